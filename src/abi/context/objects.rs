//! The objects a context holds: each a verbs.h structure first (so the C pointer is the
//! object's address), then xrnic's handle; and the lookups from a C pointer, which refuse
//! one that is not (or no longer) a live object of that kind (crate::live).

use core::ffi::c_int;
use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use xrnic::verbs::{self as xv, Sge};
use xrnic::wire::Lkey;

use crate::live::{self, Kind};
use crate::types::*;

use super::{CqState, context};

#[repr(C)]
pub struct XPd {
    pub ibv: ibv_pd,
    pub pd: xv::Pd,
    /// MRs and QPs of this PD: `ibv_dealloc_pd` is EBUSY while any remain.
    pub users: AtomicUsize,
}

#[repr(C)]
pub struct XMr {
    pub ibv: ibv_mr,
    pub(crate) mr: xv::Mr,
    pub(crate) pd: *const XPd,
}

static HANDLES: AtomicU32 = AtomicU32::new(1);

/// A fresh `handle` value for an object (programs print them; nothing looks them up).
pub fn next_handle() -> u32 {
    HANDLES.fetch_add(1, Ordering::Relaxed)
}

/// The PD behind `pd`, if it is live.
///
/// # Safety
///
/// The lookup refuses a pointer that is not (or no longer) a live PD, but the
/// reference it returns has no lifetime the compiler can check: it is valid only while the
/// PD is not destroyed. The caller uses it within the call it serves and the program
/// does not call `ibv_dealloc_pd` on it meanwhile (a libibverbs program may not destroy an
/// object while another of its calls uses it).
pub unsafe fn xpd<'a>(pd: *mut ibv_pd) -> Option<&'a XPd> {
    // SAFETY: a live Pd entry is a leaked Box<XPd> whose first field is the ibv_pd.
    live::is(pd, Kind::Pd).then(|| unsafe { &*(pd as *const XPd) })
}

#[repr(C)]
pub struct XSrq {
    pub ibv: ibv_srq,
    pub srq: xv::Srq,
    pub(crate) pd: *const XPd,
    /// QPs on this SRQ: `ibv_destroy_srq` is EBUSY while any remain.
    pub users: AtomicUsize,
    pub(crate) max_sge: u32,
}

/// The SRQ behind `srq`, if it is live.
///
/// # Safety
///
/// The lookup refuses a pointer that is not (or no longer) a live SRQ, but the
/// reference it returns has no lifetime the compiler can check: it is valid only while the
/// SRQ is not destroyed. The caller uses it within the call it serves and the program
/// does not call `ibv_destroy_srq` on it meanwhile (a libibverbs program may not destroy an
/// object while another of its calls uses it).
pub unsafe fn xsrq<'a>(srq: *mut ibv_srq) -> Option<&'a XSrq> {
    // SAFETY: a live Srq entry is a leaked Box<XSrq> whose first field is the ibv_srq.
    live::is(srq, Kind::Srq).then(|| unsafe { &*(srq as *const XSrq) })
}

/// The live SRQs by engine number, so that a limit event names its `ibv_srq *`.
pub fn by_num(ctx: *mut ibv_context, num: u32) -> Option<*mut ibv_srq> {
    live::find(Kind::Srq, |p| {
        // SAFETY: `p` is a live Srq entry (find holds the table's lock meanwhile, and
        // ibv_destroy_srq removes it before freeing).
        let x = unsafe { &*(p as *const XSrq) };
        x.ibv.context == ctx && x.srq.srq_num() == num
    })
    .map(|p| p as *mut ibv_srq)
}

#[repr(C)]
pub struct XAh {
    pub ibv: ibv_ah,
    pub ah: xv::Ah,
    pub(crate) pd: *const XPd,
}

/// The address handle behind `ah`, if it is live (a lookup: a UD post with a stale or
/// foreign pointer is EINVAL instead of a read of freed memory).
///
/// # Safety
///
/// The lookup refuses a pointer that is not (or no longer) a live AH, but the
/// reference it returns has no lifetime the compiler can check: it is valid only while the
/// AH is not destroyed. The caller uses it within the call it serves and the program
/// does not call `ibv_destroy_ah` on it meanwhile (a libibverbs program may not destroy an
/// object while another of its calls uses it).
pub unsafe fn xah<'a>(ah: *mut ibv_ah) -> Option<&'a XAh> {
    // SAFETY: a live Ah entry is a leaked Box<XAh> whose first field is the ibv_ah.
    live::is(ah, Kind::Ah).then(|| unsafe { &*(ah as *const XAh) })
}

#[repr(C)]
pub struct XQp {
    /// The `ibv_qp` programs see, inside the `ibv_qp_ex` of the work-request API
    /// (crate::qp `ex`): one address for both.
    pub ibv: ibv_qp_ex,
    pub(crate) qp: xv::Qp,
    pub(crate) pd: *const XPd,
    pub(crate) cqs: [Arc<CqState>; 2],
    pub(crate) cap: ibv_qp_cap,
    pub(crate) sq_sig_all: bool,
    pub(crate) qp_type: c_int,
    /// The SRQ its receive WQEs come from (NULL: its own receive queue).
    pub(crate) srq: *const XSrq,
    /// Inline data: the ring its bytes are copied into (`None` when max_inline_data 0).
    pub(crate) inline: Option<Inline>,
    /// The requests built between `ibv_wr_start` and `ibv_wr_complete`.
    pub(crate) batch: Mutex<Batch>,
}

/// A UD request's destination: the address handle (`ibv_ah *` as usize, looked up when
/// posted), the remote QPN and Q_Key.
#[derive(Clone, Copy)]
pub struct UdDest {
    pub ah: usize,
    pub qpn: u32,
    pub qkey: u32,
}

/// One request as the post path takes it: the engine's request, its inline bytes
/// (copied from the program when it named them), its UD destination.
pub struct Built {
    pub wr: xv::SendWr,
    pub inline: Option<Vec<u8>>,
    pub ud: Option<UdDest>,
}

/// The `ibv_wr_*` requests of one `wr_start` .. `wr_complete` span, and the first error
/// a builder or setter met (rdma-core's rxe keeps it the same way: `wr_complete` returns
/// it and posts nothing).
#[derive(Default)]
pub struct Batch {
    pub wrs: Vec<Built>,
    pub err: c_int,
}

/// The largest `max_inline_data` a QP takes: rxe's (RXE_MAX_INLINE_DATA, the SGE area
/// of its largest send WQE, 32 SGEs of 16 bytes; drivers/infiniband/sw/rxe/rxe_param.h).
pub const MAX_INLINE_DATA: u32 = 512;

/// Inline data of a QP: `slots` slots of `slot` bytes in an engine-owned region. A
/// request's bytes go into the slot after the last one used, and the slot index moves on
/// only when the engine took the request. With `max_send_wr + 1` slots, a slot is
/// written only when the request that used it last has left the send queue: the queue
/// holds at most `max_send_wr` requests, all among the last `max_send_wr` posted, which
/// occupy the other slots (an unacknowledged request is still in the queue, and is
/// resent from its slot).
pub struct Inline {
    pub(crate) mr: xv::Mr,
    pub(crate) slot: usize,
    pub(crate) slots: usize,
    /// The next slot; held across the copy and the post, so that posts from several
    /// threads use distinct slots.
    pub(crate) next: Mutex<usize>,
}

/// The QP behind `qp`, if it is live.
///
/// # Safety
///
/// The lookup refuses a pointer that is not (or no longer) a live QP, but the
/// reference it returns has no lifetime the compiler can check: it is valid only while the
/// QP is not destroyed. The caller uses it within the call it serves and the program
/// does not call `ibv_destroy_qp` on it meanwhile (a libibverbs program may not destroy an
/// object while another of its calls uses it).
pub(crate) unsafe fn xqp<'a>(qp: *mut ibv_qp) -> Option<&'a XQp> {
    // SAFETY: a live Qp entry is a leaked Box<XQp> whose first field is the ibv_qp.
    live::is(qp, Kind::Qp).then(|| unsafe { &*(qp as *const XQp) })
}

impl XPd {
    pub(crate) fn pd_device(&self) -> xv::Device {
        // SAFETY: the program does not close `self.ibv.context` while this call uses it.
        unsafe { context(self.ibv.context) }
            .map(|c| c.dev.clone())
            .expect("a live PD's context is open")
    }
}

/// The SGE list of a work request, or EINVAL for more than `max` entries.
///
/// # Safety
/// `sg` must point to `n` readable `ibv_sge` when `n` > 0.
pub(crate) unsafe fn sges(sg: *const ibv_sge, n: c_int, max: u32) -> Result<Vec<Sge>, c_int> {
    if n < 0 || n as u32 > max || (n > 0 && sg.is_null()) {
        return Err(libc::EINVAL);
    }
    let mut v = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        // SAFETY: i < n entries at `sg` (the caller's contract).
        let s = unsafe { sg.add(i).read_unaligned() };
        v.push(Sge {
            addr: s.addr,
            length: s.length,
            lkey: Lkey(s.lkey),
        });
    }
    Ok(v)
}
