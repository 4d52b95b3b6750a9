//! What the tests of the library share: the built library, a directory to put on
//! LD_LIBRARY_PATH, and the check that a tool the test needs is there.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;

/// Fails, naming `what`, unless `ok`. A test that calls this carries the cfg of its
/// prerequisite (src/abi/build.rs), so that it shows as ignored where it is missing
/// (docs/testing.md "Tests with a prerequisite").
pub fn require(ok: bool, what: &str) {
    assert!(ok, "{what} is missing: install it (make deps)");
}

/// target/<profile>/libibverbs.so, beside the directory of this test binary. `cargo
/// test` does not build a cdylib (no test links it): `make test` runs `cargo build
/// --workspace` first; a library older than its sources fails here instead of being
/// tested stale.
pub fn built_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let lib = profile_dir.join("libibverbs.so");
    let built = std::fs::metadata(&lib)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; build it first: cargo build -p xrnic-verbs",
                lib.display()
            )
        });
    let src = Path::new(env!("CARGO_MANIFEST_DIR"));
    for e in std::fs::read_dir(src).unwrap().flatten() {
        let m = e.metadata().unwrap();
        assert!(
            !m.is_file() || m.modified().unwrap() <= built,
            "{} is older than {}: run cargo build -p xrnic-verbs first",
            lib.display(),
            e.path().display()
        );
    }
    lib
}

/// A directory holding `libibverbs.so.1` -> the built library, for LD_LIBRARY_PATH.
pub fn library_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xrnic-verbs-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("libibverbs.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(built_library(), &link).unwrap();
    dir
}

pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `name version` of every defined symbol of `lib` at its default version (objdump -T):
/// node symbols, unversioned (Base) ones and hidden compat versions (`(IBVERBS_1.0)`)
/// left out.
pub fn versioned_exports(lib: &Path) -> std::collections::BTreeSet<(String, String)> {
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
            let default = !ver.starts_with('(') && ver != "Base" && name != ver;
            default.then(|| (name.to_string(), ver.to_string()))
        })
        .collect()
}

/// The rdma-core releases whose symbol lists tests/symbols/ holds: Ubuntu 22.04's,
/// Debian 12's, Ubuntu 24.04's and Debian 13's.
pub const RDMA_CORE_VERSIONS: [&str; 4] = ["39.0", "44.0", "50.0", "56.0"];

/// tests/symbols/`lib`-`version`.txt as (symbol, node) pairs: `lib` is "libibverbs" or
/// "librdmacm". Lines starting with `#` (the source) are skipped; any other line must be
/// exactly `symbol node`.
pub fn symbol_list(lib: &str, version: &str) -> std::collections::BTreeSet<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/symbols")
        .join(format!("{lib}-{version}.txt"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [name, node] => (name.to_string(), node.to_string()),
            _ => panic!("{}: not `symbol node`: {l:?}", path.display()),
        })
        .collect()
}

/// Every (symbol, node) of every listed release of both libraries.
pub fn all_listed_symbols() -> std::collections::BTreeSet<(String, String)> {
    RDMA_CORE_VERSIONS
        .iter()
        .flat_map(|v| [symbol_list("libibverbs", v), symbol_list("librdmacm", v)])
        .flatten()
        .collect()
}
