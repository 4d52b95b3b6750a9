//! Extended CQs: `ibv_create_cq_ex` (`verbs_context.create_cq_ex`), the polling API of
//! `struct ibv_cq_ex` (`ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll` and the
//! `ibv_wc_read_*` accessors), the device clock (`ibv_query_rt_values_ex`, through
//! `verbs_context.query_rt_values`) and `ibv_resize_cq`.
//!
//! - `wc_flags`: rxe's (providers/rxe/rxe.c `RXE_SUP_WC_FLAGS`: byte_len, imm, qp_num,
//!   src_qp, slid, sl, dlid_path_bits) and both completion timestamps; CVLAN, FLOW_TAG
//!   and TM_INFO (hardware features) are EOPNOTSUPP, as are `comp_mask`'s parent domain
//!   and any creation flag.
//! - The clock: nanoseconds of CLOCK_MONOTONIC_RAW, reported as `hca_core_clock`
//!   1 000 000 kHz with a 64-bit `completion_timestamp_mask` (crate::device
//!   `query_device_ex`); `ibv_query_rt_values_ex` reads the same clock. A completion's
//!   timestamp is the clock when the library takes it from the engine's CQ
//!   (`start_poll` / `next_poll`), not when the engine made it: the engine's
//!   completions carry no time. `_WALLCLOCK` is CLOCK_REALTIME at the same moment.
//! - Every CQ is an `ibv_cq_ex` (crate::context `XCq`); one made by `ibv_create_cq` has
//!   the same ops, so a program may poll either way.

use core::ffi::{c_int, c_uint};

use xrnic::verbs::WorkCompletion;
use xrnic::verbs::ibv::conv::wc_opcode_to_ibv;

use super::{NewCq, make, round_cqe, to_ibv};
use crate::context::{Polled, XCq, xcq};
use crate::types::*;
use crate::{guard, ret, set_errno};

const WITH_BYTE_LEN: u64 = 1 << 0;
const WITH_IMM: u64 = 1 << 1;
const WITH_QP_NUM: u64 = 1 << 2;
const WITH_SRC_QP: u64 = 1 << 3;
const WITH_SLID: u64 = 1 << 4;
const WITH_SL: u64 = 1 << 5;
const WITH_DLID_PATH_BITS: u64 = 1 << 6;
const WITH_COMPLETION_TIMESTAMP: u64 = 1 << 7;
const WITH_COMPLETION_TIMESTAMP_WALLCLOCK: u64 = 1 << 11;

/// verbs.h `IBV_WC_STANDARD_FLAGS`: what `ibv_create_cq` gives.
pub(crate) const STANDARD_WC_FLAGS: u64 = WITH_BYTE_LEN
    | WITH_IMM
    | WITH_QP_NUM
    | WITH_SRC_QP
    | WITH_SLID
    | WITH_SL
    | WITH_DLID_PATH_BITS;

/// The `wc_flags` xrnic offers.
const SUPPORTED_WC_FLAGS: u64 =
    STANDARD_WC_FLAGS | WITH_COMPLETION_TIMESTAMP | WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;
const IBV_CQ_INIT_ATTR_MASK_PD: u32 = 1 << 1;
const IBV_VALUES_MASK_RAW_CLOCK: u32 = 1 << 0;

/// `verbs_context.create_cq_ex`; verbs.h's `ibv_create_cq_ex` calls it.
pub unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(core::ptr::null_mut(), || {
        let r = (|| {
            if attr.is_null() {
                return Err(libc::EINVAL);
            }
            // SAFETY: `attr` points to the caller's ibv_cq_init_attr_ex (verbs.h).
            let a = unsafe { &*attr };
            if a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
                return Err(libc::EOPNOTSUPP);
            }
            if a.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0 {
                return Err(libc::EINVAL);
            }
            // Parent domains (their allocators) and creation flags (single-threaded,
            // ignore overrun): none yet; the kernel's rxe refuses any flag too.
            if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0
                || (a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 && a.flags != 0)
            {
                return Err(libc::EOPNOTSUPP);
            }
            make(
                ctx,
                &NewCq {
                    cqe: i64::from(a.cqe),
                    cq_context: a.cq_context,
                    channel: a.channel,
                    comp_vector: i64::from(a.comp_vector),
                    wc_flags: a.wc_flags,
                },
            )
        })();
        match r {
            Ok(p) => p as *mut ibv_cq_ex,
            Err(e) => {
                set_errno(e);
                core::ptr::null_mut()
            }
        }
    })
}

/// Set the polling ops of a new CQ: every accessor, whatever `wc_flags` asked (rxe sets
/// only those asked for; a program reads only those).
pub(super) fn fill(c: &mut ibv_cq_ex, _wc_flags: u64) {
    c.start_poll = Some(start_poll);
    c.next_poll = Some(next_poll);
    c.end_poll = Some(end_poll);
    c.read_opcode = Some(read_opcode);
    c.read_vendor_err = Some(read_vendor_err);
    c.read_byte_len = Some(read_byte_len);
    c.read_imm_data = Some(read_imm_data);
    c.read_qp_num = Some(read_qp_num);
    c.read_src_qp = Some(read_src_qp);
    c.read_wc_flags = Some(read_wc_flags);
    c.read_slid = Some(read_slid);
    c.read_sl = Some(read_sl);
    c.read_dlid_path_bits = Some(read_dlid_path_bits);
    c.read_completion_ts = Some(read_completion_ts);
    c.read_completion_wallclock_ns = Some(read_completion_wallclock_ns);
}

/// Nanoseconds of `clock`.
fn now_ns(clock: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec into a live local.
    unsafe { libc::clock_gettime(clock, &mut t) };
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

/// The device clock (see the module's doc).
pub(crate) const DEVICE_CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC_RAW;

/// Take the next completion into `cq`'s current one: 0, or ENOENT when the CQ is
/// empty (verbs.h: `ibv_start_poll` / `ibv_next_poll`).
///
/// # Safety
/// `cq` is a CQ this library made, not destroyed (the data path trusts it, as
/// `ibv_poll_cq` does).
unsafe fn take(cq: *mut ibv_cq_ex) -> c_int {
    guard(libc::EIO, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller's contract: a live Box<XCq>, its first field the ibv_cq_ex.
        let x = unsafe { &*(cq as *const XCq) };
        let mut v: Vec<WorkCompletion> = Vec::with_capacity(1);
        match x.state.cq.try_poll_into(1, &mut v) {
            Ok(1) => {}
            Ok(_) => return libc::ENOENT,
            Err(e) => return e.errno(),
        }
        let p = Polled {
            wc: v[0],
            ts: now_ns(DEVICE_CLOCK),
            wall_ns: now_ns(libc::CLOCK_REALTIME),
        };
        // SAFETY: the program's ibv_cq_ex: `status` and `wr_id` are the fields it
        // reads the current completion's from (verbs.h).
        unsafe {
            (*cq).status = p.wc.status as c_int;
            (*cq).wr_id = p.wc.wr_id;
        }
        *x.cur.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        0
    })
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // verbs.h: `attr->comp_mask` must be 0.
    // SAFETY: a non-NULL attr is the caller's struct.
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: the program's CQ (verbs.h contract of ibv_start_poll).
    unsafe { take(cq) }
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: as in start_poll.
    unsafe { take(cq) }
}

unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

/// `f` of the current completion (zero when there is none: a program reading before a
/// successful `start_poll` gets zeros, never a crash).
///
/// # Safety
/// As [`take`].
unsafe fn cur<T: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&Polled) -> T) -> T {
    guard(T::default(), || {
        if cq.is_null() {
            return T::default();
        }
        // SAFETY: the caller's contract.
        let x = unsafe { &*(cq as *const XCq) };
        let g = x.cur.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().map(f).unwrap_or_default()
    })
}

macro_rules! readers {
    ($($name:ident -> $t:ty = |$p:ident| $e:expr;)*) => {$(
        unsafe extern "C" fn $name(cq: *mut ibv_cq_ex) -> $t {
            // SAFETY: the program's CQ (verbs.h contract of `ibv_wc_read_*`).
            unsafe { cur(cq, |$p: &Polled| $e) }
        }
    )*};
}

readers! {
    read_opcode -> c_int = |p| wc_opcode_to_ibv(p.wc.opcode);
    read_vendor_err -> u32 = |_p| 0;
    read_byte_len -> u32 = |p| p.wc.byte_len;
    read_imm_data -> u32 = |p| to_ibv(&p.wc).imm_data;
    read_qp_num -> u32 = |p| p.wc.qp_num.value();
    read_src_qp -> u32 = |p| p.wc.src_qp.value();
    read_wc_flags -> c_uint = |p| to_ibv(&p.wc).wc_flags;
    read_slid -> u32 = |_p| 0;
    read_sl -> u8 = |p| p.wc.sl;
    read_dlid_path_bits -> u8 = |_p| 0;
    read_completion_ts -> u64 = |p| p.ts;
    read_completion_wallclock_ns -> u64 = |p| p.wall_ns;
}

/// `verbs_context.query_rt_values`: the device clock (`IBV_VALUES_MASK_RAW_CLOCK`).
/// `comp_mask` is written back with the bits served, as rdma-core's mlx5 provider
/// (`mlx5_query_rt_values`) answers a bit it does not know.
pub unsafe extern "C" fn query_rt_values(
    ctx: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program does not close `ctx` while this call uses it.
        if unsafe { crate::context::context(ctx) }.is_none() || values.is_null() {
            return ret(Err(libc::EINVAL));
        }
        // SAFETY: `values` points to the caller's ibv_values_ex.
        let v = unsafe { &mut *values };
        let asked = v.comp_mask;
        v.comp_mask = 0;
        if asked & IBV_VALUES_MASK_RAW_CLOCK != 0 {
            v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
            let ns = now_ns(DEVICE_CLOCK);
            v.raw_clock = libc::timespec {
                tv_sec: (ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000) as libc::c_long,
            };
        }
        0
    })
}

/// `ibv_resize_cq`: room for `cqe` completions (rounded as at creation, written to
/// `cq->cqe`), those queued kept in order. Fewer than are queued, 0 or past `max_cqe`:
/// EINVAL, as rxe (`rxe_cq_chk_attr`).
pub extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program does not destroy the CQ `cq` while this call uses it.
        let Some(x) = (unsafe { xcq(cq) }) else {
            return ret(Err(libc::EINVAL));
        };
        // SAFETY: the program does not close the CQ's context while this call uses it.
        let Some(c) = (unsafe { crate::context::context(x.ibv.context) }) else {
            return ret(Err(libc::EINVAL));
        };
        let max = c.dev.query_device().max_cqe;
        if cqe < 1 || cqe as u32 > max {
            return ret(Err(libc::EINVAL));
        }
        // rxe compares the size asked for, before its rounding, with the completions
        // queued (`rxe_cq_chk_attr`); the engine's CQ checks the rounded size again
        // under its lock.
        if x.state.cq.pending().is_ok_and(|q| (cqe as usize) < q) {
            return ret(Err(libc::EINVAL));
        }
        let n = round_cqe(cqe as u32, max);
        if let Err(e) = x.state.cq.resize(n as usize) {
            return ret(Err(e.errno()));
        }
        // SAFETY: the program's CQ; `cqe` is the field verbs.h says the resize updates.
        unsafe { (*cq).cqe = n as c_int };
        0
    })
}
