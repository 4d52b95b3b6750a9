// The optional prerequisites of the tests, shared by the build scripts of the two crates
// whose tests need them (build.rs, src/abi/build.rs; each `include!`s this file). For each
// prerequisite that is missing the script sets `--cfg NAME`, and the tests that need it
// carry `#[cfg_attr(NAME, ignore = "needs ...")]`: they show as ignored instead of passing
// without checking anything (docs/testing.md "Tests with a prerequisite"). Under `CI=true`
// none is set: those tests then run, and their own lookup fails naming what is missing.

/// One prerequisite: the cfg set when it is missing, and what it consists of. An entry
/// with a `/` is a path that must exist (a relative one from the crate's manifest
/// directory); a bare name is a program found on the PATH.
struct Prerequisite {
    cfg: &'static str,
    needs: &'static [&'static str],
}

/// Declares every cfg of `list` to rustc, and sets those whose prerequisite is missing.
/// A present prerequisite is watched, so that its removal re-runs the build script; one
/// that is missing cannot be watched by path: install it and touch the build script (or
/// `cargo clean -p` the crate).
fn test_prerequisites(list: &[Prerequisite]) {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    for p in list {
        println!("cargo::rustc-check-cfg=cfg({})", p.cfg);
        let mut missing = false;
        for need in p.needs {
            match locate(need) {
                Some(found) => println!("cargo:rerun-if-changed={}", found.display()),
                None => {
                    missing = true;
                    // Whether the cfg is set depends on CI, and a program's presence on
                    // the PATH (watched only while missing: a PATH change need not
                    // rebuild the crate otherwise).
                    println!("cargo:rerun-if-env-changed=CI");
                    if !need.contains('/') {
                        println!("cargo:rerun-if-env-changed=PATH");
                    }
                }
            }
        }
        if missing && !ci {
            println!("cargo:rustc-cfg={}", p.cfg);
        }
    }
}

/// `need` as a path that exists (module doc), or None.
fn locate(need: &str) -> Option<std::path::PathBuf> {
    if need.contains('/') {
        let dir = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default();
        let p = std::path::PathBuf::from(dir).join(need);
        return p.exists().then_some(p);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(need))
            .find(|t| t.is_file())
    })
}
