//! Unreliable Datagram QPs (IBTA vol. 1 §9.8.2 datagrams, §10.2.5 Q_Keys) and the GSI
//! QP (QP1, §13.5.1), sans-IO like the rest of the engine.
//!
//! Contract:
//! - A UD QP goes RESET → INIT (P_Key index, port, Q_Key) → RTR → RTS (SQ PSN) by the
//!   rules of [`check_modify_ud`] (the UD rows of IBTA §10.3, as ib_core's
//!   `ib_modify_qp_is_ok` encodes them); it has no peer, no path MTU, no ACKs, no timers.
//! - [`Rnic::post_send_ud`] takes SEND or SEND with immediate and a [`UdDest`]: the
//!   address handle, the remote QPN and Q_Key. Each WR becomes one SEND ONLY (0x64) or
//!   SEND ONLY WITH IMMEDIATE (0x65) frame with a DETH (Q_Key, our QPN); a Q_Key with the
//!   high bit set means the QP's own Q_Key (§10.2.5, rxe `init_req_packet`). A message
//!   longer than the port MTU ([`super::Config::port_mtu`]) sends nothing and completes
//!   successfully, as IBTA C10-93.1.1 asks and rxe does (`rxe_req.c`: the overlong UD send is
//!   faked); [`UdCounters::too_long_not_sent`] counts it.
//! - Receiving: a datagram whose DETH Q_Key is not the QP's is dropped and counted
//!   (rxe `check_keys`); so is one with no receive WQE posted (no RNR for UD, rxe
//!   `RESPST_ERR_RNR`). The buffer gets the 40-byte GRH first, as rxe writes it
//!   (`rxe_resp.c`, `build_rdma_network_hdr`): for IPv4 20 zero bytes and then the
//!   20-byte IPv4 header of the frame, for IPv6 the IPv6 header; then the payload. The
//!   completion has `src_qp` (DETH), `grh`, `byte_len` = 40 + payload, and the immediate.
//!   A buffer too small completes LOC_LEN_ERR (rxe class D) and the QP carries on.
//! - Loss, duplication and reordering are the application's business: nothing is
//!   retransmitted or acknowledged, every datagram stands alone, from any peer.
//!
//! The UD service of one QP lives here (below `device` in the import order,
//! tests/layering.rs); the device's UD verbs call it with the QP and its context.
//!
//! [`Rnic::post_send_ud`]: super::Rnic::post_send_ud

use crate::wire::{
    BthFields, BthRepr, DethRepr, Ext, ExtHeaders, FrameTemplate, FrameView, Opcode, Psn, Qpn,
    UdpRepr,
};

use super::Ctx;
use super::cq::{WcOpcode, WcStatus, WorkCompletion, roce_v2_sl};
use super::framing::av_addrs;
use super::memory::Access;
use super::memory::{LocalSeg, Segs, resolve_sges, scatter};
use super::qp::{
    AttrMask, Qp, QpState, QpType, UdWqe, VerbsError, complete_ud_send as complete_send,
};
pub use super::qp::{UdCounters, UdDest};
use super::time::Instant;
use super::trace::{Event, TxReason, qp_event};
use super::verdict::RxVerdict;
use super::wr::{SendFlags, SendWr, WrOpcode};

/// The QPN of the General Services Interface QP (IBTA §13.5.1).
pub const GSI_QPN: Qpn = Qpn::new(1);

/// The well-known Q_Key of QP1 (IBTA §13.5.1 / ib_core `IB_QP1_QKEY`); rxe checks
/// datagrams to QP1 against it (`check_keys`).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// The P_Key table: one entry, the default full-membership key (the key every QP sends).
pub(crate) const PKEY_TABLE: [u16; 1] = [crate::wire::PKey::DEFAULT.0];

/// The GRH at the start of every UD receive buffer (`sizeof(struct ibv_grh)`).
pub const GRH_LEN: usize = 40;

/// Required and optional attributes of one UD transition, or `None` if it is invalid
/// (IBTA §10.3; ib_core `qp_state_table`, the IB_QPT_UD entries).
pub fn transition_rule_ud(from: QpState, to: QpState) -> Option<(AttrMask, AttrMask)> {
    use AttrMask as M;
    use QpState::*;
    let none = M(0);
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) => (M::PKEY_INDEX | M::PORT | M::QKEY, none),
        (Init, Init) => (none, M::PKEY_INDEX | M::PORT | M::QKEY),
        (Init, Rtr) => (none, M::PKEY_INDEX | M::QKEY),
        (Rtr, Rts) => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
        (Rts, Rts) | (Sqd, Rts) | (Sqe, Rts) => (none, M::CUR_STATE | M::QKEY),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (none, M::PKEY_INDEX | M::QKEY),
        _ => return None,
    })
}

/// `check_modify` for a UD QP: the legal target state, or why not.
pub fn check_modify_ud(
    cur: QpState,
    attr: &super::qp::QpAttr,
    mask: AttrMask,
) -> Result<QpState, VerbsError> {
    let to = if mask.contains(AttrMask::STATE) {
        attr.qp_state
    } else {
        cur
    };
    if mask.contains(AttrMask::CUR_STATE) && attr.cur_qp_state != cur {
        return Err(VerbsError::CurrentStateMismatch);
    }
    let (req, opt) =
        transition_rule_ud(cur, to).ok_or(VerbsError::InvalidTransition { from: cur, to })?;
    let given = mask.without(AttrMask::STATE);
    let missing = req.without(given);
    if missing.0 != 0 {
        return Err(VerbsError::MissingAttributes(missing));
    }
    let extra = given.without(req.union(opt));
    if extra.0 != 0 {
        return Err(VerbsError::UnexpectedAttributes(extra));
    }
    if given.contains(AttrMask::PORT) && attr.port_num != 1 {
        return Err(VerbsError::InvalidValue("port_num must be 1"));
    }
    if given.contains(AttrMask::PKEY_INDEX) && usize::from(attr.pkey_index) >= PKEY_TABLE.len() {
        return Err(VerbsError::InvalidValue(
            "only P_Key index 0 (0xffff) exists",
        ));
    }
    Ok(to)
}

/// The next frame of a UD QP, if its send queue has one ready.
pub(crate) fn transmit(
    qp: &mut Qp,
    ctx: &mut Ctx<'_>,
    scratch: &mut Vec<u8>,
    buf: &mut [u8],
) -> Option<(usize, TxReason)> {
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
        return None;
    }
    let mtu = ctx.cfg.port_mtu.bytes();
    loop {
        let w = qp.ud.sq.pop_front()?;
        let segs = match &w.segs {
            Ok(s) => s,
            Err(st) => {
                // A local error (bad key, region gone): the WR fails and the QP goes to
                // ERR, as for RC (IBTA §10.8.3.3, rxe `rxe_completer` on a local error).
                complete_send(qp, ctx, &w, *st);
                qp.enter_error(ctx);
                return None;
            }
        };
        let psn = qp.req.take_psn();
        if w.len > mtu {
            // C10-93.1.1: nothing is emitted and no error is reported (rxe_req.c fakes
            // the send).
            qp.ud.counters.too_long_not_sent += 1;
            complete_send(qp, ctx, &w, WcStatus::Success);
            continue;
        }
        scratch.clear();
        scratch.resize(w.len as usize, 0);
        if !gather(ctx, segs, scratch) {
            complete_send(qp, ctx, &w, WcStatus::LocProtErr);
            qp.enter_error(ctx);
            return None;
        }
        let qkey = if w.dest.remote_qkey & 0x8000_0000 != 0 {
            qp.attr.qkey
        } else {
            w.dest.remote_qkey
        };
        let (eth, ip) = av_addrs(ctx.cfg, &w.dest.av);
        let opcode = if w.imm.is_some() {
            Opcode::UD_SEND_ONLY_IMM
        } else {
            Opcode::UD_SEND_ONLY
        };
        let t = FrameTemplate::new(
            eth,
            ip,
            UdpRepr {
                src_port: qp.src_port,
                checksum: 0,
            },
            &BthRepr::new(opcode, w.dest.remote_qpn, Psn::new(0)),
        );
        let ext = ExtHeaders {
            deth: Some(DethRepr {
                qkey,
                src_qp: qp.qpn,
            }),
            immdt: w.imm,
            ..ExtHeaders::NONE
        };
        // AckReq set as rxe sets it on every last/only packet, UD included
        // (`init_req_packet`; seen in its captures); a UD receiver ignores it.
        let len = t
            .emit(
                BthFields {
                    opcode,
                    psn,
                    ack_req: true,
                    solicited: w.solicited,
                },
                &ext,
                scratch,
                buf,
            )
            .ok();
        qp_event!(
            ctx.now,
            ctx.dev,
            qp.qpn,
            Event::UdSent,
            wr_id = w.wr_id,
            dest_qp = w.dest.remote_qpn.value(),
            len = w.len
        );
        complete_send(
            qp,
            ctx,
            &w,
            if len.is_some() {
                WcStatus::Success
            } else {
                WcStatus::LocQpOpErr
            },
        );
        let l = len?;
        qp.ud.counters.datagrams_sent += 1;
        qp.counters.packets_sent += 1;
        qp.counters.bytes_sent += l as u64;
        return Some((l, TxReason::Request));
    }
}

/// Copy the bytes of `segs` into `out` (its length); false if a region went away.
fn gather(ctx: &Ctx<'_>, segs: &[LocalSeg], out: &mut [u8]) -> bool {
    let mut at = 0;
    for s in segs {
        let n = s.len as usize;
        let Some(dst) = out.get_mut(at..at + n) else {
            return false;
        };
        if n > 0 && !ctx.mem.read(s.mem, 0, dst) {
            return false;
        }
        at += n;
    }
    at == out.len()
}

/// Source and destination GIDs of a received GRH (the 40 bytes before a UD payload):
/// for RoCE v2 over IPv4 the last 20 bytes are the IPv4 header (rxe's layout), else the
/// IPv6 header ([`grh_of`] writes it). `None` when `g` is shorter than a GRH.
pub fn grh_gids(g: &[u8]) -> Option<([u8; 16], [u8; 16])> {
    if g.len() < GRH_LEN {
        return None;
    }
    let mut s = [0u8; 16];
    let mut d = [0u8; 16];
    if g[20] >> 4 == 4 && g[..20] == [0u8; 20] {
        s[10] = 0xff;
        s[11] = 0xff;
        d[10] = 0xff;
        d[11] = 0xff;
        s[12..].copy_from_slice(&g[32..36]);
        d[12..].copy_from_slice(&g[36..40]);
    } else {
        s.copy_from_slice(&g[8..24]);
        d.copy_from_slice(&g[24..40]);
    }
    Some((s, d))
}

/// The 40 bytes a UD receive buffer starts with, from the IP header of the frame
/// (rxe `build_rdma_network_hdr`: the IPv4 header in the last 20 bytes of `union
/// rdma_network_hdr`, the IPv6 header as the whole GRH).
pub fn grh_of(view: &FrameView<'_>) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    let h = view.ip_header();
    if view.is_ipv6() {
        let n = h.len().min(GRH_LEN);
        g[..n].copy_from_slice(&h[..n]);
    } else {
        // `struct iphdr` without options: 20 bytes.
        let n = h.len().min(20);
        g[20..20 + n].copy_from_slice(&h[..n]);
    }
    g
}

/// The rest of `Rnic::post_send_ud` once QP `qp` is found: checks the WR against the UD
/// rules (rxe `validate_send_wr`) and queues it; `max_wr` is the device's `max_qp_wr`,
/// `ngids` the size of its GID table.
pub(crate) fn post_send(
    qp: &mut Qp,
    mut ctx: Ctx<'_>,
    wr: SendWr,
    dest: &UdDest,
    max_wr: u32,
    ngids: usize,
) -> Result<(), VerbsError> {
    let qpn = qp.qpn;
    if qp.init.qp_type != QpType::Ud {
        return Err(VerbsError::InvalidValue(
            "post_send_ud on a QP that is not UD",
        ));
    }
    let imm = match wr.opcode {
        WrOpcode::Send => None,
        WrOpcode::SendWithImm => Some(wr.imm_data),
        // rxe `validate_send_wr`: UD carries only SENDs (EINVAL).
        _ => {
            return Err(VerbsError::InvalidValue(
                "UD QPs send only SEND (with immediate)",
            ));
        }
    };
    if usize::from(dest.av.sgid_index) >= ngids {
        return Err(VerbsError::InvalidValue("sgid_index beyond the GID table"));
    }
    if dest.av.flow_label > 0xf_ffff {
        return Err(VerbsError::InvalidValue("flow_label is 20 bits"));
    }
    let len64: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
    let mut w = UdWqe {
        wr_id: wr.wr_id,
        signaled: wr.send_flags.contains(SendFlags::SIGNALED),
        imm,
        solicited: wr.send_flags.contains(SendFlags::SOLICITED),
        segs: Ok(Segs::new()),
        len: len64.min(u64::from(u32::MAX)) as u32,
        dest: *dest,
    };
    match qp.state {
        QpState::Rts | QpState::Sqd => {}
        QpState::Err => {
            complete_send(qp, &mut ctx, &w, WcStatus::WrFlushErr);
            return Ok(());
        }
        s => return Err(VerbsError::WrongState(s)),
    }
    if qp.ud.sq.len() >= qp.init.max_send_wr.min(max_wr) as usize {
        return Err(VerbsError::QueueFull);
    }
    w.segs = resolve_sges(ctx.mem, qp.pd, &wr.sg_list, Access::NONE);
    qp_event!(
        ctx.now,
        ctx.dev,
        qpn,
        Event::WqePosted,
        queue = "sq",
        wr_id = wr.wr_id,
        opcode = ?wr.opcode,
        len = len64
    );
    qp.ud.sq.push_back(w);
    Ok(())
}

/// The rest of `Rnic::handle_ud` once the datagram's QP (in `slot`) is found: its
/// verdict, and `slot` when the verdict was reached at the QP (the caller counts both).
pub(crate) fn receive(
    qp: &mut Qp,
    mut ctx: Ctx<'_>,
    slot: usize,
    now: Instant,
    view: &FrameView<'_>,
) -> (RxVerdict, Option<usize>) {
    // A UD packet for a connected QP is not this QP's (rxe `check_type_state`).
    if qp.init.qp_type != QpType::Ud {
        return (RxVerdict::UnknownQp, None);
    }
    if !matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
        return (RxVerdict::WrongState, Some(slot));
    }
    // Every UD opcode has a DETH (IBTA §9.2.1, table 38): `FrameView::parse` checked
    // the opcode's headers are there.
    let Some(deth) = view.ext_bytes(Ext::Deth).map(DethRepr::parse) else {
        return (RxVerdict::Malformed, None);
    };
    if deth.qkey != qp.attr.qkey {
        qp_event!(
            now,
            ctx.dev,
            qp.qpn,
            Event::UdDropped,
            reason = "bad_qkey",
            qkey = deth.qkey
        );
        return (RxVerdict::BadQkey, Some(slot));
    }
    let imm = view
        .ext_bytes(Ext::ImmDt)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let Some(wqe) = qp.resp.take_recv() else {
        return (RxVerdict::NoRecvWqe, Some(slot));
    };
    let payload = view.payload();
    let total = GRH_LEN + payload.len();
    let status = match &wqe.segs {
        Err(st) => *st,
        Ok(_) if (total as u64) > wqe.len => WcStatus::LocLenErr,
        Ok(segs) => {
            let grh = grh_of(view);
            if scatter(ctx.mem, segs, 0, &grh) && scatter(ctx.mem, segs, GRH_LEN, payload) {
                WcStatus::Success
            } else {
                WcStatus::LocProtErr
            }
        }
    };
    let ok = status == WcStatus::Success;
    if ok {
        qp.ud.counters.datagrams_received += 1;
    }
    let wc = WorkCompletion {
        wr_id: wqe.wr_id,
        status,
        opcode: WcOpcode::Recv,
        byte_len: if ok { total as u32 } else { 0 },
        imm_data: if ok { imm } else { None },
        invalidated_rkey: None,
        qp_num: qp.qpn,
        src_qp: deth.src_qp,
        grh: ok,
        sl: if ok { roce_v2_sl(view.is_ipv6()) } else { 0 },
    };
    ctx.complete(qp.recv_cq, wc);
    // A bad local key or a region gone is a local error of the QP (§10.8.3.3); a
    // buffer too small is not (rxe, class D).
    if matches!(status, WcStatus::LocProtErr) {
        qp.enter_error(&mut ctx);
    }
    (RxVerdict::Taken, Some(slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ud_transitions_follow_ib_core() {
        use QpState::{Init, Reset, Rtr, Rts};
        let a = |s| super::super::qp::QpAttr {
            qp_state: s,
            ..Default::default()
        };
        // RESET→INIT needs P_Key index, port and Q_Key; access flags are not UD's.
        assert_eq!(
            check_modify_ud(Reset, &a(Init), AttrMask::STATE | AttrMask::PORT),
            Err(VerbsError::MissingAttributes(
                AttrMask::PKEY_INDEX | AttrMask::QKEY
            ))
        );
        let init = AttrMask::STATE | AttrMask::PORT | AttrMask::PKEY_INDEX | AttrMask::QKEY;
        assert_eq!(check_modify_ud(Reset, &a(Init), init), Ok(Init));
        assert_eq!(
            check_modify_ud(Reset, &a(Init), init | AttrMask::ACCESS_FLAGS),
            Err(VerbsError::UnexpectedAttributes(AttrMask::ACCESS_FLAGS))
        );
        // INIT→RTR needs nothing; an address vector is refused.
        assert_eq!(check_modify_ud(Init, &a(Rtr), AttrMask::STATE), Ok(Rtr));
        assert_eq!(
            check_modify_ud(Init, &a(Rtr), AttrMask::STATE | AttrMask::AV),
            Err(VerbsError::UnexpectedAttributes(AttrMask::AV))
        );
        assert_eq!(
            check_modify_ud(Rtr, &a(Rts), AttrMask::STATE),
            Err(VerbsError::MissingAttributes(AttrMask::SQ_PSN))
        );
        assert_eq!(
            check_modify_ud(Rtr, &a(Rts), AttrMask::STATE | AttrMask::SQ_PSN),
            Ok(Rts)
        );
        assert_eq!(
            check_modify_ud(Init, &a(Rts), AttrMask::STATE),
            Err(VerbsError::InvalidTransition {
                from: Init,
                to: Rts
            })
        );
    }
}
