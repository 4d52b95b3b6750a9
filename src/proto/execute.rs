//! The responder executing inbound requests on a QP (IBTA vol. 1 §9.7.5 responder
//! behaviour, validation and responses; rxe's `rxe_resp.c` plays this role): the half
//! of the responder that needs the whole [`Qp`] (its state, attributes, receive queue
//! or SRQ, CQs). The responder's own state and the responses it sends are
//! `super::responder`, below the QP.
//!
//! Contract: [`handle_request`] checks one request packet in the order the spec gives
//! (PSN, opcode sequence, length, receive WQE, R_Key/bounds/rights), then either executes
//! it or turns the fault into a NAK queued on `qp.resp`; it never panics on peer input.

use crate::wire::{ExtHeaders, NakCode, OpInfo, Operation, Psn, Qpn, Segment, Syndrome};

use super::cq::{WcOpcode, WcStatus, WorkCompletion};
use super::memory::{Access, AccessError, MemRef, scatter};
use super::qp::{Qp, QpState};
use super::responder::{Cached, CachedKind, InProgress, RespOut};
use super::srq::AsyncEvent;
use super::trace::{Event, qp_event};
use super::{Ctx, Fault};

fn nak(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn, code: NakCode) {
    let msn = qp.resp.msn();
    // Sequence-error NAKs are bounded like ACKs; a fatal NAK is always queued.
    let cap = if code == NakCode::PsnSequenceError {
        out_cap(qp)
    } else {
        usize::MAX
    };
    qp.resp.push_ack(cap, psn, Syndrome::Nak(code), msn, false);
    qp_event!(ctx.now, ctx.dev, qp.qpn, Event::NakQueued, psn = psn.value(), syndrome = ?code);
    if code != NakCode::PsnSequenceError {
        // Class A (invalid request) and class C (access) errors are fatal for the
        // responder QP too (§9.9, rxe `do_class_ac_error`). No receive completion
        // reports it (an RDMA request has none): an affiliated error does (§11.6.3.1).
        if !qp.resp.is_fatal() {
            ctx.raise(responder_error_event(qp.qpn, code));
        }
        qp.resp.fail();
    }
}

/// The affiliated asynchronous error of a responder QP that NAKed with `code` and goes
/// to ERR (IBTA §11.6.3.1; mlx5 raises the same three).
pub(crate) fn responder_error_event(qpn: Qpn, code: NakCode) -> AsyncEvent {
    match code {
        NakCode::RemoteAccessError => AsyncEvent::QpAccessErr(qpn),
        NakCode::RemoteOperationalError => AsyncEvent::QpFatal(qpn),
        _ => AsyncEvent::QpReqErr(qpn),
    }
}

/// IBV_EVENT_COMM_EST the first time a packet reaches `qp` in RTR (IBTA §11.6.3.1:
/// the event tells a CM that missed its RTU that the connection works).
// The test inlined (once per request packet), the event out of line (once per QP).
#[inline(always)]
pub(crate) fn comm_est(qp: &mut Qp, ctx: &mut Ctx<'_>) {
    if qp.state == QpState::Rtr && !qp.resp.established() {
        raise_comm_est(qp, ctx);
    }
}

#[cold]
#[inline(never)]
fn raise_comm_est(qp: &mut Qp, ctx: &mut Ctx<'_>) {
    qp.resp.mark_established();
    ctx.raise(AsyncEvent::CommEst(qp.qpn));
}

/// What [`check_psn`] found (rxe `check_psn`: RESPST_CHK_OP_SEQ, RESPST_DUPLICATE_REQUEST
/// or RESPST_ERR_PSN_OUT_OF_SEQ).
enum PsnCheck {
    /// The expected PSN: the request goes on to the next check.
    Expected,
    /// Before the expected PSN, by this (negative) distance: a duplicate.
    Duplicate(i32),
    /// After it: out of sequence, already answered.
    OutOfSequence,
}

/// Handle one request packet addressed to `qp`: the responder's steps in the order IBTA
/// vol. 1 §9.7.5 and rxe's `rxe_resp.c` (`enum resp_states`) give them. Each check is a
/// function named after its rule; a fault any of them finds is answered by
/// [`answer_fault`].
#[inline(always)]
pub(crate) fn handle_request(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    info: &OpInfo,
    psn: Psn,
    ack_req: bool,
    ext: &ExtHeaders,
    payload: &[u8],
) {
    if !check_qp_state(qp) {
        return;
    }
    comm_est(qp, ctx);
    match check_psn(qp, ctx, psn) {
        PsnCheck::Expected => {}
        PsnCheck::Duplicate(d) => return duplicate(qp, ctx, info, psn, d, ext),
        PsnCheck::OutOfSequence => return,
    }
    let executed = check_op_seq(qp, info)
        .and_then(|()| check_length(qp, info, payload))
        .and_then(|()| execute(qp, ctx, info, psn, ext, payload));
    match executed {
        Ok(npsn) => acknowledge(qp, ctx, info, psn, ack_req, npsn),
        Err(fault) => answer_fault(qp, ctx, psn, ack_req, fault),
    }
}

/// Rule: only a QP in RTR, RTS or SQD whose responder is not failing takes requests
/// (IBTA vol. 1 §10.3 QP states; rxe `rxe_rcv` → `check_type_state`); anything else is
/// dropped and counted `dropped_wrong_state`.
#[inline(always)]
fn check_qp_state(qp: &mut Qp) -> bool {
    if !matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd) || qp.resp.is_fatal() {
        qp.counters.dropped_wrong_state += 1;
        return false;
    }
    true
}

/// Rule: the request's PSN against the expected PSN (IBTA vol. 1 §9.7.5, rxe
/// `check_psn`). After it: out of sequence, NAK PSN sequence error carrying the expected
/// PSN once, then drop until the expected PSN arrives. Before it: a duplicate
/// ([`duplicate`]). Equal: go on, and the next gap may be NAKed again.
#[inline(always)]
fn check_psn(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn) -> PsnCheck {
    let d = psn.diff(qp.resp.epsn());
    if d > 0 {
        // §9.7.5: out of sequence: NAK once, drop until the expected PSN arrives.
        qp.counters.out_of_sequence += 1;
        if !qp.resp.sequence_nak_sent() {
            qp.resp.note_waiting_nak();
            let e = qp.resp.epsn();
            nak(qp, ctx, e, NakCode::PsnSequenceError);
        }
        return PsnCheck::OutOfSequence;
    }
    if d < 0 {
        return PsnCheck::Duplicate(d);
    }
    qp.resp.expected_psn_arrived();
    PsnCheck::Expected
}

/// Rule: the opcode sequence (IBTA vol. 1 §9.7.5, validation of the request opcode
/// sequence; rxe `check_op_seq`): a FIRST/MIDDLE must be followed by MIDDLE or LAST of
/// the same operation; a new message may not start in the middle of one, nor a
/// MIDDLE/LAST arrive outside one. Else NAK invalid request.
#[inline(always)]
fn check_op_seq(qp: &Qp, info: &OpInfo) -> Result<(), Fault> {
    let cur = qp.resp.in_progress();
    let seq_ok = match (cur, info.operation, info.segment) {
        (InProgress::None, _, s) => {
            s.starts() || !matches!(info.operation, Operation::Send | Operation::Write)
        }
        (InProgress::Send { .. }, Operation::Send, s) => !s.starts(),
        (InProgress::Write { .. }, Operation::Write, s) => !s.starts(),
        _ => false,
    };
    if seq_ok {
        Ok(())
    } else {
        Err(Fault::Nak(NakCode::InvalidRequest))
    }
}

/// Rule: the packet length (IBTA vol. 1 §9.7.5, length validation; rxe `check_length`):
/// FIRST and MIDDLE carry exactly one MTU, LAST 1..=MTU, ONLY 0..=MTU. Else NAK invalid
/// request.
#[inline(always)]
fn check_length(qp: &Qp, info: &OpInfo, payload: &[u8]) -> Result<(), Fault> {
    let mtu = qp.attr.path_mtu.bytes() as usize;
    let n = payload.len();
    let len_ok = match info.segment {
        Segment::First | Segment::Middle => n == mtu,
        Segment::Last => (1..=mtu).contains(&n),
        Segment::Only => n <= mtu,
    };
    if len_ok {
        Ok(())
    } else {
        Err(Fault::Nak(NakCode::InvalidRequest))
    }
}

/// Rule: execute the operation (IBTA vol. 1 §9.4, §9.7.5; rxe `execute`), with the
/// checks that depend on it: the QP's access flags ([`check_op_valid`]), the receive WQE
/// and the READ/atomic resources (rxe `check_resource`: [`take_srq_wqe`],
/// [`rd_atomic_admit`]), the R_Key ([`check_rkey`]). Returns the PSNs the request
/// consumed. FLUSH and ATOMIC WRITE are not offered by this engine (no device cap bit):
/// NAK invalid request.
#[inline(always)]
fn execute(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    info: &OpInfo,
    psn: Psn,
    ext: &ExtHeaders,
    payload: &[u8],
) -> Result<u32, Fault> {
    match info.operation {
        Operation::Send => do_send(qp, ctx, info, ext, payload),
        Operation::Write => do_write(qp, ctx, info, ext, payload),
        Operation::ReadRequest => do_read(qp, ctx, psn, ext),
        Operation::CmpSwap | Operation::FetchAdd => do_atomic(qp, ctx, info, psn, ext),
        _ => Err(Fault::Nak(NakCode::InvalidRequest)),
    }
}

/// Rule: acknowledge an executed request (IBTA vol. 1 §9.7.5 responses, coalesced ACKs;
/// rxe `acknowledge`): the expected PSN moves past it; a SEND/WRITE is ACKed when it asks
/// for it (AckReq) or every `ack_every` packets; a READ or atomic is answered by its own
/// responses, queued by `do_read` / `do_atomic`.
#[inline(always)]
fn acknowledge(qp: &mut Qp, ctx: &mut Ctx<'_>, info: &OpInfo, psn: Psn, ack_req: bool, npsn: u32) {
    qp.resp.accept_packet(npsn);
    let responded = matches!(
        info.operation,
        Operation::ReadRequest | Operation::CmpSwap | Operation::FetchAdd
    );
    if !responded {
        qp.resp.note_executed(psn);
    }
    if !responded && (ack_req || qp.resp.pkts_since_ack() >= ctx.cfg.ack_every) {
        let (m, s) = (qp.resp.msn(), Syndrome::ACK_UNLIMITED);
        let cap = out_cap(qp);
        let coalesced = qp.resp.push_ack(cap, psn, s, m, false);
        qp_event!(
            ctx.now,
            ctx.dev,
            qp.qpn,
            Event::AckQueued,
            psn = psn.value(),
            ack_req = ack_req,
            replaces_psn = coalesced.map(|p| p.value())
        );
    }
}

/// Answer the fault a check or the execution found (IBTA vol. 1 §9.7.5.2 NAK codes, §9.9
/// error classes; rxe's RESPST_ERR_* states): an RNR NAK ([`rnr_nak`]), a refused remote
/// invalidation ([`refuse_invalidate`]), a dead owner ([`owner_gone`]) or a NAK.
fn answer_fault(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn, ack_req: bool, fault: Fault) {
    match fault {
        Fault::Rnr => rnr_nak(qp, ctx, psn),
        Fault::Invalidate => refuse_invalidate(qp, ctx, psn, ack_req),
        Fault::Gone => owner_gone(qp, ctx, psn),
        Fault::Nak(code) => {
            match code {
                NakCode::RemoteAccessError => qp.counters.remote_access_errors += 1,
                _ => qp.counters.invalid_requests += 1,
            }
            nak(qp, ctx, psn, code);
        }
    }
}

/// Rule: no receive WQE for a SEND or WRITE with immediate (IBTA vol. 1 §9.7.5.2.8;
/// rxe RESPST_ERR_RNR): RNR NAK with our min_rnr_timer; the PSN is not consumed, the
/// requester resends it after the timer.
fn rnr_nak(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn) {
    qp.counters.out_of_buffer += 1;
    // Later packets of the same burst are out of sequence now; they must not add a
    // sequence-error NAK that would cut the requester's RNR wait short.
    qp.resp.note_waiting_nak();
    let (m, t) = (qp.resp.msn(), qp.attr.min_rnr_timer);
    let cap = out_cap(qp);
    qp.resp
        .push_ack(cap, psn, Syndrome::RnrNak { timer: t }, m, false);
    qp_event!(
        ctx.now,
        ctx.dev,
        qp.qpn,
        Event::RnrNakQueued,
        psn = psn.value(),
        timer_code = t
    );
}

/// Rule: a remote invalidation this engine cannot do (IBTA vol. 1 §10.6, memory windows
/// and fast registration; rxe class J, `RESPST_ERR_INVALIDATE_RKEY`): the receive
/// completed REM_INV_REQ_ERR (done by `do_send`), no NAK: the packet is acknowledged as
/// any other when it asks for it, then the QP goes to ERR.
fn refuse_invalidate(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn, ack_req: bool) {
    qp.counters.invalid_requests += 1;
    qp.resp.fail();
    if ack_req {
        let m = qp.resp.msn();
        qp.resp
            .push_ack(usize::MAX, psn, Syndrome::ACK_UNLIMITED, m, false);
    }
    qp_event!(
        ctx.now,
        ctx.dev,
        qp.qpn,
        Event::InvalidateRefused,
        psn = psn.value()
    );
    if qp.resp.queued_responses() == 0 {
        qp.enter_error(ctx);
    }
}

/// The process that owns the QP's memory is gone ([`Fault::Gone`]): the request is
/// dropped unanswered and the QP moves to ERR, where it takes nothing more, as a
/// destroyed QP would; the owner's teardown destroys it soon after.
pub(crate) fn owner_gone(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn) {
    qp.counters.dropped_owner_gone += 1;
    qp.resp.abandon_message();
    qp_event!(
        ctx.now,
        ctx.dev,
        qp.qpn,
        Event::OwnerGone,
        psn = psn.value()
    );
    qp.enter_error(ctx);
}

/// Rule: a duplicate request (IBTA vol. 1 §9.7.5, responder resources; rxe
/// `duplicate_request`): never executed again. A READ is answered again
/// ([`duplicate_read`]), an atomic's saved result replayed ([`duplicate_atomic`]), a
/// SEND/WRITE re-ACKed ([`duplicate_send_write`]).
fn duplicate(qp: &mut Qp, ctx: &mut Ctx<'_>, info: &OpInfo, psn: Psn, d: i32, ext: &ExtHeaders) {
    qp.counters.duplicate_request += 1;
    qp_event!(
        ctx.now,
        ctx.dev,
        qp.qpn,
        Event::DuplicateRequest,
        psn = psn.value(),
        opcode = info.name
    );
    // Where the duplicate lies on the unwrapped PSN count: `d` is within 2^23 of the
    // expected PSN (§9.7.5), so entries older than that window can never match, and
    // an entry made 2^24 PSNs ago for the same 24-bit PSN does not either.
    // Before the QP's first PSN: no request of ours, nothing to answer.
    let at = u64::try_from(qp.resp.psn_count() as i64 + i64::from(d)).ok();
    qp.resp.age_cache();
    match info.operation {
        Operation::ReadRequest => duplicate_read(qp, ctx, psn, at, ext),
        Operation::CmpSwap | Operation::FetchAdd => duplicate_atomic(qp, ctx, info, psn, at, ext),
        _ => duplicate_send_write(qp),
    }
}

/// Rule: a duplicate READ (IBTA vol. 1 §9.7.5): answer again from the PSN asked for,
/// re-reading memory. As rxe `duplicate_request`: the newest READ holding the PSN; same
/// R_Key and a range inside the original one (any such subset is served); else drop
/// (class D). The region must still be the registration the READ was checked against,
/// and the QP must still allow remote reads, else NAK remote access (rxe
/// `rxe_recheck_mr` → RESPST_ERR_RKEY_VIOLATION).
fn duplicate_read(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn, at: Option<u64>, ext: &ExtHeaders) {
    let Some(reth) = ext.reth else { return };
    let hit = qp.resp.cached(at, |k| matches!(k, CachedKind::Read { .. }));
    let (Some(c), Some(at)) = (hit, at) else {
        return;
    };
    let CachedKind::Read {
        rkey,
        va,
        len: olen,
        serial,
    } = c.kind
    else {
        return;
    };
    let len = reth.dma_len;
    let npkts = len.div_ceil(qp.attr.path_mtu.bytes()).max(1);
    let skipped = at + u64::from(c.npkts) - c.end_count;
    let inside = reth.va >= va
        && reth.va.checked_add(u64::from(len)) <= va.checked_add(u64::from(olen))
        && skipped + u64::from(npkts) <= u64::from(c.npkts);
    if rkey != reth.rkey.0 || !inside || qp.resp.queued_responses() > out_cap(qp) {
        return;
    }
    let mem = if len == 0 {
        MemRef::nothing(rkey)
    } else {
        match check_rkey(ctx, qp, rkey, reth.va, u64::from(len), Access::REMOTE_READ) {
            Ok(m) if m.serial == serial => m,
            // As for a new READ: the QP no longer enables READs.
            Err(Fault::Nak(NakCode::InvalidRequest)) => {
                nak(qp, ctx, psn, NakCode::InvalidRequest);
                return;
            }
            _ => {
                qp.counters.remote_access_errors += 1;
                nak(qp, ctx, psn, NakCode::RemoteAccessError);
                return;
            }
        }
    };
    qp.counters.responses_replayed += 1;
    let end = psn.add(npkts);
    let fresh = RespOut::Read {
        first_psn: psn,
        npkts,
        sent: 0,
        mem,
        len,
        msn: c.msn,
        replay_end: end,
    };
    qp.resp.queue_read_replay(fresh, c.msn);
}

/// Rule: a duplicate atomic (IBTA vol. 1 §9.7.5): never execute an atomic twice; replay
/// the saved original value. The duplicate must be the same request (same operation and
/// operands), else NAK invalid request (docs/transport.md, "Error classes that differ
/// from rxe"); a full response queue drops it (class D).
fn duplicate_atomic(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    info: &OpInfo,
    psn: Psn,
    at: Option<u64>,
    ext: &ExtHeaders,
) {
    let hit = qp
        .resp
        .cached(at, |k| matches!(k, CachedKind::Atomic { .. }));
    if let Some(Cached {
        kind:
            CachedKind::Atomic {
                orig,
                req,
                cmp_swap,
            },
        msn,
        ..
    }) = hit
    {
        let same = Some(req) == ext.atomic && cmp_swap == (info.operation == Operation::CmpSwap);
        if same && qp.resp.queued_responses() >= out_cap(qp) {
            // Full: dropped like a duplicate READ past the bound (class D).
        } else if same {
            qp.counters.responses_replayed += 1;
            qp.resp.queue_response(RespOut::Atomic {
                psn,
                orig,
                msn,
                replay: true,
            });
        } else {
            qp.counters.invalid_requests += 1;
            nak(qp, ctx, psn, NakCode::InvalidRequest);
        }
    }
}

/// Rule: a duplicate SEND/WRITE (IBTA vol. 1 §9.7.5, C9-105): not executed again; ACK
/// the newest SEND/WRITE PSN executed, so the requester learns how far we are. Never
/// the PSN of a READ or atomic: that ACK would tell the requester a READ or atomic
/// completed without its response (rxe "IB/rxe: fix for duplicate request processing
/// and ack psns").
fn duplicate_send_write(qp: &mut Qp) {
    let (p, m) = (qp.resp.ack_psn(), qp.resp.msn());
    let cap = out_cap(qp);
    qp.resp.push_ack(cap, p, Syndrome::ACK_UNLIMITED, m, true);
}

/// Rule: the QP's own access flags gate remote operations (IBTA vol. 1 §10.2,
/// `ibv_qp_attr.qp_access_flags`; rxe `check_op_valid`). An operation the QP does not
/// enable is an invalid request (an operation this receive queue does not support,
/// §9.7.5.2 NAK codes), not a memory protection fault: the requester sees
/// REM_INV_REQ_ERR.
fn check_op_valid(qp: &Qp, need: Access) -> Result<(), Fault> {
    if !qp.attr.qp_access_flags.contains(need) {
        return Err(Fault::Nak(NakCode::InvalidRequest));
    }
    Ok(())
}

/// Rule: the R_Key, range and rights of a remote access (IBTA vol. 1 §10.6, §9.7.5;
/// rxe `check_rkey`), after [`check_op_valid`]: the region's rights, bounds and PD, else
/// NAK remote access error.
fn check_rkey(
    ctx: &Ctx<'_>,
    qp: &Qp,
    rkey: u32,
    va: u64,
    len: u64,
    need: Access,
) -> Result<MemRef, Fault> {
    check_op_valid(qp, need)?;
    ctx.mem
        .check(qp.pd, rkey, va, len, need)
        .map_err(|_: AccessError| Fault::Nak(NakCode::RemoteAccessError))
}

fn complete_recv(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<u32>,
    inv: Option<crate::wire::Rkey>,
) {
    let Some(wqe) = qp.resp.take_recv() else {
        return;
    };
    qp_event!(
        ctx.now,
        ctx.dev,
        qp.qpn,
        Event::WqeCompleted,
        queue = "rq",
        wr_id = wqe.wr_id,
        status = ?status,
        byte_len = byte_len
    );
    let wc = WorkCompletion {
        wr_id: wqe.wr_id,
        status,
        opcode,
        byte_len,
        imm_data: imm,
        invalidated_rkey: inv,
        qp_num: qp.qpn,
        src_qp: qp.attr.dest_qp_num,
        grh: false,
        sl: 0,
    };
    ctx.complete(qp.recv_cq, wc);
}

pub(crate) fn do_send(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    info: &OpInfo,
    ext: &ExtHeaders,
    payload: &[u8],
) -> Result<u32, Fault> {
    let written = match qp.resp.in_progress() {
        InProgress::Send { written } => written,
        _ => 0,
    };
    take_srq_wqe(qp, ctx);
    let Some(wqe) = qp.resp.head_recv() else {
        return Err(Fault::Rnr);
    };
    let segs = match &wqe.segs {
        Ok(s) => s,
        Err(st) => {
            // A receive with a bad local key: it completes in error and the requester
            // sees a remote operational error (§9.7.5, class B).
            let st = *st;
            complete_recv(qp, ctx, st, WcOpcode::Recv, 0, None, None);
            return Err(Fault::Nak(NakCode::RemoteOperationalError));
        }
    };
    if u64::from(written) + payload.len() as u64 > wqe.len {
        // The message is longer than the receive buffer: LOC_LEN_ERR here, invalid
        // request at the requester (as rxe does).
        complete_recv(
            qp,
            ctx,
            WcStatus::LocLenErr,
            WcOpcode::Recv,
            written,
            None,
            None,
        );
        return Err(Fault::Nak(NakCode::InvalidRequest));
    }
    if !scatter(ctx.mem, segs, written as usize, payload) {
        if segs.iter().any(|s| ctx.mem.owner_gone(s.mem)) {
            return Err(Fault::Gone);
        }
        complete_recv(
            qp,
            ctx,
            WcStatus::LocProtErr,
            WcOpcode::Recv,
            written,
            None,
            None,
        );
        return Err(Fault::Nak(NakCode::RemoteOperationalError));
    }
    let written = written + payload.len() as u32;
    if info.segment.ends() {
        let mut inv = None;
        if let Some(rkey) = ext.ieth {
            // Only memory windows and fast-registered regions can be invalidated
            // remotely, and this engine has neither: this fails (see
            // `MemTable::invalidate`), and the receive completes REM_INV_REQ_ERR (rxe
            // `RESPST_ERR_INVALIDATE_RKEY`, class J).
            if ctx.mem.invalidate(qp.pd, rkey).is_err() {
                complete_recv(
                    qp,
                    ctx,
                    WcStatus::RemInvReqErr,
                    WcOpcode::Recv,
                    written,
                    None,
                    None,
                );
                return Err(Fault::Invalidate);
            }
            inv = Some(rkey);
        }
        qp.resp.complete_message();
        complete_recv(
            qp,
            ctx,
            WcStatus::Success,
            WcOpcode::Recv,
            written,
            ext.immdt,
            inv,
        );
    } else {
        qp.resp.continue_message(InProgress::Send { written });
    }
    Ok(1)
}

#[inline(always)]
pub(crate) fn do_write(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    info: &OpInfo,
    ext: &ExtHeaders,
    payload: &[u8],
) -> Result<u32, Fault> {
    let (mem, dma_len, written) = match (qp.resp.in_progress(), ext.reth) {
        (
            InProgress::Write {
                mem,
                dma_len,
                written,
            },
            _,
        ) => (mem, dma_len, written),
        (_, Some(reth)) => {
            // A zero-length WRITE touches nothing and checks no R_Key (rxe and hardware designs skip the R_Key check for a zero-length WRITE).
            let mem = if reth.dma_len == 0 {
                None
            } else {
                Some(check_rkey(
                    ctx,
                    qp,
                    reth.rkey.0,
                    reth.va,
                    u64::from(reth.dma_len),
                    Access::REMOTE_WRITE,
                )?)
            };
            (mem, reth.dma_len, 0)
        }
        _ => return Err(Fault::Nak(NakCode::InvalidRequest)),
    };
    let n = payload.len() as u32;
    let total = written
        .checked_add(n)
        .ok_or(Fault::Nak(NakCode::InvalidRequest))?;
    // More bytes than the RETH announced, or fewer at the end: invalid request (IBTA §9.7.5 length validation).
    if total > dma_len || (info.segment.ends() && total != dma_len) {
        return Err(Fault::Nak(NakCode::InvalidRequest));
    }
    let imm = info.exts.has(crate::wire::Ext::ImmDt);
    if imm {
        take_srq_wqe(qp, ctx);
    }
    if imm && qp.resp.rq_len() == 0 {
        // WRITE with immediate needs a receive WQE for its completion.
        return Err(Fault::Rnr);
    }
    if n > 0 {
        let m = mem.ok_or(Fault::Nak(NakCode::InvalidRequest))?;
        if !ctx.mem.write(m, written as usize, payload) {
            if ctx.mem.owner_gone(m) {
                return Err(Fault::Gone);
            }
            return Err(Fault::Nak(NakCode::RemoteAccessError));
        }
    }
    if info.segment.ends() {
        qp.resp.complete_message();
        if imm {
            complete_recv(
                qp,
                ctx,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                total,
                ext.immdt,
                None,
            );
        }
    } else if let Some(InProgress::Write { written: w, .. }) = qp.resp.in_progress_mut() {
        // A MIDDLE (the message in progress is this one, taken from `cur` above): only
        // the count moves.
        *w = total;
    } else {
        qp.resp.continue_message(InProgress::Write {
            mem,
            dma_len,
            written: total,
        });
    }
    Ok(1)
}

/// The most READ/atomic responses not sent yet (for new requests) one QP holds: past it,
/// NAK invalid request. The advertised bound is max_dest_rd_atomic, but rxe serves a
/// requester past it (see [`rd_atomic_admit`]); no requester can be set to keep more than
/// 255 outstanding (`ibv_qp_attr.max_rd_atomic` is a u8, as the CM's initiator depth),
/// so a peer within its own settings never meets this cap. It bounds memory only.
pub(crate) const RD_ATOMIC_HARD_CAP: usize = u8::MAX as usize;

/// The bound of a QP's response queue (`Responder::out`): what a peer can make the
/// responder hold by sending requests faster than it takes the answers. Room for each
/// READ/atomic response in use (at least max_dest_rd_atomic of them) and one ACK after
/// each, plus room for duplicates' replays; a fatal NAK is never dropped (`usize::MAX`).
/// At most `2 * RD_ATOMIC_HARD_CAP + 4` entries.
fn out_cap(qp: &Qp) -> usize {
    2 * qp
        .resp
        .rd_atomic_in_use()
        .max(usize::from(qp.attr.max_dest_rd_atomic))
        + 4
}

/// Admission of a new READ/atomic (IBTA vol. 1 §9.7.5.1, responder resources: a
/// requester keeps at most the responder's max_dest_rd_atomic outstanding). With
/// max_dest_rd_atomic 0 there are none: NAK invalid request, as rxe `check_resource`
/// (RESPST_ERR_TOO_MANY_RDMA_ATM_REQ). Past max_dest_rd_atomic in use, rxe does not
/// refuse ("it is the requesters job ... we just recycle the responder resource queue":
/// `rxe_prepare_res` reuses the oldest of its max_dest_rd_atomic resources), and a perftest
/// requester on rxe may keep more outstanding than xrnic advertises; so it is served,
/// counted in `rd_atomic_over_limit` (true here: the caller counts it once the request
/// passed its other checks), and `cache_push` recycles the oldest cached entry. Only past
/// [`RD_ATOMIC_HARD_CAP`]: NAK invalid request.
fn rd_atomic_admit(qp: &Qp) -> Result<bool, Fault> {
    if qp.attr.max_dest_rd_atomic == 0 {
        return Err(Fault::Nak(NakCode::InvalidRequest));
    }
    let in_use = qp.resp.rd_atomic_in_use();
    if in_use >= RD_ATOMIC_HARD_CAP {
        return Err(Fault::Nak(NakCode::InvalidRequest));
    }
    Ok(in_use >= usize::from(qp.attr.max_dest_rd_atomic))
}

/// Make room in the response cache: it holds at most max_dest_rd_atomic entries (rxe's
/// ring of max_dest_rd_atomic resources); a requester within the bound never has more
/// outstanding, so the oldest is no longer needed. One past it loses the oldest's replay
/// (its duplicate is dropped, class D), as on rxe.
fn cache_push(qp: &mut Qp, c: Cached) {
    let cap = usize::from(qp.attr.max_dest_rd_atomic.max(1));
    qp.resp.cache_response(c, cap);
}

fn do_read(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn, ext: &ExtHeaders) -> Result<u32, Fault> {
    let over = rd_atomic_admit(qp)?;
    let reth = ext.reth.ok_or(Fault::Nak(NakCode::InvalidRequest))?;
    if reth.dma_len > 1 << 31 {
        return Err(Fault::Nak(NakCode::InvalidRequest));
    }
    let mem = if reth.dma_len == 0 {
        MemRef::nothing(reth.rkey.0)
    } else {
        check_rkey(
            ctx,
            qp,
            reth.rkey.0,
            reth.va,
            u64::from(reth.dma_len),
            Access::REMOTE_READ,
        )?
    };
    let npkts = reth.dma_len.div_ceil(qp.attr.path_mtu.bytes()).max(1);
    qp.counters.rd_atomic_over_limit += u64::from(over);
    let msn = qp.resp.complete_message();
    let end_count = qp.resp.psn_count() + u64::from(npkts);
    cache_push(
        qp,
        Cached {
            npkts,
            end_count,
            msn,
            kind: CachedKind::Read {
                rkey: reth.rkey.0,
                va: reth.va,
                len: reth.dma_len,
                serial: mem.serial,
            },
        },
    );
    qp.resp.queue_response(RespOut::Read {
        first_psn: psn,
        npkts,
        sent: 0,
        mem,
        len: reth.dma_len,
        msn,
        replay_end: psn,
    });
    Ok(npkts)
}

fn do_atomic(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    info: &OpInfo,
    psn: Psn,
    ext: &ExtHeaders,
) -> Result<u32, Fault> {
    let over = rd_atomic_admit(qp)?;
    let a = ext.atomic.ok_or(Fault::Nak(NakCode::InvalidRequest))?;
    // The target must be 8-byte aligned (IBTA §9.4). xrnic NAKs a misaligned one as a
    // remote access error; rxe sends NAK invalid request instead
    // (`RESPST_ERR_MISALIGNED_ATOMIC`): the choice and its reason are in docs/transport.md
    // ("Error classes that differ from rxe").
    if a.va % 8 != 0 {
        return Err(Fault::Nak(NakCode::RemoteAccessError));
    }
    let m = check_rkey(ctx, qp, a.rkey.0, a.va, 8, Access::REMOTE_ATOMIC)?;
    // Atomics act on a 64-bit word in host byte order, as the CPU would see it.
    let cmp = (info.operation == Operation::CmpSwap).then_some(a.compare);
    let Some(orig) = ctx.mem.atomic(m, cmp, a.swap_add) else {
        if ctx.mem.owner_gone(m) {
            return Err(Fault::Gone);
        }
        return Err(Fault::Nak(NakCode::RemoteAccessError));
    };
    qp.counters.atomics_executed += 1;
    qp.counters.rd_atomic_over_limit += u64::from(over);
    let msn = qp.resp.complete_message();
    let end_count = qp.resp.psn_count() + 1;
    cache_push(
        qp,
        Cached {
            npkts: 1,
            end_count,
            msn,
            kind: CachedKind::Atomic {
                orig,
                req: a,
                cmp_swap: info.operation == Operation::CmpSwap,
            },
        },
    );
    qp.resp.queue_response(RespOut::Atomic {
        psn,
        orig,
        msn,
        replay: false,
    });
    Ok(1)
}

/// Give `qp` a receive WQE from its SRQ when it uses one and holds none: called by the
/// responder right before it needs a WQE for an in-sequence message (rxe
/// `check_resource` → `get_srq_wqe`). Raises the limit event when due.
fn take_srq_wqe(qp: &mut Qp, ctx: &mut Ctx<'_>) {
    let Some(srq) = qp.init.srq else { return };
    if qp.resp.rq_len() != 0 {
        return;
    }
    let Some(Some(s)) = ctx.srqs.get_mut(srq.0 as usize) else {
        return;
    };
    let Some(wqe) = s.rq.pop_front() else { return };
    qp_event!(
        ctx.now,
        ctx.dev,
        qp.qpn,
        Event::SrqWqeTaken,
        srq = srq.0,
        wr_id = wqe.wr_id,
        left = s.rq.len()
    );
    qp.resp.post_recv(wqe);
    if s.limit > 0 && (s.rq.len() as u32) < s.limit {
        s.limit = 0;
        ctx.raise(AsyncEvent::SrqLimitReached(srq));
    }
}
