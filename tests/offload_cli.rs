//! The offload backend's selection and errors in the CLI, on a machine with or without
//! RDMA devices (the traffic itself is tested in the rxe guest: tests/verbs_api.rs and
//! interop/run-offload.sh): a missing libibverbs is a clear message, not a crash; an
//! interface name given as an RDMA device gets a hint; `--netdev` and `--device` are
//! exclusive.

#[path = "common/bin_path.rs"]
mod bin_path;
use bin_path::xrnic_bin;

use std::process::{Command, Output};

fn xrnic(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(xrnic_bin());
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run xrnic")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const NO_LIB: (&str, &str) = ("XRNIC_LIBIBVERBS", "/nonexistent/libibverbs.so.1");

#[test]
fn without_libibverbs_rdma_devices_are_a_clear_error() {
    let o = xrnic(&["devinfo", "-d", "rxe0"], &[NO_LIB]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("libibverbs is not available"), "{e}");
    assert!(e.contains("/nonexistent/libibverbs.so.1"), "{e}");
    for cmd in [
        &["rc-pingpong", "-d", "rxe0"][..],
        &["perf", "write", "--device", "rxe0"],
    ] {
        let o = xrnic(cmd, &[NO_LIB]);
        assert_eq!(o.status.code(), Some(1), "{cmd:?}");
        assert!(
            stderr(&o).contains("libibverbs is not available"),
            "{cmd:?}"
        );
    }
}

#[test]
fn devinfo_without_a_name_lists_netdevs_and_says_why_no_rdma_device() {
    let o = xrnic(&["devinfo"], &[NO_LIB]);
    let e = stderr(&o);
    assert!(
        e.contains("no RDMA devices listed: libibverbs is not available"),
        "{e}"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    // Every Ethernet interface of this namespace is listed as a software device.
    let mut n = 0;
    for d in std::fs::read_dir("/sys/class/net").unwrap().flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        let ty = std::fs::read_to_string(d.path().join("type")).unwrap_or_default();
        if name != "lo" && ty.trim() == "1" {
            assert!(
                out.contains(&format!("hca_id:\txrnic_{name}\n")),
                "{name}: {out}"
            );
            n += 1;
        }
    }
    assert_eq!(o.status.code(), Some(if n > 0 { 0 } else { 1 }), "{e}");
}

#[test]
fn an_interface_named_as_an_rdma_device_gets_a_hint() {
    let o = xrnic(&["rc-pingpong", "-d", "lo"], &[]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    if !e.contains("libibverbs is not available") {
        assert!(e.contains("no RDMA device lo"), "{e}");
        assert!(e.contains("use --netdev lo"), "{e}");
    }
}

#[test]
fn netdev_and_device_are_exclusive() {
    for cmd in [
        &["devinfo", "--netdev", "eth0", "-d", "rxe0"][..],
        &["rc-pingpong", "--netdev", "eth0", "--device", "rxe0"],
        &["perf", "send", "--netdev", "eth0", "-d", "rxe0"],
        &["stat", "--netdev", "eth0", "-d", "rxe0"],
        &["perf", "send"],
        &["stat"],
    ] {
        let o = xrnic(cmd, &[]);
        assert_eq!(o.status.code(), Some(2), "{cmd:?}: {}", stderr(&o));
    }
}

#[test]
fn stat_of_a_missing_rdma_device_is_an_error() {
    let o = xrnic(&["stat", "-d", "nosuch0"], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no RDMA device nosuch0"),
        "{}",
        stderr(&o)
    );
}
