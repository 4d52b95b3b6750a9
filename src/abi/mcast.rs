//! `ibv_attach_mcast` / `ibv_detach_mcast` (libibverbs, IBTA vol. 1 §11.2.5) on a UD QP
//! of an xrnic device: the Rust API's `Qp::attach_mcast` / `detach_mcast`
//! (src/verbs/mcast.rs), with rxe's answers: 0 for an attach of a pair attached already
//! (uverbs finds it in the QP's list), EINVAL for a GID that is not multicast or a QP
//! that is not UD (ib_core `ib_attach_mcast`), for a detach of a pair not attached
//! (rxe `rxe_detach_mcg`) and for a pointer that is no live QP of ours; ENOMEM past rxe's
//! limits; EIO once the device is gone. The MLID is not used (RoCE, ib_core
//! `is_valid_mcast_lid`). Like libibverbs' verbs they return the errno value.

use core::ffi::c_int;

use crate::context::xqp;
use crate::types::*;
use crate::{guard, ret};

pub extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    guard(libc::EIO, || ret(change(qp, gid, lid, true)))
}

pub extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    guard(libc::EIO, || ret(change(qp, gid, lid, false)))
}

fn change(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16, attach: bool) -> Result<(), c_int> {
    // SAFETY: the program does not destroy the QP `qp` while this call uses it.
    let q = unsafe { xqp(qp) }.ok_or(libc::EINVAL)?;
    if gid.is_null() {
        return Err(libc::EINVAL);
    }
    if crate::context::ctx_gone(q.ibv.qp_base.context) {
        return Err(libc::EIO);
    }
    // SAFETY: `gid` points to the caller's 16-byte union ibv_gid (verbs.h contract),
    // checked non-NULL above; every bit pattern is a valid `raw`.
    let g: [u8; 16] = unsafe { (*gid).raw };
    let r = if attach {
        q.qp.attach_mcast(&g, lid)
    } else {
        q.qp.detach_mcast(&g, lid)
    };
    r.map_err(|e| {
        if std::env::var_os("XRNIC_DEBUG").is_some() {
            let verb = if attach { "attach" } else { "detach" };
            eprintln!("xrnic: ibv_{verb}_mcast: {e}");
        }
        e.errno()
    })
}
