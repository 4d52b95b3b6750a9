//! Every resource a peer can consume is bounded (docs/security.md): for each one, a test
//! pushes past the bound through `handle_frame` and checks the answer the spec asks for
//! (NAK, drop, error) and the counter that names it. The frames are the peer's own (side
//! A's requester builds them; the tests re-emit them with other PSNs, as a hostile or
//! buggy peer would send them) and side B's responder is the one under attack.

use xrnic::proto::{Instant, RxVerdict};
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
    setup_res(RES)
}

/// Every frame `side` wants to send now.
fn drain(p: &mut Pair, side: Side) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    while let Some(n) = p.dev(side).poll_transmit(Instant::ZERO, &mut buf) {
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

/// The largest number of responses B may hold for one QP while at most
/// max_dest_rd_atomic READ/atomic responses are queued: the bound of its response queue
/// (`2 * max_dest_rd_atomic + 4`, src/proto/responder.rs `out_cap`), plus the one fatal
/// NAK that is never dropped.
const OUT_CAP: usize = 2 * RES as usize + 4 + 1;

/// The hard cap on READ/atomic responses not sent yet (src/proto/responder.rs
/// `RD_ATOMIC_HARD_CAP`): `ibv_qp_attr.max_rd_atomic` is a u8, no requester keeps more.
const HARD_CAP: u32 = u8::MAX as u32;

fn setup_res(res: u8) -> (Pair, RcPair, MrInfo, MrInfo) {
    let opts = ConnectOpts {
        max_rd_atomic: res,
        ..ConnectOpts::default()
    };
    let (mut p, c) = pair(LinkConfig::default(), &opts);
    let src = mr(&mut p, Side::A, &c, 4096, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 4096, Access::ALL);
    (p, c, src, dst)
}

fn fetch_add_wr(local: &MrInfo, remote: &MrInfo) -> SendWr {
    let mut aw = send_wr(2, WrOpcode::AtomicFetchAndAdd, sge(local, 8, 8));
    aw.atomic = AtomicInfo {
        remote_addr: remote.addr,
        rkey: remote.rkey,
        compare_add: 1,
        swap: 0,
    };
    aw
}

/// READ/atomic responder resources (IBTA vol. 1 §9.7.5.1, max_dest_rd_atomic): a peer
/// with more READs/atomics outstanding than B's responder resources is served anyway,
/// as Linux rxe serves it (`check_resource`: "it is the requesters job to not send too
/// many read/atomic ops, we just recycle the responder resource queue"); a perftest
/// requester on rxe (max_qp_rd_atom 128) may do it against xrnic's 16. Each READ/atomic
/// past the bound is counted in `rd_atomic_over_limit`; no NAK, B's QP stays in RTS;
/// the atomic runs once. The oldest resources were recycled (rxe `rxe_prepare_res`): a
/// duplicate of the first READ is dropped, one of the newest is replayed.
#[test]
fn reads_past_max_dest_rd_atomic_are_served_like_rxe() {
    for (res, outstanding, atomic_last) in [
        (RES, RES + 1, false),
        (RES, 3 * RES, true),
        (16, 128, false),
    ] {
        let (mut p, c, src, dst) = setup_res(res);
        let read = request(&mut p, &c, read_wr(&src, &dst));
        let atomic = request(&mut p, &c, fetch_add_wr(&src, &dst));
        let p0 = psn_a();
        let n = u32::from(outstanding);
        // Responses are not drained: all stay outstanding at B.
        for i in 0..n {
            let psn = (p0 + i) & 0xff_ffff;
            let f = if atomic_last && i + 1 == n {
                with_psn(&atomic, psn)
            } else {
                with_psn(&read, psn)
            };
            assert_eq!(p.b.handle_frame(Instant::ZERO, &f), RxVerdict::Taken);
        }
        let got = infos(&drain(&mut p, Side::B));
        let reads = got
            .iter()
            .filter(|g| g.0 == Opcode::RC_READ_RESPONSE_ONLY)
            .count();
        let atomics = got.iter().filter(|g| g.0 == Opcode::RC_ATOMIC_ACK).count();
        assert_eq!(reads + atomics, n as usize, "{got:x?}");
        assert_eq!(atomics, usize::from(atomic_last));
        assert!(
            got.iter().all(|g| !matches!(g.2, Some(Syndrome::Nak(_)))),
            "{got:x?}"
        );
        let k = p.b.qp_counters(c.qp_b).unwrap();
        assert_eq!(k.rd_atomic_over_limit, u64::from(outstanding - res));
        assert_eq!(k.invalid_requests, 0);
        assert_eq!(k.atomics_executed, u64::from(atomic_last));
        assert_eq!(p.b.query_qp(c.qp_b).unwrap().qp_state, QpState::Rts);

        // The first READ's replay state was recycled: its duplicate is dropped (class D).
        assert_eq!(
            p.b.handle_frame(Instant::ZERO, &with_psn(&read, p0)),
            RxVerdict::Taken
        );
        assert!(drain(&mut p, Side::B).is_empty(), "recycled: dropped");
        // The newest READ's is kept: replayed.
        let newest = (p0 + n - 1 - u32::from(atomic_last)) & 0xff_ffff;
        assert_eq!(
            p.b.handle_frame(Instant::ZERO, &with_psn(&read, newest)),
            RxVerdict::Taken
        );
        let got = infos(&drain(&mut p, Side::B));
        assert_eq!(got.len(), 1, "{got:x?}");
        assert_eq!(
            (got[0].0, got[0].1),
            (Opcode::RC_READ_RESPONSE_ONLY, newest)
        );
        let k = p.b.qp_counters(c.qp_b).unwrap();
        assert_eq!((k.duplicate_request, k.responses_replayed), (2, 1));
    }
}

/// The memory bound behind it: at most 255 READ/atomic responses not sent yet per QP
/// (`ibv_qp_attr.max_rd_atomic` is a u8: no requester within its own settings has more
/// outstanding). One more is an invalid request: NAK invalid request (class A, §9.9: B's
/// QP goes to ERR), counted in `invalid_requests`; the 255 before it are answered and a
/// refused atomic is not executed.
#[test]
fn reads_past_the_hard_cap_get_nak_invalid_request() {
    for atomic_last in [false, true] {
        let (mut p, c, src, dst) = setup();
        let read = request(&mut p, &c, read_wr(&src, &dst));
        let atomic = request(&mut p, &c, fetch_add_wr(&src, &dst));
        let p0 = psn_a();
        for i in 0..HARD_CAP {
            assert_eq!(
                p.b.handle_frame(Instant::ZERO, &with_psn(&read, (p0 + i) & 0xff_ffff)),
                RxVerdict::Taken
            );
        }
        let extra = (p0 + HARD_CAP) & 0xff_ffff;
        let last = if atomic_last {
            with_psn(&atomic, extra)
        } else {
            with_psn(&read, extra)
        };
        assert_eq!(p.b.handle_frame(Instant::ZERO, &last), RxVerdict::Taken);
        let got = infos(&drain(&mut p, Side::B));
        let responses = got
            .iter()
            .filter(|g| g.0 == Opcode::RC_READ_RESPONSE_ONLY)
            .count();
        assert_eq!(responses, HARD_CAP as usize);
        assert_eq!(
            got.last().unwrap(),
            &(
                Opcode::RC_ACK,
                extra,
                Some(Syndrome::Nak(NakCode::InvalidRequest))
            ),
        );
        let k = p.b.qp_counters(c.qp_b).unwrap();
        assert_eq!(k.invalid_requests, 1);
        assert_eq!(k.rd_atomic_over_limit, u64::from(HARD_CAP - u32::from(RES)));
        assert_eq!(k.atomics_executed, 0, "the refused atomic was not executed");
        assert_eq!(p.b.query_qp(c.qp_b).unwrap().qp_state, QpState::Err);
    }
}

/// No responder resources at all (max_dest_rd_atomic 0): every READ is an invalid
/// request, as on rxe (`check_resource` → RESPST_ERR_TOO_MANY_RDMA_ATM_REQ).
#[test]
fn reads_without_responder_resources_get_nak_invalid_request() {
    // The READ comes from a pair with resources; B of a pair without any gets it (the
    // same QPNs, PSNs and addresses: both pairs are built the same way).
    let (mut p, c, src, dst) = setup();
    let read = request(&mut p, &c, read_wr(&src, &dst));
    let (mut q, d, _, _) = setup_res(0);
    assert_eq!(q.b.query_qp(d.qp_b).unwrap().max_dest_rd_atomic, 0);
    assert_eq!(q.b.handle_frame(Instant::ZERO, &read), RxVerdict::Taken);
    let got = infos(&drain(&mut q, Side::B));
    assert_eq!(
        got,
        vec![(
            Opcode::RC_ACK,
            psn_a(),
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        )]
    );
    assert_eq!(q.b.qp_counters(d.qp_b).unwrap().invalid_requests, 1);
}

/// A peer that waits for each READ's responses before the next stays within the
/// resources however many READs it sends (the bound counts responses not sent yet).
#[test]
fn reads_within_max_dest_rd_atomic_are_all_answered() {
    let (mut p, c, src, dst) = setup();
    let read = request(&mut p, &c, read_wr(&src, &dst));
    let p0 = psn_a();
    for i in 0..4 * u32::from(RES) {
        assert_eq!(
            p.b.handle_frame(Instant::ZERO, &with_psn(&read, (p0 + i) & 0xff_ffff)),
            RxVerdict::Taken
        );
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
        assert_eq!(
            p.b.handle_frame(Instant::ZERO, &with_psn(&read, (p0 + i) & 0xff_ffff)),
            RxVerdict::Taken
        );
        drain(&mut p, Side::B);
    }
    assert_eq!(
        p.b.handle_frame(Instant::ZERO, &with_psn(&read, p0)),
        RxVerdict::Taken
    );
    assert!(drain(&mut p, Side::B).is_empty(), "evicted: dropped");
    let newest = (p0 + n - 1) & 0xff_ffff;
    assert_eq!(
        p.b.handle_frame(Instant::ZERO, &with_psn(&read, newest)),
        RxVerdict::Taken
    );
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
    let f = request(&mut p, &c, fetch_add_wr(&src, &dst));
    for _ in 0..1000 {
        assert_eq!(p.b.handle_frame(Instant::ZERO, &f), RxVerdict::Taken);
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
        assert_eq!(p.b.handle_frame(Instant::ZERO, &f), RxVerdict::Taken);
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
        assert_eq!(
            p.b.handle_frame(
                Instant::ZERO,
                &with_psn(&f, (psn_a() + 10 + i * 97) & 0xff_ffff),
            ),
            RxVerdict::Taken
        );
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
    assert_eq!(p.b.handle_frame(Instant::ZERO, &f), RxVerdict::Taken);
    drain(&mut p, Side::B);
    let next = with_psn(&f, (psn_a() + 1) & 0xff_ffff);
    for _ in 0..500 {
        assert_eq!(p.b.handle_frame(Instant::ZERO, &f), RxVerdict::Taken);
        assert_eq!(p.b.handle_frame(Instant::ZERO, &next), RxVerdict::Taken);
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
        assert_eq!(
            p.b.handle_frame(Instant::ZERO, &with_psn(&f, (psn_a() + i) & 0xff_ffff)),
            RxVerdict::Taken
        );
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
    cc.add_qp(Instant::ZERO, c.qp_b);
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
        assert_eq!(p.b.handle_frame(Instant::ZERO, &ce), RxVerdict::Taken);
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
        assert_eq!(p.b.handle_frame(Instant::ZERO, &out[..n]), RxVerdict::Taken);
    }
    assert_eq!(p.b.congestion().unwrap().qp_statuses().len(), before);
    assert_eq!(p.b.counters().rp_cnp_ignored, 1000);
}

/// A CNP addressed to B (built by A's notification point for a CE-marked frame).
fn drain_cnp_template(p: &mut Pair, c: &RcPair) -> Vec<u8> {
    let line = 10_000_000_000;
    let mut cc = CongestionControl::new(Algorithm::Dcqcn(DcqcnParams::connectx()), line, 16384);
    cc.add_qp(Instant::ZERO, c.qp_a);
    p.a.enable_congestion_control(cc);
    // An ACK from B to A, CE-marked, makes A's NP send a CNP to B.
    let mut w = send_wr(4, WrOpcode::RdmaWrite, vec![]);
    w.rdma.rkey = xrnic::wire::Rkey(0);
    p.a.post_send(c.qp_a, w).unwrap();
    let req = drain(p, Side::A);
    for f in &req {
        assert_eq!(p.b.handle_frame(Instant::ZERO, f), RxVerdict::Taken);
    }
    let acks = drain(p, Side::B);
    for a in &acks {
        let mut r = FrameRepr::parse(a).unwrap();
        if let xrnic::wire::IpRepr::V4 { tos, .. } = &mut r.ip {
            *tos |= 3;
        }
        let mut out = vec![0u8; r.buffer_len()];
        let n = r.emit(&mut out).unwrap();
        assert_eq!(p.a.handle_frame(Instant::ZERO, &out[..n]), RxVerdict::Taken);
    }
    drain(p, Side::A)
        .into_iter()
        .find(|f| FrameRepr::parse(f).unwrap().roce.bth.opcode == Opcode::CNP)
        .expect("A's NP sent a CNP")
}

/// Requester state a peer cannot create: ACKs and NAKs (even a fatal NAK remote access
/// error) for PSNs A never sent are dropped (IBTA vol. 1 §9.7.4, response PSN
/// validation), each counted in `ghost_responses`; A's outstanding READ still completes.
#[test]
fn responses_for_psns_never_sent_are_dropped_and_counted() {
    let (mut p, c, src, dst) = setup();
    let read = request(&mut p, &c, read_wr(&src, &dst));
    // B's answer to A's READ, as a template of a response frame addressed to A.
    assert_eq!(p.b.handle_frame(Instant::ZERO, &read), RxVerdict::Taken);
    let resp = drain(&mut p, Side::B).remove(0);
    let never = (psn_a() + 1000) & 0xff_ffff;
    let mut n = 0;
    for syndrome in [
        Syndrome::ACK_UNLIMITED,
        Syndrome::Nak(NakCode::PsnSequenceError),
        Syndrome::Nak(NakCode::RemoteAccessError),
    ] {
        let mut r = FrameRepr::parse(&resp).unwrap();
        r.roce.bth.opcode = Opcode::RC_ACK;
        r.roce.bth.psn = Psn::new(never);
        r.roce.ext.aeth = Some(xrnic::wire::AethRepr {
            syndrome,
            msn: xrnic::wire::Msn::new(1),
        });
        r.roce.payload = &[];
        let mut out = vec![0u8; r.buffer_len()];
        let len = r.emit(&mut out).unwrap();
        for _ in 0..100 {
            assert_eq!(
                p.a.handle_frame(Instant::ZERO, &out[..len]),
                RxVerdict::Taken
            );
            n += 1;
        }
    }
    let k = p.a.qp_counters(c.qp_a).unwrap();
    assert_eq!((k.ghost_responses, k.naks_received), (n, 0), "{k:?}");
    assert_eq!(p.a.query_qp(c.qp_a).unwrap().qp_state, QpState::Rts);
    // The real response still completes the READ.
    assert_eq!(p.a.handle_frame(Instant::ZERO, &resp), RxVerdict::Taken);
    let wcs = poll(&mut p, Side::A, &c);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!(wcs[0].status, xrnic::proto::WcStatus::Success);
}
