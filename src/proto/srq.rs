//! Shared receive queues (IBTA vol. 1 §10.2.9, `ibv_create_srq(3)`; rxe's `rxe_srq.c`
//! and `get_srq_wqe` in `rxe_resp.c`) and the device's asynchronous events.
//!
//! Contract: an SRQ holds receive WQEs posted with [`Rnic::post_srq_recv`] for any number
//! of QPs (RC or UC) created with `QpInitAttr::srq`. A QP takes one WQE from its SRQ
//! when a message that needs one arrives in sequence and the QP holds none
//! (`execute::take_srq_wqe`); that WQE then belongs to the QP (it completes on the QP's receive CQ,
//! or is flushed with the QP), exactly as rxe copies it into `qp->resp.srq_wqe`. An
//! empty SRQ makes an RC QP answer RNR NAK and a UC QP drop the message. The limit
//! (`srq_limit`, armed by [`Rnic::create_srq`] or [`Rnic::modify_srq`] with
//! [`SrqAttrMask::LIMIT`]): when taking a WQE leaves fewer than `srq_limit`, one
//! [`AsyncEvent::SrqLimitReached`] is queued and the limit disarmed (set to 0) until
//! armed again (IBTA §10.2.9.3; rxe `get_srq_wqe`). Events are read with
//! [`Rnic::poll_async_event`].
//!
//! This module holds the SRQ's state and the event type, below `qp` in the import order
//! (tests/layering.rs); the verbs are `impl Rnic` in `srq_verbs`, above `device`.
//!
//! [`Rnic::post_srq_recv`]: super::Rnic::post_srq_recv
//! [`Rnic::create_srq`]: super::Rnic::create_srq
//! [`Rnic::modify_srq`]: super::Rnic::modify_srq
//! [`Rnic::poll_async_event`]: super::Rnic::poll_async_event

use std::collections::VecDeque;

use super::cq::Cq;
use super::memory::Pd;
use super::responder::RecvWqe;
use crate::wire::Qpn;

/// A shared receive queue handle (`struct ibv_srq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Srq(pub u32);

/// SRQ attributes (`struct ibv_srq_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct SrqAttr {
    /// Most WQEs the SRQ holds.
    pub max_wr: u32,
    /// Most scatter/gather entries per WQE.
    pub max_sge: u32,
    /// The limit: 0 = disarmed.
    pub srq_limit: u32,
}

/// `enum ibv_srq_attr_mask`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct SrqAttrMask(pub u32);

impl SrqAttrMask {
    /// Resize (IBV_SRQ_MAX_WR).
    pub const MAX_WR: SrqAttrMask = SrqAttrMask(1);
    /// Arm the limit (IBV_SRQ_LIMIT).
    pub const LIMIT: SrqAttrMask = SrqAttrMask(2);
    pub const fn contains(self, o: SrqAttrMask) -> bool {
        self.0 & o.0 == o.0
    }
}

/// An asynchronous event (`struct ibv_async_event`), the ones this engine raises
/// (IBTA vol. 1 §11.6.3: affiliated events and errors). Errors that a work completion
/// reports (a requester's failed WR, a receive completed in error) raise none: the
/// completion is the report, as with rxe and mlx5.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// IBV_EVENT_SRQ_LIMIT_REACHED: the SRQ holds fewer WQEs than its armed limit.
    SrqLimitReached(Srq),
    /// IBV_EVENT_COMM_EST: the first packet arrived on an RC or UC QP in RTR (§11.6.3.1
    /// "Communication Established"); once per RTR.
    CommEst(Qpn),
    /// IBV_EVENT_QP_LAST_WQE_REACHED: a QP on an SRQ entered ERR (by modify or by an
    /// error): it takes no more WQEs from the SRQ (§10.2.9.5, §11.6.3.1).
    QpLastWqeReached(Qpn),
    /// IBV_EVENT_QP_FATAL: the responder QP goes to ERR after a class A error it
    /// answered with a Remote Operational Error NAK (§9.9.3.1.1; "Local Work Queue
    /// Catastrophic Error", §11.6.3.1).
    QpFatal(Qpn),
    /// IBV_EVENT_QP_REQ_ERR: the responder QP goes to ERR after an invalid request it
    /// answered with an Invalid Request NAK ("Invalid Request Local Work Queue Error").
    QpReqErr(Qpn),
    /// IBV_EVENT_QP_ACCESS_ERR: the responder QP goes to ERR after an access violation
    /// it answered with a Remote Access Error NAK ("Local Access Violation Work Queue
    /// Error").
    QpAccessErr(Qpn),
    /// IBV_EVENT_CQ_ERR: a completion found its CQ full and was dropped (CQ overrun,
    /// §11.6.3.1 "CQ Error"; rxe `rxe_cq_post`).
    CqErr(Cq),
    /// IBV_EVENT_SQ_DRAINED: a QP moved from RTS to SQD and every message it had started
    /// has completed (§11.6.3.1 "Send Queue Drained"; §10.3.1 SQD: no new message
    /// starts). Raised once per entry into SQD, also when nothing was outstanding, as
    /// rxe raises it from its completer whether or not `en_sqd_async_notify` was set.
    SqDrained(Qpn),
    /// IBV_EVENT_PORT_ACTIVE: the port (number given) became ACTIVE: its interface's
    /// link came up (§11.6.3.2, an unaffiliated event; raised from outside the engine,
    /// src/verbs/link_watch.rs).
    PortActive(u8),
    /// IBV_EVENT_PORT_ERR: the port left ACTIVE: its interface's link went down.
    PortErr(u8),
    /// IBV_EVENT_DEVICE_FATAL: the device is gone (its interface was deleted), raised
    /// once by [`Rnic::device_fatal`](super::Rnic::device_fatal) (§11.6.3.2, an
    /// unaffiliated event; the kernel's uverbs sends it when a device is unregistered,
    /// `ib_uverbs_free_hw_resources`).
    DeviceFatal,
}

/// Most asynchronous events a device holds unread (`Ctx::raise`).
pub const MAX_ASYNC_EVENTS: usize = 1024;

/// Largest `max_sge` of an SRQ (rxe's `RXE_MAX_SRQ_SGE` is 27; ibv_devinfo `max_srq_sge`).
pub const MAX_SRQ_SGE: u32 = 27;

/// The engine's state of one SRQ.
#[derive(Debug)]
pub(crate) struct SharedRq {
    pub pd: Pd,
    pub rq: VecDeque<RecvWqe>,
    pub max_wr: u32,
    pub max_sge: u32,
    pub limit: u32,
}
