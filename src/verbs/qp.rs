//! RC queue pairs (`struct ibv_qp`): creation attributes, what [`Qp::connect`] takes from
//! the other end, and the QP's verbs (`modify`, `query`, `post_send`, `post_recv`,
//! counters), on either backend.

use std::sync::Arc;

use super::{
    Access, AddressVector, AttrMask, Backend, Cq, CqInner, Device, Error, Gid, Mtu, PdInner, Psn,
    QpAttr, QpCounters, QpRateStatus, QpState, Qpn, RecvWr, Result, SendWr, gid_is_ipv4, ibv,
};

/// Creation attributes of an RC QP (`struct ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug)]
pub struct QpInitAttr<'a> {
    pub send_cq: &'a Cq,
    pub recv_cq: &'a Cq,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub sq_sig_all: bool,
}

impl<'a> QpInitAttr<'a> {
    /// Both queues `depth` deep, only signaled sends complete.
    pub fn new(send_cq: &'a Cq, recv_cq: &'a Cq, depth: u32) -> Self {
        QpInitAttr {
            send_cq,
            recv_cq,
            max_send_wr: depth,
            max_recv_wr: depth,
            sq_sig_all: false,
        }
    }
}

/// What the other end announces (ibv_rc_pingpong's `pingpong_dest`, without the LID).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    pub qpn: Qpn,
    /// The first PSN the remote end sends (our expected receive PSN).
    pub psn: u32,
    pub gid: Gid,
}

/// Attributes [`Qp::connect`] uses besides the remote's values; the defaults are
/// ibv_rc_pingpong's (`pp_connect_ctx`).
#[derive(Clone, Copy, Debug)]
pub struct ConnectOpts {
    pub access: Access,
    pub path_mtu: Mtu,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    /// IP hop limit / TTL; rc_pingpong sets 1. Like ib_core, `modify` replaces it with
    /// the route's hop limit unless the destination GID is link-local.
    pub hop_limit: u8,
    pub traffic_class: u8,
}

impl Default for ConnectOpts {
    fn default() -> Self {
        ConnectOpts {
            access: Access::LOCAL_WRITE,
            path_mtu: Mtu::Mtu1024,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            hop_limit: 1,
            traffic_class: 0,
        }
    }
}

#[derive(Debug)]
pub(super) enum QpKind {
    Soft {
        pd: Arc<PdInner>,
        _cqs: [Arc<CqInner>; 2],
        /// The SRQ the QP takes receive WQEs from, kept alive as long as the QP.
        _srq: Option<Arc<super::srq::SrqInner>>,
    },
    Verbs(ibv::Qp),
    /// A QP of the device service (the service resolves MACs and hop limits itself).
    Svc(super::remote::RemoteQp),
}

/// An RC queue pair (`struct ibv_qp`).
#[derive(Debug)]
pub struct Qp {
    pub(super) qpn: Qpn,
    pub(super) dev: Device,
    pub(super) kind: QpKind,
}

impl Qp {
    pub fn qp_num(&self) -> Qpn {
        self.qpn
    }

    fn dev(&self) -> &Device {
        &self.dev
    }

    /// The device this QP belongs to.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// `ibv_modify_qp`. With [`AttrMask::AV`] and an all-zero `dmac`, the MAC of `dgid` is
    /// looked up (and resolved) in the kernel's neighbour table first (software backend;
    /// the kernel does it for an RDMA device).
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        self.modify_on(attr, mask, None)
    }

    /// [`Qp::modify`] with the address vector's path resolved already (the next hop's
    /// MAC and the hop limit, from [`Device::path_step`] and a resolution elsewhere):
    /// nothing is looked up, whatever `dmac` the attributes carry. The device service
    /// uses it (src/service/resolver.rs): its loop never waits on the network.
    pub fn modify_resolved(
        &self,
        attr: &QpAttr,
        mask: AttrMask,
        path: ([u8; 6], u8),
    ) -> Result<()> {
        self.modify_on(attr, mask, Some(path))
    }

    fn modify_on(&self, attr: &QpAttr, mask: AttrMask, path: Option<([u8; 6], u8)>) -> Result<()> {
        let dev = self.dev();
        let mut attr = *attr;
        if mask.contains(AttrMask::PATH_MTU) {
            let active = dev.inner.port.active_mtu;
            if attr.path_mtu.bytes() > active.bytes() {
                return Err(Error::PathMtuTooLarge {
                    requested: attr.path_mtu.bytes(),
                    active: active.bytes(),
                });
            }
        }
        if mask.contains(AttrMask::AV) {
            let av = &mut attr.ah_attr;
            if let Some(sgid) = dev.query_gid(usize::from(av.sgid_index)) {
                if gid_is_ipv4(&sgid) != gid_is_ipv4(&av.dgid) {
                    return Err(Error::GidFamilyMismatch {
                        sgid_index: av.sgid_index,
                    });
                }
            }
            if let QpKind::Soft { .. } = self.kind {
                let sgid = dev.query_gid(usize::from(av.sgid_index));
                let hop_limit = if let Some((dmac, hop_limit)) = path {
                    av.dmac = dmac;
                    hop_limit
                } else if av.dmac == [0; 6] {
                    let (dmac, hop_limit) = dev.resolve_path(sgid.as_ref(), &av.dgid)?;
                    av.dmac = dmac;
                    hop_limit
                } else {
                    dev.route_hop_limit(&av.dgid)
                };
                // ib_core's `ib_resolve_eth_dmac` (drivers/infiniband/core/verbs.c), run on
                // every RoCE modify with an address vector of a connected QP, replaces the
                // GRH hop limit with the route's (`ib_resolve_unicast_gid_dmac` →
                // `rdma_addr_find_l2_eth_by_grh`); only a link-local destination from a
                // RoCE v1 source GID keeps the caller's. Our GIDs are all RoCE v2, so
                // always. So rxe and ConnectX send TTL / hop limit 64 where
                // ibv_rc_pingpong asks for 1 and perftest for 255 (fe80:: GIDs too), and
                // so do we (seen against rxe).
                av.hop_limit = hop_limit;
            }
        }
        match &self.kind {
            QpKind::Soft { pd, .. } => {
                pd.shared.lock().rnic.modify_qp(self.qpn, &attr, mask)?;
                pd.shared.kick();
            }
            QpKind::Verbs(qp) => qp.modify(&attr, mask)?,
            QpKind::Svc(qp) => {
                qp.pd.conn.call_ok(&crate::ipc::Req::ModifyQp {
                    qpn: self.qpn.value(),
                    attr,
                    mask,
                })?;
                if mask.contains(AttrMask::STATE) {
                    *qp.state.lock().unwrap_or_else(|p| p.into_inner()) = attr.qp_state;
                }
            }
        }
        Ok(())
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<QpAttr> {
        match &self.kind {
            QpKind::Soft { pd, .. } => Ok(pd.shared.lock().rnic.query_qp(self.qpn)?),
            QpKind::Verbs(qp) => qp.query(),
            QpKind::Svc(qp) => {
                let req = crate::ipc::Req::QueryQp {
                    qpn: self.qpn.value(),
                };
                match qp.pd.conn.call(&req)?.0 {
                    crate::ipc::Resp::QpAttr { attr } => Ok(attr),
                    _ => Err(Error::Io(std::io::Error::other(
                        "device service: unexpected answer to query_qp",
                    ))),
                }
            }
        }
    }

    /// RESET → INIT → RTR → RTS towards `remote`, like ibv_rc_pingpong (`pp_init_ctx`'s
    /// INIT, then `pp_connect_ctx`): `sq_psn` is our first PSN, `sgid_index` our GID.
    pub fn connect(
        &self,
        remote: &Remote,
        sq_psn: u32,
        sgid_index: u8,
        o: &ConnectOpts,
    ) -> Result<()> {
        let mut attr = QpAttr::rc_init(o.access);
        if self.query()?.qp_state == QpState::Reset {
            self.modify(&attr, AttrMask::RC_INIT)?;
        }
        attr.qp_state = QpState::Rtr;
        attr.path_mtu = o.path_mtu;
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = Psn::new(remote.psn);
        attr.max_dest_rd_atomic = o.max_dest_rd_atomic;
        attr.min_rnr_timer = o.min_rnr_timer;
        attr.ah_attr = AddressVector {
            dmac: [0; 6],
            dgid: remote.gid,
            sgid_index,
            traffic_class: o.traffic_class,
            hop_limit: o.hop_limit,
            flow_label: 0,
            vlan_tci: None,
        };
        // A UC QP takes the UC masks (no RNR, timeout, retry or RDMA-read attributes).
        let uc = self.qp_type() == crate::proto::QpType::Uc;
        let rtr = if uc {
            crate::proto::uc::UC_RTR
        } else {
            AttrMask::RC_RTR
        };
        self.modify(&attr, rtr)?;
        attr.qp_state = QpState::Rts;
        attr.timeout = o.timeout;
        attr.retry_cnt = o.retry_cnt;
        attr.rnr_retry = o.rnr_retry;
        attr.sq_psn = Psn::new(sq_psn);
        attr.max_rd_atomic = o.max_rd_atomic;
        let rts = if uc {
            crate::proto::uc::UC_RTS
        } else {
            AttrMask::RC_RTS
        };
        self.modify(&attr, rts)
    }

    /// RC, UC or UD (the offload backend creates RC QPs only).
    pub fn qp_type(&self) -> crate::proto::QpType {
        match &self.kind {
            QpKind::Soft { pd, .. } => pd.shared.lock().rnic.qp_type(self.qpn).unwrap_or_default(),
            QpKind::Svc(qp) => qp.qp_type,
            QpKind::Verbs(_) => crate::proto::QpType::Rc,
        }
    }

    /// `ibv_post_send` (one work request). On an idle send queue of an idle device it
    /// rings the doorbell:
    /// the frames are built and transmitted on the calling thread when no other thread
    /// is using the port (the latency case: nothing else to wait for). Behind
    /// outstanding work it kicks the driver instead, which sends whole batches (a stream
    /// of small messages would otherwise cost a `sendto` each).
    pub fn post_send(&self, wr: SendWr) -> Result<()> {
        match &self.kind {
            // The post and the doorbell's step under one engine lock
            // (`Shared::post_send_ringing`).
            QpKind::Soft { pd, .. } => pd.shared.post_send_ringing(self.qpn, wr)?,
            QpKind::Verbs(qp) => qp.post_send(&wr)?,
            QpKind::Svc(qp) => {
                qp.check_send(&wr)?;
                qp.pd.conn.post_send(self.qpn, &wr)?;
            }
        }
        Ok(())
    }

    /// `ibv_post_recv` (one work request).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        match &self.kind {
            // No kick: a new receive WQE gives the driver nothing to send (a peer that got
            // an RNR NAK retries on its own timer, IBTA §9.7.5.2.8).
            QpKind::Soft { pd, .. } => pd.shared.lock().rnic.post_recv(self.qpn, wr)?,
            QpKind::Verbs(qp) => qp.post_recv(&wr)?,
            QpKind::Svc(qp) => {
                qp.check_post(false)?;
                // UD and UC drop what finds no receive: wait until it is in the engine.
                let ready = qp.qp_type != crate::proto::QpType::Rc;
                let full = qp.recv_out.load(std::sync::atomic::Ordering::Acquire) >= qp.recv_depth;
                qp.pd.conn.post_recv(self.qpn, &wr, ready, full)?;
                qp.recv_out
                    .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
        }
        Ok(())
    }

    /// This QP's current rate, target rate and α (DCQCN); `None` when congestion control
    /// is off, and on the offload backend.
    pub fn rate_status(&self) -> Option<QpRateStatus> {
        match &self.kind {
            QpKind::Soft { pd, .. } => pd.shared.lock().rnic.congestion()?.qp_status(self.qpn),
            QpKind::Verbs(_) | QpKind::Svc(_) => None,
        }
    }

    /// This QP's counters (the software engine's; [`Error::Unsupported`] on the offload
    /// backend, which has no per-QP counters: see [`Device::backend`]).
    pub fn counters(&self) -> Result<QpCounters> {
        match &self.kind {
            QpKind::Soft { pd, .. } => Ok(pd
                .shared
                .lock()
                .rnic
                .qp_counters(self.qpn)
                .unwrap_or_default()),
            QpKind::Verbs(_) => Err(Error::Unsupported {
                what: "per-QP counters",
                backend: Backend::Offload,
            }),
            QpKind::Svc(_) => Err(Error::Unsupported {
                what: "per-QP counters through the device service",
                backend: Backend::Software,
            }),
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if let QpKind::Soft { pd, .. } = &self.kind {
            // Datagrams posted and not sent yet leave first, for at most 200 ms: rxe
            // sends them inside ibv_post_send, so a program that posts unsignaled UD
            // sends and destroys the QP at once (mckey's sender) loses none there.
            let end = std::time::Instant::now() + std::time::Duration::from_millis(200);
            while pd.shared.lock().rnic.ud_pending_sends(self.qpn) > 0
                && std::time::Instant::now() < end
            {
                pd.shared.doorbell();
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            let mut g = pd.shared.lock();
            if let Err(e) = g.rnic.destroy_qp(self.qpn) {
                tracing::error!("destroy_qp {}: {e}", self.qpn.value());
            }
            g.qps.remove(&self.qpn);
            drop(g);
            // destroy_qp detached it from its groups: leave those now empty in the kernel
            // (not under the engine's lock: the sync takes the memberships' lock first).
            if !self.dev.mcast_memberships().is_empty() {
                let _ = self.dev.sync_mcast_memberships();
            }
            // ACKs this QP produced on a polling thread may still wait in the port
            // (deferred, driver/poll.rs): a program that destroys the QP and exits right
            // after its last completion must not leave the peer without them.
            pd.shared.flush_deferred();
        }
    }
}
