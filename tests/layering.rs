//! The layers import one way (README, docs/README.md): [`LAYERS`] orders every top-level
//! module of the `xrnic` crate, bottom first, and then the crates built on it (src/abi =
//! `xrnic-verbs`, src/cli = `xrnic-cli`, src/netns = `xrnic-netns`); a module may import
//! only modules on earlier rows. This reads the sources and fails on any path that names
//! a module on its own row or a later one: `crate::X` in the library (in a `use`, a
//! `use crate::{..}` group, or inline), `xrnic::X` in the other crates (and `crate::X` in
//! src/cli, which re-exports the library), outside comments and test code (`*tests.rs`
//! files, a crate's tests/ folder, and what follows `#[cfg(test)]` at the start of a
//! line). `module_map` prints the edges between top-level modules
//! (`cargo test --test layering module_map -- --nocapture`).
//!
//! Inside proto/ the imports go one way too: config and the other
//! leaves, cq, the work requests (wr), memory and the packet description (packet) <-
//! requester, responder <- srq (the SRQ's state) <- qp <- framing, execute (the
//! responder's request execution on a QP) <- completer, uc, ud (the UC and UD services
//! of one QP) <- device <- srq_verbs (the SRQ verbs, `impl Rnic`), fatal (the device
//! going away, `impl Rnic`) ([`PROTO_ORDER`]).
//! This reads the `super::X` and `crate::proto::X` paths of those files (same rules for
//! comments and test code; in a folder module's files below its mod.rs,
//! `super::super::X`); any edge against the order fails, with no exceptions. Every
//! module of proto/ is in the order, declared in proto/mod.rs (none reached as a
//! child of another through `#[path]`).
//!
//! And the library runs no external program (it must work where no tool is installed):
//! no file of the
//! `xrnic` crate's src (the other crates' folders, src/cli, src/abi and src/netns, aside;
//! test code aside) names `std::process::Command` in any form, nor libc's exec, spawn or
//! fork calls. The namespace harness that runs `ip` is the `xrnic-netns` crate.

use std::path::{Path, PathBuf};

/// The C library's own order (src/abi).
#[path = "layering/abi.rs"]
mod abi;

/// Every top-level module of the `xrnic` crate (src/lib.rs), bottom first, and on the
/// last row the crates built on it: each may import only modules on earlier rows, never
/// one on its own row. `wire` (packet formats) imports nothing; `io` (AF_XDP, links,
/// captures) and `proto` (the sans-IO transport) know nothing of each other; the driver
/// (the engine on a port), the simulated pair, the connection manager, the out-of-band
/// tools, the trace writer and the client-service protocol (`ipc`) stand side by side;
/// `verbs` uses the driver and, for a device behind the service, the protocol; the
/// device service (`service`) serves verbs' objects over the protocol; the C library
/// (abi), the command line (cli) and the namespace harness (netns) are on top
/// (`every_top_level_module_is_in_the_order`).
const LAYERS: &[&[&str]] = &[
    &["wire"],
    &["io", "proto"],
    &["driver", "sim", "cm", "oob", "trace_out", "ipc"],
    &["verbs"],
    &["service"],
    &["abi", "cli", "netns"],
];

/// The crates on the last row of [`LAYERS`]: folders of src/ with a Cargo.toml.
const CRATES: &[&str] = &["abi", "cli", "netns"];

/// (layer, the layers it must not import): those on its own row of [`LAYERS`] and every
/// row above it.
fn rules() -> Vec<(&'static str, Vec<&'static str>)> {
    order_rules(LAYERS)
}

/// (module, the modules it must not import) of an order, bottom first.
fn order_rules(order: &[&[&'static str]]) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut rules = Vec::new();
    for (i, row) in order.iter().enumerate() {
        for m in row.iter() {
            let forbidden = order[i..]
                .iter()
                .flat_map(|r| r.iter().copied())
                .filter(|x| x != m)
                .collect();
            rules.push((*m, forbidden));
        }
    }
    rules
}

/// proto/'s import order, bottom first: each module may import only those on earlier
/// rows (and not those on its own row). The first row are the leaves (`config` is the
/// very bottom); every module of proto/ is on one row
/// (`every_proto_module_is_in_the_order`).
const PROTO_ORDER: &[&[&str]] = &[
    &["config", "counters", "time", "trace", "verdict", "user_mem"],
    &["cq", "timers", "sched", "congestion", "read_credit"],
    &["wr"],
    &["memory"],
    &["packet"],
    &["requester", "responder"],
    // The SRQ's state and the async event type: a QP names its SRQ, `Ctx` holds them.
    &["srq"],
    &["qp"],
    &["framing", "execute", "resources"],
    // The UC and UD services of one QP (the device calls them with the QP and its Ctx).
    &["completer", "uc", "ud", "mcast"],
    &["device"],
    // `impl Rnic` blocks of verbs the device itself never calls.
    &["srq_verbs", "fatal", "mcast_verbs"],
];

/// (proto module, the proto modules it must not import): those on its own row of
/// [`PROTO_ORDER`] and every row above it.
fn proto_rules() -> Vec<(&'static str, Vec<&'static str>)> {
    order_rules(PROTO_ORDER)
}

/// The proto modules a file directly under src/proto (or a folder module's mod.rs)
/// names, through `super::X`, `super::{X, ..}` (one line or several) or
/// `crate::proto::X`.
fn proto_refs(code: &str) -> Vec<(usize, String)> {
    proto_refs_from(code, "super::")
}

/// [`proto_refs`] of a file one level further down (a folder module's other files),
/// where proto/ is `super::super::`.
fn proto_refs_from(code: &str, up: &str) -> Vec<(usize, String)> {
    let ident = |s: &str| -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut refs = Vec::new();
    let mut open = false;
    for (n, line) in code.lines().enumerate() {
        let line = line.split("//").next().unwrap_or("");
        if open {
            if line.trim().starts_with('}') {
                open = false;
            } else {
                for item in line.split(',') {
                    let h = ident(item);
                    if !h.is_empty() {
                        refs.push((n + 1, h));
                    }
                }
            }
            continue;
        }
        for pat in [up, "crate::proto::"] {
            let mut rest = line;
            while let Some(i) = rest.find(pat) {
                let before = rest[..i].chars().last();
                rest = &rest[i + pat.len()..];
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                if let Some(group) = rest.strip_prefix('{') {
                    if !group.contains('}') {
                        open = true;
                    }
                    for item in group.split('}').next().unwrap_or("").split(',') {
                        let h = ident(item);
                        if !h.is_empty() {
                            refs.push((n + 1, h));
                        }
                    }
                    continue;
                }
                refs.push((n + 1, ident(rest)));
            }
        }
    }
    refs
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The files of one layer: `src/<layer>.rs` and everything under `src/<layer>/`, test
/// code aside (`*tests.rs`; of a crate, its tests/ folder and build.rs).
fn layer_files(src: &Path, layer: &str) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let file = src.join(format!("{layer}.rs"));
    if file.is_file() {
        v.push(file);
    }
    let dir = src.join(layer);
    rs_files(&dir, &mut v);
    v.retain(|p| {
        let rel = p.strip_prefix(&dir).unwrap_or(p);
        !p.file_name()
            .unwrap()
            .to_string_lossy()
            .ends_with("tests.rs")
            && !rel.starts_with("tests")
            && rel != Path::new("build.rs")
    });
    v.sort();
    v
}

/// The path prefixes through which a layer's files name the library's top-level modules:
/// `crate::` inside the library; `xrnic::` in the crates on top, and `crate::` too in
/// src/cli (its lib.rs re-exports the library: `pub use xrnic::*`).
fn prefixes(layer: &str) -> &'static [&'static str] {
    match layer {
        "cli" => &["crate::", "xrnic::"],
        l if CRATES.contains(&l) => &["xrnic::"],
        _ => &["crate::"],
    }
}

/// The top-level modules of the library that one file of `layer` (comments and tests
/// cut) names, with the line of each.
fn layer_refs(layer: &str, code: &str) -> Vec<(usize, String)> {
    let library: Vec<&str> = LAYERS
        .iter()
        .flat_map(|r| r.iter().copied())
        .filter(|m| !CRATES.contains(m))
        .collect();
    let mut refs: Vec<(usize, String)> = prefixes(layer)
        .iter()
        .flat_map(|p| path_refs(code, p))
        .filter(|(_, m)| library.contains(&m.as_str()) && m != layer)
        .collect();
    refs.sort();
    refs.dedup();
    refs
}

/// The top-level modules that `code` (one file, comments and tests cut) names through
/// `crate::`, with the line of each.
fn crate_refs(code: &str) -> Vec<(usize, String)> {
    path_refs(code, "crate::")
}

/// The first names of the paths of `code` that start with `prefix` (`crate::` or
/// `xrnic::`), with the line of each.
fn path_refs(code: &str, prefix: &str) -> Vec<(usize, String)> {
    let mut refs = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(i) = rest.find(prefix) {
            // `xrnic_crate::` or `$crate::` are other paths.
            let before = rest[..i].chars().last();
            rest = &rest[i + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                // `use crate::{a::b, c}` (one line; rustfmt breaks longer groups, whose
                // other lines start with the names themselves: see `group_lines`).
                let body = group.split('}').next().unwrap_or("");
                for item in body.split(',') {
                    let head: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !head.is_empty() {
                        refs.push((n + 1, head));
                    }
                }
                continue;
            }
            let head: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            refs.push((n + 1, head));
        }
    }
    refs.extend(group_lines(code, prefix));
    refs
}

/// The items of multi-line `use <prefix>{` groups.
fn group_lines(code: &str, prefix: &str) -> Vec<(usize, String)> {
    let mut refs = Vec::new();
    let mut open = false;
    let (opener, pub_opener) = (format!("use {prefix}{{"), format!("pub use {prefix}{{"));
    for (n, line) in code.lines().enumerate() {
        let t = line.trim();
        if t.starts_with(&opener) || t.starts_with(&pub_opener) {
            open = !t.contains('}');
            continue;
        }
        if open {
            if t.starts_with('}') {
                open = false;
                continue;
            }
            for item in t.split(',') {
                let head: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !head.is_empty() {
                    refs.push((n + 1, head));
                }
            }
        }
    }
    refs
}

/// A file's text without its test code: an inline `#[cfg(test)] mod .. {` to its closing
/// brace, and the item after any other `#[cfg(test)]` line
/// (a `use`, an out-of-line `mod`). Lines cut become empty, so line numbers stay.
fn non_test(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            out.push(lines[i]);
            i += 1;
            continue;
        }
        // The attribute and any further attributes, then the item's first line.
        let mut j = i + 1;
        while j < lines.len() && lines[j].trim().starts_with("#[") {
            j += 1;
        }
        let item = lines.get(j).map_or("", |l| l.trim());
        let inline_mod =
            (item.starts_with("mod ") || item.starts_with("pub mod ")) && item.ends_with('{');
        // An inline test module ends where its braces close (qp.rs has code after one).
        let end = if inline_mod {
            let mut depth = 0i32;
            let mut k = j;
            while k < lines.len() {
                let l = lines[k].split("//").next().unwrap_or("");
                depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
                k += 1;
                if depth <= 0 {
                    break;
                }
            }
            k
        } else {
            j + 1
        };
        out.extend(std::iter::repeat_n("", end.min(lines.len()) - i));
        i = end;
    }
    out.join("\n")
}

/// Where each layer stands in [`LAYERS`]: its row.
fn row_of(m: &str) -> usize {
    LAYERS
        .iter()
        .position(|r| r.contains(&m))
        .unwrap_or_else(|| panic!("{m} is in no row of LAYERS"))
}

/// Every edge between top-level modules: (importer, imported, file relative to src/, line).
fn module_edges(src: &Path) -> Vec<(&'static str, String, String, usize)> {
    let mut edges = Vec::new();
    for layer in LAYERS.iter().flat_map(|r| r.iter().copied()) {
        let files = layer_files(src, layer);
        assert!(!files.is_empty(), "no sources for {layer}");
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let rel = f.strip_prefix(src).unwrap().display().to_string();
            for (line, m) in layer_refs(layer, &non_test(&text)) {
                edges.push((layer, m, rel.clone(), line));
            }
        }
    }
    edges
}

#[test]
fn each_layer_imports_only_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rules = rules();
    let mut bad = Vec::new();
    for (layer, m, file, line) in module_edges(&src) {
        let forbidden = &rules.iter().find(|(l, _)| *l == layer).unwrap().1;
        if forbidden.contains(&m.as_str()) {
            bad.push(format!(
                "src/{file}:{line}: {layer} (row {}) imports {m} (row {}) of tests/layering.rs LAYERS",
                row_of(layer),
                row_of(&m)
            ));
        }
    }
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
}

/// The map of the top-level modules: each with the modules it imports and how many
/// lines name each (`-- --nocapture` prints it). Each edge points to an earlier row of
/// [`LAYERS`], so the map has no cycle; and the walk sees the edges every build has (a
/// blind walk would pass the test above vacuously).
#[test]
fn module_map() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut map: std::collections::BTreeMap<&str, std::collections::BTreeMap<String, usize>> =
        Default::default();
    for (layer, m, _, _) in module_edges(&src) {
        *map.entry(layer).or_default().entry(m).or_default() += 1;
    }
    for row in LAYERS {
        for layer in row.iter() {
            let to: Vec<String> = map
                .get(layer)
                .into_iter()
                .flatten()
                .map(|(m, n)| format!("{m} ({n})"))
                .collect();
            println!("{layer:>9} -> {}", to.join(", "));
        }
    }
    let has = |a: &str, b: &str| map.get(a).is_some_and(|t| t.contains_key(b));
    for (a, b) in [
        ("proto", "wire"),
        ("driver", "io"),
        ("verbs", "ipc"),
        ("service", "verbs"),
        ("service", "ipc"),
        ("abi", "verbs"),
        ("cli", "service"),
        ("netns", "io"),
    ] {
        assert!(has(a, b), "the walk missed {a} -> {b}: {map:?}");
    }
    for (a, to) in &map {
        for b in to.keys() {
            assert!(row_of(b) < row_of(a), "{a} -> {b} goes up or sideways");
        }
    }
}

/// Every top-level module of the library (each `mod` of src/lib.rs) and every crate
/// folder of src/ is on one row of [`LAYERS`], once: a module the order does not name
/// could import anything.
#[test]
fn every_top_level_module_is_in_the_order() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut found: Vec<String> = lib
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            l.strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("mod "))
                .or_else(|| l.strip_prefix("pub(crate) mod "))
                .and_then(|r| r.strip_suffix(';'))
                .map(str::to_string)
        })
        .collect();
    assert!(
        ["wire", "proto", "verbs", "service"]
            .iter()
            .all(|m| found.iter().any(|f| f == m)),
        "the read of src/lib.rs missed modules: {found:?}"
    );
    let crates: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("Cargo.toml").is_file())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    let mut sorted_crates = crates.clone();
    sorted_crates.sort();
    assert_eq!(sorted_crates, CRATES, "the crates on top of the library");
    found.extend(crates);
    found.sort();
    let mut listed: Vec<&str> = LAYERS.iter().flat_map(|r| r.iter().copied()).collect();
    listed.sort();
    assert_eq!(
        found, listed,
        "the top-level modules (src/lib.rs) and crates (src/*/Cargo.toml) against LAYERS"
    );
    // The crates stand on the top row, alone.
    assert_eq!(LAYERS.last().unwrap(), &CRATES);
}

/// The order forbids every back edge between top-level modules, and keeps the rules the
/// layers always had.
#[test]
fn the_layer_order_forbids_every_back_edge() {
    let rules = rules();
    let forbidden = |a: &str, b: &str| {
        rules
            .iter()
            .find(|(m, _)| *m == a)
            .is_some_and(|(_, f)| f.contains(&b))
    };
    for (i, low) in LAYERS.iter().enumerate() {
        for (j, high) in LAYERS.iter().enumerate().skip(i) {
            for a in low.iter() {
                for b in high.iter().filter(|b| *b != a) {
                    assert!(forbidden(a, b), "{a} may import {b}");
                    if j > i {
                        assert!(!forbidden(b, a), "{b} may not import {a}");
                    }
                }
            }
        }
    }
    // proto is sans-IO; io knows no transport; the driver no verbs; the protocol neither
    // of its two sides; verbs no service.
    assert!(forbidden("proto", "io") && forbidden("io", "proto"));
    assert!(forbidden("driver", "verbs") && forbidden("driver", "sim"));
    assert!(forbidden("ipc", "verbs") && forbidden("ipc", "service"));
    assert!(forbidden("verbs", "service") && forbidden("service", "cli"));
    assert!(!forbidden("service", "ipc") && !forbidden("verbs", "ipc"));
}

/// The sources of proto module `m` (tests cut), each with the prefix that names proto/
/// in it: src/proto/m.rs, or a folder src/proto/m/ (mod.rs with `super::`, its other
/// files with `super::super::`).
fn proto_module_files(proto: &Path, m: &str) -> Vec<(PathBuf, &'static str)> {
    let file = proto.join(format!("{m}.rs"));
    if file.is_file() {
        return vec![(file, "super::")];
    }
    let mut files = Vec::new();
    rs_files(&proto.join(m), &mut files);
    files.sort();
    files
        .into_iter()
        .filter(|p| !p.to_string_lossy().ends_with("tests.rs"))
        .map(|p| {
            let up = if p.file_name().is_some_and(|n| n == "mod.rs") {
                "super::"
            } else {
                "super::super::"
            };
            (p, up)
        })
        .collect()
}

#[test]
fn proto_imports_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/proto");
    let mut bad = Vec::new();
    for (module, forbidden) in proto_rules() {
        let files = proto_module_files(&src, module);
        assert!(!files.is_empty(), "no sources for proto::{module}");
        for (f, up) in files {
            let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{f:?}: {e}"));
            let name = f.strip_prefix(&src).unwrap().display().to_string();
            for (line, m) in proto_refs_from(&non_test(&text), up) {
                if forbidden.contains(&m.as_str()) {
                    bad.push(format!("proto/{name}:{line}: {module} imports proto::{m}"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "proto layering broken:\n{}", bad.join("\n"));
}

/// Every module of proto/ (each `.rs` file directly in it but mod.rs and `*tests.rs`,
/// each folder) is on a row of [`PROTO_ORDER`], once, and is declared in proto/mod.rs:
/// a module the order does not name could import anything, and one reached as the child
/// of another (`#[path = ".."] mod x;` inside it) would be checked as neither.
#[test]
fn every_proto_module_is_in_the_order() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/proto");
    let mut found = Vec::new();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        let p = e.path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            found.push(name);
        } else if let Some(m) = name.strip_suffix(".rs")
            && m != "mod"
            && !m.ends_with("tests")
        {
            found.push(m.to_string());
        }
    }
    found.sort();
    assert!(
        ["device", "qp", "srq", "uc", "ud", "congestion"]
            .iter()
            .all(|m| found.iter().any(|f| f == m)),
        "the walk missed modules: {found:?}"
    );
    let listed: Vec<&str> = PROTO_ORDER.iter().flat_map(|r| r.iter().copied()).collect();
    let missing: Vec<&String> = found
        .iter()
        .filter(|m| !listed.contains(&m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "proto modules not in PROTO_ORDER (tests/layering.rs): {missing:?}"
    );
    let mut twice = listed.clone();
    twice.sort();
    twice.dedup();
    assert_eq!(
        twice.len(),
        listed.len(),
        "a module on two rows: {listed:?}"
    );
    let decl = non_test(&std::fs::read_to_string(src.join("mod.rs")).unwrap());
    let declared = |m: &str| {
        decl.lines().any(|l| {
            let l = l.trim();
            l == format!("mod {m};")
                || l == format!("pub mod {m};")
                || l == format!("pub(crate) mod {m};")
        })
    };
    let undeclared: Vec<&&str> = listed.iter().filter(|m| !declared(m)).collect();
    assert!(
        undeclared.is_empty(),
        "proto modules not declared in proto/mod.rs: {undeclared:?}"
    );
    // No proto file reaches a proto module as its own child.
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        let p = e.path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".rs") && !name.ends_with("tests.rs") {
            let code = non_test(&std::fs::read_to_string(&p).unwrap());
            assert!(
                !code.lines().any(|l| l.trim_start().starts_with("#[path")),
                "proto/{name} declares a module by #[path] outside test code"
            );
        }
    }
}

/// The order forbids every back edge: for any two modules on different rows, the lower
/// one may not import the higher one, and two modules of one row not each other.
#[test]
fn the_proto_order_forbids_every_back_edge() {
    let rules = proto_rules();
    let forbidden = |a: &str, b: &str| {
        rules
            .iter()
            .find(|(m, _)| *m == a)
            .is_some_and(|(_, f)| f.contains(&b))
    };
    for (i, low) in PROTO_ORDER.iter().enumerate() {
        for (j, high) in PROTO_ORDER.iter().enumerate().skip(i) {
            for a in low.iter() {
                for b in high.iter().filter(|b| *b != a) {
                    assert!(forbidden(a, b), "{a} may import {b}");
                    if j > i {
                        assert!(!forbidden(b, a), "{b} may not import {a}");
                    }
                }
            }
        }
    }
    assert!(forbidden("qp", "device") && forbidden("responder", "qp"));
    assert!(forbidden("config", "qp") && forbidden("framing", "completer"));
    // The loops of UC, SRQ and UD stay broken.
    assert!(forbidden("qp", "uc") && forbidden("srq", "qp") && forbidden("srq", "device"));
    assert!(forbidden("ud", "device") && forbidden("device", "srq_verbs"));
}

/// The proto checker finds each form.
#[test]
fn the_proto_checker_sees_every_form() {
    let code = "use super::qp::Qp;\n\
                use super::{cq::Cq, device::Rnic};\n\
                use super::{\n    completer::X,\n    responder::Y,\n};\n\
                let s = crate::proto::requester::Z; // super::memory in a comment\n\
                use super::super::wire;\n\
                #[cfg(test)]\nuse super::wr::Sge;";
    let refs: Vec<String> = proto_refs(&non_test(code))
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    for m in ["qp", "cq", "device", "completer", "responder", "requester"] {
        assert!(refs.contains(&m.to_string()), "{m} in {refs:?}");
    }
    for m in ["memory", "wr"] {
        assert!(!refs.contains(&m.to_string()), "{m} in {refs:?}");
    }
}

/// The checker itself finds each form of a forbidden path.
#[test]
fn the_checker_sees_every_form_of_a_path() {
    let code = "use crate::sim::Pair;\n\
                let x = crate::verbs::netdev::mac_text(&m); // crate::cli in a comment\n\
                use crate::{io::link, wire::Qpn};\n\
                use crate::{\n    driver::Engine,\n    proto::Rnic,\n};\n\
                $crate::proto::trace::enabled();\n\
                #[cfg(test)]\nuse crate::cli::x;\n\
                #[cfg(test)]\nmod tests {\n    use crate::cli::y;\n}";
    let refs: Vec<String> = crate_refs(&non_test(code))
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    for m in ["sim", "verbs", "io", "wire", "driver", "proto"] {
        assert!(refs.contains(&m.to_string()), "{m} in {refs:?}");
    }
    assert!(!refs.contains(&"cli".to_string()), "{refs:?}");
    assert_eq!(refs.iter().filter(|m| *m == "proto").count(), 1, "{refs:?}");
}

/// In the crates on top the checker reads `xrnic::X` (and, in src/cli, `crate::X`), and
/// only names of the library's modules.
#[test]
fn the_checker_reads_the_crates_on_top() {
    let code = "use xrnic::verbs::Device;\n\
                let g = xrnic::service::gsi::grh_gids(&m); // xrnic::cli in a comment\n\
                use xrnic::{\n    proto::Rnic,\n    wire::Qpn,\n};\n\
                use crate::cq::Cq;\n\
                use xrnic_cli::cli::x;";
    let names = |layer| -> Vec<String> {
        layer_refs(layer, &non_test(code))
            .into_iter()
            .map(|(_, m)| m)
            .collect()
    };
    assert_eq!(names("abi"), ["verbs", "service", "proto", "wire"]);
    let cli = names("cli");
    assert_eq!(cli, ["verbs", "service", "proto", "wire"]);
    assert!(
        layer_refs("cli", "use crate::ipc::Req;\nuse crate::cli::perf;")
            .iter()
            .map(|(_, m)| m.as_str())
            .eq(["ipc"])
    );
    // The library's own files read `crate::` only.
    assert!(layer_refs("service", "use xrnic::verbs::Device;").is_empty());
}

/// Every `.rs` file of the library crate: all of src/ except the folders that are crates
/// of their own (they hold a Cargo.toml: src/cli, src/abi, src/netns) and `*tests.rs`
/// test modules.
fn library_files(src: &Path) -> Vec<PathBuf> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(d) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                if !p.join("Cargo.toml").exists() {
                    walk(&p, out);
                }
            } else if p.extension().is_some_and(|x| x == "rs")
                && !p
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .ends_with("tests.rs")
            {
                out.push(p);
            }
        }
    }
    let mut v = Vec::new();
    walk(src, &mut v);
    v.sort();
    v
}

/// The ways `code` (one file, tests cut) could run a program, each with its line: a path
/// to `std::process::Command` (direct, aliased, in a `process::{..}` group over any number
/// of lines, or a `process::*` glob), `Command::new`, `CommandExt`, and libc's exec /
/// spawn / fork / system calls.
fn program_runs(code: &str) -> Vec<(usize, String)> {
    const CALLS: &[&str] = &[
        "Command::new",
        "CommandExt",
        "process::Command",
        "process::*",
        "libc::exec",
        "libc::posix_spawn",
        "libc::fork",
        "libc::vfork",
        "libc::system",
        "libc::popen",
    ];
    let mut hits = Vec::new();
    // Inside a `process::{` group: its brace depth.
    let mut group: Option<usize> = None;
    for (n, line) in code.lines().enumerate() {
        let line = line.split("//").next().unwrap_or("");
        let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
        for c in CALLS {
            if compact.contains(c) {
                hits.push((n + 1, c.to_string()));
            }
        }
        let mut rest = compact.as_str();
        loop {
            if let Some(depth) = group.as_mut() {
                let mut end = None;
                for (i, ch) in rest.char_indices() {
                    match ch {
                        '{' => *depth += 1,
                        '}' => {
                            *depth -= 1;
                            if *depth == 0 {
                                end = Some(i);
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                let body = &rest[..end.unwrap_or(rest.len())];
                if body
                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .any(|w| w == "Command")
                {
                    hits.push((n + 1, "process::{.., Command, ..}".to_string()));
                }
                match end {
                    Some(i) => {
                        group = None;
                        rest = &rest[i + 1..];
                    }
                    None => break,
                }
            }
            match rest.find("process::{") {
                Some(i) => {
                    rest = &rest[i + "process::{".len()..];
                    group = Some(1);
                }
                None => break,
            }
        }
    }
    hits.sort();
    hits.dedup();
    hits
}

#[test]
fn no_file_of_the_library_runs_a_program() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let files = library_files(&src);
    // The walk sees the library and only the library (a broken walk would pass vacuously).
    let rel: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(root).unwrap().display().to_string())
        .collect();
    for f in [
        "src/lib.rs",
        "src/driver.rs",
        "src/io/link.rs",
        "src/io/afxdp/port.rs",
    ] {
        assert!(rel.iter().any(|r| r == f), "{f} not among {rel:?}");
    }
    for other in ["src/cli/", "src/abi/", "src/netns/"] {
        assert!(!rel.iter().any(|r| r.starts_with(other)), "{other} walked");
    }
    let mut bad = Vec::new();
    for (f, r) in files.iter().zip(&rel) {
        let text = std::fs::read_to_string(f).unwrap();
        for (line, what) in program_runs(&non_test(&text)) {
            bad.push(format!("{r}:{line}: {what}"));
        }
    }
    assert!(
        bad.is_empty(),
        "the library runs a program (it must not; a harness that runs one \
         belongs in src/netns or src/cli):\n{}",
        bad.join("\n")
    );
}

/// The program-run checker finds each form, and not test code or comments.
#[test]
fn the_program_checker_sees_every_form() {
    let forms = [
        "use std::process::Command;",
        "use std::process::Command as Cmd;",
        "let o = std::process::Command::new(\"ip\").output();",
        "use std::process::{Child, Command, Stdio};",
        "use std::process::{\n    Child,\n    Command,\n};",
        "use std::{io, process::{Output, Command}};",
        "use std::process::*;",
        "use std::os::unix::process::CommandExt;",
        "let c = Command :: new(x);",
        "unsafe { libc::execvp(p, a) };",
        "unsafe { libc::posix_spawnp(p, a) };",
        "unsafe { libc::fork() };",
    ];
    for f in forms {
        assert!(!program_runs(&non_test(f)).is_empty(), "missed: {f}");
    }
    let clean = [
        "let id = std::process::id();",
        "use std::process::{exit, id};",
        "std::process::abort();",
        "// std::process::Command in a comment",
        "enum Cmd { Command }",
        "#[cfg(test)]\nuse std::process::Command;",
        "#[cfg(test)]\nmod tests {\n    use std::process::Command;\n}",
    ];
    for c in clean {
        assert!(program_runs(&non_test(c)).is_empty(), "false hit: {c}");
    }
    // The line of a hit inside a multi-line group is the line naming Command.
    assert_eq!(
        program_runs("use std::process::{\n    Child,\n    Command,\n};"),
        vec![(3, "process::{.., Command, ..}".to_string())]
    );
}
