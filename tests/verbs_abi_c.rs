//! tests/c/verbs_suite.c, compiled with cc against the system's <infiniband/verbs.h>
//! (libibverbs-dev) and linked with -libverbs, runs on xrnic through `xrnic exec` on both
//! ends of a veth pair (root: AF_XDP, XDP): every implemented verb and its error paths,
//! inline data, a completion channel, an RC transfer between the two processes. The
//! program prints one line per check and "N passed, M failed". The library must be
//! built (`cargo build --workspace`, as `make test` does). tests/c/verbs_fatal.c: the
//! interface deleted under a running program (IBV_EVENT_DEVICE_FATAL).
//! tests/c/verbs_exit_open.c: a program that returns from main with its device open, or
//! closes it with objects alive, still leaves the device's last stat snapshot
//! (XRNIC_FINAL_STAT_DIR).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{text, xrnic_bin};
use xrnic_netns::{Side, VethPair};

/// tests/c/NAME.c built and linked with libibverbs ([`common::build_c`]).
fn build(name: &str) -> (PathBuf, PathBuf) {
    common::build_c(name, &["-libverbs"])
}

fn exec_gid(pair: &VethPair, side: Side, exe: &Path, dir: &Path, role: &str, gid: &str) -> Command {
    let e = pair.end(side);
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &e.netns, "timeout", "120", xrnic_bin()])
        .args(["exec", "--in-process", "--netdev", &e.ifname, "--"])
        .arg(exe)
        .arg(format!("xrnic_{}", e.ifname))
        .arg(gid)
        .arg(role)
        .arg(dir);
    c
}

/// The drop-in library these tests load must be built (`cargo test` does not relink it).
fn library_built() {
    let lib = Path::new(xrnic_bin()).with_file_name("libibverbs.so");
    assert!(
        lib.exists(),
        "{} missing: cargo build --workspace",
        lib.display()
    );
}

/// The C program `exe` as server on B and client on A (GID index `gid`, rendezvous in
/// `dir`), the client's command given `client_env`: both outputs, client first.
fn run_pair(
    pair: &VethPair,
    exe: &Path,
    dir: &Path,
    gid: &str,
    client_env: &[(&str, &Path)],
) -> (Output, Output) {
    let server = exec_gid(pair, Side::B, exe, dir, "server", gid)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut client = exec_gid(pair, Side::A, exe, dir, "client", gid);
    for (k, v) in client_env {
        client.env(k, v);
    }
    let client = client.output().unwrap();
    (client, server.wait_with_output().unwrap())
}

#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn the_c_verbs_suite_passes_on_both_ends_through_xrnic_exec() {
    library_built();
    let (dir, exe) = build("verbs_suite");
    let pair = VethPair::new(1500).expect("veth pair");
    // The client's device leaves its last counters in `stats` as it closes
    // (XRNIC_FINAL_STAT_DIR, src/abi/device.rs `options`).
    let stats = dir.join("stats");
    std::fs::create_dir_all(&stats).unwrap();
    let (client, server) = run_pair(&pair, &exe, &dir, "1", &[("XRNIC_FINAL_STAT_DIR", &stats)]);
    let snapshots: Vec<serde_json::Value> = std::fs::read_dir(&stats)
        .unwrap()
        .flatten()
        .map(|f| serde_json::from_slice(&std::fs::read(f.path()).unwrap()).unwrap())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(snapshots.len(), 1, "one device, one final snapshot");
    let snap = &snapshots[0];
    assert_eq!(snap["running"], false, "{snap}");
    assert_eq!(snap["netdev"], pair.end(Side::A).ifname.as_str(), "{snap}");
    assert!(
        snap["device"]["qp"]["packets_sent"].as_u64() > Some(0),
        "the client's traffic is counted: {snap}"
    );
    for (who, o, checks) in [("client", &client, 56), ("server", &server, 47)] {
        let t = text(o);
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{who}: {t}");
        assert!(!s.contains("FAIL:"), "{who}: {t}");
        assert!(
            s.contains(&format!("{checks} passed, 0 failed")),
            "{who}: {t}"
        );
        let lines: &[&str] = if who == "client" {
            &[
                "PASS: a bad lkey completes with IBV_WC_LOC_PROT_ERR",
                "PASS: no async event for an error a completion reports",
                "PASS: a SEND posted in ERR completes with IBV_WC_WR_FLUSH_ERR",
                "PASS: more SGEs than max_send_sge: EINVAL, bad_wr the WR",
                "PASS: max_inline_data 0 with 2 send SGEs: 32 reported",
                "PASS: RDMA WRITE to a QP without IBV_ACCESS_REMOTE_WRITE: IBV_WC_REM_INV_REQ_ERR",
                "PASS: RDMA READ past the end of the peer's MR: IBV_WC_REM_ACCESS_ERR",
                "PASS: SEND with no receive posted, rnr_retry 0: IBV_WC_RNR_RETRY_EXC_ERR",
                "PASS: SEND with no receive posted, rnr_retry 1: IBV_WC_RNR_RETRY_EXC_ERR",
                "PASS: send CQ overrun: IBV_EVENT_CQ_ERR on the CQ",
                "PASS: IBV_EVENT_SQ_DRAINED on the QP in SQD",
            ]
        } else {
            &[
                "PASS: inline SEND's bytes are the sender's at post time",
                "PASS: ibv_get_async_event: IBV_EVENT_COMM_EST on the QP in RTR",
                "PASS: ibv_ack_async_event counts on the QP (events_completed)",
            ]
        };
        for line in lines {
            assert!(s.contains(line), "{who}: {line}: {t}");
        }
    }
}

/// tests/c/verbs_exit_open.c `MODE` on one end with XRNIC_FINAL_STAT_DIR: it sends one
/// message between two QPs of its device and leaves every object alive. The device's
/// last snapshot must be `DIR/<IF>.<pid>.json`, `running: false`, both QPs in RTS and the
/// SEND counted. `checks`: how many the program passes.
fn final_snapshot_of_a_leaky_program(mode: &str, checks: usize) {
    library_built();
    let (dir, exe) = build("verbs_exit_open");
    let pair = VethPair::new(1500).expect("veth pair");
    let e = pair.end(Side::A);
    let stats = dir.join("stats");
    std::fs::create_dir_all(&stats).unwrap();
    let o = Command::new("ip")
        .args(["netns", "exec", &e.netns, "timeout", "120", xrnic_bin()])
        .args(["exec", "--in-process", "--netdev", &e.ifname, "--"])
        .arg(&exe)
        .arg(format!("xrnic_{}", e.ifname))
        .arg("1")
        .arg(mode)
        .env("XRNIC_FINAL_STAT_DIR", &stats)
        .output()
        .unwrap();
    let t = text(&o);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let files: Vec<PathBuf> = std::fs::read_dir(&stats)
        .unwrap()
        .flatten()
        .map(|f| f.path())
        .collect();
    let snaps: Vec<serde_json::Value> = files
        .iter()
        .map(|f| serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(o.status.success(), "{t}");
    assert!(out.contains(&format!("{checks} passed, 0 failed")), "{t}");
    let field = |key: &str| -> Vec<u32> {
        let line = out
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("{key}: {t}"));
        line.split_whitespace()
            .skip(1)
            .map(|w| w.parse().unwrap())
            .collect()
    };
    let (pid, qpns) = (field("pid ")[0], field("qpn "));
    assert_eq!(
        files,
        [stats.join(format!("{}.{pid}.json", e.ifname))],
        "one device, its final snapshot: {t}"
    );
    let snap = &snaps[0];
    assert_eq!(snap["running"], false, "{snap}");
    assert_eq!(snap["pid"], pid, "{snap}");
    assert_eq!(snap["netdev"], e.ifname.as_str(), "{snap}");
    // The SEND and its ACK, through the device's loopback.
    assert!(
        snap["device"]["qp"]["packets_sent"].as_u64() >= Some(2),
        "the traffic is counted: {snap}"
    );
    let mut seen: Vec<(u64, &str)> = snap["qps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| (q["qpn"].as_u64().unwrap(), q["state"].as_str().unwrap()))
        .collect();
    seen.sort();
    let mut want: Vec<(u64, &str)> = qpns.iter().map(|&q| (u64::from(q), "RTS")).collect();
    want.sort();
    assert_eq!(seen, want, "{snap}");
}

/// A program that returns from main without ibv_close_device: the library's exit
/// handler writes the snapshot a close would have (src/abi/device.rs
/// `write_final_stats_at_exit`).
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn a_program_that_exits_with_its_device_open_leaves_the_final_snapshot() {
    final_snapshot_of_a_leaky_program("exit", 6);
}

/// A program that closes its device with objects still alive (perftest 4.5's
/// ib_send_bw client never destroys its receive CQ): ibv_close_device writes the
/// snapshot itself, the QPs still as the program left them (RTS), before it lets the
/// objects go.
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn a_close_with_objects_alive_still_leaves_the_final_snapshot() {
    final_snapshot_of_a_leaky_program("close", 7);
}

/// tests/c/verbs_ud_srq.c on both ends, over the IPv4-mapped GID (1) and the fe80:: one
/// (0): address handles (from attributes and from a receive), UD with the GRH checked
/// byte for byte, the UD modify masks, a datagram past the MTU, UC, an RC QP on an SRQ,
/// the SRQ limit event through the async fd, and the error paths.
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn the_c_ud_uc_srq_suite_passes_on_both_ends_through_xrnic_exec() {
    library_built();
    let (dir, exe) = build("verbs_ud_srq");
    let pair = VethPair::new(1500).expect("veth pair");
    for gid in ["1", "0"] {
        let run = dir.join(format!("gid{gid}"));
        std::fs::create_dir_all(&run).unwrap();
        let (client, server) = run_pair(&pair, &exe, &run, gid, &[]);
        for (who, o, checks) in [("client", &client, 45), ("server", &server, 52)] {
            let t = text(o);
            let s = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success(), "{who} gid {gid}: {t}");
            assert!(!s.contains("FAIL:"), "{who} gid {gid}: {t}");
            assert!(
                s.contains(&format!("{checks} passed, 0 failed")),
                "{who} gid {gid}: {t}"
            );
        }
        let s = String::from_utf8_lossy(&server.stdout);
        for line in [
            "PASS: ibv_get_async_event: IBV_EVENT_SRQ_LIMIT_REACHED on the SRQ",
            "PASS: ibv_ack_async_event counts on the SRQ (events_completed)",
            "PASS: ibv_get_async_event: IBV_EVENT_QP_LAST_WQE_REACHED on the QP",
        ] {
            assert!(s.contains(line), "{s}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// tests/c/verbs_fatal.c on one end: once it prints READY (receives and a SEND
/// outstanding, the CQ armed), the veth is deleted under it. It must see
/// IBV_EVENT_DEVICE_FATAL, the four WRs flushed, EIO from every verb that needs the
/// device (the queries, req_notify_cq and the SRQ verbs too) and from the async fd and
/// the channel once drained, and every destroy succeed.
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn the_c_device_fatal_program_sees_the_event_the_flushes_and_eio() {
    use std::io::{BufRead, BufReader, Read};
    library_built();
    let (dir, exe) = build("verbs_fatal");
    let pair = VethPair::new(1500).expect("veth pair");
    let e = pair.end(Side::A);
    let mut child = Command::new("ip")
        .args(["netns", "exec", &e.netns, "timeout", "120", xrnic_bin()])
        .args(["exec", "--in-process", "--netdev", &e.ifname, "--"])
        .arg(&exe)
        .arg(format!("xrnic_{}", e.ifname))
        .arg("1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        seen.push_str(&line);
        if line.trim() == "READY" {
            let del = pair
                .exec(Side::A, &["ip", "link", "del", &e.ifname])
                .unwrap();
            assert!(del.status.success(), "{del:?}");
            break;
        }
    }
    out.read_to_string(&mut seen).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let t = format!("{seen}\n--- stderr\n{err}");
    assert!(seen.contains("READY"), "{t}");
    assert!(status.success(), "{status}: {t}");
    assert!(!seen.contains("FAIL:"), "{t}");
    assert!(seen.contains("46 passed, 0 failed"), "{t}");
    for line in [
        "PASS: ibv_get_async_event: IBV_EVENT_DEVICE_FATAL, element.port_num 0",
        "PASS: the 3 receives and the SEND complete with IBV_WC_WR_FLUSH_ERR",
        "PASS: ibv_post_send: EIO",
        "PASS: ibv_query_qp: EIO",
        "PASS: ibv_query_gid: -1, errno EIO",
        "PASS: ibv_query_pkey: -1, errno EIO",
        "PASS: ibv_req_notify_cq: EIO",
        "PASS: ibv_modify_srq: EIO",
        "PASS: ibv_destroy_srq",
        "PASS: ibv_get_async_event after DEVICE_FATAL: -1, errno EIO (no hang)",
        "PASS: ibv_close_device",
    ] {
        assert!(seen.contains(line), "{line}: {t}");
    }
}

/// `xrnic up` on one interface of the pair, `xrnic down` when dropped.
struct Up<'a>(&'a VethPair, Side);

impl<'a> Up<'a> {
    fn start(pair: &'a VethPair, side: Side) -> Up<'a> {
        let e = pair.end(side);
        let o = Command::new("ip")
            .args(["netns", "exec", &e.netns, xrnic_bin(), "up", &e.ifname])
            .output()
            .unwrap();
        assert!(o.status.success(), "xrnic up: {}", text(&o));
        Up(pair, side)
    }
}

impl Drop for Up<'_> {
    fn drop(&mut self) {
        let e = self.0.end(self.1);
        let _ = Command::new("ip")
            .args(["netns", "exec", &e.netns, xrnic_bin(), "down", &e.ifname])
            .output();
        let _ = std::fs::remove_file(format!("/run/xrnic/service.{}.log", e.ifname));
    }
}

/// tests/c/verbs_suite.c with the device service up on both ends (`xrnic up`): the
/// library's devices are the services', so the async events the suite checks
/// (COMM_EST on the server's QP, CQ_ERR on the client's overrun CQ, SQ_DRAINED on its
/// QP in SQD) come through the service, each to the program that owns the object, with
/// `element` its own pointer.
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn the_c_verbs_suite_gets_its_objects_events_through_the_device_service() {
    library_built();
    let (dir, exe) = build("verbs_suite");
    let pair = VethPair::new(1500).expect("veth pair");
    let _up = (Up::start(&pair, Side::A), Up::start(&pair, Side::B));
    let (client, server) = run_pair(&pair, &exe, &dir, "1", &[]);
    let _ = std::fs::remove_dir_all(&dir);
    // The whole suite, as in process (a post is queued on the service's ring: the
    // checks it must fail at once, a send before RTS and a receive in RESET, are made in
    // the client, src/verbs/remote.rs `RemoteQp::check_post`), and the events through
    // the service in particular.
    for (who, o, checks, lines) in [
        (
            "client",
            &client,
            56,
            &[
                "PASS: no async event for an error a completion reports",
                "PASS: send CQ overrun: IBV_EVENT_CQ_ERR on the CQ",
                "PASS: IBV_EVENT_SQ_DRAINED on the QP in SQD",
                "PASS: ibv_post_send on a QP in RESET sets bad_wr to the WR",
            ][..],
        ),
        (
            "server",
            &server,
            47,
            &[
                "PASS: ibv_get_async_event: IBV_EVENT_COMM_EST on the QP in RTR",
                "PASS: ibv_ack_async_event counts on the QP (events_completed)",
            ][..],
        ),
    ] {
        let t = text(o);
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{who}: {t}");
        assert!(!s.contains("FAIL:"), "{who}: {t}");
        assert!(
            s.contains(&format!("{checks} passed, 0 failed")),
            "{who}: {t}"
        );
        for line in lines {
            assert!(s.contains(line), "{who}: {line}: {t}");
        }
    }
}

/// tests/c/verbs_ex.c on both ends, in process and with the device service up on both
/// ends: `ibv_create_qp_ex` (the comp_mask variants rxe takes and refuses) and the
/// `ibv_wr_*` API (SEND, inline SEND with immediate, RDMA WRITE, READ, both atomics, a
/// failed and an aborted batch posting nothing), `ibv_create_cq_ex` polled with
/// `ibv_start_poll` / `ibv_next_poll` and read with the accessors and completion
/// timestamps, `ibv_query_rt_values_ex`, `ibv_resize_cq` with completions queued, and
/// the capability edges (comp_vector, max_cqe, queues of size 0, sizes rounded up).
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn the_c_extended_verbs_suite_passes_in_process_and_through_the_service() {
    library_built();
    let (dir, exe) = build("verbs_ex");
    let pair = VethPair::new(1500).expect("veth pair");
    for service in [false, true] {
        let run = dir.join(if service { "svc" } else { "local" });
        std::fs::create_dir_all(&run).unwrap();
        let _up = service.then(|| (Up::start(&pair, Side::A), Up::start(&pair, Side::B)));
        let (client, server) = run_pair(&pair, &exe, &run, "1", &[]);
        for (who, o, checks) in [("client", &client, 44), ("server", &server, 40)] {
            let t = text(o);
            let s = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success(), "{who} service {service}: {t}");
            assert!(!s.contains("FAIL:"), "{who} service {service}: {t}");
            assert!(
                s.contains(&format!("{checks} passed, 0 failed")),
                "{who} service {service}: {t}"
            );
        }
        let s = String::from_utf8_lossy(&client.stdout);
        for line in [
            "PASS: ibv_create_qp_ex PD|CREATE_FLAGS, flags 0",
            "PASS: ibv_create_cq with comp_vector num_comp_vectors: EINVAL",
            "PASS: ibv_resize_cq below the completions queued: EINVAL",
            "PASS: nothing of the failed or aborted batches was posted",
            "PASS: one receive more: ENOMEM, bad_wr the WR",
            "info: max_send_wr 10 -> 15, max_recv_wr 10 -> 15, max_inline_data 64 -> 64",
            "info: ibv_create_cq 100: cqe 127",
        ] {
            assert!(s.contains(line), "service {service}: {line}: {s}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program that closes its device with objects alive and opens it again, three times,
/// one exchange each time: every open works (the interface, its XDP program and its
/// AF_XDP socket are free again after the close, as a kernel RNIC's context frees its
/// objects when its file closes), and the snapshot is the last open's, its two QPs only.
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn a_device_closed_with_objects_alive_opens_again() {
    final_snapshot_of_a_leaky_program("reopen", 21);
}

/// tests/c/verbs_multi_open.c on one end: the device opened three times in one process
/// (src/abi/opened.rs). SENDs between QPs of different contexts through the device's
/// loopback, COMM_EST on the async fd of the context that owns the QP and on no other,
/// objects refused across contexts (EINVAL), one context closed with its objects alive
/// while the others keep working (its QP gone: the peer QP's SEND ends in
/// RETRY_EXC_ERR; its channel fails EIO, no hang), a reopen, and after the last close a
/// fresh open that works. With `service`, the device is the device service's (`xrnic
/// up`): the contexts share the program's one connection to it.
fn multi_open(service: bool) {
    library_built();
    let (dir, exe) = build("verbs_multi_open");
    let pair = VethPair::new(1500).expect("veth pair");
    let _up = service.then(|| Up::start(&pair, Side::A));
    let e = pair.end(Side::A);
    let o = Command::new("ip")
        .args(["netns", "exec", &e.netns, "timeout", "120", xrnic_bin()])
        .args(["exec", "--in-process", "--netdev", &e.ifname, "--"])
        .arg(&exe)
        .arg(format!("xrnic_{}", e.ifname))
        .arg("1")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let t = text(&o);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{t}");
    assert!(!s.contains("FAIL:"), "{t}");
    assert!(s.contains("34 passed, 0 failed"), "{t}");
    for line in [
        "PASS: ibv_open_device of the same device again: context B",
        "PASS: IBV_EVENT_COMM_EST on B's async fd, element B's QP",
        "PASS: no event on A's async fd",
        "PASS: A and B still exchange after C closed",
        "PASS: a SEND to C's QP, destroyed by the close: IBV_WC_RETRY_EXC_ERR",
        "PASS: the device opens again after its last context closed",
        "PASS: and a SEND through it completes",
    ] {
        assert!(s.contains(line), "{line}: {t}");
    }
}

/// [`multi_open`] in process. Fails on a library that opens a device only once per
/// process (the second ibv_open_device found the XDP program attached: EBUSY).
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn one_device_opened_three_times_in_one_process() {
    multi_open(false);
}

/// [`multi_open`] through the device service.
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn one_service_device_opened_three_times_in_one_process() {
    multi_open(true);
}
