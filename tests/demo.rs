//! `xrnic demo` end to end: it exits 0, its last line says the data was verified, the
//! capture it wrote holds RoCE packets with valid ICRCs, and no namespace of it is left
//! afterwards — also when it is interrupted with SIGINT in the middle of a step. Not root:
//! a clear message and exit status 1. The root tests are `#[ignore = "needs root"]`
//! (docs/testing.md).

mod common;
use common::xrnic_bin;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// The namespaces whose names carry `pid` (VethPair names them `xrnic-<pid>-<n>-<side>`).
fn namespaces_of(pid: u32) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    assert!(out.status.success(), "ip netns list failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("xrnic-{pid}-")))
        .map(str::to_string)
        .collect()
}

fn tmp_pcap(name: &str) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    dir.join(format!("{name}-{}.pcapng", std::process::id()))
}

#[test]
#[ignore = "needs root"]
fn demo_verifies_everything_and_leaves_no_namespace() {
    let pcap = tmp_pcap("demo");
    let child = Command::new(xrnic_bin())
        .args(["demo", "-n", "20", "--pcap"])
        .arg(&pcap)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("xrnic demo");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let t = format!(
        "status {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{t}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("demo: all data verified (") && last.ends_with(" RDMA operations)"),
        "{t}"
    );
    // Every step says it verified its data, and each kind of operation was shown.
    let steps: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" bytes ") && !l.starts_with("demo: all data verified"))
        .collect();
    assert!(steps.iter().all(|l| l.ends_with("verified yes")), "{t}");
    for op in [
        "rc-pingpong 64 B",
        "perf write",
        "perf read",
        "perf send",
        "perf atomic",
        "IPv4",
        "IPv6",
        "SEND",
        "RDMA WRITE",
        "RDMA READ",
        "FETCH_ADD",
        "CMP_SWAP",
    ] {
        assert!(steps.iter().any(|l| l.contains(op)), "no {op} step\n{t}");
    }
    assert_eq!(namespaces_of(pid), Vec::<String>::new(), "{t}");
    // The capture, checked here independently of the demo's own check.
    let frames = xrnic::io::capture::read_file(&pcap).expect("the demo's capture");
    let sum = xrnic_cli::cli::decode::decode_frames(
        &frames,
        xrnic_cli::cli::decode::Format::Text,
        &mut std::io::sink(),
    )
    .expect("decode");
    assert!(sum.roce > 0 && sum.all_good(), "{sum:?}\n{t}");
    let wire_roce = sum.roce;
    let _ = std::fs::remove_file(&pcap);
    // The devices' own captures beside it (the capture taps), one interface per step:
    // every ICRC valid, both directions, and the demo says where they are.
    for side in ["a", "b"] {
        let cap = xrnic_cli::cli::demo::rnic_capture(&pcap, side);
        assert!(
            stdout.contains(&format!(
                "demo: device {} capture {}: ",
                side.to_uppercase(),
                cap.display()
            )),
            "{t}"
        );
        let d = Command::new(xrnic_bin())
            .args(["decode", "--strict"])
            .arg(&cap)
            .output()
            .expect("decode");
        assert!(d.status.success(), "{}: {d:?}", cap.display());
        let frames = xrnic::io::capture::read_file(&cap).expect("the device capture");
        let sum = xrnic_cli::cli::decode::decode_frames(
            &frames,
            xrnic_cli::cli::decode::Format::Text,
            &mut std::io::sink(),
        )
        .expect("decode");
        assert!(sum.roce > 0 && sum.all_good(), "{sum:?}");
        // Each device sent or received every RoCE frame that crossed the link: when
        // dumpcap lost none, the wire and each device capture hold the same number.
        if stdout.contains(" captured, 0 dropped by dumpcap)") {
            assert_eq!(sum.roce, wire_roce, "{}\n{t}", cap.display());
        }
        let _ = std::fs::remove_file(&cap);
    }
    let mut steps_dir = pcap.clone().into_os_string();
    steps_dir.push(".rnic-steps");
    assert!(
        !std::path::Path::new(&steps_dir).exists(),
        "the per-step captures were merged and removed"
    );
}

#[test]
#[ignore = "needs root"]
fn demo_interrupted_leaves_no_namespace() {
    let pcap = tmp_pcap("demo-sigint");
    let mut child = Command::new(xrnic_bin())
        .args(["demo", "-n", "5000", "--pcap"])
        .arg(&pcap)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("xrnic demo");
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    // Wait for the first finished step: the namespaces exist, and the next rc-pingpong
    // pair (5000 exchanges) is running.
    let mut seen = Vec::new();
    for l in lines.by_ref() {
        let l = l.expect("read");
        seen.push(l.clone());
        if l.contains("rc-pingpong") {
            break;
        }
    }
    assert!(
        seen.last().is_some_and(|l| l.contains("rc-pingpong")),
        "the demo ended before its first step: {seen:?}"
    );
    assert_eq!(namespaces_of(pid).len(), 3, "{seen:?}");
    let p = rustix::process::Pid::from_raw(pid as i32).expect("pid");
    rustix::process::kill_process(p, rustix::process::Signal::INT).expect("kill");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let out = child.wait_with_output().expect("wait");
    let t = format!(
        "status {}\nstdout:\n{}\n{}\nstderr:\n{}",
        out.status,
        seen.join("\n"),
        rest.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(130), "{t}");
    // The steps' device captures up to the signal stay for the user: clean them here.
    let mut steps_dir = pcap.clone().into_os_string();
    steps_dir.push(".rnic-steps");
    let _ = std::fs::remove_dir_all(&steps_dir);
    assert!(
        !rest
            .iter()
            .any(|l| l.starts_with("demo: all data verified")),
        "the demo finished before the signal: {t}"
    );
    assert_eq!(namespaces_of(pid), Vec::<String>::new(), "{t}");
    let _ = std::fs::remove_file(&pcap);
}

#[test]
#[ignore = "needs root"]
fn demo_without_root_says_so() {
    let o = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            xrnic_bin(),
            "demo",
        ])
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("needs root"), "{err}");
}

/// Without dumpcap on the PATH it names the package to install, exits 1 and creates
/// nothing.
#[test]
#[ignore = "needs root"]
fn demo_without_dumpcap_names_the_package() {
    // A PATH with only `ip` and `ss` (where this machine has them).
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("demo-path-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for tool in ["ip", "ss"] {
        let found = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .map(|d| std::path::Path::new(d).join(tool))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{tool} not found"));
        let _ = std::os::unix::fs::symlink(found, dir.join(tool));
    }
    let child = Command::new(xrnic_bin())
        .arg("demo")
        .env("PATH", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("xrnic demo");
    let pid = child.id();
    let o = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("missing tools") && err.contains("tshark"),
        "{err}"
    );
    assert_eq!(namespaces_of(pid), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&dir);
}
