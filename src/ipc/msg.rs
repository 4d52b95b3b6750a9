//! The control messages: a client's requests ([`Req`]) and the service's answers
//! ([`Resp`]), JSON datagrams on the SOCK_SEQPACKET socket.

use serde::{Deserialize, Serialize};

use super::res::ResDoc;
use crate::proto::{Access, AddressVector, AttrMask, Mtu, QpAttr, QpState};
use crate::wire::{Psn, Qpn};

/// The largest control message (a `res` answer of a busy device fits).
pub const MAX_MSG: usize = 1 << 20;

/// A client's (or `xrnic down`'s, `xrnic res`'s) request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Req {
    /// First message of a verbs client: answered with [`Resp::Hello`] and four
    /// descriptors: the submission ring's memfd, the write end of the doorbell pipe, and
    /// the read ends of the completion notifier and the event notifier (pipes the service
    /// writes when completions, or asynchronous events for [`Req::AsyncEvents`], are
    /// there: src/io/shm.rs, "Wakeups").
    Hello {
        comm: String,
    },
    AllocPd,
    DeallocPd {
        pd: u32,
    },
    /// Register `len` bytes at `addr` of the client's memory at I/O address `iova`.
    RegMr {
        pd: u32,
        addr: u64,
        len: u64,
        iova: u64,
        access: u32,
    },
    DeregMr {
        lkey: u32,
    },
    /// Answered with the ring's memfd and the read end of the CQ's event pipe.
    CreateCq {
        cqe: u32,
    },
    DestroyCq {
        cq: u32,
    },
    CreateQp {
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        max_send_wr: u32,
        max_recv_wr: u32,
        sq_sig_all: bool,
        /// [`QPT_RC`], [`QPT_UC`] or [`QPT_UD`] (absent: RC, what older clients send).
        #[serde(default)]
        qp_type: u8,
        /// The client's SRQ the QP takes its receive WQEs from.
        #[serde(default)]
        srq: Option<u32>,
    },
    ModifyQp {
        qpn: u32,
        attr: QpAttrMsg,
        mask: u32,
    },
    QueryQp {
        qpn: u32,
    },
    DestroyQp {
        qpn: u32,
    },
    /// An address handle on the client's PD: the service resolves the MAC and the hop
    /// limit as the in-process device does (`Pd::create_ah`); answered with [`Resp::Ah`].
    CreateAh {
        pd: u32,
        av: AvMsg,
    },
    DestroyAh {
        ah: u32,
    },
    /// `ibv_attach_mcast` of the client's UD QP: the service's device joins the group
    /// in the kernel as for an in-process QP.
    AttachMcast {
        qpn: u32,
        gid: [u8; 16],
        lid: u16,
    },
    DetachMcast {
        qpn: u32,
        gid: [u8; 16],
        lid: u16,
    },
    /// The groups the client's QP is attached to: answered with [`Resp::Groups`].
    McastGroups {
        qpn: u32,
    },
    /// Answered with [`Resp::Srq`].
    CreateSrq {
        pd: u32,
        attr: SrqAttrMsg,
    },
    ModifySrq {
        srq: u32,
        attr: SrqAttrMsg,
        mask: u32,
    },
    /// Answered with [`Resp::SrqAttr`].
    QuerySrq {
        srq: u32,
    },
    DestroySrq {
        srq: u32,
    },
    /// The asynchronous events queued for this client since the last ask: the
    /// unaffiliated ones and those of its own objects (answered with
    /// [`Resp::AsyncEvents`]).
    AsyncEvents,
    /// Use the device's GSI QP through the service's relay (src/service/gsi.rs):
    /// answered with [`Resp::GsiOpened`] and the read end of a pipe the service writes when MADs
    /// for the client wait ([`Req::GsiRecv`]).
    GsiOpen,
    /// Receive the REQs and SIDR_REQs for `service_id` (EADDRINUSE when anyone does).
    GsiListen {
        service_id: u64,
    },
    GsiUnlisten {
        service_id: u64,
    },
    /// Send a CM MAD from QP1 to the port of GID `to` (only a MAD naming the client's
    /// own comm IDs).
    GsiSend {
        to: [u8; 16],
        mad: Vec<u8>,
    },
    /// The MADs waiting for the client, oldest first: [`Resp::GsiMads`].
    GsiRecv,
    /// The resources the asker may see (`xrnic res`, `xrnic stat`): every client's
    /// to root or CAP_NET_ADMIN, its own uid's to anyone else (src/service/res.rs), in
    /// one answer (which may be too large for one message: [`Req::ResPage`]).
    Res,
    /// The same, one page: the [`RES_PAGE`] entries after the first `skip` ones
    /// (answered with [`Resp::ResPage`]).
    ResPage {
        skip: u64,
    },
    /// Stop the service (`xrnic down`): root or the service's own user only.
    Shutdown,
}

/// The service's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Resp {
    Hello {
        service_pid: u32,
        active_mtu: u32,
        max_mtu: u32,
        sq_slots: u32,
    },
    Pd {
        pd: u32,
    },
    Mr {
        lkey: u32,
        rkey: u32,
    },
    Cq {
        cq: u32,
        slots: u32,
    },
    Qp {
        qpn: u32,
    },
    QpAttr {
        attr: QpAttrMsg,
    },
    /// The client's handle of the new AH and its address vector as resolved.
    Ah {
        ah: u32,
        av: AvMsg,
    },
    /// The client's handle of the new SRQ (what its SRQ_LIMIT_REACHED events name) and
    /// its sizes as made.
    Srq {
        srq: u32,
        attr: SrqAttrMsg,
    },
    /// An SRQ's attributes and the receive WQEs it holds now.
    Groups {
        gids: Vec<[u8; 16]>,
    },
    SrqAttr {
        attr: SrqAttrMsg,
        #[serde(default)]
        len: u32,
    },
    Res(ResDoc),
    /// One page of [`Req::ResPage`]: `next` is the `skip` of the next page, `None` on the
    /// last one. Pages are built afresh for each ask (as a netlink dump): an object made
    /// or destroyed between two asks may be seen twice or not at all.
    ResPage {
        doc: ResDoc,
        next: Option<u64>,
    },
    /// The client's comm-ID range (`CmConfig::comm_ids`).
    GsiOpened {
        comm_base: u32,
        comm_span: u32,
    },
    GsiMads {
        mads: Vec<GsiMad>,
    },
    /// The events of [`Req::AsyncEvents`], oldest first, as `enum ibv_event_type`
    /// values ([`encode_event`]), and beside each its element: the port (1) of a port
    /// event, 0 for DEVICE_FATAL, the QPN of a QP's event, the client's own handle of
    /// its CQ for CQ_ERR ([`decode_event`]).
    AsyncEvents {
        events: Vec<u32>,
        #[serde(default)]
        elements: Vec<u32>,
    },
    Ok,
    /// The verb failed: an errno and the message.
    Err {
        errno: i32,
        msg: String,
    },
}

/// `Req::CreateQp`'s QP types.
pub const QPT_RC: u8 = 0;
pub const QPT_UC: u8 = 1;
pub const QPT_UD: u8 = 2;

/// The wire value of a QP type.
pub fn qp_type_code(t: crate::proto::QpType) -> u8 {
    use crate::proto::QpType as T;
    match t {
        T::Rc => QPT_RC,
        T::Uc => QPT_UC,
        T::Ud => QPT_UD,
    }
}

/// The QP type of a wire value (untrusted: `None` for anything else).
pub fn qp_type_of(v: u8) -> Option<crate::proto::QpType> {
    use crate::proto::QpType as T;
    match v {
        QPT_RC => Some(T::Rc),
        QPT_UC => Some(T::Uc),
        QPT_UD => Some(T::Ud),
        _ => None,
    }
}

/// [`AddressVector`] as plain numbers (an address handle's attributes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AvMsg {
    pub dmac: [u8; 6],
    pub dgid: [u8; 16],
    pub sgid_index: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub flow_label: u32,
    pub vlan_tci: Option<u16>,
}

impl AvMsg {
    pub fn from_av(a: &AddressVector) -> AvMsg {
        AvMsg {
            dmac: a.dmac,
            dgid: a.dgid,
            sgid_index: a.sgid_index,
            traffic_class: a.traffic_class,
            hop_limit: a.hop_limit,
            flow_label: a.flow_label,
            vlan_tci: a.vlan_tci,
        }
    }

    pub fn to_av(&self) -> AddressVector {
        AddressVector {
            dmac: self.dmac,
            dgid: self.dgid,
            sgid_index: self.sgid_index,
            traffic_class: self.traffic_class,
            hop_limit: self.hop_limit,
            flow_label: self.flow_label,
            vlan_tci: self.vlan_tci,
        }
    }
}

/// [`crate::proto::SrqAttr`] on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrqAttrMsg {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

impl SrqAttrMsg {
    pub fn from_attr(a: &crate::proto::SrqAttr) -> SrqAttrMsg {
        SrqAttrMsg {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        }
    }

    pub fn to_attr(self) -> crate::proto::SrqAttr {
        crate::proto::SrqAttr {
            max_wr: self.max_wr,
            max_sge: self.max_sge,
            srq_limit: self.srq_limit,
        }
    }
}
/// A CM MAD the service's GSI QP received: the sender's and the receiving GID (from
/// the GRH) and the 256 bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GsiMad {
    pub from: [u8; 16],
    pub to: [u8; 16],
    pub mad: Vec<u8>,
}

/// Most MADs one [`Resp::GsiMads`] carries (the answer fits the client's buffer).
pub const GSI_MADS_PER_ANSWER: usize = 32;

/// [`QpAttr`] as plain numbers (the engine's types carry no serde).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpAttrMsg {
    pub qp_state: u8,
    pub cur_qp_state: u8,
    pub path_mtu: u32,
    pub access: u32,
    pub pkey_index: u16,
    pub port_num: u8,
    pub dmac: [u8; 6],
    pub dgid: [u8; 16],
    pub sgid_index: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub flow_label: u32,
    pub vlan_tci: Option<u16>,
    pub dest_qp_num: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub sq_draining: bool,
    pub qkey: u32,
}

fn state_code(s: QpState) -> u8 {
    QpState::ALL.iter().position(|&x| x == s).unwrap_or(0) as u8
}

impl QpAttrMsg {
    pub fn from_attr(a: &QpAttr) -> QpAttrMsg {
        QpAttrMsg {
            qp_state: state_code(a.qp_state),
            cur_qp_state: state_code(a.cur_qp_state),
            path_mtu: a.path_mtu.bytes(),
            access: a.qp_access_flags.0,
            pkey_index: a.pkey_index,
            port_num: a.port_num,
            dmac: a.ah_attr.dmac,
            dgid: a.ah_attr.dgid,
            sgid_index: a.ah_attr.sgid_index,
            traffic_class: a.ah_attr.traffic_class,
            hop_limit: a.ah_attr.hop_limit,
            flow_label: a.ah_attr.flow_label,
            vlan_tci: a.ah_attr.vlan_tci,
            dest_qp_num: a.dest_qp_num.value(),
            rq_psn: a.rq_psn.value(),
            sq_psn: a.sq_psn.value(),
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            min_rnr_timer: a.min_rnr_timer,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            sq_draining: a.sq_draining,
            qkey: a.qkey,
        }
    }

    /// Back to the engine's type; `None` for a value no QpAttr has (the engine checks
    /// the rest as for any caller).
    pub fn to_attr(&self) -> Option<QpAttr> {
        Some(QpAttr {
            qp_state: *QpState::ALL.get(usize::from(self.qp_state))?,
            cur_qp_state: *QpState::ALL.get(usize::from(self.cur_qp_state))?,
            path_mtu: Mtu::from_bytes(self.path_mtu)?,
            qp_access_flags: Access(self.access),
            pkey_index: self.pkey_index,
            port_num: self.port_num,
            ah_attr: AddressVector {
                dmac: self.dmac,
                dgid: self.dgid,
                sgid_index: self.sgid_index,
                traffic_class: self.traffic_class,
                hop_limit: self.hop_limit,
                flow_label: self.flow_label,
                vlan_tci: self.vlan_tci,
            },
            dest_qp_num: Qpn::new(self.dest_qp_num),
            rq_psn: Psn::new(self.rq_psn),
            sq_psn: Psn::new(self.sq_psn),
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            min_rnr_timer: self.min_rnr_timer,
            max_rd_atomic: self.max_rd_atomic,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            sq_draining: self.sq_draining,
            qkey: self.qkey,
        })
    }
}

/// The mask as the engine's type.
pub fn mask(m: u32) -> AttrMask {
    AttrMask(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_attributes_round_trip_and_an_unknown_mtu_is_refused() {
        let a = QpAttr::default();
        assert_eq!(QpAttrMsg::from_attr(&a).to_attr(), Some(a));
        let m = QpAttrMsg {
            path_mtu: 1000,
            ..QpAttrMsg::from_attr(&a)
        };
        assert_eq!(m.to_attr(), None);
    }
}
