//! UD ids (RDMA_PS_UDP): no connection, a SIDR exchange instead (IBTA vol.1 §12.11).
//!
//! As librdmacm and the kernel's cma.c do it for RoCE:
//! - `rdma_create_qp` moves the UD QP straight to RTS with the port space's Q_Key
//!   (librdmacm cma.c `ucma_init_ud_qp`: INIT with port, P_Key index and Q_Key, RTR, RTS
//!   with SQ PSN 0);
//! - `rdma_connect` sends a SIDR_REQ whose private data starts with the same IP header as
//!   a REQ's (kernel cma.c `cma_resolve_ib_udp`); the SIDR_REP brings ESTABLISHED with
//!   `param.ud` (the peer's QPN, its Q_Key and an address handle towards it), a SIDR_REP
//!   with a status other than 0 brings UNREACHABLE (cma.c `cma_sidr_rep_handler`);
//! - a SIDR_REQ for a listener is CONNECT_REQUEST on a new UD id, `rdma_accept` answers
//!   with the id's QPN and Q_Key (cma.c `cma_send_sidr_rep`), `rdma_reject` with status
//!   "rejected".

use core::ffi::c_int;
use std::net::SocketAddr;
use std::sync::Arc;

use xrnic::cm::{CmId, Path};
use xrnic::wire::mad::{CMA_HDR_LEN, CmaHdr, SidrRep, SidrReq};

use super::*;

/// librdmacm's / the kernel's Q_Key of RDMA_PS_UDP ids (`RDMA_UDP_QKEY`).
pub(super) const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// `IBV_QPT_UD`.
pub(super) const QPT_UD: c_int = 4;
const QP_QKEY: u32 = 1 << 6;
/// Private data of a SIDR_REQ and a SIDR_REP (IBTA vol.1 §12.11, Tables 107, 108).
const SIDR_REQ_PRIVATE: usize = 216;
const SIDR_REP_PRIVATE: usize = 136;

pub(super) fn is_ud(x: &XId) -> bool {
    x.c().ps == c_int::from(RDMA_PS_UDP)
}

/// `rdma_init_qp_attr` of a UD id (librdmacm `ucma_init_ud_qp`, kernel cma.c
/// `cma_ib_init_qp_attr` for UD: Q_Key and P_Key index at INIT; RTR and RTS need only
/// the state, and SQ PSN 0 at RTS).
pub(super) fn init_qp_attr(state: c_int) -> Result<(ibv_qp_attr, c_int), c_int> {
    let mut a = ibv_qp_attr {
        qp_state: state,
        ..Default::default()
    };
    match state {
        1 => {
            a.port_num = 1;
            a.pkey_index = 0;
            a.qkey = RDMA_UDP_QKEY;
            Ok((a, attr_mask(&[QP_STATE, QP_PKEY_INDEX, QP_PORT, QP_QKEY])))
        }
        2 => Ok((a, attr_mask(&[QP_STATE]))),
        3 => {
            a.sq_psn = 0;
            Ok((a, attr_mask(&[QP_STATE, QP_SQ_PSN])))
        }
        _ => Err(libc::EINVAL),
    }
}

/// The address handle attributes towards `path.remote_gid` (what the kernel's
/// `ib_init_ah_attr_from_path` gives a UD id on RoCE: global, our GID's index).
fn ah_attr(p: &Port, path: &Path) -> ibv_ah_attr {
    let mut a = ibv_ah_attr {
        is_global: 1,
        port_num: 1,
        ..Default::default()
    };
    a.grh.dgid.raw = path.remote_gid;
    a.grh.sgid_index = p.gid_index(&path.local_gid).unwrap_or(0);
    a.grh.hop_limit = p.dev.route_hop_limit(&path.remote_gid);
    a.grh.traffic_class = path.traffic_class;
    a.grh.flow_label = path.flow_label;
    a
}

fn ud_event(x: &XId, kind: c_int, ah: ibv_ah_attr, qpn: u32, qkey: u32, data: &[u8]) -> XEvent {
    let mut e = event(x, kind, 0);
    e.ev.param.ud = rdma_ud_param {
        private_data: core::ptr::null(),
        private_data_len: data.len().min(255) as u8,
        ah_attr: ah,
        qp_num: qpn,
        qkey,
    };
    e.private = data.to_vec();
    e
}

/// `rdma_connect` on a UD id: the SIDR_REQ (the IP header, then the program's bytes).
pub(super) fn connect(
    x: &XId,
    id: *mut rdma_cm_id,
    p: &Arc<Port>,
    param: *const rdma_conn_param,
) -> Result<(), c_int> {
    let (Some(src), Some(dst)) = (
        sockaddr(&x.c().route.addr.src as *const _ as *const libc::sockaddr),
        sockaddr(&x.c().route.addr.dst as *const _ as *const libc::sockaddr),
    ) else {
        return Err(libc::EINVAL);
    };
    let user = param_of(x, param, 0).private_data;
    if user.len() > SIDR_REQ_PRIVATE - CMA_HDR_LEN {
        return Err(libc::EINVAL);
    }
    let mut pd = vec![0u8; CMA_HDR_LEN];
    CmaHdr { src, dst: dst.ip() }.emit(&mut pd);
    pd.extend_from_slice(&user);
    let remote_gid = x.c().route.addr.ib.dgid.raw;
    let path = Path {
        local_gid: x.c().route.addr.ib.sgid.raw,
        remote_gid,
        mtu: xrnic::verbs::ibv::conv::mtu_to_ibv(p.dev.query_port().active_mtu) as u8,
        hop_limit: p.dev.route_hop_limit(&remote_gid),
        traffic_class: 0,
        flow_label: 0,
    };
    let sid = service_id(x.c().ps as u16, dst.port());
    let key = Arc::as_ptr(p) as usize;
    {
        // Registered before the SIDR_REP can be dispatched (the port's thread).
        let mut cm = p.cm.lock().unwrap_or_else(|e| e.into_inner());
        let c = cm.sidr_request(p.now(), sid, path, &pd);
        reg(|r| r.conns.insert((key, c), id as usize));
        let mut st = x.st.lock().unwrap_or_else(|e| e.into_inner());
        st.cm = Some(c);
        st.ud_path = Some(path);
    }
    // Sends the queued SIDR_REQ.
    p.with_cm(|_, _| ());
    Ok(())
}

/// `rdma_accept` on a UD id: SIDR_REP "OK" with the id's QPN and Q_Key.
pub(super) fn accept(
    x: &XId,
    p: &Port,
    c: CmId,
    param: *const rdma_conn_param,
) -> Result<(), c_int> {
    let cp = param_of(x, param, 0);
    if cp.private_data.len() > SIDR_REP_PRIVATE {
        return Err(libc::EINVAL);
    }
    if !p.with_cm(|cm, _| cm.sidr_accept(c, cp.qpn, RDMA_UDP_QKEY, &cp.private_data)) {
        return Err(libc::EINVAL);
    }
    // The exchange is over: the CM forgot the request (SIDR has no RTU).
    reg(|r| r.conns.remove(&(p as *const Port as usize, c)));
    x.st.lock().unwrap_or_else(|e| e.into_inner()).cm = None;
    Ok(())
}

/// A SIDR_REQ for `listener`: CONNECT_REQUEST on a new UD id.
pub(super) fn on_request(p: &Port, listener: u64, c: CmId, from: [u8; 16], req: &SidrReq) {
    // SAFETY: the port thread looks the id up (registered ids only) and uses it for this
    // event. It relies on the program not destroying the id meanwhile (librdmacm: an id is
    // destroyed only after its events are acked); nothing here holds rdma_destroy_id off.
    let Some(l) = (unsafe { xid(listener as *mut rdma_cm_id) }) else {
        p.with_cm(|cm, _| cm.reject(c, 0, &[]));
        return;
    };
    let Some(h) = CmaHdr::parse(&req.private_data) else {
        p.with_cm(|cm, _| cm.reject(c, 0, &[]));
        return;
    };
    let lport = sockaddr(&l.c().route.addr.src as *const _ as *const libc::sockaddr)
        .map_or(0, |a| a.port());
    let child = new_child(l);
    // SAFETY: just made, registered, not yet visible to the program.
    let cx = unsafe { &*child };
    // SAFETY: no other reference to the rdma_cm_id of `cx` is live while this one is used.
    let ci = unsafe { &mut *cx.id_ptr() };
    ci.verbs = p.ctx;
    ci.pd = super::sync::default_pd(p.ctx);
    ci.port_num = 1;
    ci.qp_type = QPT_UD;
    store(&mut ci.route.addr.src, SocketAddr::new(h.dst, lport));
    store(&mut ci.route.addr.dst, h.src);
    ci.route.addr.ib.sgid.raw = gid_of(h.dst);
    ci.route.addr.ib.dgid.raw = from;
    ci.route.addr.ib.pkey = 0xffff;
    let path = Path {
        local_gid: gid_of(h.dst),
        remote_gid: from,
        ..Path::default()
    };
    {
        let mut st = cx.st.lock().unwrap_or_else(|e| e.into_inner());
        st.port = ports_arc(p);
        st.cm = Some(c);
        st.ud_path = Some(path);
    }
    reg(|r| {
        r.conns
            .insert((p as *const Port as usize, c), child as usize)
    });
    // kernel cma.c `cma_set_ib_event` / librdmacm `ucma_copy_ud_event`: the private data
    // after the IP header; the QPN and Q_Key are not known yet (0).
    let mut e = ud_event(
        cx,
        ev::CONNECT_REQUEST,
        ah_attr(p, &path),
        0,
        0,
        &req.private_data[CMA_HDR_LEN..],
    );
    e.ev.listen_id = listener as *mut rdma_cm_id;
    push(l.c().channel, e);
}

/// The SIDR_REP "OK" to our SIDR_REQ: ESTABLISHED with the peer's QPN, Q_Key and AH.
pub(super) fn on_reply(p: &Port, c: CmId, rep: &SidrRep) {
    // SAFETY: the port thread looks the id up (registered ids only) and uses it for this
    // event. It relies on the program not destroying the id meanwhile (librdmacm: an id is
    // destroyed only after its events are acked); nothing here holds rdma_destroy_id off.
    let Some(x) = (unsafe { conn_id(p, c) }) else {
        return;
    };
    reg(|r| r.conns.remove(&(p as *const Port as usize, c)));
    let path = {
        let mut st = x.st.lock().unwrap_or_else(|e| e.into_inner());
        st.cm = None;
        st.ud_path
    };
    let Some(path) = path else { return };
    push(
        x.c().channel,
        ud_event(
            x,
            ev::ESTABLISHED,
            ah_attr(p, &path),
            rep.qpn,
            rep.qkey,
            &rep.private_data,
        ),
    );
}

/// A SIDR_REP with a status other than OK (the CM gives it as `Rejected`): UNREACHABLE,
/// the SIDR status as the event's status (cma.c `cma_sidr_rep_handler`).
pub(super) fn on_refused(p: &Port, c: CmId, status: u16) {
    // SAFETY: the port thread looks the id up (registered ids only) and uses it for this
    // event. It relies on the program not destroying the id meanwhile (librdmacm: an id is
    // destroyed only after its events are acked); nothing here holds rdma_destroy_id off.
    let Some(x) = (unsafe { conn_id(p, c) }) else {
        return;
    };
    reg(|r| r.conns.remove(&(p as *const Port as usize, c)));
    x.st.lock().unwrap_or_else(|e| e.into_inner()).cm = None;
    push(
        x.c().channel,
        event(x, ev::UNREACHABLE, c_int::from(status)),
    );
}
