//! librdmacm's failure paths on the wire (docs/rdmacm.md): tests/c/rdmacm_fail.c (compiled with cc against
//! the system's <rdma/rdma_cma.h>, librdmacm-dev) on both ends of a veth pair through
//! `xrnic exec`, each end's CM xrnic's own (src/cm). The events are the ones the kernel's
//! cma.c gives for the same wire exchange:
//! - a listener that calls rdma_reject with private data: REJECTED, status 28
//!   (IB_CM_REJ_CONSUMER_DEFINED), the private data, private_data_len 148
//!   (IB_CM_REJ_PRIVATE_DATA_SIZE);
//! - the peer killed (SIGKILL) after ESTABLISHED, then rdma_disconnect: nobody answers
//!   the DREQ; after every retry DISCONNECTED with status -ETIMEDOUT (cma.c
//!   `IB_CM_DREQ_ERROR`).
//!
//! Root: AF_XDP, XDP. The library must be built (`cargo build --workspace`).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{require_c_headers, text, xrnic_bin};
use xrnic_netns::{Side, VethPair};

/// cc tests/c/rdmacm_fail.c: (its directory, the program). Fails without cc or
/// librdmacm-dev's headers.
fn build() -> (PathBuf, PathBuf) {
    let lib = Path::new(xrnic_bin()).with_file_name("libibverbs.so");
    assert!(
        lib.exists(),
        "{} missing: cargo build --workspace",
        lib.display()
    );
    require_c_headers("/usr/include/rdma/rdma_cma.h", "librdmacm-dev");
    // One folder per call: the tests run in parallel in one process, and the first to
    // finish removes its folder (a shared one took the other test's binary away before
    // its client started: the client printed nothing and the test failed in a second).
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("xrnic-rdmacm-fail-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("rdmacm_fail");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/rdmacm_fail.c");
    let o = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .unwrap();
    assert!(o.status.success(), "cc: {}", text(&o));
    (dir, exe)
}

fn exec(pair: &VethPair, side: Side, exe: &Path, args: &[&str]) -> Command {
    let e = pair.end(side);
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &e.netns, "timeout", "150", xrnic_bin()])
        .args(["exec", "--in-process", "--netdev", &e.ifname, "--"])
        .arg(exe)
        .args(args);
    c
}

/// The lines a child prints, as they come.
fn lines(out: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Wait for a line starting with `prefix` (at most `secs`); every line seen goes to `seen`.
fn expect(rx: &mpsc::Receiver<String>, prefix: &str, secs: u64, seen: &mut Vec<String>) -> String {
    let end = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                seen.push(l.clone());
                if l.starts_with(prefix) {
                    return l;
                }
            }
            Err(_) => panic!("no line '{prefix}...' in {seen:?}"),
        }
    }
}

fn spawn(c: &mut Command) -> Child {
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The client's output once it ended, again while B's listener is not up yet (B's CM
/// answers REJ 8 until rdma_listen).
fn client_once(pair: &VethPair, exe: &Path, b: &str, port: &str) -> Output {
    for _ in 0..50 {
        let o = exec(pair, Side::A, exe, &["client", b, port])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        if !String::from_utf8_lossy(&o.stdout).contains("RDMA_CM_EVENT_REJECTED status 8 ") {
            return o;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("B never listened");
}

#[test]
#[cfg_attr(not(xrnic_no_librdmacm_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_librdmacm_dev, ignore = "needs root and librdmacm-dev")]
fn a_listener_that_rejects_gives_rejected_28_with_its_private_data() {
    let (dir, exe) = build();
    let pair = VethPair::new(1500).expect("veth pair");
    let b = pair.end(Side::B).ipv4.to_string();
    let mut server = spawn(&mut exec(&pair, Side::B, &exe, &["reject", &b, "7990"]));
    let srx = lines(server.stdout.take().unwrap());
    let mut seen = Vec::new();
    expect(&srx, "reject: listening", 30, &mut seen);
    let o = client_once(&pair, &exe, &b, "7990");
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(
            "client: RDMA_CM_EVENT_REJECTED status 28 private_data_len 148 private 'go away'"
        ),
        "{}",
        text(&o)
    );
    expect(&srx, "reject: rejected", 30, &mut seen);
    let s = server.wait_with_output().unwrap();
    assert!(s.status.success(), "{seen:?} {}", text(&s));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[cfg_attr(not(xrnic_no_librdmacm_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_librdmacm_dev, ignore = "needs root and librdmacm-dev")]
fn peer_killed_after_established_gives_disconnected_etimedout_after_the_dreq_retries() {
    let (dir, exe) = build();
    let pair = VethPair::new(1500).expect("veth pair");
    let b = pair.end(Side::B).ipv4.to_string();
    let mut server = spawn(&mut exec(
        &pair,
        Side::B,
        &exe,
        &["established", &b, "7991"],
    ));
    let srx = lines(server.stdout.take().unwrap());
    let mut seen = Vec::new();
    let l = expect(&srx, "established: listening pid ", 30, &mut seen);
    let pid: i32 = l.rsplit(' ').next().unwrap().parse().unwrap();
    // The client, again while B's CM answers REJ 8 (not listening yet).
    let (mut client, crx, mut cseen) = loop {
        let mut c = spawn(&mut exec(&pair, Side::A, &exe, &["client", &b, "7991"]));
        let crx = lines(c.stdout.take().unwrap());
        let mut cseen = Vec::new();
        let l = expect(&crx, "client: RDMA_CM_EVENT_", 60, &mut cseen);
        let l = if l.contains("ADDR_RESOLVED") || l.contains("ROUTE_RESOLVED") {
            expect(&crx, "client: RDMA_CM_EVENT_ROUTE", 60, &mut cseen);
            expect(&crx, "client: RDMA_CM_EVENT_", 60, &mut cseen)
        } else {
            l
        };
        if l.contains("REJECTED status 8 ") {
            let _ = c.wait();
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        assert_eq!(l, "client: RDMA_CM_EVENT_ESTABLISHED status 0", "{cseen:?}");
        break (c, crx, cseen);
    };
    expect(
        &srx,
        "established: RDMA_CM_EVENT_ESTABLISHED",
        30,
        &mut seen,
    );
    // The server's process dies with its CM: nothing on B answers a MAD any more.
    let k = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .output()
        .unwrap();
    assert!(k.status.success(), "{}", text(&k));
    let s = server.wait_with_output().unwrap();
    assert!(!s.status.success(), "killed: {}", text(&s));
    // Now the client disconnects: DREQ, resent, unanswered.
    client.stdin.take().unwrap().write_all(b"go\n").unwrap();
    expect(&crx, "client: disconnecting", 30, &mut cseen);
    // 16 DREQs 4.8 s apart (2 × packet life 16 + response timeout 20, cma.c defaults).
    let l = expect(&crx, "client: RDMA_CM_EVENT_DISCONNECTED", 120, &mut cseen);
    assert_eq!(
        l,
        format!(
            "client: RDMA_CM_EVENT_DISCONNECTED status {}",
            -libc::ETIMEDOUT
        ),
        "{cseen:?}"
    );
    let o = client.wait_with_output().unwrap();
    assert!(o.status.success(), "{cseen:?} {}", text(&o));
    let _ = std::fs::remove_dir_all(dir);
}
