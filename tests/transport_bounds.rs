//! Every resource a peer can consume is bounded (issue 19, point 2): for each one, a test
//! pushes past the bound through `handle_frame` and checks the answer the spec asks for
//! (NAK, drop, error) and the counter that names it. The frames are the peer's own (side
//! A's requester builds them; the tests re-emit them with other PSNs, as a hostile or
//! buggy peer would send them) and side B's responder is the one under attack.

#[path = "transport_common/mod.rs"]
mod common;

use common::*;
use xrnic::proto::congestion::{Algorithm, CongestionControl, DcqcnParams};
use xrnic::proto::{
    Access, AtomicInfo, MAX_FRAME_LEN, MrInfo, QpState, RdmaInfo, SendWr, WrOpcode,
};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair, RcPair, Side};
use xrnic::wire::{FrameRepr, NakCode, Opcode, Psn, Qpn, Syndrome};

/// Responder resources of side B (max_dest_rd_atomic; A's max_rd_atomic is the same).
const RES: u8 = 4;

fn setup() -> (Pair, RcPair, MrInfo, MrInfo) {
    let opts = ConnectOpts {
        max_rd_atomic: RES,
        ..ConnectOpts::default()
    };
    let (mut p, c) = pair(LinkConfig::default(), &opts);
    let src = mr(&mut p, Side::A, &c, 4096, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 4096, Access::ALL);
    (p, c, src, dst)
}

/// Every frame `side` wants to send now.
fn drain(p: &mut Pair, side: Side) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    while let Some(n) = p.dev(side).poll_transmit(0, &mut buf) {
        out.push(buf[..n].to_vec());
    }
    out
}

/// The first frame A's requester sends for `wr`.
fn request(p: &mut Pair, c: &RcPair, wr: SendWr) -> Vec<u8> {
    p.a.post_send(c.qp_a, wr).unwrap();
    drain(p, Side::A).remove(0)
}

/// `f` re-emitted with PSN `psn` (lengths and ICRC recomputed).
fn with_psn(f: &[u8], psn: u32) -> Vec<u8> {
    let mut r = FrameRepr::parse(f).unwrap();
    r.roce.bth.psn = Psn::new(psn);
    let mut out = vec![0u8; r.buffer_len()];
    let n = r.emit(&mut out).unwrap();
    out.truncate(n);
    out
}

/// (opcode, PSN, AETH syndrome) of each frame.
fn infos(frames: &[Vec<u8>]) -> Vec<(Opcode, u32, Option<Syndrome>)> {
    frames
        .iter()
        .map(|f| {
            let r = FrameRepr::parse(f).unwrap();
            (
                r.roce.bth.opcode,
                r.roce.bth.psn.value(),
                r.roce.ext.aeth.map(|a| a.syndrome),
            )
        })
        .collect()
}

fn read_wr(local: &MrInfo, remote: &MrInfo) -> SendWr {
    let mut w = send_wr(1, WrOpcode::RdmaRead, sge(local, 0, 64));
    w.rdma = RdmaInfo {
        remote_addr: remote.addr,
        rkey: remote.rkey,
    };
    w
}

fn psn_a() -> u32 {
    ConnectOpts::default().psn_a.value()
}

/// The largest number of responses B may hold for one QP: the bound of its response
/// queue (`2 * max_dest_rd_atomic + 4`, src/proto/responder.rs `out_full`), plus the one
/// fatal NAK that is never dropped.
const OUT_CAP: usize = 2 * RES as usize + 4 + 1;

/// READ/atomic responder resources (IBTA vol. 1 §9.7.5.1, max_dest_rd_atomic): a peer
/// that has more READs or atomics outstanding than B's responder resources makes an
/// invalid request: NAK invalid request (class A, §9.9: B's QP goes to ERR), counted in
/// `invalid_requests`. The first RES are answered.
#[test]
fn reads_past_max_dest_rd_atomic_get_nak_invalid_request() {
    for atomic_last in [false, true] {
        let (mut p, c, src, dst) = setup();
        let read = request(&mut p, &c, read_wr(&src, &dst));
        let mut aw = send_wr(2, WrOpcode::AtomicFetchAndAdd, sge(&src, 8, 8));
        aw.atomic = AtomicInfo {
            remote_addr: dst.addr,
            rkey: dst.rkey,
            compare_add: 1,
            swap: 0,
        };
        // A has RES outstanding at most; the atomic is its second request.
        let atomic = request(&mut p, &c, aw);
        let p0 = psn_a();
        // Responses are not drained: all RES stay outstanding at B.
        for i in 0..u32::from(RES) {
            p.b.handle_frame(0, &with_psn(&read, (p0 + i) & 0xff_ffff));
        }
        let extra = (p0 + u32::from(RES)) & 0xff_ffff;
        let last = if atomic_last {
            with_psn(&atomic, extra)
        } else {
            with_psn(&read, extra)
        };
        p.b.handle_frame(0, &last);
        let got = infos(&drain(&mut p, Side::B));
        let responses = got
            .iter()
            .filter(|g| g.0 == Opcode::RC_READ_RESPONSE_ONLY)
            .count();
        assert_eq!(responses, usize::from(RES), "{got:x?}");
        assert_eq!(
            got.last().unwrap(),
            &(
                Opcode::RC_ACK,
                extra,
                Some(Syndrome::Nak(NakCode::InvalidRequest))
            ),
            "{got:x?}"
        );
        let k = p.b.qp_counters(c.qp_b).unwrap();
        assert_eq!(k.invalid_requests, 1);
        assert_eq!(k.atomics_executed, 0, "the refused atomic was not executed");
        assert_eq!(p.b.query_qp(c.qp_b).unwrap().qp_state, QpState::Err);
    }
}

/// A peer that waits for each READ's responses before the next stays within the
/// resources however many READs it sends (the bound counts responses not sent yet).
#[test]
fn reads_within_max_dest_rd_atomic_are_all_answered() {
    let (mut p, c, src, dst) = setup();
    let read = request(&mut p, &c, read_wr(&src, &dst));
    let p0 = psn_a();
    for i in 0..4 * u32::from(RES) {
        p.b.handle_frame(0, &with_psn(&read, (p0 + i) & 0xff_ffff));
        let got = infos(&drain(&mut p, Side::B));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, Opcode::RC_READ_RESPONSE_ONLY);
    }
    assert_eq!(p.b.qp_counters(c.qp_b).unwrap().invalid_requests, 0);
}

/// The duplicate-response cache (§9.7.5, responder resources) holds max_dest_rd_atomic
/// entries: a duplicate READ of an evicted one is dropped (class D), counted in
/// `duplicate_request` and not in `responses_replayed`; one still cached is replayed.
#[test]
fn response_cache_holds_max_dest_rd_atomic_entries() {
    let (mut p, c, src, dst) = setup();
    let read = request(&mut p, &c, read_wr(&src, &dst));
    let p0 = psn_a();
    let n = u32::from(RES) + 1;
    for i in 0..n {
        p.b.handle_frame(0, &with_psn(&read, (p0 + i) & 0xff_ffff));
        drain(&mut p, Side::B);
    }
    p.b.handle_frame(0, &with_psn(&read, p0));
    assert!(drain(&mut p, Side::B).is_empty(), "evicted: dropped");
    let newest = (p0 + n - 1) & 0xff_ffff;
    p.b.handle_frame(0, &with_psn(&read, newest));
    let got = infos(&drain(&mut p, Side::B));
    assert_eq!(got, vec![(Opcode::RC_READ_RESPONSE_ONLY, newest, got[0].2)]);
    let k = p.b.qp_counters(c.qp_b).unwrap();
    assert_eq!((k.duplicate_request, k.responses_replayed), (2, 1));
}

/// Duplicate atomics (§9.7.5: replay the saved result, never execute again): a flood of
/// them before B sends anything queues at most the response queue's bound; the atomic
/// ran once; every duplicate is counted.
#[test]
fn duplicate_atomic_flood_is_bounded() {
    let (mut p, c, src, dst) = setup();
    let mut w = send_wr(2, WrOpcode::AtomicFetchAndAdd, sge(&src, 8, 8));
    w.atomic = AtomicInfo {
        remote_addr: dst.addr,
        rkey: dst.rkey,
        compare_add: 1,
        swap: 0,
    };
    let f = request(&mut p, &c, w);
    for _ in 0..1000 {
        p.b.handle_frame(0, &f);
    }
    let got = drain(&mut p, Side::B);
    assert!(got.len() <= OUT_CAP, "{} responses queued", got.len());
    assert!(got.len() > 1, "duplicates are still answered");
    let k = p.b.qp_counters(c.qp_b).unwrap();
    assert_eq!(k.atomics_executed, 1);
    assert_eq!(k.duplicate_request, 999);
    assert_eq!(p.b.mr_bytes(dst.lkey).unwrap()[..8], 1u64.to_ne_bytes());
}

/// RNR state (§9.7.5.2.8): a SEND with no receive WQE gets an RNR NAK; the same SEND
/// again and again before B sends anything queues one RNR NAK, not one per copy; each is
/// counted in `out_of_buffer`.
#[test]
fn rnr_flood_queues_one_rnr_nak() {
    let (mut p, c, src, _dst) = setup();
    let f = request(&mut p, &c, send_wr(3, WrOpcode::Send, sge(&src, 0, 16)));
    for _ in 0..1000 {
        p.b.handle_frame(0, &f);
    }
    let got = infos(&drain(&mut p, Side::B));
    assert_eq!(got.len(), 1, "{got:x?}");
    assert!(matches!(got[0].2, Some(Syndrome::RnrNak { .. })));
    assert_eq!(p.b.qp_counters(c.qp_b).unwrap().out_of_buffer, 1000);
}

/// Pending NAK state (§9.7.5.1.1, one NAK per sequence error): requests far ahead of the
/// expected PSN get one PSN sequence error NAK; each is counted in `out_of_sequence`.
#[test]
fn out_of_sequence_flood_gets_one_nak() {
    let (mut p, c, src, _dst) = setup();
    let f = request(&mut p, &c, send_wr(3, WrOpcode::Send, sge(&src, 0, 16)));
    for i in 0..1000u32 {
        p.b.handle_frame(0, &with_psn(&f, (psn_a() + 10 + i * 97) & 0xff_ffff));
    }
    let got = infos(&drain(&mut p, Side::B));
    assert_eq!(
        got,
        vec![(
            Opcode::RC_ACK,
            psn_a(),
            Some(Syndrome::Nak(NakCode::PsnSequenceError))
        )]
    );
    assert_eq!(p.b.qp_counters(c.qp_b).unwrap().out_of_sequence, 1000);
}

/// The response queue as a whole: duplicate SENDs (each answered with an ACK) alternating
/// with a new SEND that finds no receive WQE (RNR NAK) defeat ACK coalescing; still B
/// queues at most the bound. The requests are counted (`duplicate_request`,
/// `out_of_buffer`).
#[test]
fn duplicates_and_rnr_alternating_cannot_grow_the_response_queue() {
    let (mut p, c, src, dst) = setup();
    p.b.post_recv(c.qp_b, recv_wr(9, sge(&dst, 0, 64))).unwrap();
    let f = request(&mut p, &c, send_wr(3, WrOpcode::Send, sge(&src, 0, 16)));
    p.b.handle_frame(0, &f);
    drain(&mut p, Side::B);
    let next = with_psn(&f, (psn_a() + 1) & 0xff_ffff);
    for _ in 0..500 {
        p.b.handle_frame(0, &f);
        p.b.handle_frame(0, &next);
    }
    let got = drain(&mut p, Side::B);
    assert!(got.len() <= OUT_CAP, "{} responses queued", got.len());
    let k = p.b.qp_counters(c.qp_b).unwrap();
    assert_eq!((k.duplicate_request, k.out_of_buffer), (500, 500));
}

/// Receive queues: the peer consumes receive WQEs, it cannot add any; the application's
/// are capped at max_recv_wr (ibv_post_recv ENOMEM), and SENDs past them get RNR NAKs.
#[test]
fn receive_queue_is_capped_and_sends_past_it_get_rnr() {
    let opts = ConnectOpts {
        max_wr: 4,
        ..ConnectOpts::default()
    };
    let (mut p, c) = pair(LinkConfig::default(), &opts);
    let src = mr(&mut p, Side::A, &c, 4096, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 4096, Access::ALL);
    for i in 0..4 {
        p.b.post_recv(c.qp_b, recv_wr(i, sge(&dst, 0, 64))).unwrap();
    }
    assert!(p.b.post_recv(c.qp_b, recv_wr(5, sge(&dst, 0, 64))).is_err());
    let f = request(&mut p, &c, send_wr(3, WrOpcode::Send, sge(&src, 0, 16)));
    for i in 0..5u32 {
        p.b.handle_frame(0, &with_psn(&f, (psn_a() + i) & 0xff_ffff));
    }
    let k = p.b.qp_counters(c.qp_b).unwrap();
    assert_eq!(k.out_of_buffer, 1, "the fifth SEND finds no WQE");
    assert_eq!(p.b.resources().qps[0].rq_wrs, 0);
}

/// CNP state per flow (RoCE v2 annex A17.9): the notification point keeps one timestamp
/// per local QP (a CE-marked flood to one QP sends one CNP per interval,
/// `np_cnp_sent`), and CNPs naming QPs that do not exist create no state
/// (`rp_cnp_ignored`).
#[test]
fn cnp_state_is_per_local_qp_only() {
    let (mut p, c, src, dst) = setup();
    let line = 10_000_000_000;
    let mut cc = CongestionControl::new(Algorithm::Dcqcn(DcqcnParams::connectx()), line, 16384);
    cc.add_qp(0, c.qp_b);
    p.b.enable_congestion_control(cc);
    p.b.post_recv(c.qp_b, recv_wr(9, sge(&dst, 0, 64))).unwrap();
    let f = request(&mut p, &c, send_wr(3, WrOpcode::Send, sge(&src, 0, 16)));
    // The same SEND, CE-marked, over and over (the first executes, the rest duplicates).
    let mut r = FrameRepr::parse(&f).unwrap();
    if let xrnic::wire::IpRepr::V4 { tos, .. } = &mut r.ip {
        *tos |= 3;
    }
    let mut ce = vec![0u8; r.buffer_len()];
    let n = r.emit(&mut ce).unwrap();
    ce.truncate(n);
    for _ in 0..1000 {
        p.b.handle_frame(0, &ce);
    }
    let got = infos(&drain(&mut p, Side::B));
    let cnps = got.iter().filter(|g| g.0 == Opcode::CNP).count();
    assert_eq!(cnps, 1, "{got:x?}");
    let k = p.b.counters();
    assert_eq!((k.np_ecn_marked_roce_packets, k.np_cnp_sent), (1000, 1));

    // CNPs for 1000 QPNs that are not ours: no new state, each counted as ignored.
    let before = p.b.congestion().unwrap().qp_statuses().len();
    let cnp = drain_cnp_template(&mut p, &c);
    for q in 0..1000u32 {
        let mut r = FrameRepr::parse(&cnp).unwrap();
        r.roce.bth.dest_qp = Qpn::new(0x1000 + q);
        let mut out = vec![0u8; r.buffer_len()];
        let n = r.emit(&mut out).unwrap();
        p.b.handle_frame(0, &out[..n]);
    }
    assert_eq!(p.b.congestion().unwrap().qp_statuses().len(), before);
    assert_eq!(p.b.counters().rp_cnp_ignored, 1000);
}

/// A CNP addressed to B (built by A's notification point for a CE-marked frame).
fn drain_cnp_template(p: &mut Pair, c: &RcPair) -> Vec<u8> {
    let line = 10_000_000_000;
    let mut cc = CongestionControl::new(Algorithm::Dcqcn(DcqcnParams::connectx()), line, 16384);
    cc.add_qp(0, c.qp_a);
    p.a.enable_congestion_control(cc);
    // An ACK from B to A, CE-marked, makes A's NP send a CNP to B.
    let mut w = send_wr(4, WrOpcode::RdmaWrite, vec![]);
    w.rdma.rkey = xrnic::wire::Rkey(0);
    p.a.post_send(c.qp_a, w).unwrap();
    let req = drain(p, Side::A);
    for f in &req {
        p.b.handle_frame(0, f);
    }
    let acks = drain(p, Side::B);
    for a in &acks {
        let mut r = FrameRepr::parse(a).unwrap();
        if let xrnic::wire::IpRepr::V4 { tos, .. } = &mut r.ip {
            *tos |= 3;
        }
        let mut out = vec![0u8; r.buffer_len()];
        let n = r.emit(&mut out).unwrap();
        p.a.handle_frame(0, &out[..n]);
    }
    drain(p, Side::A)
        .into_iter()
        .find(|f| FrameRepr::parse(f).unwrap().roce.bth.opcode == Opcode::CNP)
        .expect("A's NP sent a CNP")
}
