//! What a child of `fork()` sees of the contexts its parent had open (docs/verbs-abi.md
//! "fork"). Not its parent's device: the driver thread, the AF_XDP socket and the
//! service connection behind them are the parent's, and a child that posted on or polled
//! them would take the parent's completions from the shared rings, or run its requests
//! as the parent's. So in the child every inherited context and object is not one of
//! this process's (the lookups of crate::live and crate::context use only the tables of
//! the process's own generation: EINVAL), and the data path of an inherited context,
//! which trusts its pointers without a lookup, is switched to verbs that refuse
//! ([`refuse_inherited`]). The child opens a device of its own (crate::opened).

use core::ffi::c_int;

use crate::types::*;

/// Registers [`refuse_inherited`] once, with the first context opened (so before any
/// fork that could inherit one).
static AT_FORK: std::sync::Once = std::sync::Once::new();

pub(super) fn register_once() {
    AT_FORK.call_once(|| {
        // SAFETY: registers a child handler of this library that takes no argument;
        // glibc's pthread_atfork (libc_nonshared.a) passes this object's __dso_handle,
        // so the handler goes when the library is unloaded.
        let r = unsafe { libc::pthread_atfork(None, None, Some(refuse_inherited)) };
        if r != 0 {
            eprintln!(
                "xrnic: pthread_atfork failed ({r}): a fork child could post on its parent's QPs"
            );
        }
    });
}

/// pthread_atfork(3)'s child handler: in the child, its only thread, right after fork().
/// Each context the parent had open gets the refusing data-path verbs in its ops table
/// (the child's copy of it; `ibv_post_send` and the other verbs.h inlines call through
/// `qp->context->ops`). Takes the list's lock only if it is free: a lock another thread
/// of the parent held at the fork stays held in the child for ever (and the next verb of
/// the child waits on it), so nothing here may wait.
extern "C" fn refuse_inherited() {
    let Ok(mut open) = super::CONTEXTS.try_lock() else {
        return;
    };
    let Some(o) = open.as_mut() else {
        return;
    };
    for &p in o.set.iter() {
        // SAFETY: `p` is the `ibv_context` of a context open in the parent at the fork:
        // a leaked box never freed in this process (ibv_close_device of an inherited
        // context frees nothing, crate::context `forget_inherited`); this is the only
        // thread of the child, so no call uses it meanwhile.
        let ops = unsafe { &mut (*(p as *mut ibv_context)).ops };
        ops.poll_cq = Some(poll_cq);
        ops.req_notify_cq = Some(req_notify_cq);
        ops.post_send = Some(post_send);
        ops.post_recv = Some(post_recv);
        ops.post_srq_recv = Some(post_srq_recv);
    }
}

/// `ibv_poll_cq` on an inherited CQ: -1 (a failure to poll, errno EINVAL).
unsafe extern "C" fn poll_cq(_cq: *mut ibv_cq, _n: c_int, _wc: *mut ibv_wc) -> c_int {
    crate::set_errno(libc::EINVAL);
    -1
}

unsafe extern "C" fn req_notify_cq(_cq: *mut ibv_cq, _solicited: c_int) -> c_int {
    crate::set_errno(libc::EINVAL);
    libc::EINVAL
}

/// A post on an inherited QP or SRQ: EINVAL, `*bad` at the first request.
///
/// # Safety
///
/// `bad` is NULL or the caller's out pointer (verbs.h contract).
unsafe fn refuse_post<W>(wr: *mut W, bad: *mut *mut W) -> c_int {
    if !bad.is_null() {
        // SAFETY: the caller's out pointer (this function's contract).
        unsafe { *bad = wr };
    }
    crate::set_errno(libc::EINVAL);
    libc::EINVAL
}

unsafe extern "C" fn post_send(
    _qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: called by ibv_post_send with its caller's out pointer.
    unsafe { refuse_post(wr, bad) }
}

unsafe extern "C" fn post_recv(
    _qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: called by ibv_post_recv with its caller's out pointer.
    unsafe { refuse_post(wr, bad) }
}

unsafe extern "C" fn post_srq_recv(
    _srq: *mut core::ffi::c_void,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: called by ibv_post_srq_recv with its caller's out pointer.
    unsafe { refuse_post(wr, bad) }
}
