//! End to end: the built `xrnic sim` binary, its JSON summary and its exit codes.

#[path = "common/bin_path.rs"]
mod bin_path;
use bin_path::xrnic_bin;

use std::process::Command;

fn xrnic(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(xrnic_bin())
        .args(args)
        .output()
        .expect("run xrnic");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn summary(stdout: &str) -> serde_json::Value {
    let last = stdout.lines().last().expect("some output");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"))
}

#[test]
fn lossy_mixed_run_verifies_and_reports_json() {
    let (code, out, err) = xrnic(&[
        "sim",
        "--ops",
        "mixed",
        "--messages",
        "400",
        "--size",
        "0..65536",
        "--mtu",
        "2048",
        "--loss",
        "0.02",
        "--reorder",
        "0.01",
        "--dup",
        "0.01",
        "--corrupt",
        "0.01",
        "--seed",
        "9",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let s = summary(&out);
    for k in [
        "messages_completed",
        "errors",
        "bytes_verified",
        "retransmitted_packets",
        "naks_sent",
        "rnr_naks_sent",
        "duplicates_received",
        "virtual_time_us",
    ] {
        assert!(s[k].is_u64(), "{k} missing in {s}");
    }
    assert_eq!(s["messages_completed"], 400);
    assert_eq!(s["errors"], 0);
    assert!(s["bytes_verified"].as_u64().unwrap() > 1_000_000);
    assert!(s["retransmitted_packets"].as_u64().unwrap() > 0);
    assert!(s["naks_sent"].as_u64().unwrap() > 0);
    assert!(s["virtual_time_us"].as_u64().unwrap() > 0);
    assert_eq!(s["ok"], true);
    // Same seed, same run.
    let (_, out2, _) = xrnic(&[
        "sim",
        "--ops",
        "mixed",
        "--messages",
        "400",
        "--size",
        "0..65536",
        "--mtu",
        "2048",
        "--loss",
        "0.02",
        "--reorder",
        "0.01",
        "--dup",
        "0.01",
        "--corrupt",
        "0.01",
        "--seed",
        "9",
        "--json",
    ]);
    assert_eq!(summary(&out2), s);
}

#[test]
fn every_op_kind_runs_over_ipv6() {
    for ops in ["send", "write", "read", "atomic"] {
        let (code, out, err) =
            xrnic(&["sim", "--ops", ops, "--messages", "50", "--ipv6", "--json"]);
        assert_eq!(code, 0, "{ops}: {out}\n{err}");
        assert_eq!(summary(&out)["messages_completed"], 50, "{ops}");
    }
}

#[test]
fn a_dead_link_fails_with_a_nonzero_exit() {
    let (code, out, _) = xrnic(&["sim", "--messages", "5", "--loss", "1", "--json"]);
    assert_eq!(code, 1, "{out}");
    let s = summary(&out);
    assert_eq!(s["ok"], false);
    assert_eq!(s["errors"], 5, "one RETRY_EXC_ERR and four flushed");
    assert!(
        s["first_error"].as_str().unwrap().contains("RetryExcErr"),
        "{s}"
    );
}

#[test]
fn bad_arguments_are_refused_clearly() {
    for (args, needle) in [
        (&["sim", "--mtu", "1500"][..], "not a path MTU"),
        (&["sim", "--loss", "2"][..], "not a probability"),
        (&["sim", "--size", "70000"][..], "65536"),
        (&["sim", "--ops", "flush"][..], "invalid value"),
        (&["sim", "--messages", "many"][..], "invalid value"),
    ] {
        let (code, out, err) = xrnic(args);
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(needle), "{args:?}: stderr {err:?}");
        assert!(out.is_empty(), "{args:?}");
    }
}
