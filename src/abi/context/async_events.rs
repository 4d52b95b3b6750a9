//! A context's asynchronous events as the device's completion hook queues them
//! ([`pump`]), and the destroy's wait for their acknowledgement ([`forget`]); events.rs
//! hands them to the program.

use core::ffi::{c_int, c_void};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};

use xrnic::verbs::{self as xv, AsyncEvent};

use crate::live::{self, Kind};
use crate::types::*;

use super::{Notify, XCq, by_num, context};

/// `enum ibv_event_type` (verbs.h).
pub const IBV_EVENT_CQ_ERR: c_int = 0;
pub const IBV_EVENT_QP_FATAL: c_int = 1;
pub const IBV_EVENT_QP_REQ_ERR: c_int = 2;
pub const IBV_EVENT_QP_ACCESS_ERR: c_int = 3;
pub const IBV_EVENT_COMM_EST: c_int = 4;
pub const IBV_EVENT_SQ_DRAINED: c_int = 5;
pub const IBV_EVENT_DEVICE_FATAL: c_int = 8;
pub const IBV_EVENT_PORT_ACTIVE: c_int = 9;
pub const IBV_EVENT_PORT_ERR: c_int = 10;
pub const IBV_EVENT_SRQ_LIMIT_REACHED: c_int = 15;
pub const IBV_EVENT_QP_LAST_WQE_REACHED: c_int = 16;

/// PORT_ACTIVE / PORT_ERR / DEVICE_FATAL: the element is a port number, not an object.
pub(crate) fn is_port_event(t: c_int) -> bool {
    matches!(
        t,
        IBV_EVENT_PORT_ACTIVE | IBV_EVENT_PORT_ERR | IBV_EVENT_DEVICE_FATAL
    )
}

/// What the async fd's count is raised by once the device is fatal: reads never block
/// again (an eventfd holds up to 2^64 - 2; this is never read down).
pub(crate) const DEAD_COUNT: u64 = 1 << 48;

/// One event waiting to be read: the element (`ibv_qp *`, ... as usize), its type.
type Item = (usize, c_int);

/// The events of one context, waiting to be read.
#[derive(Default)]
pub struct AsyncQueue {
    /// The context (`ibv_context *` as usize) and its async fd, set once the context
    /// exists.
    pub(crate) src: OnceLock<(usize, c_int)>,
    pub(crate) events: Mutex<VecDeque<Item>>,
    /// DEVICE_FATAL was queued: the device is gone.
    pub(crate) dead: AtomicBool,
}

/// Per object (`ibv_qp *`, `ibv_cq *`, `ibv_srq *` as usize): events handed out by
/// `ibv_get_async_event` and events acknowledged. An entry exists only while its object
/// is allocated (destroy removes it before freeing).
pub(crate) static ACKS: Mutex<Option<HashMap<usize, (u32, u32)>>> = Mutex::new(None);
pub(crate) static ACKED: Condvar = Condvar::new();

fn qp_by_num(ctx: usize, qpn: u32) -> Option<usize> {
    live::find(Kind::Qp, |p| {
        // SAFETY: `p` is a live Qp entry (a leaked Box<XQp> whose first field is the
        // ibv_qp); find holds the table's lock, ibv_destroy_qp removes it before freeing.
        let q = unsafe { &*(p as *const ibv_qp) };
        q.context as usize == ctx && q.qp_num == qpn
    })
}

/// The CQ of context `ctx` for which `is` holds (given the CQ's xrnic handle).
fn cq_where(ctx: usize, is: impl Fn(&xv::Cq) -> bool) -> Option<usize> {
    live::find(Kind::Cq, |p| {
        // SAFETY: as in `qp_by_num`, for a leaked Box<XCq>.
        let x = unsafe { &*(p as *const XCq) };
        x.ibv.context as usize == ctx && is(&x.state.cq)
    })
}

/// PORT_ACTIVE / PORT_ERR / DEVICE_FATAL: events of the device, not of one object.
fn is_device_event(ev: &AsyncEvent) -> bool {
    matches!(
        ev,
        AsyncEvent::PortActive(_) | AsyncEvent::PortErr(_) | AsyncEvent::DeviceFatal
    )
}

/// What context `ctx` reads for `ev`: the element (its own object, looked up in the
/// live table, or the port number) and the type; `None` when the object the event is
/// about is not one of `ctx`'s (another context's, or already destroyed).
fn element(ctx: usize, ev: &AsyncEvent) -> Option<Item> {
    match *ev {
        AsyncEvent::SrqLimitReached(s) => {
            by_num(ctx as *mut ibv_context, s.0).map(|p| (p as usize, IBV_EVENT_SRQ_LIMIT_REACHED))
        }
        AsyncEvent::CommEst(n) => qp_by_num(ctx, n.value()).map(|p| (p, IBV_EVENT_COMM_EST)),
        AsyncEvent::QpLastWqeReached(n) => {
            qp_by_num(ctx, n.value()).map(|p| (p, IBV_EVENT_QP_LAST_WQE_REACHED))
        }
        AsyncEvent::QpFatal(n) => qp_by_num(ctx, n.value()).map(|p| (p, IBV_EVENT_QP_FATAL)),
        AsyncEvent::QpReqErr(n) => qp_by_num(ctx, n.value()).map(|p| (p, IBV_EVENT_QP_REQ_ERR)),
        AsyncEvent::QpAccessErr(n) => {
            qp_by_num(ctx, n.value()).map(|p| (p, IBV_EVENT_QP_ACCESS_ERR))
        }
        AsyncEvent::SqDrained(n) => qp_by_num(ctx, n.value()).map(|p| (p, IBV_EVENT_SQ_DRAINED)),
        // The element of a port event is the port number (`element.port_num`).
        AsyncEvent::PortActive(p) => Some((usize::from(p), IBV_EVENT_PORT_ACTIVE)),
        AsyncEvent::PortErr(p) => Some((usize::from(p), IBV_EVENT_PORT_ERR)),
        AsyncEvent::CqErr(c) => {
            cq_where(ctx, |x| x.engine_cq() == Some(c)).map(|p| (p, IBV_EVENT_CQ_ERR))
        }
        AsyncEvent::DeviceFatal => Some((0, IBV_EVENT_DEVICE_FATAL)),
    }
}

/// Move the engine's events to the queues of the device's open contexts `ctxs`
/// (`ibv_context *` as usize, and each one's [`Notify`]); the device's
/// completion hook calls this, with the engine unlocked (crate::opened). An event about
/// a QP, CQ or SRQ goes to the context that made the object, with that context's
/// pointer as the element, as the kernel's uverbs queues an affiliated event on the
/// event file of the object's own context (uverbs_main.c `ib_uverbs_qp_event_handler`
/// and friends, through the object's `uobject->ufile`). A port event and DEVICE_FATAL
/// go to every context of the device, as each context registers its own handler for
/// the device's unaffiliated events (`ib_uverbs_event_handler`). An event about an
/// object already destroyed has no one to go to.
pub fn pump(dev: &xv::Device, ctxs: &[(usize, std::sync::Arc<Notify>)]) {
    while let Some(ev) = dev.poll_async_event() {
        if is_device_event(&ev) {
            for (_, n) in ctxs {
                n.async_q.deliver(&ev);
            }
        } else if let Some((_, n)) = ctxs.iter().find(|(c, _)| element(*c, &ev).is_some()) {
            n.async_q.deliver(&ev);
        }
    }
}

impl AsyncQueue {
    /// Name the context whose events this queue holds.
    pub fn attach(&self, ctx: *mut ibv_context, fd: c_int) {
        let _ = self.src.set((ctx as usize, fd));
    }

    /// Queue `ev` and count it on the fd. The element is looked up (again, in this
    /// context) and the event queued under the queue's lock, which [`forget`] takes
    /// after a destroy removed its object from the live table: no event names a freed
    /// object.
    fn deliver(&self, ev: &AsyncEvent) {
        let Some(&(ctx, fd)) = self.src.get() else {
            return;
        };
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let Some(item) = element(ctx, ev) else {
            return;
        };
        // Marked dead with the event queued, under the queue's lock: a program that
        // has read DEVICE_FATAL finds the context dead (ibv_create_comp_channel EIO).
        let first_fatal =
            item.1 == IBV_EVENT_DEVICE_FATAL && !self.dead.swap(true, Ordering::SeqCst);
        q.push_back(item);
        drop(q);
        // SAFETY: writes 8 bytes from a live local to the context's eventfd (open while
        // the context is among its device's contexts, crate::opened).
        let _ = unsafe { libc::write(fd, &1u64 as *const u64 as *const c_void, 8) };
        if first_fatal {
            // SAFETY: as above.
            let _ = unsafe { libc::write(fd, &DEAD_COUNT as *const u64 as *const c_void, 8) };
        }
    }

    /// DEVICE_FATAL was delivered to this queue: the device is gone.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }
}

/// Called by ibv_destroy_qp / _cq / _srq once `element` left the live table and before
/// it is freed: drop its events not yet read, then wait until every event handed out
/// for it is acknowledged (rdma-core's destroy waits the same way: `events_completed`
/// against the kernel's `events_reported`).
///
/// A destroy made by `ibv_close_device` (the context is no longer open, crate::opened
/// `destroy_objects`) does not wait: the kernel's close destroys a context's objects
/// whatever events were left unacknowledged (uverbs `ib_uverbs_cleanup_ufile`).
pub fn forget(ctx: *mut ibv_context, element: usize) {
    // SAFETY: the program does not close `ctx` while this call uses it.
    let open = unsafe { context(ctx) };
    if let Some(x) = open {
        x.notify
            .async_q
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&(el, _)| el != element);
    }
    let mut g = ACKS.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let m = g.get_or_insert_with(HashMap::new);
        match m.get(&element) {
            Some(&(out, acked)) if acked < out && open.is_some() => {}
            _ => {
                m.remove(&element);
                return;
            }
        }
        g = ACKED.wait(g).unwrap_or_else(|e| e.into_inner());
    }
}
