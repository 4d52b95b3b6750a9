//! Protection domains and memory regions over the application's own memory
//! (`ibv_reg_mr`, `ibv_reg_mr_iova2`): the engine reads and writes the buffer in place
//! ([`xrnic::verbs::Pd::reg_user_mr`]), at the IOVA the program gave (its address for
//! `ibv_reg_mr`).

use core::ffi::{c_int, c_uint, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

use xrnic::verbs::Access;

use crate::context::{XMr, XPd, context, next_handle, xpd};
use crate::live::{self, Kind};
use crate::types::*;
use crate::{guard, ret, set_errno};

pub extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    guard(core::ptr::null_mut(), || {
        // SAFETY: the program does not close `ctx` while this call uses it.
        let Some(x) = (unsafe { context(ctx) }) else {
            set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        };
        match x.dev.alloc_pd() {
            Ok(pd) => {
                let p = Box::into_raw(Box::new(XPd {
                    ibv: ibv_pd {
                        context: ctx,
                        handle: next_handle(),
                    },
                    pd,
                    users: AtomicUsize::new(0),
                }));
                live::add(p, Kind::Pd);
                p as *mut ibv_pd
            }
            Err(e) => {
                set_errno(e.errno());
                core::ptr::null_mut()
            }
        }
    })
}

pub extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program does not destroy the PD `pd` while this call uses it.
        match unsafe { xpd(pd) } {
            None => return ret(Err(libc::EINVAL)),
            Some(p) if p.users.load(Ordering::SeqCst) > 0 => return ret(Err(libc::EBUSY)),
            Some(_) => {}
        }
        if !live::remove(pd, Kind::Pd) {
            return ret(Err(libc::EINVAL));
        }
        // SAFETY: it was a live Pd (a leaked Box<XPd>), removed above: freed once.
        drop(unsafe { Box::from_raw(pd as *mut XPd) });
        0
    })
}

/// `IBV_ACCESS_OPTIONAL_RANGE` (verbs.h): hints a device may ignore (relaxed ordering).
const ACCESS_OPTIONAL: c_uint = 0x3ff0_0000;
/// `IBV_ACCESS_HUGETLB`: a hint about the pages, nothing to do for xrnic.
const ACCESS_HUGETLB: c_uint = 1 << 7;

/// The access rights of `access`, or the errno: EOPNOTSUPP for memory windows, zero-based
/// and on-demand regions and flush rights (not implemented).
fn access_of(access: c_uint) -> Result<Access, c_int> {
    let a = access & !ACCESS_OPTIONAL & !ACCESS_HUGETLB;
    if a & !Access::ALL.0 != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(Access(a))
}

fn reg(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: c_uint) -> *mut ibv_mr {
    // SAFETY: the program does not destroy the PD `pd` while this call uses it.
    let Some(p) = (unsafe { xpd(pd) }) else {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    };
    let access = match access_of(access) {
        Ok(a) => a,
        Err(e) => {
            set_errno(e);
            return core::ptr::null_mut();
        }
    };
    // SAFETY: the verbs contract: the program keeps `addr..addr+len` mapped until
    // ibv_dereg_mr, which drops the Mr (deregisters it) before returning.
    let r = unsafe { p.pd.reg_user_mr(addr as *mut u8, len, iova, access) };
    match r {
        Ok(mr) => {
            p.users.fetch_add(1, Ordering::SeqCst);
            let x = Box::into_raw(Box::new(XMr {
                ibv: ibv_mr {
                    context: p.ibv.context,
                    pd,
                    addr,
                    length: len,
                    handle: next_handle(),
                    lkey: mr.lkey().0,
                    rkey: mr.rkey().0,
                },
                mr,
                pd: p,
            }));
            live::add(x, Kind::Mr);
            x as *mut ibv_mr
        }
        Err(e) => {
            set_errno(e.errno());
            core::ptr::null_mut()
        }
    }
}

pub extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    guard(core::ptr::null_mut(), || {
        reg(pd, addr, len, addr as u64, access as c_uint)
    })
}

pub extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard(core::ptr::null_mut(), || {
        reg(pd, addr, len, iova, access as c_uint)
    })
}

pub extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard(core::ptr::null_mut(), || reg(pd, addr, len, iova, access))
}

pub extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        if !live::remove(mr, Kind::Mr) {
            return ret(Err(libc::EINVAL));
        }
        // SAFETY: it was a live Mr (a leaked Box<XMr>), removed above: freed once.
        let x = unsafe { Box::from_raw(mr as *mut XMr) };
        // SAFETY: an MR keeps its PD: ibv_dealloc_pd refuses while `users` > 0.
        unsafe { &*x.pd }.users.fetch_sub(1, Ordering::SeqCst);
        drop(x);
        0
    })
}
