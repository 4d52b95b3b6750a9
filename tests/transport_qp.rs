//! The QP state machine through the engine (every transition from every reachable state),
//! flushing in ERR, SQD, address vectors on the wire (IPv4 and IPv6), idle QP memory,
//! credits, and counters.

use std::time::Duration;
use xrnic::proto::Instant;
#[path = "transport_common/mod.rs"]
mod common;

use common::*;
use xrnic::proto::{
    Access, AddressVector, AttrMask, Config, Mtu, QpAttr, QpInitAttr, QpState, Rnic, VerbsError,
    WcStatus, WrOpcode, ipv4_gid, qp::transition_rule,
};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair, Side, side_config};
use xrnic::wire::{FrameRepr, IpRepr, Opcode, Psn, Qpn, Syndrome};

const REACHABLE: [QpState; 6] = [
    QpState::Reset,
    QpState::Init,
    QpState::Rtr,
    QpState::Rts,
    QpState::Sqd,
    QpState::Err,
];

fn full_attr(to: QpState) -> QpAttr {
    QpAttr {
        qp_state: to,
        cur_qp_state: QpState::Reset,
        path_mtu: Mtu::Mtu1024,
        qp_access_flags: Access::ALL,
        pkey_index: 0,
        port_num: 1,
        ah_attr: AddressVector {
            dmac: [2, 0, 0, 0, 0, 2],
            dgid: ipv4_gid([192, 0, 2, 2]),
            ..AddressVector::default()
        },
        dest_qp_num: Qpn::new(0x22),
        rq_psn: Psn::new(5),
        sq_psn: Psn::new(9),
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        sq_draining: false,
        qkey: 0,
    }
}

fn new_qp() -> (Rnic, Qpn, xrnic::proto::Cq) {
    let mut d = Rnic::new(Config::default());
    let pd = d.alloc_pd();
    let cq = d.create_cq(64);
    let init = QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        max_send_wr: 16,
        max_recv_wr: 16,
        sq_sig_all: false,
        qp_type: xrnic::proto::QpType::Rc,
        srq: None,
    };
    let q = d.create_qp(pd, &init).unwrap();
    (d, q, cq)
}

fn modify(d: &mut Rnic, q: Qpn, to: QpState, mask: AttrMask) -> Result<(), VerbsError> {
    let mut a = full_attr(to);
    a.cur_qp_state = d.query_qp(q)?.qp_state;
    d.modify_qp(q, &a, mask | AttrMask::STATE)
}

fn required(from: QpState, to: QpState) -> AttrMask {
    transition_rule(from, to).unwrap().0
}

fn bring_to(d: &mut Rnic, q: Qpn, s: QpState) {
    use QpState::*;
    let path: &[QpState] = match s {
        Reset => &[],
        Init => &[Init],
        Rtr => &[Init, Rtr],
        Rts => &[Init, Rtr, Rts],
        Sqd => &[Init, Rtr, Rts, Sqd],
        Err => &[Err],
        Sqe => unreachable!(),
    };
    let mut cur = Reset;
    for &n in path {
        modify(d, q, n, required(cur, n)).unwrap();
        cur = n;
    }
    assert_eq!(d.query_qp(q).unwrap().qp_state, s);
}

#[test]
fn every_transition_from_every_reachable_state() {
    for from in REACHABLE {
        for to in QpState::ALL {
            let (mut d, q, _) = new_qp();
            bring_to(&mut d, q, from);
            match transition_rule(from, to) {
                None => {
                    assert_eq!(
                        modify(&mut d, q, to, AttrMask::default()),
                        Err(VerbsError::InvalidTransition { from, to }),
                        "{from:?}->{to:?}"
                    );
                    assert_eq!(d.query_qp(q).unwrap().qp_state, from, "unchanged");
                }
                Some((req, opt)) => {
                    // Each required attribute left out is refused, and nothing changes.
                    for bit in 0..21 {
                        let b = AttrMask(1 << bit);
                        if req.contains(b) {
                            let e = modify(&mut d, q, to, AttrMask(req.0 & !b.0));
                            assert_eq!(
                                e,
                                Err(VerbsError::MissingAttributes(b)),
                                "{from:?}->{to:?}"
                            );
                            assert_eq!(d.query_qp(q).unwrap().qp_state, from);
                        }
                    }
                    // An attribute the transition does not take is refused.
                    let stray = [AttrMask::SQ_PSN, AttrMask::DEST_QPN, AttrMask::QKEY]
                        .into_iter()
                        .find(|m| !req.contains(*m) && !opt.contains(*m))
                        .unwrap();
                    assert_eq!(
                        modify(&mut d, q, to, req | stray),
                        Err(VerbsError::UnexpectedAttributes(stray)),
                        "{from:?}->{to:?}"
                    );
                    modify(&mut d, q, to, req | opt)
                        .unwrap_or_else(|e| panic!("{from:?}->{to:?}: {e}"));
                    assert_eq!(d.query_qp(q).unwrap().qp_state, to, "{from:?}->{to:?}");
                }
            }
        }
    }
}

#[test]
fn sqe_is_never_entered_by_an_rc_qp() {
    // RC send-queue errors go straight to ERR (IBTA §10.3.1); no modify reaches SQE.
    for from in REACHABLE {
        let (mut d, q, _) = new_qp();
        bring_to(&mut d, q, from);
        assert!(matches!(
            modify(&mut d, q, QpState::Sqe, AttrMask::default()),
            Err(VerbsError::InvalidTransition { .. })
        ));
    }
}

#[test]
fn attributes_are_applied_and_queried() {
    let (mut d, q, _) = new_qp();
    bring_to(&mut d, q, QpState::Rts);
    let a = d.query_qp(q).unwrap();
    let f = full_attr(QpState::Rts);
    assert_eq!(a.dest_qp_num, f.dest_qp_num);
    assert_eq!(a.rq_psn, f.rq_psn);
    assert_eq!(a.sq_psn, f.sq_psn);
    assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (14, 7, 7));
    assert_eq!(
        (a.max_rd_atomic, a.max_dest_rd_atomic, a.min_rnr_timer),
        (4, 4, 12)
    );
    assert_eq!(a.ah_attr, f.ah_attr);
    let mut bad = full_attr(QpState::Rts);
    bad.min_rnr_timer = 32;
    assert!(matches!(
        d.modify_qp(q, &bad, AttrMask::MIN_RNR_TIMER),
        Err(VerbsError::InvalidValue(_))
    ));
    bad.min_rnr_timer = 3;
    d.modify_qp(q, &bad, AttrMask::MIN_RNR_TIMER).unwrap();
    assert_eq!(d.query_qp(q).unwrap().min_rnr_timer, 3);
    // Back to RESET wipes the PSNs.
    modify(&mut d, q, QpState::Reset, AttrMask::default()).unwrap();
    assert_eq!(d.query_qp(q).unwrap().sq_psn, Psn::new(0));
}

#[test]
fn err_flushes_posted_work_in_order_and_later_posts_too() {
    let (mut d, q, cq) = new_qp();
    let pd = d.alloc_pd();
    let _ = pd;
    assert!(matches!(
        d.post_recv(q, recv_wr(1, vec![])),
        Err(VerbsError::WrongState(QpState::Reset))
    ));
    bring_to(&mut d, q, QpState::Init);
    d.post_recv(q, recv_wr(10, vec![])).unwrap();
    assert!(matches!(
        d.post_send(q, send_wr(1, WrOpcode::Send, vec![])),
        Err(VerbsError::WrongState(QpState::Init))
    ));
    modify(
        &mut d,
        q,
        QpState::Rtr,
        required(QpState::Init, QpState::Rtr),
    )
    .unwrap();
    modify(
        &mut d,
        q,
        QpState::Rts,
        required(QpState::Rtr, QpState::Rts),
    )
    .unwrap();
    d.post_recv(q, recv_wr(11, vec![])).unwrap();
    for id in 1..=3 {
        d.post_send(q, send_wr(id, WrOpcode::Send, vec![])).unwrap();
    }
    // One packet goes out (and stays unacknowledged); the rest wait.
    let mut buf = vec![0u8; xrnic::proto::MAX_FRAME_LEN];
    assert!(d.poll_transmit(Instant::ZERO, &mut buf).is_some());
    modify(&mut d, q, QpState::Err, AttrMask::default()).unwrap();
    d.post_send(q, send_wr(4, WrOpcode::RdmaRead, vec![]))
        .unwrap();
    d.post_recv(q, recv_wr(12, vec![])).unwrap();
    let mut wcs = vec![];
    d.poll_cq(cq, 100, &mut wcs);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    let f = WcStatus::WrFlushErr;
    assert_eq!(
        got,
        [(1, f), (2, f), (3, f), (10, f), (11, f), (4, f), (12, f)]
    );
    assert!(
        d.poll_transmit(Instant::from_nanos(1), &mut buf).is_none(),
        "ERR sends nothing"
    );
    assert_eq!(d.poll_timeout(), None, "and runs no timer");
}

#[test]
fn sqd_stops_new_work_and_rts_resumes_it() {
    let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
    let src = mr(&mut p, Side::A, &c, 4096, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 4096, Access::ALL);
    let mut w = send_wr(1, WrOpcode::RdmaWrite, sge(&src, 0, 4096));
    w.rdma.remote_addr = dst.addr;
    w.rdma.rkey = dst.rkey;
    p.a.post_send(c.qp_a, w.clone()).unwrap();
    // Send the first packet, then drain.
    p.step();
    assert!(p.a.qp_counters(c.qp_a).unwrap().packets_sent >= 1);
    let mut attr = QpAttr {
        qp_state: QpState::Sqd,
        ..QpAttr::default()
    };
    p.a.modify_qp(c.qp_a, &attr, AttrMask::STATE).unwrap();
    assert!(p.a.query_qp(c.qp_a).unwrap().sq_draining);
    w.wr_id = 2;
    p.a.post_send(c.qp_a, w).unwrap();
    let mut wcs = vec![];
    run_for_wcs(
        &mut p,
        Side::A,
        &c,
        1,
        Instant::from_nanos(1_000_000_000),
        &mut wcs,
    );
    p.run_until(p.now + Duration::from_nanos(10_000_000), |_| false);
    assert_eq!(wcs.len(), 1, "the started WR finishes, the new one waits");
    let q = p.a.query_qp(c.qp_a).unwrap();
    assert_eq!((q.qp_state, q.sq_draining), (QpState::Sqd, false));
    attr.qp_state = QpState::Rts;
    p.a.modify_qp(c.qp_a, &attr, AttrMask::STATE).unwrap();
    let limit = p.now + Duration::from_nanos(1_000_000_000);
    run_for_wcs(&mut p, Side::A, &c, 2, limit, &mut wcs);
    assert_eq!(wcs[1].wr_id, 2);
    assert_eq!(wcs[1].status, WcStatus::Success);
}

/// The frame header is built once per QP and kept (a template patched per packet); a
/// `modify_qp` that changes the address vector must show in the very next frame.
#[test]
fn a_new_address_vector_shows_in_the_next_frame() {
    let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
    p.capture = Some(Vec::new());
    let src = mr(&mut p, Side::A, &c, 4096, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 4096, Access::ALL);
    let mut w = send_wr(1, WrOpcode::RdmaWrite, sge(&src, 0, 100));
    w.rdma.remote_addr = dst.addr;
    w.rdma.rkey = dst.rkey;
    p.a.post_send(c.qp_a, w.clone()).unwrap();
    let mut wcs = vec![];
    run_for_wcs(
        &mut p,
        Side::A,
        &c,
        1,
        Instant::from_nanos(1_000_000_000),
        &mut wcs,
    );
    // SQD -> SQD may change the address vector (IBTA §10.3 / ibv_modify_qp).
    let mut attr = p.a.query_qp(c.qp_a).unwrap();
    attr.qp_state = QpState::Sqd;
    p.a.modify_qp(c.qp_a, &attr, AttrMask::STATE).unwrap();
    attr.ah_attr.traffic_class = 0x28;
    attr.ah_attr.hop_limit = 9;
    attr.ah_attr.vlan_tci = Some(0x2007);
    p.a.modify_qp(c.qp_a, &attr, AttrMask::AV).unwrap();
    attr.qp_state = QpState::Rts;
    p.a.modify_qp(c.qp_a, &attr, AttrMask::STATE).unwrap();
    w.wr_id = 2;
    p.a.post_send(c.qp_a, w).unwrap();
    p.run_until(p.now + Duration::from_nanos(1_000_000), |_| false);
    let sent: Vec<_> = p
        .capture
        .take()
        .unwrap()
        .into_iter()
        .filter(|(_, s, _)| *s == Side::A)
        .map(|(_, _, b)| {
            let f = FrameRepr::parse(&b).expect("valid frame with ICRC");
            let IpRepr::V4 { tos, ttl, .. } = f.ip else {
                panic!("IPv4 expected")
            };
            (f.roce.bth.opcode, tos, ttl, f.eth.vlan_tci)
        })
        .collect();
    assert_eq!(
        sent,
        [
            (Opcode::RC_WRITE_ONLY, 0, 64, None),
            (Opcode::RC_WRITE_ONLY, 0x28, 9, Some(0x2007)),
        ]
    );
}

#[test]
fn ipv4_and_ipv6_frames_carry_the_address_vector() {
    for ipv6 in [false, true] {
        let opts = ConnectOpts {
            ipv6,
            traffic_class: 0x02, // ECT(0), for DCQCN later
            mtu: Mtu::Mtu512,
            ..ConnectOpts::default()
        };
        let (mut p, c) = pair(LinkConfig::default(), &opts);
        p.capture = Some(Vec::new());
        let src = mr(&mut p, Side::A, &c, 2000, Access::LOCAL_WRITE);
        for (i, b) in p.a.mr_bytes_mut(src.lkey).unwrap().iter_mut().enumerate() {
            *b = i as u8;
        }
        let dst = mr(&mut p, Side::B, &c, 2000, Access::ALL);
        p.b.post_recv(c.qp_b, recv_wr(1, sge(&dst, 0, 2000)))
            .unwrap();
        p.a.post_send(c.qp_a, send_wr(1, WrOpcode::Send, sge(&src, 0, 1999)))
            .unwrap();
        let mut wcs = vec![];
        run_for_wcs(
            &mut p,
            Side::A,
            &c,
            1,
            Instant::from_nanos(1_000_000_000),
            &mut wcs,
        );
        assert_eq!(wcs[0].status, WcStatus::Success);
        assert_eq!(
            p.b.mr_bytes(dst.lkey).unwrap()[..1999],
            p.a.mr_bytes(src.lkey).unwrap()[..1999]
        );
        let cap = p.capture.take().unwrap();
        let (a_cfg, b_cfg) = (side_config(Side::A), side_config(Side::B));
        let mut opcodes = vec![];
        for (_, side, bytes) in &cap {
            let f = FrameRepr::parse(bytes).expect("valid frame with ICRC");
            let (me, peer, qpn, peer_qpn) = match side {
                Side::A => (&a_cfg, &b_cfg, c.qp_a, c.qp_b),
                Side::B => (&b_cfg, &a_cfg, c.qp_b, c.qp_a),
            };
            assert_eq!(f.eth.src, me.mac);
            assert_eq!(f.eth.dst, peer.mac);
            assert_eq!(f.udp.checksum, 0, "UDP checksum 0 like rxe");
            assert!(f.udp.src_port >= 0xc000);
            assert_eq!(f.udp.src_port, xrnic::proto::qp::udp_src_port(qpn));
            assert_eq!(f.roce.bth.dest_qp, peer_qpn);
            match f.ip {
                IpRepr::V4 {
                    src,
                    dst,
                    tos,
                    dont_fragment,
                    ttl,
                    ..
                } => {
                    assert!(!ipv6);
                    assert_eq!(ipv4_gid(src), me.gids[0]);
                    assert_eq!(ipv4_gid(dst), peer.gids[0]);
                    assert!(dont_fragment);
                    assert_eq!((ttl, tos), (64, 2));
                }
                IpRepr::V6 {
                    src,
                    dst,
                    traffic_class,
                    hop_limit,
                    ..
                } => {
                    assert!(ipv6);
                    assert_eq!((src, dst), (me.gids[1], peer.gids[1]));
                    assert_eq!((hop_limit, traffic_class), (64, 2));
                }
            }
            if *side == Side::A {
                opcodes.push((f.roce.bth.opcode, f.roce.payload.len(), f.roce.bth.ack_req));
            }
        }
        assert_eq!(
            opcodes,
            [
                (Opcode::RC_SEND_FIRST, 512, false),
                (Opcode::RC_SEND_MIDDLE, 512, false),
                (Opcode::RC_SEND_MIDDLE, 512, false),
                (Opcode::RC_SEND_LAST, 463, true)
            ]
        );
    }
}

#[test]
fn idle_qp_memory_is_small() {
    let (mut d, q, _) = new_qp();
    bring_to(&mut d, q, QpState::Rts);
    let bytes = d.qp_memory_bytes(q).unwrap();
    eprintln!("memory per idle RC QP: {bytes} bytes");
    assert!(bytes <= 16 * 1024, "{bytes} bytes");
}

#[test]
fn credits_are_advertised_and_honoured_when_configured() {
    let mut sent = vec![];
    for honour in [false, true] {
        let mut a = side_config(Side::A);
        let mut b = side_config(Side::B);
        a.honour_credits = honour;
        b.advertise_credits = true;
        let mut p = Pair::with_configs(a, b, LinkConfig::default(), 1);
        let c = p
            .connect(&ConnectOpts {
                min_rnr_timer: 10,
                ..ConnectOpts::default()
            })
            .unwrap();
        p.capture = Some(Vec::new());
        let src = mr(&mut p, Side::A, &c, 64, Access::LOCAL_WRITE);
        let dst = mr(&mut p, Side::B, &c, 64, Access::ALL);
        for i in 0..4 {
            p.b.post_recv(c.qp_b, recv_wr(i, sge(&dst, 0, 64))).unwrap();
        }
        p.a.post_send(c.qp_a, send_wr(0, WrOpcode::Send, sge(&src, 0, 8)))
            .unwrap();
        let mut wcs = vec![];
        run_for_wcs(
            &mut p,
            Side::A,
            &c,
            1,
            Instant::from_nanos(1_000_000_000),
            &mut wcs,
        );
        // Three receives left: credit code 3 means three credits (IBTA table 46).
        let acks = frames(&p, Side::B, Opcode::RC_ACK);
        assert_eq!(acks[0].1, Some(Syndrome::Ack { credit_code: 3 }));
        for i in 1..=8 {
            p.a.post_send(c.qp_a, send_wr(i, WrOpcode::Send, sge(&src, 0, 8)))
                .unwrap();
        }
        // Within one RNR period, count the SENDs that went out.
        let t = p.now;
        p.run_until(t + Duration::from_nanos(200_000), |_| false);
        sent.push(
            frames(&p, Side::A, Opcode::RC_SEND_ONLY)
                .iter()
                .filter(|f| f.0 >= t.as_nanos())
                .count(),
        );
    }
    // Ignoring credits, all eight go at once (five are then refused); honouring them,
    // three go, then one probe at a time.
    assert_eq!(sent[0], 8, "{sent:?}");
    assert!(sent[1] < sent[0], "{sent:?}");
}

#[test]
fn qps_of_one_device_take_turns_on_the_wire() {
    let mut p = Pair::new(LinkConfig::default(), 1);
    p.capture = Some(Vec::new());
    let c1 = p.connect(&ConnectOpts::default()).unwrap();
    let c2 = p.connect(&ConnectOpts::default()).unwrap();
    for c in [&c1, &c2] {
        let src = mr(&mut p, Side::A, c, 65536, Access::LOCAL_WRITE);
        let dst = mr(&mut p, Side::B, c, 65536, Access::ALL);
        let mut w = send_wr(1, WrOpcode::RdmaWrite, sge(&src, 0, 65536));
        w.rdma.remote_addr = dst.addr;
        w.rdma.rkey = dst.rkey;
        p.a.post_send(c.qp_a, w).unwrap();
    }
    let mut w1 = vec![];
    let mut w2 = vec![];
    p.run_until(Instant::from_nanos(1_000_000_000), |pr| {
        pr.a.poll_cq(c1.cq_a, 8, &mut w1);
        pr.a.poll_cq(c2.cq_a, 8, &mut w2);
        !w1.is_empty() && !w2.is_empty()
    });
    assert_eq!(
        (w1[0].status, w2[0].status),
        (WcStatus::Success, WcStatus::Success)
    );
    let dests: Vec<_> = p
        .capture
        .as_ref()
        .unwrap()
        .iter()
        .filter(|f| f.1 == Side::A)
        .map(|f| FrameRepr::parse(&f.2).unwrap().roce.bth.dest_qp)
        .take(40)
        .collect();
    // Both QPs have 64 packets to send; they alternate instead of one draining first.
    for pair in dests.chunks(2) {
        assert_ne!(pair[0], pair[1], "{dests:?}");
    }
}
