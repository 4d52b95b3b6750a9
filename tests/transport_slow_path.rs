//! A path slower than `ack_every` (64) packets per local ACK timeout: the TCG guests of
//! interop/ move about 1 MB/s through xrnic, where 64 packets of 1 KiB take about as long
//! as perftest's default timeout (14: 4.096 µs × 2^14 ≈ 67 ms). Asking for an ACK only
//! every 64 packets, the requester's timer expired between ACKs with nothing lost, once
//! per 64 packets, and each expiry resent a window (in the guests, behind the packets
//! still queued at the receiver: the 2-4 MiB sweeps ended in RETRY_EXC_ERR). The
//! requester measures how fast the peer acknowledges and asks for ACKs often enough that
//! one comes back within a quarter of the timeout (`Requester::paced_ack_every`).

#[path = "transport_common/mod.rs"]
mod common;

use common::*;
use xrnic::proto::{Access, Instant, WcStatus, WrOpcode};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair, RcPair, Side};

/// Four 1 MiB WRITEs over a `mbps` link with perftest's timeout: (timeouts, retransmitted
/// packets), after checking every completion and every byte.
fn four_mib_over(mbps: u64) -> (u64, u64) {
    let link = LinkConfig {
        bandwidth_bps: mbps * 1_000_000,
        delay_ns: 100_000,
        ..LinkConfig::default()
    };
    let opts = ConnectOpts {
        timeout: 14,
        ..ConnectOpts::default()
    };
    let (mut p, c) = pair(link, &opts);
    let size = 1usize << 20;
    let src = mr(&mut p, Side::A, &c, size, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, size * 4, Access::ALL);
    for (i, b) in p.a.mr_bytes_mut(src.lkey).unwrap().iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    for i in 0..4u64 {
        let mut w = send_wr(i, WrOpcode::RdmaWrite, sge(&src, 0, size as u32));
        w.rdma.remote_addr = dst.addr + i * size as u64;
        w.rdma.rkey = dst.rkey;
        p.a.post_send(c.qp_a, w).unwrap();
    }
    let mut wcs = vec![];
    // Virtual time: 4 MiB at 7 Mb/s is about 5 s.
    run_for_wcs(
        &mut p,
        Side::A,
        &c,
        4,
        Instant::from_nanos(100_000_000_000),
        &mut wcs,
    );
    assert!(
        wcs.iter().all(|w| w.status == WcStatus::Success),
        "{mbps} Mb/s: {wcs:?}"
    );
    let want: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let got = p.b.mr_bytes_mut(dst.lkey).unwrap();
    for (i, chunk) in got.chunks(size).enumerate() {
        assert!(chunk == want.as_slice(), "{mbps} Mb/s: message {i} differs");
    }
    let qa = p.a.qp_counters(c.qp_a).unwrap();
    assert_eq!(qa.retry_exceeded_err, 0);
    (qa.local_ack_timeout_err, qa.retransmitted_packets)
}

#[test]
fn a_path_slower_than_64_packets_per_timeout_sees_no_timeout_after_its_pace_is_known() {
    // 8, 7 and 6 Mb/s: a 1 KiB-MTU packet (1082 bytes on the wire) takes 1.1-1.4 ms, 64
    // of them 69-92 ms, more than the 67 ms timeout. Without pacing the AckReq, one timeout
    // per 64 packets (64 in 4 MiB). With it, only the intervals before two ACKs measured
    // the pace can expire.
    for mbps in [8, 7, 6] {
        let (timeouts, retx) = four_mib_over(mbps);
        assert!(
            timeouts <= 2,
            "{mbps} Mb/s: {timeouts} local ACK timeouts, {retx} packets resent"
        );
    }
}

#[test]
fn a_path_fast_enough_for_64_packets_per_timeout_never_times_out() {
    // 10 and 40 Mb/s: 64 packets take 55 and 14 ms, within the timeout.
    for mbps in [40, 10] {
        assert_eq!(four_mib_over(mbps), (0, 0), "{mbps} Mb/s");
    }
}

/// One 64 KiB WRITE (64 packets at path MTU 1024) on `c` after `idle_ns` of nothing
/// outstanding: the ACKs the responder sent for it, after checking its completion.
fn acks_for_one_write_after(p: &mut Pair, c: &RcPair, idle_ns: u64, id: u64) -> u64 {
    let size = 64 * 1024;
    let src = mr(p, Side::A, c, size, Access::LOCAL_WRITE);
    let dst = mr(p, Side::B, c, size, Access::ALL);
    p.now = Instant::from_nanos(p.now.as_nanos() + idle_ns);
    let before = p.b.qp_counters(c.qp_b).unwrap().acks_sent;
    let mut w = send_wr(id, WrOpcode::RdmaWrite, sge(&src, 0, size as u32));
    w.rdma.remote_addr = dst.addr;
    w.rdma.rkey = dst.rkey;
    p.a.post_send(c.qp_a, w).unwrap();
    let mut wcs = vec![];
    let limit = Instant::from_nanos(p.now.as_nanos() + 1_000_000_000);
    run_for_wcs(p, Side::A, c, 1, limit, &mut wcs);
    assert_eq!(wcs[0].status, WcStatus::Success, "{wcs:?}");
    assert_eq!(p.a.qp_counters(c.qp_a).unwrap().local_ack_timeout_err, 0);
    p.b.qp_counters(c.qp_b).unwrap().acks_sent - before
}

#[test]
fn time_with_nothing_outstanding_is_not_taken_for_a_slow_path() {
    // A QP that sends a message now and then (10 000 QPs sharing 32 messages in flight in
    // `make bench-net` (h): each gets one about every 0.3 s) once measured the pace from
    // the last ACK before the idle time: 10 s over 128 packets looked like a path of
    // 78 ms per packet, and every later packet asked for an ACK of its own (64 ACKs per
    // 64 KiB message instead of 1). The sample now starts at the first packet sent with
    // nothing outstanding.
    let opts = ConnectOpts {
        mtu: xrnic::proto::Mtu::Mtu1024,
        timeout: 14,
        ..ConnectOpts::default()
    };
    let (mut p, c) = pair(LinkConfig::default(), &opts);
    // The first message measures the pace on a fast path: one ACK, at its last packet.
    assert_eq!(acks_for_one_write_after(&mut p, &c, 0, 1), 1);
    for (i, idle_ns) in [10_000_000_000u64, 10_000_000_000, 1_000_000_000]
        .into_iter()
        .enumerate()
    {
        let acks = acks_for_one_write_after(&mut p, &c, idle_ns, 2 + i as u64);
        assert_eq!(acks, 1, "message {} after {idle_ns} ns idle", i + 2);
    }
}
