//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq` (resize, arm the limit),
//! `ibv_query_srq`, `ibv_destroy_srq` (EBUSY while a QP uses it, as ib_core), and
//! `ctx->ops.post_srq_recv`. `ibv_create_srq_ex` is verbs.h's inline: with only the PD
//! (and a basic SRQ type) it calls `ibv_create_srq`; the extended op is left NULL, so
//! anything else (XRC, tag matching) is EOPNOTSUPP there. `ibv_get_srq_num` (XRC only)
//! finds its op NULL too. The limit event reaches the program on the async fd
//! (crate::events).

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

use xrnic::verbs::{RecvWr, SrqAttr, SrqAttrMask};

use crate::context::{XSrq, next_handle, sges, xpd, xsrq};
use crate::live::{self, Kind};
use crate::types::*;
use crate::{guard, ret, set_errno};

pub extern "C" fn ibv_create_srq(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    guard(core::ptr::null_mut(), || match create(pd, init) {
        Ok(s) => s,
        Err(e) => {
            set_errno(e);
            core::ptr::null_mut()
        }
    })
}

fn create(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> Result<*mut ibv_srq, c_int> {
    // SAFETY: the program does not destroy the PD `pd` while this call uses it.
    let p = unsafe { xpd(pd) }.ok_or(libc::EINVAL)?;
    if init.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: `init` points to the caller's ibv_srq_init_attr (verbs.h contract).
    let a = unsafe { &mut *init };
    let want = SrqAttr {
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge,
        srq_limit: a.attr.srq_limit,
    };
    let srq = p.pd.create_srq(&want).map_err(|e| e.errno())?;
    let got = srq.query().map_err(|e| e.errno())?;
    // What the SRQ holds, written back as providers do.
    a.attr.max_wr = got.max_wr;
    a.attr.max_sge = got.max_sge;
    // SAFETY: ibv_srq is C data for which all-zero is valid (NULL pointers, glibc's
    // static mutex / condition initialisers).
    let mut ibv: ibv_srq = unsafe { core::mem::zeroed() };
    ibv.context = p.ibv.context;
    ibv.srq_context = a.srq_context;
    ibv.pd = pd;
    ibv.handle = next_handle();
    p.users.fetch_add(1, Ordering::SeqCst);
    let x = Box::into_raw(Box::new(XSrq {
        ibv,
        srq,
        pd: p,
        users: AtomicUsize::new(0),
        max_sge: got.max_sge,
    }));
    live::add(x, Kind::Srq);
    Ok(x as *mut ibv_srq)
}

pub extern "C" fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program does not destroy the SRQ `srq` while this call uses it.
        let Some(x) = (unsafe { xsrq(srq) }) else {
            return ret(Err(libc::EINVAL));
        };
        if attr.is_null() {
            return ret(Err(libc::EINVAL));
        }
        // ibv_cmd_modify_srq: refused EIO on a disassociated device (device::gone).
        if crate::context::ctx_gone(x.ibv.context) {
            return ret(Err(libc::EIO));
        }
        // SAFETY: `attr` points to the caller's ibv_srq_attr.
        let a = unsafe { *attr };
        let s = SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        };
        ret(x
            .srq
            .modify(&s, SrqAttrMask(mask as u32))
            .map_err(|e| e.errno()))
    })
}

pub extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program does not destroy the SRQ `srq` while this call uses it.
        let Some(x) = (unsafe { xsrq(srq) }) else {
            return ret(Err(libc::EINVAL));
        };
        if attr.is_null() {
            return ret(Err(libc::EINVAL));
        }
        // ibv_cmd_query_srq: as ibv_modify_srq.
        if crate::context::ctx_gone(x.ibv.context) {
            return ret(Err(libc::EIO));
        }
        match x.srq.query() {
            Ok(q) => {
                // SAFETY: `attr` points to the caller's ibv_srq_attr.
                unsafe {
                    attr.write(ibv_srq_attr {
                        max_wr: q.max_wr,
                        max_sge: q.max_sge,
                        srq_limit: q.srq_limit,
                    })
                };
                0
            }
            Err(e) => ret(Err(e.errno())),
        }
    })
}

pub extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program does not destroy the SRQ `srq` while this call uses it.
        match unsafe { xsrq(srq) } {
            None => return ret(Err(libc::EINVAL)),
            Some(x) if x.users.load(Ordering::SeqCst) > 0 => return ret(Err(libc::EBUSY)),
            Some(_) => {}
        }
        if !live::remove(srq, Kind::Srq) {
            return ret(Err(libc::EINVAL));
        }
        // SAFETY: still allocated (freed below); its context pointer is ours.
        crate::context::forget(unsafe { (*srq).context }, srq as usize);
        // SAFETY: removed above: a leaked Box<XSrq> freed once.
        let x = unsafe { Box::from_raw(srq as *mut XSrq) };
        let pd = x.pd;
        if let Err(e) = x.srq.destroy() {
            // No QP of ours uses it (checked above): not expected.
            eprintln!("xrnic: ibv_destroy_srq: {e}");
        }
        // SAFETY: an SRQ keeps its PD (ibv_dealloc_pd is EBUSY while `users` > 0).
        unsafe { &*pd }.users.fetch_sub(1, Ordering::SeqCst);
        0
    })
}

/// `ctx->ops.post_srq_recv`: each work request in turn; the first refused one is
/// returned in `bad` with its errno (ENOMEM when the SRQ is full, EINVAL for too many
/// SGEs, as rxe).
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut c_void,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the data path trusts the program's SRQ pointer, as every provider
        // does (a live Box<XSrq>).
        let x = unsafe { &*(srq as *const XSrq) };
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: `cur` is a node of the program's list.
            let w = unsafe { &*cur };
            // SAFETY: the work request's SGE list.
            let r = unsafe { sges(w.sg_list, w.num_sge, x.max_sge) }.and_then(|sg| {
                x.srq
                    .post_recv(RecvWr {
                        wr_id: w.wr_id,
                        sg_list: sg,
                    })
                    .map_err(|e| e.errno())
            });
            if let Err(e) = r {
                if !bad.is_null() {
                    // SAFETY: the caller's out pointer.
                    unsafe { *bad = cur };
                }
                return e;
            }
            cur = w.next;
        }
        0
    })
}
