//! What the device service and its clients say to each other: control messages (JSON
//! datagrams on the SOCK_SEQPACKET socket) and the fixed layouts of the ring slots.
//!
//! Contract: every decoder here takes untrusted input (the service decodes what a client
//! wrote) and returns `None` / an error for anything that is not a valid value; nothing
//! panics.

use serde::{Deserialize, Serialize};

use crate::proto::{
    Access, AddressVector, AtomicInfo, AttrMask, Mtu, QpAttr, QpState, RdmaInfo, RecvWr, SendFlags,
    SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use crate::wire::{Lkey, Psn, Qpn, Rkey};

/// The largest control message (a `res` answer of a busy device fits).
pub const MAX_MSG: usize = 1 << 20;

/// Submission ring: slots of 256 bytes (32 words).
pub const SQ_SLOT_BYTES: usize = 256;
pub const SQ_WORDS: usize = SQ_SLOT_BYTES / 8;
/// Slots of a client's submission ring (every send and receive of all its QPs).
pub const SQ_SLOTS: u32 = 4096;
/// Most SGEs one work request carries through the ring.
pub const MAX_SGE: usize = 12;
/// Completion ring slots: 48 bytes.
pub const CQ_SLOT_BYTES: usize = 48;
pub const CQ_WORDS: usize = CQ_SLOT_BYTES / 8;

/// The service's socket: the abstract name `xrnic/<IF>` (abstract names belong to the
/// network namespace, so each namespace's `eth0` has its own service).
pub fn socket_name(ifname: &str) -> Vec<u8> {
    format!("xrnic/{ifname}").into_bytes()
}

/// Who listens on `@xrnic/<IF>`: the credentials the kernel recorded when that process
/// called listen(2), as SO_PEERCRED gives them on the connected socket (unix(7)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listener {
    pub pid: i32,
    pub uid: u32,
}

/// Whether a client whose effective uid is `me` may talk to a service run as `uid`:
/// root's, or its own. Any other user could have bound the abstract name first (an
/// abstract name has no owner and no permissions, unix(7)); a client that sent its
/// requests there would hand that user its buffer addresses and objects.
pub fn trusted(uid: u32, me: u32) -> bool {
    uid == 0 || uid == me
}

/// Connect to whatever listens on the service socket of `ifname`: the socket and the
/// listener's credentials, `None` when nothing listens. Sends nothing.
pub fn connect_any(ifname: &str) -> std::io::Result<Option<(std::os::fd::OwnedFd, Listener)>> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let sock = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let addr = SocketAddrUnix::new_abstract_name(&socket_name(ifname))?;
    match rustix::net::connect(&sock, &addr) {
        Ok(()) => {}
        Err(rustix::io::Errno::CONNREFUSED | rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let cred = rustix::net::sockopt::socket_peercred(&sock)?;
    let who = Listener {
        pid: cred.pid.as_raw_nonzero().get(),
        uid: cred.uid.as_raw(),
    };
    Ok(Some((sock, who)))
}

/// [`connect_any`], refusing a listener this process must not trust ([`trusted`]) before
/// anything is sent: a `PermissionDenied` error (EACCES) naming its pid and uid.
pub fn connect_service(ifname: &str) -> std::io::Result<Option<std::os::fd::OwnedFd>> {
    let Some((sock, who)) = connect_any(ifname)? else {
        return Ok(None);
    };
    let me = rustix::process::geteuid().as_raw();
    if !trusted(who.uid, me) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            impostor(ifname, who, me),
        ));
    }
    Ok(Some(sock))
}

/// What a client says of a listener it does not trust.
pub fn impostor(ifname: &str, who: Listener, me: u32) -> String {
    format!(
        "@xrnic/{ifname} is held by pid {} (uid {}), not by root or this user (uid {me}): \
         not a device service this process trusts; nothing was sent to it",
        who.pid, who.uid
    )
}

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

/// IBV_EVENT_CQ_ERR (verbs.h `enum ibv_event_type`).
pub const EV_CQ_ERR: u32 = 0;
/// IBV_EVENT_QP_FATAL.
pub const EV_QP_FATAL: u32 = 1;
/// IBV_EVENT_QP_REQ_ERR.
pub const EV_QP_REQ_ERR: u32 = 2;
/// IBV_EVENT_QP_ACCESS_ERR.
pub const EV_QP_ACCESS_ERR: u32 = 3;
/// IBV_EVENT_COMM_EST.
pub const EV_COMM_EST: u32 = 4;
/// IBV_EVENT_SQ_DRAINED.
pub const EV_SQ_DRAINED: u32 = 5;
/// IBV_EVENT_DEVICE_FATAL.
pub const EV_DEVICE_FATAL: u32 = 8;
/// IBV_EVENT_PORT_ACTIVE.
pub const EV_PORT_ACTIVE: u32 = 9;
/// IBV_EVENT_PORT_ERR.
pub const EV_PORT_ERR: u32 = 10;
/// IBV_EVENT_SRQ_LIMIT_REACHED.
pub const EV_SRQ_LIMIT_REACHED: u32 = 15;
/// IBV_EVENT_QP_LAST_WQE_REACHED.
pub const EV_QP_LAST_WQE_REACHED: u32 = 16;

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

/// The wire value of an unaffiliated event (`None`: an event of one object, which goes
/// only to the object's owner, [`encode_qp_event`] / CQ_ERR).
pub fn encode_event(e: &crate::proto::AsyncEvent) -> Option<u32> {
    use crate::proto::AsyncEvent as E;
    match e {
        E::PortActive(_) => Some(EV_PORT_ACTIVE),
        E::PortErr(_) => Some(EV_PORT_ERR),
        E::DeviceFatal => Some(EV_DEVICE_FATAL),
        _ => None,
    }
}

/// The wire value and the QP of an event of one QP (`None` for any other event).
pub fn encode_qp_event(e: &crate::proto::AsyncEvent) -> Option<(u32, crate::wire::Qpn)> {
    use crate::proto::AsyncEvent as E;
    match *e {
        E::QpFatal(q) => Some((EV_QP_FATAL, q)),
        E::QpReqErr(q) => Some((EV_QP_REQ_ERR, q)),
        E::QpAccessErr(q) => Some((EV_QP_ACCESS_ERR, q)),
        E::CommEst(q) => Some((EV_COMM_EST, q)),
        E::SqDrained(q) => Some((EV_SQ_DRAINED, q)),
        E::QpLastWqeReached(q) => Some((EV_QP_LAST_WQE_REACHED, q)),
        _ => None,
    }
}

/// The event of a wire value and its element (untrusted: `None` for anything else).
/// A QP's event names the QPN (the client's QP has the engine's number); CQ_ERR names
/// the client's handle of the CQ, which is what the client's `Cq::engine_cq` returns;
/// SRQ_LIMIT_REACHED the client's handle of the SRQ (its `Srq::srq_num`).
pub fn decode_event(v: u32, element: u32) -> Option<crate::proto::AsyncEvent> {
    use crate::proto::AsyncEvent as E;
    let q = crate::wire::Qpn::new(element);
    match v {
        EV_PORT_ACTIVE => Some(E::PortActive(1)),
        EV_PORT_ERR => Some(E::PortErr(1)),
        EV_DEVICE_FATAL => Some(E::DeviceFatal),
        EV_QP_FATAL => Some(E::QpFatal(q)),
        EV_QP_REQ_ERR => Some(E::QpReqErr(q)),
        EV_QP_ACCESS_ERR => Some(E::QpAccessErr(q)),
        EV_COMM_EST => Some(E::CommEst(q)),
        EV_SQ_DRAINED => Some(E::SqDrained(q)),
        EV_QP_LAST_WQE_REACHED => Some(E::QpLastWqeReached(q)),
        EV_CQ_ERR => Some(E::CqErr(crate::proto::Cq(element))),
        EV_SRQ_LIMIT_REACHED => Some(E::SrqLimitReached(crate::proto::Srq(element))),
        _ => None,
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

/// `xrnic res` through the service: the resources the asker may see, each with its
/// owner (src/service/res.rs).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ResDoc {
    pub service_pid: u32,
    pub netdev: String,
    pub clients: Vec<ClientRes>,
    /// The GSI relay's counters (src/service/gsi.rs).
    #[serde(default)]
    pub gsi: super::gsi::RelayCounters,
}

/// Most entries (a client, or one of its objects or listens) of one [`Resp::ResPage`]:
/// its JSON stays well under the 64 KiB a client reads an answer into.
pub const RES_PAGE: usize = 256;

impl ResDoc {
    /// The [`RES_PAGE`] entries after the first `skip` (each client's entries: the
    /// client itself, then its PDs, MRs, CQs, QPs, AHs, SRQs and listens; a client some
    /// of whose entries are in the page is in it with those), and the `skip` of the next
    /// page (`None`: this was the last).
    pub fn page(&self, skip: u64, max: usize) -> (ResDoc, Option<u64>) {
        let skip = usize::try_from(skip).unwrap_or(usize::MAX);
        let mut out = ResDoc {
            service_pid: self.service_pid,
            netdev: self.netdev.clone(),
            clients: Vec::new(),
            gsi: self.gsi,
        };
        let (mut at, mut room) = (0usize, max.max(1));
        for c in &self.clients {
            let n = 1
                + c.pds.len()
                + c.mrs.len()
                + c.cqs.len()
                + c.qps.len()
                + c.ahs.len()
                + c.srqs.len()
                + c.gsi_listens.len();
            if at + n <= skip || room == 0 {
                at += n;
                continue;
            }
            let mut p = ClientRes {
                id: c.id,
                pid: c.pid,
                uid: c.uid,
                comm: c.comm.clone(),
                bad_slots: c.bad_slots,
                ..Default::default()
            };
            let from = skip.saturating_sub(at);
            // The client itself is entry 0 of its own.
            let mut i = 1usize;
            if from == 0 {
                room -= 1;
            }
            cut(&c.pds, &mut p.pds, &mut i, from, &mut room);
            cut(&c.mrs, &mut p.mrs, &mut i, from, &mut room);
            cut(&c.cqs, &mut p.cqs, &mut i, from, &mut room);
            cut(&c.qps, &mut p.qps, &mut i, from, &mut room);
            cut(&c.ahs, &mut p.ahs, &mut i, from, &mut room);
            cut(&c.srqs, &mut p.srqs, &mut i, from, &mut room);
            cut(&c.gsi_listens, &mut p.gsi_listens, &mut i, from, &mut room);
            out.clients.push(p);
            at += n;
        }
        let taken = max.max(1) - room;
        let next = skip.saturating_add(taken);
        (out, (next < at).then_some(next as u64))
    }

    /// Add a page ([`ResDoc::page`]) to what the earlier pages gave.
    pub fn merge(&mut self, page: ResDoc) {
        self.service_pid = page.service_pid;
        self.netdev = page.netdev;
        self.gsi = page.gsi;
        for p in page.clients {
            let Some(c) = self
                .clients
                .iter_mut()
                .find(|c| (c.id, c.pid) == (p.id, p.pid))
            else {
                self.clients.push(p);
                continue;
            };
            c.bad_slots = p.bad_slots;
            c.pds.extend(p.pds);
            c.mrs.extend(p.mrs);
            c.cqs.extend(p.cqs);
            c.qps.extend(p.qps);
            c.ahs.extend(p.ahs);
            c.srqs.extend(p.srqs);
            c.gsi_listens.extend(p.gsi_listens);
        }
    }
}

/// Entries `*at..` are `src`: copy those from entry `from` on into `dst`, at most `room`.
fn cut<T: Clone>(src: &[T], dst: &mut Vec<T>, at: &mut usize, from: usize, room: &mut usize) {
    let start = from.saturating_sub(*at).min(src.len());
    let n = (src.len() - start).min(*room);
    dst.extend_from_slice(&src[start..start + n]);
    *room -= n;
    *at += src.len();
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClientRes {
    /// The service's name of the connection (pages of one client are merged by it).
    #[serde(default)]
    pub id: u64,
    pub pid: i32,
    pub uid: u32,
    pub comm: String,
    pub pds: Vec<u32>,
    pub mrs: Vec<MrRes>,
    pub cqs: Vec<CqRes>,
    pub qps: Vec<QpRes>,
    #[serde(default)]
    pub ahs: Vec<AhRes>,
    #[serde(default)]
    pub srqs: Vec<SrqRes>,
    /// Ring slots the service dropped as malformed.
    pub bad_slots: u64,
    /// The ServiceIDs the client listens on through the GSI relay.
    #[serde(default)]
    pub gsi_listens: Vec<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MrRes {
    pub lkey: u32,
    pub rkey: u32,
    pub pd: u32,
    pub addr: u64,
    pub length: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CqRes {
    pub cq: u32,
    pub cqe: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct QpRes {
    pub lqpn: u32,
    pub rqpn: u32,
    pub pd: u32,
    pub state: String,
    /// "RC", "UC" or "UD" (absent from an older service: RC).
    #[serde(default)]
    pub qp_type: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AhRes {
    pub ah: u32,
    pub pd: u32,
    /// The destination GID as an address (IPv4 for a mapped GID).
    pub dgid: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SrqRes {
    pub srq: u32,
    pub pd: u32,
    pub max_wr: u32,
    pub srq_limit: u32,
}

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

/// Whose a submission slot is.
const KIND_SEND: u64 = 1;
const KIND_RECV: u64 = 2;
/// A UD send: as a send, words 3 and 4 name the destination ([`UdTarget`]).
const KIND_SEND_UD: u64 = 3;
/// A receive posted to an SRQ: word 1 is the client's handle of the SRQ.
const KIND_SRQ_RECV: u64 = 4;

const WR_OPCODES: [WrOpcode; 8] = [
    WrOpcode::Send,
    WrOpcode::SendWithImm,
    WrOpcode::SendWithInv,
    WrOpcode::RdmaWrite,
    WrOpcode::RdmaWriteWithImm,
    WrOpcode::RdmaRead,
    WrOpcode::AtomicCmpAndSwp,
    WrOpcode::AtomicFetchAndAdd,
];

/// Where a UD send goes (`ibv_send_wr.wr.ud`): the client's handle of the AH, the
/// remote QPN and the remote Q_Key (high bit set: the QP's own, as the engine reads it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdTarget {
    pub ah: u32,
    pub remote_qpn: Qpn,
    pub remote_qkey: u32,
}

/// A decoded submission slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    Send(Qpn, SendWr),
    Recv(Qpn, RecvWr),
    SendUd(Qpn, SendWr, UdTarget),
    /// A receive for the client's SRQ of this handle.
    SrqRecv(u32, RecvWr),
}

fn put_sges(w: &mut [u64; SQ_WORDS], sges: &[Sge]) -> Option<()> {
    if sges.len() > MAX_SGE {
        return None;
    }
    for (i, s) in sges.iter().enumerate() {
        w[8 + 2 * i] = s.addr;
        w[9 + 2 * i] = u64::from(s.length) | u64::from(s.lkey.0) << 32;
    }
    Some(())
}

fn get_sges(w: &[u64; SQ_WORDS], n: usize) -> Option<Vec<Sge>> {
    if n > MAX_SGE {
        return None;
    }
    Some(
        (0..n)
            .map(|i| Sge {
                addr: w[8 + 2 * i],
                length: w[9 + 2 * i] as u32,
                lkey: Lkey((w[9 + 2 * i] >> 32) as u32),
            })
            .collect(),
    )
}

/// Word 0: kind (bits 0..8), SGE count (8..16), opcode (16..24), send flags (32..64).
/// Word 1: the QPN (an SRQ receive: the SRQ's handle) and the immediate; word 2 the
/// wr_id; words 3..7 the remote address, keys and atomic operands (a UD send: the AH
/// handle and remote QPN, the remote Q_Key); words 8.. the SGEs.
pub fn encode_send(qpn: Qpn, wr: &SendWr) -> Option<[u64; SQ_WORDS]> {
    let mut w = [0u64; SQ_WORDS];
    let op = WR_OPCODES.iter().position(|&o| o == wr.opcode)? as u64;
    w[0] = KIND_SEND | (wr.sg_list.len() as u64) << 8 | op << 16 | u64::from(wr.send_flags.0) << 32;
    w[1] = u64::from(qpn.value()) | u64::from(wr.imm_data) << 32;
    w[2] = wr.wr_id;
    let (addr, rkey) = if wr.opcode.is_atomic() {
        (wr.atomic.remote_addr, wr.atomic.rkey)
    } else {
        (wr.rdma.remote_addr, wr.rdma.rkey)
    };
    w[3] = addr;
    w[4] = u64::from(rkey.0) | u64::from(wr.invalidate_rkey.0) << 32;
    w[5] = wr.atomic.compare_add;
    w[6] = wr.atomic.swap;
    put_sges(&mut w, &wr.sg_list)?;
    Some(w)
}

pub fn encode_recv(qpn: Qpn, wr: &RecvWr) -> Option<[u64; SQ_WORDS]> {
    encode_recv_kind(KIND_RECV, qpn.value(), wr)
}

/// A receive for the client's SRQ `srq`.
pub fn encode_srq_recv(srq: u32, wr: &RecvWr) -> Option<[u64; SQ_WORDS]> {
    encode_recv_kind(KIND_SRQ_RECV, srq, wr)
}

fn encode_recv_kind(kind: u64, target: u32, wr: &RecvWr) -> Option<[u64; SQ_WORDS]> {
    let mut w = [0u64; SQ_WORDS];
    w[0] = kind | (wr.sg_list.len() as u64) << 8;
    w[1] = u64::from(target);
    w[2] = wr.wr_id;
    put_sges(&mut w, &wr.sg_list)?;
    Some(w)
}

/// A UD send (SEND or SEND_WITH_IMM only, as the engine's UD QPs take): word 3 the AH
/// handle and the remote QPN, word 4 the remote Q_Key.
pub fn encode_send_ud(qpn: Qpn, wr: &SendWr, to: &UdTarget) -> Option<[u64; SQ_WORDS]> {
    if !matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm) {
        return None;
    }
    let mut w = encode_send(qpn, wr)?;
    w[0] = (w[0] & !0xff) | KIND_SEND_UD;
    w[3] = u64::from(to.ah) | u64::from(to.remote_qpn.value()) << 32;
    w[4] = u64::from(to.remote_qkey);
    w[5] = 0;
    w[6] = 0;
    Some(w)
}

/// Decode a submission slot; `None` for anything malformed.
pub fn decode_work(w: &[u64; SQ_WORDS]) -> Option<Work> {
    let kind = w[0] & 0xff;
    let nsge = ((w[0] >> 8) & 0xff) as usize;
    let qpn = Qpn::new(w[1] as u32);
    let sg_list = get_sges(w, nsge)?;
    match kind {
        KIND_SEND => {
            let opcode = *WR_OPCODES.get(((w[0] >> 16) & 0xff) as usize)?;
            if w[0] >> 24 & 0xff != 0 {
                return None;
            }
            let rkey = Rkey(w[4] as u32);
            let mut wr = SendWr::new(w[2], opcode);
            wr.sg_list = sg_list;
            wr.send_flags = SendFlags((w[0] >> 32) as u32);
            wr.imm_data = (w[1] >> 32) as u32;
            wr.invalidate_rkey = Rkey((w[4] >> 32) as u32);
            if opcode.is_atomic() {
                wr.atomic = AtomicInfo {
                    remote_addr: w[3],
                    rkey,
                    compare_add: w[5],
                    swap: w[6],
                };
            } else {
                wr.rdma = RdmaInfo {
                    remote_addr: w[3],
                    rkey,
                };
            }
            Some(Work::Send(qpn, wr))
        }
        KIND_SEND_UD => {
            let opcode = *WR_OPCODES.get(((w[0] >> 16) & 0xff) as usize)?;
            if w[0] >> 24 & 0xff != 0 || !matches!(opcode, WrOpcode::Send | WrOpcode::SendWithImm) {
                return None;
            }
            let remote_qpn = (w[3] >> 32) as u32;
            if remote_qpn > 0xff_ffff || w[4] >> 32 != 0 {
                return None;
            }
            let mut wr = SendWr::new(w[2], opcode);
            wr.sg_list = sg_list;
            wr.send_flags = SendFlags((w[0] >> 32) as u32);
            wr.imm_data = (w[1] >> 32) as u32;
            let to = UdTarget {
                ah: w[3] as u32,
                remote_qpn: Qpn::new(remote_qpn),
                remote_qkey: w[4] as u32,
            };
            Some(Work::SendUd(qpn, wr, to))
        }
        KIND_RECV => Some(Work::Recv(
            qpn,
            RecvWr {
                wr_id: w[2],
                sg_list,
            },
        )),
        KIND_SRQ_RECV => Some(Work::SrqRecv(
            w[1] as u32,
            RecvWr {
                wr_id: w[2],
                sg_list,
            },
        )),
        _ => None,
    }
}

const WC_OPCODES: [WcOpcode; 7] = [
    WcOpcode::Send,
    WcOpcode::RdmaWrite,
    WcOpcode::RdmaRead,
    WcOpcode::CompSwap,
    WcOpcode::FetchAdd,
    WcOpcode::Recv,
    WcOpcode::RecvRdmaWithImm,
];

/// A completion slot: wr_id; status | opcode | flags | sl | byte_len; imm | invalidated rkey;
/// qp_num | src_qp.
pub fn encode_wc(wc: &WorkCompletion) -> [u64; CQ_WORDS] {
    let op = WC_OPCODES.iter().position(|&o| o == wc.opcode).unwrap_or(0) as u64;
    let flags = u64::from(wc.imm_data.is_some())
        | u64::from(wc.invalidated_rkey.is_some()) << 1
        | u64::from(wc.grh) << 2;
    let mut w = [0u64; CQ_WORDS];
    w[0] = wc.wr_id;
    w[1] = wc.status as u64
        | op << 8
        | flags << 16
        | u64::from(wc.sl) << 24
        | u64::from(wc.byte_len) << 32;
    w[2] = u64::from(wc.imm_data.unwrap_or(0))
        | u64::from(wc.invalidated_rkey.map_or(0, |r| r.0)) << 32;
    w[3] = u64::from(wc.qp_num.value()) | u64::from(wc.src_qp.value()) << 32;
    w
}

pub fn decode_wc(w: &[u64; CQ_WORDS]) -> WorkCompletion {
    let flags = (w[1] >> 16) & 0xff;
    WorkCompletion {
        wr_id: w[0],
        status: WcStatus::from_ibv((w[1] & 0xff) as u32),
        opcode: WC_OPCODES
            .get(((w[1] >> 8) & 0xff) as usize)
            .copied()
            .unwrap_or(WcOpcode::Send),
        byte_len: (w[1] >> 32) as u32,
        imm_data: (flags & 1 != 0).then_some(w[2] as u32),
        invalidated_rkey: (flags & 2 != 0).then_some(Rkey((w[2] >> 32) as u32)),
        qp_num: Qpn::new(w[3] as u32),
        src_qp: Qpn::new((w[3] >> 32) as u32),
        grh: flags & 4 != 0,
        sl: (w[1] >> 24) as u8,
    }
}

/// The mask as the engine's type.
pub fn mask(m: u32) -> AttrMask {
    AttrMask(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of any size put back together give the listing they came from, each page
    /// within its size (the client itself counts as an entry), the last one saying so.
    #[test]
    fn res_pages_merge_back_into_the_whole_listing() {
        let client = |id: u64, n: u32| ClientRes {
            id,
            pid: id as i32,
            uid: 7,
            comm: format!("c{id}"),
            pds: (0..n % 3).collect(),
            mrs: (0..n)
                .map(|k| MrRes {
                    lkey: k,
                    rkey: k + 1,
                    ..Default::default()
                })
                .collect(),
            cqs: (0..n / 2).map(|cq| CqRes { cq, cqe: 16 }).collect(),
            gsi_listens: vec![u64::from(n)],
            ..Default::default()
        };
        let doc = ResDoc {
            service_pid: 9,
            netdev: "eth0".into(),
            clients: vec![client(1, 0), client(2, 1000), client(3, 5), client(4, 0)],
            gsi: Default::default(),
        };
        let whole = serde_json::to_value(&doc).unwrap();
        for max in [1, 2, 7, 256, 5000] {
            let (mut got, mut skip, mut pages) = (ResDoc::default(), Some(0), 0);
            while let Some(s) = skip {
                let (page, next) = doc.page(s, max);
                let entries: usize = page
                    .clients
                    .iter()
                    .map(|c| c.pds.len() + c.mrs.len() + c.cqs.len() + c.gsi_listens.len())
                    .sum();
                assert!(entries <= max, "page of {entries} entries, max {max}");
                assert!(next.is_none_or(|n| n > s), "pages advance");
                got.merge(page);
                skip = next;
                pages += 1;
            }
            assert_eq!(serde_json::to_value(&got).unwrap(), whole, "max {max}");
            assert!(max < 5000 || pages == 1);
        }
        // Past the end: an empty last page.
        let (page, next) = doc.page(1_000_000, 10);
        assert!(page.clients.is_empty() && next.is_none());
    }

    #[test]
    fn every_forwarded_event_round_trips_and_unknown_values_are_refused() {
        use crate::proto::AsyncEvent as E;
        let q = Qpn::new(0x12_3456);
        for e in [
            E::QpFatal(q),
            E::QpReqErr(q),
            E::QpAccessErr(q),
            E::CommEst(q),
            E::SqDrained(q),
            E::QpLastWqeReached(q),
        ] {
            let (v, n) = encode_qp_event(&e).unwrap();
            assert_eq!(encode_event(&e), None, "{e:?} goes to its owner only");
            assert_eq!(decode_event(v, n.value()), Some(e));
        }
        assert_eq!(
            decode_event(EV_CQ_ERR, 7),
            Some(E::CqErr(crate::proto::Cq(7)))
        );
        for e in [E::PortActive(1), E::PortErr(1), E::DeviceFatal] {
            assert_eq!(decode_event(encode_event(&e).unwrap(), 1), Some(e));
            assert_eq!(encode_qp_event(&e), None);
        }
        assert_eq!(
            decode_event(EV_SRQ_LIMIT_REACHED, 3),
            Some(E::SrqLimitReached(crate::proto::Srq(3)))
        );
        // Unknown and garbage values: nothing.
        for v in [6, 7, 11, 12, 17, u32::MAX] {
            assert_eq!(decode_event(v, 1), None, "{v}");
        }
    }

    #[test]
    fn slots_round_trip_and_garbage_is_refused() {
        let mut wr = SendWr::new(7, WrOpcode::AtomicCmpAndSwp);
        wr.sg_list = vec![Sge {
            addr: 0x1000,
            length: 8,
            lkey: Lkey(0x1234),
        }];
        wr.atomic = AtomicInfo {
            remote_addr: 0x2000,
            rkey: Rkey(9),
            compare_add: 1,
            swap: 2,
        };
        let w = encode_send(Qpn::new(17), &wr).unwrap();
        assert_eq!(decode_work(&w), Some(Work::Send(Qpn::new(17), wr.clone())));
        let r = RecvWr {
            wr_id: 3,
            sg_list: vec![],
        };
        assert_eq!(
            decode_work(&encode_recv(Qpn::new(5), &r).unwrap()),
            Some(Work::Recv(Qpn::new(5), r))
        );
        let mut bad = w;
        bad[0] = 0xff;
        assert_eq!(decode_work(&bad), None, "unknown kind");
        bad = w;
        bad[0] = KIND_SEND | 40 << 8;
        assert_eq!(decode_work(&bad), None, "too many SGEs");
        bad = w;
        bad[0] = KIND_SEND | 9 << 16;
        assert_eq!(decode_work(&bad), None, "unknown opcode");
        wr.sg_list = vec![Sge::default(); MAX_SGE + 1];
        assert!(encode_send(Qpn::new(1), &wr).is_none());

        let wc = WorkCompletion {
            wr_id: 11,
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 4096,
            imm_data: Some(0xabcd),
            invalidated_rkey: None,
            qp_num: Qpn::new(17),
            src_qp: Qpn::new(18),
            grh: false,
            sl: 0,
        };
        assert_eq!(decode_wc(&encode_wc(&wc)), wc);
        let ud = WorkCompletion {
            grh: true,
            sl: 0xa,
            ..wc
        };
        assert_eq!(decode_wc(&encode_wc(&ud)), ud);

        // A UD send and an SRQ receive round trip; a UD slot with an RDMA opcode or a
        // QPN past 24 bits is refused.
        let mut ud = SendWr::new(21, WrOpcode::SendWithImm);
        ud.imm_data = 0x1234_5678;
        ud.sg_list = vec![Sge {
            addr: 0x3000,
            length: 100,
            lkey: Lkey(5),
        }];
        let to = UdTarget {
            ah: 4,
            remote_qpn: Qpn::new(0x12_3456),
            remote_qkey: 0x8000_0000,
        };
        let w = encode_send_ud(Qpn::new(9), &ud, &to).unwrap();
        assert_eq!(
            decode_work(&w),
            Some(Work::SendUd(Qpn::new(9), ud.clone(), to))
        );
        let mut bad = w;
        bad[0] = (bad[0] & !(0xff << 16)) | 3 << 16;
        assert_eq!(decode_work(&bad), None, "RDMA WRITE on a UD slot");
        bad = w;
        bad[3] |= 0xff00_0000 << 32;
        assert_eq!(decode_work(&bad), None, "a remote QPN past 24 bits");
        assert!(encode_send_ud(Qpn::new(9), &SendWr::new(1, WrOpcode::RdmaRead), &to).is_none());
        let r = RecvWr {
            wr_id: 8,
            sg_list: vec![],
        };
        assert_eq!(
            decode_work(&encode_srq_recv(77, &r).unwrap()),
            Some(Work::SrqRecv(77, r))
        );

        let a = QpAttr::default();
        assert_eq!(QpAttrMsg::from_attr(&a).to_attr(), Some(a));
        let m = QpAttrMsg {
            path_mtu: 1000,
            ..QpAttrMsg::from_attr(&a)
        };
        assert_eq!(m.to_attr(), None);
    }
}
