//! The devices the program has open, each shared by its contexts.
//!
//! A program may open one device as many times as it likes (rdma-core: each
//! `ibv_open_device` is a new `ibv_context`, its own file on the uverbs device): UCX
//! opens a device once per memory domain and per interface, MPI stacks and test suites
//! open, close and reopen, librdmacm opens its own (crate::rdmacm_port). An xrnic device
//! is an engine, a driver thread, an AF_XDP socket and the interface's XDP program,
//! which one process can hold only once: so the first `ibv_open_device` of an interface
//! opens the device ([`xrnic::verbs::Device`]) and puts it in [`OPENED`], and each later
//! one makes a new context on that same device. The device is let go when its last
//! context closes.
//!
//! Who owns what:
//! - [`Opened`]: the device (an `xv::Device` handle) and its open contexts, each with
//!   its [`Notify`] (CQ channels, async event queue). The device's completion hook (one
//!   per device) runs every context's CQ events, then moves the engine's async events
//!   to the context that owns each object (crate::context `pump`), all under the list's
//!   lock, so that a context that closes (it leaves the list first) gets nothing
//!   written to its fds afterwards.
//! - Each context (crate::context `XContext`) holds a handle of the device, and each
//!   object made in it one more (through the xrnic object); objects are tagged with
//!   their context (`ibv_qp.context`, ...), and one context cannot use another's (the
//!   PD, CQs and SRQ of a QP, the channel of a CQ: EINVAL, as the kernel's per-file
//!   handle lookup fails).
//! - `ibv_close_device` destroys what the closed context still has ([`destroy_objects`]:
//!   QPs, SRQs, AHs, MRs, CQs, PDs, in that order, as the kernel's uverbs destroys a
//!   context's objects when its file closes, `ib_uverbs_cleanup_ufile`); the other
//!   contexts of the device and their traffic go on. Its completion channels stay
//!   allocated until the program destroys them (rdma-core frees an `ibv_comp_channel`
//!   only in `ibv_destroy_comp_channel`), readable and failing EIO once drained.
//! - The last close writes the final stat snapshot (before its objects go, so it shows
//!   them as the program left them), removes the hook and drops the device: the driver
//!   thread stops, the socket closes, XDP is detached, and the interface opens again.

use std::sync::{Arc, Mutex};

use xrnic::verbs as xv;

use crate::context::{Notify, Ops};
use crate::live::Kind;
use crate::types::*;

/// The open contexts of one device: `ibv_context *` as usize, and each one's [`Notify`].
pub type Contexts = Arc<Mutex<Vec<(usize, Arc<Notify>)>>>;

/// One device the program has open.
pub struct Opened {
    /// The process generation that opened it (`crate::live::generation`): a fork child
    /// never uses its parent's device, whose driver thread, socket and service
    /// connection are the parent's (docs/verbs-abi.md "fork"); it opens its own.
    pub generation: u32,
    pub ifname: String,
    pub dev: xv::Device,
    pub ctxs: Contexts,
}

/// The devices open now, at most one live (not fatal) per interface and process
/// generation. A device that went fatal (its interface deleted) stays listed until its
/// last context closes; a new open of the interface then opens a fresh device. In a fork
/// child the parent's entries stay listed, never used and never dropped: dropping one
/// would join a driver thread that does not exist in the child.
static OPENED: Mutex<Vec<Opened>> = Mutex::new(Vec::new());

/// The device's completion hook: every context's armed CQs, then the engine's async
/// events to their contexts, then the wake-up of a dead context's channels.
fn run_hook(dev: &xv::Device, ctxs: &Contexts) {
    let g = ctxs.lock().unwrap_or_else(|e| e.into_inner());
    for (_, n) in g.iter() {
        n.run_cqs();
    }
    crate::context::pump(dev, &g);
    for (_, n) in g.iter() {
        n.wake_channels_if_dead(false);
    }
}

/// The live device of `ifname` with a new context `ctx` (its `notify`) added: the one
/// already open, else `open()`'s, with its completion hook set.
pub fn add_context(
    ifname: &str,
    open: impl FnOnce() -> xv::Result<xv::Device>,
    make_ctx: impl FnOnce(xv::Device) -> Option<(usize, Arc<Notify>)>,
) -> xv::Result<Option<usize>> {
    let mut g = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    let generation = crate::live::generation();
    let found = g
        .iter()
        .position(|o| o.generation == generation && o.ifname == ifname && !o.dev.is_fatal());
    let i = match found {
        Some(i) => i,
        None => {
            let dev = open()?;
            let ctxs: Contexts = Arc::default();
            let (d, c) = (dev.clone(), ctxs.clone());
            dev.set_completion_hook(Some(Arc::new(move || run_hook(&d, &c))))?;
            g.push(Opened {
                generation,
                ifname: ifname.to_string(),
                dev,
                ctxs,
            });
            g.len() - 1
        }
    };
    let o = &g[i];
    let Some((ctx, notify)) = make_ctx(o.dev.clone()) else {
        if o.ctxs.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            // The first context failed: nothing holds the device.
            let o = g.remove(i);
            let _ = o.dev.set_completion_hook(None);
        }
        return Ok(None);
    };
    o.ctxs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((ctx, notify));
    Ok(Some(ctx))
}

/// Take context `ctx` off its device's list (the hook no longer runs it). Returns
/// whether it was the device's last: the device then leaves [`OPENED`] and its hook is
/// removed (it held a handle of the device).
pub fn remove_context(ctx: usize) -> bool {
    let mut g = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    let generation = crate::live::generation();
    let Some(i) = g.iter().position(|o| {
        o.generation == generation
            && o.ctxs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|&(c, _)| c == ctx)
    }) else {
        // Not listed (not expected): nothing to let go.
        return false;
    };
    let last = {
        let mut l = g[i].ctxs.lock().unwrap_or_else(|e| e.into_inner());
        l.retain(|&(c, _)| c != ctx);
        l.is_empty()
    };
    if last {
        let o = g.remove(i);
        drop(g);
        let _ = o.dev.set_completion_hook(None);
    }
    last
}

/// Destroy every object context `ctx` still has, through the library's own destroys
/// (which then do not wait for unacknowledged async events, crate::events `forget`,
/// since the context is no longer open), in the order that leaves no object in use:
/// QPs, SRQs, AHs, MRs, CQs, PDs. The kernel's uverbs does the same for a closed
/// context's file (`ib_uverbs_cleanup_ufile`, `uverbs_destroy_ufile_hw`). Completion
/// channels stay (see the module comment). Returns how many objects went.
pub fn destroy_objects(ctx: *mut ibv_context, ops: &Ops) -> usize {
    let mut n = 0;
    for kind in [Kind::Qp, Kind::Srq, Kind::Ah, Kind::Mr, Kind::Cq, Kind::Pd] {
        for p in crate::live::of_context(kind, ctx) {
            let r = match kind {
                Kind::Qp => (ops.destroy_qp)(p as *mut ibv_qp),
                Kind::Srq => (ops.destroy_srq)(p as *mut ibv_srq),
                Kind::Ah => (ops.destroy_ah)(p as *mut ibv_ah),
                Kind::Mr => (ops.dereg_mr)(p as *mut ibv_mr),
                Kind::Cq => (ops.destroy_cq)(p as *mut ibv_cq),
                Kind::Pd => (ops.dealloc_pd)(p as *mut ibv_pd),
                Kind::Channel => 0,
            };
            if r == 0 {
                n += 1;
            } else {
                // Not expected: one context's objects are used by none of another's.
                eprintln!(
                    "xrnic: ibv_close_device: a {kind:?} of the context not destroyed: errno {r}"
                );
            }
        }
    }
    n
}
