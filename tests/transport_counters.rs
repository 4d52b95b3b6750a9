//! Counters per QP and per device, on a lossy link and with hand-made bad frames.

use std::time::Duration;
use xrnic::proto::verdict::RxTally;
use xrnic::proto::{Instant, RxVerdict};
#[path = "transport_common/mod.rs"]
mod common;

use common::*;
use xrnic::proto::{Access, WcStatus, WrOpcode};
use xrnic::sim::{ConnectOpts, LinkConfig, Side};
use xrnic::wire::Opcode;

#[test]
fn lossy_run_counts_what_happened() {
    let link = LinkConfig {
        loss: 0.03,
        reorder: 0.03,
        dup: 0.03,
        corrupt: 0.03,
        ..LinkConfig::default()
    };
    let (mut p, c) = pair(link, &ConnectOpts::default());
    let src = mr(&mut p, Side::A, &c, 1 << 20, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 1 << 20, Access::ALL);
    p.b.mr_bytes_mut(dst.lkey).unwrap().fill(3);
    let n = 120u64;
    for i in 0..n {
        let op = if i % 2 == 0 {
            WrOpcode::RdmaWrite
        } else {
            WrOpcode::RdmaRead
        };
        let mut w = send_wr(i, op, sge(&src, (i % 16) * 65536, 8192));
        w.rdma.remote_addr = dst.addr + (i % 16) * 65536;
        w.rdma.rkey = dst.rkey;
        p.a.post_send(c.qp_a, w).unwrap();
    }
    let mut wcs = vec![];
    run_for_wcs(
        &mut p,
        Side::A,
        &c,
        n as usize,
        Instant::from_nanos(10_000_000_000),
        &mut wcs,
    );
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    p.run_until(p.now + Duration::from_nanos(100_000_000), |pr| {
        pr.link.in_flight() == 0
    });

    let (a, b) = (p.a.counters(), p.b.counters());
    let (qa, qb) = (
        p.a.qp_counters(c.qp_a).unwrap(),
        p.b.qp_counters(c.qp_b).unwrap(),
    );
    // One QP per device: the device sums equal the QP counters.
    assert_eq!(a.qp, qa);
    assert_eq!(b.qp, qb);
    // Every frame the link carried was sent by a QP, and every delivered frame was
    // received by a QP or dropped and counted at the device.
    let l = p.link.stats;
    assert_eq!(qa.packets_sent + qb.packets_sent, l.frames_sent);
    let dropped = |d: &xrnic::proto::DeviceCounters| {
        d.malformed_frames_dropped
            + d.wrong_address_dropped
            + d.unknown_qp_dropped
            + d.unsupported_dropped
    };
    assert_eq!(
        qa.packets_received + qb.packets_received + dropped(&a) + dropped(&b),
        l.frames_delivered
    );
    assert!(a.malformed_frames_dropped + b.malformed_frames_dropped > 0);
    assert!(
        a.icrc_errors + b.icrc_errors > 0,
        "bit flips in covered fields fail the ICRC"
    );
    assert!(dropped(&a) + dropped(&b) <= l.corrupted);
    // Loss and reordering: the responder saw gaps and NAKed, the requester went back.
    assert!(qb.out_of_sequence > 0);
    assert!(qb.naks_sent > 0 && qa.packet_seq_err > 0);
    assert!(qa.packet_seq_err <= qb.naks_sent);
    assert_eq!(qa.naks_received, qa.packet_seq_err);
    assert!(qb.duplicate_request > 0);
    assert!(qa.retransmitted_packets > 0);
    assert!(qb.retransmitted_packets > 0, "READ responses replayed");
    assert!(qb.responses_replayed > 0);
    // Lost READ responses show up as implied NAKs or timeouts at the requester.
    assert!(qa.implied_nak_seq_err + qa.local_ack_timeout_err > 0);
    assert!(qa.implied_nak_seq_err > 0);
    assert_eq!(qa.rnr_naks_received + qb.rnr_naks_sent, 0);
    assert!(qa.acks_received > 0 && qb.acks_sent > 0);
    assert!(qa.bytes_sent > n / 2 * 8192);
}

#[test]
fn bad_frames_are_dropped_and_counted_never_panicking() {
    let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
    p.capture = Some(Vec::new());
    let src = mr(&mut p, Side::A, &c, 64, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 64, Access::ALL);
    let mut w = send_wr(1, WrOpcode::RdmaWrite, sge(&src, 0, 64));
    w.rdma.remote_addr = dst.addr;
    w.rdma.rkey = dst.rkey;
    p.a.post_send(c.qp_a, w).unwrap();
    let mut wcs = vec![];
    run_for_wcs(
        &mut p,
        Side::A,
        &c,
        1,
        Instant::from_nanos(1_000_000),
        &mut wcs,
    );
    let good = p
        .capture
        .as_ref()
        .unwrap()
        .iter()
        .find(|f| f.1 == Side::A)
        .unwrap()
        .2
        .clone();
    let before = p.b.counters();
    let bq = p.b.qp_counters(c.qp_b).unwrap();

    let now = p.now;
    // Shorter than its IP and UDP lengths say: malformed before any ICRC is read.
    let cut = good.len() - 1;
    for short in [
        &[][..],
        &[0xff; 7],
        &good[..14],
        &good[..30],
        &good[..50],
        &good[..cut],
    ] {
        assert_eq!(
            p.b.handle_frame(now, short),
            RxVerdict::Malformed,
            "{short:x?}"
        );
    }
    let mut bad_icrc = good.clone();
    let last = bad_icrc.len() - 5;
    bad_icrc[last] ^= 0x40; // payload bit
    assert_eq!(p.b.handle_frame(now, &bad_icrc), RxVerdict::BadIcrc);
    // A TTL change breaks the IPv4 header checksum (the ICRC masks the TTL).
    let mut ttl = good.clone();
    ttl[14 + 8] ^= 1;
    match xrnic::wire::FrameView::parse(&ttl) {
        Err(xrnic::wire::Error::Ipv4Checksum {
            offset,
            expected,
            found,
        }) => {
            assert_eq!(offset, 14);
            assert_eq!(found, u16::from_be_bytes([good[24], good[25]]));
            assert_ne!(expected, found);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.b.handle_frame(now, &ttl), RxVerdict::Malformed);
    let mut bad_mac = good.clone();
    bad_mac[0] ^= 1;
    assert_eq!(p.b.handle_frame(now, &bad_mac), RxVerdict::WrongAddress);
    // Every single-bit flip of a real frame: never a panic, never executed. Each gets the
    // verdict of the first check it fails, and that verdict's counter moves.
    let mut flips = RxTally::default();
    for bit in 0..good.len() * 8 {
        let mut f = good.clone();
        f[bit / 8] ^= 1 << (bit % 8);
        flips.add(p.b.handle_frame(now, &f));
    }
    // Bits the ICRC does not cover (IBTA annex A17.3.3: the masked IP fields) may still
    // give a frame the QP takes, as a duplicate.
    let allowed = [
        RxVerdict::Taken,
        RxVerdict::Malformed,
        RxVerdict::BadIcrc,
        RxVerdict::WrongAddress,
    ];
    for v in RxVerdict::ALL.into_iter().filter(|v| !allowed.contains(v)) {
        assert_eq!(flips.get(v), 0, "a bit flip gave {v:?}");
    }
    assert!(flips.get(RxVerdict::BadIcrc) > 0, "{flips:?}");
    assert!(flips.get(RxVerdict::WrongAddress) > 0, "{flips:?}");
    let after = p.b.counters();
    assert_eq!(
        after.icrc_errors - before.icrc_errors,
        1 + flips.get(RxVerdict::BadIcrc)
    );
    // Seven malformed and one bad ICRC above; a bad ICRC counts as malformed too
    // (src/proto/verdict.rs).
    assert_eq!(
        after.malformed_frames_dropped - before.malformed_frames_dropped,
        8 + flips.get(RxVerdict::Malformed) + flips.get(RxVerdict::BadIcrc)
    );
    assert_eq!(
        after.wrong_address_dropped - before.wrong_address_dropped,
        1 + flips.get(RxVerdict::WrongAddress)
    );
    // The valid duplicates among the flips (bits the ICRC does not cover) are duplicates
    // at the responder: nothing is written twice, no new completion.
    let aq = p.b.qp_counters(c.qp_b).unwrap();
    assert_eq!(aq.remote_access_errors, bq.remote_access_errors);
    assert!(poll(&mut p, Side::B, &c).is_empty());
    // Unknown QPN.
    let mut f = xrnic::wire::FrameRepr::parse(&good).unwrap();
    f.roce.bth.dest_qp = xrnic::wire::Qpn::new(0x777);
    let mut buf = vec![0u8; 2000];
    let n = f.emit(&mut buf).unwrap();
    assert_eq!(p.b.handle_frame(now, &buf[..n]), RxVerdict::UnknownQp);
    assert_eq!(
        p.b.counters().unknown_qp_dropped,
        after.unknown_qp_dropped + 1
    );
    // A UD frame for an RC QP: not that QP's (rxe `check_type_state`).
    let mut ud = xrnic::wire::FrameRepr::parse(&good).unwrap();
    ud.roce.bth.opcode = Opcode::UD_SEND_ONLY;
    ud.roce.ext = xrnic::wire::ExtHeaders {
        deth: Some(xrnic::wire::DethRepr {
            qkey: 0x8001_0000,
            src_qp: xrnic::wire::Qpn::new(1),
        }),
        ..Default::default()
    };
    let n = ud.emit(&mut buf).unwrap();
    assert_eq!(p.b.handle_frame(now, &buf[..n]), RxVerdict::UnknownQp);
    assert_eq!(
        p.b.counters().unknown_qp_dropped,
        after.unknown_qp_dropped + 2
    );
    assert_eq!(
        p.b.counters().unsupported_dropped,
        after.unsupported_dropped
    );
}

/// An RC QP talks to one peer (IBTA §9.6, packet source
/// validation), so a frame from a third GID to a connected QP is not that QP's: it is
/// dropped as `unknown_qp_dropped` (what counters.rs, the capture tap and
/// docs/observability.md say), and the QP's own counters do not see it.
#[test]
fn a_frame_from_a_third_gid_is_unknown_qp_not_the_qps_packet() {
    let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
    let src = mr(&mut p, Side::A, &c, 64, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 64, Access::LOCAL_WRITE);
    p.b.post_recv(c.qp_b, recv_wr(1, sge(&dst, 0, 64))).unwrap();
    p.a.post_send(c.qp_a, send_wr(1, WrOpcode::Send, sge(&src, 0, 8)))
        .unwrap();
    let mut buf = vec![0u8; xrnic::proto::MAX_FRAME_LEN];
    let n = p.a.poll_transmit(Instant::ZERO, &mut buf).unwrap();
    let mut f = xrnic::wire::FrameRepr::parse(&buf[..n]).unwrap();
    match &mut f.ip {
        xrnic::wire::IpRepr::V4 { src, .. } => *src = [192, 0, 2, 3],
        other => panic!("{other:?}"),
    }
    let mut third = vec![0u8; f.buffer_len()];
    let m = f.emit(&mut third).unwrap();
    let before = p.b.counters();
    let bq = p.b.qp_counters(c.qp_b).unwrap();
    assert_eq!(
        p.b.handle_frame(Instant::ZERO, &third[..m]),
        RxVerdict::WrongPeer
    );
    let after = p.b.counters();
    assert_eq!(after.unknown_qp_dropped, before.unknown_qp_dropped + 1);
    assert_eq!(p.b.qp_counters(c.qp_b).unwrap(), bq, "not the QP's packet");
    assert!(poll(&mut p, Side::B, &c).is_empty());
}
