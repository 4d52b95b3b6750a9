//! Queue pairs (RC, UC, UD): create / modify / query / destroy, and the data path of
//! `ctx->ops` (`ibv_post_send`, `ibv_post_recv`: SGE lists, lists of work requests,
//! signaled and unsignaled). RC and UC QPs may take their receive WQEs from an SRQ
//! (`init.srq`, crate::srq); a UD QP on an SRQ is EOPNOTSUPP (the engine's UD receive
//! uses the QP's own queue). A UD send names its destination in `wr.ud` (a live address
//! handle, crate::ah, else EINVAL; the remote QPN and Q_Key). The modify masks each type
//! needs are the engine's (IBTA vol. 1 §10.3: for UD, INIT takes PKEY_INDEX|PORT|QKEY,
//! RTS takes SQ_PSN; for UC, RTR takes AV|PATH_MTU|DEST_QPN|RQ_PSN and RTS SQ_PSN);
//! a missing or unexpected attribute is EINVAL, as ib_core's `ib_modify_qp_is_ok`
//! makes it for rxe. Inline data (`IBV_SEND_INLINE`) up to [`MAX_INLINE_DATA`] bytes, as
//! rxe: the bytes are copied at post time into a per-QP ring of slots in an
//! engine-owned region, and the request sends from there (the program may reuse its
//! buffer, unregistered or not, as soon as `ibv_post_send` returns).

use core::ffi::c_int;
use core::sync::atomic::Ordering;
use std::sync::Mutex;

use xrnic::verbs::{
    self as xv, Access, AttrMask, QpAttr, QpState, Qpn, RecvWr, Rkey, SendFlags, SendWr, Sge,
    WrOpcode,
};

use xrnic::verbs::ibv::conv::wr_opcode_from_ibv;

use crate::context::{
    Batch, Built, Inline, MAX_INLINE_DATA, UdDest, XQp, XSrq, next_handle, sges, xah, xcq, xpd,
    xqp, xsrq,
};
use crate::live::{self, Kind};
use crate::types::*;
use crate::{guard, ret, set_errno};

mod ex;
pub use ex::{create_qp_ex, ibv_qp_to_qp_ex};

const IBV_QPT_RC: c_int = 2;
const IBV_QPT_UC: c_int = 3;
const IBV_QPT_UD: c_int = 4;

pub extern "C" fn ibv_create_qp(pd: *mut ibv_pd, init: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    guard(core::ptr::null_mut(), || match create(pd, init) {
        Ok(q) => q,
        Err(e) => {
            set_errno(e);
            core::ptr::null_mut()
        }
    })
}

fn create(pd: *mut ibv_pd, init: *mut ibv_qp_init_attr) -> Result<*mut ibv_qp, c_int> {
    // SAFETY: the program does not destroy the PD `pd` while this call uses it.
    let p = unsafe { xpd(pd) }.ok_or(libc::EINVAL)?;
    if init.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: `init` points to the caller's ibv_qp_init_attr (verbs.h contract).
    let a = unsafe { &mut *init };
    let srq = if a.srq.is_null() {
        None
    } else {
        // SAFETY: the program does not destroy the SRQ `a.srq` while this call uses it.
        Some(unsafe { xsrq(a.srq as *mut ibv_srq) }.ok_or(libc::EINVAL)?)
    };
    let qp_type = match a.qp_type {
        IBV_QPT_RC => xv::QpType::Rc,
        IBV_QPT_UC => xv::QpType::Uc,
        IBV_QPT_UD if srq.is_none() => xv::QpType::Ud,
        IBV_QPT_UD => return Err(libc::EOPNOTSUPP),
        // XRC, raw packet, driver QPs.
        _ => return Err(libc::EOPNOTSUPP),
    };
    let (scq, rcq) = (
        // SAFETY: the program does not destroy the CQ `a.send_cq` while this call uses it.
        unsafe { xcq(a.send_cq) }.ok_or(libc::EINVAL)?,
        // SAFETY: the program does not destroy the CQ `a.recv_cq` while this call uses it.
        unsafe { xcq(a.recv_cq) }.ok_or(libc::EINVAL)?,
    );
    // The PD, the CQs and the SRQ must be of one context: the kernel looks each handle
    // up in the context's own file (uverbs_cmd.c `create_qp`, `uobj_get_obj_read`), so
    // another context's object is EINVAL there. Each context's objects stay its own,
    // and its close destroys them (crate::opened).
    let ctx = p.ibv.context;
    if scq.ibv.context != ctx || rcq.ibv.context != ctx || srq.is_some_and(|s| s.ibv.context != ctx)
    {
        return Err(libc::EINVAL);
    }
    let dev = p.pd_device();
    let attr = dev.query_device();
    let mut c = a.cap;
    if c.max_send_wr > attr.max_qp_wr
        || (srq.is_none() && c.max_recv_wr > attr.max_qp_wr)
        || c.max_send_sge > attr.max_sge
        || (srq.is_none() && c.max_recv_sge > attr.max_sge)
        || c.max_inline_data > MAX_INLINE_DATA
    {
        return Err(libc::EINVAL);
    }
    // The queues' sizes as rxe rounds them (rxe_queue.c `rxe_queue_init`: a power of two
    // slots, one kept empty), written back to the caller: 0 stays 0 (a receive-only or
    // send-only QP), 10 becomes 15. A QP on an SRQ has no receive queue of its own: its
    // receive capabilities are left as asked, as rxe's `rxe_qp_init_resp` leaves them.
    c.max_send_wr = round_queue(c.max_send_wr, attr.max_qp_wr);
    if srq.is_none() {
        c.max_recv_wr = round_queue(c.max_recv_wr, attr.max_qp_wr);
    }
    let qi = xv::QpInitAttr {
        send_cq: &scq.state.cq,
        recv_cq: &rcq.state.cq,
        // The engine's queues hold at least one request; posting to a queue of size 0
        // is refused before it ([`post_built`], `post_recv`).
        max_send_wr: c.max_send_wr.max(1),
        max_recv_wr: c.max_recv_wr.max(1),
        sq_sig_all: a.sq_sig_all != 0,
    };
    let qp = match qp_type {
        xv::QpType::Ud => p.pd.create_ud_qp(&qi),
        t => p.pd.create_qp_ext(&qi, t, srq.map(|s| &s.srq)),
    }
    .map_err(|e| e.errno())?;
    // SAFETY: ibv_qp_ex is C data for which all-zero is valid (NULL pointers, absent
    // ops, RESET state, glibc's static mutex / condition initialisers).
    let mut ex: ibv_qp_ex = unsafe { core::mem::zeroed() };
    ex::fill(&mut ex);
    let ibv = &mut ex.qp_base;
    ibv.context = p.ibv.context;
    ibv.qp_context = a.qp_context;
    ibv.pd = pd;
    ibv.send_cq = a.send_cq;
    ibv.recv_cq = a.recv_cq;
    ibv.handle = next_handle();
    ibv.qp_num = qp.qp_num().value();
    ibv.qp_type = a.qp_type;
    ibv.srq = a.srq;
    // The send WQE's size as the kernel's rxe sizes it (rxe_qp.c `rxe_qp_init_req`): room
    // for the larger of the SGE list (16 bytes an SGE) and the inline data, and the
    // capabilities reported are what that room holds. So a QP asked for no inline data
    // still takes 16 bytes per send SGE inline (rdma_xclient posts IBV_SEND_INLINE with
    // max_inline_data 0), and inline room adds SGEs.
    let wqe = (c.max_send_sge * 16).max(c.max_inline_data);
    c.max_send_sge = wqe / 16;
    c.max_inline_data = wqe;
    let inline = if c.max_inline_data > 0 {
        let slot = (c.max_inline_data as usize).next_multiple_of(64);
        let slots = c.max_send_wr.max(1) as usize + 1;
        let mr =
            p.pd.reg_mr(slot * slots, Access::LOCAL_WRITE)
                .map_err(|e| e.errno())?;
        Some(Inline {
            mr,
            slot,
            slots,
            next: Mutex::new(0),
        })
    } else {
        None
    };
    let cap = c;
    a.cap = cap;
    p.users.fetch_add(1, Ordering::SeqCst);
    scq.state.users.fetch_add(1, Ordering::SeqCst);
    rcq.state.users.fetch_add(1, Ordering::SeqCst);
    if let Some(s) = srq {
        s.users.fetch_add(1, Ordering::SeqCst);
    }
    let x = Box::into_raw(Box::new(XQp {
        ibv: ex,
        qp,
        pd: p,
        cqs: [scq.state.clone(), rcq.state.clone()],
        cap,
        sq_sig_all: a.sq_sig_all != 0,
        qp_type: a.qp_type,
        srq: srq.map_or(core::ptr::null(), |s| s as *const XSrq),
        inline,
        batch: Mutex::new(Batch::default()),
    }));
    live::add(x, Kind::Qp);
    Ok(x as *mut ibv_qp)
}

/// A queue of `n` requests as rxe sizes it: `n + 1` rounded up to a power of two, less
/// the one slot kept empty; never past the device's `max` (n <= max already).
fn round_queue(n: u32, max: u32) -> u32 {
    n.checked_add(1)
        .and_then(u32::checked_next_power_of_two)
        .map_or(max, |s| (s - 1).min(max))
        .max(n)
}

pub extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || {
        if !live::remove(qp, Kind::Qp) {
            return ret(Err(libc::EINVAL));
        }
        // SAFETY: still allocated (freed below); its context pointer is ours.
        crate::context::forget(unsafe { (*qp).context }, qp as usize);
        // SAFETY: removed above: a leaked Box<XQp> freed once.
        let x = unsafe { Box::from_raw(qp as *mut XQp) };
        for c in &x.cqs {
            c.users.fetch_sub(1, Ordering::SeqCst);
        }
        // SAFETY: a QP keeps its PD (ibv_dealloc_pd is EBUSY while `users` > 0).
        unsafe { &*x.pd }.users.fetch_sub(1, Ordering::SeqCst);
        if !x.srq.is_null() {
            // SAFETY: a QP keeps its SRQ (ibv_destroy_srq is EBUSY while `users` > 0).
            unsafe { &*x.srq }.users.fetch_sub(1, Ordering::SeqCst);
        }
        0
    })
}

/// `IBV_QP_*` bits xrnic understands for RC (the same values as [`AttrMask`]).
const KNOWN_MASK: c_int = (1 << 21) - 1;

pub extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    guard(libc::EIO, || ret(modify(qp, attr, mask)))
}

fn modify(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> Result<(), c_int> {
    // SAFETY: the program does not destroy the QP `qp` while this call uses it.
    let x = unsafe { xqp(qp) }.ok_or(libc::EINVAL)?;
    if attr.is_null() || mask & !KNOWN_MASK != 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: `attr` points to the caller's ibv_qp_attr.
    let a = unsafe { &*attr };
    let m = AttrMask(mask as u32);
    // verbs.h's values checked, the flow label cut to 20 bits, an AV without a GRH
    // refused (xrnic::verbs::ibv::conv).
    let q = QpAttr::try_from((a, m)).map_err(|e| xv::Error::Verbs(e).errno())?;
    if let Err(e) = x.qp.modify(&q, m) {
        if std::env::var_os("XRNIC_DEBUG").is_some() {
            eprintln!("xrnic: ibv_modify_qp: {e}");
        }
        return Err(e.errno());
    }
    if m.contains(AttrMask::STATE) {
        // SAFETY: the program's QP struct; `state` is a plain int it may read.
        unsafe { (*qp).state = a.qp_state };
        if q.qp_state == QpState::Err {
            // Flushed work requests are completions: signal armed CQs.
            x.qp.device().run_completion_hook();
        }
    }
    Ok(())
}

pub extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program does not destroy the QP `qp` while this call uses it.
        let Some(x) = (unsafe { xqp(qp) }) else {
            return ret(Err(libc::EINVAL));
        };
        if attr.is_null() || init.is_null() {
            return ret(Err(libc::EINVAL));
        }
        // ibv_cmd_query_qp's lookup of the QP is refused on a disassociated device.
        if crate::context::ctx_gone(x.ibv.qp_base.context) {
            return ret(Err(libc::EIO));
        }
        let q = match x.qp.query() {
            Ok(q) => q,
            Err(e) => return ret(Err(e.errno())),
        };
        let mut o = ibv_qp_attr::from(&q);
        // The current state is the state; the port and the AV's port are the device's
        // one port.
        o.cur_qp_state = o.qp_state;
        o.port_num = q.port_num.max(1);
        o.ah_attr.port_num = 1;
        o.cap = x.cap;
        // SAFETY: both point to the caller's structs.
        unsafe {
            attr.write(o);
            (*init).qp_context = x.ibv.qp_base.qp_context;
            (*init).send_cq = x.ibv.qp_base.send_cq;
            (*init).recv_cq = x.ibv.qp_base.recv_cq;
            (*init).srq = x.ibv.qp_base.srq;
            (*init).cap = x.cap;
            (*init).qp_type = x.qp_type;
            (*init).sq_sig_all = c_int::from(x.sq_sig_all);
        }
        0
    })
}

const IBV_SEND_INLINE: u32 = 1 << 3;

fn send_wr(x: &XQp, w: &ibv_send_wr) -> Result<SendWr, c_int> {
    let op = wr_opcode_from_ibv(w.opcode).map_err(|_| libc::EINVAL)?;
    // SAFETY: the work request's SGE list (verbs.h contract).
    let sg = unsafe { sges(w.sg_list, w.num_sge, x.cap.max_send_sge) }?;
    let mut s = SendWr::new(w.wr_id, op);
    s.sg_list = sg;
    s.send_flags = SendFlags(w.send_flags & 7);
    s.imm_data = u32::from_be(w.imm_data);
    s.invalidate_rkey = Rkey(w.imm_data);
    s.rdma.remote_addr = w.wr.remote_addr;
    s.rdma.rkey = Rkey(w.rdma_rkey());
    s.atomic.remote_addr = w.wr.remote_addr;
    s.atomic.compare_add = w.wr.compare_add;
    s.atomic.swap = w.wr.swap;
    s.atomic.rkey = Rkey(w.wr.rkey);
    Ok(s)
}

/// Whether `op` carries inline data when IBV_SEND_INLINE is set: the SEND and RDMA
/// WRITE kinds (READ and atomics have no payload to send; the flag is ignored there).
fn inlinable(op: WrOpcode) -> bool {
    matches!(
        op,
        WrOpcode::Send
            | WrOpcode::SendWithImm
            | WrOpcode::SendWithInv
            | WrOpcode::RdmaWrite
            | WrOpcode::RdmaWriteWithImm
    )
}

/// The request of `w` as the post path takes it: with IBV_SEND_INLINE its bytes are
/// read now (the SGEs' lkeys are not checked, as for inline data in rxe and IBTA vol. 1
/// §10.8.3.3: the data is taken by value); more than `max_inline_data` bytes is EINVAL,
/// as in rxe. A UD request carries its `wr.ud` destination.
fn built(x: &XQp, w: &ibv_send_wr, s: SendWr) -> Result<Built, c_int> {
    let ud = (x.qp_type == IBV_QPT_UD).then(|| UdDest {
        ah: w.ud_ah() as usize,
        qpn: w.ud_remote_qpn(),
        qkey: w.ud_remote_qkey(),
    });
    let mut inline = None;
    if w.send_flags & IBV_SEND_INLINE != 0 && inlinable(s.opcode) {
        let total: u64 = s.sg_list.iter().map(|g| u64::from(g.length)).sum();
        if total > u64::from(x.cap.max_inline_data) {
            return Err(libc::EINVAL);
        }
        let mut bytes = Vec::with_capacity(total as usize);
        for g in s.sg_list.iter().filter(|g| g.length > 0) {
            // SAFETY: an inline SGE names `length` readable bytes of the program's
            // memory at `addr` (verbs.h: the data is read during ibv_post_send); the
            // total is at most max_inline_data (checked above).
            let part = unsafe {
                core::slice::from_raw_parts(g.addr as usize as *const u8, g.length as usize)
            };
            bytes.extend_from_slice(part);
        }
        inline = Some(bytes);
    }
    Ok(Built { wr: s, inline, ud })
}

/// Post one request, from `ibv_post_send` or `ibv_wr_complete` (one path for both): its
/// inline bytes, if any, are first copied into the QP's inline ring. A QP created with
/// `max_send_wr` 0 has no room: ENOMEM, as rxe's full queue answers.
pub(crate) fn post_built(x: &XQp, b: Built) -> Result<(), c_int> {
    let Built {
        wr: mut s,
        inline,
        ud,
    } = b;
    if x.cap.max_send_wr == 0 {
        return Err(libc::ENOMEM);
    }
    let Some(bytes) = inline else {
        return submit(x, s, ud);
    };
    if bytes.len() > x.cap.max_inline_data as usize {
        return Err(libc::EINVAL);
    }
    s.sg_list.clear();
    let Some(inl) = &x.inline else {
        // max_inline_data 0: only an empty request may be inline.
        if !bytes.is_empty() {
            return Err(libc::EINVAL);
        }
        return submit(x, s, ud);
    };
    let mut next = inl.next.lock().unwrap_or_else(|e| e.into_inner());
    let off = *next * inl.slot;
    inl.mr.write(off, &bytes).map_err(|e| e.errno())?;
    if !bytes.is_empty() {
        s.sg_list.push(Sge {
            addr: inl.mr.addr() + off as u64,
            length: bytes.len() as u32,
            lkey: inl.mr.lkey(),
        });
    }
    submit(x, s, ud)?;
    *next = (*next + 1) % inl.slots;
    Ok(())
}

/// Hand one request to the engine: a UD one with its destination (a live address
/// handle, else EINVAL).
fn submit(x: &XQp, s: SendWr, ud: Option<UdDest>) -> Result<(), c_int> {
    if x.qp_type != IBV_QPT_UD {
        return x.qp.post_send(s).map_err(|e| e.errno());
    }
    let d = ud.ok_or(libc::EINVAL)?;
    // SAFETY: the program does not destroy the AH `d.ah` while this call uses it.
    let ah = unsafe { xah(d.ah as *mut ibv_ah) }.ok_or(libc::EINVAL)?;
    x.qp.post_send_ud(s, &ah.ah, Qpn::new(d.qpn), d.qkey)
        .map_err(|e| e.errno())
}

/// `ctx->ops.post_send`: 0, or the errno with `*bad` at the first refused request.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the data path trusts the program's QP pointer (a live Box<XQp>), as
        // every provider does.
        let x = unsafe { &*(qp as *const XQp) };
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: `cur` is a node of the program's list.
            let w = unsafe { &*cur };
            let r = send_wr(x, w)
                .and_then(|s| built(x, w, s))
                .and_then(|b| post_built(x, b));
            if let Err(e) = r {
                if !bad.is_null() {
                    // SAFETY: the caller's out pointer.
                    unsafe { *bad = cur };
                }
                return e;
            }
            cur = w.next;
        }
        0
    })
}

/// `ctx->ops.post_recv`.
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: as in post_send.
        let x = unsafe { &*(qp as *const XQp) };
        if !x.srq.is_null() {
            // Receive WQEs come from the SRQ: rdma-core's rxe `rxe_post_recv` finds no
            // receive queue and returns EINVAL with `*bad_wr` NULL.
            if !bad.is_null() {
                // SAFETY: the caller's out pointer.
                unsafe { *bad = core::ptr::null_mut() };
            }
            return libc::EINVAL;
        }
        if x.cap.max_recv_wr == 0 && !wr.is_null() {
            // A QP created with max_recv_wr 0 has no receive queue: rxe's full queue.
            if !bad.is_null() {
                // SAFETY: the caller's out pointer.
                unsafe { *bad = wr };
            }
            return libc::ENOMEM;
        }
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: `cur` is a node of the program's list.
            let w = unsafe { &*cur };
            // SAFETY: the work request's SGE list.
            let r = unsafe { sges(w.sg_list, w.num_sge, x.cap.max_recv_sge) }.and_then(|sg| {
                x.qp.post_recv(RecvWr {
                    wr_id: w.wr_id,
                    sg_list: sg,
                })
                .map_err(|e| e.errno())
            });
            if let Err(e) = r {
                if !bad.is_null() {
                    // SAFETY: the caller's out pointer.
                    unsafe { *bad = cur };
                }
                return e;
            }
            cur = w.next;
        }
        0
    })
}

#[cfg(test)]
mod tests {
    use super::round_queue;

    #[test]
    fn queues_are_sized_as_rxe_sizes_them() {
        // rxe_queue_init: n + 1 slots rounded up to a power of two, one kept empty.
        for (n, want) in [
            (0, 0),
            (1, 1),
            (2, 3),
            (10, 15),
            (15, 15),
            (16, 31),
            (100, 127),
        ] {
            assert_eq!(round_queue(n, 16384), want, "{n}");
        }
        // Never past the device's maximum, never below what was asked.
        assert_eq!(round_queue(16384, 16384), 16384);
        assert_eq!(round_queue(9000, 16384), 16383);
        assert_eq!(round_queue(u32::MAX, u32::MAX), u32::MAX);
    }
}
