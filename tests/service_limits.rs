//! The device service's per-client views and caps: `xrnic stat --netdev IF` shows each
//! client's counters beside the device's totals, and a client that floods the service
//! (creates resources in a loop, rings its doorbell without end) meets its caps (ENOMEM)
//! while another client's stock pair still passes. Root tests (`#[ignore = "needs
//! root"]`, docs/testing.md); the library must be built (`cargo build --workspace`).

mod common;
mod service_support;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{text, xrnic_bin};
use service_support::{RcPair, Svc, out};
use xrnic::verbs::{Access, Device, Error, QpInitAttr, RecvWr, SendWr, WcStatus, WrOpcode};
use xrnic_netns::Side;

fn errno(e: &Error) -> Option<i32> {
    match e {
        Error::Io(io) => io.raw_os_error(),
        _ => None,
    }
}

/// Two clients (two connections of this process to the service), one QP each,
/// connected over the device's loopback; 5 SENDs from the first to the second. `xrnic
/// stat --netdev IF` (run while both live) shows both clients, each with its QP and that
/// QP's counters; the device's totals are the sum of the clients' (nothing else ever ran
/// on this service).
/// The device's next async event, waited for up to 10 s (a guard against hanging).
fn next_event(d: &Device) -> Option<xrnic::verbs::AsyncEvent> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(e) = d.poll_async_event() {
            return Some(e);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "needs root"]
fn xrnic_stat_shows_each_client_with_its_counters_and_the_device_totals() {
    let s = Svc::start();
    let ifname = s.ifname().to_string();
    s.pair
        .run_in(Side::A, move || {
            let RcPair {
                a,
                b,
                ca,
                cb,
                ma,
                mb,
                qa,
                qb,
            } = RcPair::connect(&ifname);
            assert!(a.service_pid().is_some() && b.service_pid().is_some());
            for i in 0..5u64 {
                qb.post_recv(RecvWr {
                    wr_id: i,
                    sg_list: vec![mb.sge(0, 64)],
                })
                .unwrap();
                let mut wr = SendWr::new(i, WrOpcode::Send);
                wr.sg_list = vec![ma.sge(0, 13)];
                qa.post_send(wr).unwrap();
                for cq in [&ca, &cb] {
                    let wc = cq.wait(1, Duration::from_secs(10));
                    assert_eq!(wc.len(), 1);
                    assert_eq!(wc[0].status, WcStatus::Success);
                }
            }
            let (na, nb) = (qa.qp_num().value(), qb.qp_num().value());
            let me = i64::from(std::process::id());
            // The snapshot is written every 500 ms: wait for one with both QPs' counts.
            let end = Instant::now() + Duration::from_secs(10);
            let (doc, textout) = loop {
                let o = Command::new(xrnic_bin())
                    .args(["stat", "--netdev", &ifname, "--json"])
                    .output()
                    .unwrap();
                assert!(o.status.success(), "{}", text(&o));
                let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                let sent = |qpn: u32| {
                    v["clients"].as_array().and_then(|cs| {
                        cs.iter()
                            .find(|c| c["qps"] == serde_json::json!([qpn]))
                            .and_then(|c| c["counters"]["packets_sent"].as_u64())
                    })
                };
                if sent(na).is_some_and(|n| n >= 5) && sent(nb).is_some_and(|n| n >= 1) {
                    let t = Command::new(xrnic_bin())
                        .args(["stat", "--netdev", &ifname])
                        .output()
                        .unwrap();
                    break (v, out(&t));
                }
                assert!(Instant::now() < end, "no snapshot with both QPs: {v}");
                std::thread::sleep(Duration::from_millis(100));
            };
            let clients = doc["clients"].as_array().unwrap();
            assert_eq!(clients.len(), 2, "{doc}");
            for c in clients {
                assert_eq!(c["pid"], me, "{c}");
            }
            let of = |qpn: u32| {
                clients
                    .iter()
                    .find(|c| c["qps"] == serde_json::json!([qpn]))
                    .unwrap()
            };
            // The sender's client: 5 SENDs out, 5 ACKs in; the receiver's: 5 in, 5 ACKs.
            // The two clients' rings reach the service in either order: a SEND may meet
            // its QP before the receive posted just before it (another client's ring), be
            // RNR-NAKed (out_of_buffer, rnr_naks_sent) and resent (retransmitted_packets,
            // in packets_sent too): about one run in four on a loaded host. The counts
            // without those are exact.
            let c = |qpn: u32, k: &str| of(qpn)["counters"][k].clone();
            let n = |qpn: u32, k: &str| c(qpn, k).as_u64().unwrap_or(u64::MAX);
            assert_eq!(
                (
                    n(na, "packets_sent") - n(na, "retransmitted_packets"),
                    c(na, "acks_received")
                ),
                (5, 5.into()),
                "{}",
                of(na)
            );
            assert_eq!(
                (
                    n(nb, "packets_received") - n(nb, "rnr_naks_sent"),
                    c(nb, "acks_sent")
                ),
                (5, 5.into()),
                "{}",
                of(nb)
            );
            assert_eq!(
                (c(na, "acks_sent"), c(nb, "acks_received")),
                (0.into(), 0.into())
            );
            // Each client's counters are its QP's.
            for qpn in [na, nb] {
                let q = doc["qps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|q| q["qpn"] == qpn)
                    .unwrap();
                for k in [
                    "packets_sent",
                    "packets_received",
                    "acks_sent",
                    "bytes_sent",
                ] {
                    assert_eq!(of(qpn)["counters"][k], q["counters"][k], "{k}: {doc}");
                }
            }
            // The device's totals: the clients' sum.
            for k in ["packets_sent", "packets_received", "bytes_received"] {
                let sum: u64 = clients
                    .iter()
                    .map(|c| c["counters"][k].as_u64().unwrap())
                    .sum();
                assert_eq!(doc["device"]["qp"][k], sum, "{k}: {doc}");
            }
            let pat = format!("qp {na} state RTS dest_qpn {nb} pid {me} comm ");
            assert!(textout.contains(&pat), "{pat} in:\n{textout}");
            assert!(textout.contains("  service: pid "), "{textout}");
            assert!(
                textout.contains(&format!("client pid {me} comm ")),
                "{textout}"
            );
            drop((qa, qb, ma, mb));
        })
        .unwrap();
}

/// A client that floods: its CQs, QPs, MRs and registered bytes stop at the caps `xrnic
/// up` was given (ENOMEM, and a freed MR makes room again), then it posts to its QP
/// without end (each post a slot and a doorbell, refused in RESET: an error completion
/// each) while a stock ib_send_bw pair, as nobody, runs on the same device and passes.
#[test]
#[cfg_attr(not(xrnic_no_perftest), ignore = "needs root")]
#[cfg_attr(xrnic_no_perftest, ignore = "needs root and perftest")]
fn a_flooding_client_meets_its_caps_and_another_clients_pair_still_passes() {
    let s = Svc::start_with(&[
        "--max-qps",
        "8",
        "--max-cqs",
        "6",
        "--max-mrs",
        "32",
        "--max-mr-bytes",
        "1048576",
    ]);
    let ifname = s.ifname().to_string();
    let stop = AtomicBool::new(false);
    // The flooder's post count, read around the pair's run.
    let rung = std::sync::atomic::AtomicU64::new(0);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let flood = || {
        let dev = Device::open(&ifname).unwrap();
        assert!(dev.service_pid().is_some());
        let pd = dev.alloc_pd().unwrap();
        let mut cqs = Vec::new();
        let e = loop {
            match dev.create_cq(16) {
                Ok(c) => cqs.push(c),
                Err(e) => break e,
            }
            assert!(cqs.len() <= 6, "past the CQ cap");
        };
        assert_eq!((cqs.len(), errno(&e)), (6, Some(libc::ENOMEM)), "{e}");
        let mut qps = Vec::new();
        let e = loop {
            match pd.create_qp(&QpInitAttr::new(&cqs[0], &cqs[1], 64)) {
                Ok(q) => qps.push(q),
                Err(e) => break e,
            }
            assert!(qps.len() <= 8, "past the QP cap");
        };
        assert_eq!((qps.len(), errno(&e)), (8, Some(libc::ENOMEM)), "{e}");
        // 16 x 64 KiB fill the 1 MiB; one freed, 17 small ones fill the 32 MRs.
        let mut big = Vec::new();
        let e = loop {
            match pd.reg_mr(65536, Access::LOCAL_WRITE) {
                Ok(m) => big.push(m),
                Err(e) => break e,
            }
            assert!(big.len() <= 16, "past the byte cap");
        };
        assert_eq!((big.len(), errno(&e)), (16, Some(libc::ENOMEM)), "{e}");
        big.pop();
        let mut small = Vec::new();
        let e = loop {
            match pd.reg_mr(64, Access::LOCAL_WRITE) {
                Ok(m) => small.push(m),
                Err(e) => break e,
            }
            assert!(small.len() <= 17, "past the MR cap");
        };
        assert_eq!((small.len(), errno(&e)), (17, Some(libc::ENOMEM)), "{e}");
        ready_tx.send(()).unwrap();
        // Ring without end until the pair is done.
        let mut posts = 0u64;
        while !stop.load(Ordering::SeqCst) {
            for q in &qps {
                let _ = q.post_recv(RecvWr {
                    wr_id: posts,
                    sg_list: vec![],
                });
                posts += 1;
                rung.store(posts, Ordering::SeqCst);
            }
            for c in &cqs {
                let _ = c.poll(64);
            }
        }
        posts
    };
    let (posts, during, sv, c) = std::thread::scope(|sc| {
        let h = sc.spawn(|| s.pair.run_in(Side::A, flood).unwrap());
        ready_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the flooder reached its caps");
        let before = rung.load(Ordering::SeqCst);
        let (sv, c) = s.pair_run(
            "ib_send_bw",
            &["-x", "1", "-n", "2000", "-s", "4096"],
            18570,
        );
        let during = rung.load(Ordering::SeqCst) - before;
        stop.store(true, Ordering::SeqCst);
        (h.join().unwrap(), during, sv, c)
    });
    assert!(out(&c).contains("4096       2000"), "{}", text(&c));
    assert!(sv.status.success());
    // Liveness, not a rate: the flooder kept ringing while the pair ran (how often
    // depends on the machine's load).
    assert!(
        during > 0,
        "the flooder rang while the pair ran ({posts} posts, {during} during the pair)"
    );
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The service forwards its device's port events to its clients (src/service/server.rs,
/// src/verbs/remote.rs), as the in-process device raises them: `ip link set down` gives
/// each client PORT_ERR (the port reads DOWN), `up` PORT_ACTIVE, and deleting the
/// interface DEVICE_FATAL, after which a receive the client had posted completes flushed,
/// posts fail with `VerbsError::DeviceFatal` and control verbs with EIO.
#[test]
#[ignore = "needs root"]
fn service_clients_get_port_events_and_device_fatal() {
    use xrnic::verbs::{AsyncEvent, PortState, VerbsError};
    let s = Svc::start();
    let ifname = s.ifname().to_string();
    let netns = s.pair.end(Side::A).netns.clone();
    let ip = move |args: &[&str]| {
        let o = Command::new("ip")
            .args(["-n", &netns])
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "ip {args:?}: {}", text(&o));
    };
    s.pair
        .run_in(Side::A, move || {
            let RcPair {
                a, b, ca, ma, qa, ..
            } = RcPair::connect(&ifname);
            assert!(a.service_pid().is_some() && b.service_pid().is_some());
            assert_eq!(a.query_port().state, PortState::Active);
            ip(&["link", "set", "dev", &ifname, "down"]);
            for d in [&a, &b] {
                assert_eq!(next_event(d), Some(AsyncEvent::PortErr(1)));
                assert_eq!(d.query_port().state, PortState::Down);
            }
            ip(&["link", "set", "dev", &ifname, "up"]);
            for d in [&a, &b] {
                assert_eq!(next_event(d), Some(AsyncEvent::PortActive(1)));
                assert_eq!(d.query_port().state, PortState::Active);
            }
            qa.post_recv(RecvWr {
                wr_id: 42,
                sg_list: vec![ma.sge(0, 64)],
            })
            .unwrap();
            ip(&["link", "del", &ifname]);
            // PORT_ERR may come first (the link goes down before the interface goes).
            let mut seen = Vec::new();
            while !seen.contains(&AsyncEvent::DeviceFatal) {
                let e = next_event(&a).unwrap_or_else(|| panic!("no DEVICE_FATAL: {seen:?}"));
                assert!(matches!(
                    e,
                    AsyncEvent::PortErr(1) | AsyncEvent::DeviceFatal
                ));
                seen.push(e);
            }
            assert!(a.is_fatal());
            assert_eq!(a.query_port().state, PortState::Down);
            let wc = ca.wait(1, Duration::from_secs(10));
            assert_eq!(wc.len(), 1, "the receive is flushed");
            assert_eq!((wc[0].wr_id, wc[0].status), (42, WcStatus::WrFlushErr));
            let r = qa.post_recv(RecvWr {
                wr_id: 43,
                sg_list: vec![ma.sge(0, 64)],
            });
            assert!(
                matches!(r, Err(Error::Verbs(VerbsError::DeviceFatal))),
                "{r:?}"
            );
            let e = a.alloc_pd().map(drop).unwrap_err();
            assert_eq!(errno(&e), Some(libc::EIO), "{e}");
        })
        .unwrap();
}

/// Events of one object go to the client that owns it, naming the object as that
/// client knows it: SQ_DRAINED of the first client's QP (moved to SQD) reaches the first
/// client only, QP_ACCESS_ERR of the second's (an RDMA WRITE with a wrong rkey to it)
/// the second only. Once the device is fatal, a client that opens it later is refused
/// with ENODEV (the kernel deletes an unregistered device's uverbs file: the open fails).
#[test]
#[ignore = "needs root"]
fn service_forwards_object_events_to_their_owner_and_refuses_a_late_open() {
    use xrnic::verbs::{AsyncEvent, AttrMask, QpAttr, QpState};
    let s = Svc::start();
    let ifname = s.ifname().to_string();
    let netns = s.pair.end(Side::A).netns.clone();
    s.pair
        .run_in(Side::A, move || {
            let RcPair {
                a,
                b,
                ca,
                ma,
                mb,
                qa,
                qb,
                ..
            } = RcPair::connect(&ifname);
            let state = |st| QpAttr {
                qp_state: st,
                ..QpAttr::default()
            };
            qa.modify(&state(QpState::Sqd), AttrMask::STATE).unwrap();
            assert_eq!(next_event(&a), Some(AsyncEvent::SqDrained(qa.qp_num())));
            qa.modify(&state(QpState::Rts), AttrMask::STATE).unwrap();
            let mut wr = SendWr::new(5, WrOpcode::RdmaWrite);
            wr.sg_list = vec![ma.sge(0, 8)];
            wr.rdma.remote_addr = mb.addr();
            wr.rdma.rkey = xrnic::wire::Rkey(mb.rkey().0 ^ 0x5a00);
            qa.post_send(wr).unwrap();
            let wc = ca.wait(1, Duration::from_secs(10));
            assert_eq!(wc.len(), 1);
            assert_eq!(wc[0].status, WcStatus::RemAccessErr);
            // The second client's first event is its own QP's: SQ_DRAINED did not leak.
            assert_eq!(next_event(&b), Some(AsyncEvent::QpAccessErr(qb.qp_num())));
            assert_eq!(
                a.poll_async_event(),
                None,
                "the access error is not the first's"
            );
            let o = Command::new("ip")
                .args(["-n", &netns, "link", "del", &ifname])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", text(&o));
            let mut seen = Vec::new();
            while !seen.contains(&AsyncEvent::DeviceFatal) {
                let e = next_event(&a).unwrap_or_else(|| panic!("no DEVICE_FATAL: {seen:?}"));
                seen.push(e);
            }
            let e = Device::open(&ifname).map(drop).unwrap_err();
            assert_eq!(errno(&e), Some(libc::ENODEV), "{e}");
        })
        .unwrap();
}
