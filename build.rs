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
//! is on the PATH. Under `CI=true` neither is set: those tests then run and fail.

use std::env;
use std::path::PathBuf;
use std::process::ExitCode;

const SRC: &str = "bpf/xrnic.bpf.c";

fn main() -> ExitCode {
    println!("cargo:rerun-if-changed={SRC}");
    println!("cargo:rerun-if-changed=build.rs");
    test_prerequisites();
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

/// Sets `xrnic_no_vectors` / `xrnic_no_tshark` for the tests (module doc). A prerequisite
/// that is present is watched, so that its removal re-runs this script; one that is missing
/// cannot be watched by path: install it and touch build.rs (or `cargo clean -p xrnic`).
fn test_prerequisites() {
    println!("cargo::rustc-check-cfg=cfg(xrnic_no_vectors)");
    println!("cargo::rustc-check-cfg=cfg(xrnic_no_tshark)");
    let ci = env::var("CI").is_ok_and(|v| v == "true");
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let vectors = manifest.join("../shared/vectors");
    if vectors.is_dir() {
        println!("cargo:rerun-if-changed={}", vectors.display());
    } else {
        println!("cargo:rerun-if-env-changed=CI");
        if !ci {
            println!("cargo:rustc-cfg=xrnic_no_vectors");
        }
    }
    let tshark = env::var_os("PATH").and_then(|p| {
        env::split_paths(&p)
            .map(|d| d.join("tshark"))
            .find(|t| t.is_file())
    });
    match tshark {
        Some(t) => println!("cargo:rerun-if-changed={}", t.display()),
        None => {
            println!("cargo:rerun-if-env-changed=CI");
            println!("cargo:rerun-if-env-changed=PATH");
            if !ci {
                println!("cargo:rustc-cfg=xrnic_no_tshark");
            }
        }
    }
}
