//! The crate layout (README, docs/README.md): the engine library `xrnic` has none of the
//! command line's crates (clap, ctrlc, plotters) among its normal dependencies, direct or
//! transitive; they belong to `xrnic-cli` (src/cli/Cargo.toml), which builds the `xrnic`
//! binary. Read from `cargo metadata`'s resolved graph, as `cargo tree -e normal` shows it.

#[path = "common/bin_path.rs"]
mod bin_path;

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use serde_json::Value;

const CLI_ONLY: [&str; 3] = ["clap", "ctrlc", "plotters"];

/// The resolved graph: package id -> (name, ids of its normal dependencies).
fn normal_graph() -> (HashMap<String, String>, HashMap<String, Vec<String>>) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // The graph of the host's platform only: crates for other targets (the Android
    // and Windows sides of chrono's and libc's dependencies) are never downloaded by a
    // build here, and `--offline` would fail on them on a fresh machine.
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let vv = Command::new(rustc)
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    let host = String::from_utf8_lossy(&vv.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host");
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
            &host,
            "--manifest-path",
        ])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let names = doc["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            let id = p["id"].as_str().expect("id").to_owned();
            (id, p["name"].as_str().expect("name").to_owned())
        })
        .collect();
    let deps = doc["resolve"]["nodes"]
        .as_array()
        .expect("resolve.nodes")
        .iter()
        .map(|n| {
            let normal = n["deps"]
                .as_array()
                .expect("deps")
                .iter()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .expect("dep_kinds")
                        .iter()
                        .any(|k| k["kind"].is_null())
                })
                .map(|d| d["pkg"].as_str().expect("pkg").to_owned())
                .collect();
            (n["id"].as_str().expect("id").to_owned(), normal)
        })
        .collect();
    (names, deps)
}

/// Names of every package `root` reaches through normal dependencies (itself excluded).
fn normal_closure(root: &str) -> BTreeSet<String> {
    let (names, deps) = normal_graph();
    let start = names
        .iter()
        .find(|(_, n)| *n == root)
        .map(|(id, _)| id.clone())
        .unwrap_or_else(|| panic!("no package {root} in the workspace"));
    let mut seen = BTreeSet::new();
    let mut todo = vec![start];
    while let Some(id) = todo.pop() {
        for d in deps.get(&id).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen.into_iter().map(|id| names[&id].clone()).collect()
}

#[test]
fn the_library_has_no_cli_crate_among_its_normal_dependencies() {
    let lib = normal_closure("xrnic");
    // The walk sees the library's real dependencies (a broken walk would pass vacuously).
    assert!(
        lib.contains("xsk-rs") && lib.contains("etherparse"),
        "{lib:?}"
    );
    for c in CLI_ONLY {
        assert!(!lib.contains(c), "xrnic depends on {c} (normal): {lib:?}");
    }
}

#[test]
fn the_cli_crate_has_them_and_the_library() {
    let cli = normal_closure("xrnic-cli");
    for c in CLI_ONLY.iter().chain(&["xrnic"]) {
        assert!(cli.contains(*c), "xrnic-cli lacks {c}: {cli:?}");
    }
}

#[test]
fn a_missing_xrnic_binary_is_a_message_that_says_how_to_build_it() {
    let dir = std::env::temp_dir().join(format!("xrnic-bin-path-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("deps")).unwrap();
    let exe = dir.join("deps").join("some_test-0123");
    let e = bin_path::find_beside(&exe).unwrap_err();
    assert!(
        e.contains("is missing") && e.contains("cargo build -p xrnic-cli"),
        "{e}"
    );
    std::fs::write(dir.join("xrnic"), b"").unwrap();
    assert_eq!(bin_path::find_beside(&exe).unwrap(), dir.join("xrnic"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_binary_the_tests_run_is_the_cli_crates() {
    let out = Command::new(bin_path::xrnic_bin())
        .arg("--version")
        .output()
        .expect("run xrnic --version");
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "xrnic 0.1.0");
}
