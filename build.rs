//! Compiles the XDP program `bpf/xrnic.bpf.c` into `$OUT_DIR/xrnic.bpf.o` with
//! libbpf-cargo's `SkeletonBuilder` (clang, BPF target). `src/io/afxdp/filter.rs` embeds
//! the object with `include_bytes!` and loads it with libbpf-rs at run time.
//!
//! A failure stops the build with a message that names the missing tool or package
//! (`scripts/install-deps.sh` installs them on Debian).
//!
//! It also tells the tests which of their optional prerequisites this machine lacks, so
//! that a test needing one shows as ignored instead of passing without checking anything
//! (docs/testing.md): `--cfg xrnic_no_vectors` when `../shared/vectors` (the real
//! captures beside the repository) is not there, `--cfg xrnic_no_tshark` when no `tshark`
//! is on the PATH, and one cfg per Debian package of stock tools or C headers
//! ([`PREREQUISITES`]). Under `CI=true` none is set: those tests then run and fail.

use std::env;
use std::path::PathBuf;
use std::process::ExitCode;

const SRC: &str = "bpf/xrnic.bpf.c";

fn main() -> ExitCode {
    println!("cargo:rerun-if-changed={SRC}");
    println!("cargo:rerun-if-changed=build.rs");
    test_prerequisites(PREREQUISITES);
    match build() {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("error: building the XDP program {SRC} failed: {msg}");
            eprintln!(
                "hint: it needs clang, libbpf-dev and linux-libc-dev; run `make deps` (scripts/install-deps.sh with the Makefile's package list)"
            );
            ExitCode::FAILURE
        }
    }
}

fn build() -> Result<(), String> {
    let out_dir = env::var_os("OUT_DIR").ok_or("cargo did not set OUT_DIR")?;
    let obj = PathBuf::from(out_dir).join("xrnic.bpf.o");
    let manifest =
        env::var_os("CARGO_MANIFEST_DIR").ok_or("cargo did not set CARGO_MANIFEST_DIR")?;
    let src = PathBuf::from(manifest).join(SRC);

    // Debian keeps <asm/types.h> under the multiarch directory, which clang's BPF
    // target does not search by itself.
    let multiarch = match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("aarch64") => "/usr/include/aarch64-linux-gnu",
        _ => "/usr/include/x86_64-linux-gnu",
    };
    let multiarch_arg = format!("-I{multiarch}");
    libbpf_cargo::SkeletonBuilder::new()
        .source(&src)
        .obj(&obj)
        .clang_args(["-O2", "-Wall", "-Werror", multiarch_arg.as_str()])
        .build()
        .map_err(|e| format!("{e:#}"))?;
    Ok(())
}

include!("build/prerequisites.rs");

/// What the tests of this crate may lack (the module doc; the table in docs/testing.md).
/// The programs are the Debian packages' binaries by their /usr/bin path, as the tests
/// run them.
const PREREQUISITES: &[Prerequisite] = &[
    Prerequisite {
        cfg: "xrnic_no_vectors",
        needs: &["../shared/vectors"],
    },
    Prerequisite {
        cfg: "xrnic_no_tshark",
        needs: &["tshark"],
    },
    Prerequisite {
        cfg: "xrnic_no_ibverbs_utils",
        needs: &[
            "/usr/bin/ibv_devinfo",
            "/usr/bin/ibv_devices",
            "/usr/bin/ibv_rc_pingpong",
            "/usr/bin/ibv_uc_pingpong",
            "/usr/bin/ibv_ud_pingpong",
            "/usr/bin/ibv_srq_pingpong",
            "/usr/bin/ibv_xsrq_pingpong",
        ],
    },
    Prerequisite {
        cfg: "xrnic_no_perftest",
        needs: &[
            "/usr/bin/ib_write_bw",
            "/usr/bin/ib_send_bw",
            "/usr/bin/ib_read_bw",
            "/usr/bin/ib_atomic_bw",
            "/usr/bin/ib_write_lat",
            "/usr/bin/ib_send_lat",
            "/usr/bin/ib_read_lat",
            "/usr/bin/ib_atomic_lat",
        ],
    },
    Prerequisite {
        cfg: "xrnic_no_rdmacm_utils",
        needs: &[
            "/usr/bin/rping",
            "/usr/bin/ucmatose",
            "/usr/bin/udaddy",
            "/usr/bin/mckey",
            "/usr/bin/rdma_server",
            "/usr/bin/rdma_client",
            "/usr/bin/rdma_xserver",
            "/usr/bin/rdma_xclient",
            "/usr/bin/rstream",
            "/usr/bin/udpong",
            "/usr/bin/rcopy",
        ],
    },
    Prerequisite {
        cfg: "xrnic_no_ucx_utils",
        needs: &["/usr/bin/ucx_perftest"],
    },
    Prerequisite {
        cfg: "xrnic_no_pyverbs",
        needs: &[
            "/usr/share/doc/rdma-core/tests/run_tests.py",
            "/usr/lib/python3/dist-packages/pyverbs/__init__.py",
        ],
    },
    Prerequisite {
        cfg: "xrnic_no_infiniband_diags",
        needs: &["/usr/sbin/ibstat", "/usr/sbin/ibstatus"],
    },
    Prerequisite {
        cfg: "xrnic_no_libibverbs_dev",
        needs: &["cc", "/usr/include/infiniband/verbs.h"],
    },
    Prerequisite {
        cfg: "xrnic_no_librdmacm_dev",
        needs: &["cc", "/usr/include/rdma/rdma_cma.h"],
    },
];
