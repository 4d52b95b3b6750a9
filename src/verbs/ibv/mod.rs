//! The offload backend's FFI: safe handles over rdma-core's libibverbs, loaded at run
//! time ([`sys`]), for [`crate::verbs`] to dispatch to when a device is opened with
//! [`crate::verbs::Device::open_rdma`].
//!
//! Contract:
//! - This module, [`sys`] and [`abi`] (the verbs.h structures, shared with the drop-in
//!   library) are the only places outside `src/io/afxdp` with `unsafe`;
//!   every block says why it is sound. Each handle owns one libibverbs object and frees
//!   it on drop, after everything made from it (a [`Qp`] holds its PD and CQs, an [`Mr`]
//!   its PD, all of them the [`Context`]).
//! - libibverbs objects may be used from any thread (libibverbs and its providers lock
//!   internally; rdma-core `Documentation/libibverbs.md`, "Thread safety"), so the handles
//!   are `Send + Sync`.
//! - Memory regions are page-aligned, zeroed heap buffers this module allocates and
//!   registers; the RNIC reads and writes them by DMA while the region is registered.
//!   The CPU reaches them only by copies through raw pointers ([`Mr::read`],
//!   [`Mr::write`]; [`Mr::with`] / [`Mr::with_mut`] lend a copy), never by a Rust
//!   reference into memory the RNIC may write; a per-region lock serialises the copies,
//!   and is never held while a caller's closure runs. Like any verbs program, a caller
//!   must not look at bytes a remote peer may be writing at the same time (their value
//!   is undefined until the completion that ends the transfer).
//! - Failures are [`Error::Ibv`] with the call's name and `errno`.

pub mod abi;
pub mod conv;
pub mod sys;

use std::alloc::Layout;
use std::ffi::{CStr, c_int};
use std::os::fd::BorrowedFd;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{Error, Gid, Result};
use crate::proto::{Access, AttrMask, QpAttr, RecvWr, SendWr, WcStatus, WorkCompletion, WrOpcode};
use crate::wire::{Lkey, Qpn, Rkey};

static LIB: OnceLock<std::result::Result<sys::Lib, String>> = OnceLock::new();

/// libibverbs, loaded on first use.
pub fn lib() -> Result<&'static sys::Lib> {
    LIB.get_or_init(sys::Lib::load)
        .as_ref()
        .map_err(|e| Error::NoLibibverbs(e.clone()))
}

fn last_err(call: &'static str) -> Error {
    Error::Ibv {
        call,
        err: std::io::Error::last_os_error(),
    }
}

/// Destroy calls (`ibv_destroy_qp`, `ibv_destroy_cq`, `ibv_destroy_comp_channel`,
/// `ibv_dereg_mr`, `ibv_dealloc_pd`, `ibv_close_device`) that failed in this process.
static TEARDOWN_FAILURES: AtomicU64 = AtomicU64::new(0);

/// How many destroy calls of the offload backend failed in this process (each is logged
/// too). Handles are freed on drop, which cannot return an error: this is where a failure
/// shows. A region whose `ibv_dereg_mr` failed keeps its buffer (leaked, never freed),
/// since its keys may still let the RNIC reach it.
pub fn teardown_failures() -> u64 {
    TEARDOWN_FAILURES.load(Ordering::Relaxed)
}

/// Whether a destroy call returning `rc` succeeded; a failure is logged and counted
/// ([`teardown_failures`]).
fn released(call: &'static str, rc: c_int) -> bool {
    match check(call, rc) {
        Ok(()) => true,
        Err(e) => {
            TEARDOWN_FAILURES.fetch_add(1, Ordering::Relaxed);
            tracing::error!("{e} (the object stays as it was)");
            false
        }
    }
}

/// libibverbs functions returning an errno value (0 on success).
fn check(call: &'static str, rc: c_int) -> Result<()> {
    match rc {
        0 => Ok(()),
        // Some calls return -1 and set errno, others return the errno value itself.
        r if r < 0 => Err(last_err(call)),
        r => Err(Error::Ibv {
            call,
            err: std::io::Error::from_raw_os_error(r),
        }),
    }
}

/// ibv_get_device_list returned NULL: ENOSYS means the kernel has no RDMA support
/// (no `/sys/class/infiniband_verbs`), which is no device rather than a failure.
fn no_list() -> Result<Vec<String>> {
    let e = last_err("ibv_get_device_list");
    match &e {
        Error::Ibv { err, .. } if err.raw_os_error() == Some(38) => Ok(Vec::new()),
        _ => Err(e),
    }
}

/// The names of the RDMA devices libibverbs finds (`ibv_devices`).
pub fn device_names() -> Result<Vec<String>> {
    let l = lib()?;
    let mut n: c_int = 0;
    // SAFETY: ibv_get_device_list writes the count to `n` and returns a NULL-terminated
    // array of `n` device pointers (or NULL with errno set).
    let list = unsafe { (l.fns.get_device_list)(&mut n) };
    if list.is_null() {
        return no_list();
    }
    let mut names = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: `i < n` entries of the array are valid device pointers, and
        // ibv_get_device_name returns a NUL-terminated string owned by the device.
        let name = unsafe { CStr::from_ptr((l.fns.get_device_name)(*list.add(i))) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { (l.fns.free_device_list)(list) };
    Ok(names)
}

/// An open device (`struct ibv_context`).
#[derive(Debug)]
pub struct Context {
    ctx: NonNull<sys::ibv_context>,
    lib: &'static sys::Lib,
}

// SAFETY: libibverbs contexts are thread-safe (see the module doc); the pointer is only
// passed to libibverbs.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// `ibv_open_device` on the device called `name`.
    pub fn open(name: &str) -> Result<Context> {
        let l = lib()?;
        let mut n: c_int = 0;
        // SAFETY: as in `device_names`.
        let list = unsafe { (l.fns.get_device_list)(&mut n) };
        if list.is_null() {
            return no_list().and_then(|found| {
                Err(Error::NoRdmaDevice {
                    name: name.to_string(),
                    found,
                })
            });
        }
        let mut found = Vec::new();
        let mut ctx = ptr::null_mut();
        let mut open_err = None;
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: as in `device_names`; the device stays valid until the list is
            // freed, and an opened context holds its own reference.
            unsafe {
                let dev = *list.add(i);
                let dn = CStr::from_ptr((l.fns.get_device_name)(dev)).to_string_lossy();
                if dn == name {
                    ctx = (l.fns.open_device)(dev);
                    if ctx.is_null() {
                        open_err = Some(last_err("ibv_open_device"));
                    }
                }
                found.push(dn.into_owned());
            }
        }
        // SAFETY: `list` came from ibv_get_device_list and is freed once.
        unsafe { (l.fns.free_device_list)(list) };
        if let Some(e) = open_err {
            return Err(e);
        }
        let ctx = NonNull::new(ctx).ok_or_else(|| Error::NoRdmaDevice {
            name: name.to_string(),
            found,
        })?;
        Ok(Context { ctx, lib: l })
    }

    fn fns(&self) -> &'static sys::Fns {
        &self.lib.fns
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<sys::ibv_device_attr> {
        let mut a = std::mem::MaybeUninit::<sys::ibv_device_attr>::zeroed();
        // SAFETY: the context is open; `a` is a writable ibv_device_attr.
        check("ibv_query_device", unsafe {
            (self.fns().query_device)(self.ctx.as_ptr(), a.as_mut_ptr())
        })?;
        // SAFETY: zero is a valid value of every field, and the call filled the rest.
        Ok(unsafe { a.assume_init() })
    }

    /// `ibv_query_port`.
    pub fn query_port(&self, port: u8) -> Result<sys::ibv_port_attr> {
        let mut a = sys::ibv_port_attr::default();
        // SAFETY: the context is open; `a` is a zeroed ibv_port_attr, as verbs.h's
        // inline wrapper passes it.
        check("ibv_query_port", unsafe {
            (self.fns().query_port)(self.ctx.as_ptr(), port, &mut a)
        })?;
        Ok(a)
    }

    /// `ibv_query_gid`.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        let mut g = sys::ibv_gid::default();
        let index = c_int::try_from(index).map_err(|_| Error::Ibv {
            call: "ibv_query_gid",
            err: std::io::Error::from_raw_os_error(22),
        })?;
        // SAFETY: the context is open; `g` is a 16-byte union ibv_gid.
        check("ibv_query_gid", unsafe {
            (self.fns().query_gid)(self.ctx.as_ptr(), port, index, &mut g)
        })?;
        Ok(g.raw)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every object made from the context holds an Arc of it, so none is left.
        let rc = unsafe { (self.fns().close_device)(self.ctx.as_ptr()) };
        released("ibv_close_device", rc);
    }
}

/// A protection domain (`struct ibv_pd`).
#[derive(Debug)]
pub struct Pd {
    pd: NonNull<sys::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: see Context.
unsafe impl Send for Pd {}
// SAFETY: see Context.
unsafe impl Sync for Pd {}

impl Pd {
    /// `ibv_alloc_pd`.
    pub fn alloc(ctx: &Arc<Context>) -> Result<Pd> {
        // SAFETY: the context is open.
        let pd = unsafe { (ctx.fns().alloc_pd)(ctx.ctx.as_ptr()) };
        Ok(Pd {
            pd: NonNull::new(pd).ok_or_else(|| last_err("ibv_alloc_pd"))?,
            ctx: ctx.clone(),
        })
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an Arc of it, so none is left.
        let rc = unsafe { (self.ctx.fns().dealloc_pd)(self.pd.as_ptr()) };
        released("ibv_dealloc_pd", rc);
    }
}

/// A registered memory region over a buffer this handle owns.
#[derive(Debug)]
pub struct Mr {
    mr: NonNull<sys::ibv_mr>,
    buf: NonNull<u8>,
    layout: Layout,
    len: usize,
    /// Serialises the CPU's copies ([`Mr::read`], [`Mr::write`]); never held while a
    /// caller's code runs.
    cpu: Mutex<()>,
    pd: Arc<Pd>,
}

// SAFETY: the buffer is only reached by the raw-pointer copies of `read`/`write` under
// `cpu`, the MR pointer only by libibverbs (thread-safe).
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

const PAGE: usize = 4096;

impl Mr {
    /// Allocate `len` zeroed, page-aligned bytes and `ibv_reg_mr` them with `access`.
    pub fn reg(pd: &Arc<Pd>, len: usize, access: Access) -> Result<Mr> {
        // A zero-length allocation is not allowed; register at least one byte of a page.
        let layout = Layout::from_size_align(len.max(1), PAGE).map_err(|_| Error::Ibv {
            call: "ibv_reg_mr",
            err: std::io::Error::from_raw_os_error(12),
        })?;
        // SAFETY: the layout has a non-zero size.
        let buf = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or(Error::Ibv {
            call: "ibv_reg_mr",
            err: std::io::Error::from_raw_os_error(12),
        })?;
        // SAFETY: `buf` is `len` bytes we own until dereg (Drop deregisters first).
        let mr = unsafe {
            (pd.ctx.fns().reg_mr)(pd.pd.as_ptr(), buf.as_ptr().cast(), len, access.0 as c_int)
        };
        let Some(mr) = NonNull::new(mr) else {
            let e = last_err("ibv_reg_mr");
            // SAFETY: allocated above with this layout, not registered.
            unsafe { std::alloc::dealloc(buf.as_ptr(), layout) };
            return Err(e);
        };
        Ok(Mr {
            mr,
            buf,
            layout,
            len,
            cpu: Mutex::new(()),
            pd: pd.clone(),
        })
    }

    fn raw(&self) -> &sys::ibv_mr {
        // SAFETY: libibverbs keeps the ibv_mr valid until ibv_dereg_mr (in Drop) and never
        // changes these fields.
        unsafe { self.mr.as_ref() }
    }
    pub fn lkey(&self) -> Lkey {
        Lkey(self.raw().lkey)
    }
    pub fn rkey(&self) -> Rkey {
        Rkey(self.raw().rkey)
    }
    /// The buffer's virtual address: SGEs and remote addresses name it (ibv_reg_mr's
    /// iova is the address).
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copy `out.len()` bytes at `offset` out of the buffer (the caller checked the range).
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(offset.checked_add(out.len()).is_some_and(|e| e <= self.len));
        let _g = self.cpu.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the range is inside the `len` bytes `buf` holds while self lives (checked
        // above); `out` is another allocation. Copied through raw pointers, with no Rust
        // reference to the buffer: the RNIC may write it by DMA at any time (module doc),
        // and `cpu` keeps other CPU copies of this region out meanwhile.
        unsafe {
            ptr::copy_nonoverlapping(self.buf.as_ptr().add(offset), out.as_mut_ptr(), out.len())
        };
    }

    /// Copy `data` into the buffer at `offset` (the caller checked the range).
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(
            offset
                .checked_add(data.len())
                .is_some_and(|e| e <= self.len)
        );
        let _g = self.cpu.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: as in `read`, the other way.
        unsafe {
            ptr::copy_nonoverlapping(data.as_ptr(), self.buf.as_ptr().add(offset), data.len())
        };
    }

    /// Lend a copy of the whole buffer to `f` (no lock held while it runs:
    /// `super::mr_copy`).
    pub fn with<T>(&self, f: impl FnOnce(&[u8]) -> T) -> T {
        let mut copy = vec![0u8; self.len];
        self.read(0, &mut copy);
        f(&copy)
    }

    /// Lend a copy of the whole buffer to `f` mutably, then write back the bytes it
    /// changed (no lock held while it runs: `super::mr_copy`).
    pub fn with_mut<T>(&self, f: impl FnOnce(&mut [u8]) -> T) -> T {
        let mut copy = vec![0u8; self.len];
        self.read(0, &mut copy);
        let old = copy.clone();
        let r = f(&mut copy);
        super::mr_copy::changed_runs(&old, &copy, |at, b| self.write(at, b));
        r
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: deregistered once; nothing else refers to the ibv_mr.
        let rc = unsafe { (self.pd.ctx.fns().dereg_mr)(self.mr.as_ptr()) };
        if !released("ibv_dereg_mr", rc) {
            // The keys may still be valid: the RNIC could write into freed memory. Leak
            // the buffer instead (counted in `teardown_failures`).
            tracing::error!(
                "ibv_dereg_mr failed: the region's {} bytes at {:#x} are leaked, not freed",
                self.len,
                self.addr()
            );
            return;
        }
        // SAFETY: deregistered just above, so no longer reachable by the RNIC; freed once,
        // with the layout it was allocated with.
        unsafe { std::alloc::dealloc(self.buf.as_ptr(), self.layout) };
    }
}

/// A completion queue with its own completion channel (for [`Cq::wait_into`]).
#[derive(Debug)]
pub struct Cq {
    cq: NonNull<sys::ibv_cq>,
    chan: NonNull<sys::ibv_comp_channel>,
    /// Serialises waiters: one thread at a time reads the channel.
    waiter: Mutex<()>,
    ctx: Arc<Context>,
}

// SAFETY: see Context.
unsafe impl Send for Cq {}
// SAFETY: see Context.
unsafe impl Sync for Cq {}

impl Cq {
    /// `ibv_create_comp_channel` + `ibv_create_cq` with room for `cqe` completions.
    pub fn create(ctx: &Arc<Context>, cqe: usize) -> Result<Cq> {
        let cqe = c_int::try_from(cqe.max(1)).map_err(|_| Error::Ibv {
            call: "ibv_create_cq",
            err: std::io::Error::from_raw_os_error(22),
        })?;
        // SAFETY: the context is open.
        let chan = unsafe { (ctx.fns().create_comp_channel)(ctx.ctx.as_ptr()) };
        let chan = NonNull::new(chan).ok_or_else(|| last_err("ibv_create_comp_channel"))?;
        // SAFETY: the context and channel are valid; no CQ context pointer, vector 0.
        let cq = unsafe {
            (ctx.fns().create_cq)(ctx.ctx.as_ptr(), cqe, ptr::null_mut(), chan.as_ptr(), 0)
        };
        let Some(cq) = NonNull::new(cq) else {
            let e = last_err("ibv_create_cq");
            // SAFETY: the channel has no CQ.
            unsafe { (ctx.fns().destroy_comp_channel)(chan.as_ptr()) };
            return Err(e);
        };
        Ok(Cq {
            cq,
            chan,
            waiter: Mutex::new(()),
            ctx: ctx.clone(),
        })
    }

    fn ops(&self) -> &sys::ibv_context {
        // SAFETY: the context outlives the CQ; its ops table is set at open and constant.
        unsafe { self.ctx.ctx.as_ref() }
    }

    /// `ibv_poll_cq` for up to `max` completions, appended to `out`.
    pub fn poll_into(&self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        let Some(poll) = self.ops().ops.poll_cq else {
            return Err(Error::Ibv {
                call: "ibv_poll_cq",
                err: std::io::Error::from_raw_os_error(95),
            });
        };
        let mut wcs = [sys::ibv_wc::default(); 16];
        let mut total = 0;
        while total < max {
            let want = (max - total).min(wcs.len()) as c_int;
            // SAFETY: the CQ is valid and `wcs` has room for `want` entries.
            let n = unsafe { poll(self.cq.as_ptr(), want, wcs.as_mut_ptr()) };
            if n < 0 {
                return Err(Error::Ibv {
                    call: "ibv_poll_cq",
                    err: std::io::Error::from_raw_os_error(-n),
                });
            }
            let n = n as usize;
            out.extend(wcs[..n].iter().map(wc_from_ibv));
            total += n;
            if n < want as usize {
                break;
            }
        }
        Ok(total)
    }

    /// Poll; when nothing is there, arm the CQ and sleep on its channel until a
    /// completion event or `timeout`.
    pub fn wait_into(
        &self,
        max: usize,
        timeout: Duration,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        let _w = self.waiter.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let n = self.poll_into(max, out)?;
            if n > 0 {
                return Ok(n);
            }
            let Some(notify) = self.ops().ops.req_notify_cq else {
                return Err(Error::Ibv {
                    call: "ibv_req_notify_cq",
                    err: std::io::Error::from_raw_os_error(95),
                });
            };
            // SAFETY: the CQ is valid. Arm, then poll again: a completion that arrived
            // before arming raises no event (the usual ibv_req_notify_cq race).
            let rc = unsafe { notify(self.cq.as_ptr(), 0) };
            check("ibv_req_notify_cq", rc)?;
            let n = self.poll_into(max, out)?;
            if n > 0 {
                return Ok(n);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(0);
            }
            // SAFETY: the channel's fd stays open while the channel exists (self).
            let fd = unsafe { BorrowedFd::borrow_raw(self.chan.as_ref().fd) };
            let mut fds = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::IN,
            )];
            let ts = rustix::event::Timespec::try_from(left).unwrap_or(rustix::event::Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            });
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    return Err(Error::Ibv {
                        call: "poll(comp_channel)",
                        err: e.into(),
                    });
                }
            }
            let mut ev_cq = ptr::null_mut();
            let mut ev_ctx = ptr::null_mut();
            // SAFETY: the channel is readable, so ibv_get_cq_event does not block; the
            // event is for our CQ (the channel is ours alone) and is acknowledged at once,
            // so ibv_destroy_cq never waits for it.
            unsafe {
                check(
                    "ibv_get_cq_event",
                    (self.ctx.fns().get_cq_event)(self.chan.as_ptr(), &mut ev_cq, &mut ev_ctx),
                )?;
                (self.ctx.fns().ack_cq_events)(self.cq.as_ptr(), 1);
            }
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc of it, so none is left; all events
        // were acknowledged; the channel is destroyed after its only CQ.
        let rc = unsafe { (self.ctx.fns().destroy_cq)(self.cq.as_ptr()) };
        // A channel still used by its CQ cannot be destroyed (EBUSY): only after the CQ.
        if released("ibv_destroy_cq", rc) {
            // SAFETY: the channel's only CQ is gone; destroyed once.
            let rc = unsafe { (self.ctx.fns().destroy_comp_channel)(self.chan.as_ptr()) };
            released("ibv_destroy_comp_channel", rc);
        }
    }
}

/// What [`Qp::create`] asks for.
#[derive(Clone, Copy, Debug)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_sge: u32,
    pub sq_sig_all: bool,
}

/// An RC queue pair.
#[derive(Debug)]
pub struct Qp {
    qp: NonNull<sys::ibv_qp>,
    max_sge: u32,
    pd: Arc<Pd>,
    _cqs: [Arc<Cq>; 2],
}

// SAFETY: see Context.
unsafe impl Send for Qp {}
// SAFETY: see Context.
unsafe impl Sync for Qp {}

impl Qp {
    /// `ibv_create_qp` for an RC QP.
    pub fn create(pd: &Arc<Pd>, send_cq: &Arc<Cq>, recv_cq: &Arc<Cq>, caps: QpCaps) -> Result<Qp> {
        let mut init = sys::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.cq.as_ptr(),
            recv_cq: recv_cq.cq.as_ptr(),
            srq: ptr::null_mut(),
            cap: sys::ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: caps.max_sge,
                max_recv_sge: caps.max_sge,
                max_inline_data: 0,
            },
            qp_type: sys::QPT_RC,
            sq_sig_all: c_int::from(caps.sq_sig_all),
        };
        // SAFETY: PD and CQs are valid objects of one context; `init` is filled.
        let qp = unsafe { (pd.ctx.fns().create_qp)(pd.pd.as_ptr(), &mut init) };
        Ok(Qp {
            qp: NonNull::new(qp).ok_or_else(|| last_err("ibv_create_qp"))?,
            max_sge: caps.max_sge,
            pd: pd.clone(),
            _cqs: [send_cq.clone(), recv_cq.clone()],
        })
    }

    pub fn qp_num(&self) -> Qpn {
        // SAFETY: qp_num is set at creation and never changes.
        Qpn::new(unsafe { self.qp.as_ref().qp_num })
    }

    fn ops(&self) -> &sys::ibv_context {
        // SAFETY: the context outlives the QP (the PD holds it).
        unsafe { self.pd.ctx.ctx.as_ref() }
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        let mut a = sys::ibv_qp_attr::from(attr);
        // SAFETY: the QP is valid; `a` is a full ibv_qp_attr.
        check("ibv_modify_qp", unsafe {
            (self.pd.ctx.fns().modify_qp)(self.qp.as_ptr(), &mut a, mask.0 as c_int)
        })
    }

    /// `ibv_query_qp` of every attribute [`QpAttr`] has.
    pub fn query(&self) -> Result<QpAttr> {
        let mut a = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: ptr::null_mut(),
            recv_cq: ptr::null_mut(),
            srq: ptr::null_mut(),
            cap: sys::ibv_qp_cap::default(),
            qp_type: 0,
            sq_sig_all: 0,
        };
        let mask = AttrMask::STATE.0
            | AttrMask::CUR_STATE.0
            | AttrMask::ACCESS_FLAGS.0
            | AttrMask::PKEY_INDEX.0
            | AttrMask::PORT.0
            | AttrMask::AV.0
            | AttrMask::PATH_MTU.0
            | AttrMask::TIMEOUT.0
            | AttrMask::RETRY_CNT.0
            | AttrMask::RNR_RETRY.0
            | AttrMask::RQ_PSN.0
            | AttrMask::MAX_QP_RD_ATOMIC.0
            | AttrMask::MIN_RNR_TIMER.0
            | AttrMask::SQ_PSN.0
            | AttrMask::MAX_DEST_RD_ATOMIC.0
            | AttrMask::DEST_QPN.0;
        // SAFETY: the QP is valid; `a` and `init` are writable.
        check("ibv_query_qp", unsafe {
            (self.pd.ctx.fns().query_qp)(self.qp.as_ptr(), &mut a, mask as c_int, &mut init)
        })?;
        QpAttr::from_ibv_query(&a).map_err(Error::Verbs)
    }

    /// `ibv_post_send` of one work request.
    pub fn post_send(&self, wr: &SendWr) -> Result<()> {
        let post = self.ops().ops.post_send.ok_or(Error::Ibv {
            call: "ibv_post_send",
            err: std::io::Error::from_raw_os_error(95),
        })?;
        let mut sges = sges_to_ibv(&wr.sg_list, self.max_sge, "ibv_post_send")?;
        // The `wr` union: atomics are {remote_addr, compare_add, swap, rkey}, RDMA
        // {remote_addr, rkey} with rkey where compare_add would be.
        let wr_u = if wr.opcode.is_atomic() {
            sys::SendWrRemote {
                remote_addr: wr.atomic.remote_addr,
                compare_add: wr.atomic.compare_add,
                swap: wr.atomic.swap,
                rkey: wr.atomic.rkey.0,
            }
        } else {
            sys::SendWrRemote {
                remote_addr: wr.rdma.remote_addr,
                compare_add: rdma_word1(wr.rdma.rkey.0),
                swap: 0,
                rkey: 0,
            }
        };
        let mut w = sys::ibv_send_wr {
            wr_id: wr.wr_id,
            next: ptr::null_mut(),
            sg_list: if sges.is_empty() {
                ptr::null_mut()
            } else {
                sges.as_mut_ptr()
            },
            num_sge: sges.len() as c_int,
            opcode: conv::wr_opcode_to_ibv(wr.opcode),
            send_flags: wr.send_flags.0,
            imm_data: match wr.opcode {
                WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm => wr.imm_data.to_be(),
                WrOpcode::SendWithInv => wr.invalidate_rkey.0,
                _ => 0,
            },
            wr: wr_u,
            qp_type_xrc_remote_srqn: 0,
            bind_mw_or_tso: [0; 6],
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is valid; `w` and the SGEs it points to live across the call
        // (the provider copies the WQE before returning).
        check("ibv_post_send", unsafe {
            post(self.qp.as_ptr(), &mut w, &mut bad)
        })
    }

    /// `ibv_post_recv` of one work request.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        let post = self.ops().ops.post_recv.ok_or(Error::Ibv {
            call: "ibv_post_recv",
            err: std::io::Error::from_raw_os_error(95),
        })?;
        let mut sges = sges_to_ibv(&wr.sg_list, self.max_sge, "ibv_post_recv")?;
        let mut w = sys::ibv_recv_wr {
            wr_id: wr.wr_id,
            next: ptr::null_mut(),
            sg_list: if sges.is_empty() {
                ptr::null_mut()
            } else {
                sges.as_mut_ptr()
            },
            num_sge: sges.len() as c_int,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: as in post_send.
        check("ibv_post_recv", unsafe {
            post(self.qp.as_ptr(), &mut w, &mut bad)
        })
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: destroyed once; nothing else refers to it.
        let rc = unsafe { (self.pd.ctx.fns().destroy_qp)(self.qp.as_ptr()) };
        released("ibv_destroy_qp", rc);
    }
}

/// `word1` of the `wr` union for RDMA: `rdma.rkey` is a `uint32_t` at the start of the
/// place `atomic.compare_add` (a `uint64_t`) has, so its bytes go first in memory, on
/// either byte order.
fn rdma_word1(rkey: u32) -> u64 {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&rkey.to_ne_bytes());
    u64::from_ne_bytes(b)
}

fn sges_to_ibv(
    sg: &[crate::proto::Sge],
    max: u32,
    call: &'static str,
) -> Result<Vec<sys::ibv_sge>> {
    if sg.len() > max as usize {
        // EINVAL, what the provider would answer for num_sge > max_send_sge.
        return Err(Error::Ibv {
            call,
            err: std::io::Error::from_raw_os_error(22),
        });
    }
    Ok(sg
        .iter()
        .map(|s| sys::ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey.0,
        })
        .collect())
}

/// A work completion from `struct ibv_wc`.
fn wc_from_ibv(w: &sys::ibv_wc) -> WorkCompletion {
    let status = WcStatus::from_ibv(w.status as u32);
    // enum ibv_wc_opcode. libibverbs leaves the opcode undefined in error completions;
    // those report SEND here (check `status` first, as with libibverbs).
    // libibverbs leaves the opcode undefined in error completions: check `status` first.
    let opcode = conv::wc_opcode_from_ibv(w.opcode);
    WorkCompletion {
        wr_id: w.wr_id,
        status,
        opcode,
        byte_len: w.byte_len,
        imm_data: (w.wc_flags & sys::WC_WITH_IMM != 0).then(|| u32::from_be(w.imm_data)),
        invalidated_rkey: (w.wc_flags & sys::WC_WITH_INV != 0).then_some(Rkey(w.imm_data)),
        qp_num: Qpn::new(w.qp_num),
        src_qp: Qpn::new(w.src_qp),
        grh: w.wc_flags & sys::WC_GRH != 0,
        sl: w.sl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_fields_convert() {
        let w = sys::ibv_wc {
            wr_id: 7,
            status: 0,
            opcode: 129,
            byte_len: 12,
            imm_data: 0x1234_5678u32.to_be(),
            qp_num: 17,
            src_qp: 18,
            wc_flags: sys::WC_WITH_IMM,
            ..Default::default()
        };
        let wc = wc_from_ibv(&w);
        assert_eq!(wc.opcode, crate::proto::WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc.imm_data, Some(0x1234_5678));
        assert_eq!(wc.invalidated_rkey, None);
        assert_eq!((wc.qp_num.value(), wc.src_qp.value()), (17, 18));
        let bad = sys::ibv_wc {
            status: 13,
            ..Default::default()
        };
        assert_eq!(wc_from_ibv(&bad).status, WcStatus::RnrRetryExcErr);
    }

    #[test]
    fn failed_destroy_calls_are_counted_and_reported_as_failed() {
        let before = teardown_failures();
        assert!(released("ibv_destroy_qp", 0));
        assert_eq!(teardown_failures(), before);
        // An errno value (EBUSY: a QP still attached) and -1 with errno both fail.
        assert!(!released("ibv_dereg_mr", 16));
        assert!(!released("ibv_destroy_cq", -1));
        assert!(teardown_failures() >= before + 2);
    }

    #[test]
    fn rdma_rkey_lands_where_the_c_union_has_it() {
        // struct { uint64_t remote_addr; uint32_t rkey; } rdma: rkey at offset 8.
        let w = sys::SendWrRemote {
            remote_addr: 1,
            compare_add: rdma_word1(0xabcd_ef01),
            swap: 0,
            rkey: 0,
        };
        // The fields fill bytes 0..28 with no gap (offsets 0, 8, 16, 24); 28..32 is the
        // struct's tail padding, uninitialised, so only the fields' bytes are copied.
        let defined = std::mem::offset_of!(sys::SendWrRemote, rkey) + 4;
        assert_eq!(
            (defined, std::mem::size_of::<sys::SendWrRemote>()),
            (28, 32)
        );
        assert_eq!(std::mem::offset_of!(sys::SendWrRemote, compare_add), 8);
        let mut bytes = [0u8; 32];
        // SAFETY: bytes 0..`defined` of `w` are its four fields, all initialised, with no
        // padding between them (the offsets asserted above); the padding after them is not
        // read. `bytes` is a separate array of 32 >= `defined` bytes.
        unsafe {
            ptr::copy_nonoverlapping((&raw const w).cast::<u8>(), bytes.as_mut_ptr(), defined)
        };
        assert_eq!(&bytes[8..12], &0xabcd_ef01u32.to_ne_bytes());
    }
}
