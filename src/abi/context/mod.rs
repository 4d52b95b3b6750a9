//! The context module: what a context is ([`XContext`], and the objects made in it, the
//! `XPd`, `XCq`, `XQp`, ... that wrap verbs.h's structures), how an entry point finds
//! the context or object behind a C pointer (the `context`, `xpd`, `xcq`, ... lookups),
//! and the ops table through which the code that opens and closes a device reaches the
//! objects ([`Ops`]), as rdma-core's providers declare their objects and their
//! `to_m*()` casts in one header and fill libibverbs/driver.h's `verbs_context_ops`.
//!
//! Every object module (mr, cq, qp, srq, ah, mcast, events) imports this module and no
//! other object module; device.rs and opened.rs reach the objects only through
//! [`Ops`] (filled by ops.rs) and what this module owns. tests/layering/abi.rs (run by tests/layering.rs) holds
//! that order.

use core::ffi::c_int;
use core::mem::offset_of;
use std::collections::HashSet;
use std::sync::Mutex;

use xrnic::verbs as xv;

use crate::types::*;

mod async_events;
mod completion;
mod fork;
mod objects;

pub use async_events::*;
pub use completion::*;
pub use objects::*;

/// An `ibv_device` and what xrnic needs to open it.
#[repr(C)]
pub struct XDevice {
    pub ibv: ibv_device,
    pub ifname: String,
    pub index: c_int,
}

/// An open device: the `verbs_context` programs see, then xrnic's state.
#[repr(C)]
pub struct XContext {
    pub vctx: verbs_context,
    pub dev: xv::Device,
    pub xdev: &'static XDevice,
    /// The CQs with a completion channel, signalled from the device's completion hook.
    pub notify: std::sync::Arc<Notify>,
    /// The destroy verbs and the event pump of this library ([`Ops`]).
    pub ops: &'static Ops,
}

/// The open contexts (addresses of their `ibv_context`), so that a control verb can
/// refuse a pointer that is not (or no longer) one of ours; the process generation that
/// opened them (`crate::live::generation`); and the contexts a fork child inherited
/// (moved to `inherited` by [`open_set`], see [`forget_inherited`]).
struct Open {
    generation: u32,
    set: HashSet<usize>,
    inherited: HashSet<usize>,
}

static CONTEXTS: Mutex<Option<Open>> = Mutex::new(None);

/// The open contexts of this process: in a fork child, the parent's move to `inherited`
/// on the first look (none of them is open here: docs/verbs-abi.md "fork").
fn open_set(o: &mut Option<Open>) -> &mut Open {
    let g = crate::live::generation();
    let o = o.get_or_insert_with(|| Open {
        generation: g,
        set: HashSet::new(),
        inherited: HashSet::new(),
    });
    if o.generation != g {
        o.generation = g;
        let old = std::mem::take(&mut o.set);
        o.inherited.extend(old);
    }
    o
}

/// Forget `ctx` if it is a context this process inherited through fork() from one that
/// had it open; true when it was one. Such a context is not open here (every verb on it
/// fails EINVAL), and its `ibv_close_device` lets go of the child's copy only
/// (rdma-core's child closes its own descriptor of the uverbs file; the parent's
/// context is untouched).
pub(crate) fn forget_inherited(ctx: *mut ibv_context) -> bool {
    open_set(&mut CONTEXTS.lock().unwrap_or_else(|e| e.into_inner()))
        .inherited
        .remove(&(ctx as usize))
}

const CTX_OFFSET: usize = offset_of!(XContext, vctx) + offset_of!(verbs_context, context);

/// The context behind `ctx`, if it is open.
///
/// # Safety
///
/// The lookup refuses a pointer that is not (or no longer) a live context, but the
/// reference it returns has no lifetime the compiler can check: it is valid only while the
/// context is not destroyed. The caller uses it within the call it serves and the program
/// does not call `ibv_close_device` on it meanwhile (a libibverbs program may not destroy an
/// object while another of its calls uses it).
pub unsafe fn context<'a>(ctx: *mut ibv_context) -> Option<&'a XContext> {
    if !open_set(&mut CONTEXTS.lock().unwrap_or_else(|e| e.into_inner()))
        .set
        .contains(&(ctx as usize))
    {
        return None;
    }
    // SAFETY: `ctx` is the `vctx.context` field of a live boxed XContext (it is in
    // CONTEXTS, which ibv_close_device leaves before freeing it).
    Some(unsafe { &*((ctx as *const u8).sub(CTX_OFFSET) as *const XContext) })
}

/// The device behind `x` is gone (IBV_EVENT_DEVICE_FATAL, src/proto/fatal.rs). Once the
/// kernel has disassociated a device, every command but a destroy fails EIO: rdma_core.c
/// `rdma_lookup_get_uobject` refuses each object lookup but `UVERBS_LOOKUP_DESTROY`, and
/// the device-wide commands (query_device, query_port, the GID-entry ioctl) meet
/// `ib_uverbs_get_ucontext_file`'s EIO. The verbs of this library that would otherwise
/// answer from their own tables (queries, `req_notify_cq`, ...) check this first.
pub(crate) fn gone(x: &XContext) -> bool {
    x.notify.async_q.is_dead() || x.dev.is_fatal()
}

/// [`gone`] for the context behind `ctx` (false for one that is not open).
pub(crate) fn ctx_gone(ctx: *mut ibv_context) -> bool {
    // SAFETY: the program does not close `ctx` while this call uses it.
    unsafe { context(ctx) }.is_some_and(gone)
}

/// Run `f` on every open context, with the list locked (a close waits meanwhile); gives
/// up when the lock is not free within `patience` (another thread holds it at exit).
pub(crate) fn each_open(patience: std::time::Duration, mut f: impl FnMut(&XContext)) {
    let Some(mut open) = xrnic::driver::try_lock_for(&CONTEXTS, patience) else {
        return;
    };
    for &p in open_set(&mut open).set.iter() {
        // SAFETY: `p` is the `vctx.context` field of a live boxed XContext: it is in
        // CONTEXTS, locked here, which ibv_close_device leaves before freeing it.
        f(unsafe { &*((p as *const u8).sub(CTX_OFFSET) as *const XContext) });
    }
}

/// Make `ctx` (the `vctx.context` of a leaked `XContext`) open: [`context`] finds it.
pub(crate) fn register(ctx: *mut ibv_context) {
    fork::register_once();
    open_set(&mut CONTEXTS.lock().unwrap_or_else(|e| e.into_inner()))
        .set
        .insert(ctx as usize);
}

/// Close `ctx`: the box of its `XContext`, or `None` when it is not open.
///
/// # Safety
///
/// No other call of the program uses `ctx` meanwhile (a libibverbs program may not
/// close a context while another of its calls uses it); the box is freed by the caller.
pub(crate) unsafe fn unregister(ctx: *mut ibv_context) -> Option<Box<XContext>> {
    let removed = open_set(&mut CONTEXTS.lock().unwrap_or_else(|e| e.into_inner()))
        .set
        .remove(&(ctx as usize));
    // SAFETY: `ctx` was in CONTEXTS, so it is the `vctx.context` of the XContext
    // ibv_open_device leaked; removed from the set above, nothing else frees it.
    removed.then(|| unsafe { Box::from_raw((ctx as *mut u8).sub(CTX_OFFSET) as *mut XContext) })
}

/// The contexts librdmacm keeps open for its CM (rdmacm_port.rs): the program did not
/// open them and its `ibv_close_device` leaves them (rdma-core's librdmacm closes its
/// own contexts only when it unloads).
static KEPT: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Keep `ctx` open for librdmacm.
pub(crate) fn keep(ctx: *mut ibv_context) {
    KEPT.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(ctx as usize);
}

/// `ctx` is one librdmacm keeps ([`keep`]).
pub(crate) fn is_kept(ctx: *mut ibv_context) -> bool {
    KEPT.lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&(ctx as usize))
}

/// The verbs the device code calls on a context's objects without importing the
/// modules that implement them (rdma-core's `verbs_context_ops`, libibverbs/driver.h):
/// one static table, ops.rs's `OPS`, named by every context.
pub struct Ops {
    pub destroy_qp: extern "C" fn(*mut ibv_qp) -> c_int,
    pub destroy_srq: extern "C" fn(*mut ibv_srq) -> c_int,
    pub destroy_ah: extern "C" fn(*mut ibv_ah) -> c_int,
    pub dereg_mr: extern "C" fn(*mut ibv_mr) -> c_int,
    pub destroy_cq: extern "C" fn(*mut ibv_cq) -> c_int,
    pub dealloc_pd: extern "C" fn(*mut ibv_pd) -> c_int,
}
