//! What the device's completion hook needs of a context: its completion channels and
//! their CQs ([`Notify`]), and the CQ objects (`XCq`) that share their state with it.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use xrnic::verbs as xv;

use crate::live::{self, Kind};
use crate::types::*;

use super::{AsyncQueue, DEAD_COUNT};

#[repr(C)]
pub struct XChannel {
    pub ibv: ibv_comp_channel,
    /// The CQs (`ibv_cq *` as usize) whose events wait to be read.
    pub(crate) events: Mutex<VecDeque<usize>>,
    /// CQs that use this channel: destroying it is EBUSY while any remain.
    pub(crate) users: AtomicUsize,
    /// The device is gone: no event will come after those queued.
    pub(crate) dead: AtomicBool,
}

impl XChannel {
    pub(crate) fn push(&self, cq: usize) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(cq);
        // SAFETY: writes 8 bytes from a live local to our eventfd.
        let _ = unsafe { libc::write(self.ibv.fd, &1u64 as *const u64 as *const c_void, 8) };
    }
}

/// What the completion hook needs of a CQ.
pub struct CqState {
    pub cq: xv::Cq,
    pub(crate) armed: AtomicBool,
    /// `XChannel *` (0: none). The channel outlives the CQ (its `users`).
    pub(crate) channel: usize,
    /// This CQ's `ibv_cq *`, the event's payload.
    pub(crate) ibv: usize,
    /// QPs that use this CQ: destroying it is EBUSY while any remain.
    pub users: AtomicUsize,
    pub(crate) comp_events: AtomicU32,
}

/// A CQ: the `ibv_cq` programs see, inside the `ibv_cq_ex` of the extended polling API
/// (crate::cq `ex`; verbs.h's `ibv_cq_ex_to_cq` is a cast), then xrnic's state.
#[repr(C)]
pub struct XCq {
    pub ibv: ibv_cq_ex,
    pub state: Arc<CqState>,
    /// The completion `start_poll` / `next_poll` last took, read by the `read_*` ops.
    pub(crate) cur: Mutex<Option<Polled>>,
}

/// A completion taken by the extended polling API, with the device clock's reading
/// when it was taken (nanoseconds of CLOCK_MONOTONIC_RAW, and of CLOCK_REALTIME).
#[derive(Clone, Copy)]
pub struct Polled {
    pub wc: xv::WorkCompletion,
    pub ts: u64,
    pub wall_ns: u64,
}

/// The CQs with a channel, of one context.
#[derive(Default)]
pub struct Notify {
    pub(crate) cqs: Mutex<Vec<Arc<CqState>>>,
    /// The context's async events (async_events.rs), moved from the engine by `run`.
    pub async_q: AsyncQueue,
    /// The context's completion channels (`XChannel *` as usize), to wake their readers
    /// when the device goes; a channel leaves before it is freed.
    pub(crate) channels: Mutex<Vec<usize>>,
}

impl Notify {
    /// Turn each armed CQ that holds completions into an event on its channel.
    pub fn run_cqs(&self) {
        let cqs: Vec<Arc<CqState>> = self
            .cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|c| c.armed.load(Ordering::SeqCst))
            .cloned()
            .collect();
        for c in cqs {
            if c.cq.pending().unwrap_or(0) > 0 && c.armed.swap(false, Ordering::SeqCst) {
                // SAFETY: a CQ keeps its channel alive (the channel's `users`).
                unsafe { &*(c.channel as *const XChannel) }.push(c.ibv);
            }
        }
    }

    /// Once the context is dead (DEVICE_FATAL read into its queue), or closed, every
    /// channel of it stays readable: its readers get EIO once drained instead of
    /// blocking for ever (the kernel's closed completion event file, uverbs
    /// `ib_uverbs_event_read`).
    pub fn wake_channels_if_dead(&self, closed: bool) {
        if !closed && !self.async_q.is_dead() {
            return;
        }
        for &ch in self
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            // SAFETY: a listed channel is allocated (destroy unlists it under this
            // lock before freeing it; a closed context's channels stay allocated until
            // the program destroys them).
            let ch = unsafe { &*(ch as *const XChannel) };
            if !ch.dead.swap(true, Ordering::SeqCst) {
                let n = DEAD_COUNT;
                // SAFETY: writes 8 bytes from a live local to the channel's eventfd.
                let _ = unsafe { libc::write(ch.ibv.fd, &n as *const u64 as *const c_void, 8) };
            }
        }
    }
}

/// The CQ behind `cq`, if it is live.
///
/// # Safety
///
/// The lookup refuses a pointer that is not (or no longer) a live CQ, but the
/// reference it returns has no lifetime the compiler can check: it is valid only while the
/// CQ is not destroyed. The caller uses it within the call it serves and the program
/// does not call `ibv_destroy_cq` on it meanwhile (a libibverbs program may not destroy an
/// object while another of its calls uses it).
pub unsafe fn xcq<'a>(cq: *mut ibv_cq) -> Option<&'a XCq> {
    // SAFETY: a live Cq entry is a leaked Box<XCq> whose first field is the ibv_cq.
    live::is(cq, Kind::Cq).then(|| unsafe { &*(cq as *const XCq) })
}
