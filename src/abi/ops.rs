//! The data-path ops of `ibv_context.ops` that programs call inline (verbs.h:
//! `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_post_send`, `ibv_post_recv`,
//! `ibv_post_srq_recv`). Every slot a program may call is set: an op xrnic lacks
//! returns its documented error instead of jumping to NULL.

use core::ffi::{c_int, c_void};

use crate::types::*;
use crate::{guard, set_errno};

/// Fill the ops of a new context.
pub fn install(ops: &mut ibv_context_ops) {
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops.post_srq_recv = Some(post_srq_recv);
}

/// No CQ can exist yet: a negative count is poll_cq's error.
unsafe extern "C" fn poll_cq(_cq: *mut ibv_cq, _n: c_int, _wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        set_errno(libc::EOPNOTSUPP);
        -1
    })
}

unsafe extern "C" fn req_notify_cq(_cq: *mut ibv_cq, _solicited: c_int) -> c_int {
    libc::EOPNOTSUPP
}

unsafe extern "C" fn post_send(
    _qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    if !bad.is_null() {
        // SAFETY: a non-NULL `bad` points to the caller's pointer slot.
        unsafe { *bad = wr };
    }
    libc::EOPNOTSUPP
}

unsafe extern "C" fn post_recv(
    _qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    if !bad.is_null() {
        // SAFETY: a non-NULL `bad` points to the caller's pointer slot.
        unsafe { *bad = wr };
    }
    libc::EOPNOTSUPP
}

/// No SRQ (the next issue): refused.
unsafe extern "C" fn post_srq_recv(
    _srq: *mut c_void,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    if !bad.is_null() {
        // SAFETY: a non-NULL `bad` points to the caller's pointer slot.
        unsafe { *bad = wr };
    }
    libc::EOPNOTSUPP
}
