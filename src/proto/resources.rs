//! Resource snapshots: what `rdma resource show qp|mr|cq` lists, from the engine's state.
//!
//! Contract: [`Rnic::resources`](super::Rnic::resources) copies the state of every QP, MR
//! and CQ at the time of the call (no references into the engine, serializable). The
//! `Display` helpers print one line per object in the style of iproute2's `rdma resource
//! show`, so the same formatting serves the simulator (`xrnic sim --res`) and live devices
//! (`xrnic res`, which reads these structures back from the driver's JSON snapshot). When
//! [`Resources::owner`] is set (live devices) every line ends with `pid P comm C`, as
//! iproute2 prints the process that owns the object.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::memory::MrInfo;
use super::qp::{QpState, QpType};

/// Every object of one device.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Resources {
    pub dev: String,
    pub qps: Vec<QpResource>,
    pub mrs: Vec<MrResource>,
    pub cqs: Vec<CqResource>,
    /// The process that owns the objects (a live device); `None` in the simulator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
}

/// The process of a live device, as `rdma resource show` names it (`pid`, `comm`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub pid: u32,
    /// The process name (`/proc/<pid>/comm`).
    pub comm: String,
}

/// One QP.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct QpResource {
    pub qpn: u32,
    /// "RC", "UC" or "UD", as `rdma resource show qp` prints `type` (snapshots written
    /// before the field existed are RC).
    #[serde(default = "rc_name")]
    pub qp_type: String,
    /// The shared receive queue the QP takes its receive WQEs from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub srq: Option<u32>,
    pub pd: u32,
    pub state: QpState,
    pub dest_qpn: u32,
    pub path_mtu: u32,
    /// The PSN the next new request gets.
    pub sq_psn: u32,
    /// The oldest PSN not acknowledged yet.
    pub una_psn: u32,
    /// The PSN the responder expects next.
    pub rq_psn: u32,
    /// Send WRs posted and not completed.
    pub sq_wrs: usize,
    /// Of those, the ones already on the wire.
    pub sq_started: usize,
    /// Receive WRs posted and not consumed.
    pub rq_wrs: usize,
    pub retry_left: u8,
    pub rnr_left: u8,
    pub rnr_wait_until_ns: Option<u64>,
    pub ack_deadline_ns: Option<u64>,
    pub packets_sent: u64,
    pub retransmitted_packets: u64,
}

/// One memory region; the engine owns (pins) its bytes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MrResource {
    pub lkey: u32,
    pub rkey: u32,
    pub pd: u32,
    pub addr: u64,
    pub pinned_bytes: usize,
    pub access: u32,
}

impl From<MrInfo> for MrResource {
    fn from(m: MrInfo) -> Self {
        MrResource {
            lkey: m.lkey.0,
            rkey: m.rkey.0,
            pd: m.pd.0,
            addr: m.addr,
            pinned_bytes: m.length,
            access: m.access.0,
        }
    }
}

/// One completion queue.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CqResource {
    pub cqn: u32,
    pub cqe: usize,
    /// QPs attached, counted once as send and once as receive CQ: ib_core's `usecnt`,
    /// which `rdma resource show cq` prints as `users`.
    #[serde(default)]
    pub users: u32,
    /// Completions waiting to be polled.
    pub queued: usize,
    pub overruns: u64,
}

fn rc_name() -> String {
    qp_type_name(QpType::Rc).to_string()
}

/// The `rdma resource show qp` spelling of a QP type.
pub fn qp_type_name(t: QpType) -> &'static str {
    match t {
        QpType::Rc => "RC",
        QpType::Uc => "UC",
        QpType::Ud => "UD",
    }
}

fn state_name(s: QpState) -> &'static str {
    match s {
        QpState::Reset => "RESET",
        QpState::Init => "INIT",
        QpState::Rtr => "RTR",
        QpState::Rts => "RTS",
        QpState::Sqd => "SQD",
        QpState::Sqe => "SQE",
        QpState::Err => "ERR",
    }
}

impl Resources {
    /// ` pid P comm C` when the owner is known, else nothing.
    fn owner_suffix(&self) -> String {
        self.owner
            .as_ref()
            .map(|o| format!(" pid {} comm {}", o.pid, o.comm))
            .unwrap_or_default()
    }

    /// `rdma resource show qp` lines.
    pub fn qp_lines(&self) -> String {
        let owner = self.owner_suffix();
        let mut o = String::new();
        for q in &self.qps {
            let _ = writeln!(
                o,
                "link {}/1 lqpn {} rqpn {} type {} state {} pdn {}{} mtu {} sq-psn {} una-psn {} rq-psn {} sq-wrs {} ({} on the wire) rq-wrs {} retry-left {} rnr-left {}{}{} sent {} retransmitted {}{owner}",
                self.dev,
                q.qpn,
                q.dest_qpn,
                q.qp_type,
                state_name(q.state),
                q.pd,
                q.srq.map(|n| format!(" srqn {n}")).unwrap_or_default(),
                q.path_mtu,
                q.sq_psn,
                q.una_psn,
                q.rq_psn,
                q.sq_wrs,
                q.sq_started,
                q.rq_wrs,
                q.retry_left,
                q.rnr_left,
                q.rnr_wait_until_ns
                    .map(|t| format!(" rnr-wait-until {t}ns"))
                    .unwrap_or_default(),
                q.ack_deadline_ns
                    .map(|t| format!(" ack-timer {t}ns"))
                    .unwrap_or_default(),
                q.packets_sent,
                q.retransmitted_packets,
            );
        }
        o
    }

    /// `rdma resource show mr` lines.
    pub fn mr_lines(&self) -> String {
        let owner = self.owner_suffix();
        let mut o = String::new();
        for m in &self.mrs {
            let _ = writeln!(
                o,
                "dev {} mrlen {} lkey 0x{:x} rkey 0x{:x} pdn {} iova 0x{:x} access 0x{:x} pinned {}{owner}",
                self.dev, m.pinned_bytes, m.lkey, m.rkey, m.pd, m.addr, m.access, m.pinned_bytes
            );
        }
        o
    }

    /// `rdma resource show cq` lines.
    pub fn cq_lines(&self) -> String {
        let owner = self.owner_suffix();
        let mut o = String::new();
        for c in &self.cqs {
            let _ = writeln!(
                o,
                "dev {} cqn {} cqe {} users {} queued {} overruns {}{owner}",
                self.dev, c.cqn, c.cqe, c.users, c.queued, c.overruns
            );
        }
        o
    }
}
