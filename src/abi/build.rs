//! Links `libibverbs.so` with SONAME `libibverbs.so.1` and the version nodes of
//! `libibverbs.map` (the symbols themselves get their versions from `.symver` in
//! exports.rs: rustc's own version script decides what is exported, ours only declares
//! the nodes). It also sets the cfgs that ignore the tests whose prerequisite this
//! machine lacks (../../build/prerequisites.rs).

include!("../../build/prerequisites.rs");

/// What the tests of this crate may lack (docs/testing.md "Tests with a prerequisite").
const PREREQUISITES: &[Prerequisite] = &[
    Prerequisite {
        cfg: "xrnic_no_real_libibverbs",
        needs: &[
            "objdump",
            "readelf",
            "/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
        ],
    },
    Prerequisite {
        cfg: "xrnic_no_real_librdmacm",
        needs: &["objdump", "/usr/lib/x86_64-linux-gnu/librdmacm.so.1"],
    },
    Prerequisite {
        cfg: "xrnic_no_ibverbs_utils",
        needs: &["ibv_devices", "ibv_devinfo"],
    },
    Prerequisite {
        cfg: "xrnic_no_perftest",
        needs: &["ib_write_bw"],
    },
    Prerequisite {
        cfg: "xrnic_no_objdump",
        needs: &["objdump"],
    },
    Prerequisite {
        cfg: "xrnic_no_libibverbs_dev",
        needs: &["cc", "/usr/include/infiniband/verbs.h"],
    },
    Prerequisite {
        cfg: "xrnic_no_rdmacm_utils",
        needs: &["/usr/bin/rping", "/usr/bin/ucmatose", "/usr/bin/udaddy"],
    },
];

fn main() {
    test_prerequisites(PREREQUISITES);
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=libibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/libibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    // libxdp-sys bundles libxdp.a built without -fPIC; its default print function reads
    // libc's `stderr` with a PC-relative load, which a shared object cannot resolve
    // against libc. Redirect that one reference to `__wrap_stderr`, a copy of libc's
    // `stderr` inside this library (stderr.rs sets it when the library loads).
    println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap=stderr");
}
