//! Progress on application threads (src/driver/poll.rs), on the in-process simulated link
//! (no root needed): busy polling alone moves every byte right through the fault
//! injector's losses (its steps receive, retransmit on timers and transmit); a passive
//! server's driver still answers one-sided WRITEs and READs while only the client polls;
//! the driver takes the socket back when a poller stops calling; two threads waiting on
//! two CQs of one device (one asleep on the socket, one on the condition variable) both
//! get their completions. Deferred ACKs (a polling thread's ACKs wait for its next
//! frames): a polled ping-pong through losses completes every message with every byte
//! right and the ACKs deferred, and a deferred ACK still leaves when its application
//! stops calling (the requester may not retry, so only that ACK can complete it).
//! Retransmit and RNR timers fire while the application only polls an empty CQ.

use std::time::{Duration, Instant};

use xrnic::verbs::{
    Access, ConnectOpts, Cq, Device, DeviceOptions, Mr, Mtu, Qp, QpInitAttr, RecvWr, Remote,
    SendWr, WcStatus, WorkCompletion, WrOpcode,
};

/// A guard against hanging, not a performance bound.
const PATIENCE: Duration = Duration::from_secs(60);

struct End {
    dev: Device,
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn end(dev: &Device, len: usize) -> End {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let mr = pd.reg_mr(len, Access::ALL).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 512)).unwrap();
    End {
        dev: dev.clone(),
        cq,
        mr,
        qp,
    }
}

fn opts() -> ConnectOpts {
    ConnectOpts {
        access: Access::ALL,
        path_mtu: Mtu::Mtu1024,
        // 4.096 µs × 2^8 ≈ 1 ms: losses are repaired quickly.
        timeout: 8,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 1,
        ..ConnectOpts::default()
    }
}

fn connect(a: &End, b: &End) {
    connect_with(a, b, &opts());
}

fn connect_with(a: &End, b: &End, o: &ConnectOpts) {
    let g = |d: &Device| d.query_gid(1).unwrap();
    a.qp.connect(
        &Remote {
            qpn: b.qp.qp_num(),
            psn: 0x10,
            gid: g(&b.dev),
        },
        0x20,
        1,
        o,
    )
    .unwrap();
    b.qp.connect(
        &Remote {
            qpn: a.qp.qp_num(),
            psn: 0x20,
            gid: g(&a.dev),
        },
        0x10,
        1,
        o,
    )
    .unwrap();
}

/// Busy-poll `cq` (never sleeping) until `n` completions came.
fn poll_n(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let start = Instant::now();
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            start.elapsed() < PATIENCE,
            "{} of {n} completions: {out:?}",
            out.len()
        );
        if cq.poll_into(n - out.len(), &mut out) == 0 {
            std::thread::yield_now();
        }
    }
    out
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(7)) as u8)
        .collect()
}

#[test]
fn busy_polling_alone_delivers_every_byte_through_losses() {
    let lossy = |seed| DeviceOptions {
        rx_drop: 0.05,
        seed,
        ..DeviceOptions::default()
    };
    let (da, db) = Device::open_sim_pair_with(&lossy(3), &lossy(4)).unwrap();
    const MSG: usize = 3000; // three packets at path MTU 1024
    const N: usize = 60;
    let (a, b) = (end(&da, MSG * N), end(&db, MSG * N));
    connect(&a, &b);
    for i in 0..N {
        a.mr.write(i * MSG, &pattern(i as u32, MSG)).unwrap();
        b.qp.post_recv(RecvWr {
            wr_id: i as u64,
            sg_list: vec![b.mr.sge(i * MSG, MSG as u32)],
        })
        .unwrap();
    }
    // The sender polls in its own thread; each side only ever calls poll.
    let sender = std::thread::spawn(move || {
        for i in 0..N {
            let mut wr = SendWr::new(i as u64, WrOpcode::Send);
            wr.sg_list = vec![a.mr.sge(i * MSG, MSG as u32)];
            wr.send_flags = xrnic::verbs::SendFlags::SIGNALED;
            a.qp.post_send(wr).unwrap();
        }
        let wcs = poll_n(&a.cq, N);
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
        a
    });
    let wcs = poll_n(&b.cq, N);
    let a = sender.join().unwrap();
    for w in &wcs {
        assert_eq!(
            (w.status, w.byte_len),
            (WcStatus::Success, MSG as u32),
            "{w:?}"
        );
    }
    let mut got = vec![0u8; MSG];
    for i in 0..N {
        b.mr.read(i * MSG, &mut got).unwrap();
        assert!(got == pattern(i as u32, MSG), "message {i} differs");
    }
    let (sa, sb) = (da.driver_stats().unwrap(), db.driver_stats().unwrap());
    assert!(
        sa.fault_dropped + sb.fault_dropped > 0,
        "the injector dropped nothing: {sa:?} {sb:?}"
    );
    assert!(
        a.qp.counters().unwrap().retransmitted_packets > 0,
        "{:?}",
        a.qp.counters().unwrap()
    );
    // The application threads did the work: their steps moved frames.
    assert!(sa.app_steps > 0 && sb.app_steps > 0, "{sa:?} {sb:?}");
}

#[test]
fn a_passive_server_answers_writes_and_reads_while_only_the_client_polls() {
    let (da, db) = Device::open_sim_pair().unwrap();
    const LEN: usize = 64 * 1024;
    let (a, b) = (end(&da, 2 * LEN), end(&db, LEN));
    connect(&a, &b);
    let data = pattern(9, LEN);
    a.mr.write(0, &data).unwrap();
    let mut wr = SendWr::new(1, WrOpcode::RdmaWrite);
    wr.sg_list = vec![a.mr.sge(0, LEN as u32)];
    wr.rdma.remote_addr = b.mr.addr();
    wr.rdma.rkey = b.mr.rkey();
    wr.send_flags = xrnic::verbs::SendFlags::SIGNALED;
    a.qp.post_send(wr).unwrap();
    let mut rd = SendWr::new(2, WrOpcode::RdmaRead);
    rd.sg_list = vec![a.mr.sge(LEN, LEN as u32)];
    rd.rdma.remote_addr = b.mr.addr();
    rd.rdma.rkey = b.mr.rkey();
    rd.send_flags = xrnic::verbs::SendFlags::SIGNALED;
    a.qp.post_send(rd).unwrap();
    let wcs = poll_n(&a.cq, 2);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let mut got = vec![0u8; LEN];
    b.mr.read(0, &mut got).unwrap();
    assert!(got == data, "the WRITE's bytes differ at the server");
    a.mr.read(LEN, &mut got).unwrap();
    assert!(got == data, "the READ brought back other bytes");
    // B's application made no call since connecting: its driver thread did B's part.
    let sb = db.driver_stats().unwrap();
    assert_eq!(sb.app_steps, 0, "{sb:?}");
    assert!(sb.frames_in > 0 && sb.frames_out > 0, "{sb:?}");
}

#[test]
fn the_driver_takes_the_socket_back_when_a_poller_stops_calling() {
    let (da, db) = Device::open_sim_pair().unwrap();
    let (a, b) = (end(&da, 4096), end(&db, 4096));
    connect(&a, &b);
    a.qp.post_recv(RecvWr {
        wr_id: 5,
        sg_list: vec![a.mr.sge(0, 64)],
    })
    .unwrap();
    // A polls once (taking the poll lease), then never calls in again.
    assert!(a.cq.poll(4).is_empty());
    let steps = da.driver_stats().unwrap().app_steps;
    b.mr.write(0, b"to a passive poller").unwrap();
    let mut wr = SendWr::new(6, WrOpcode::Send);
    wr.sg_list = vec![b.mr.sge(0, 19)];
    b.qp.post_send(wr).unwrap();
    // Reading counters takes no step: only A's driver thread can receive the SEND.
    let start = Instant::now();
    while a.qp.counters().unwrap().packets_received == 0 {
        assert!(start.elapsed() < PATIENCE, "A's driver never received");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(da.driver_stats().unwrap().app_steps, steps);
    let wc = a.cq.poll(4);
    assert_eq!(wc.len(), 1, "{wc:?}");
    assert_eq!((wc[0].wr_id, wc[0].byte_len), (5, 19));
}

#[test]
fn two_threads_waiting_on_two_cqs_of_one_device_both_wake() {
    let (da, db) = Device::open_sim_pair().unwrap();
    // Two connections between the same two devices, each with its own CQ on A.
    let (a1, b1) = (end(&da, 4096), end(&db, 4096));
    let (a2, b2) = (end(&da, 4096), end(&db, 4096));
    connect(&a1, &b1);
    connect(&a2, &b2);
    for (a, id) in [(&a1, 11u64), (&a2, 22)] {
        a.qp.post_recv(RecvWr {
            wr_id: id,
            sg_list: vec![a.mr.sge(0, 64)],
        })
        .unwrap();
    }
    let wait = |cq: Cq| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            cq.wait_receiving(4, PATIENCE, &mut v);
            v
        })
    };
    let (w1, w2) = (wait(a1.cq.clone()), wait(a2.cq.clone()));
    // Both are (very likely) asleep by now, one of them on the socket.
    std::thread::sleep(Duration::from_millis(20));
    for (b, len) in [(&b2, 7u32), (&b1, 9)] {
        let mut wr = SendWr::new(1, WrOpcode::Send);
        wr.sg_list = vec![b.mr.sge(0, len)];
        b.qp.post_send(wr).unwrap();
    }
    let (g1, g2) = (w1.join().unwrap(), w2.join().unwrap());
    assert_eq!(g1.len(), 1, "{g1:?}");
    assert_eq!(g2.len(), 1, "{g2:?}");
    assert_eq!((g1[0].wr_id, g1[0].byte_len), (11, 9));
    assert_eq!((g2[0].wr_id, g2[0].byte_len), (22, 7));
}

/// One side of an rc-pingpong-like exchange, polling only: post the next SEND once the
/// previous SEND and the awaited receive completed (the client starts). Checks every
/// completion and every received byte.
fn ping_pong_side(e: &End, n: usize, msg: usize, client: bool) {
    const SEND: u64 = 1 << 32;
    let tx_at = n * msg;
    let send = |i: usize| {
        e.mr.write(tx_at, &pattern(i as u32 | (u32::from(client) << 16), msg))
            .unwrap();
        let mut wr = SendWr::new(SEND | i as u64, WrOpcode::Send);
        wr.sg_list = vec![e.mr.sge(tx_at, msg as u32)];
        wr.send_flags = xrnic::verbs::SendFlags::SIGNALED;
        e.qp.post_send(wr).unwrap();
    };
    let (mut sent, mut scnt, mut rcnt) = (0usize, 0usize, 0usize);
    if client {
        send(0);
        sent = 1;
    }
    let mut got = vec![0u8; msg];
    while scnt < n || rcnt < n {
        for wc in poll_n(&e.cq, 1) {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.wr_id & SEND != 0 {
                assert_eq!(wc.wr_id, SEND | scnt as u64);
                scnt += 1;
            } else {
                assert_eq!((wc.wr_id, wc.byte_len), (rcnt as u64, msg as u32));
                e.mr.read(rcnt * msg, &mut got).unwrap();
                let from = u32::from(!client) << 16;
                assert!(got == pattern(rcnt as u32 | from, msg), "message {rcnt}");
                rcnt += 1;
            }
        }
        // The client answers its own round once both completions came; the server
        // answers each message it received once its previous SEND completed.
        if sent < n && scnt == sent && rcnt == sent + usize::from(!client) {
            send(sent);
            sent += 1;
        }
    }
}

#[test]
fn a_polled_ping_pong_defers_its_acks_and_completes_through_losses() {
    let lossy = |seed| DeviceOptions {
        rx_drop: 0.05,
        seed,
        ..DeviceOptions::default()
    };
    let (da, db) = Device::open_sim_pair_with(&lossy(5), &lossy(6)).unwrap();
    const MSG: usize = 64;
    const N: usize = 300;
    let (a, b) = (end(&da, MSG * (N + 1)), end(&db, MSG * (N + 1)));
    // 4.096 µs × 2^13 ≈ 34 ms: with retry_cnt 7 the QPs outlive ~240 ms of a starved
    // thread (make test-loaded, or CI next to other builds: at timeout 8, ~1 ms, a busy
    // machine ended this test in RETRY_EXC_ERR with nothing lost for good).
    connect_with(
        &a,
        &b,
        &ConnectOpts {
            timeout: 13,
            ..opts()
        },
    );
    for e in [&a, &b] {
        for i in 0..N {
            e.qp.post_recv(RecvWr {
                wr_id: i as u64,
                sg_list: vec![e.mr.sge(i * MSG, MSG as u32)],
            })
            .unwrap();
        }
    }
    let server = std::thread::spawn(move || {
        ping_pong_side(&b, N, MSG, false);
        b
    });
    ping_pong_side(&a, N, MSG, true);
    let _b = server.join().unwrap();
    let (sa, sb) = (da.driver_stats().unwrap(), db.driver_stats().unwrap());
    assert!(
        sa.fault_dropped > 0 && sb.fault_dropped > 0,
        "the injector dropped nothing: {sa:?} {sb:?}"
    );
    // Both sides' ACKs took the deferred path (each side polls for the message it then
    // answers), and every SEND still completed: each ACK arrived, or a later one covered it.
    assert!(
        sa.acks_deferred > 0 && sb.acks_deferred > 0,
        "{sa:?} {sb:?}"
    );
}

#[test]
fn a_deferred_ack_leaves_when_its_application_stops_calling() {
    let (da, db) = Device::open_sim_pair().unwrap();
    let (a, b) = (end(&da, 4096), end(&db, 4096));
    // No retries: A's SEND completes only through B's one ACK for it. The long timeout
    // (4.096 µs × 2^20 ≈ 4.3 s) is a guard against hanging: a deferred ACK leaves within
    // the poll lease (2 ms) of B's last call.
    let o = ConnectOpts {
        timeout: 20,
        retry_cnt: 0,
        ..opts()
    };
    connect_with(&a, &b, &o);
    let mut deferred_rounds = 0;
    for round in 0..1000u64 {
        b.qp.post_recv(RecvWr {
            wr_id: round,
            sg_list: vec![b.mr.sge(0, 64)],
        })
        .unwrap();
        let before = db.driver_stats().unwrap().acks_deferred;
        let mut wr = SendWr::new(round, WrOpcode::Send);
        wr.sg_list = vec![a.mr.sge(0, 64)];
        wr.send_flags = xrnic::verbs::SendFlags::SIGNALED;
        a.qp.post_send(wr).unwrap();
        // B polls until the message is there, then makes no call this round (reading
        // its counters below takes no step).
        let got = poll_n(&b.cq, 1);
        assert_eq!((got[0].status, got[0].wr_id), (WcStatus::Success, round));
        let wc = a.cq.wait(1, PATIENCE);
        assert_eq!(wc.len(), 1, "round {round}: no send completion");
        assert_eq!(
            (wc[0].status, wc[0].wr_id),
            (WcStatus::Success, round),
            "round {round}: the ACK did not come"
        );
        if db.driver_stats().unwrap().acks_deferred > before {
            deferred_rounds += 1;
            if deferred_rounds == 5 {
                break;
            }
        }
    }
    assert_eq!(deferred_rounds, 5, "{:?}", db.driver_stats().unwrap());
    assert_eq!(a.qp.counters().unwrap().retransmitted_packets, 0);
}

/// Poll `cq` (yielding, never sleeping) until `done` says so; the completions seen.
fn poll_until(cq: &Cq, mut done: impl FnMut() -> bool) -> Vec<WorkCompletion> {
    let start = Instant::now();
    let mut out = Vec::new();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "gave up polling: {out:?}");
        if cq.poll_into(4, &mut out) == 0 {
            std::thread::yield_now();
        }
    }
    out
}

#[test]
fn retransmit_timers_fire_while_the_application_polls_an_empty_cq() {
    // B's fault injector drops everything: A's SEND is never acknowledged, nothing ever
    // reaches A's receive ring, so A's polls find nothing and only the timers can make
    // progress: the SEND goes out again on each local ACK timeout
    // (≈ 1 ms at timeout 8) until retry_cnt is spent, then fails (IBTA §9.7.6.1.3).
    let deaf = DeviceOptions {
        rx_drop: 1.0,
        ..DeviceOptions::default()
    };
    let (da, db) = Device::open_sim_pair_with(&DeviceOptions::default(), &deaf).unwrap();
    let (a, b) = (end(&da, 4096), end(&db, 4096));
    let o = ConnectOpts {
        retry_cnt: 3,
        ..opts()
    };
    connect_with(&a, &b, &o);
    let mut wr = SendWr::new(7, WrOpcode::Send);
    wr.sg_list = vec![a.mr.sge(0, 64)];
    wr.send_flags = xrnic::verbs::SendFlags::SIGNALED;
    a.qp.post_send(wr).unwrap();
    let wcs = poll_n(&a.cq, 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (7, WcStatus::RetryExcErr),
        "{wcs:?}"
    );
    let c = a.qp.counters().unwrap();
    assert_eq!(c.retransmitted_packets, 3, "{c:?}");
    assert_eq!(c.retry_exceeded_err, 1, "{c:?}");
    // B's driver thread drops what it takes from its link in its own time: wait (bounded)
    // until it has taken the four copies of the SEND.
    let end = Instant::now() + PATIENCE;
    while db.driver_stats().unwrap().fault_dropped < 4 {
        assert!(Instant::now() < end, "{:?}", db.driver_stats().unwrap());
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn rnr_timers_fire_while_the_application_polls_an_empty_cq() {
    // B has no receive posted: it answers A's SEND with RNR NAKs, and A sends again each
    // time its RNR timer (min_rnr_timer 1: 0.01 ms) runs out (IBTA §9.7.5.2.8), while A
    // only polls its empty CQ. Once B posts a receive (without
    // stepping: its driver thread answers), the next retry completes the SEND.
    let (da, db) = Device::open_sim_pair().unwrap();
    let (a, b) = (end(&da, 4096), end(&db, 4096));
    let o = ConnectOpts {
        rnr_retry: 7, // infinite
        ..opts()
    };
    connect_with(&a, &b, &o);
    a.mr.write(0, b"after the RNR NAKs").unwrap();
    let mut wr = SendWr::new(8, WrOpcode::Send);
    wr.sg_list = vec![a.mr.sge(0, 18)];
    wr.send_flags = xrnic::verbs::SendFlags::SIGNALED;
    a.qp.post_send(wr).unwrap();
    let early = poll_until(&a.cq, || a.qp.counters().unwrap().rnr_naks_received >= 3);
    assert!(
        early.is_empty(),
        "completed without a receive at B: {early:?}"
    );
    b.qp.post_recv(RecvWr {
        wr_id: 9,
        sg_list: vec![b.mr.sge(0, 64)],
    })
    .unwrap();
    let wcs = poll_n(&a.cq, 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (8, WcStatus::Success),
        "{wcs:?}"
    );
    let got = poll_n(&b.cq, 1);
    assert_eq!((got[0].wr_id, got[0].byte_len), (9, 18));
    let mut msg = [0u8; 18];
    b.mr.read(0, &mut msg).unwrap();
    assert_eq!(&msg, b"after the RNR NAKs");
    let c = a.qp.counters().unwrap();
    assert!(c.retransmitted_packets >= 3, "{c:?}");
}

#[test]
fn a_post_while_another_qp_has_work_in_flight_leaves_the_sending_to_the_driver() {
    // The doorbell (a step on the posting thread, one `sendto`) is for the latency case:
    // an idle device. With a message unacknowledged on some QP the driver thread steps
    // for it anyway, and a post on another, idle send queue only kicks it: with many QPs
    // that each get one message at a time (`make bench-net` (h)), a doorbell per post
    // cost a `sendto` and a driver wake-up per message (docs/performance.md "Many QPs").
    let (da, db) = Device::open_sim_pair().unwrap();
    let (a, b) = (end(&da, 4096), end(&db, 4096));
    connect(&a, &b);
    // A second QP of A whose peer does not exist: B drops its request unanswered, so its
    // message stays unacknowledged (and its retransmission timer armed) for seconds.
    let pd = da.alloc_pd().unwrap();
    let lost = pd.create_qp(&QpInitAttr::new(&a.cq, &a.cq, 4)).unwrap();
    let slow = ConnectOpts {
        // 4.096 µs × 2^22 ≈ 17 s: no retry within the test.
        timeout: 22,
        ..opts()
    };
    lost.connect(
        &Remote {
            qpn: xrnic::wire::Qpn::new(b.qp.qp_num().value() ^ 0x40),
            psn: 0x30,
            gid: db.query_gid(1).unwrap(),
        },
        0x40,
        1,
        &slow,
    )
    .unwrap();
    let mr = pd.reg_mr(64, Access::ALL).unwrap();
    let mut w = SendWr::new(7, WrOpcode::RdmaWrite);
    w.sg_list = vec![mr.sge(0, 64)];
    w.rdma.remote_addr = b.mr.addr();
    w.rdma.rkey = b.mr.rkey();
    lost.post_send(w).unwrap();
    let start = Instant::now();
    while lost.counters().unwrap().packets_sent == 0 {
        assert!(
            start.elapsed() < PATIENCE,
            "the lost QP's request never left"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Now a WRITE on the connected QP, whose send queue is empty.
    let steps = da.driver_stats().unwrap().app_steps;
    let data = pattern(3, 4096);
    a.mr.write(0, &data).unwrap();
    let mut wr = SendWr::new(8, WrOpcode::RdmaWrite);
    wr.sg_list = vec![a.mr.sge(0, 4096)];
    wr.rdma.remote_addr = b.mr.addr();
    wr.rdma.rkey = b.mr.rkey();
    wr.send_flags = xrnic::verbs::SendFlags::SIGNALED;
    a.qp.post_send(wr).unwrap();
    assert_eq!(
        da.driver_stats().unwrap().app_steps,
        steps,
        "the post stepped on the application's thread"
    );
    // The driver thread sent it: it completes (waiting on the condition variable, which
    // takes no step either).
    let mut wcs = Vec::new();
    while wcs.is_empty() {
        assert!(start.elapsed() < PATIENCE, "the WRITE never completed");
        a.cq.wait_into(4, Duration::from_millis(100), &mut wcs);
    }
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (8, WcStatus::Success),
        "{wcs:?}"
    );
    assert_eq!(da.driver_stats().unwrap().app_steps, steps);
    let mut got = vec![0u8; 4096];
    b.mr.read(0, &mut got).unwrap();
    assert!(got == data, "the WRITE's bytes differ at the server");
}
