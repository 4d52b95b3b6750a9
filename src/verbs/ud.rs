//! UD queue pairs in the Rust API: address handles ([`Ah`], `ibv_create_ah`), UD and GSI
//! QP creation, the UD send (`ibv_post_send` with `wr.ud`), the P_Key table.
//!
//! Contract: [`Pd::create_ah`] resolves an all-zero `dmac` and the hop limit exactly as
//! [`Qp::modify`] does for a connected QP's address vector (ib_core runs
//! `ib_resolve_eth_dmac` for address handles too); [`Pd::create_ud_qp`] creates a UD QP
//! in RESET, [`Qp::ud_ready`] takes it to RTS (ibv_ud_pingpong's `pp_init_ctx` /
//! `pp_connect_ctx` masks); [`Qp::post_send_ud`] sends one datagram. Receives use
//! [`Qp::post_recv`]: the buffer gets the 40-byte GRH first (`crate::proto::GRH_LEN`).
//! Software backend, in this process or through the device service (whose own device
//! makes the AH, resolving it there, src/service/objects.rs); on the offload backend
//! these return `Error::Unsupported`. The GSI QP is the in-process device's only.
//! An address handle to a multicast GID takes the group's MAC, derived, not resolved
//! (ib_core `ib_resolve_eth_dmac`); attaching QPs to groups is src/verbs/mcast.rs.

use std::sync::Arc;

use super::qp::QpKind;
use super::{
    AddressVector, AttrMask, Backend, CqKind, Device, Error, PdKind, Psn, QpAttr, QpInitAttr,
    QpState, Qpn, Result, SendWr, gid_is_ipv4,
};
use super::{Pd, Qp, remote};
use crate::proto::{self, UdCounters, UdDest};

/// An address handle (`struct ibv_ah`): where UD sends go, with the MAC resolved.
/// Through the device service, also the service's AH (freed with the last clone).
#[derive(Clone, Debug)]
pub struct Ah {
    av: AddressVector,
    svc: Option<Arc<remote::RemoteAh>>,
}

impl PartialEq for Ah {
    fn eq(&self, o: &Ah) -> bool {
        self.av == o.av
            && match (&self.svc, &o.svc) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

impl Eq for Ah {}

impl Ah {
    /// The resolved address vector.
    pub fn attr(&self) -> &AddressVector {
        &self.av
    }
}

fn unsupported(what: &'static str) -> Error {
    Error::Unsupported {
        what,
        backend: Backend::Offload,
    }
}

impl Pd {
    /// `ibv_create_ah`: checks the source GID's family against the destination's and
    /// resolves the next hop's MAC (when `dmac` is all zero) and the route's hop limit.
    pub fn create_ah(&self, av: &AddressVector) -> Result<Ah> {
        self.create_ah_on(av, None)
    }

    /// [`Pd::create_ah`] with the path resolved already (the next hop's MAC and the hop
    /// limit): nothing is looked up, whatever `dmac` `av` carries (a multicast GID still
    /// takes its group's MAC). The device service uses it (src/service/resolver.rs).
    pub fn create_ah_resolved(&self, av: &AddressVector, path: ([u8; 6], u8)) -> Result<Ah> {
        self.create_ah_on(av, Some(path))
    }

    fn create_ah_on(&self, av: &AddressVector, path: Option<([u8; 6], u8)>) -> Result<Ah> {
        let dev = &self.dev;
        if dev.is_fatal() {
            return Err(proto::VerbsError::DeviceFatal.into());
        }
        let mut av = *av;
        let Some(sgid) = dev.query_gid(usize::from(av.sgid_index)) else {
            return Err(proto::VerbsError::InvalidValue("sgid_index beyond the GID table").into());
        };
        if gid_is_ipv4(&sgid) != gid_is_ipv4(&av.dgid) {
            return Err(Error::GidFamilyMismatch {
                sgid_index: av.sgid_index,
            });
        }
        match &self.kind {
            PdKind::Soft(_) => {}
            // The service's device resolves it, as below.
            PdKind::Svc(pd) => {
                let (h, av) = remote::RemoteAh::create(pd, &av)?;
                return Ok(Ah {
                    av,
                    svc: Some(Arc::new(h)),
                });
            }
            PdKind::Verbs(_) => return Err(unsupported("UD address handles")),
        }
        // A group: its MAC, derived from the GID; the hop limit as given (ib_core
        // `ib_resolve_eth_dmac` resolves no neighbour and keeps `grh.hop_limit`; 0 goes
        // out as 64, `framing::av_addrs`).
        if let Some(mac) = crate::wire::multicast_mac(&av.dgid) {
            av.dmac = mac;
            return Ok(Ah { av, svc: None });
        }
        // As `Qp::modify` does for RC (ib_core `ib_resolve_eth_dmac`).
        av.hop_limit = if let Some((dmac, hop_limit)) = path {
            av.dmac = dmac;
            hop_limit
        } else if av.dmac == [0; 6] {
            let (dmac, hop_limit) = dev.resolve_path(Some(&sgid), &av.dgid)?;
            av.dmac = dmac;
            hop_limit
        } else {
            dev.route_hop_limit(&av.dgid)
        };
        Ok(Ah { av, svc: None })
    }

    /// `ibv_create_qp` with `IBV_QPT_UD`.
    pub fn create_ud_qp(&self, init: &QpInitAttr<'_>) -> Result<Qp> {
        self.create_datagram_qp(init, false)
    }

    /// The GSI QP, QP1 (IBTA §13.5.1): UD, Q_Key 0x80010000. One per device.
    pub fn create_gsi_qp(&self, init: &QpInitAttr<'_>) -> Result<Qp> {
        self.create_datagram_qp(init, true)
    }

    fn create_datagram_qp(&self, init: &QpInitAttr<'_>, gsi: bool) -> Result<Qp> {
        if let (PdKind::Svc(pd), CqKind::Svc(scq), CqKind::Svc(rcq)) =
            (&self.kind, &init.send_cq.kind, &init.recv_cq.kind)
        {
            if gsi {
                // QP1 is the device's own (one per device): the service's, not a client's.
                return Err(Error::Unsupported {
                    what: "the GSI QP through the device service",
                    backend: Backend::Software,
                });
            }
            return remote::create_qp(&self.dev, pd, [scq, rcq], init, proto::QpType::Ud, None);
        }
        let (PdKind::Soft(pd), CqKind::Soft(scq), CqKind::Soft(rcq)) =
            (&self.kind, &init.send_cq.kind, &init.recv_cq.kind)
        else {
            return Err(unsupported("UD QPs"));
        };
        if !Arc::ptr_eq(&pd.shared, &scq.shared) || !Arc::ptr_eq(&pd.shared, &rcq.shared) {
            return Err(Error::DeviceMismatch);
        }
        let attr = proto::QpInitAttr {
            send_cq: scq.cq,
            recv_cq: rcq.cq,
            max_send_wr: init.max_send_wr,
            max_recv_wr: init.max_recv_wr,
            sq_sig_all: init.sq_sig_all,
            qp_type: proto::QpType::Ud,
            srq: None,
        };
        let qpn = {
            let mut g = pd.shared.lock();
            let q = if gsi {
                g.rnic.create_gsi_qp(pd.pd, &attr)?
            } else {
                g.rnic.create_qp(pd.pd, &attr)?
            };
            g.qps.insert(q, ());
            q
        };
        Ok(Qp {
            qpn,
            dev: self.dev.clone(),
            kind: QpKind::Soft {
                pd: pd.clone(),
                _cqs: [scq.clone(), rcq.clone()],
                _srq: None,
            },
        })
    }
}

impl Qp {
    /// RESET → INIT (P_Key index 0, port 1, `qkey`) → RTR → RTS (`sq_psn`), the masks
    /// ibv_ud_pingpong uses. The GSI QP keeps its Q_Key whatever `qkey` says.
    pub fn ud_ready(&self, qkey: u32, sq_psn: u32) -> Result<()> {
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        if self.query()?.qp_state == QpState::Reset {
            self.modify(
                &a,
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
            )?;
        }
        a.qp_state = QpState::Rtr;
        self.modify(&a, AttrMask::STATE)?;
        a.qp_state = QpState::Rts;
        a.sq_psn = Psn::new(sq_psn);
        self.modify(&a, AttrMask::STATE | AttrMask::SQ_PSN)
    }

    /// `ibv_post_send` on a UD QP: one SEND (with immediate when `wr.opcode` says so) to
    /// QP `remote_qpn` at `ah`, with `remote_qkey` (high bit set: the QP's own Q_Key).
    pub fn post_send_ud(
        &self,
        wr: SendWr,
        ah: &Ah,
        remote_qpn: Qpn,
        remote_qkey: u32,
    ) -> Result<()> {
        let pd = match &self.kind {
            QpKind::Soft { pd, .. } => pd,
            QpKind::Svc(qp) => {
                let Some(h) = &ah.svc else {
                    return Err(Error::DeviceMismatch);
                };
                return remote::post_send_ud(qp, &wr, h, remote_qpn, remote_qkey);
            }
            QpKind::Verbs(_) => return Err(unsupported("UD sends")),
        };
        if ah.svc.is_some() {
            return Err(Error::DeviceMismatch);
        }
        let dest = UdDest {
            av: ah.av,
            remote_qpn,
            remote_qkey,
        };
        pd.shared.lock().rnic.post_send_ud(self.qpn, wr, &dest)?;
        pd.shared.doorbell();
        Ok(())
    }

    /// The datagram counters of a UD QP (sent, received, Q_Key and no-WQE drops).
    pub fn ud_counters(&self) -> Result<UdCounters> {
        let QpKind::Soft { pd, .. } = &self.kind else {
            return Err(unsupported("UD counters"));
        };
        pd.shared
            .lock()
            .rnic
            .ud_counters(self.qpn)
            .ok_or_else(|| proto::VerbsError::NotFound("QP").into())
    }
}

impl Device {
    /// `ibv_query_pkey`: the P_Key at `index` (index 0: 0xFFFF).
    pub fn query_pkey(&self, index: u16) -> Option<u16> {
        (index == 0).then_some(crate::wire::PKey::DEFAULT.0)
    }
}
