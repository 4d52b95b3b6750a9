//! rdma-core's own rdma_cm tests (python3-pyverbs: `run_tests.py -k rdmacm`) on xrnic,
//! as a user runs them: under one `xrnic exec` as root (a device service shared by the
//! suite's forked passive and active processes, docs/verbs-abi.md "Several processes"),
//! and as `nobody` through a device service root started. Each test forks its two sides
//! from a process that has already opened the device (docs/verbs-abi.md "fork"); the
//! multicast tests bind with `rdma_getaddrinfo`'s source address and make their address
//! handles on the id's PD; the external-QP test moves its own QP with
//! `rdma_init_qp_attr` before `rdma_accept` and calls `rdma_establish`.
//!
//! Root tests (`#[ignore = "needs root"]`, docs/testing.md); python3-pyverbs installed
//! (build.rs ignores them without it, except under CI=true). The whole suite, with its
//! table against rxe0, is `make conformance` (docs/interop.md).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{text, xrnic_bin};
use xrnic_netns::{Side, VethPair};

const SUITE: &str = "/usr/share/doc/rdma-core/tests";

/// The suite as run_tests.py needs it: Debian compresses its larger files (dh_compress),
/// which Python does not import, so a copy with them unpacked, readable by nobody.
fn suite_copy(tag: &str) -> PathBuf {
    assert!(
        Path::new(SUITE).join("run_tests.py").exists(),
        "{SUITE}/run_tests.py missing: apt-get install python3-pyverbs"
    );
    let dir = std::env::temp_dir().join(format!("xrnic-rdmacm-suite-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "mkdir -p '{d}' && cp -r {SUITE}/. '{d}/' && gunzip -f '{d}'/*.py.gz && \
             chmod -R a+rX '{d}'",
            d = dir.display()
        ))
        .status()
        .unwrap();
    assert!(ok.success(), "copying the suite to {}", dir.display());
    dir
}

/// `run_tests.py --dev xrnic_IF -v -k rdmacm` under `xrnic exec`, in A's namespace,
/// with `prefix` before xrnic (e.g. setpriv to nobody). Debian's python3 has pyverbs.
fn run_suite(pair: &VethPair, dir: &Path, prefix: &[&str]) -> Output {
    let ifname = pair.end(Side::A).ifname.clone();
    let dev = format!("xrnic_{ifname}");
    let script = dir.join("run_tests.py");
    Command::new("ip")
        .args(["netns", "exec", &pair.end(Side::A).netns, "timeout", "600"])
        .args(prefix)
        .args([xrnic_bin(), "exec", "--netdev", &ifname, "--"])
        .args(["/usr/bin/python3", script.to_str().unwrap()])
        .args(["--dev", &dev, "-v", "-k", "rdmacm"])
        .current_dir(dir)
        .output()
        .unwrap()
}

/// Every rdma_cm test the suite has for a device like this one passed: unittest's summary
/// is OK, and of the tests it ran only the two mlx5 ones were skipped ("Ran N tests",
/// "OK (skipped=K)": N - K passed; a FAIL or ERROR makes the summary FAILED).
fn assert_all_pass(o: &Output) {
    let out = text(o);
    let number_after = |key: &str| -> Option<usize> {
        let at = out.find(key)? + key.len();
        out[at..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect::<String>()
            .parse()
            .ok()
    };
    let ran = number_after("\nRan ").unwrap_or(0);
    let skipped = number_after("OK (skipped=").unwrap_or(0);
    assert!(
        o.status.success() && out.contains("\nOK") && ran >= 12 && skipped <= 2,
        "ran {ran}, skipped {skipped}, status {:?}:\n{out}",
        o.status
    );
    for name in [
        "test_rdmacm_sync_traffic",
        "test_rdmacm_async_traffic_external_qp",
        "test_rdmacm_async_multicast_traffic",
        "test_rdmacm_async_read",
    ] {
        assert!(out.contains(name), "{name} did not run:\n{out}");
    }
}

fn pair() -> VethPair {
    let pair = VethPair::new(1500).expect("veth pair (root)");
    pair.exec(Side::A, &["ip", "link", "set", "lo", "up"])
        .unwrap();
    pair
}

#[test]
#[cfg_attr(not(xrnic_no_pyverbs), ignore = "needs root")]
#[cfg_attr(xrnic_no_pyverbs, ignore = "needs root and python3-pyverbs")]
fn rdma_cm_tests_pass_under_one_xrnic_exec_as_root() {
    let pair = pair();
    let dir = suite_copy("root");
    let o = run_suite(&pair, &dir, &[]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_all_pass(&o);
}

#[test]
#[cfg_attr(not(xrnic_no_pyverbs), ignore = "needs root")]
#[cfg_attr(xrnic_no_pyverbs, ignore = "needs root and python3-pyverbs")]
fn rdma_cm_tests_pass_through_the_service_as_nobody() {
    let pair = pair();
    let dir = suite_copy("nobody");
    let ns = pair.end(Side::A).netns.clone();
    let ifname = pair.end(Side::A).ifname.clone();
    // As root once: `xrnic exec` makes its libibverbs.so.1 link next to the binary.
    let link = Command::new("ip")
        .args(["netns", "exec", &ns, xrnic_bin(), "exec", "--no-view"])
        .args(["--in-process", "--", "true"])
        .output()
        .unwrap();
    assert!(link.status.success(), "{}", text(&link));
    let up = Command::new("ip")
        .args(["netns", "exec", &ns, xrnic_bin(), "up", &ifname])
        .output()
        .unwrap();
    assert!(up.status.success(), "xrnic up: {}", text(&up));
    let o = run_suite(
        &pair,
        &dir,
        &[
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
        ],
    );
    let _ = Command::new("ip")
        .args(["netns", "exec", &ns, xrnic_bin(), "down", &ifname])
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    assert_all_pass(&o);
}
