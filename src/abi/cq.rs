//! Completion queues and completion channels.
//!
//! - A channel's `fd` is an eventfd in semaphore mode: one count per event, so `poll`,
//!   `epoll` and a blocking `ibv_get_cq_event` all work on it; the events themselves (which
//!   CQ) wait in a queue beside it.
//! - `ibv_req_notify_cq` arms a CQ; the device's completion hook ([`Notify::run`], called by
//!   the driver after completions may have arrived) turns each armed, non-empty CQ into one
//!   event on its channel and disarms it, as a CQ's notification is one-shot (IBTA vol. 1
//!   §11.4.2.2). `solicited_only` is treated as "any completion" (an extra event is
//!   harmless: the program polls and finds the completion).
//! - Once the device is fatal (IBV_EVENT_DEVICE_FATAL, crate::events) every channel of
//!   the context stays readable and `ibv_get_cq_event` fails EIO when no event is left,
//!   as the kernel's closed completion event file answers (`ib_uverbs_event_read`): the
//!   events of the flushed CQs come first, then no thread waits for ever.
//! - `ibv_poll_cq` (through `ctx->ops`) converts into a per-thread buffer: no allocation
//!   per call once warm; the engine lock is held only for the drain.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use xrnic::verbs::WorkCompletion;

use crate::context::{CqState, XChannel, XCq, context, next_handle, xcq};

mod ex;
pub use ex::{create_cq_ex, ibv_resize_cq, query_rt_values};
use xrnic::verbs::ibv::conv::wc_opcode_to_ibv;

use crate::live::{self, Kind};
use crate::types::*;
use crate::{guard, ret, set_errno};

pub extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    guard(core::ptr::null_mut(), || {
        // SAFETY: the program does not close `ctx` while this call uses it.
        let Some(x) = (unsafe { context(ctx) }) else {
            set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        };
        if x.notify.async_q.is_dead() {
            set_errno(libc::EIO);
            return core::ptr::null_mut();
        }
        // SAFETY: eventfd has no memory arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return core::ptr::null_mut();
        }
        let p = Box::into_raw(Box::new(XChannel {
            ibv: ibv_comp_channel {
                context: ctx,
                fd,
                refcnt: 0,
            },
            events: Mutex::new(VecDeque::new()),
            users: AtomicUsize::new(0),
            dead: AtomicBool::new(false),
        }));
        live::add(p, Kind::Channel);
        x.notify
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(p as usize);
        p as *mut ibv_comp_channel
    })
}

pub extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || {
        if !live::is(ch, Kind::Channel) {
            return ret(Err(libc::EINVAL));
        }
        // SAFETY: live Channel: a leaked Box<XChannel>.
        if unsafe { &*(ch as *const XChannel) }
            .users
            .load(Ordering::SeqCst)
            > 0
        {
            return ret(Err(libc::EBUSY));
        }
        if !live::remove(ch, Kind::Channel) {
            return ret(Err(libc::EINVAL));
        }
        // SAFETY: removed above, so freed once; the fd is ours.
        let x = unsafe { Box::from_raw(ch as *mut XChannel) };
        // SAFETY: the program does not close `x.ibv.context` while this call uses it.
        if let Some(c) = unsafe { context(x.ibv.context) } {
            c.notify
                .channels
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|&p| p != ch as usize);
        }
        // SAFETY: closes our own eventfd once.
        unsafe { libc::close(x.ibv.fd) };
        0
    })
}

/// `ibv_get_cq_event`: blocks (unless the program made the fd non-blocking) until an
/// event arrives; 0, or -1 with errno.
pub extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        if !live::is(ch, Kind::Channel) || cq.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: live Channel: a leaked Box<XChannel>; destroying it while a thread
        // waits here is the program's error, as with rdma-core.
        let x = unsafe { &*(ch as *const XChannel) };
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live local.
        if unsafe { libc::read(x.ibv.fd, &mut v as *mut u64 as *mut c_void, 8) } != 8 {
            return -1;
        }
        let ev = x
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        let Some(c) = ev else {
            // Nothing queued: the device is gone (the count was one of DEAD_COUNT's),
            // or a count raced ahead of its event.
            set_errno(if x.dead.load(Ordering::SeqCst) {
                libc::EIO
            } else {
                libc::EAGAIN
            });
            return -1;
        };
        let c = c as *mut ibv_cq;
        // SAFETY: the CQ of an event is live until the program acknowledges the event
        // and destroys it (the verbs contract); the out pointers are the caller's.
        unsafe {
            *cq = c;
            *cq_context = (*c).cq_context;
        }
        0
    })
}

pub extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: u32) {
    guard((), || {
        // SAFETY: the program does not destroy the CQ `cq` while this call uses it.
        if let Some(x) = unsafe { xcq(cq) } {
            x.state.comp_events.fetch_add(n, Ordering::SeqCst);
        }
    })
}

pub extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard(core::ptr::null_mut(), || {
        let a = NewCq {
            cqe: i64::from(cqe),
            cq_context,
            channel,
            comp_vector: i64::from(comp_vector),
            wc_flags: ex::STANDARD_WC_FLAGS,
        };
        match make(ctx, &a) {
            Ok(p) => p as *mut ibv_cq,
            Err(e) => {
                set_errno(e);
                core::ptr::null_mut()
            }
        }
    })
}

/// What a new CQ is asked for, by `ibv_create_cq` or `ibv_create_cq_ex`.
pub(crate) struct NewCq {
    pub cqe: i64,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: i64,
    /// The `wc_flags` of `ibv_create_cq_ex` (`ibv_create_cq`: the standard ones).
    pub wc_flags: u64,
}

/// A new CQ in context `ctx`, or the errno.
pub(crate) fn make(ctx: *mut ibv_context, a: &NewCq) -> Result<*mut XCq, c_int> {
    // SAFETY: the program does not close `ctx` while this call uses it.
    let x = unsafe { context(ctx) }.ok_or(libc::EINVAL)?;
    let max = x.dev.query_device().max_cqe;
    let channel = a.channel;
    // A channel of another context is EINVAL, as the kernel's lookup of the channel's
    // fd in this context's file fails (uverbs_cmd.c `ib_uverbs_lookup_comp_file`):
    // each context's objects stay its own (crate::opened).
    let foreign = || {
        // SAFETY: checked live first (the `||` below): a leaked Box<XChannel>.
        unsafe { (*channel).context != ctx }
    };
    // A completion vector the context does not have (`num_comp_vectors`, one: every
    // CQ's events come from the one completion hook) is EINVAL, as the kernel's
    // `ib_uverbs_create_cq` answers `comp_vector >= num_comp_vectors`.
    if a.cqe < 1
        || a.cqe > i64::from(max)
        || a.comp_vector < 0
        || a.comp_vector >= i64::from(x.vctx.context.num_comp_vectors)
        || (!channel.is_null() && (!live::is(channel, Kind::Channel) || foreign()))
    {
        return Err(libc::EINVAL);
    }
    // Rounded as rxe rounds it (rxe_queue.c `rxe_queue_init`) and reported in
    // `cq->cqe`: 100 becomes 127; the maximum stays (a power of two less one).
    let cqe = round_cqe(a.cqe as u32, max);
    let cq = x.dev.create_cq(cqe as usize).map_err(|e| e.errno())?;
    // SAFETY: ibv_cq_ex is C data for which all-zero is valid (NULL pointers, absent
    // ops, zero counts, PTHREAD_MUTEX_INITIALIZER / PTHREAD_COND_INITIALIZER on glibc).
    let mut ibv: ibv_cq_ex = unsafe { core::mem::zeroed() };
    ibv.context = ctx;
    ibv.channel = channel;
    ibv.cq_context = a.cq_context;
    ibv.handle = next_handle();
    ibv.cqe = cqe as c_int;
    ex::fill(&mut ibv, a.wc_flags);
    let b = Box::new(XCq {
        ibv,
        state: Arc::new(CqState {
            cq,
            armed: AtomicBool::new(false),
            channel: channel as usize,
            ibv: 0,
            users: AtomicUsize::new(0),
            comp_events: AtomicU32::new(0),
        }),
        cur: Mutex::new(None),
    });
    let p = Box::into_raw(b);
    // SAFETY: `p` is the box just leaked; nothing else refers to it yet.
    let xc = unsafe { &mut *p };
    // The state names its own ibv_cq (known only once boxed).
    Arc::get_mut(&mut xc.state).expect("fresh Arc").ibv = p as usize;
    if !channel.is_null() {
        // SAFETY: checked live above.
        unsafe { &*(channel as *const XChannel) }
            .users
            .fetch_add(1, Ordering::SeqCst);
        x.notify
            .cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(xc.state.clone());
    }
    live::add(p, Kind::Cq);
    Ok(p)
}

/// `n + 1` rounded up to a power of two, less one; never past `max` (n <= max).
pub(crate) fn round_cqe(n: u32, max: u32) -> u32 {
    n.checked_add(1)
        .and_then(u32::checked_next_power_of_two)
        .map_or(max, |s| (s - 1).min(max))
        .max(n)
}

pub extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program does not destroy the CQ `cq` while this call uses it.
        match unsafe { xcq(cq) } {
            None => return ret(Err(libc::EINVAL)),
            Some(c) if c.state.users.load(Ordering::SeqCst) > 0 => return ret(Err(libc::EBUSY)),
            Some(_) => {}
        }
        if !live::remove(cq, Kind::Cq) {
            return ret(Err(libc::EINVAL));
        }
        // SAFETY: still allocated (freed below); its context pointer is ours.
        crate::context::forget(unsafe { (*cq).context }, cq as usize);
        // SAFETY: removed above: a leaked Box<XCq> freed once.
        let x = unsafe { Box::from_raw(cq as *mut XCq) };
        // SAFETY: the program does not close `x.ibv.context` while this call uses it.
        if let Some(ctx) = unsafe { context(x.ibv.context) } {
            ctx.notify
                .cqs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|s| !Arc::ptr_eq(s, &x.state));
        }
        if x.state.channel != 0 {
            // SAFETY: the channel outlives its CQs (its `users`).
            unsafe { &*(x.state.channel as *const XChannel) }
                .users
                .fetch_sub(1, Ordering::SeqCst);
        }
        0
    })
}

/// `ctx->ops.req_notify_cq`.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program does not destroy the CQ `cq` while this call uses it.
        let Some(x) = (unsafe { xcq(cq) }) else {
            return libc::EINVAL;
        };
        if x.state.channel == 0 {
            return libc::EINVAL;
        }
        // The provider's ibv_cmd_req_notify_cq: the kernel's CQ lookup answers EIO on a
        // disassociated device (crate::device::gone). Only the queue's flag is read
        // here (an atomic): the event that set it came before, so a program that read
        // DEVICE_FATAL finds it set.
        // SAFETY: the program does not close `x.ibv.context` while this call uses it.
        if unsafe { context(x.ibv.context) }.is_some_and(|c| c.notify.async_q.is_dead()) {
            set_errno(libc::EIO);
            return libc::EIO;
        }
        x.state.armed.store(true, Ordering::SeqCst);
        0
    })
}

const IBV_WC_GRH: u32 = 1 << 0;
const IBV_WC_WITH_IMM: u32 = 1 << 1;
const IBV_WC_WITH_INV: u32 = 1 << 3;

pub(crate) fn to_ibv(w: &WorkCompletion) -> ibv_wc {
    // A UD receive: the buffer starts with the 40-byte GRH. `slid` is 0 (RoCE has no
    // LIDs) and `pkey_index` 0 (the one P_Key), as rxe reports them; `sl` says IPv4 or
    // IPv6 as a ConnectX does (proto::cq::WorkCompletion::sl).
    let mut flags = if w.grh { IBV_WC_GRH } else { 0 };
    let mut imm = 0;
    if let Some(i) = w.imm_data {
        flags |= IBV_WC_WITH_IMM;
        imm = i.to_be();
    }
    if let Some(r) = w.invalidated_rkey {
        flags |= IBV_WC_WITH_INV;
        imm = r.0;
    }
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as c_int,
        opcode: wc_opcode_to_ibv(w.opcode),
        byte_len: w.byte_len,
        imm_data: imm,
        qp_num: w.qp_num.value(),
        src_qp: w.src_qp.value(),
        wc_flags: flags,
        sl: w.sl,
        ..Default::default()
    }
}

thread_local! {
    static POLLED: RefCell<Vec<WorkCompletion>> = const { RefCell::new(Vec::new()) };
}

/// `ctx->ops.poll_cq`: how many completions were written to `wc`, or -1.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        if n <= 0 {
            return if n == 0 { 0 } else { -1 };
        }
        if cq.is_null() || wc.is_null() {
            return -1;
        }
        // SAFETY: the data path trusts the program's CQ pointer, as every provider does
        // (a live Box<XCq>: looking it up would cost a lock per poll).
        let x = unsafe { &*(cq as *const XCq) };
        POLLED.with(|b| {
            let mut v = b.borrow_mut();
            v.clear();
            match x.state.cq.try_poll_into(n as usize, &mut v) {
                Ok(k) => {
                    for (i, w) in v.iter().take(k).enumerate() {
                        // SAFETY: the program gave room for `n` >= k entries at `wc`.
                        unsafe { wc.add(i).write(to_ibv(w)) };
                    }
                    k as c_int
                }
                Err(_) => -1,
            }
        })
    })
}
