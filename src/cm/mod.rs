//! The IB Communication Manager (IBTA vol.1 §12) for one port, sans-IO: connection ids,
//! listeners by service ID, REQ → (MRA) → REP → RTU, REJ, DREQ → DREP, timewait, SIDR, and
//! the retries of each MAD, as the kernel's drivers/infiniband/core/cm.c runs them.
//!
//! Contract (quinn-proto style): the CM never reads a clock and never sends. Inputs are
//! [`Cm::handle_mad`] (a MAD that arrived on QP1, with the sender's GID), [`Cm::handle_timeout`]
//! and the consumer's calls ([`Cm::listen`], [`Cm::connect`], [`Cm::accept`], ...), each
//! with `now` a [`proto::Instant`](crate::proto::Instant) on the caller's clock (the port's
//! monotonic clock in src/abi, virtual time in the tests; src/proto/time.rs). Outputs are drained: [`Cm::poll_transmit`] (a MAD
//! for QP1 at a GID), [`Cm::poll_event`] (what rdma_cm turns into `RDMA_CM_EVENT_*`) and
//! [`Cm::poll_timeout`]. The CM does not touch QPs: [`Cm::qp_attr`] gives the attributes
//! for INIT → RTR → RTS from the REQ/REP parameters (`ib_cm_init_qp_attr`), and the
//! consumer (librdmacm in src/abi/rdmacm*.rs, tests) moves its QP.
//!
//! Timers: a sent REQ, REP or DREQ (and a SIDR_REQ) is resent after
//! `2 × packet life + peer's cm_response_timeout` (cm.c `timeout_ms`), at most
//! `max_cm_retries` times; then the id fails (REQ, REP: [`CmEvent::Unreachable`]; DREQ:
//! [`CmEvent::DreqError`], cm.c `IB_CM_DREQ_ERROR`). An MRA for our REQ stretches the
//! wait by its service timeout. Duplicates are answered as cm.c does: a REQ again → MRA
//! again (or nothing after REP: REP has its own timer), a REP again → RTU again, a DREQ
//! in timewait → DREP again. Timewait lasts `2 × packet life` plus the ACK timeout.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::proto::Instant;
use crate::wire::mad::{
    CmMsg, Dreq, Mad, Mra, MsgRef, Rej, Rep, Req, Rtu, SidrRep, SidrReq, rej_reason, sidr_status,
};

pub mod res;
#[cfg(test)]
mod tests;

/// 4.096 µs × 2^t, the unit of every CM timeout field (IBTA §12.6.5).
pub const fn cm_time(t: u8) -> Duration {
    Duration::from_nanos(4096u64 << (t & 0x1f))
}

/// A connection id (the CM's local communication ID).
pub type CmId = u32;

/// Per-port CM settings; the defaults are the kernel rdma_cm's for RoCE
/// (cma.c `CMA_CM_RESPONSE_TIMEOUT` 20, `CMA_MAX_CM_RETRIES` 15,
/// `CMA_IBOE_PACKET_LIFETIME` 16).
#[derive(Clone, Copy, Debug)]
pub struct CmConfig {
    pub ca_guid: u64,
    pub response_timeout: u8,
    pub max_cm_retries: u8,
    pub packet_life_time: u8,
    /// The QP local ACK timeout put in the REQ's path (cma.c: packet life + 1).
    pub local_ack_timeout: u8,
    /// First local communication ID (cm.c draws it at random; tests fix it).
    pub first_comm_id: u32,
    /// The local communication IDs this CM may use: `(base, span)`, IDs `base ..
    /// base + span` (wrapping inside). `None`: any non-zero ID. A client of the device
    /// service gets a range of its own, so that the service can route a MAD naming one
    /// of its IDs to it (src/service/gsi.rs); `first_comm_id` is then taken inside it.
    pub comm_ids: Option<(u32, u32)>,
}

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig {
            ca_guid: 0,
            response_timeout: 20,
            max_cm_retries: 15,
            packet_life_time: 16,
            local_ack_timeout: 17,
            first_comm_id: 0x1000,
            comm_ids: None,
        }
    }
}

/// The path a connection uses (from rdma_resolve_route): GIDs and the IP hop's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Path {
    pub local_gid: [u8; 16],
    pub remote_gid: [u8; 16],
    /// IBV_MTU_* (1..5).
    pub mtu: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
}

/// The consumer's side of a connection (rdma_conn_param plus its QP).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ConnParam {
    pub qpn: u32,
    pub psn: u32,
    pub qkey: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub private_data: Vec<u8>,
}

/// What the consumer learns (rdma_cm turns these into `RDMA_CM_EVENT_*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a listener: a new passive id (RDMA_CM_EVENT_CONNECT_REQUEST).
    ConnectRequest {
        listener: u64,
        id: CmId,
        from: [u8; 16],
        req: Box<Req>,
    },
    /// Our REQ was answered by a REP (librdmacm moves its QP, then `rtu`).
    ConnectResponse { id: CmId, rep: Box<Rep> },
    /// RTU received (passive) or sent (active): RDMA_CM_EVENT_ESTABLISHED.
    Established { id: CmId },
    /// A REJ: RDMA_CM_EVENT_REJECTED with `reason` as the event's status.
    Rejected {
        id: CmId,
        reason: u16,
        private_data: Vec<u8>,
    },
    /// No answer after every retry (REQ, REP) or SIDR: RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT.
    Unreachable { id: CmId },
    /// DREQ received or DREP received: RDMA_CM_EVENT_DISCONNECTED.
    Disconnected { id: CmId },
    /// Our DREQ unanswered after every retry (cm.c `IB_CM_DREQ_ERROR`): the peer is gone;
    /// RDMA_CM_EVENT_DISCONNECTED with status -ETIMEDOUT (cma.c `cma_ib_handler`).
    DreqError { id: CmId },
    /// The id left timewait (RDMA_CM_EVENT_TIMEWAIT_EXIT); it is gone.
    TimewaitExit { id: CmId },
    /// A SIDR_REQ for a listener (RDMA_CM_EVENT_CONNECT_REQUEST on a UD id).
    SidrRequest {
        listener: u64,
        id: CmId,
        from: [u8; 16],
        req: Box<SidrReq>,
    },
    /// The answer to our SIDR_REQ (RDMA_CM_EVENT_ESTABLISHED with the UD parameters, or
    /// UNREACHABLE when `status` is not 0).
    SidrReply { id: CmId, rep: Box<SidrRep> },
}

/// Where an id is (cm.c `enum ib_cm_state`, the subset RoCE uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    ReqSent,
    MraReqRcvd,
    ReqRcvd,
    MraReqSent,
    RepSent,
    Established,
    DreqSent,
    DreqRcvd,
    Timewait,
    SidrReqSent,
    SidrReqRcvd,
}

impl State {
    /// cm.c's name of the state (`enum ib_cm_state` without `IB_CM_`).
    pub fn name(self) -> &'static str {
        match self {
            State::ReqSent => "REQ_SENT",
            State::MraReqRcvd => "MRA_REQ_RCVD",
            State::ReqRcvd => "REQ_RCVD",
            State::MraReqSent => "MRA_REQ_SENT",
            State::RepSent => "REP_SENT",
            State::Established => "ESTABLISHED",
            State::DreqSent => "DREQ_SENT",
            State::DreqRcvd => "DREQ_RCVD",
            State::Timewait => "TIMEWAIT",
            State::SidrReqSent => "SIDR_REQ_SENT",
            State::SidrReqRcvd => "SIDR_REQ_RCVD",
        }
    }
}

/// A MAD to send on QP1 to the port with GID `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    pub to: [u8; 16],
    pub mad: [u8; 256],
}

/// What the CM counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmCounters {
    pub sent: u64,
    pub received: u64,
    pub resent: u64,
    pub duplicates: u64,
    /// Undecodable MADs, or MADs for no id.
    pub dropped: u64,
    pub rejects_sent: u64,
}

#[derive(Clone, Debug)]
struct Conn {
    state: State,
    path: Path,
    /// The peer's local comm id (0 until known).
    remote_id: u32,
    remote_qpn: u32,
    /// The peer's starting PSN (our RQ PSN).
    remote_psn: u32,
    local: ConnParam,
    /// The peer's responder resources / initiator depth, from its REQ or REP.
    remote_rr: u8,
    remote_id_depth: u8,
    tid: u64,
    /// The MAD we resend on timeout, with its wait.
    last: Option<[u8; 256]>,
    deadline: Option<Instant>,
    wait: Duration,
    retries_left: u8,
    sidr_service: u64,
}

/// Where a REJ goes and what it answers: the peer's port, the transaction it rejects, the
/// two comm ids (ours 0 when the REQ made no id) and the message rejected.
struct RejTo {
    gid: [u8; 16],
    tid: u64,
    local: u32,
    remote: u32,
    msg: MsgRef,
}

/// A passive side's parameters: the consumer's, with the retry counts of the REQ
/// (cm.c `cm_req_handler` takes `retry_count` and `rnr_retry_count` from the REQ;
/// librdmacm documents `retry_count` as ignored when accepting).
fn passive_param(from_req: &ConnParam, mut p: ConnParam) -> ConnParam {
    p.retry_count = from_req.retry_count;
    p.rnr_retry_count = from_req.rnr_retry_count;
    p
}

/// The CM of one port.
pub struct Cm {
    cfg: CmConfig,
    next_id: u32,
    next_tid: u64,
    listeners: HashMap<u64, u64>,
    conns: HashMap<CmId, Conn>,
    tx: VecDeque<Transmit>,
    events: VecDeque<CmEvent>,
    counters: CmCounters,
}

/// The QP attributes the CM gives for a transition (`ib_cm_init_qp_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct QpParams {
    pub dest_qpn: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub path_mtu: u8,
    pub max_dest_rd_atomic: u8,
    pub max_rd_atomic: u8,
    /// cm.c `min_rnr_timer` 0 unless set by the consumer: IBTA Table 45 code 0 = 655 ms;
    /// rdma_cm uses 12 (0.64 ms), as does this.
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub path: Path,
}

impl Cm {
    pub fn new(cfg: CmConfig) -> Cm {
        let first = match cfg.comm_ids {
            Some((base, span)) if span > 0 => base + cfg.first_comm_id % span,
            _ => cfg.first_comm_id,
        };
        Cm {
            cfg,
            next_id: first.max(1),
            next_tid: u64::from(cfg.first_comm_id) << 32,
            listeners: HashMap::new(),
            conns: HashMap::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            counters: CmCounters::default(),
        }
    }

    pub fn counters(&self) -> CmCounters {
        self.counters
    }

    /// The state of `id`, `None` once it is gone.
    pub fn state(&self, id: CmId) -> Option<State> {
        self.conns.get(&id).map(|c| c.state)
    }

    /// The QPN our side of connection `id` carries (0 for a SIDR id).
    pub fn local_qpn(&self, id: CmId) -> Option<u32> {
        self.conns.get(&id).map(|c| c.local.qpn)
    }

    /// Every live id with its state and service (for `xrnic res` / `rdma res show cm_id`).
    pub fn ids(&self) -> Vec<(CmId, State)> {
        let mut v: Vec<_> = self.conns.iter().map(|(k, c)| (*k, c.state)).collect();
        v.sort_unstable_by_key(|x| x.0);
        v
    }

    /// Listen on `service_id`, delivering to `listener` (the consumer's handle). `false`
    /// when the service already has a listener (rdma_listen: EADDRINUSE).
    pub fn listen(&mut self, service_id: u64, listener: u64) -> bool {
        if self.listeners.contains_key(&service_id) {
            return false;
        }
        self.listeners.insert(service_id, listener);
        true
    }

    pub fn unlisten(&mut self, service_id: u64) {
        self.listeners.remove(&service_id);
    }

    #[must_use = "a drained MAD must be sent"]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.tx.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    fn alloc_id(&mut self) -> CmId {
        loop {
            let id = self.next_id;
            self.next_id = match self.cfg.comm_ids {
                Some((base, span)) if span > 0 => {
                    base + (id.wrapping_sub(base).wrapping_add(1) % span)
                }
                _ => id.wrapping_add(1),
            }
            .max(1);
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    fn new_tid(&mut self) -> u64 {
        self.next_tid += 1;
        self.next_tid
    }

    fn resend_wait(&self) -> Duration {
        // cm.c: packet life twice, plus the peer's response time (we send ours: the same).
        2 * cm_time(self.cfg.packet_life_time) + cm_time(self.cfg.response_timeout)
    }

    fn send(&mut self, to: [u8; 16], tid: u64, msg: CmMsg) -> [u8; 256] {
        let mad = Mad { tid, msg }.emit();
        self.tx.push_back(Transmit { to, mad });
        self.counters.sent += 1;
        mad
    }

    /// Send `msg` for `id` and arm its resend timer.
    fn send_timed(&mut self, now: Instant, id: CmId, msg: CmMsg) {
        let wait = self.resend_wait();
        let retries = self.cfg.max_cm_retries;
        let Some(c) = self.conns.get(&id) else { return };
        let (to, tid) = (c.path.remote_gid, c.tid);
        let mad = self.send(to, tid, msg);
        if let Some(c) = self.conns.get_mut(&id) {
            c.last = Some(mad);
            c.wait = wait;
            c.deadline = Some(now + wait);
            c.retries_left = retries;
        }
    }

    /// rdma_connect: send a REQ for `service_id` over `path` with the consumer's QP.
    pub fn connect(&mut self, now: Instant, service_id: u64, path: Path, p: ConnParam) -> CmId {
        let id = self.alloc_id();
        let tid = self.new_tid();
        let mut private_data = [0u8; 92];
        let n = p.private_data.len().min(92);
        private_data[..n].copy_from_slice(&p.private_data[..n]);
        let req = Req {
            local_comm_id: id,
            service_id,
            local_ca_guid: self.cfg.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.cfg.response_timeout,
            transport_service_type: 0,
            end_to_end_flow_control: false,
            starting_psn: p.psn & 0xff_ffff,
            local_cm_response_timeout: self.cfg.response_timeout,
            retry_count: p.retry_count & 7,
            partition_key: 0xffff,
            path_mtu: path.mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count & 7,
            max_cm_retries: self.cfg.max_cm_retries,
            srq: p.srq,
            extended_transport_type: 0,
            primary: crate::wire::mad::CmPath {
                // RoCE: the permissive LID (cm.c `cm_format_req` for IB_LINK_LAYER_ETHERNET).
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: path.local_gid,
                remote_gid: path.remote_gid,
                flow_label: path.flow_label,
                packet_rate: 0,
                traffic_class: path.traffic_class,
                hop_limit: path.hop_limit,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: self.cfg.local_ack_timeout,
            },
            alternate: Default::default(),
            private_data,
        };
        self.conns.insert(
            id,
            Conn {
                state: State::ReqSent,
                path,
                remote_id: 0,
                remote_qpn: 0,
                remote_psn: 0,
                local: p,
                remote_rr: 0,
                remote_id_depth: 0,
                tid,
                last: None,
                deadline: None,
                wait: Duration::ZERO,
                retries_left: 0,
                sidr_service: service_id,
            },
        );
        self.send_timed(now, id, CmMsg::Req(Box::new(req)));
        id
    }

    /// rdma_accept on a passive id: send the REP.
    pub fn accept(&mut self, now: Instant, id: CmId, p: ConnParam) -> bool {
        let guid = self.cfg.ca_guid;
        let Some(c) = self.conns.get_mut(&id) else {
            return false;
        };
        if !matches!(c.state, State::ReqRcvd | State::MraReqSent) {
            return false;
        }
        let mut private_data = [0u8; 196];
        let n = p.private_data.len().min(196);
        private_data[..n].copy_from_slice(&p.private_data[..n]);
        let rep = Rep {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            local_eecn: 0,
            starting_psn: p.psn & 0xff_ffff,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: p.rnr_retry_count & 7,
            srq: p.srq,
            local_ca_guid: guid,
            private_data,
        };
        c.local = passive_param(&c.local, p);
        c.state = State::RepSent;
        self.send_timed(now, id, CmMsg::Rep(Box::new(rep)));
        true
    }

    /// The consumer's side of a passive id before [`Cm::accept`] (librdmacm moves the QP
    /// to RTR and RTS from it before the REP goes out).
    pub fn set_local(&mut self, id: CmId, p: ConnParam) -> bool {
        match self.conns.get_mut(&id) {
            Some(c) => {
                c.local = passive_param(&c.local, p);
                true
            }
            None => false,
        }
    }

    /// Send a REJ for `id` (a passive id not yet accepted, or an active one that got a
    /// REP it does not want) and forget it.
    pub fn reject(&mut self, id: CmId, reason: u16, private: &[u8]) -> bool {
        let Some(c) = self.conns.remove(&id) else {
            return false;
        };
        let msg = match c.state {
            State::ReqRcvd | State::MraReqSent => MsgRef::Req,
            State::ReqSent | State::MraReqRcvd => MsgRef::Rep,
            State::SidrReqRcvd => {
                self.sidr_reply(&c, id, sidr_status::REJECT, 0, 0, private);
                return true;
            }
            _ => {
                self.conns.insert(id, c);
                return false;
            }
        };
        let to = RejTo {
            gid: c.path.remote_gid,
            tid: c.tid,
            local: id,
            remote: c.remote_id,
            msg,
        };
        self.send_rej(to, reason, private);
        true
    }

    fn send_rej(&mut self, to: RejTo, reason: u16, private: &[u8]) {
        let mut private_data = [0u8; 148];
        let n = private.len().min(148);
        private_data[..n].copy_from_slice(&private[..n]);
        self.counters.rejects_sent += 1;
        self.send(
            to.gid,
            to.tid,
            CmMsg::Rej(Box::new(Rej {
                local_comm_id: to.local,
                remote_comm_id: to.remote,
                message_rejected: to.msg,
                reject_info_length: 0,
                reason,
                ari: [0; 72],
                private_data,
            })),
        );
    }

    /// Active side, after its QP is at RTS: send the RTU (rdma_connect's
    /// CONNECT_RESPONSE → `ib_send_cm_rtu`). ESTABLISHED follows at once.
    pub fn rtu(&mut self, id: CmId) -> bool {
        let Some(c) = self.conns.get_mut(&id) else {
            return false;
        };
        if !matches!(c.state, State::ReqSent | State::MraReqRcvd) || c.remote_id == 0 {
            return false;
        }
        c.state = State::Established;
        c.deadline = None;
        let (to, tid, remote) = (c.path.remote_gid, c.tid, c.remote_id);
        let m = self.send(
            to,
            tid,
            CmMsg::Rtu(Box::new(Rtu {
                local_comm_id: id,
                remote_comm_id: remote,
                private_data: [0; 224],
            })),
        );
        if let Some(c) = self.conns.get_mut(&id) {
            c.last = Some(m);
        }
        self.events.push_back(CmEvent::Established { id });
        true
    }

    /// rdma_disconnect: DREQ from ESTABLISHED, DREP when a DREQ came first.
    pub fn disconnect(&mut self, now: Instant, id: CmId) -> bool {
        let Some(c) = self.conns.get(&id) else {
            return false;
        };
        match c.state {
            State::Established | State::RepSent => {
                let (remote, qpn, tid) = (c.remote_id, c.remote_qpn, self.new_tid());
                let c = self.conns.get_mut(&id).expect("checked above");
                c.state = State::DreqSent;
                c.tid = tid;
                self.send_timed(
                    now,
                    id,
                    CmMsg::Dreq(Box::new(Dreq {
                        local_comm_id: id,
                        remote_comm_id: remote,
                        remote_qpn: qpn,
                        private_data: [0; 220],
                    })),
                );
                true
            }
            State::DreqRcvd => {
                self.send_drep(id);
                self.enter_timewait(now, id);
                true
            }
            _ => false,
        }
    }

    fn send_drep(&mut self, id: CmId) {
        let Some(c) = self.conns.get(&id) else { return };
        let (to, tid, remote) = (c.path.remote_gid, c.tid, c.remote_id);
        let m = self.send(
            to,
            tid,
            CmMsg::Drep(Box::new(Rtu {
                local_comm_id: id,
                remote_comm_id: remote,
                private_data: [0; 224],
            })),
        );
        if let Some(c) = self.conns.get_mut(&id) {
            c.last = Some(m);
        }
    }

    fn enter_timewait(&mut self, now: Instant, id: CmId) {
        let wait = 2 * cm_time(self.cfg.packet_life_time) + cm_time(self.cfg.local_ack_timeout);
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::Timewait;
            c.deadline = Some(now + wait);
            c.retries_left = 0;
        }
    }

    /// Forget `id` at once (rdma_destroy_id). A connected id sends its DREQ first (cm.c
    /// `cm_destroy_id` does), without waiting for the DREP.
    pub fn destroy(&mut self, now: Instant, id: CmId) {
        if let Some(c) = self.conns.get(&id) {
            match c.state {
                State::Established => {
                    self.disconnect(now, id);
                }
                State::DreqRcvd => self.send_drep(id),
                State::ReqRcvd | State::MraReqSent => {
                    self.reject(id, rej_reason::CONSUMER_DEFINED, &[]);
                }
                _ => {}
            }
        }
        self.conns.remove(&id);
    }

    /// rdma_resolve_route on a UD id then `ib_send_cm_sidr_req`.
    pub fn sidr_request(
        &mut self,
        now: Instant,
        service_id: u64,
        path: Path,
        private: &[u8],
    ) -> CmId {
        let id = self.alloc_id();
        let tid = self.new_tid();
        let mut private_data = [0u8; 216];
        let n = private.len().min(216);
        private_data[..n].copy_from_slice(&private[..n]);
        self.conns.insert(
            id,
            Conn {
                state: State::SidrReqSent,
                path,
                remote_id: 0,
                remote_qpn: 0,
                remote_psn: 0,
                local: ConnParam::default(),
                remote_rr: 0,
                remote_id_depth: 0,
                tid,
                last: None,
                deadline: None,
                wait: Duration::ZERO,
                retries_left: 0,
                sidr_service: service_id,
            },
        );
        self.send_timed(
            now,
            id,
            CmMsg::SidrReq(Box::new(SidrReq {
                request_id: id,
                partition_key: 0xffff,
                service_id,
                private_data,
            })),
        );
        id
    }

    /// Answer a SIDR request with our UD QP (`status` 0) and forget the id.
    pub fn sidr_accept(&mut self, id: CmId, qpn: u32, qkey: u32, private: &[u8]) -> bool {
        match self.conns.remove(&id) {
            Some(c) if c.state == State::SidrReqRcvd => {
                self.sidr_reply(&c, id, sidr_status::OK, qpn, qkey, private);
                true
            }
            Some(c) => {
                self.conns.insert(id, c);
                false
            }
            None => false,
        }
    }

    fn sidr_reply(&mut self, c: &Conn, _id: CmId, status: u8, qpn: u32, qkey: u32, private: &[u8]) {
        let mut private_data = [0u8; 136];
        let n = private.len().min(136);
        private_data[..n].copy_from_slice(&private[..n]);
        self.send(
            c.path.remote_gid,
            c.tid,
            CmMsg::SidrRep(Box::new(SidrRep {
                request_id: c.remote_id,
                status,
                additional_info_length: 0,
                qpn,
                service_id: c.sidr_service,
                qkey,
                additional_info: [0; 72],
                private_data,
            })),
        );
    }

    /// The QP attributes for `id` to reach `state` (1 INIT, 2 RTR, 3 RTS; IBV_QPS_*).
    pub fn qp_attr(&self, id: CmId) -> Option<QpParams> {
        let c = self.conns.get(&id)?;
        Some(QpParams {
            dest_qpn: c.remote_qpn,
            // The Starting PSN a side puts in its REQ or REP is the PSN it expects to
            // receive, as the kernel's CM reads it (cm.c: `ib_send_cm_req` and
            // `ib_send_cm_rep` keep their own message's Starting PSN as `rq_psn`;
            // `cm_req_handler` / `cm_rep_handler` take the peer's as `sq_psn`). Seen on
            // the wire against rxe: with the two swapped its first SEND is NAKed with a
            // PSN sequence error.
            rq_psn: c.local.psn,
            sq_psn: c.remote_psn,
            path_mtu: c.path.mtu,
            // cm.c `cm_init_qp_rtr_attr` / `cm_init_qp_rts_attr`: our own responder
            // resources and initiator depth (from the REQ we sent or the REP we sent).
            max_dest_rd_atomic: c.local.responder_resources,
            max_rd_atomic: c.local.initiator_depth,
            min_rnr_timer: 12,
            timeout: self.cfg.local_ack_timeout,
            retry_cnt: c.local.retry_count,
            rnr_retry: c.local.rnr_retry_count,
            path: c.path,
        })
    }

    /// The peer's initiator depth, from its REQ or REP.
    pub fn remote_initiator_depth(&self, id: CmId) -> Option<u8> {
        self.conns.get(&id).map(|c| c.remote_id_depth)
    }

    /// Resend what timed out; fail what ran out of retries; end timewaits.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<CmId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(k, _)| *k)
            .collect();
        for id in due {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.state == State::Timewait {
                self.conns.remove(&id);
                self.events.push_back(CmEvent::TimewaitExit { id });
                continue;
            }
            if c.retries_left == 0 {
                let state = c.state;
                match state {
                    State::DreqSent => {
                        self.events.push_back(CmEvent::DreqError { id });
                        self.enter_timewait(now, id);
                    }
                    _ => {
                        self.conns.remove(&id);
                        self.events.push_back(CmEvent::Unreachable { id });
                    }
                }
                continue;
            }
            c.retries_left -= 1;
            c.deadline = Some(now + c.wait);
            if let Some(mad) = c.last {
                let to = c.path.remote_gid;
                self.tx.push_back(Transmit { to, mad });
                self.counters.sent += 1;
                self.counters.resent += 1;
            }
        }
    }

    /// A MAD from the port with GID `from` arrived on QP1.
    pub fn handle_mad(&mut self, now: Instant, from: [u8; 16], local_gid: [u8; 16], buf: &[u8]) {
        let Ok(mad) = Mad::parse(buf) else {
            self.counters.dropped += 1;
            return;
        };
        self.counters.received += 1;
        match mad.msg {
            CmMsg::Req(r) => self.on_req(now, from, local_gid, mad.tid, r),
            CmMsg::Mra(m) => self.on_mra(now, &m),
            CmMsg::Rej(r) => self.on_rej(&r),
            CmMsg::Rep(r) => self.on_rep(r),
            CmMsg::Rtu(r) => self.on_rtu(&r),
            CmMsg::Dreq(r) => self.on_dreq(now, from, mad.tid, &r),
            CmMsg::Drep(r) => self.on_drep(now, &r),
            CmMsg::SidrReq(r) => self.on_sidr_req(from, local_gid, mad.tid, r),
            CmMsg::SidrRep(r) => self.on_sidr_rep(r),
            CmMsg::Unsupported {
                local_comm_id,
                remote_comm_id: _,
                ..
            } => {
                // LAP/APR (alternate paths): not served. cm.c would answer a LAP with an APR;
                // a REJ would tear the connection down, so count and drop.
                let _ = local_comm_id;
                self.counters.dropped += 1;
            }
        }
    }

    fn find_remote(&self, from: &[u8; 16], remote_id: u32) -> Option<CmId> {
        self.conns
            .iter()
            .find(|(_, c)| c.remote_id == remote_id && c.path.remote_gid == *from)
            .map(|(k, _)| *k)
    }

    fn on_req(&mut self, now: Instant, from: [u8; 16], local_gid: [u8; 16], tid: u64, r: Box<Req>) {
        if let Some(id) = self.find_remote(&from, r.local_comm_id) {
            // A duplicate (cm.c `cm_dup_req_handler`): MRA again while the consumer thinks,
            // a REJ "stale connection" in timewait, nothing otherwise.
            self.counters.duplicates += 1;
            match self.conns[&id].state {
                State::MraReqSent => self.send_mra(id),
                State::Timewait => {
                    let to = RejTo {
                        gid: from,
                        tid,
                        local: id,
                        remote: r.local_comm_id,
                        msg: MsgRef::Req,
                    };
                    self.send_rej(to, rej_reason::STALE_CONN, &[]);
                }
                _ => {}
            }
            return;
        }
        let Some(&listener) = self.listeners.get(&r.service_id) else {
            // cm.c `cm_match_req`: no listener → REJ "invalid service ID"; rdma_cm gives the
            // peer RDMA_CM_EVENT_REJECTED with status 8 (what rping prints for a port
            // nobody listens on).
            let to = RejTo {
                gid: from,
                tid,
                local: 0,
                remote: r.local_comm_id,
                msg: MsgRef::Req,
            };
            self.send_rej(to, rej_reason::INVALID_SERVICE_ID, &[]);
            return;
        };
        let id = self.alloc_id();
        let path = Path {
            local_gid,
            remote_gid: from,
            mtu: r.path_mtu,
            hop_limit: r.primary.hop_limit,
            traffic_class: r.primary.traffic_class,
            flow_label: r.primary.flow_label,
        };
        self.conns.insert(
            id,
            Conn {
                state: State::MraReqSent,
                path,
                remote_id: r.local_comm_id,
                remote_qpn: r.local_qpn,
                remote_psn: r.starting_psn,
                local: ConnParam {
                    retry_count: r.retry_count,
                    rnr_retry_count: r.rnr_retry_count,
                    ..ConnParam::default()
                },
                remote_rr: r.responder_resources,
                remote_id_depth: r.initiator_depth,
                tid,
                last: None,
                deadline: None,
                wait: Duration::ZERO,
                retries_left: 0,
                sidr_service: r.service_id,
            },
        );
        // cma.c `cma_ib_req_handler`: an MRA as soon as the request is handed up, so the
        // peer waits for the consumer's rdma_accept.
        self.send_mra(id);
        let _ = now;
        self.events.push_back(CmEvent::ConnectRequest {
            listener,
            id,
            from,
            req: r,
        });
    }

    fn send_mra(&mut self, id: CmId) {
        let Some(c) = self.conns.get(&id) else { return };
        let (to, tid, remote) = (c.path.remote_gid, c.tid, c.remote_id);
        self.send(
            to,
            tid,
            CmMsg::Mra(Box::new(Mra {
                local_comm_id: id,
                remote_comm_id: remote,
                message_mraed: MsgRef::Req,
                // cma.c CMA_CM_MRA_SETTING: service timeout 24 (~69 s).
                service_timeout: 24,
                private_data: [0; 222],
            })),
        );
    }

    fn on_mra(&mut self, now: Instant, m: &Mra) {
        let life = cm_time(self.cfg.packet_life_time);
        let Some(c) = self.conns.get_mut(&m.remote_comm_id) else {
            self.counters.dropped += 1;
            return;
        };
        if c.state == State::ReqSent && m.message_mraed == MsgRef::Req {
            c.state = State::MraReqRcvd;
            c.remote_id = m.local_comm_id;
            c.deadline = Some(now + life + cm_time(m.service_timeout));
        } else {
            self.counters.duplicates += 1;
        }
    }

    fn on_rej(&mut self, r: &Rej) {
        let Some(c) = self.conns.get(&r.remote_comm_id) else {
            self.counters.dropped += 1;
            return;
        };
        if !matches!(
            c.state,
            State::ReqSent
                | State::MraReqRcvd
                | State::RepSent
                | State::MraReqSent
                | State::ReqRcvd
        ) {
            self.counters.dropped += 1;
            return;
        }
        let id = r.remote_comm_id;
        self.conns.remove(&id);
        self.events.push_back(CmEvent::Rejected {
            id,
            reason: r.reason,
            private_data: r.private_data.to_vec(),
        });
    }

    fn on_rep(&mut self, r: Box<Rep>) {
        let Some(c) = self.conns.get_mut(&r.remote_comm_id) else {
            self.counters.dropped += 1;
            return;
        };
        let id = r.remote_comm_id;
        match c.state {
            State::ReqSent | State::MraReqRcvd if c.remote_qpn == 0 => {
                c.remote_id = r.local_comm_id;
                c.remote_qpn = r.local_qpn;
                c.remote_psn = r.starting_psn;
                c.remote_rr = r.responder_resources;
                c.remote_id_depth = r.initiator_depth;
                // cm.c `cm_rep_handler`: the active side's RNR retry count is the REP's.
                c.local.rnr_retry_count = r.rnr_retry_count;
                // Waiting for the consumer's RTU now (its QP moves); no more REQ resends.
                c.deadline = None;
                self.events
                    .push_back(CmEvent::ConnectResponse { id, rep: r });
            }
            State::Established => {
                // cm.c `cm_dup_rep_handler`: our RTU was lost; send it again.
                self.counters.duplicates += 1;
                if let Some(mad) = c.last {
                    let to = c.path.remote_gid;
                    self.tx.push_back(Transmit { to, mad });
                    self.counters.sent += 1;
                    self.counters.resent += 1;
                }
            }
            _ => self.counters.duplicates += 1,
        }
    }

    fn on_rtu(&mut self, r: &Rtu) {
        let Some(c) = self.conns.get_mut(&r.remote_comm_id) else {
            self.counters.dropped += 1;
            return;
        };
        if c.state == State::RepSent {
            c.state = State::Established;
            c.deadline = None;
            self.events.push_back(CmEvent::Established {
                id: r.remote_comm_id,
            });
        } else {
            self.counters.duplicates += 1;
        }
    }

    fn on_dreq(&mut self, now: Instant, from: [u8; 16], tid: u64, r: &Dreq) {
        let id = r.remote_comm_id;
        let Some(c) = self.conns.get_mut(&id) else {
            // cm.c answers a DREQ for an unknown id with a DREP (`cm_issue_drep`).
            self.counters.dropped += 1;
            self.send(
                from,
                tid,
                CmMsg::Drep(Box::new(Rtu {
                    local_comm_id: r.remote_comm_id,
                    remote_comm_id: r.local_comm_id,
                    private_data: [0; 224],
                })),
            );
            return;
        };
        match c.state {
            State::Established | State::RepSent => {
                c.state = State::DreqRcvd;
                c.tid = tid;
                c.deadline = None;
                self.events.push_back(CmEvent::Disconnected { id });
            }
            State::DreqSent => {
                // Both sides disconnect at once (IBTA §12.9.6): answer and go to timewait.
                c.tid = tid;
                self.send_drep(id);
                self.events.push_back(CmEvent::Disconnected { id });
                self.enter_timewait(now, id);
            }
            State::Timewait => {
                self.counters.duplicates += 1;
                c.tid = tid;
                self.send_drep(id);
            }
            _ => self.counters.duplicates += 1,
        }
    }

    fn on_drep(&mut self, now: Instant, r: &Rtu) {
        let id = r.remote_comm_id;
        match self.conns.get(&id).map(|c| c.state) {
            Some(State::DreqSent) => {
                self.events.push_back(CmEvent::Disconnected { id });
                self.enter_timewait(now, id);
            }
            Some(_) => self.counters.duplicates += 1,
            None => self.counters.dropped += 1,
        }
    }

    fn on_sidr_req(&mut self, from: [u8; 16], local_gid: [u8; 16], tid: u64, r: Box<SidrReq>) {
        if self.conns.values().any(|c| {
            c.state == State::SidrReqRcvd
                && c.remote_id == r.request_id
                && c.path.remote_gid == from
        }) {
            self.counters.duplicates += 1;
            return;
        }
        let Some(&listener) = self.listeners.get(&r.service_id) else {
            let c = Conn {
                state: State::SidrReqRcvd,
                path: Path {
                    remote_gid: from,
                    ..Path::default()
                },
                remote_id: r.request_id,
                remote_qpn: 0,
                remote_psn: 0,
                local: ConnParam::default(),
                remote_rr: 0,
                remote_id_depth: 0,
                tid,
                last: None,
                deadline: None,
                wait: Duration::ZERO,
                retries_left: 0,
                sidr_service: r.service_id,
            };
            self.sidr_reply(&c, 0, sidr_status::UNSUPPORTED, 0, 0, &[]);
            return;
        };
        let id = self.alloc_id();
        self.conns.insert(
            id,
            Conn {
                state: State::SidrReqRcvd,
                path: Path {
                    local_gid,
                    remote_gid: from,
                    ..Path::default()
                },
                remote_id: r.request_id,
                remote_qpn: 0,
                remote_psn: 0,
                local: ConnParam::default(),
                remote_rr: 0,
                remote_id_depth: 0,
                tid,
                last: None,
                deadline: None,
                wait: Duration::ZERO,
                retries_left: 0,
                sidr_service: r.service_id,
            },
        );
        self.events.push_back(CmEvent::SidrRequest {
            listener,
            id,
            from,
            req: r,
        });
    }

    fn on_sidr_rep(&mut self, r: Box<SidrRep>) {
        match self.conns.get(&r.request_id).map(|c| c.state) {
            Some(State::SidrReqSent) => {
                let id = r.request_id;
                self.conns.remove(&id);
                if r.status == sidr_status::OK {
                    self.events.push_back(CmEvent::SidrReply { id, rep: r });
                } else {
                    self.events.push_back(CmEvent::Rejected {
                        id,
                        reason: u16::from(r.status),
                        private_data: r.private_data.to_vec(),
                    });
                }
            }
            _ => self.counters.dropped += 1,
        }
    }
}
