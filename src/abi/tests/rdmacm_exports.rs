//! The built library against Debian's librdmacm.so.1 (rdma-core 44): every default-version
//! librdmacm symbol at its RDMACM_1.x node (objdump -T), and stock rdmacm-utils binaries
//! (linked with BIND_NOW) start against a `librdmacm.so.1` link to the library.
//! Without objdump / librdmacm1 / rdmacm-utils the checks show as ignored
//! (src/abi/build.rs); under CI=true they run and fail.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::{built_library, have, library_dir, require};

const REAL: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

fn rdmacm_exports(lib: &Path) -> BTreeSet<(String, String)> {
    let out = Command::new("objdump").arg("-T").arg(lib).output().unwrap();
    assert!(out.status.success(), "objdump -T {}", lib.display());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.contains(" DF ") || l.contains(" DO "))
        .filter(|l| !l.contains("*UND*"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (name, ver) = (f[f.len() - 1], f[f.len() - 2]);
            (ver.starts_with("RDMACM_") && name != ver).then(|| (name.to_string(), ver.to_string()))
        })
        .collect()
}

#[test]
#[cfg_attr(xrnic_no_real_librdmacm, ignore = "needs binutils and librdmacm1")]
fn exports_every_default_symbol_of_librdmacm_44_at_its_node() {
    require(have("objdump"), "objdump (binutils)");
    require(
        Path::new(REAL).exists(),
        "librdmacm1 (the real librdmacm.so.1)",
    );
    let real = rdmacm_exports(Path::new(REAL));
    let ours = rdmacm_exports(&built_library());
    assert!(real.len() >= 68, "the real library exports {}", real.len());
    let missing: Vec<_> = real.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&real).collect();
    assert!(missing.is_empty(), "missing: {missing:?}");
    assert!(extra.is_empty(), "not in the real library: {extra:?}");
    for (n, v) in [
        ("rdma_create_id", "RDMACM_1.0"),
        ("rdma_join_multicast_ex", "RDMACM_1.1"),
        ("rdma_establish", "RDMACM_1.2"),
        ("rdma_reject_ece", "RDMACM_1.3"),
    ] {
        assert!(ours.contains(&(n.to_string(), v.to_string())), "{n}@@{v}");
    }
}

/// rping, ucmatose and udaddy start (BIND_NOW) and print their usage: every symbol and
/// version node they import resolves in the one library, loaded once under both names.
#[test]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs rdmacm-utils")]
fn stock_rdmacm_utils_load_against_it() {
    let dir = library_dir("rdmacm");
    let cm = dir.join("librdmacm.so.1");
    let _ = std::fs::remove_file(&cm);
    std::os::unix::fs::symlink(built_library(), &cm).unwrap();
    for tool in ["rping", "ucmatose", "udaddy"] {
        let p = format!("/usr/bin/{tool}");
        require(Path::new(&p).exists(), &format!("{p} (rdmacm-utils)"));
        let o = Command::new(&p)
            .arg("-h")
            .env("LD_LIBRARY_PATH", &dir)
            .env("LD_BIND_NOW", "1")
            .env("LD_DEBUG", "files")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("version `RDMACM"), "{tool}: {err}");
        assert!(!err.contains("undefined symbol"), "{tool}: {err}");
        // The loader maps the file once: librdmacm.so.1 is found as the already
        // loaded libibverbs.so.1 (same dev/inode) or the other way round.
        let inits = err
            .lines()
            .filter(|l| l.contains("calling init:") && l.contains(dir.to_str().unwrap()))
            .count();
        assert_eq!(inits, 1, "{tool}: one xrnic library initialised: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
