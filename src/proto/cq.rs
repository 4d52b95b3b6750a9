//! Completion queues and ibverbs-style work completions.
//!
//! Contract: a CQ is a bounded FIFO. Completions are pushed by the engine in the order the
//! work requests finish (per queue, in posting order, IBTA vol. 1 §10.8 work request ordering) and
//! popped by `poll_cq`. A push to a full CQ is an overrun: the completion is dropped and
//! `overruns` counts it (ibverbs reports IBV_EVENT_CQ_ERR; there is no event channel
//! here yet).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::wire::{Qpn, Rkey};

/// Work completion status, named and numbered as `enum ibv_wc_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocProtErr = 4,
    WrFlushErr = 5,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    GeneralErr = 21,
    // The rest of `enum ibv_wc_status`: the engine never produces these, a hardware
    // RNIC behind the offload backend (src/verbs/ibv) may.
    LocEecOpErr = 3,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    TmErr = 22,
    TmRndvIncomplete = 23,
}

impl WcStatus {
    /// The libibverbs `ibv_wc_status_str` spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::GeneralErr => "general error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::TmErr => "TM error",
            WcStatus::TmRndvIncomplete => "TM software rendezvous",
        }
    }

    /// Every status, in `enum ibv_wc_status` order.
    pub const ALL: [WcStatus; 24] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
        WcStatus::TmErr,
        WcStatus::TmRndvIncomplete,
    ];

    /// The status of an `enum ibv_wc_status` value; values past the enum (a newer
    /// libibverbs) are [`WcStatus::GeneralErr`].
    pub fn from_ibv(v: u32) -> WcStatus {
        WcStatus::ALL
            .into_iter()
            .find(|&s| s as u32 == v)
            .unwrap_or(WcStatus::GeneralErr)
    }
}

/// What finished, as `enum ibv_wc_opcode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    Recv,
    RecvRdmaWithImm,
}

/// One work completion (`struct ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred (RDMA READ, atomics: 8).
    pub byte_len: u32,
    /// Immediate data of SEND/WRITE with immediate, host order.
    pub imm_data: Option<u32>,
    /// The R_Key a SEND with invalidate invalidated.
    pub invalidated_rkey: Option<Rkey>,
    /// The local QP.
    pub qp_num: Qpn,
    /// The remote QP (the QP's destination QP for RC; the DETH source QP for UD).
    pub src_qp: Qpn,
    /// `IBV_WC_GRH`: the receive buffer starts with the 40-byte GRH (UD receives).
    pub grh: bool,
    /// The completion's `sl`. RoCE has no service level on the wire; for a UD receive
    /// it is what a ConnectX reports there (mlx5 CQE `flags_rqpn` bits 24-27, which its
    /// provider returns as `wc.sl`): bit 3 "the frame has a UDP header" and the L3
    /// header type, 1 IPv6 or 2 IPv4 ([`roce_v2_sl`]). IBTA A17.4.5.1 asks a RoCE v2 UD
    /// completion to say whether the frame was IPv4 or IPv6; UCX 1.11 to 1.17 (Debian 12
    /// has 1.13) read it from there and drop every UD datagram whose `sl` says
    /// otherwise, as on rxe, which reports 0. 0 for everything else.
    pub sl: u8,
}

/// The `sl` of a RoCE v2 UD receive completion (see [`WorkCompletion::sl`]).
pub fn roce_v2_sl(ipv6: bool) -> u8 {
    0x8 | if ipv6 { 0x1 } else { 0x2 }
}

/// A completion queue handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cq(pub(crate) u32);

#[derive(Debug)]
pub(crate) struct CompletionQueue {
    entries: VecDeque<WorkCompletion>,
    capacity: usize,
    pub(crate) overruns: u64,
    /// The device's count of completions added ([`crate::proto::Rnic::completions_added`]),
    /// shared by its CQs: bumped by every `push`, however the completion was made.
    added: Arc<AtomicU64>,
    /// How many completions wait (`entries.len()`), readable without the engine's lock:
    /// an empty `ibv_poll_cq` reads it instead of locking the engine
    /// ([`crate::proto::Rnic::cq_ready`]). Written only here, by `push` and `poll`.
    ready: Arc<AtomicUsize>,
}

impl CompletionQueue {
    pub(crate) fn new(capacity: usize, added: Arc<AtomicU64>) -> Self {
        CompletionQueue {
            entries: VecDeque::new(),
            capacity,
            overruns: 0,
            added,
            ready: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The lock-free count of waiting completions (see the field).
    pub(crate) fn ready(&self) -> Arc<AtomicUsize> {
        self.ready.clone()
    }

    /// Add a completion, or count an overrun when the CQ is full (false).
    pub(crate) fn push(&mut self, wc: WorkCompletion) -> bool {
        if self.entries.len() >= self.capacity {
            self.overruns += 1;
            false
        } else {
            self.entries.push_back(wc);
            // Release: a poller that reads the new count without the lock then takes
            // the lock and finds the entry (the lock orders the entry itself).
            self.ready.store(self.entries.len(), Ordering::Release);
            // Relaxed: the `Rnic` is used by one thread at a time (its owner's lock
            // orders the accesses); the atomic only lets the CQs share the count.
            self.added.fetch_add(1, Ordering::Relaxed);
            true
        }
    }

    /// A new capacity; fewer slots than completions waiting is refused (they stay).
    pub(crate) fn resize(&mut self, capacity: usize) -> Result<(), crate::proto::VerbsError> {
        if capacity < self.entries.len() {
            return Err(crate::proto::VerbsError::InvalidValue(
                "cqe below the completions queued",
            ));
        }
        self.capacity = capacity;
        Ok(())
    }

    /// Completions waiting to be polled, and the capacity.
    pub(crate) fn depth(&self) -> (usize, usize) {
        (self.entries.len(), self.capacity)
    }

    pub(crate) fn poll(&mut self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        let n = max.min(self.entries.len());
        out.extend(self.entries.drain(..n));
        self.ready.store(self.entries.len(), Ordering::Release);
        n
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_numbered_as_ibv_wc_status() {
        for (i, s) in WcStatus::ALL.into_iter().enumerate() {
            assert_eq!(s as usize, i, "{s:?}");
            assert_eq!(WcStatus::from_ibv(i as u32), s);
        }
        assert_eq!(WcStatus::from_ibv(99), WcStatus::GeneralErr);
    }

    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            qp_num: Qpn::new(1),
            src_qp: Qpn::new(2),
            grh: false,
            sl: 0,
        }
    }

    #[test]
    fn resize_keeps_the_queued_and_refuses_fewer_slots() {
        let mut q = CompletionQueue::new(2, Arc::new(AtomicU64::new(0)));
        assert!(q.push(wc(1)) && q.push(wc(2)));
        assert!(!q.push(wc(3)), "full at 2");
        assert!(q.resize(1).is_err(), "fewer slots than the 2 queued");
        assert_eq!(q.depth(), (2, 2), "a refused resize changes nothing");
        q.resize(4).unwrap();
        assert!(q.push(wc(4)) && q.push(wc(5)));
        assert!(!q.push(wc(6)), "full at 4");
        q.resize(4).unwrap();
        let mut out = Vec::new();
        assert_eq!(q.poll(&mut out, 8), 4);
        let ids: Vec<u64> = out.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, [1, 2, 4, 5], "in order across the resizes");
        q.resize(1).unwrap();
        assert_eq!(q.depth(), (0, 1));
    }

    #[test]
    fn fifo_bounded_with_overrun_count() {
        let added = Arc::new(AtomicU64::new(0));
        let mut cq = CompletionQueue::new(2, added.clone());
        let ready = cq.ready();
        for i in 0..3 {
            cq.push(wc(i));
        }
        assert_eq!(
            ready.load(Ordering::Acquire),
            2,
            "the lock-free count follows"
        );
        assert_eq!(cq.overruns, 1);
        assert_eq!(added.load(Ordering::Relaxed), 2, "an overrun adds nothing");
        let mut out = vec![];
        assert_eq!(cq.poll(&mut out, 10), 2);
        assert_eq!(out.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(cq.len(), 0);
        assert_eq!(ready.load(Ordering::Acquire), 0);
        assert_eq!(WcStatus::RnrRetryExcErr as u32, 13);
        assert_eq!(WcStatus::WrFlushErr.as_str(), "Work Request Flushed Error");
    }
}
