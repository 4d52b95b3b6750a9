//! The layers import one way (README, docs/README.md): wire/
//! imports nothing above it; proto/ no verbs, driver, sim, cli or io; the driver no verbs,
//! sim or cli; io/ none of proto, verbs, driver, sim or cli. This reads the sources and
//! fails on any `crate::X` path (in a `use`, a `use crate::{..}` group, or inline) that
//! names a forbidden module, outside comments and test code (`*tests.rs` files and what
//! follows `#[cfg(test)]` at the start of a line).
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

/// The crate's top-level modules.
const MODULES: &[&str] = &[
    "cm",
    "driver",
    "io",
    "oob",
    "proto",
    "service",
    "sim",
    "trace_out",
    "verbs",
    "wire",
];

/// (layer, the modules it must not import).
fn rules() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        (
            "wire",
            MODULES.iter().copied().filter(|m| *m != "wire").collect(),
        ),
        ("proto", vec!["verbs", "driver", "sim", "cli", "io"]),
        // The driver imports nothing above it.
        (
            "driver",
            vec!["verbs", "sim", "cli", "cm", "oob", "service", "trace_out"],
        ),
        ("io", vec!["proto", "verbs", "driver", "sim", "cli"]),
    ]
}

/// proto/'s import order, bottom first: each module may import only those on earlier
/// rows (and not those on its own row). The first row are the leaves (`config` is the
/// very bottom); every module of proto/ is on one row
/// (`every_proto_module_is_in_the_order`).
const PROTO_ORDER: &[&[&str]] = &[
    &["config", "counters", "time", "trace", "verdict", "user_mem"],
    &["cq", "timers", "sched", "congestion"],
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
    let mut rules = Vec::new();
    for (i, row) in PROTO_ORDER.iter().enumerate() {
        for m in row.iter() {
            let forbidden = PROTO_ORDER[i..]
                .iter()
                .flat_map(|r| r.iter().copied())
                .filter(|x| x != m)
                .collect();
            rules.push((*m, forbidden));
        }
    }
    rules
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

/// The files of one layer: `src/<layer>.rs` and everything under `src/<layer>/`.
fn layer_files(src: &Path, layer: &str) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let file = src.join(format!("{layer}.rs"));
    if file.is_file() {
        v.push(file);
    }
    rs_files(&src.join(layer), &mut v);
    v.retain(|p| {
        !p.file_name()
            .unwrap()
            .to_string_lossy()
            .ends_with("tests.rs")
    });
    v.sort();
    v
}

/// The top-level modules that `code` (one file, comments and tests cut) names through
/// `crate::`, with the line of each.
fn crate_refs(code: &str) -> Vec<(usize, String)> {
    let mut refs = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            // `xrnic_crate::` or `$crate::` are other paths.
            let before = rest[..i].chars().last();
            rest = &rest[i + "crate::".len()..];
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
    refs.extend(group_lines(code));
    refs
}

/// The items of multi-line `use crate::{` groups.
fn group_lines(code: &str) -> Vec<(usize, String)> {
    let mut refs = Vec::new();
    let mut open = false;
    for (n, line) in code.lines().enumerate() {
        let t = line.trim();
        if t.starts_with("use crate::{") || t.starts_with("pub use crate::{") {
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

#[test]
fn each_layer_imports_only_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    for (layer, forbidden) in rules() {
        let files = layer_files(&src, layer);
        assert!(!files.is_empty(), "no sources for {layer}");
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for (line, m) in crate_refs(&non_test(&text)) {
                if forbidden.contains(&m.as_str()) {
                    bad.push(format!(
                        "{}:{line}: {layer} imports crate::{m}",
                        f.strip_prefix(&src).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
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
