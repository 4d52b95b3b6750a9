//! Regression tests for the transport bugs a review against IBTA and rxe found (and
//! the deviations fixed): each drives the engine through its public API on the
//! simulator, mostly frame by frame (frames of one side handed to the other by hand, in
//! chosen orders, some patched), and checks the rule the comment cites.

use xrnic::proto::{Instant, RxVerdict};
#[path = "transport_common/mod.rs"]
mod common;

use common::*;
use xrnic::proto::{
    Access, AttrMask, MAX_FRAME_LEN, MrInfo, Mtu, QpAttr, QpState, Sge, VerbsError, WcStatus,
    WrOpcode,
};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair, RcPair, Side};
use xrnic::wire::{FrameRepr, Lkey, NakCode, Opcode, PKey, Syndrome};

/// Every frame `side` wants to send now.
fn drain(p: &mut Pair, side: Side) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    while let Some(n) = p.dev(side).poll_transmit(Instant::ZERO, &mut buf) {
        out.push(buf[..n].to_vec());
    }
    out
}

/// At most one frame `side` wants to send now.
fn one(p: &mut Pair, side: Side) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    p.dev(side)
        .poll_transmit(Instant::ZERO, &mut buf)
        .map(|n| buf[..n].to_vec())
}

/// (opcode, PSN, AETH syndrome) of a frame.
fn info(f: &[u8]) -> (Opcode, u32, Option<Syndrome>) {
    let r = FrameRepr::parse(f).unwrap();
    (
        r.roce.bth.opcode,
        r.roce.bth.psn.value(),
        r.roce.ext.aeth.map(|a| a.syndrome),
    )
}

/// A frame re-emitted (lengths and ICRC recomputed) after `f` changed its fields.
fn patch(frame: &[u8], f: impl FnOnce(&mut FrameRepr<'_>)) -> Vec<u8> {
    let mut r = FrameRepr::parse(frame).unwrap();
    f(&mut r);
    let mut out = vec![0u8; r.buffer_len()];
    let n = r.emit(&mut out).unwrap();
    out.truncate(n);
    out
}

fn feed(p: &mut Pair, to: Side, frames: &[Vec<u8>]) {
    for f in frames {
        assert_eq!(p.dev(to).handle_frame(Instant::ZERO, f), RxVerdict::Taken);
    }
}

fn setup() -> (Pair, RcPair, MrInfo, MrInfo) {
    let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
    let src = mr(&mut p, Side::A, &c, 1 << 16, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 1 << 16, Access::ALL);
    (p, c, src, dst)
}

fn read_wr(id: u64, local: &MrInfo, remote: &MrInfo, off: u64, len: u32) -> xrnic::proto::SendWr {
    let mut w = send_wr(id, WrOpcode::RdmaRead, sge(local, 0, len));
    w.rdma.remote_addr = remote.addr + off;
    w.rdma.rkey = remote.rkey;
    w
}

/// Register and deregister regions in `pd` of side `s` until one gets `key` again (the
/// ABA case: a key of a freed region coming back); returns that region.
fn same_key_again(
    p: &mut Pair,
    s: Side,
    pd: xrnic::proto::Pd,
    key: Lkey,
    access: Access,
) -> MrInfo {
    for _ in 0..4096 {
        let m = p.dev(s).reg_mr(pd, 4096, access).unwrap();
        if m.lkey == key {
            return m;
        }
        p.dev(s).dereg_mr(m.lkey).unwrap();
    }
    panic!("the key never came back in 4096 registrations");
}

// ----- 1. SEND_WITH_INV -------------------------------------------------------------------

/// Bug 1. Remote invalidation is for memory windows and fast-registered MRs only (IBTA
/// vol. 1 §10.6, memory windows and fast registration: a memory region registered by
/// the consumer is not remotely invalidatable; rxe `rxe_invalidate_mr` refuses an MR whose type is not
/// IB_MR_TYPE_MEM_REG). A failed invalidation is rxe's class J: the receive completes
/// REM_INV_REQ_ERR and the responder QP goes to ERR; the region stays registered, bytes
/// and all.
#[test]
fn send_with_inv_never_invalidates_a_reg_mr_region() {
    // The victim: a local-write-only region, and the very receive buffer of the SEND.
    for victim_is_recv_buffer in [false, true] {
        let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
        let src = mr(&mut p, Side::A, &c, 64, Access::LOCAL_WRITE);
        let dst = mr(&mut p, Side::B, &c, 64, Access::LOCAL_WRITE);
        let other = mr(&mut p, Side::B, &c, 64, Access::LOCAL_WRITE);
        p.b.mr_bytes_mut(other.lkey).unwrap().fill(0x5a);
        let victim = if victim_is_recv_buffer { dst } else { other };
        p.b.post_recv(c.qp_b, recv_wr(7, sge(&dst, 0, 64))).unwrap();
        let mut w = send_wr(1, WrOpcode::SendWithInv, sge(&src, 0, 10));
        w.invalidate_rkey = victim.rkey;
        p.a.post_send(c.qp_a, w).unwrap();
        let mut rx = vec![];
        run_for_wcs(
            &mut p,
            Side::B,
            &c,
            1,
            Instant::from_nanos(1_000_000_000),
            &mut rx,
        );
        assert_eq!((rx[0].wr_id, rx[0].status), (7, WcStatus::RemInvReqErr));
        assert_eq!(rx[0].invalidated_rkey, None);
        assert!(p.b.mr_bytes(victim.lkey).is_some(), "the region survives");
        assert!(p.b.mr_bytes(other.lkey).unwrap().iter().all(|&b| b == 0x5a));
        assert_eq!(p.b.query_qp(c.qp_b).unwrap().qp_state, QpState::Err);
        p.b.dereg_mr(victim.lkey)
            .expect("the owner can still deregister it");
    }
}

/// Keys are not a plain count: two regions registered one after the other do not differ
/// by one step of a visible counter in the low byte (rxe: index << 8 | a random 8-bit key).
#[test]
fn mr_keys_do_not_count_up_in_the_low_byte() {
    let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
    let keys: Vec<u32> = (0..8)
        .map(|_| mr(&mut p, Side::B, &c, 64, Access::LOCAL_WRITE).lkey.0 & 0xff)
        .collect();
    let steps: Vec<u32> = keys
        .windows(2)
        .map(|w| (w[1].wrapping_sub(w[0])) & 0xff)
        .collect();
    assert!(steps.iter().any(|&s| s != steps[0]), "low bytes {keys:x?}");
}

// ----- 2. SEND from a deregistered MR --------------------------------------------------------

/// Bug 2. A WR whose local buffer is no longer valid when its data is gathered completes
/// LOC_PROT_ERR (IBTA §10.8, local protection error; rxe's `copy_data` failure
/// in `rxe_req.c` sets IB_WC_LOC_PROT_ERR); nothing goes on the wire for it.
#[test]
fn send_from_a_deregistered_mr_is_loc_prot_err_not_an_empty_packet() {
    // One SGE (sent in place) and two SGEs of which the second goes (gathered).
    for two_sges in [false, true] {
        let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
        p.capture = Some(Vec::new());
        let a1 = mr(&mut p, Side::A, &c, 64, Access::LOCAL_WRITE);
        let a2 = mr(&mut p, Side::A, &c, 64, Access::LOCAL_WRITE);
        let dst = mr(&mut p, Side::B, &c, 256, Access::LOCAL_WRITE);
        p.b.post_recv(c.qp_b, recv_wr(7, sge(&dst, 0, 256)))
            .unwrap();
        let mut sg = sge(&a1, 0, 64);
        if two_sges {
            sg.push(Sge {
                addr: a2.addr,
                length: 64,
                lkey: a2.lkey,
            });
        }
        p.a.post_send(c.qp_a, send_wr(1, WrOpcode::Send, sg))
            .unwrap();
        p.a.dereg_mr(if two_sges { a2.lkey } else { a1.lkey })
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
        assert_eq!(wcs[0].status, WcStatus::LocProtErr, "two_sges {two_sges}");
        assert!(frames(&p, Side::A, Opcode::RC_SEND_ONLY).is_empty());
        assert!(poll(&mut p, Side::B, &c).is_empty(), "nothing received");
        assert_eq!(p.a.query_qp(c.qp_a).unwrap().qp_state, QpState::Err);
    }
}

// ----- 3. READ whose MR disappears --------------------------------------------------------

/// Bug 3. The responder re-checks the region of a READ at every response it sends
/// (rxe `read_reply` → `rxe_recheck_mr`, else RESPST_ERR_RKEY_VIOLATION): a region gone
/// meanwhile is a NAK remote access error (class C, IBTA §9.7.5, §9.9), the requester
/// completes the READ REM_ACCESS_ERR; responses queued behind it are not thrown away.
/// Also when the key came back for another region meanwhile (ABA, bug 6).
#[test]
fn read_whose_mr_goes_before_its_responses_naks_remote_access() {
    for reuse_key in [false, true] {
        let (mut p, c, src, _) = setup();
        let target = mr(&mut p, Side::B, &c, 4096, Access::ALL);
        let rbuf = mr(&mut p, Side::B, &c, 64, Access::LOCAL_WRITE);
        p.b.post_recv(c.qp_b, recv_wr(9, sge(&rbuf, 0, 64)))
            .unwrap();
        p.a.post_send(c.qp_a, read_wr(1, &src, &target, 0, 4096))
            .unwrap();
        p.a.post_send(c.qp_a, send_wr(2, WrOpcode::Send, sge(&src, 0, 8)))
            .unwrap();
        let req = drain(&mut p, Side::A);
        assert_eq!(req.len(), 2);
        let read_psn = info(&req[0]).1;
        let send_psn = info(&req[1]).1;
        feed(&mut p, Side::B, &req);
        // The SEND behind the READ was received.
        assert_eq!(poll(&mut p, Side::B, &c)[0].status, WcStatus::Success);
        // The first response leaves; then the region goes.
        let first = one(&mut p, Side::B).unwrap();
        assert_eq!(info(&first).0, Opcode::RC_READ_RESPONSE_FIRST);
        assert_eq!(p.a.handle_frame(Instant::ZERO, &first), RxVerdict::Taken);
        p.b.dereg_mr(target.lkey).unwrap();
        if reuse_key {
            let pd = p.b.alloc_pd();
            same_key_again(&mut p, Side::B, pd, target.lkey, Access::ALL);
        }
        let out = drain(&mut p, Side::B);
        let got: Vec<_> = out.iter().map(|f| info(f)).collect();
        assert_eq!(
            got,
            [
                (
                    Opcode::RC_ACK,
                    (read_psn + 1) & 0xff_ffff,
                    Some(Syndrome::Nak(NakCode::RemoteAccessError))
                ),
                (Opcode::RC_ACK, send_psn, Some(Syndrome::ACK_UNLIMITED)),
            ],
            "reuse_key {reuse_key}"
        );
        feed(&mut p, Side::A, &out);
        let st: Vec<_> = poll(&mut p, Side::A, &c).iter().map(|w| w.status).collect();
        assert_eq!(st, [WcStatus::RemAccessErr, WcStatus::WrFlushErr]);
        assert_eq!(p.b.qp_counters(c.qp_b).unwrap().remote_access_errors, 1);
        assert_eq!(p.b.query_qp(c.qp_b).unwrap().qp_state, QpState::Err);
    }
}

/// Bug 3, duplicates: a duplicate READ of a region that went away is NAKed remote access
/// error too (rxe `duplicate_request` → `read_reply` → `rxe_recheck_mr` fails →
/// RESPST_ERR_RKEY_VIOLATION), not dropped silently.
#[test]
fn duplicate_read_of_a_deregistered_mr_naks_remote_access() {
    let (mut p, c, src, _) = setup();
    let target = mr(&mut p, Side::B, &c, 2048, Access::ALL);
    p.a.post_send(c.qp_a, read_wr(1, &src, &target, 0, 2048))
        .unwrap();
    let req = drain(&mut p, Side::A);
    feed(&mut p, Side::B, &req);
    assert_eq!(drain(&mut p, Side::B).len(), 2, "both responses sent");
    p.b.dereg_mr(target.lkey).unwrap();
    feed(&mut p, Side::B, &req);
    let got: Vec<_> = drain(&mut p, Side::B).iter().map(|f| info(f)).collect();
    assert_eq!(
        got,
        [(
            Opcode::RC_ACK,
            info(&req[0]).1,
            Some(Syndrome::Nak(NakCode::RemoteAccessError))
        )]
    );
}

// ----- 4. READ spanning 2^23 PSNs ----------------------------------------------------------

/// Bug 4. At most 2^23 PSNs may be outstanding (IBTA §9.7.1, §9.7.5: a PSN is
/// compared within half of the 24-bit space); a message needing that many or more is
/// refused at post time, as EINVAL (rxe refuses a length beyond max_msg_sz with -EINVAL).
#[test]
fn messages_the_psn_window_cannot_carry_are_refused_at_post_send() {
    let opts = ConnectOpts {
        mtu: Mtu::Mtu256,
        ..ConnectOpts::default()
    };
    let (mut p, c) = pair(LinkConfig::default(), &opts);
    let no_mr = |len: u32| {
        vec![Sge {
            addr: 0x1_0000_0000,
            length: len,
            lkey: Lkey(0x1234),
        }]
    };
    for op in [WrOpcode::RdmaRead, WrOpcode::RdmaWrite, WrOpcode::Send] {
        // 2^31 bytes at MTU 256: exactly 2^23 packets.
        let r = p.a.post_send(c.qp_a, send_wr(1, op, no_mr(1 << 31)));
        assert!(
            matches!(r, Err(VerbsError::InvalidValue(_))),
            "{op:?}: {r:?}"
        );
    }
    assert_eq!(p.a.send_queue_len(c.qp_a), 0);
    // The largest accepted: 2^23 - 1 - max_unacked_psns packets (queued; its bad key
    // fails it later, not the post).
    let max = ((1u32 << 23) - 1 - p.a.config().max_unacked_psns) * 256;
    p.a.post_send(c.qp_a, send_wr(2, WrOpcode::RdmaRead, no_mr(max)))
        .unwrap();
    let r =
        p.a.post_send(c.qp_a, send_wr(3, WrOpcode::RdmaRead, no_mr(max + 1)));
    assert!(matches!(r, Err(VerbsError::InvalidValue(_))), "{r:?}");
    // At MTU 1024 the same 2^31 bytes are 2^21 packets: fine.
    let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
    p.a.post_send(c.qp_a, send_wr(1, WrOpcode::RdmaRead, no_mr(1 << 31)))
        .unwrap();
}

// ----- 7. ACK PSN of a duplicate SEND/WRITE -------------------------------------------------

/// Bug 7. The ACK that answers a duplicate SEND/WRITE carries the PSN of the newest
/// SEND/WRITE executed, never a READ's or an atomic's (IBTA C9-105; rxe commit "IB/rxe:
/// fix for duplicate request processing and ack psns"): an ACK for a READ's last PSN
/// tells an rxe requester that READ completed without its data.
#[test]
fn ack_for_a_duplicate_send_carries_a_send_psn_not_a_read_or_atomic_psn() {
    for atomic in [false, true] {
        let (mut p, c, src, dst) = setup();
        p.b.post_recv(c.qp_b, recv_wr(1, sge(&dst, 0, 64))).unwrap();
        p.a.post_send(c.qp_a, send_wr(1, WrOpcode::Send, sge(&src, 0, 8)))
            .unwrap();
        if atomic {
            let mut w = send_wr(2, WrOpcode::AtomicFetchAndAdd, sge(&src, 0, 8));
            w.atomic.remote_addr = dst.addr + 64;
            w.atomic.rkey = dst.rkey;
            p.a.post_send(c.qp_a, w).unwrap();
        } else {
            p.a.post_send(c.qp_a, read_wr(2, &src, &dst, 0, 2048))
                .unwrap();
        }
        let req = drain(&mut p, Side::A);
        let send_psn = info(&req[0]).1;
        feed(&mut p, Side::B, &req);
        drain(&mut p, Side::B);
        // The SEND again.
        feed(&mut p, Side::B, &req[..1]);
        let got: Vec<_> = drain(&mut p, Side::B).iter().map(|f| info(f)).collect();
        assert_eq!(
            got,
            [(Opcode::RC_ACK, send_psn, Some(Syndrome::ACK_UNLIMITED))],
            "atomic {atomic}"
        );
    }
}

// ----- 6. Key reuse (ABA) -------------------------------------------------------------------

/// Bug 6. A WRITE validated at its FIRST packet keeps what it validated (IBTA §9.7.5:
/// the R_Key check is for the region the RETH named; §10.6: a deregistered region is
/// no longer accessible): when that region goes and a region of another PD, with local
/// access only, gets the same key, MIDDLE and LAST must not land in it: NAK remote
/// access error, bytes untouched.
#[test]
fn write_in_progress_does_not_land_in_a_new_region_with_the_same_key() {
    let (mut p, c, src, _) = setup();
    let target = mr(&mut p, Side::B, &c, 4096, Access::ALL);
    let mut w = send_wr(1, WrOpcode::RdmaWrite, sge(&src, 0, 3072));
    w.rdma.remote_addr = target.addr;
    w.rdma.rkey = target.rkey;
    p.a.mr_bytes_mut(src.lkey).unwrap().fill(0x77);
    p.a.post_send(c.qp_a, w).unwrap();
    let req = drain(&mut p, Side::A);
    assert_eq!(req.len(), 3);
    feed(&mut p, Side::B, &req[..1]);
    p.b.dereg_mr(target.lkey).unwrap();
    let pd = p.b.alloc_pd();
    let intruder = same_key_again(&mut p, Side::B, pd, target.lkey, Access::LOCAL_WRITE);
    feed(&mut p, Side::B, &req[1..]);
    let got: Vec<_> = drain(&mut p, Side::B).iter().map(|f| info(f)).collect();
    assert_eq!(
        got,
        [(
            Opcode::RC_ACK,
            info(&req[1]).1,
            Some(Syndrome::Nak(NakCode::RemoteAccessError))
        )]
    );
    assert!(p.b.mr_bytes(intruder.lkey).unwrap().iter().all(|&b| b == 0));
}

/// Bug 6, requester side: a posted SEND whose region was deregistered and whose key now
/// names another region does not send that region's bytes (LOC_PROT_ERR as bug 2).
#[test]
fn posted_send_does_not_read_a_new_region_with_the_same_key() {
    let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
    let a1 = mr(&mut p, Side::A, &c, 64, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 64, Access::LOCAL_WRITE);
    p.b.post_recv(c.qp_b, recv_wr(7, sge(&dst, 0, 64))).unwrap();
    p.a.post_send(c.qp_a, send_wr(1, WrOpcode::Send, sge(&a1, 0, 64)))
        .unwrap();
    p.a.dereg_mr(a1.lkey).unwrap();
    let again = same_key_again(&mut p, Side::A, c.pd_a, a1.lkey, Access::LOCAL_WRITE);
    p.a.mr_bytes_mut(again.lkey).unwrap().fill(0x99);
    let mut wcs = vec![];
    run_for_wcs(
        &mut p,
        Side::A,
        &c,
        1,
        Instant::from_nanos(1_000_000_000),
        &mut wcs,
    );
    assert_eq!(wcs[0].status, WcStatus::LocProtErr);
    assert!(p.b.mr_bytes(dst.lkey).unwrap().iter().all(|&b| b == 0));
}

// ----- Deviations ---------------------------------------------------------------------------

/// P_Key check on receive (IBTA §9.6 header validation, §10.9 P_Key matching: the low 15 bits
/// must match an entry of the table and not both keys may be limited members; rxe
/// `check_keys` drops and counts): our table holds 0xFFFF, so 0xFFFF and 0x7FFF
/// (limited member) are accepted, anything else is dropped and counted.
#[test]
fn a_frame_with_a_foreign_pkey_is_dropped_and_counted() {
    let (mut p, c, src, dst) = setup();
    for i in 0..2 {
        p.b.post_recv(c.qp_b, recv_wr(i, sge(&dst, 0, 64))).unwrap();
    }
    p.a.post_send(c.qp_a, send_wr(1, WrOpcode::Send, sge(&src, 0, 8)))
        .unwrap();
    let f = drain(&mut p, Side::A).remove(0);
    let foreign = patch(&f, |r| r.roce.bth.pkey = PKey(0x8001));
    let limited = patch(&f, |r| r.roce.bth.pkey = PKey(0x7fff));
    assert_eq!(
        p.b.handle_frame(Instant::ZERO, &foreign),
        RxVerdict::BadPkey
    );
    assert!(poll(&mut p, Side::B, &c).is_empty(), "dropped");
    assert_eq!(p.b.counters().bad_pkey_dropped, 1);
    assert!(drain(&mut p, Side::B).is_empty(), "and not answered");
    assert_eq!(p.b.handle_frame(Instant::ZERO, &limited), RxVerdict::Taken);
    assert_eq!(poll(&mut p, Side::B, &c).len(), 1, "0x7FFF matches 0xFFFF");
    assert_eq!(p.b.counters().bad_pkey_dropped, 1);
}

/// The requester honours the AETH syndrome of atomic ACKs and READ responses (IBTA
/// §9.7.5: FIRST/LAST/ONLY READ responses and atomic ACKs carry an AETH whose
/// syndrome is an ACK; rxe `check_ack` returns COMPST_ERROR for anything else).
#[test]
fn a_nak_syndrome_in_an_atomic_ack_or_read_response_is_an_error() {
    for read in [false, true] {
        let (mut p, c, src, dst) = setup();
        if read {
            p.a.post_send(c.qp_a, read_wr(1, &src, &dst, 0, 64))
                .unwrap();
        } else {
            let mut w = send_wr(1, WrOpcode::AtomicFetchAndAdd, sge(&src, 0, 8));
            w.atomic.remote_addr = dst.addr;
            w.atomic.rkey = dst.rkey;
            p.a.post_send(c.qp_a, w).unwrap();
        }
        let req = drain(&mut p, Side::A);
        feed(&mut p, Side::B, &req);
        let resp = drain(&mut p, Side::B);
        assert_eq!(resp.len(), 1);
        let bad = patch(&resp[0], |r| {
            if let Some(a) = r.roce.ext.aeth.as_mut() {
                a.syndrome = Syndrome::Nak(NakCode::RemoteAccessError);
            }
        });
        assert_eq!(p.a.handle_frame(Instant::ZERO, &bad), RxVerdict::Taken);
        let st: Vec<_> = poll(&mut p, Side::A, &c).iter().map(|w| w.status).collect();
        assert_eq!(st, [WcStatus::RemAccessErr], "read {read}");
    }
}

/// Duplicate READs (IBTA §9.7.5, rxe `duplicate_request`): the VA range must lie
/// inside the original request's, else the duplicate is dropped (a shifted VA must not
/// return other bytes); any such subset is served, also one that ends before the
/// original's last PSN.
#[test]
fn duplicate_read_must_lie_inside_the_original_range_and_any_subset_is_served() {
    let (mut p, c, src, dst) = setup();
    p.a.post_send(c.qp_a, read_wr(1, &src, &dst, 0, 3072))
        .unwrap();
    let req = drain(&mut p, Side::A);
    feed(&mut p, Side::B, &req);
    assert_eq!(drain(&mut p, Side::B).len(), 3);
    let psn0 = info(&req[0]).1;
    // Shifted by 8 bytes: not the same request.
    let shifted = patch(&req[0], |r| r.roce.ext.reth.as_mut().unwrap().va += 8);
    assert_eq!(p.b.handle_frame(Instant::ZERO, &shifted), RxVerdict::Taken);
    assert!(drain(&mut p, Side::B).is_empty(), "shifted VA dropped");
    // The first 1024 bytes only: one response at the first PSN.
    let head = patch(&req[0], |r| {
        r.roce.ext.reth.as_mut().unwrap().dma_len = 1024
    });
    assert_eq!(p.b.handle_frame(Instant::ZERO, &head), RxVerdict::Taken);
    let got: Vec<_> = drain(&mut p, Side::B).iter().map(|f| info(f).0).collect();
    assert_eq!(got, [Opcode::RC_READ_RESPONSE_ONLY]);
    // The middle 1024 bytes, from the second PSN.
    let mid = patch(&req[0], |r| {
        r.roce.bth.psn = r.roce.bth.psn.add(1);
        let reth = r.roce.ext.reth.as_mut().unwrap();
        reth.va += 1024;
        reth.dma_len = 1024;
    });
    assert_eq!(p.b.handle_frame(Instant::ZERO, &mid), RxVerdict::Taken);
    let got: Vec<_> = drain(&mut p, Side::B)
        .iter()
        .map(|f| (info(f).0, info(f).1))
        .collect();
    assert_eq!(
        got,
        [(Opcode::RC_READ_RESPONSE_ONLY, (psn0 + 1) & 0xff_ffff)]
    );
    assert_eq!(p.b.qp_counters(c.qp_b).unwrap().responses_replayed, 2);
}

/// Duplicate READs re-check the QP's current access flags (IBTA §10.2: remote access
/// rights of the QP gate every remote operation): once REMOTE_READ was taken away, a
/// duplicate is answered NAK invalid request, like a new READ (an operation the QP does
/// not enable, §9.7.5.2; rxe's check_op_valid).
#[test]
fn duplicate_read_rechecks_the_qp_access_flags() {
    let (mut p, c, src, dst) = setup();
    p.a.post_send(c.qp_a, read_wr(1, &src, &dst, 0, 64))
        .unwrap();
    let req = drain(&mut p, Side::A);
    feed(&mut p, Side::B, &req);
    assert_eq!(drain(&mut p, Side::B).len(), 1);
    let attr = QpAttr {
        qp_state: QpState::Rts,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        ..QpAttr::rc_init(Access::LOCAL_WRITE)
    };
    p.b.modify_qp(c.qp_b, &attr, AttrMask::STATE | AttrMask::ACCESS_FLAGS)
        .unwrap();
    feed(&mut p, Side::B, &req);
    let got: Vec<_> = drain(&mut p, Side::B).iter().map(|f| info(f)).collect();
    assert_eq!(
        got,
        [(
            Opcode::RC_ACK,
            info(&req[0]).1,
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        )]
    );
}

/// A new WRITE, READ or atomic the responder's QP does not enable (its access flags lack
/// REMOTE_WRITE / REMOTE_READ / REMOTE_ATOMIC, the region allows everything) is an
/// invalid request, as rxe's check_op_valid answers it: NAK invalid request, the
/// requester completes REM_INV_REQ_ERR, the target bytes stay, the responder goes to ERR.
#[test]
fn an_operation_the_qp_does_not_enable_is_an_invalid_request() {
    let all_but = |a: Access| Access(Access::ALL.0 & !a.0);
    for (op, keep) in [
        (WrOpcode::RdmaWrite, all_but(Access::REMOTE_WRITE)),
        (WrOpcode::RdmaRead, all_but(Access::REMOTE_READ)),
        (WrOpcode::AtomicFetchAndAdd, all_but(Access::REMOTE_ATOMIC)),
    ] {
        let (mut p, c, src, dst) = setup();
        let attr = QpAttr {
            qp_state: QpState::Rts,
            qp_access_flags: keep,
            ..QpAttr::rc_init(Access::LOCAL_WRITE)
        };
        p.b.modify_qp(c.qp_b, &attr, AttrMask::STATE | AttrMask::ACCESS_FLAGS)
            .unwrap();
        p.b.mr_bytes_mut(dst.lkey).unwrap()[..8].fill(0xee);
        let len = if op == WrOpcode::AtomicFetchAndAdd {
            8
        } else {
            64
        };
        let mut w = send_wr(1, op, sge(&src, 0, len));
        w.rdma.remote_addr = dst.addr;
        w.rdma.rkey = dst.rkey;
        w.atomic.remote_addr = dst.addr;
        w.atomic.rkey = dst.rkey;
        w.atomic.compare_add = 1;
        p.a.post_send(c.qp_a, w).unwrap();
        let req = drain(&mut p, Side::A);
        feed(&mut p, Side::B, &req);
        let out = drain(&mut p, Side::B);
        let got: Vec<_> = out.iter().map(|f| info(f)).collect();
        let nak = Some(Syndrome::Nak(NakCode::InvalidRequest));
        assert_eq!(got, [(Opcode::RC_ACK, info(&req[0]).1, nak)], "{op:?}");
        feed(&mut p, Side::A, &out);
        let st: Vec<_> = poll(&mut p, Side::A, &c).iter().map(|w| w.status).collect();
        assert_eq!(st, [WcStatus::RemInvReqErr], "{op:?}");
        assert_eq!(&p.b.mr_bytes(dst.lkey).unwrap()[..8], &[0xee; 8], "{op:?}");
        assert_eq!(
            p.b.query_qp(c.qp_b).unwrap().qp_state,
            QpState::Err,
            "{op:?}"
        );
        assert_eq!(
            p.b.qp_counters(c.qp_b).unwrap().invalid_requests,
            1,
            "{op:?}"
        );
    }
}

/// Bug 5, the window's other edge: a READ or atomic "duplicate" for a PSN before the
/// QP's first one names no request of ours (IBTA §9.7.5: duplicates are requests already
/// executed) and is dropped, even when the QP's very first request was a READ.
#[test]
fn a_duplicate_before_the_first_psn_matches_nothing() {
    let (mut p, c, src, dst) = setup();
    p.a.post_send(c.qp_a, read_wr(1, &src, &dst, 0, 64))
        .unwrap();
    let req = drain(&mut p, Side::A);
    feed(&mut p, Side::B, &req);
    assert_eq!(drain(&mut p, Side::B).len(), 1);
    let before = patch(&req[0], |r| r.roce.bth.psn = r.roce.bth.psn.sub(1));
    assert_eq!(p.b.handle_frame(Instant::ZERO, &before), RxVerdict::Taken);
    assert!(drain(&mut p, Side::B).is_empty());
    assert_eq!(p.b.qp_counters(c.qp_b).unwrap().responses_replayed, 0);
}

/// A responder that moves its QP to ERR right after a receive completed (librdmacm's
/// `rdma_disconnect` does, rping's server and client both) still sends the ACK it owed
/// for that SEND, as rxe does (it acknowledges in the same pass that executed the
/// request): the sender's SEND completes SUCCESS instead of retrying to
/// RETRY_EXC_ERR. READ responses are not sent from ERR.
#[test]
fn an_ack_owed_when_the_responder_moves_to_err_still_leaves() {
    let (mut p, c, src, dst) = setup();
    p.dev(Side::B)
        .post_recv(c.qp_b, recv_wr(7, sge(&dst, 0, 64)))
        .unwrap();
    p.dev(Side::A)
        .post_send(c.qp_a, send_wr(1, WrOpcode::Send, sge(&src, 0, 64)))
        .unwrap();
    let sends = drain(&mut p, Side::A);
    assert_eq!(sends.len(), 1);
    feed(&mut p, Side::B, &sends);
    let wcs = poll(&mut p, Side::B, &c);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    // B's application moves the QP to ERR before B's driver transmitted anything.
    let a = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    p.dev(Side::B)
        .modify_qp(c.qp_b, &a, AttrMask::STATE)
        .unwrap();
    let acks = drain(&mut p, Side::B);
    assert_eq!(acks.len(), 1, "the owed ACK");
    let (op, psn, syn) = info(&acks[0]);
    assert_eq!(op, Opcode::RC_ACK);
    assert_eq!(psn, info(&sends[0]).1);
    assert!(matches!(syn, Some(Syndrome::Ack { .. })), "{syn:?}");
    feed(&mut p, Side::A, &acks);
    let wcs = poll(&mut p, Side::A, &c);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    // Nothing else leaves B in ERR.
    assert!(drain(&mut p, Side::B).is_empty());
}
