//! Compiles the XDP program `bpf/xrnic.bpf.c` into `$OUT_DIR/xrnic.bpf.o` with
//! libbpf-cargo's `SkeletonBuilder` (clang, BPF target). `src/io/afxdp/filter.rs` embeds
//! the object with `include_bytes!` and loads it with libbpf-rs at run time.
//!
//! A failure stops the build with a message that names the missing tool or package
//! (`scripts/install-deps.sh` installs them on Debian).

use std::env;
use std::path::PathBuf;
use std::process::ExitCode;

const SRC: &str = "bpf/xrnic.bpf.c";

fn main() -> ExitCode {
    println!("cargo:rerun-if-changed={SRC}");
    println!("cargo:rerun-if-changed=build.rs");
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
