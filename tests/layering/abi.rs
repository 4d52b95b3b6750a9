//! The C library's modules (src/abi, the drop-in libibverbs.so.1 and librdmacm.so.1)
//! import one way ([`ABI_ORDER`], docs/verbs-abi.md): the C types and pure helpers <-
//! the context module (context/: what a context and its objects are, how an entry point
//! finds them from a C pointer, the destroy ops table, as rdma-core's providers declare
//! them for libibverbs/driver.h's `verbs_context_ops`) <- the object modules (mr, cq,
//! qp, srq, ah, mcast, events), leaves that never import each other <- ops (the tables
//! that name the object modules' verbs) <- opened, device (opening and closing: they
//! reach the objects only through the ops table and the context module, [`THROUGH_OPS`])
//! <- rdmacm_port
//! (librdmacm's CM port) <- rdmacm <- exports (the symbol tables).
//!
//! This reads the sources and fails on any `crate::X` path (in a `use`, a `use
//! crate::{..}` group, or inline) from a module to one not on an earlier row of the
//! order, outside comments and test code (`*tests.rs` files and what follows
//! `#[cfg(test)]` at the start of a line), as tests/layering.rs does for the `xrnic`
//! crate. Names of the crate root (lib.rs: `guard`, `ret`, `set_errno`, `live`) are
//! below every module. Every module of src/abi is on one row.
//!
//! `cargo test --test layering -- --nocapture abi_module_graph` prints the graph.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{crate_refs, non_test, rs_files};

/// src/abi's import order, bottom first: each module may import only those on earlier
/// rows (and not those on its own row).
const ABI_ORDER: &[&[&str]] = &[
    // The verbs.h structures, their layout check, pure helpers, the unimplemented entry
    // points, the stderr hook.
    &["types", "misc", "stubs", "stderr"],
    &["layout"],
    // What a context and its objects are, their lookups, the ops table's type.
    &["context"],
    // The object modules: leaves.
    &["mr", "cq", "qp", "srq", "ah", "mcast", "events"],
    // The ops tables filled with the object modules' verbs.
    &["ops"],
    // The devices open, shared by their contexts; then the device list, open, close.
    &["opened"],
    &["device"],
    // librdmacm: its CM port per device, then the ids.
    &["rdmacm_port"],
    &["rdmacm"],
    // Every exported symbol.
    &["exports"],
];

/// Files that are `#[path]` children of another module (counted as that module's).
const PATH_CHILDREN: &[(&str, &str)] = &[("rdmacm_exports", "exports")];

/// The row of `m` in [`ABI_ORDER`].
fn row(m: &str) -> Option<usize> {
    ABI_ORDER.iter().position(|r| r.contains(&m))
}

/// The object modules' row of [`ABI_ORDER`].
const OBJECTS: usize = 3;

/// Modules that reach the objects only through the ops table and the context module:
/// they may not import the object row although it is below them.
const THROUGH_OPS: &[&str] = &["opened", "device"];

/// `from` must not import `to`: `to` is a module of src/abi not on an earlier row, or
/// an object module and `from` one of [`THROUGH_OPS`].
fn forbidden(from: &str, to: &str) -> bool {
    match (row(from), row(to)) {
        (Some(f), Some(t)) => {
            from != to && (t >= f || (t == OBJECTS && THROUGH_OPS.contains(&from)))
        }
        _ => false,
    }
}

fn abi_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/abi")
}

/// The module of src/abi a file belongs to (`None`: the crate root, the build script,
/// the integration tests under src/abi/tests), and whether it is test code.
fn module_of(abi: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(abi).ok()?;
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    if matches!(name.as_str(), "lib" | "build" | "tests") {
        return None;
    }
    let name = PATH_CHILDREN
        .iter()
        .find(|(child, _)| *child == name)
        .map_or(name, |(_, parent)| parent.to_string());
    Some(name)
}

/// Every non-test file of src/abi by module.
fn abi_modules() -> BTreeMap<String, Vec<PathBuf>> {
    let abi = abi_dir();
    let mut files = Vec::new();
    rs_files(&abi, &mut files);
    files.sort();
    let mut m: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for f in files {
        if f.file_name()
            .unwrap()
            .to_string_lossy()
            .ends_with("tests.rs")
        {
            continue;
        }
        if let Some(name) = module_of(&abi, &f) {
            m.entry(name).or_default().push(f);
        }
    }
    m
}

/// The module graph: each module and the modules of src/abi it imports (with the file
/// and line of the first such import).
fn graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let mods = abi_modules();
    let mut g = BTreeMap::new();
    for (m, files) in &mods {
        let mut edges = BTreeMap::new();
        for f in files {
            let code = non_test(&std::fs::read_to_string(f).unwrap());
            for (line, to) in crate_refs(&code) {
                if mods.contains_key(&to) && to != *m {
                    edges
                        .entry(to)
                        .or_insert_with(|| format!("{}:{line}", f.display()));
                }
            }
        }
        g.insert(m.clone(), edges);
    }
    g
}

#[test]
fn abi_imports_one_way() {
    let mut bad = Vec::new();
    for (m, edges) in graph() {
        for (to, at) in edges {
            if forbidden(&m, &to) {
                bad.push(format!("{at}: {m} imports {to}"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports against ABI_ORDER:\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_abi_module_is_in_the_order() {
    let mods = abi_modules();
    assert!(mods.len() >= 15, "src/abi not found: {mods:?}");
    let missing: Vec<&String> = mods.keys().filter(|m| row(m).is_none()).collect();
    assert!(missing.is_empty(), "modules not in ABI_ORDER: {missing:?}");
    let stale: Vec<&&str> = ABI_ORDER
        .iter()
        .flat_map(|r| r.iter())
        .filter(|m| !mods.contains_key(**m))
        .collect();
    assert!(stale.is_empty(), "ABI_ORDER names no module: {stale:?}");
}

#[test]
fn the_abi_order_forbids_every_back_edge() {
    // Object modules are leaves: none imports another, nor the device code.
    for (a, b) in [
        ("qp", "cq"),
        ("srq", "qp"),
        ("cq", "events"),
        ("events", "srq"),
    ] {
        assert!(forbidden(a, b), "{a} -> {b}");
    }
    assert!(forbidden("qp", "device") && forbidden("mr", "opened"));
    // Device opening reaches the objects only through ops and the context.
    assert!(forbidden("device", "qp") && forbidden("opened", "cq"));
    assert!(!forbidden("device", "ops") && !forbidden("opened", "context"));
    // The context module knows no object module; rdmacm_port does not call rdmacm.
    assert!(forbidden("context", "qp") && forbidden("context", "device"));
    assert!(forbidden("rdmacm_port", "rdmacm") && !forbidden("rdmacm", "rdmacm_port"));
    assert!(!forbidden("qp", "context") && !forbidden("exports", "rdmacm"));
    assert_eq!(
        ABI_ORDER[OBJECTS],
        ["mr", "cq", "qp", "srq", "ah", "mcast", "events"]
    );
}

#[test]
fn the_abi_checker_sees_every_form() {
    let code = "use crate::qp::xqp;\n\
                let x = crate::cq::xcq(p); // crate::srq in a comment\n\
                use crate::{guard, mr::XPd};\n\
                use crate::{\n    ah::xah, events,\n};\n\
                let y = xrnic_crate::device::z; $crate::device\n\
                #[cfg(test)]\nuse crate::device::x;\n\
                #[cfg(test)]\nmod tests {\n    use crate::opened::y;\n}";
    let refs: Vec<String> = crate_refs(&non_test(code))
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    assert_eq!(refs, ["qp", "cq", "guard", "mr", "ah", "events"]);
    let root = abi_dir();
    assert_eq!(
        module_of(&root, &root.join("context/objects.rs")),
        Some("context".into())
    );
    assert_eq!(
        module_of(&root, &root.join("rdmacm_exports.rs")),
        Some("exports".into())
    );
    assert_eq!(module_of(&root, &root.join("lib.rs")), None);
    assert_eq!(module_of(&root, &root.join("tests/common/mod.rs")), None);
}

/// Prints src/abi's module graph (`-- --nocapture`) and checks it has no cycle: every
/// module's imports come before it in a topological order.
#[test]
fn abi_module_graph() {
    let g = graph();
    for (m, edges) in &g {
        let to: Vec<&str> = edges.keys().map(String::as_str).collect();
        println!("{m:12} -> {}", to.join(" "));
    }
    let mut done: Vec<&str> = Vec::new();
    while done.len() < g.len() {
        let next = g.iter().find(|(m, e)| {
            !done.contains(&m.as_str()) && e.keys().all(|t| done.contains(&t.as_str()))
        });
        let Some((m, _)) = next else {
            let rest: Vec<&String> = g.keys().filter(|m| !done.contains(&m.as_str())).collect();
            panic!("a cycle among {rest:?}");
        };
        done.push(m);
    }
}
