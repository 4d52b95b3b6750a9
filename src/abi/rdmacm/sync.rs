//! librdmacm's synchronous mode (an id made with a NULL channel) and the endpoint calls
//! built on it (`rdma_create_ep`, `rdma_get_request`, `rdma_destroy_ep`), as librdmacm
//! cma.c does them:
//! - a sync id gets a channel of its own; each call that starts an exchange then waits
//!   for the id's next event (`ucma_complete`): it is kept in `id->event` (the previous
//!   one acked), and a failed event is the call's error (REJECTED: ECONNREFUSED, else
//!   the status as errno);
//! - a sync listener's children get a channel of their own too (cma.c
//!   `ucma_process_conn_req` migrates them), and `rdma_get_request` waits for the
//!   CONNECT_REQUEST and creates the child's QP from the listener's `qp_init_attr`;
//! - `rdma_create_qp` without a PD or CQs takes the device's default PD and makes a
//!   completion channel and CQ for each queue (cma.c `ucma_get_pd`, `ucma_create_cqs`),
//!   which `rdma_get_send_comp` / `rdma_get_recv_comp` (rdma_verbs.h) wait on.

use core::ffi::c_int;
use std::collections::HashMap;
use std::sync::Mutex;

use super::*;

/// `RAI_PASSIVE` (rdma_cma.h).
const RAI_PASSIVE: c_int = 1;

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .filter(|e| *e != 0)
        .unwrap_or(libc::EIO)
}

pub(super) fn is_sync(x: &XId) -> bool {
    x.st.lock().unwrap_or_else(|e| e.into_inner()).sync
}

/// `ucma_complete`: for a sync id, wait for its next event and keep it in `id->event`.
pub(super) fn complete(x: &XId) -> Result<(), c_int> {
    if !is_sync(x) {
        return Ok(());
    }
    // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
    let id = unsafe { &mut *x.id_ptr() };
    if !id.event.is_null() {
        rdma_ack_cm_event(id.event);
        id.event = core::ptr::null_mut();
    }
    let mut e = core::ptr::null_mut();
    if rdma_get_cm_event(x.c().channel, &mut e) != 0 {
        return Err(errno());
    }
    // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
    unsafe { &mut *x.id_ptr() }.event = e;
    // SAFETY: an event handed out by rdma_get_cm_event just now, not yet acked.
    let (kind, status) = unsafe { ((*e).event, (*e).status) };
    match status {
        0 => Ok(()),
        _ if kind == ev::REJECTED => Err(libc::ECONNREFUSED),
        s if s < 0 => Err(-s),
        s => Err(s),
    }
}

/// A sync id's own channel (librdmacm `rdma_create_id` with a NULL channel).
pub(super) fn own_channel() -> *mut rdma_event_channel {
    rdma_create_event_channel()
}

/// `rdma_destroy_id` of a sync id: its last event acked and its channel destroyed.
pub(super) fn release(ch: *mut rdma_event_channel, event: *mut rdma_cm_event) {
    if !event.is_null() {
        rdma_ack_cm_event(event);
    }
    rdma_destroy_event_channel(ch);
}

/// The default PD of each device context, made on first use: librdmacm's per-device PD
/// (cma.c `ucma_get_device` allocates it and sets `id->pd` to it whenever an id is bound
/// to a device; `rdma_create_qp` uses it when given none).
static PDS: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);

pub(super) fn default_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    let mut g = PDS.lock().unwrap_or_else(|e| e.into_inner());
    let m = g.get_or_insert_with(HashMap::new);
    if let Some(&p) = m.get(&(ctx as usize)) {
        return p as *mut ibv_pd;
    }
    let pd = crate::mr::ibv_alloc_pd(ctx);
    if !pd.is_null() {
        m.insert(ctx as usize, pd as usize);
    }
    pd
}

/// Fill in what `rdma_create_qp` may be given empty: the PD and the CQs (each with a
/// completion channel, kept on the id). Returns the PD to use.
pub(super) fn complete_init(
    x: &XId,
    pd: *mut ibv_pd,
    init: &mut ibv_qp_init_attr,
) -> Result<*mut ibv_pd, c_int> {
    let ctx = x.c().verbs;
    if ctx.is_null() {
        return Err(libc::EINVAL);
    }
    let pd = if !pd.is_null() {
        pd
    } else if !x.c().pd.is_null() {
        x.c().pd
    } else {
        default_pd(ctx)
    };
    if pd.is_null() {
        return Err(errno());
    }
    // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
    unsafe { &mut *x.id_ptr() }.pd = pd;
    // The CQs in the PD's context: a QP's PD and CQs must be of one context
    // (src/abi/qp.rs), and a program may give a PD of a context it opened itself
    // (librdmacm would refuse a PD not of `id->verbs`; xrnic's ids take either).
    // SAFETY: the program does not destroy the PD `pd` while this call uses it.
    let ctx = unsafe { crate::context::xpd(pd) }.map_or(ctx, |p| p.ibv.context);
    let make = |n: u32| -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
        let ch = crate::cq::ibv_create_comp_channel(ctx);
        if ch.is_null() {
            return Err(errno());
        }
        let cq = crate::cq::ibv_create_cq(ctx, n.max(1) as c_int, core::ptr::null_mut(), ch, 0);
        if cq.is_null() {
            let e = errno();
            crate::cq::ibv_destroy_comp_channel(ch);
            return Err(e);
        }
        Ok((ch, cq))
    };
    if init.send_cq.is_null() {
        let (ch, cq) = make(init.cap.max_send_wr)?;
        // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
        let idm = unsafe { &mut *x.id_ptr() };
        idm.send_cq_channel = ch;
        idm.send_cq = cq;
        init.send_cq = cq;
    }
    if init.recv_cq.is_null() {
        let (ch, cq) = make(init.cap.max_recv_wr)?;
        // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
        let idm = unsafe { &mut *x.id_ptr() };
        idm.recv_cq_channel = ch;
        idm.recv_cq = cq;
        init.recv_cq = cq;
    }
    Ok(pd)
}

/// The CQs and channels `complete_init` made for `x` (rdma_destroy_qp).
pub(super) fn destroy_cqs(x: &XId) {
    let st = x.st.lock().unwrap_or_else(|e| e.into_inner());
    let own = st.own_cqs;
    drop(st);
    if !own {
        return;
    }
    // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
    let idm = unsafe { &mut *x.id_ptr() };
    for (cq, ch) in [
        (&mut idm.send_cq, &mut idm.send_cq_channel),
        (&mut idm.recv_cq, &mut idm.recv_cq_channel),
    ] {
        if !cq.is_null() {
            crate::cq::ibv_destroy_cq(*cq);
            *cq = core::ptr::null_mut();
        }
        if !ch.is_null() {
            crate::cq::ibv_destroy_comp_channel(*ch);
            *ch = core::ptr::null_mut();
        }
    }
}

pub extern "C" fn rdma_create_ep(
    out: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        if out.is_null() || res.is_null() {
            return err(libc::EINVAL, -1);
        }
        // SAFETY: the caller's rdma_addrinfo (from rdma_getaddrinfo).
        let r = unsafe { &*res };
        let mut id = core::ptr::null_mut();
        if rdma_create_id(
            core::ptr::null_mut(),
            &mut id,
            core::ptr::null_mut(),
            r.ai_port_space,
        ) != 0
        {
            return -1;
        }
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let fail = |id: *mut rdma_cm_id| {
            let e = errno();
            rdma_destroy_ep(id);
            err(e, -1)
        };
        if r.ai_flags & RAI_PASSIVE != 0 {
            if rdma_bind_addr(id, r.ai_src_addr) != 0 {
                return fail(id);
            }
            if !pd.is_null() {
                // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one
                // is used.
                unsafe { &mut *x.id_ptr() }.pd = pd;
            }
            if !qp_init_attr.is_null() {
                // SAFETY: the caller's attribute struct.
                let mut a = unsafe { core::ptr::read(qp_init_attr) };
                a.qp_type = r.ai_qp_type;
                x.st.lock().unwrap_or_else(|e| e.into_inner()).qp_init = Some(a);
            }
        } else {
            if rdma_resolve_addr(id, r.ai_src_addr, r.ai_dst_addr, 2000) != 0
                || rdma_resolve_route(id, 2000) != 0
            {
                return fail(id);
            }
            if !qp_init_attr.is_null() {
                // SAFETY: the caller's attribute struct (librdmacm writes the type).
                unsafe { (*qp_init_attr).qp_type = r.ai_qp_type };
                if rdma_create_qp(id, pd, qp_init_attr) != 0 {
                    return fail(id);
                }
            }
        }
        // SAFETY: the caller's pointer slot.
        unsafe { *out = id };
        0
    })
}

pub extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        if unsafe { xid(id) }.is_some() {
            rdma_destroy_qp(id);
            rdma_destroy_id(id);
        }
    })
}

/// `rdma_get_request`: the next CONNECT_REQUEST of a sync listener, its QP made from
/// the listener's `qp_init_attr`; the event stays in the new id's `event`.
pub extern "C" fn rdma_get_request(listen: *mut rdma_cm_id, out: *mut *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `listen` while this call uses it.
        let Some(l) = (unsafe { xid(listen) }) else {
            return err(libc::EINVAL, -1);
        };
        if out.is_null() || !is_sync(l) {
            return err(libc::EINVAL, -1);
        }
        if let Err(e) = complete(l) {
            return err(e, -1);
        }
        let e = l.c().event;
        // SAFETY: the event complete() just stored.
        let (kind, child) = unsafe { ((*e).event, (*e).id) };
        if kind != ev::CONNECT_REQUEST {
            return err(libc::EINVAL, -1);
        }
        // The event moves to the child (librdmacm: `(*id)->event = event`).
        // SAFETY: no other reference to the rdma_cm_id of `l` is live while this one is used.
        unsafe { &mut *l.id_ptr() }.event = core::ptr::null_mut();
        // SAFETY: the child id the event names is the program's only from this call on.
        let Some(cx) = (unsafe { xid(child) }) else {
            rdma_ack_cm_event(e);
            return err(libc::EINVAL, -1);
        };
        // SAFETY: no other reference to the rdma_cm_id of `cx` is live while this one is used.
        unsafe { &mut *cx.id_ptr() }.event = e;
        let qi =
            l.st.lock()
                .unwrap_or_else(|e| e.into_inner())
                .qp_init
                .as_ref()
                .map(|a| ibv_qp_init_attr {
                    qp_context: a.qp_context,
                    send_cq: a.send_cq,
                    recv_cq: a.recv_cq,
                    srq: a.srq,
                    cap: a.cap,
                    qp_type: a.qp_type,
                    sq_sig_all: a.sq_sig_all,
                });
        if let Some(mut a) = qi {
            if rdma_create_qp(child, l.c().pd, &mut a) != 0 {
                let er = errno();
                rdma_reject(child, core::ptr::null(), 0);
                rdma_destroy_id(child);
                return err(er, -1);
            }
        }
        // SAFETY: the caller's pointer slot.
        unsafe { *out = child };
        0
    })
}
