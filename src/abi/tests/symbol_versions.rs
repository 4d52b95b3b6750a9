//! A program built on any current distribution loads against the library: rdma-core 39
//! (Ubuntu 22.04), 44 (Debian 12), 50 (Ubuntu 24.04) and 56 (Debian 13). tests/symbols/
//! holds each release's default-version symbols, taken from its libibverbs.map.in and
//! librdmacm.map (the source and tag in each file's header); the library must export each
//! at its node (objdump -T), a program referencing all of them must start (BIND_NOW), and
//! the late verbs must answer with an errno where xrnic lacks them.
//!
//! Needs binutils (objdump), cc and libibverbs-dev's headers; without them the checks
//! show as ignored (src/abi/build.rs), under CI=true they run and fail.

mod common;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{
    RDMA_CORE_VERSIONS, all_listed_symbols, built_library, have, library_dir, require, symbol_list,
    versioned_exports,
};

const LIBS: [&str; 2] = ["libibverbs", "librdmacm"];

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The lists are well formed and the export table (exports.rs, rdmacm_exports.rs) names
/// each of their symbols at its node: no prerequisite, so a list the table misses fails
/// on every machine.
#[test]
fn the_export_tables_name_every_listed_symbol_at_its_node() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let table = std::fs::read_to_string(dir.join("exports.rs")).unwrap()
        + &std::fs::read_to_string(dir.join("rdmacm_exports.rs")).unwrap();
    let map = std::fs::read_to_string(dir.join("libibverbs.map")).unwrap();
    for version in RDMA_CORE_VERSIONS {
        for lib in LIBS {
            let path = dir.join(format!("tests/symbols/{lib}-{version}.txt"));
            let head = std::fs::read_to_string(&path).unwrap();
            assert!(
                head.starts_with(&format!("# rdma-core v{version} ")),
                "{}: the first line names the release",
                path.display()
            );
            let list = symbol_list(lib, version);
            assert!(
                list.len() > 60,
                "{}: {} symbols",
                path.display(),
                list.len()
            );
            for (name, node) in &list {
                let prefix = if lib == "libibverbs" {
                    "IBVERBS_"
                } else {
                    "RDMACM_"
                };
                assert!(
                    node.starts_with(prefix),
                    "{name} {node} in {}",
                    path.display()
                );
                assert!(
                    map.contains(&format!("\n{node} {{")),
                    "node {node} not declared"
                );
                let entry = [
                    format!("fn {name} @ \"{node}\" =>"),
                    format!("data {name} @ \"{node}\" ="),
                ];
                assert!(
                    entry.iter().any(|e| table.contains(e.as_str())),
                    "{name}@@{node} (rdma-core {version}) is not in the export table"
                );
            }
        }
    }
    // What each release adds, named (a list regenerated wrongly fails here).
    let v44 = symbol_list("libibverbs", "44.0");
    let v56 = symbol_list("libibverbs", "56.0");
    let added: Vec<_> = v56.difference(&v44).map(|(n, _)| n.as_str()).collect();
    assert_eq!(added, ["ibv_cmd_create_cq_ex2", "ibv_wr_opcode_str"]);
    assert!(v44.is_subset(&v56));
    assert_eq!(
        symbol_list("libibverbs", "39.0"),
        v44,
        "39 and 44 export the same"
    );
}

/// The built library exports every listed (symbol, node) of every release, and no
/// symbol at a libibverbs or librdmacm node that no listed release has.
#[test]
#[cfg_attr(xrnic_no_objdump, ignore = "needs binutils")]
fn the_library_exports_each_releases_symbols_at_their_nodes() {
    require(have("objdump"), "objdump (binutils)");
    let ours = versioned_exports(&built_library());
    for version in RDMA_CORE_VERSIONS {
        for lib in LIBS {
            let list = symbol_list(lib, version);
            let missing: Vec<_> = list.difference(&ours).collect();
            assert!(missing.is_empty(), "{lib} {version}: missing {missing:?}");
        }
    }
    let all = all_listed_symbols();
    let extra: Vec<_> = ours
        .iter()
        .filter(|(_, v)| v.starts_with("IBVERBS_") || v.starts_with("RDMACM_"))
        .filter(|s| !all.contains(*s))
        .collect();
    assert!(extra.is_empty(), "in no listed release: {extra:?}");
}

/// Debian 12's own libraries export exactly the committed rdma-core 44 lists: the lists
/// are what a build of the map exports, not only what the map names.
#[test]
#[cfg_attr(
    any(xrnic_no_real_libibverbs, xrnic_no_real_librdmacm),
    ignore = "needs binutils, libibverbs1 and librdmacm1"
)]
fn the_rdma_core_44_lists_are_what_debian_12s_libraries_export() {
    require(have("objdump"), "objdump (binutils)");
    for lib in LIBS {
        let real = PathBuf::from(format!("/usr/lib/x86_64-linux-gnu/{lib}.so.1"));
        require(real.exists(), &format!("{lib}1 ({})", real.display()));
        let exported: BTreeSet<_> = versioned_exports(&real)
            .into_iter()
            .filter(|(_, v)| v.starts_with("IBVERBS_") || v.starts_with("RDMACM_"))
            .collect();
        assert_eq!(exported, symbol_list(lib, "44.0"), "{lib}");
    }
}

/// A C program that references every (symbol, node) of `list` with `.symver` (as a
/// program built against that release binds them), linked against the built library
/// with BIND_NOW; returns the executable. It prints the number of symbols it resolved.
fn program_for(list: &BTreeSet<(String, String)>, dir: &Path, tag: &str) -> PathBuf {
    let mut src = String::from("#include <stdio.h>\n");
    for (i, (name, node)) in list.iter().enumerate() {
        writeln!(src, "extern char s{i}[];").unwrap();
        writeln!(src, "__asm__(\".symver s{i}, {name}@{node}\");").unwrap();
    }
    src.push_str("static const void *const all[] = {\n");
    for i in 0..list.len() {
        writeln!(src, "\ts{i},").unwrap();
    }
    src.push_str(
        "};\nint main(void)\n{\n\tunsigned n = 0;\n\
         \tfor (unsigned i = 0; i < sizeof(all) / sizeof(all[0]); i++)\n\
         \t\tn += all[i] != 0;\n\tprintf(\"%u\\n\", n);\n\treturn 0;\n}\n",
    );
    let c = dir.join(format!("{tag}.c"));
    let exe = dir.join(tag);
    std::fs::write(&c, src).unwrap();
    // -fPIC: every reference goes through the GOT, none is a copy relocation.
    let o = Command::new("cc")
        .args(["-fPIC", "-Wall", "-Werror", "-Wl,-z,now", "-o"])
        .arg(&exe)
        .arg(&c)
        .arg(dir.join("libibverbs.so.1"))
        .output()
        .unwrap();
    assert!(o.status.success(), "cc {tag}: {}", text(&o));
    exe
}

/// For each release, a program bound to every symbol of its libibverbs and one bound to
/// every symbol of its librdmacm start against the library (the loader resolves each
/// versioned reference at start) and see all their symbols.
#[test]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs cc")]
fn a_program_built_against_each_release_loads() {
    require(have("cc"), "cc (gcc)");
    let dir = library_dir("symver");
    for version in RDMA_CORE_VERSIONS {
        for lib in LIBS {
            let list = symbol_list(lib, version);
            let exe = program_for(&list, &dir, &format!("{lib}-{version}"));
            let o = Command::new(&exe)
                .env("LD_LIBRARY_PATH", &dir)
                .output()
                .unwrap();
            assert!(o.status.success(), "{lib} {version}: {}", text(&o));
            assert_eq!(
                String::from_utf8_lossy(&o.stdout).trim(),
                list.len().to_string(),
                "{lib} {version}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same programs against Debian 12's real libibverbs (rdma-core 44): the one built for
/// rdma-core 44 starts, the one for 56 does not (its ibv_cmd_create_cq_ex2 and
/// ibv_wr_opcode_str are not there). So
/// the check above can fail, and the programs bind what the lists say.
#[test]
#[cfg_attr(
    any(xrnic_no_libibverbs_dev, xrnic_no_real_libibverbs),
    ignore = "needs cc and libibverbs1"
)]
fn the_rdma_core_56_program_does_not_load_against_rdma_core_44() {
    require(have("cc"), "cc (gcc)");
    let real = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";
    require(Path::new(real).exists(), "libibverbs1");
    let dir = library_dir("symver-real");
    let v44 = program_for(&symbol_list("libibverbs", "44.0"), &dir, "v44");
    let v56 = program_for(&symbol_list("libibverbs", "56.0"), &dir, "v56");
    let real_dir = dir.join("real");
    std::fs::create_dir_all(&real_dir).unwrap();
    let _ = std::fs::remove_file(real_dir.join("libibverbs.so.1"));
    std::os::unix::fs::symlink(real, real_dir.join("libibverbs.so.1")).unwrap();
    let run = |exe: &Path| {
        Command::new(exe)
            .env("LD_LIBRARY_PATH", &real_dir)
            .output()
            .unwrap()
    };
    let o = run(&v44);
    assert!(o.status.success(), "v44 on rdma-core 44: {}", text(&o));
    let o = run(&v56);
    assert!(
        !o.status.success(),
        "v56 on rdma-core 44 started: {}",
        text(&o)
    );
    let err = text(&o);
    assert!(err.contains("version IBVERBS_PRIVATE_34"), "{err}");
    assert!(
        err.contains("ibv_cmd_create_cq_ex2") || err.contains("ibv_wr_opcode_str"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// tests/c/late_verbs.c, built against the installed verbs.h and run on a veth pair in a
/// network namespace of its own: the late verbs link, load and answer, an errno where
/// xrnic does not implement them (what rdma-core answers for a provider without them).
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn late_verbs_link_load_and_answer_an_errno() {
    require(have("cc"), "cc (gcc)");
    require(have("unshare"), "unshare (util-linux)");
    require(have("ip"), "ip (iproute2)");
    let dir = library_dir("late");
    let exe = dir.join("late_verbs");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/late_verbs.c");
    let o = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(dir.join("libibverbs.so.1"))
        .output()
        .unwrap();
    assert!(o.status.success(), "cc: {}", text(&o));
    let o = Command::new("unshare")
        .args(["-n", "sh", "-c"])
        .arg(
            "ip link add v0 type veth peer name v1 && ip link set v0 up && ip link set v1 up \
             && ip addr add 192.0.2.1/24 dev v0 && exec \"$0\"",
        )
        .arg(&exe)
        .env("LD_LIBRARY_PATH", &dir)
        .env("XRNIC_NETDEV", "v0")
        .output()
        .unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let eopnotsupp = libc::EOPNOTSUPP;
    let lines: Vec<&str> = out.lines().collect();
    let fork = lines
        .iter()
        .find_map(|l| l.strip_prefix("ibv_is_fork_initialized "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        ["0", "1", "2"].contains(&fork),
        "enum ibv_fork_status: {out}"
    );
    for want in [
        "ibv_query_qp_data_in_order 0".to_string(),
        format!("ibv_reg_dmabuf_mr NULL errno {eopnotsupp}"),
        format!("ibv_import_device NULL errno {eopnotsupp}"),
        format!("ibv_query_ece {eopnotsupp}"),
        "ibv_wr_opcode_str send".to_string(),
        "done".to_string(),
    ] {
        assert!(
            lines.contains(&want.as_str()),
            "no line {want:?} in:\n{out}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
