//! Every frame gets a verdict from `Rnic::handle_frame`, and each verdict
//! moves its one counter (src/proto/verdict.rs). One test per verdict kind, each a frame
//! built from a real one the engine emitted, checking the verdict, the counter it names,
//! and that no other device, QP or UD counter moved.

use std::time::Duration;
use xrnic::proto::Instant;
#[path = "transport_common/mod.rs"]
mod common;

use common::*;
use xrnic::proto::{
    Access, AttrMask, DeviceCounters, QpAttr, QpCounters, QpInitAttr, QpState, QpType, RxVerdict,
    UdCounters, WrOpcode,
};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair, RcPair, Side};
use xrnic::wire::{DethRepr, ExtHeaders, FrameRepr, IpRepr, Opcode, PKey, Qpn};

/// A connected pair with a receive posted at B, and the SEND frame A emitted for it.
fn setup() -> (Pair, RcPair, Vec<u8>) {
    let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
    let src = mr(&mut p, Side::A, &c, 64, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 64, Access::LOCAL_WRITE);
    p.b.post_recv(c.qp_b, recv_wr(1, sge(&dst, 0, 64))).unwrap();
    p.a.post_send(c.qp_a, send_wr(1, WrOpcode::Send, sge(&src, 0, 8)))
        .unwrap();
    let mut buf = vec![0u8; xrnic::proto::MAX_FRAME_LEN];
    let n = p.a.poll_transmit(Instant::ZERO, &mut buf).unwrap();
    buf.truncate(n);
    (p, c, buf)
}

/// `good` changed by `f`, emitted again (lengths, checksums and ICRC recomputed).
fn edit(good: &[u8], f: impl FnOnce(&mut FrameRepr<'_>)) -> Vec<u8> {
    let mut r = FrameRepr::parse(good).unwrap();
    f(&mut r);
    let mut out = vec![0u8; r.buffer_len()];
    let n = r.emit(&mut out).unwrap();
    out.truncate(n);
    out
}

/// Everything a frame can move at B: the device counters, one QP's, its UD counters.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Snap {
    dev: DeviceCounters,
    qp: QpCounters,
    ud: UdCounters,
}

fn snap(p: &Pair, qpn: Qpn) -> Snap {
    let mut dev = p.b.counters();
    // The QP's own counters are compared on their own.
    dev.qp = QpCounters::default();
    Snap {
        dev,
        qp: p.b.qp_counters(qpn).unwrap(),
        ud: p.b.ud_counters(qpn).unwrap_or_default(),
    }
}

/// Hand `frame` to B; the verdict must be `want`, and the counters must move exactly as
/// `expect` does to the snapshot taken before (of QP `qpn`).
fn check(p: &mut Pair, qpn: Qpn, frame: &[u8], want: RxVerdict, expect: impl FnOnce(&mut Snap)) {
    let before = snap(p, qpn);
    let v = p.b.handle_frame(Instant::ZERO, frame);
    assert_eq!(v, want);
    let mut want_snap = before;
    expect(&mut want_snap);
    assert_ne!(want_snap, before, "every verdict moves a counter");
    assert_eq!(
        snap(p, qpn),
        want_snap,
        "{want:?} moved {:?}",
        want.counter()
    );
}

/// The QP counted the frame as received (a verdict reached at the QP).
fn received(s: &mut Snap, len: usize) {
    s.qp.packets_received += 1;
    s.qp.bytes_received += len as u64;
}

#[test]
fn taken_counts_the_packet_at_its_qp() {
    let (mut p, c, good) = setup();
    check(&mut p, c.qp_b, &good, RxVerdict::Taken, |s| {
        received(s, good.len());
    });
    assert_eq!(RxVerdict::Taken.counter(), None);
}

#[test]
fn malformed_moves_malformed_frames_dropped() {
    let (mut p, c, good) = setup();
    for f in [
        &[][..],
        &[0xff; 7][..],
        &good[..30],
        &good[..good.len() - 1],
    ] {
        check(&mut p, c.qp_b, f, RxVerdict::Malformed, |s| {
            s.dev.malformed_frames_dropped += 1
        });
    }
    // A TTL change breaks the IPv4 header checksum (the ICRC masks the TTL).
    let mut ttl = good.clone();
    ttl[14 + 8] ^= 1;
    check(&mut p, c.qp_b, &ttl, RxVerdict::Malformed, |s| {
        s.dev.malformed_frames_dropped += 1
    });
    assert_eq!(
        RxVerdict::Malformed.counter(),
        Some("malformed_frames_dropped")
    );
}

#[test]
fn bad_icrc_moves_icrc_errors_among_the_malformed() {
    let (mut p, c, good) = setup();
    let mut bad = good.clone();
    let last = bad.len() - 5;
    bad[last] ^= 0x40; // a payload bit
    check(&mut p, c.qp_b, &bad, RxVerdict::BadIcrc, |s| {
        s.dev.icrc_errors += 1;
        s.dev.malformed_frames_dropped += 1;
    });
    assert_eq!(RxVerdict::BadIcrc.counter(), Some("icrc_errors"));
}

#[test]
fn wrong_address_moves_wrong_address_dropped() {
    let (mut p, c, good) = setup();
    let mac = edit(&good, |f| f.eth.dst[5] ^= 0x10);
    let ip = edit(&good, |f| match &mut f.ip {
        IpRepr::V4 { dst, .. } => dst[3] ^= 0x40,
        other => panic!("{other:?}"),
    });
    for f in [mac, ip] {
        check(&mut p, c.qp_b, &f, RxVerdict::WrongAddress, |s| {
            s.dev.wrong_address_dropped += 1
        });
    }
    assert_eq!(
        RxVerdict::WrongAddress.counter(),
        Some("wrong_address_dropped")
    );
}

#[test]
fn a_cnp_without_congestion_control_is_unsupported() {
    let (mut p, c, good) = setup();
    let r = FrameRepr::parse(&good).unwrap();
    let cnp = xrnic::proto::congestion::build_cnp(r.eth, r.ip, c.qp_b, 48, 6);
    let mut f = vec![0u8; cnp.buffer_len()];
    let n = cnp.emit(&mut f).unwrap();
    check(&mut p, c.qp_b, &f[..n], RxVerdict::Unsupported, |s| {
        s.dev.unsupported_dropped += 1
    });
    assert_eq!(
        RxVerdict::Unsupported.counter(),
        Some("unsupported_dropped")
    );
}

#[test]
fn bad_pkey_moves_bad_pkey_dropped() {
    let (mut p, c, good) = setup();
    // Another partition, and the invalid P_Key (base 0 matches nothing, IBTA §10.9.1.1).
    for k in [0xabcd, 0x8000] {
        let f = edit(&good, |f| f.roce.bth.pkey = PKey(k));
        check(&mut p, c.qp_b, &f, RxVerdict::BadPkey, |s| {
            s.dev.bad_pkey_dropped += 1
        });
    }
    assert_eq!(RxVerdict::BadPkey.counter(), Some("bad_pkey_dropped"));
}

#[test]
fn unknown_qp_moves_unknown_qp_dropped() {
    let (mut p, c, good) = setup();
    let nobody = edit(&good, |f| f.roce.bth.dest_qp = Qpn::new(0x777));
    check(&mut p, c.qp_b, &nobody, RxVerdict::UnknownQp, |s| {
        s.dev.unknown_qp_dropped += 1
    });
    // A UD datagram for the RC QP: not that QP's (rxe `check_type_state`).
    let ud = edit(&good, |f| {
        f.roce.bth.opcode = Opcode::UD_SEND_ONLY;
        f.roce.ext = ExtHeaders {
            deth: Some(DethRepr {
                qkey: 0x8001_0000,
                src_qp: Qpn::new(1),
            }),
            ..Default::default()
        };
    });
    check(&mut p, c.qp_b, &ud, RxVerdict::UnknownQp, |s| {
        s.dev.unknown_qp_dropped += 1
    });
    assert_eq!(RxVerdict::UnknownQp.counter(), Some("unknown_qp_dropped"));
}

/// Packet source validation (IBTA §9.6): a frame from a third GID to a connected QP is
/// `unknown_qp_dropped` at the device, and the QP's own counters do not see it.
#[test]
fn wrong_peer_moves_unknown_qp_dropped_and_no_qp_counter() {
    let (mut p, c, good) = setup();
    let third = edit(&good, |f| match &mut f.ip {
        IpRepr::V4 { src, .. } => *src = [192, 0, 2, 3],
        other => panic!("{other:?}"),
    });
    check(&mut p, c.qp_b, &third, RxVerdict::WrongPeer, |s| {
        s.dev.unknown_qp_dropped += 1
    });
    assert_eq!(RxVerdict::WrongPeer.counter(), Some("unknown_qp_dropped"));
}

/// A second RC QP at B in INIT, on the pair's PD and CQ.
fn init_qp(p: &mut Pair, c: &RcPair, qp_type: QpType) -> Qpn {
    let qpn =
        p.b.create_qp(
            c.pd_b,
            &QpInitAttr {
                send_cq: c.cq_b,
                recv_cq: c.cq_b,
                max_send_wr: 16,
                max_recv_wr: 16,
                sq_sig_all: false,
                qp_type,
                srq: None,
            },
        )
        .unwrap();
    let a = QpAttr {
        qp_state: QpState::Init,
        qkey: 0x1234,
        ..QpAttr::default()
    };
    let mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
    let mask = match qp_type {
        QpType::Ud => mask | AttrMask::QKEY,
        _ => mask | AttrMask::ACCESS_FLAGS,
    };
    p.b.modify_qp(qpn, &a, mask).unwrap();
    qpn
}

#[test]
fn wrong_state_moves_dropped_wrong_state_after_packets_received() {
    let (mut p, c, good) = setup();
    let qpn = init_qp(&mut p, &c, QpType::Rc);
    let f = edit(&good, |f| f.roce.bth.dest_qp = qpn);
    check(&mut p, qpn, &f, RxVerdict::WrongState, |s| {
        received(s, f.len());
        s.qp.dropped_wrong_state += 1;
    });
    assert_eq!(
        RxVerdict::WrongState.counter(),
        Some("qp.dropped_wrong_state")
    );
}

#[test]
fn wrong_state_at_a_ud_qp_moves_its_wrong_state_dropped() {
    let (mut p, c, good) = setup();
    let qpn = init_qp(&mut p, &c, QpType::Ud);
    let f = edit(&good, |f| {
        f.roce.bth.dest_qp = qpn;
        f.roce.bth.opcode = Opcode::UD_SEND_ONLY;
        f.roce.ext = ExtHeaders {
            deth: Some(DethRepr {
                qkey: 0x1234,
                src_qp: Qpn::new(0x22),
            }),
            ..Default::default()
        };
    });
    check(&mut p, qpn, &f, RxVerdict::WrongState, |s| {
        received(s, f.len());
        s.ud.wrong_state_dropped += 1;
    });
}

#[test]
fn a_uc_opcode_at_an_rc_qp_is_wrong_service_and_an_invalid_request() {
    let (mut p, c, good) = setup();
    // SEND ONLY's UC twin (IBTA §9.2.1, table 38: opcode | 0x20).
    let f = edit(&good, |f| {
        f.roce.bth.opcode = Opcode(f.roce.bth.opcode.0 | 0x20);
        f.roce.bth.ack_req = false;
    });
    check(&mut p, c.qp_b, &f, RxVerdict::WrongService, |s| {
        received(s, f.len());
        s.qp.invalid_requests += 1;
    });
    assert_eq!(
        RxVerdict::WrongService.counter(),
        Some("qp.invalid_requests")
    );
}

/// A UD QP at B moved on to RTS with Q_Key 0x1234, and a datagram for it.
fn ud_rts(p: &mut Pair, c: &RcPair, good: &[u8], qkey: u32) -> (Qpn, Vec<u8>) {
    let qpn = init_qp(p, c, QpType::Ud);
    for st in [QpState::Rtr, QpState::Rts] {
        let a = QpAttr {
            qp_state: st,
            ..QpAttr::default()
        };
        let mask = match st {
            QpState::Rts => AttrMask::STATE | AttrMask::SQ_PSN,
            _ => AttrMask::STATE,
        };
        p.b.modify_qp(qpn, &a, mask).unwrap();
    }
    let f = edit(good, |f| {
        f.roce.bth.dest_qp = qpn;
        f.roce.bth.opcode = Opcode::UD_SEND_ONLY;
        f.roce.bth.ack_req = false;
        f.roce.ext = ExtHeaders {
            deth: Some(DethRepr {
                qkey,
                src_qp: Qpn::new(0x22),
            }),
            ..Default::default()
        };
    });
    (qpn, f)
}

#[test]
fn a_datagram_with_another_qkey_moves_bad_qkey_dropped() {
    let (mut p, c, good) = setup();
    let (qpn, f) = ud_rts(&mut p, &c, &good, 0x4321);
    check(&mut p, qpn, &f, RxVerdict::BadQkey, |s| {
        received(s, f.len());
        s.ud.bad_qkey_dropped += 1;
    });
    assert_eq!(RxVerdict::BadQkey.counter(), Some("ud.bad_qkey_dropped"));
}

#[test]
fn a_datagram_without_a_receive_moves_no_recv_wqe_dropped() {
    let (mut p, c, good) = setup();
    let (qpn, f) = ud_rts(&mut p, &c, &good, 0x1234);
    check(&mut p, qpn, &f, RxVerdict::NoRecvWqe, |s| {
        received(s, f.len());
        s.ud.no_recv_wqe_dropped += 1;
    });
    assert_eq!(
        RxVerdict::NoRecvWqe.counter(),
        Some("ud.no_recv_wqe_dropped")
    );
    // With a receive posted, the same datagram is taken.
    let m = p.b.reg_mr(c.pd_b, 4096, Access::LOCAL_WRITE).unwrap();
    p.b.post_recv(qpn, recv_wr(7, sge(&m, 0, 4096))).unwrap();
    check(&mut p, qpn, &f, RxVerdict::Taken, |s| {
        received(s, f.len());
        s.ud.datagrams_received += 1;
    });
}

/// The simulator tallies the verdicts its link delivered: on a corrupting link the frames
/// refused at each side are exactly the frame-level drops that side counted.
#[test]
fn the_simulator_tallies_each_sides_verdicts() {
    let link = LinkConfig {
        corrupt: 0.05,
        ..LinkConfig::default()
    };
    let (mut p, c) = pair(link, &ConnectOpts::default());
    let src = mr(&mut p, Side::A, &c, 1 << 16, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 1 << 16, Access::ALL);
    for i in 0..40 {
        let mut w = send_wr(i, WrOpcode::RdmaWrite, sge(&src, 0, 4096));
        w.rdma.remote_addr = dst.addr;
        w.rdma.rkey = dst.rkey;
        p.a.post_send(c.qp_a, w).unwrap();
    }
    let mut wcs = vec![];
    run_for_wcs(
        &mut p,
        Side::A,
        &c,
        40,
        Instant::from_nanos(10_000_000_000),
        &mut wcs,
    );
    p.run_until(p.now + Duration::from_nanos(100_000_000), |pr| {
        pr.link.in_flight() == 0
    });
    let mut refused = 0;
    for (s, t) in [(Side::A, p.verdicts[0]), (Side::B, p.verdicts[1])] {
        let d = p.dev(s).counters();
        assert_eq!(t.get(RxVerdict::BadIcrc), d.icrc_errors);
        assert_eq!(
            t.get(RxVerdict::Malformed) + t.get(RxVerdict::BadIcrc),
            d.malformed_frames_dropped
        );
        assert_eq!(
            t.get(RxVerdict::Taken),
            d.qp.packets_received,
            "{s:?}: a QP counted each frame taken"
        );
        refused += t.refused();
    }
    assert!(refused > 0, "5% corruption refused some frame");
    assert_eq!(
        p.verdicts[0].get(RxVerdict::Taken) + p.verdicts[1].get(RxVerdict::Taken) + refused,
        p.link.stats.frames_delivered
    );
}
