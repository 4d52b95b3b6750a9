//! The completer: processes ACKs, NAKs, RNR NAKs, READ responses and atomic ACKs, completes
//! send work requests in order, and drives retransmission (IBTA vol. 1 §9.7.4 requester
//! response handling, §9.7.5 ACK/NAK semantics, §9.7.6 timers; rxe's `rxe_comp.c`).
//!
//! Contract: completions leave strictly in posting order. A response for PSN `p` implicitly
//! acknowledges every PSN before it (§9.7.5 coalesced ACKs); when that skips over a
//! READ or atomic whose response has not arrived, it is an implied NAK (§9.7.4) and
//! the requester goes back to the missing PSN. Each Go-Back-N cause (sequence NAK,
//! implied NAK) retransmits once per PSN until progress; timeouts always do. retry_cnt
//! bounds timeouts and sequence NAKs, rnr_retry bounds RNR NAKs (7 = forever); both are
//! refilled by progress. Exhaustion or a fatal NAK completes the WR in error and moves the
//! QP to ERR, which flushes the rest.

use crate::wire::{ExtHeaders, NakCode, OpInfo, Operation, Psn, Syndrome, aeth_credits};

use super::Ctx;
use super::cq::WcStatus;
use super::memory::scatter;
use super::qp::{Qp, QpState};
use super::time::Instant;
use super::timers::{Timer, rnr_timer};
use super::trace::{Event, TxReason, qp_event};

/// Why the completer goes back.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cause {
    SeqNak,
    Implied,
}

/// Handle one response packet (ACK, atomic ACK, READ response) addressed to `qp`: the
/// completer's steps in the order IBTA vol. 1 §9.7.4/§9.7.5 and rxe's `rxe_comp.c`
/// (`enum comp_state`) give them, each a function named after its rule.
pub(crate) fn handle_response(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    info: &OpInfo,
    psn: Psn,
    ext: &ExtHeaders,
    payload: &[u8],
) {
    if !check_qp_state(qp) {
        return;
    }
    let syndrome = ext.aeth.map(|a| a.syndrome);
    if !check_psn_sent(qp, psn) {
        return;
    }
    take_credits(qp, ctx, syndrome);
    if !check_psn_new(qp, psn) || !check_ack(qp, ctx, info, psn, syndrome) {
        return;
    }
    match info.operation {
        Operation::Ack => match syndrome {
            Some(Syndrome::Ack { .. }) => {
                qp.counters.acks_received += 1;
                ack_through(qp, ctx, psn);
            }
            Some(Syndrome::Nak(code)) => nak_received(qp, ctx, psn, code),
            Some(Syndrome::RnrNak { timer }) => rnr_nak_received(qp, ctx, psn, timer),
            _ => qp.counters.dropped_wrong_state += 1,
        },
        Operation::AtomicAck => do_atomic(qp, ctx, psn, ext),
        Operation::ReadResponse => do_read(qp, ctx, info, psn, payload),
        _ => qp.counters.dropped_wrong_state += 1,
    }
}

/// Rule: only a QP in RTS or SQD takes responses (IBTA vol. 1 §10.3 QP states; rxe
/// `rxe_rcv` → `check_type_state`); else drop, `dropped_wrong_state`.
fn check_qp_state(qp: &mut Qp) -> bool {
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
        qp.counters.dropped_wrong_state += 1;
        return false;
    }
    true
}

/// Rule: a response to a PSN never sent is ignored (a "ghost" ACK, IBTA vol. 1 §9.7.4
/// response PSN validation; rxe `check_psn`), counted `ghost_responses`.
fn check_psn_sent(qp: &mut Qp, psn: Psn) -> bool {
    if !qp.req.sent(psn) {
        qp.counters.ghost_responses += 1;
        return false;
    }
    true
}

/// Rule: the credits of any ACK's AETH, duplicate or not, when the device honours them
/// (IBTA vol. 1 §9.7.7 end-to-end flow control, table 46 credit codes).
fn take_credits(qp: &mut Qp, ctx: &Ctx<'_>, syndrome: Option<Syndrome>) {
    if let Some(Syndrome::Ack { credit_code }) = syndrome {
        if ctx.cfg.honour_credits {
            qp.req.set_credits(aeth_credits(credit_code));
        }
    }
}

/// Rule: a response for a PSN already acknowledged is a duplicate (IBTA vol. 1 §9.7.4;
/// rxe `check_psn` → COMPST_EXIT), counted `duplicate_response`.
fn check_psn_new(qp: &mut Qp, psn: Psn) -> bool {
    if psn.before(qp.req.una()) {
        qp.counters.duplicate_response += 1;
        return false;
    }
    true
}

/// Rule: an atomic ACK and a READ response FIRST/LAST/ONLY carry an AETH that must be an
/// ACK (IBTA vol. 1 §9.7.5; rxe `check_ack` returns COMPST_ERROR for any other
/// syndrome): a NAK there fails the WR at that PSN like a NAK in an ACK would. Returns
/// false when the packet was such a NAK.
fn check_ack(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    info: &OpInfo,
    psn: Psn,
    syndrome: Option<Syndrome>,
) -> bool {
    if !matches!(
        info.operation,
        Operation::AtomicAck | Operation::ReadResponse
    ) {
        return true;
    }
    let Some(syn @ (Syndrome::Nak(_) | Syndrome::RnrNak { .. } | Syndrome::Reserved(_))) = syndrome
    else {
        return true;
    };
    qp.counters.naks_received += 1;
    qp_event!(ctx.now, ctx.dev, qp.qpn, Event::NakInResponse, psn = psn.value(), syndrome = ?syn);
    if !before_response(qp, ctx, psn) {
        return false;
    }
    let status = match syn {
        Syndrome::Nak(NakCode::InvalidRequest) => WcStatus::RemInvReqErr,
        Syndrome::Nak(NakCode::RemoteAccessError) => WcStatus::RemAccessErr,
        _ => WcStatus::RemOpErr,
    };
    fail(qp, ctx, status);
    false
}

/// Rule: a NAK acknowledges every PSN before its own (IBTA vol. 1 §9.7.5). Returns false
/// when the NAK itself must not be acted on: an implied NAK was raised on the way or the
/// QP failed.
fn ack_before_nak(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn) -> bool {
    if psn != qp.req.una() && ack_through(qp, ctx, psn.sub(1)) {
        return false;
    }
    qp.state_ok()
}

/// Rule: a NAK received (IBTA vol. 1 §9.7.5.2; rxe `check_ack` → COMPST_ERROR_RETRY or
/// COMPST_ERROR): a PSN sequence error goes back to the NAKed PSN (bounded by retry_cnt;
/// ignored during an RNR wait), any other code fails the WR at that PSN: invalid
/// request REM_INV_REQ_ERR, remote access REM_ACCESS_ERR, the rest REM_OP_ERR.
fn nak_received(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn, code: NakCode) {
    qp.counters.naks_received += 1;
    qp_event!(ctx.now, ctx.dev, qp.qpn, Event::NakReceived, psn = psn.value(), syndrome = ?code);
    if code == NakCode::PsnSequenceError {
        qp.counters.packet_seq_err += 1;
    }
    if !ack_before_nak(qp, ctx, psn) {
        return;
    }
    match code {
        NakCode::PsnSequenceError => {
            if qp.req.timers().is_armed(Timer::RnrWait) {
                return;
            }
            go_back(qp, ctx, psn, Cause::SeqNak);
        }
        NakCode::InvalidRequest => fail(qp, ctx, WcStatus::RemInvReqErr),
        NakCode::RemoteAccessError => fail(qp, ctx, WcStatus::RemAccessErr),
        _ => fail(qp, ctx, WcStatus::RemOpErr),
    }
}

/// Rule: an RNR NAK received (IBTA vol. 1 §9.7.5.2.8; rxe COMPST_RNR_RETRY): wait the
/// responder's timer, then resend from the NAKed PSN, at most rnr_retry times (7 =
/// forever); when none is left the WR completes RNR_RETRY_EXC_ERR.
fn rnr_nak_received(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn, timer: u8) {
    qp.counters.rnr_naks_received += 1;
    qp_event!(
        ctx.now,
        ctx.dev,
        qp.qpn,
        Event::RnrNakReceived,
        psn = psn.value(),
        timer_code = timer
    );
    if !ack_before_nak(qp, ctx, psn) {
        return;
    }
    // rnr_retry 7 = retry forever (§9.7.5).
    if qp.attr.rnr_retry != 7 && !qp.req.take_rnr_retry() {
        qp.counters.rnr_nak_retry_err += 1;
        fail(qp, ctx, WcStatus::RnrRetryExcErr);
        return;
    }
    // Wait the responder's timer (table 45), then resend from the NAKed PSN.
    qp.req.wait_rnr(ctx.now, timer, psn);
    qp_event!(
        ctx.now,
        ctx.dev,
        qp.qpn,
        Event::RnrWait,
        from_psn = psn.value(),
        wait_ns = crate::wire::rnr_timer_ns(timer),
        until_ns = (ctx.now + rnr_timer(timer)).as_nanos()
    );
}

/// Rule: an atomic ACK (IBTA vol. 1 §9.7.5, §9.3.7; rxe `do_atomic`): after completing
/// what it implies before it, the original value is written into the head WR's buffer
/// and the WR completes; a buffer that cannot take it fails the WR LOC_PROT_ERR.
fn do_atomic(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn, ext: &ExtHeaders) {
    if !before_response(qp, ctx, psn) {
        return;
    }
    let Some(w) = qp.req.head() else { return };
    if !(w.wr.opcode.is_atomic() && w.first_psn == psn) {
        return;
    }
    let orig = ext.atomic_ack.map(|a| a.orig).unwrap_or(0);
    let ok = match &w.segs {
        Ok(segs) => scatter(ctx.mem, segs, 0, &orig.to_ne_bytes()),
        Err(_) => false,
    };
    qp.counters.acks_received += 1;
    if ok {
        qp.req.head_acked(1);
        progress(qp, ctx);
        qp.complete_send_front(ctx, WcStatus::Success, 8);
    } else {
        fail(qp, ctx, WcStatus::LocProtErr);
    }
}

/// Rule: a READ response (IBTA vol. 1 §9.7.4, §9.7.5; rxe `do_read`): after completing
/// what it implies before it, the response must be the next one of the head READ (a
/// later one is an implied NAK from the first missing, an earlier one a duplicate), of
/// the right segment and length (else REM_OP_ERR); its bytes are scattered into the WR's
/// buffer (else LOC_PROT_ERR), and the last one completes the WR.
fn do_read(qp: &mut Qp, ctx: &mut Ctx<'_>, info: &OpInfo, psn: Psn, payload: &[u8]) {
    if !before_response(qp, ctx, psn) {
        return;
    }
    let mtu = qp.attr.path_mtu.bytes();
    let Some(w) = qp.req.head() else { return };
    if w.wr.opcode != super::wr::WrOpcode::RdmaRead || !w.holds(psn) {
        return;
    }
    let expected = w.first_psn.add(w.acked_pkts);
    if psn.after(expected) {
        // Responses missing within this READ: ask again from the first missing one.
        qp.counters.implied_nak_seq_err += 1;
        go_back(qp, ctx, expected, Cause::Implied);
        return;
    }
    if psn.before(expected) {
        qp.counters.duplicate_response += 1;
        return;
    }
    let k = w.acked_pkts;
    // A READ retried from the middle is answered by a new FIRST..LAST run, and
    // late packets of the old run may still arrive; both carry the same bytes for
    // the same PSN, so only "last or not" and the length are checked. A READ split
    // into parts (super::read_credit) has a LAST at the end of each part.
    let last = w.ends_request(k);
    let off = k as usize * mtu as usize;
    let want_len = (w.len as usize - off.min(w.len as usize)).min(mtu as usize);
    if info.segment.ends() != last || payload.len() != want_len {
        // A response that does not fit the request: the responder is broken;
        // treat it as a remote operational error.
        fail(qp, ctx, WcStatus::RemOpErr);
        return;
    }
    let ok = match &w.segs {
        Ok(segs) => scatter(ctx.mem, segs, off, payload),
        Err(_) => false,
    };
    if !ok {
        fail(qp, ctx, WcStatus::LocProtErr);
        return;
    }
    let Some(w) = qp.req.head() else { return };
    let (acked, len) = (w.acked_pkts + 1, w.len);
    let done = acked == w.npkts;
    qp.req.head_acked(acked);
    progress(qp, ctx);
    if done {
        qp.complete_send_front(ctx, WcStatus::Success, len);
    }
}

/// Complete what a READ response or atomic ACK for `psn` implies before it. Returns false
/// when the packet must be dropped (an implied NAK was raised or the QP failed).
fn before_response(qp: &mut Qp, ctx: &mut Ctx<'_>, psn: Psn) -> bool {
    loop {
        let Some(w) = qp.req.head() else {
            return false;
        };
        if !w.started || w.holds(psn) {
            return qp.state_ok();
        }
        if !w.last_psn().before(psn) {
            return false;
        }
        if w.wr.opcode.is_read_or_atomic() {
            let p = w.first_psn.add(w.acked_pkts);
            qp.counters.implied_nak_seq_err += 1;
            go_back(qp, ctx, p, Cause::Implied);
            return false;
        }
        let len = w.len;
        progress(qp, ctx);
        qp.complete_send_front(ctx, WcStatus::Success, len);
    }
}

/// A positive ACK for `p`: complete every SEND/WRITE up to it. Returns true when an
/// implied NAK was raised (a READ/atomic before `p` lacks its response).
fn ack_through(qp: &mut Qp, ctx: &mut Ctx<'_>, p: Psn) -> bool {
    if p.before(qp.req.una()) {
        return false;
    }
    loop {
        let Some(w) = qp.req.head() else {
            return false;
        };
        if !w.started {
            return false;
        }
        if !w.last_psn().after(p) {
            if w.wr.opcode.is_read_or_atomic() {
                let q = w.first_psn.add(w.acked_pkts);
                qp.counters.implied_nak_seq_err += 1;
                go_back(qp, ctx, q, Cause::Implied);
                return true;
            }
            let len = w.len;
            progress(qp, ctx);
            qp.complete_send_front(ctx, WcStatus::Success, len);
        } else {
            if !w.wr.opcode.is_read_or_atomic() && !w.first_psn.after(p) {
                let n = p.diff(w.first_psn) as u32 + 1;
                if n > w.acked_pkts {
                    qp.req.head_acked(n);
                    progress(qp, ctx);
                }
            }
            return false;
        }
    }
}

/// Forward progress: refill the retry budgets and restart the ACK timer (§9.7.6), and
/// measure how fast the peer acknowledges (the requester's AckReq spacing follows it,
/// `Requester::paced_ack_every`).
fn progress(qp: &mut Qp, ctx: &Ctx<'_>) {
    let a = &qp.attr;
    qp.req
        .progress(ctx.now, a.retry_cnt, a.rnr_retry, a.timeout);
    qp_event!(
        ctx.now,
        ctx.dev,
        qp.qpn,
        Event::PsnWindow,
        una = qp.req.una().value(),
        next_psn = qp.req.next_psn().value(),
        ack_deadline_ns = qp
            .req
            .timers()
            .get(Timer::Retransmit)
            .map(Instant::as_nanos)
    );
}

fn go_back(qp: &mut Qp, ctx: &mut Ctx<'_>, p: Psn, cause: Cause) {
    if qp.req.going_back_from(p) {
        return;
    }
    if cause == Cause::SeqNak && !qp.req.take_retry() {
        qp.counters.retry_exceeded_err += 1;
        fail(qp, ctx, WcStatus::RetryExcErr);
        return;
    }
    let reason = match cause {
        Cause::SeqNak => TxReason::RetransmitNak,
        Cause::Implied => TxReason::RetransmitImplied,
    };
    qp.req.go_back(p, reason);
    qp_event!(ctx.now, ctx.dev, qp.qpn, Event::GoBackN, from_psn = p.value(), cause = ?cause);
}

/// The retransmission timer or the RNR wait expired.
pub(crate) fn handle_timeout(qp: &mut Qp, ctx: &mut Ctx<'_>) {
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
        qp.req.timers_mut().stop_transport();
        return;
    }
    if qp.req.timers_mut().expire(Timer::RnrWait, ctx.now) {
        qp_event!(ctx.now, ctx.dev, qp.qpn, Event::TimerFired, timer = "rnr");
    }
    if qp.req.timers().is_expired(Timer::Retransmit, ctx.now) {
        if !qp.req.outstanding() {
            qp.req.timers_mut().stop(Timer::Retransmit);
            return;
        }
        // §9.7.6: no response within the local ACK timeout: resend from the oldest
        // unacknowledged PSN, at most retry_cnt times.
        qp.counters.local_ack_timeout_err += 1;
        qp_event!(
            ctx.now,
            ctx.dev,
            qp.qpn,
            Event::TimerFired,
            timer = "ack",
            retry_left = qp.req.retry_left()
        );
        if !qp.req.take_retry() {
            qp.counters.retry_exceeded_err += 1;
            fail(qp, ctx, WcStatus::RetryExcErr);
            return;
        }
        let una = qp.req.go_back_on_timeout(ctx.now, qp.attr.timeout);
        qp_event!(
            ctx.now,
            ctx.dev,
            qp.qpn,
            Event::GoBackN,
            from_psn = una.value(),
            cause = "Timeout",
            ack_deadline_ns = qp
                .req
                .timers()
                .get(Timer::Retransmit)
                .map(Instant::as_nanos)
        );
    }
}

/// The head WR failed: complete it with `status`, move the QP to ERR, flush the rest.
fn fail(qp: &mut Qp, ctx: &mut Ctx<'_>, status: WcStatus) {
    qp.complete_send_front(ctx, status, 0);
    qp.enter_error(ctx);
}
