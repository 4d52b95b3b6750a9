//! Extended QPs: `ibv_create_qp_ex` (`verbs_context.create_qp_ex`) and the work-request
//! API of `struct ibv_qp_ex` (verbs.h `ibv_wr_*`, `ibv_qp_to_qp_ex`).
//!
//! - `create_qp_ex` takes the `comp_mask` bits rdma-core's rxe provider takes
//!   (providers/rxe/rxe.c `check_qp_init_attr`): PD (required), CREATE_FLAGS with no flag
//!   set, SEND_OPS_FLAGS with the operations rxe offers for the QP's type. Anything else
//!   (MAX_TSO_HEADER: TSO is for raw packet QPs, which xrnic has not; XRCD, RSS) is
//!   EOPNOTSUPP, as with rxe. The QP is then made as `ibv_create_qp` makes it.
//! - Every QP is an `ibv_qp_ex` (crate::context `XQp`), its builders and setters set.
//!   A builder (`wr_send`, `wr_rdma_write`, ...) starts a request with the `wr_id` and
//!   `wr_flags` the program wrote into the structure; the setters (`wr_set_sge`,
//!   `wr_set_inline_data`, `wr_set_ud_addr`, ...) complete the last one; `wr_complete`
//!   posts them in order through the path `ibv_post_send` uses (crate::qp `post_built`):
//!   one engine, one set of checks. As in rxe, the first error a builder or setter
//!   meets is kept and `wr_complete` returns it having posted nothing; `wr_abort` drops
//!   the requests.
//! - `wr_bind_mw` and `wr_local_inv` record EOPNOTSUPP: xrnic has no memory windows,
//!   and the engine has no local invalidate (`ibv_post_send` refuses IBV_WR_LOCAL_INV
//!   and IBV_WR_BIND_MW too).

use core::ffi::{c_int, c_void};

use xrnic::verbs::{Rkey, SendFlags, SendWr, WrOpcode};

use super::{IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_SEND_INLINE, inlinable, post_built};
use crate::context::{Batch, Built, UdDest, XQp, context, sges, xpd, xqp};
use crate::types::*;
use crate::{guard, set_errno};

const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

// enum ibv_qp_create_send_ops_flags.
const WITH_RDMA_WRITE: u64 = 1 << 0;
const WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
const WITH_SEND: u64 = 1 << 2;
const WITH_SEND_WITH_IMM: u64 = 1 << 3;
const WITH_RDMA_READ: u64 = 1 << 4;
const WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
const WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
const WITH_LOCAL_INV: u64 = 1 << 7;
const WITH_BIND_MW: u64 = 1 << 8;
const WITH_SEND_WITH_INV: u64 = 1 << 9;

/// The operations a QP of type `t` may ask for in `send_ops_flags`: rxe's sets (rxe.c
/// `RXE_SUP_*_QP_SEND_OPS_FLAGS`) without FLUSH and ATOMIC_WRITE, which the engine
/// does not implement.
fn send_ops_for(t: c_int) -> Option<u64> {
    let uc = WITH_RDMA_WRITE
        | WITH_RDMA_WRITE_WITH_IMM
        | WITH_SEND
        | WITH_SEND_WITH_IMM
        | WITH_BIND_MW
        | WITH_SEND_WITH_INV;
    match t {
        IBV_QPT_RC => Some(
            uc | WITH_RDMA_READ
                | WITH_ATOMIC_CMP_AND_SWP
                | WITH_ATOMIC_FETCH_AND_ADD
                | WITH_LOCAL_INV,
        ),
        IBV_QPT_UC => Some(uc),
        IBV_QPT_UD => Some(WITH_SEND | WITH_SEND_WITH_IMM),
        _ => None,
    }
}

/// `verbs_context.create_qp_ex`; verbs.h's `ibv_create_qp_ex` calls it unless
/// `comp_mask` is PD alone (then it calls `ibv_create_qp`).
pub unsafe extern "C" fn create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(core::ptr::null_mut(), || match create_ex(ctx, attr) {
        Ok(q) => q,
        Err(e) => {
            set_errno(e);
            core::ptr::null_mut()
        }
    })
}

fn create_ex(ctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> Result<*mut ibv_qp, c_int> {
    // SAFETY: the program does not close `ctx` while this call uses it.
    if unsafe { context(ctx) }.is_none() || attr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: `attr` points to the caller's ibv_qp_init_attr_ex (verbs.h contract).
    let a = unsafe { &*attr };
    let known =
        IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if a.comp_mask & !known != 0
        || (a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
    {
        return Err(libc::EOPNOTSUPP);
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
        let ok = send_ops_for(a.qp_type).ok_or(libc::EOPNOTSUPP)?;
        if a.send_ops_flags & !ok != 0 {
            return Err(libc::EOPNOTSUPP);
        }
    }
    // Without a PD the kernel has no object to make the QP in (uverbs `create_qp`
    // looks the PD handle up): EINVAL. A PD of another context likewise.
    // SAFETY: the program does not destroy the PD `a.pd` while this call uses it.
    let pd_ctx = (a.comp_mask & IBV_QP_INIT_ATTR_PD != 0)
        .then(|| unsafe { xpd(a.pd) }.map(|p| p.ibv.context))
        .flatten();
    if pd_ctx != Some(ctx) {
        return Err(libc::EINVAL);
    }
    // ibv_qp_init_attr_ex starts with the fields of ibv_qp_init_attr (verbs.h), and the
    // capabilities are written back through the same prefix.
    super::create(a.pd, attr as *mut ibv_qp_init_attr)
}

/// `ibv_qp_to_qp_ex`: every xrnic QP is an `ibv_qp_ex` (NULL for a pointer that is not
/// a live QP).
pub extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    guard(core::ptr::null_mut(), || {
        // SAFETY: only looked up (the table answers whether it is a live QP).
        match unsafe { xqp(qp) } {
            Some(_) => qp as *mut ibv_qp_ex,
            None => core::ptr::null_mut(),
        }
    })
}

/// Set the builders and setters of a new QP.
pub(super) fn fill(q: &mut ibv_qp_ex) {
    q.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    q.wr_bind_mw = Some(wr_bind_mw);
    q.wr_local_inv = Some(wr_local_inv);
    q.wr_rdma_read = Some(wr_rdma_read);
    q.wr_rdma_write = Some(wr_rdma_write);
    q.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    q.wr_send = Some(wr_send);
    q.wr_send_imm = Some(wr_send_imm);
    q.wr_send_inv = Some(wr_send_inv);
    q.wr_set_ud_addr = Some(wr_set_ud_addr);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
}

/// The QP behind the program's `ibv_qp_ex *` (the data path trusts it, as
/// `ibv_post_send` trusts its QP pointer: a live Box<XQp>, whose first field is it).
///
/// # Safety
/// `q` is a QP this library made and the program has not destroyed.
unsafe fn xq<'a>(q: *mut ibv_qp_ex) -> &'a XQp {
    // SAFETY: the caller's contract.
    unsafe { &*(q as *const XQp) }
}

/// Run `f` on the QP's open batch unless an error is already recorded there.
///
/// # Safety
/// As [`xq`].
unsafe fn with_batch(q: *mut ibv_qp_ex, f: impl FnOnce(&XQp, &mut Batch) -> Result<(), c_int>) {
    guard((), || {
        if q.is_null() {
            return;
        }
        // SAFETY: the caller's contract.
        let x = unsafe { xq(q) };
        let mut b = x.batch.lock().unwrap_or_else(|e| e.into_inner());
        if b.err != 0 {
            return;
        }
        if let Err(e) = f(x, &mut b) {
            b.err = e;
        }
    })
}

/// A builder: a new request of opcode `op` with the `wr_id` and `wr_flags` the program
/// set, completed by `set`. Past `max_send_wr` requests in one batch: ENOSPC, as rxe's
/// `check_qp_queue_full`.
///
/// # Safety
/// As [`xq`].
unsafe fn build(q: *mut ibv_qp_ex, op: WrOpcode, set: impl FnOnce(&mut SendWr)) {
    let f = |x: &XQp, b: &mut Batch| {
        if b.wrs.len() >= x.cap.max_send_wr as usize {
            return Err(libc::ENOSPC);
        }
        // SAFETY: `q` is the program's ibv_qp_ex; it wrote these fields before the
        // call (verbs.h: `qpx->wr_id = ...; ibv_wr_send(qpx)`).
        let (wr_id, flags) = unsafe { ((*q).wr_id, (*q).wr_flags) };
        let mut s = SendWr::new(wr_id, op);
        s.send_flags = SendFlags(flags & 7);
        set(&mut s);
        let inline = (flags & IBV_SEND_INLINE != 0 && inlinable(op)).then(Vec::new);
        b.wrs.push(Built {
            wr: s,
            inline,
            ud: None,
        });
        Ok(())
    };
    // SAFETY: the caller's contract.
    unsafe { with_batch(q, f) }
}

/// The refusal of a builder the engine has no operation for.
///
/// # Safety
/// As [`xq`].
unsafe fn refuse(q: *mut ibv_qp_ex, e: c_int) {
    // SAFETY: the caller's contract.
    unsafe { with_batch(q, |_, _| Err(e)) }
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    q: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    // SAFETY: the program's ibv_qp_ex (verbs.h contract of `ibv_wr_*`).
    unsafe {
        build(q, WrOpcode::AtomicCmpAndSwp, |s| {
            s.atomic.remote_addr = remote_addr;
            s.atomic.compare_add = compare;
            s.atomic.swap = swap;
            s.atomic.rkey = Rkey(rkey);
        })
    }
}

unsafe extern "C" fn wr_atomic_fetch_add(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64) {
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe {
        build(q, WrOpcode::AtomicFetchAndAdd, |s| {
            s.atomic.remote_addr = remote_addr;
            s.atomic.compare_add = add;
            s.atomic.rkey = Rkey(rkey);
        })
    }
}

unsafe extern "C" fn wr_bind_mw(
    q: *mut ibv_qp_ex,
    _mw: *mut c_void,
    _rkey: u32,
    _info: *const c_void,
) {
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe { refuse(q, libc::EOPNOTSUPP) }
}

unsafe extern "C" fn wr_local_inv(q: *mut ibv_qp_ex, _rkey: u32) {
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe { refuse(q, libc::EOPNOTSUPP) }
}

unsafe extern "C" fn wr_rdma_read(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe { build(q, WrOpcode::RdmaRead, |s| remote(s, rkey, remote_addr)) }
}

unsafe extern "C" fn wr_rdma_write(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe { build(q, WrOpcode::RdmaWrite, |s| remote(s, rkey, remote_addr)) }
}

unsafe extern "C" fn wr_rdma_write_imm(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe {
        build(q, WrOpcode::RdmaWriteWithImm, |s| {
            remote(s, rkey, remote_addr);
            s.imm_data = u32::from_be(imm);
        })
    }
}

fn remote(s: &mut SendWr, rkey: u32, remote_addr: u64) {
    s.rdma.remote_addr = remote_addr;
    s.rdma.rkey = Rkey(rkey);
}

unsafe extern "C" fn wr_send(q: *mut ibv_qp_ex) {
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe { build(q, WrOpcode::Send, |_| {}) }
}

unsafe extern "C" fn wr_send_imm(q: *mut ibv_qp_ex, imm: u32) {
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe { build(q, WrOpcode::SendWithImm, |s| s.imm_data = u32::from_be(imm)) }
}

unsafe extern "C" fn wr_send_inv(q: *mut ibv_qp_ex, rkey: u32) {
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe { build(q, WrOpcode::SendWithInv, |s| s.invalidate_rkey = Rkey(rkey)) }
}

/// A setter: `f` completes the last request built (none: EINVAL).
///
/// # Safety
/// As [`xq`].
unsafe fn set_last(q: *mut ibv_qp_ex, f: impl FnOnce(&XQp, &mut Built) -> Result<(), c_int>) {
    // SAFETY: the caller's contract.
    unsafe {
        with_batch(q, |x, b| {
            let last = b.wrs.last_mut().ok_or(libc::EINVAL)?;
            f(x, last)
        })
    }
}

unsafe extern "C" fn wr_set_ud_addr(q: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe {
        set_last(q, |_, w| {
            // The AH is looked up when the request is posted (a stale one: EINVAL).
            w.ud = Some(UdDest {
                ah: ah as usize,
                qpn,
                qkey,
            });
            Ok(())
        })
    }
}

/// The request's data is `bytes`, sent inline; more than `max_inline_data`: ENOSPC, as
/// rxe's `wr_set_inline_data`.
fn set_inline(x: &XQp, w: &mut Built, bytes: Vec<u8>) -> Result<(), c_int> {
    if bytes.len() > x.cap.max_inline_data as usize {
        return Err(libc::ENOSPC);
    }
    w.wr.sg_list.clear();
    w.inline = Some(bytes);
    Ok(())
}

/// # Safety
/// `addr` names `length` readable bytes (verbs.h: the data is copied by the call).
unsafe fn copy_in(addr: *const c_void, length: usize) -> Vec<u8> {
    if length == 0 || addr.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    unsafe { core::slice::from_raw_parts(addr as *const u8, length) }.to_vec()
}

unsafe extern "C" fn wr_set_inline_data(q: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    let f = |x: &XQp, w: &mut Built| {
        if length > x.cap.max_inline_data as usize {
            return Err(libc::ENOSPC);
        }
        // SAFETY: the program's buffer of `length` bytes (verbs.h contract).
        let bytes = unsafe { copy_in(addr, length) };
        set_inline(x, w, bytes)
    };
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe { set_last(q, f) }
}

unsafe extern "C" fn wr_set_inline_data_list(
    q: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    let f = |x: &XQp, w: &mut Built| {
        if n > 0 && list.is_null() {
            return Err(libc::EINVAL);
        }
        let mut bytes = Vec::new();
        for i in 0..n {
            // SAFETY: `list` holds `n` entries (verbs.h contract).
            let d = unsafe { &*list.add(i) };
            if bytes.len().saturating_add(d.length) > x.cap.max_inline_data as usize {
                return Err(libc::ENOSPC);
            }
            // SAFETY: each entry names `length` readable bytes.
            bytes.extend(unsafe { copy_in(d.addr, d.length) });
        }
        set_inline(x, w, bytes)
    };
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe { set_last(q, f) }
}

/// The request's SGE list; with IBV_SEND_INLINE set on it, its bytes are read now, as
/// `ibv_post_send` reads them (crate::qp `built`).
fn set_sges(x: &XQp, w: &mut Built, sg: Vec<xrnic::verbs::Sge>) -> Result<(), c_int> {
    if w.inline.is_some() {
        let total: usize = sg.iter().map(|g| g.length as usize).sum();
        if total > x.cap.max_inline_data as usize {
            return Err(libc::ENOSPC);
        }
        let mut bytes = Vec::with_capacity(total);
        for g in &sg {
            // SAFETY: an inline SGE names `length` readable bytes of the program's
            // memory (read during the call, as `ibv_post_send` reads it).
            bytes.extend(unsafe { copy_in(g.addr as usize as *const c_void, g.length as usize) });
        }
        return set_inline(x, w, bytes);
    }
    w.wr.sg_list = sg;
    Ok(())
}

unsafe extern "C" fn wr_set_sge(q: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe {
        set_last(q, |x, w| {
            // rxe's wr_set_sge: a zero length leaves the request without data.
            let sg = if length == 0 {
                Vec::new()
            } else {
                vec![xrnic::verbs::Sge {
                    addr,
                    length,
                    lkey: xrnic::wire::Lkey(lkey),
                }]
            };
            set_sges(x, w, sg)
        })
    }
}

unsafe extern "C" fn wr_set_sge_list(q: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    let f = |x: &XQp, w: &mut Built| {
        // More SGEs than the QP's max_send_sge: ENOSPC, as rxe's wr_set_sge_list.
        if n > x.cap.max_send_sge as usize {
            return Err(libc::ENOSPC);
        }
        // SAFETY: `list` holds `n` entries (verbs.h contract); n fits c_int (at most
        // max_send_sge).
        let sg = unsafe { sges(list, n as c_int, x.cap.max_send_sge) }?;
        set_sges(x, w, sg)
    };
    // SAFETY: as in wr_atomic_cmp_swp.
    unsafe { set_last(q, f) }
}

unsafe extern "C" fn wr_start(q: *mut ibv_qp_ex) {
    guard((), || {
        if q.is_null() {
            return;
        }
        // SAFETY: as in wr_atomic_cmp_swp.
        let x = unsafe { xq(q) };
        *x.batch.lock().unwrap_or_else(|e| e.into_inner()) = Batch::default();
    })
}

unsafe extern "C" fn wr_complete(q: *mut ibv_qp_ex) -> c_int {
    guard(libc::EIO, || {
        if q.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: as in wr_atomic_cmp_swp.
        let x = unsafe { xq(q) };
        let b = core::mem::take(&mut *x.batch.lock().unwrap_or_else(|e| e.into_inner()));
        if b.err != 0 {
            return b.err;
        }
        // In order; a refusal stops there (the requests before it are posted, as
        // `ibv_post_send` leaves those before `*bad_wr`).
        for w in b.wrs {
            if let Err(e) = post_built(x, w) {
                return e;
            }
        }
        0
    })
}

unsafe extern "C" fn wr_abort(q: *mut ibv_qp_ex) {
    // SAFETY: as in wr_start.
    unsafe { wr_start(q) }
}
