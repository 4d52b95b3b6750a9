//! Where the `xrnic` binary is. It belongs to another package of the workspace (src/cli,
//! crate `xrnic-cli`), so cargo gives these tests no `CARGO_BIN_EXE_xrnic`: the binary sits
//! in target/<profile>/, the parent of the `deps/` folder that holds this test binary.
//! `make test` builds it first (`cargo build --workspace --all-targets`); a bare
//! `cargo test --test NAME` needs `cargo build -p xrnic-cli` before it (docs/testing.md).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The path of target/<profile>/xrnic beside the running test binary's `deps/` folder,
/// or a panic that says how to build it.
pub fn xrnic_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's own path");
        match find_beside(&exe) {
            Ok(p) => p.to_str().expect("a UTF-8 target path").to_owned(),
            Err(e) => panic!("{e}"),
        }
    })
}

/// target/<profile>/xrnic for a test binary at target/<profile>/deps/NAME-HASH
/// (tests/crate_deps.rs checks the message when it is missing).
pub fn find_beside(exe: &Path) -> Result<PathBuf, String> {
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("{} is not in target/<profile>/deps/", exe.display()))?;
    let bin = profile_dir.join("xrnic");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "the xrnic binary {} is missing: build it first with `cargo build -p xrnic-cli` \
             (make test does `cargo build --workspace --all-targets`)",
            bin.display()
        ))
    }
}
