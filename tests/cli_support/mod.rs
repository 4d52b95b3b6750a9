//! Helpers shared by the CLI tests (tests/cli_decode.rs, tests/tshark.rs): where the
//! conformance vectors are, how to run the built `xrnic` binary, scratch files, and the
//! frame builders of examples/write_capture.rs.
#![allow(dead_code)] // each test crate uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "../common/bin_path.rs"]
mod bin_path;
use bin_path::xrnic_bin;

#[path = "../../examples/write_capture.rs"]
pub mod write_capture;

/// ../shared/vectors, the real captures beside the repository (data the tests read). A
/// test that calls this carries
/// `#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]` (build.rs sets the
/// cfg where the folder is missing), so it only runs where the folder is: missing here
/// means it was run anyway (`--include-ignored`), and that fails.
pub fn vectors_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/vectors");
    assert!(
        d.is_dir(),
        "{} is missing: this test reads the captures there",
        d.display()
    );
    d
}

/// One vector file by its path under the vectors folder.
pub fn vector(rel: &str) -> PathBuf {
    vectors_dir().join(rel)
}

/// Fails unless `tshark` runs. A test that calls this carries
/// `#[cfg_attr(xrnic_no_tshark, ignore = "needs tshark")]` (build.rs); `make test`
/// installs the Debian package tshark.
pub fn require_tshark() {
    let ok = Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "tshark does not run: install the Debian package tshark (make deps)"
    );
}

/// Every capture in the vectors folder, sorted.
pub fn vector_files() -> Vec<PathBuf> {
    let d = vectors_dir();
    let mut v = Vec::new();
    for sub in std::fs::read_dir(&d).unwrap() {
        let sub = sub.unwrap().path();
        if sub.is_dir() {
            for f in std::fs::read_dir(&sub).unwrap() {
                let f = f.unwrap().path();
                if f.extension().is_some_and(|e| e == "pcap" || e == "pcapng") {
                    v.push(f);
                }
            }
        }
    }
    v.sort();
    assert!(!v.is_empty(), "no captures in {}", d.display());
    v
}

/// Run the built binary.
pub fn xrnic(args: &[&str]) -> Output {
    Command::new(xrnic_bin())
        .args(args)
        .output()
        .expect("run xrnic")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("stdout is UTF-8")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("stderr is UTF-8")
}

/// `xrnic decode --json FILE`, which must succeed; one JSON value per line.
pub fn decode_json(file: &Path) -> Vec<serde_json::Value> {
    let o = xrnic(&["decode", "--json", file.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}: {}",
        file.display(),
        stderr(&o)
    );
    stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}")))
        .collect()
}

/// A scratch file path unique to this test process.
pub fn scratch(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-{name}", std::process::id()))
}

/// Write frames (with 1 µs spacing) into a scratch pcapng file.
pub fn pcapng_of(name: &str, frames: &[Vec<u8>]) -> PathBuf {
    let path = scratch(name);
    let timed: Vec<_> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| (std::time::Duration::from_micros(i as u64), f.clone()))
        .collect();
    write_capture::write_pcapng(&path, std::time::Duration::from_secs(1_700_000_000), &timed)
        .unwrap();
    path
}
