//! Links `libibverbs.so` with SONAME `libibverbs.so.1` and the version nodes of
//! `libibverbs.map` (the symbols themselves get their versions from `.symver` in
//! exports.rs: rustc's own version script decides what is exported, ours only declares
//! the nodes).

fn main() {
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
