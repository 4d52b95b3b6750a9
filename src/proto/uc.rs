//! Unreliable Connected QPs (IBTA vol. 1 §9.4 operations per service, §9.7 transport
//! functions without the reliability parts, §10.3 state transitions; rxe `check_psn`,
//! `check_op_seq` and the class D/E errors of `rxe_resp.c`).
//!
//! Contract:
//! - Requester: SEND and RDMA WRITE (with and without immediate) only, with the UC
//!   opcodes (RC opcode | 0x20); no AckReq, no ACK timer, no retransmission. A WR
//!   completes when its last packet is handed to the wire ([`wr_allowed`] refuses the
//!   others at `post_send`, EINVAL like rxe's opcode table).
//! - Responder (`handle_request`): no ACK and no NAK is ever sent. A packet whose PSN
//!   is not the expected one, or that does not continue the message in progress, drops
//!   the rest of that message; the next FIRST/ONLY starts a new message and
//!   resynchronises the expected PSN on it. A SEND is delivered whole or not at all: the
//!   receive WQE of a torn SEND is not completed and serves the next SEND (rxe class D1
//!   resets it the same way). The bytes a torn WRITE already placed stay placed (no
//!   undo, as in rxe). Errors that RC turns into NAKs (no receive WQE, bad R_Key, bad
//!   length) drop the message (class D/E). Counters `uc_messages_dropped` and
//!   `uc_packets_dropped` say what was lost.
//!
//! One difference from rxe: rxe's `check_op_seq` also drops a FIRST/ONLY that arrives
//! while a message is in progress (its LAST was lost), which loses that next message
//! too; IBTA §9.4 lets the new message start, and so does this engine.

use crate::wire::{ExtHeaders, OpInfo, Operation, Psn, Segment};

use super::Ctx;
use super::execute;
use super::qp::{AttrMask, Qp, QpState};
use super::responder::InProgress;
use super::trace::{Event, qp_event};
use super::wr::WrOpcode;

/// What an INIT→RTR `modify` of a UC QP sets: the state and the required attributes.
pub const UC_RTR: AttrMask = AttrMask(
    AttrMask::STATE.0
        | AttrMask::AV.0
        | AttrMask::PATH_MTU.0
        | AttrMask::DEST_QPN.0
        | AttrMask::RQ_PSN.0,
);
/// What an RTR→RTS `modify` of a UC QP sets.
pub const UC_RTS: AttrMask = AttrMask(AttrMask::STATE.0 | AttrMask::SQ_PSN.0);

/// Required and optional attributes of one UC transition (the UC column of the Linux
/// `qp_state_table`, IBTA §10.3): no timeout, retry, RNR or RDMA-read attributes.
pub fn transition_rule(from: QpState, to: QpState) -> Option<(AttrMask, AttrMask)> {
    use AttrMask as M;
    use QpState::*;
    let none = M(0);
    let m = |bits: &[M]| bits.iter().fold(none, |a, &b| a | b);
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) => (m(&[M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS]), none),
        (Init, Init) => (none, m(&[M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS])),
        (Init, Rtr) => (
            m(&[M::AV, M::PATH_MTU, M::DEST_QPN, M::RQ_PSN]),
            m(&[M::ALT_PATH, M::ACCESS_FLAGS, M::PKEY_INDEX]),
        ),
        (Rtr, Rts) => (
            M::SQ_PSN,
            m(&[
                M::CUR_STATE,
                M::ALT_PATH,
                M::ACCESS_FLAGS,
                M::PATH_MIG_STATE,
            ]),
        ),
        (Rts, Rts) | (Sqd, Rts) => (
            none,
            m(&[
                M::CUR_STATE,
                M::ACCESS_FLAGS,
                M::ALT_PATH,
                M::PATH_MIG_STATE,
            ]),
        ),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (
            none,
            m(&[
                M::AV,
                M::ALT_PATH,
                M::ACCESS_FLAGS,
                M::PKEY_INDEX,
                M::PATH_MIG_STATE,
            ]),
        ),
        (Sqe, Rts) => (none, M::CUR_STATE),
        _ => return None,
    })
}

/// The operations a UC send queue takes (IBTA §9.4 table: SEND and RDMA WRITE, with
/// immediate; no READ, atomics or SEND with invalidate).
pub const fn wr_allowed(op: WrOpcode) -> bool {
    matches!(
        op,
        WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm
    )
}

fn drop_message(qp: &mut Qp, ctx: &Ctx<'_>, psn: Psn, why: &'static str) {
    if !qp.uc.drop_msg {
        qp.counters.uc_messages_dropped += 1;
        qp_event!(
            ctx.now,
            ctx.dev,
            qp.qpn,
            Event::UcMessageDropped,
            psn = psn.value(),
            why = why
        );
    }
    qp.uc.drop_msg = true;
    qp.resp.abandon_message();
}

/// Handle one UC request packet addressed to `qp`.
pub(crate) fn handle_request(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    info: &OpInfo,
    psn: Psn,
    ext: &ExtHeaders,
    payload: &[u8],
) {
    if !matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
        qp.counters.dropped_wrong_state += 1;
        return;
    }
    execute::comm_est(qp, ctx);
    let starts = info.segment.starts();
    let in_seq = psn == qp.resp.epsn() && !qp.uc.drop_msg;
    if !in_seq && !starts {
        // rxe `check_psn`: a gap (or a message already being dropped) drops the packet
        // and the rest of its message.
        if psn != qp.resp.epsn() {
            qp.counters.out_of_sequence += 1;
        }
        qp.counters.uc_packets_dropped += 1;
        let why = if qp.uc.drop_msg {
            "dropping"
        } else {
            "psn_gap"
        };
        drop_message(qp, ctx, psn, why);
        return;
    }
    if !in_seq && psn != qp.resp.epsn() {
        qp.counters.out_of_sequence += 1;
    }
    // Opcode sequence (rxe `check_op_seq`, UC): MIDDLE/LAST continue a message of the
    // same operation; a FIRST/ONLY always starts a new one.
    let cur = qp.resp.in_progress();
    if starts {
        if cur != InProgress::None && !qp.uc.drop_msg {
            // The LAST of the message in progress was lost: that message is dropped;
            // its receive WQE stays for this one (rxe class D1).
            qp.counters.uc_messages_dropped += 1;
            qp_event!(
                ctx.now,
                ctx.dev,
                qp.qpn,
                Event::UcMessageDropped,
                psn = psn.value(),
                why = "no_last"
            );
        }
        qp.resp.abandon_message();
        qp.uc.drop_msg = false;
    } else {
        let same = matches!(
            (cur, info.operation),
            (InProgress::Send { .. }, Operation::Send)
                | (InProgress::Write { .. }, Operation::Write)
        );
        if !same {
            qp.counters.uc_packets_dropped += 1;
            qp.counters.invalid_requests += 1;
            drop_message(qp, ctx, psn, "opcode_sequence");
            return;
        }
    }
    // Length rule (§9.7.5 applied to UC, rxe `check_length`): class D, dropped.
    let mtu = qp.attr.path_mtu.bytes() as usize;
    let n = payload.len();
    let len_ok = match info.segment {
        Segment::First | Segment::Middle => n == mtu,
        Segment::Last => (1..=mtu).contains(&n),
        Segment::Only => n <= mtu,
    };
    if !len_ok {
        qp.counters.uc_packets_dropped += 1;
        qp.counters.invalid_requests += 1;
        drop_message(qp, ctx, psn, "length");
        qp.resp.resync_epsn(psn.add(1));
        return;
    }
    let result = match info.operation {
        Operation::Send => execute::do_send(qp, ctx, info, ext, payload),
        Operation::Write => execute::do_write(qp, ctx, info, ext, payload),
        // The UC opcode table has no other operations.
        _ => Err(super::Fault::Nak(crate::wire::NakCode::InvalidRequest)),
    };
    // The PSN is consumed whatever became of the packet: the next one is expected.
    qp.resp.resync_epsn(psn.add(1));
    if let Err(super::Fault::Gone) = result {
        execute::owner_gone(qp, ctx, psn);
        return;
    }
    if let Err(f) = result {
        qp.counters.uc_packets_dropped += 1;
        let why = match f {
            super::Fault::Rnr => {
                qp.counters.out_of_buffer += 1;
                "no_receive_wqe"
            }
            super::Fault::Nak(crate::wire::NakCode::RemoteAccessError) => {
                qp.counters.remote_access_errors += 1;
                "remote_access"
            }
            _ => {
                qp.counters.invalid_requests += 1;
                "invalid"
            }
        };
        drop_message(qp, ctx, psn, why);
    }
}

/// After a UC requester packet went to the wire: the packets sent count as done (no ACK
/// will come; the PSN window must not close on them), and every WR whose last packet
/// went out completes successfully (IBTA §9.4: UC completes on transmission; rxe
/// `rxe_requester` completes UC WQEs once sent).
pub(crate) fn packet_sent(qp: &mut Qp, ctx: &mut Ctx<'_>) {
    qp.req.sent_counts_as_acked();
    while let Some(len) = qp.req.head_sent_len() {
        qp.complete_send_front(ctx, super::cq::WcStatus::Success, len);
    }
}
