//! The QP of an id: `rdma_init_qp_attr` (the attributes librdmacm gives each
//! transition), `rdma_create_qp`, `rdma_destroy_qp`, and the moves of the id's QP that
//! the connection makes.

use super::*;

pub(crate) fn attr_mask(bits: &[u32]) -> c_int {
    bits.iter().fold(0, |a, b| a | *b as c_int)
}

pub(crate) const QP_STATE: u32 = 1;
pub(crate) const QP_ACCESS_FLAGS: u32 = 1 << 3;
pub(crate) const QP_PKEY_INDEX: u32 = 1 << 4;
pub(crate) const QP_PORT: u32 = 1 << 5;
pub(crate) const QP_AV: u32 = 1 << 7;
pub(crate) const QP_PATH_MTU: u32 = 1 << 8;
pub(crate) const QP_TIMEOUT: u32 = 1 << 9;
pub(crate) const QP_RETRY_CNT: u32 = 1 << 10;
pub(crate) const QP_RNR_RETRY: u32 = 1 << 11;
pub(crate) const QP_RQ_PSN: u32 = 1 << 12;
pub(crate) const QP_MAX_QP_RD_ATOMIC: u32 = 1 << 13;
pub(crate) const QP_MIN_RNR_TIMER: u32 = 1 << 15;
pub(crate) const QP_SQ_PSN: u32 = 1 << 16;
pub(crate) const QP_MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
pub(crate) const QP_DEST_QPN: u32 = 1 << 20;

/// `rdma_init_qp_attr` for `state` (IBV_QPS_INIT 1, RTR 2, RTS 3).
pub(crate) fn init_qp_attr(x: &XId, state: c_int) -> Result<(ibv_qp_attr, c_int), c_int> {
    if ud::is_ud(x) {
        return ud::init_qp_attr(state);
    }
    let mut a = ibv_qp_attr {
        qp_state: state,
        ..Default::default()
    };
    if state == 1 {
        a.port_num = 1;
        // cm.c `cm_init_qp_init_attr`: remote write, plus read and atomics when the
        // id offers responder resources (every rdma_cm consumer here does).
        a.qp_access_flags = 1 | 2 | 4 | 8; // LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC
        return Ok((
            a,
            attr_mask(&[QP_STATE, QP_ACCESS_FLAGS, QP_PKEY_INDEX, QP_PORT]),
        ));
    }
    let st = x.st.lock().unwrap_or_else(|e| e.into_inner());
    let (Some(p), Some(c)) = (&st.port, st.cm) else {
        return Err(libc::EINVAL);
    };
    let q =
        p.cm.lock()
            .unwrap_or_else(|e| e.into_inner())
            .qp_attr(c)
            .ok_or(libc::EINVAL)?;
    if state == 2 {
        a.path_mtu = c_int::from(q.path.mtu);
        a.dest_qp_num = q.dest_qpn;
        // cma.c `rdma_init_qp_attr`: RTR's rq_psn is the id's own seq_num.
        a.rq_psn = x.seq_num;
        a.max_dest_rd_atomic = q.max_dest_rd_atomic;
        a.min_rnr_timer = q.min_rnr_timer;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.dgid.raw = q.path.remote_gid;
        a.ah_attr.grh.sgid_index = p.gid_index(&q.path.local_gid).ok_or(libc::EADDRNOTAVAIL)?;
        a.ah_attr.grh.hop_limit = q.path.hop_limit;
        a.ah_attr.grh.traffic_class = q.path.traffic_class;
        a.ah_attr.grh.flow_label = q.path.flow_label;
        Ok((
            a,
            attr_mask(&[
                QP_STATE,
                QP_AV,
                QP_PATH_MTU,
                QP_DEST_QPN,
                QP_RQ_PSN,
                QP_MAX_DEST_RD_ATOMIC,
                QP_MIN_RNR_TIMER,
            ]),
        ))
    } else if state == 3 {
        a.sq_psn = q.sq_psn;
        a.timeout = st.ack_timeout.unwrap_or(q.timeout);
        a.retry_cnt = q.retry_cnt;
        a.rnr_retry = q.rnr_retry;
        a.max_rd_atomic = q.max_rd_atomic;
        Ok((
            a,
            attr_mask(&[
                QP_STATE,
                QP_TIMEOUT,
                QP_RETRY_CNT,
                QP_RNR_RETRY,
                QP_SQ_PSN,
                QP_MAX_QP_RD_ATOMIC,
            ]),
        ))
    } else {
        Err(libc::EINVAL)
    }
}

pub extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        if attr.is_null() || mask.is_null() {
            return err(libc::EINVAL, -1);
        }
        // SAFETY: the caller's attribute struct names the state it wants.
        let state = unsafe { (*attr).qp_state };
        match init_qp_attr(x, state) {
            Ok((a, m)) => {
                // SAFETY: both are the caller's out-parameters.
                unsafe {
                    *attr = a;
                    *mask = m;
                }
                0
            }
            Err(e) => err(e, -1),
        }
    })
}

pub(crate) fn move_qp(x: &XId, state: c_int) -> Result<(), c_int> {
    if x.c().qp.is_null() {
        return Ok(());
    }
    let (mut a, m) = init_qp_attr(x, state)?;
    match crate::qp::ibv_modify_qp(x.c().qp, &mut a, m) {
        0 => Ok(()),
        e => Err(e),
    }
}

pub(crate) fn qp_to_error(x: &XId) {
    if !x.c().qp.is_null() {
        let mut a = ibv_qp_attr {
            qp_state: 6, // IBV_QPS_ERR
            ..Default::default()
        };
        crate::qp::ibv_modify_qp(x.c().qp, &mut a, QP_STATE as c_int);
    }
}

pub extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        if init.is_null() {
            return err(libc::EINVAL, -1);
        }
        // SAFETY: the caller's attribute struct.
        let ia = unsafe { &mut *init };
        let pd = if pd.is_null() && !x.c().pd.is_null() {
            x.c().pd
        } else {
            pd
        };
        let pd = if pd.is_null() || ia.send_cq.is_null() || ia.recv_cq.is_null() {
            // librdmacm makes what is missing (cma.c `ucma_get_pd`, `ucma_create_cqs`).
            let made_cqs = ia.send_cq.is_null() || ia.recv_cq.is_null();
            match sync::complete_init(x, pd, ia) {
                Ok(p) => {
                    x.st.lock().unwrap_or_else(|e| e.into_inner()).own_cqs |= made_cqs;
                    p
                }
                Err(e) => {
                    sync::destroy_cqs(x);
                    return err(e, -1);
                }
            }
        } else {
            pd
        };
        let qp = crate::qp::ibv_create_qp(pd, init);
        if qp.is_null() {
            return -1;
        }
        // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
        let idm = unsafe { &mut *x.id_ptr() };
        idm.qp = qp;
        // SAFETY: `init` is the caller's attribute struct, read after create filled it.
        unsafe {
            idm.send_cq = (*init).send_cq;
            idm.recv_cq = (*init).recv_cq;
        }
        // librdmacm `ucma_init_ud_qp`: a UD id's QP goes on to RTR and RTS at once.
        let moved = if ud::is_ud(x) {
            move_qp(x, 1)
                .and_then(|()| move_qp(x, 2))
                .and_then(|()| move_qp(x, 3))
        } else {
            move_qp(x, 1)
        };
        if let Err(e) = moved {
            crate::qp::ibv_destroy_qp(qp);
            // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
            unsafe { &mut *x.id_ptr() }.qp = core::ptr::null_mut();
            return err(e, -1);
        }
        0
    })
}

pub extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        if let Some(x) = unsafe { xid(id) } {
            if !x.c().qp.is_null() {
                crate::qp::ibv_destroy_qp(x.c().qp);
                // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one
                // is used.
                unsafe { &mut *x.id_ptr() }.qp = core::ptr::null_mut();
            }
            sync::destroy_cqs(x);
        }
    })
}
