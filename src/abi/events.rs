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
use std::collections::HashMap;

use crate::context::{
    ACKED, ACKS, IBV_EVENT_CQ_ERR, IBV_EVENT_SRQ_LIMIT_REACHED, context, is_port_event,
};
use crate::types::*;
use crate::{guard, set_errno};

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
