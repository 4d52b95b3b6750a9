//! The control messages: a client's requests ([`Req`]) and the service's answers
//! ([`Resp`]), JSON datagrams on the SOCK_SEQPACKET socket.

use serde::{Deserialize, Serialize};

use super::res::ResDoc;
use crate::proto::{AddressVector, AttrMask, QpAttr, QpType, SrqAttr, SrqAttrMask};

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
    /// `ibv_resize_cq`: the CQ holds `cqe` completions from now on.
    ResizeCq {
        cq: u32,
        cqe: u32,
    },
    CreateQp {
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        max_send_wr: u32,
        max_recv_wr: u32,
        sq_sig_all: bool,
        /// RC, UC or UD (absent: RC, what older clients send).
        #[serde(default)]
        qp_type: QpType,
        /// The client's SRQ the QP takes its receive WQEs from.
        #[serde(default)]
        srq: Option<u32>,
    },
    /// The engine's attributes and mask as they are: the service checks them as for
    /// any caller (`Qp::modify`), and a value no `QpAttr` has (a state, an MTU) fails to
    /// decode.
    ModifyQp {
        qpn: u32,
        attr: QpAttr,
        mask: AttrMask,
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
        av: AddressVector,
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
        attr: SrqAttr,
    },
    ModifySrq {
        srq: u32,
        attr: SrqAttr,
        mask: SrqAttrMask,
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
    /// The same, one page: the [`RES_PAGE`](crate::ipc::RES_PAGE) entries after the first `skip` ones
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
        attr: QpAttr,
    },
    /// The client's handle of the new AH and its address vector as resolved.
    Ah {
        ah: u32,
        av: AddressVector,
    },
    /// The client's handle of the new SRQ (what its SRQ_LIMIT_REACHED events name) and
    /// its sizes as made.
    Srq {
        srq: u32,
        attr: SrqAttr,
    },
    /// An SRQ's attributes and the receive WQEs it holds now.
    Groups {
        gids: Vec<[u8; 16]>,
    },
    SrqAttr {
        attr: SrqAttr,
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
    /// values ([`encode_event`](crate::ipc::encode_event)), and beside each its element: the port (1) of a port
    /// event, 0 for DEVICE_FATAL, the QPN of a QP's event, the client's own handle of
    /// its CQ for CQ_ERR ([`decode_event`](crate::ipc::decode_event)).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Access, Mtu, QpState};
    use crate::wire::{Psn, Qpn};

    /// The engine's types go as they are and come back the same; a value none of them
    /// has (an MTU of 1000 bytes, a state past ERR) fails to decode, and a QPN or PSN
    /// past 24 bits keeps its low 24 (as `Qpn::new`, `Psn::new`).
    #[test]
    fn messages_carry_the_engines_types_and_refuse_what_they_cannot_hold() {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: Mtu::Mtu4096,
            qp_access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ,
            dest_qp_num: Qpn::new(0x12_3456),
            rq_psn: Psn::new(0xab_cdef),
            ah_attr: AddressVector {
                dgid: [7; 16],
                flow_label: 0x1_2345,
                vlan_tci: Some(5),
                ..AddressVector::default()
            },
            qkey: 0x1111,
            ..QpAttr::default()
        };
        let req = Req::ModifyQp {
            qpn: 9,
            attr,
            mask: AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU,
        };
        let text = serde_json::to_string(&req).unwrap();
        let Ok(Req::ModifyQp {
            qpn,
            attr: got,
            mask,
        }) = serde_json::from_str(&text)
        else {
            panic!("{text}");
        };
        assert_eq!(
            (qpn, got, mask),
            (9, attr, AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU)
        );

        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let a = &mut v["ModifyQp"]["attr"];
        a["path_mtu"] = "Mtu1000".into();
        assert!(
            serde_json::from_value::<Req>(v.clone()).is_err(),
            "an MTU no QpAttr has"
        );
        v["ModifyQp"]["attr"]["path_mtu"] = "Mtu1024".into();
        v["ModifyQp"]["attr"]["qp_state"] = "SQE2".into();
        assert!(
            serde_json::from_value::<Req>(v.clone()).is_err(),
            "a state past ERR"
        );
        v["ModifyQp"]["attr"]["qp_state"] = "RTS".into();
        v["ModifyQp"]["attr"]["dest_qp_num"] = 0xff12_3456u32.into();
        let Ok(Req::ModifyQp { attr: got, .. }) = serde_json::from_value::<Req>(v) else {
            panic!("a 32-bit QPN");
        };
        assert_eq!(
            (got.qp_state, got.dest_qp_num),
            (QpState::Rts, Qpn::new(0x12_3456))
        );

        // A CreateQp without its type (an older client's) is RC; the types by name.
        let old = r#"{"CreateQp":{"pd":1,"send_cq":2,"recv_cq":2,"max_send_wr":4,"max_recv_wr":4,"sq_sig_all":false}}"#;
        let Ok(Req::CreateQp { qp_type, srq, .. }) = serde_json::from_str::<Req>(old) else {
            panic!("{old}");
        };
        assert_eq!((qp_type, srq), (QpType::Rc, None));
        let ud = old.replace("false}", r#"false,"qp_type":"Ud"}"#);
        assert!(matches!(
            serde_json::from_str::<Req>(&ud),
            Ok(Req::CreateQp {
                qp_type: QpType::Ud,
                ..
            })
        ));
        assert!(
            serde_json::from_str::<Req>(&old.replace("false}", r#"false,"qp_type":3}"#)).is_err()
        );

        let srq = Resp::SrqAttr {
            attr: SrqAttr {
                max_wr: 64,
                max_sge: 2,
                srq_limit: 8,
            },
            len: 3,
        };
        let back: Resp = serde_json::from_str(&serde_json::to_string(&srq).unwrap()).unwrap();
        assert!(
            matches!(back, Resp::SrqAttr { attr, len: 3 } if attr.max_wr == 64 && attr.srq_limit == 8)
        );
    }
}
