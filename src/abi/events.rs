//! Asynchronous events: the context's `async_fd`, `ibv_get_async_event`,
//! `ibv_ack_async_event`.
//!
//! The fd is an eventfd in semaphore mode, one count per queued event: `poll`/`epoll`
//! see it readable while an event waits, `ibv_get_async_event` blocks on it (or fails
//! EAGAIN when the program made it O_NONBLOCK, as with rdma-core's fd). The engine
//! queues its events ([`xrnic::verbs::Device::poll_async_event`]); the device's
//! completion hook moves them here ([`AsyncQueue::pump`]), so an event reaches the fd
//! with the completion that follows it (the SRQ limit: the receive that took the SRQ
//! below its limit). The hook looks only while the context has an SRQ (the one source
//! of events today), so RC-only programs pay nothing.
//!
//! Events: IBV_EVENT_SRQ_LIMIT_REACHED (element: the `ibv_srq *`). The engine raises no
//! QP events yet (QP_FATAL, COMM_EST, LAST_WQE_REACHED) nor port events: docs/verbs-abi.md.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};
use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};

use xrnic::verbs::{self as xv, AsyncEvent};

use crate::device::context;
use crate::types::*;
use crate::{guard, set_errno};

/// `IBV_EVENT_SRQ_LIMIT_REACHED` of `enum ibv_event_type`.
pub const IBV_EVENT_SRQ_LIMIT_REACHED: c_int = 15;

/// The events of one context, waiting to be read.
#[derive(Default)]
pub struct AsyncQueue {
    /// The device, the context (`ibv_context *` as usize) and its async fd, set once
    /// the context exists.
    src: OnceLock<(xv::Device, usize, c_int)>,
    events: Mutex<VecDeque<(usize, c_int)>>,
    /// Objects that can raise events (SRQs): the hook looks only while non-zero.
    pub interest: AtomicUsize,
}

impl AsyncQueue {
    /// Name the context whose engine events this queue takes.
    pub fn attach(&self, dev: xv::Device, ctx: *mut ibv_context, fd: c_int) {
        let _ = self.src.set((dev, ctx as usize, fd));
    }

    /// Move the engine's events to the queue and count each on the fd (the completion
    /// hook calls this, with the engine unlocked).
    pub fn pump(&self) {
        if self.interest.load(Ordering::SeqCst) == 0 {
            return;
        }
        let Some((dev, ctx, fd)) = self.src.get() else {
            return;
        };
        while let Some(ev) = dev.poll_async_event() {
            let item = match ev {
                AsyncEvent::SrqLimitReached(s) => crate::srq::by_num(*ctx as *mut ibv_context, s.0)
                    .map(|p| (p as usize, IBV_EVENT_SRQ_LIMIT_REACHED)),
            };
            // An event about an object already destroyed has no one to go to.
            let Some(item) = item else { continue };
            self.events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_back(item);
            // SAFETY: writes 8 bytes from a live local to the context's eventfd.
            let _ = unsafe { libc::write(*fd, &1u64 as *const u64 as *const c_void, 8) };
        }
    }
}

/// `ibv_get_async_event`: 0 with `*event` filled, or -1 with errno (the read's: EAGAIN
/// on a non-blocking fd with nothing queued).
pub extern "C" fn ibv_get_async_event(ctx: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    guard(-1, || {
        let Some(x) = context(ctx) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if event.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let fd = x.vctx.context.async_fd;
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live local.
        if unsafe { libc::read(fd, &mut v as *mut u64 as *mut c_void, 8) } != 8 {
            return -1;
        }
        let ev = x
            .notify
            .async_q
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        let Some((element, event_type)) = ev else {
            set_errno(libc::EAGAIN);
            return -1;
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

/// `ibv_ack_async_event`: counts the event on its object (`events_completed`, the
/// field rdma-core's destroy verbs wait on; xrnic's destroy does not wait).
pub extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    guard((), || {
        if event.is_null() {
            return;
        }
        // SAFETY: `event` points to an event ibv_get_async_event filled.
        let e = unsafe { &*event };
        if e.event_type == IBV_EVENT_SRQ_LIMIT_REACHED {
            let srq = e.element as *mut ibv_srq;
            if crate::srq::xsrq(srq).is_some() {
                // SAFETY: a live SRQ (a leaked Box<XSrq> whose first field is this
                // ibv_srq); its counter is the program's, written through the raw
                // pointer, as rdma-core does under the SRQ's mutex.
                unsafe {
                    let p = core::ptr::addr_of_mut!((*srq).events_completed);
                    p.write(p.read().wrapping_add(1));
                }
            }
        }
    })
}
