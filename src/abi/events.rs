//! Asynchronous events: the context's `async_fd`, `ibv_get_async_event`,
//! `ibv_ack_async_event`.
//!
//! The fd is an eventfd in semaphore mode, one count per queued event: `poll`/`epoll`
//! see it readable while an event waits, `ibv_get_async_event` blocks on it (or fails
//! EAGAIN when the program made it O_NONBLOCK, as with rdma-core's fd). The engine
//! queues its events ([`xrnic::verbs::Device::poll_async_event`]); the driver runs the
//! device's completion hook after a step that added completions or events, and the hook
//! moves each to the queue of the context it belongs to ([`pump`]: several contexts of
//! one device share its engine, crate::opened).
//!
//! Events (element in brackets): IBV_EVENT_SRQ_LIMIT_REACHED (the `ibv_srq *`),
//! IBV_EVENT_COMM_EST, IBV_EVENT_QP_LAST_WQE_REACHED, IBV_EVENT_QP_FATAL,
//! IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR (the `ibv_qp *`), IBV_EVENT_CQ_ERR (the
//! `ibv_cq *`): the engine's [`AsyncEvent`] says when each is raised.
//!
//! IBV_EVENT_DEVICE_FATAL (element.port_num 0, as uverbs_main.c
//! `ib_uverbs_free_hw_resources` sends it): the device's interface was deleted
//! (src/verbs/link_watch.rs). It is delivered once; after it the fd stays readable and
//! `ibv_get_async_event` fails EIO once the queue is empty, as the kernel's closed event
//! file answers reads (`ib_uverbs_event_read`): a program waiting for more never hangs.
//!
//! Acknowledgement as rdma-core's (libibverbs/device.c, cmd_destroy_*): the library
//! counts the events `ibv_get_async_event` handed out for each object, and
//! `ibv_ack_async_event` the ones acknowledged, into the object's `events_completed`
//! (`async_events_completed` for a CQ). Destroying a QP, CQ or SRQ drops its events not
//! yet read and waits until every event handed out for it is acknowledged.

use core::ffi::{c_int, c_void};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};

use xrnic::verbs::{self as xv, AsyncEvent};

use crate::device::context;
use crate::live::{self, Kind};
use crate::types::*;
use crate::{guard, set_errno};

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
fn is_port_event(t: c_int) -> bool {
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
    src: OnceLock<(usize, c_int)>,
    events: Mutex<VecDeque<Item>>,
    /// DEVICE_FATAL was queued: the device is gone.
    dead: AtomicBool,
}

/// Per object (`ibv_qp *`, `ibv_cq *`, `ibv_srq *` as usize): events handed out by
/// `ibv_get_async_event` and events acknowledged. An entry exists only while its object
/// is allocated (destroy removes it before freeing).
static ACKS: Mutex<Option<HashMap<usize, (u32, u32)>>> = Mutex::new(None);
static ACKED: Condvar = Condvar::new();

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
        let x = unsafe { &*(p as *const crate::cq::XCq) };
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
        AsyncEvent::SrqLimitReached(s) => crate::srq::by_num(ctx as *mut ibv_context, s.0)
            .map(|p| (p as usize, IBV_EVENT_SRQ_LIMIT_REACHED)),
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
/// (`ibv_context *` as usize, and each one's [`crate::cq::Notify`]); the device's
/// completion hook calls this, with the engine unlocked (crate::opened). An event about
/// a QP, CQ or SRQ goes to the context that made the object, with that context's
/// pointer as the element, as the kernel's uverbs queues an affiliated event on the
/// event file of the object's own context (uverbs_main.c `ib_uverbs_qp_event_handler`
/// and friends, through the object's `uobject->ufile`). A port event and DEVICE_FATAL
/// go to every context of the device, as each context registers its own handler for
/// the device's unaffiliated events (`ib_uverbs_event_handler`). An event about an
/// object already destroyed has no one to go to.
pub fn pump(dev: &xv::Device, ctxs: &[(usize, std::sync::Arc<crate::cq::Notify>)]) {
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

/// `ibv_get_async_event`: 0 with `*event` filled, or -1 with errno (the read's: EAGAIN
/// on a non-blocking fd with nothing queued).
pub extern "C" fn ibv_get_async_event(ctx: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not close `ctx` while this call uses it.
        let Some(x) = (unsafe { context(ctx) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if event.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let fd = x.vctx.context.async_fd;
        // A count whose event was dropped (its object destroyed before it was read)
        // finds the queue empty: read the next one.
        let (element, event_type) = loop {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a live local.
            if unsafe { libc::read(fd, &mut v as *mut u64 as *mut c_void, 8) } != 8 {
                return -1;
            }
            let mut q = x
                .notify
                .async_q
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if q.is_empty() && x.notify.async_q.is_dead() {
                // The device is gone and its last event was read (the count read is one
                // of DEAD_COUNT's).
                set_errno(libc::EIO);
                return -1;
            }
            if let Some(item) = q.pop_front() {
                // Counted before the queue's lock goes: a destroy that purges the
                // queue next then waits for this event's acknowledgement. A port event
                // names no object (nothing waits for it).
                if !is_port_event(item.1) {
                    let mut g = ACKS.lock().unwrap_or_else(|e| e.into_inner());
                    g.get_or_insert_with(HashMap::new)
                        .entry(item.0)
                        .or_insert((0, 0))
                        .0 += 1;
                }
                break item;
            }
        };
        // SAFETY: `event` points to the caller's ibv_async_event.
        unsafe {
            event.write(ibv_async_event {
                element: element as *mut c_void,
                event_type,
            })
        };
        0
    })
}

/// `ibv_ack_async_event`: counts the event on its object (`events_completed`, or a CQ's
/// `async_events_completed`) and wakes a destroy waiting for it.
pub extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    guard((), || {
        if event.is_null() {
            return;
        }
        // SAFETY: `event` points to an event ibv_get_async_event filled.
        let e = unsafe { &*event };
        if is_port_event(e.event_type) {
            // The element is a port number, no object: nothing to count.
            return;
        }
        let el = e.element as usize;
        let mut g = ACKS.lock().unwrap_or_else(|e| e.into_inner());
        let Some(n) = g.as_mut().and_then(|m| m.get_mut(&el)) else {
            return;
        };
        n.1 = n.1.wrapping_add(1);
        // SAFETY: the entry exists, so the object is still allocated (its destroy
        // removes the entry under this lock before freeing it); the counter is the
        // program's, written as rdma-core does under the object's mutex.
        unsafe {
            let p = match e.event_type {
                IBV_EVENT_CQ_ERR => {
                    core::ptr::addr_of_mut!((*(el as *mut ibv_cq)).async_events_completed)
                }
                IBV_EVENT_SRQ_LIMIT_REACHED => {
                    core::ptr::addr_of_mut!((*(el as *mut ibv_srq)).events_completed)
                }
                _ => core::ptr::addr_of_mut!((*(el as *mut ibv_qp)).events_completed),
            };
            p.write(p.read().wrapping_add(1));
        }
        drop(g);
        ACKED.notify_all();
    })
}
