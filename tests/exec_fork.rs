//! fork() with a device open (docs/verbs-abi.md "fork"): tests/c/verbs_fork.c, compiled
//! with cc against the system's <infiniband/verbs.h> (libibverbs-dev), run by one `xrnic
//! exec` on one end of a veth pair. The parent registers memory, joins two QPs and posts
//! a receive, then forks; the child finds every inherited object refused (EINVAL, the
//! parent's objects untouched), closes the inherited context (0) and opens the device
//! itself. Through the device service `xrnic exec` starts, the child gets its own context
//! and connection, and its QP and one of the parent's exchange a SEND each way; in
//! process (`--in-process`) the parent holds the interface and the child's open fails
//! EBUSY. Either way the parent's receive posted before the fork is still pending after
//! the child exited, and the parent's QPs work on.
//!
//! tests/c/rdmacm_fork.c: rdma_cm across fork(), as rdma-core's rdma_cm tests run it (the
//! CM used before the fork; the child listens and accepts, the parent connects and
//! sends), through the service one `xrnic exec` starts.
//!
//! Root tests (`#[ignore = "needs root"]`, docs/testing.md); the library must be built
//! (`cargo build --workspace`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{require_c_headers, text, xrnic_bin};
use xrnic_netns::{Side, VethPair};

/// tests/c/NAME.c built, linked with `libs` ([`common::build_c`]), once the library it
/// runs on is there.
fn build(name: &str, libs: &[&str]) -> (PathBuf, PathBuf) {
    let lib = Path::new(xrnic_bin()).with_file_name("libibverbs.so");
    assert!(
        lib.exists(),
        "{} missing: cargo build --workspace",
        lib.display()
    );
    common::build_c(name, libs)
}

/// The program under one `xrnic exec` (`--in-process` when `mode` is "in-process") on
/// A's interface; checks its output: `lines` among the PASS lines, the two summaries.
fn run(mode: &str, lines: &[&str], child_checks: u32) {
    let (dir, exe) = build("verbs_fork", &["-libverbs"]);
    let pair = VethPair::new(1500).expect("veth pair (root)");
    let e = pair.end(Side::A);
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &e.netns, "timeout", "120", xrnic_bin()])
        .args(["exec", "--netdev", &e.ifname]);
    if mode == "in-process" {
        c.arg("--in-process");
    }
    let o = c
        .arg("--")
        .arg(&exe)
        .arg(format!("xrnic_{}", e.ifname))
        .arg("1")
        .arg(mode)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let t = text(&o);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{t}");
    assert!(!s.contains("FAIL:"), "{t}");
    assert!(
        s.contains(&format!("{child_checks} passed, 0 failed")),
        "the child's summary: {t}"
    );
    let parent = if mode == "in-process" { 10 } else { 13 };
    assert!(
        s.trim_end()
            .ends_with(&format!("{parent} passed, 0 failed")),
        "the parent's summary, last: {t}"
    );
    for line in [
        "PASS: child: ibv_post_send on the inherited QP: EINVAL",
        "PASS: child: ibv_poll_cq on the inherited CQ: -1, errno EINVAL",
        "PASS: child: ibv_destroy_qp of the inherited QP: EINVAL",
        "PASS: child: ibv_close_device of the inherited context: 0",
        "PASS: after the child: the receive posted before the fork takes a SEND",
        "PASS: and the parent's QPs exchange again",
    ]
    .iter()
    .chain(lines)
    {
        assert!(s.contains(line), "{line}: {t}");
    }
}

/// Through the service `xrnic exec` starts. Fails on a library whose child reuses the
/// parent's device and connection (the inherited objects answered, the child's open
/// found the parent's device).
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn a_fork_child_gets_its_own_context_through_the_service() {
    run(
        "service",
        &[
            "PASS: child: ibv_open_device: a context of its own",
            "PASS: the child's SEND arrived at the parent's QP",
            "PASS: child: its SEND completed and the parent's SEND arrived",
        ],
        18,
    );
}

/// In process: the child cannot have the interface its parent holds.
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn a_fork_child_in_process_gets_ebusy_and_leaves_the_parent_alone() {
    run(
        "in-process",
        &["PASS: child: ibv_open_device while the parent holds the interface in process: EBUSY"],
        13,
    );
}

/// tests/c/rdmacm_fork.c under one `xrnic exec`. Fails on a library whose child reuses
/// its parent's CM port (the connection is rejected: nobody listens on the parent's).
#[test]
#[cfg_attr(not(xrnic_no_librdmacm_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_librdmacm_dev, ignore = "needs root and librdmacm-dev")]
fn rdma_cm_across_fork_child_listens_parent_connects() {
    require_c_headers("/usr/include/rdma/rdma_cma.h", "librdmacm-dev");
    let (dir, exe) = build("rdmacm_fork", &["-lrdmacm", "-libverbs"]);
    let pair = VethPair::new(1500).expect("veth pair (root)");
    let e = pair.end(Side::A);
    let o = Command::new("ip")
        .args(["netns", "exec", &e.netns, "timeout", "120", xrnic_bin()])
        .args(["exec", "--netdev", &e.ifname, "--"])
        .arg(&exe)
        .arg(e.ipv4.to_string())
        .arg("7480")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let t = text(&o);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{t}");
    assert!(!s.contains("FAIL:"), "{t}");
    assert!(s.contains("6 passed, 0 failed"), "the child's summary: {t}");
    assert!(
        s.trim_end().ends_with("7 passed, 0 failed"),
        "the parent's summary, last: {t}"
    );
    for line in [
        "PASS: child: the parent's SEND arrived",
        "PASS: connected to the child: RDMA_CM_EVENT_ESTABLISHED",
        "PASS: child: RDMA_CM_EVENT_DISCONNECTED",
    ] {
        assert!(s.contains(line), "{line}: {t}");
    }
}
