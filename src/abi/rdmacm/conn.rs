//! Connections: `rdma_connect`, `rdma_accept`, `rdma_reject`, `rdma_establish`,
//! `rdma_disconnect`; the CM's events turned into each id's `RDMA_CM_EVENT_*`
//! ([`dispatch`], called by the id's port, rdmacm_port.rs); and the id's other calls
//! (ports, migration, options, the device list).

use super::*;

pub(crate) fn param_of(x: &XId, p: *const rdma_conn_param, psn: u32) -> ConnParam {
    let mut c = ConnParam {
        psn,
        qpn: if x.c().qp.is_null() {
            0
        } else {
            // SAFETY: a QP created by rdma_create_qp, live while the id holds it.
            unsafe { (*x.c().qp).qp_num }
        },
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    };
    if !p.is_null() {
        // SAFETY: the caller's rdma_conn_param; private_data points to private_data_len bytes.
        let p = unsafe { &*p };
        c.responder_resources = p.responder_resources;
        c.initiator_depth = p.initiator_depth;
        c.retry_count = p.retry_count;
        c.rnr_retry_count = p.rnr_retry_count;
        c.srq = p.srq != 0;
        if x.c().qp.is_null() {
            c.qpn = p.qp_num;
        }
        if !p.private_data.is_null() && p.private_data_len > 0 {
            // SAFETY: as above.
            c.private_data = unsafe {
                core::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len.into())
            }
            .to_vec();
        }
    }
    c
}

pub(crate) fn random_psn() -> u32 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |d| d.subsec_nanos());
    (n.wrapping_mul(2654435761) >> 4) & 0xff_ffff
}

pub extern "C" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let p = x.st.lock().unwrap_or_else(|e| e.into_inner()).port.clone();
        let Some(p) = p else {
            return err(libc::EINVAL, -1);
        };
        let (Some(src), Some(dst)) = (
            sockaddr(&x.c().route.addr.src as *const _ as *const libc::sockaddr),
            sockaddr(&x.c().route.addr.dst as *const _ as *const libc::sockaddr),
        ) else {
            return err(libc::EINVAL, -1);
        };
        if ud::is_ud(x) {
            return errno_ret(ud::connect(x, id, &p, param).and_then(|()| sync::complete(x)));
        }
        let psn = x.seq_num;
        let mut cp = param_of(x, param, psn);
        if cp.private_data.len() > 92 - CMA_HDR_LEN {
            return err(libc::EINVAL, -1);
        }
        // The IP header first (kernel cma.c `cma_format_hdr`), then the program's bytes.
        let mut pd = vec![0u8; CMA_HDR_LEN];
        CmaHdr { src, dst: dst.ip() }.emit(&mut pd);
        pd.extend_from_slice(&cp.private_data);
        cp.private_data = pd;
        let local_gid = x.c().route.addr.ib.sgid.raw;
        let remote_gid = x.c().route.addr.ib.dgid.raw;
        let mtu = p.dev.query_port().active_mtu as u8;
        let hop_limit = p.dev.route_hop_limit(&remote_gid);
        let path = Path {
            local_gid,
            remote_gid,
            mtu: xrnic::verbs::ibv::conv::mtu_to_ibv(p.dev.query_port().active_mtu) as u8,
            hop_limit,
            traffic_class: 0,
            flow_label: 0,
        };
        let _ = mtu;
        let sid = service_id(x.c().ps as u16, dst.port());
        let key = Arc::as_ptr(&p) as usize;
        // Register the id before the REQ can be answered.
        let c = {
            let mut cm = p.cm.lock().unwrap_or_else(|e| e.into_inner());
            let now = p.now();
            let c = cm.connect(now, sid, path, cp);
            reg(|r| r.conns.insert((key, c), id as usize));
            let mut st = x.st.lock().unwrap_or_else(|e| e.into_inner());
            st.cm = Some(c);
            c
        };
        let _ = c;
        p.with_cm(|_, _| ());
        errno_ret(sync::complete(x))
    })
}

pub extern "C" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let (p, c) = {
            let st = x.st.lock().unwrap_or_else(|e| e.into_inner());
            (st.port.clone(), st.cm)
        };
        let (Some(p), Some(c)) = (p, c) else {
            return err(libc::EINVAL, -1);
        };
        if ud::is_ud(x) {
            return errno_ret(ud::accept(x, &p, c, param));
        }
        let psn = x.seq_num;
        let cp = param_of(x, param, psn);
        {
            // The CM's view of our side, for the QP moves before the REP (librdmacm
            // rdma_accept: RTR then RTS, then the kernel sends the REP).
            let mut cm = p.cm.lock().unwrap_or_else(|e| e.into_inner());
            cm.set_local(c, cp.clone());
        }
        if let Err(e) = move_qp(x, 2).and_then(|()| move_qp(x, 3)) {
            return err(e, -1);
        }
        if !p.with_cm(|cm, now| cm.accept(now, c, cp)) {
            return err(libc::EINVAL, -1);
        }
        errno_ret(sync::complete(x))
    })
}

pub extern "C" fn rdma_reject(id: *mut rdma_cm_id, private: *const c_void, len: u8) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let (p, c) = {
            let mut st = x.st.lock().unwrap_or_else(|e| e.into_inner());
            (st.port.clone(), st.cm.take())
        };
        let (Some(p), Some(c)) = (p, c) else {
            return err(libc::EINVAL, -1);
        };
        let data = if private.is_null() {
            Vec::new()
        } else {
            // SAFETY: `private` points to `len` bytes (librdmacm contract).
            unsafe { core::slice::from_raw_parts(private as *const u8, len.into()) }.to_vec()
        };
        reg(|r| r.conns.remove(&(Arc::as_ptr(&p) as usize, c)));
        errno_ret(
            p.with_cm(|cm, _| cm.reject(c, rej_reason::CONSUMER_DEFINED, &data))
                .then_some(())
                .ok_or(libc::EINVAL),
        )
    })
}

/// `struct ibv_ece` (verbs.h): the enhanced connection establishment options.
#[repr(C)]
pub struct ibv_ece {
    pub vendor_id: u32,
    pub options: u32,
    pub comp_mask: u32,
}

/// `rdma_set_local_ece` as rdma-core 44's cma.c: only for an id whose QP the program
/// keeps outside the CM (`id->qp` NULL), with a vendor ID and no comp_mask, else EINVAL.
/// xrnic's QPs have no ECE options (`ibv_query_ece`/`ibv_set_ece` are EOPNOTSUPP, as on
/// rxe), so nothing is sent in the REQ/REP: the options are accepted and not carried.
pub extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        if ece.is_null() || !x.c().qp.is_null() {
            return err(libc::EINVAL, -1);
        }
        // SAFETY: not NULL: the caller's ibv_ece, read during the call.
        let e = unsafe { &*ece };
        if e.vendor_id == 0 || e.comp_mask != 0 {
            return err(libc::EINVAL, -1);
        }
        0
    })
}

/// `rdma_get_remote_ece` as rdma-core 44's cma.c: the peer's ECE from its REQ/REP, for an
/// id without a CM-owned QP (else EINVAL). No xrnic or rxe peer sends one: vendor ID and
/// options 0.
pub extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        if ece.is_null() || !x.c().qp.is_null() {
            return err(libc::EINVAL, -1);
        }
        // SAFETY: not NULL: the caller's ibv_ece, written during the call.
        unsafe {
            *ece = ibv_ece {
                vendor_id: 0,
                options: 0,
                comp_mask: 0,
            }
        };
        0
    })
}

pub extern "C" fn rdma_reject_ece(id: *mut rdma_cm_id, private: *const c_void, len: u8) -> c_int {
    rdma_reject(id, private, len)
}

pub extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        let (p, c) = {
            let st = x.st.lock().unwrap_or_else(|e| e.into_inner());
            (st.port.clone(), st.cm)
        };
        let (Some(p), Some(c)) = (p, c) else {
            return err(libc::EINVAL, -1);
        };
        x.st.lock()
            .unwrap_or_else(|e| e.into_inner())
            .established_by_call = true;
        let sent = p.with_cm(|cm, _| cm.rtu(c));
        if !sent {
            x.st.lock()
                .unwrap_or_else(|e| e.into_inner())
                .established_by_call = false;
        }
        errno_ret(sent.then_some(()).ok_or(libc::EINVAL))
    })
}

pub extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        // librdmacm: the QP to ERROR first (its WRs flush), then DREQ / DREP.
        qp_to_error(x);
        let (p, c) = {
            let st = x.st.lock().unwrap_or_else(|e| e.into_inner());
            (st.port.clone(), st.cm)
        };
        let (Some(p), Some(c)) = (p, c) else {
            return err(libc::EINVAL, -1);
        };
        let ok = p.with_cm(|cm, now| cm.disconnect(now, c));
        p.drain_sends(Duration::from_millis(200));
        errno_ret(ok.then_some(()).ok_or(libc::EINVAL))
    })
}

/// The id for CM connection `c` of port `p`, if it is still live.
///
/// # Safety
///
/// As [`xid`]'s: the program does not call `rdma_destroy_id` on the id while the
/// reference is used.
pub(crate) unsafe fn conn_id<'a>(p: &Port, c: CmId) -> Option<&'a XId> {
    let key = p as *const Port as usize;
    let ptr = reg(|r| r.conns.get(&(key, c)).copied())?;
    // SAFETY: this function's contract is xid's.
    unsafe { xid(ptr as *mut rdma_cm_id) }
}

/// What a port calls back into the ids: [`dispatch`] and the ids' publication.
static UPCALLS: Upcalls = Upcalls {
    dispatch,
    publish: publish_ids,
};

/// The CM port of `ifname` (rdmacm_port.rs), opened on first use.
pub(crate) fn cm_port(ifname: &str) -> Result<std::sync::Arc<Port>, i32> {
    crate::rdmacm_port::port(ifname, &UPCALLS)
}

/// A CM event of port `p`, turned into the `RDMA_CM_EVENT_*` its id's program sees
/// (called by the port with no lock held).
pub fn dispatch(p: &Port, e: CmEvent) {
    match e {
        CmEvent::ConnectRequest {
            listener,
            id: c,
            from: _,
            req,
        } => on_connect_request(p, listener, c, &req),
        CmEvent::ConnectResponse { id: c, rep } => on_connect_response(p, c, &rep),
        CmEvent::Established { id: c } => on_established(p, c),
        CmEvent::Rejected {
            id: c,
            reason,
            private_data,
        } => on_rejected(p, c, reason, &private_data),
        CmEvent::Unreachable { id: c } => notify(p, c, ev::UNREACHABLE, -libc::ETIMEDOUT),
        CmEvent::Disconnected { id: c } => notify(p, c, ev::DISCONNECTED, 0),
        // cma.c cma_ib_handler: IB_CM_DREQ_ERROR is DISCONNECTED with -ETIMEDOUT.
        CmEvent::DreqError { id: c } => notify(p, c, ev::DISCONNECTED, -libc::ETIMEDOUT),
        CmEvent::TimewaitExit { id: c } => on_timewait_exit(p, c),
        CmEvent::SidrRequest {
            listener,
            id: c,
            from,
            req,
        } => ud::on_request(p, listener, c, from, &req),
        CmEvent::SidrReply { id: c, rep } => ud::on_reply(p, c, &rep),
    }
}

/// A REQ for listener `listener`: a new child id on the listener's channel
/// (RDMA_CM_EVENT_CONNECT_REQUEST), or a REJ when the listener is gone or the REQ carries
/// no CMA header.
pub(crate) fn on_connect_request(p: &Port, listener: u64, c: CmId, req: &xrnic::wire::mad::Req) {
    // SAFETY: the port thread looks the id up (registered ids only) and uses it for this
    // event. It relies on the program not destroying the id meanwhile (librdmacm: an id is
    // destroyed only after its events are acked); nothing here holds rdma_destroy_id off.
    let Some(l) = (unsafe { xid(listener as *mut rdma_cm_id) }) else {
        p.with_cm(|cm, _| cm.reject(c, rej_reason::INVALID_SERVICE_ID, &[]));
        return;
    };
    let Some(h) = CmaHdr::parse(&req.private_data) else {
        p.with_cm(|cm, _| cm.reject(c, rej_reason::CONSUMER_DEFINED, &[]));
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
    store(&mut ci.route.addr.src, SocketAddr::new(h.dst, lport));
    store(&mut ci.route.addr.dst, h.src);
    ci.route.addr.ib.sgid.raw = gid_of(h.dst);
    ci.route.addr.ib.dgid.raw = gid_of(h.src.ip());
    ci.route.addr.ib.pkey = 0xffff;
    {
        let mut st = cx.st.lock().unwrap_or_else(|e| e.into_inner());
        st.port = ports_arc(p);
        st.cm = Some(c);
    }
    reg(|r| {
        r.conns
            .insert((p as *const Port as usize, c), child as usize)
    });
    let mut ev = conn_event(
        cx,
        ev::CONNECT_REQUEST,
        Some(ConnNumbers {
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            srq: u8::from(req.srq),
            qp_num: req.local_qpn,
        }),
        &req.private_data[CMA_HDR_LEN..],
    );
    ev.ev.listen_id = listener as *mut rdma_cm_id;
    push(l.c().channel, ev);
}

/// The REP of an active id: its QP to RTR and RTS and the RTU (librdmacm's
/// `ucma_process_conn_resp`), or, with no QP on the id, RDMA_CM_EVENT_CONNECT_RESPONSE.
pub(crate) fn on_connect_response(p: &Port, c: CmId, rep: &xrnic::wire::mad::Rep) {
    // SAFETY: the port thread looks the id up (registered ids only) and uses it for this
    // event. It relies on the program not destroying the id meanwhile (librdmacm: an id is
    // destroyed only after its events are acked); nothing here holds rdma_destroy_id off.
    let Some(x) = (unsafe { conn_id(p, c) }) else {
        return;
    };
    let remote = ConnNumbers {
        responder_resources: rep.responder_resources,
        initiator_depth: rep.initiator_depth,
        retry_count: 0,
        rnr_retry_count: rep.rnr_retry_count,
        srq: u8::from(rep.srq),
        qp_num: rep.local_qpn,
    };
    {
        let mut st = x.st.lock().unwrap_or_else(|e| e.into_inner());
        st.rep_private = rep.private_data.to_vec();
        st.remote = Some(remote);
    }
    if x.c().qp.is_null() {
        // No QP on the id: the program moves its own and calls rdma_establish.
        push(
            x.c().channel,
            conn_event(x, ev::CONNECT_RESPONSE, Some(remote), &rep.private_data),
        );
        return;
    }
    match move_qp(x, 2).and_then(|()| move_qp(x, 3)) {
        Ok(()) => {
            p.with_cm(|cm, _| cm.rtu(c));
        }
        Err(e) => {
            // librdmacm: a QP that cannot move rejects the REP.
            p.with_cm(|cm, _| cm.reject(c, rej_reason::CONSUMER_DEFINED, &[]));
            push(x.c().channel, event(x, ev::CONNECT_ERROR, -e));
        }
    }
}

/// RDMA_CM_EVENT_ESTABLISHED, with the numbers and private data of the REP.
pub(crate) fn on_established(p: &Port, c: CmId) {
    // SAFETY: the port thread looks the id up (registered ids only) and uses it for this
    // event. It relies on the program not destroying the id meanwhile (librdmacm: an id is
    // destroyed only after its events are acked); nothing here holds rdma_destroy_id off.
    let Some(x) = (unsafe { conn_id(p, c) }) else {
        return;
    };
    let (remote, private) = {
        let mut st = x.st.lock().unwrap_or_else(|e| e.into_inner());
        if std::mem::take(&mut st.established_by_call) {
            return;
        }
        (st.remote, st.rep_private.clone())
    };
    push(
        x.c().channel,
        conn_event(x, ev::ESTABLISHED, remote, &private),
    );
}

/// A REJ (RDMA_CM_EVENT_REJECTED, its reason as the status), or a refused SIDR_REQ.
pub(crate) fn on_rejected(p: &Port, c: CmId, reason: u16, private_data: &[u8]) {
    // SAFETY: the port thread looks the id up (registered ids only) and uses it for this
    // event. It relies on the program not destroying the id meanwhile (librdmacm: an id is
    // destroyed only after its events are acked); nothing here holds rdma_destroy_id off.
    let Some(x) = (unsafe { conn_id(p, c) }) else {
        return;
    };
    if ud::is_ud(x) {
        // A SIDR_REP with a status other than OK.
        ud::on_refused(p, c, reason);
        return;
    }
    let mut e = conn_event(x, ev::REJECTED, Some(Default::default()), private_data);
    e.ev.status = c_int::from(reason);
    push(x.c().channel, e);
}

/// An event with no connection data (`kind`, `status`) on the id of connection `c`.
pub(crate) fn notify(p: &Port, c: CmId, kind: c_int, status: c_int) {
    // SAFETY: the port thread looks the id up (registered ids only) and uses it for this
    // event. It relies on the program not destroying the id meanwhile (librdmacm: an id is
    // destroyed only after its events are acked); nothing here holds rdma_destroy_id off.
    let Some(x) = (unsafe { conn_id(p, c) }) else {
        return;
    };
    push(x.c().channel, event(x, kind, status));
}

/// The connection's time-wait is over: the id leaves it (RDMA_CM_EVENT_TIMEWAIT_EXIT).
pub(crate) fn on_timewait_exit(p: &Port, c: CmId) {
    // SAFETY: as in `notify`.
    let Some(x) = (unsafe { conn_id(p, c) }) else {
        return;
    };
    reg(|r| r.conns.remove(&(p as *const Port as usize, c)));
    x.st.lock().unwrap_or_else(|e| e.into_inner()).cm = None;
    push(x.c().channel, event(x, ev::TIMEWAIT_EXIT, 0));
}

pub(crate) fn ports_arc(p: &Port) -> Option<Arc<Port>> {
    crate::rdmacm_port::ports()
        .into_iter()
        .find(|q| core::ptr::eq(Arc::as_ptr(q), p))
}

pub extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        unsafe { xid(id) }
            .and_then(|x| sockaddr(&x.c().route.addr.src as *const _ as *const libc::sockaddr))
            .map_or(0, |a| a.port().to_be())
    })
}

pub extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        unsafe { xid(id) }
            .and_then(|x| sockaddr(&x.c().route.addr.dst as *const _ as *const libc::sockaddr))
            .map_or(0, |a| a.port().to_be())
    })
}

pub extern "C" fn rdma_migrate_id(id: *mut rdma_cm_id, ch: *mut rdma_event_channel) -> c_int {
    guard(-1, || {
        // SAFETY: the program does not destroy the id `id` while this call uses it.
        let Some(x) = (unsafe { xid(id) }) else {
            return err(libc::EINVAL, -1);
        };
        // SAFETY: the program does not destroy the event channel `ch` while this call uses it.
        if unsafe { xchan(ch) }.is_none() {
            return err(libc::EINVAL, -1);
        }
        // SAFETY: no other reference to the rdma_cm_id of `x` is live while this one is used.
        unsafe { &mut *x.id_ptr() }.channel = ch;
        0
    })
}

pub use sync::{rdma_create_ep, rdma_destroy_ep, rdma_get_request};

/// A passive id for a request to listener `l`: on `l`'s channel, or, for a sync
/// listener, sync on a channel of its own (librdmacm `ucma_process_conn_req`).
pub(crate) fn new_child(l: &XId) -> *mut XId {
    if !sync::is_sync(l) {
        return new_id(l.c().channel, l.c().context, l.c().ps);
    }
    let ch = sync::own_channel();
    let child = new_id(ch, l.c().context, l.c().ps);
    // SAFETY: just made and registered.
    unsafe { &*child }
        .st
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .sync = true;
    child
}

/// `RDMA_OPTION_ID` and its `RDMA_OPTION_ID_ACK_TIMEOUT` (rdma/rdma_cma.h).
const OPTION_ID: c_int = 0;
const OPTION_ID_ACK_TIMEOUT: c_int = 3;

pub extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    // SAFETY: the program does not destroy the id `id` while this call uses it.
    let Some(x) = (unsafe { xid(id) }) else {
        return err(libc::EINVAL, -1);
    };
    if optval.is_null() {
        return err(libc::EINVAL, -1);
    }
    if level == OPTION_ID && optname == OPTION_ID_ACK_TIMEOUT {
        // The kernel's ucma_set_option_id / rdma_set_ack_timeout: one byte, RC ids only;
        // rdma_init_qp_attr's RTS attributes then carry it. (2: IBV_QPT_RC.)
        if optlen != 1 || x.c().qp_type != 2 {
            return err(libc::EINVAL, -1);
        }
        // SAFETY: not NULL and one byte long (checked above): the caller's value.
        let t = unsafe { *(optval as *const u8) };
        x.st.lock().unwrap_or_else(|e| e.into_inner()).ack_timeout = Some(t);
        return 0;
    }
    // TOS, REUSEADDR, AFONLY: accepted and not applied (a log-free no-op would be a
    // silent fallback, so say it once).
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!("xrnic: rdma_set_option: TOS, REUSEADDR and AFONLY are accepted and ignored")
    });
    0
}

pub extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    // SAFETY: the program does not destroy the id `id` while this call uses it.
    if unsafe { xid(id) }.is_none() {
        return err(libc::EINVAL, -1);
    }
    0
}

pub extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard(core::ptr::null_mut(), || {
        let ctxs: Vec<*mut ibv_context> = crate::device::netdevs()
            .iter()
            .filter_map(|n| cm_port(n).ok())
            .map(|p| p.ctx)
            .collect();
        if !num.is_null() {
            // SAFETY: caller's out-parameter.
            unsafe { *num = ctxs.len() as c_int };
        }
        let mut v = ctxs;
        v.push(core::ptr::null_mut());
        Box::into_raw(v.into_boxed_slice()) as *mut *mut ibv_context
    })
}

pub extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    guard((), || {
        if list.is_null() {
            return;
        }
        let mut n = 0;
        // SAFETY: a NULL-terminated list from rdma_get_devices.
        while !unsafe { *list.add(n) }.is_null() {
            n += 1;
        }
        // SAFETY: the boxed slice rdma_get_devices leaked, n + 1 entries.
        drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(list, n + 1)) });
    })
}
