//! Shared receive queues (IBTA vol. 1 §10.2.9, `ibv_create_srq(3)`; rxe's `rxe_srq.c`
//! and `get_srq_wqe` in `rxe_resp.c`) and the device's asynchronous events.
//!
//! Contract: an SRQ holds receive WQEs posted with [`Rnic::post_srq_recv`] for any number
//! of QPs (RC or UC) created with `QpInitAttr::srq`. A QP takes one WQE from its SRQ
//! when a message that needs one arrives in sequence and the QP holds none
//! (`take_wqe`); that WQE then belongs to the QP (it completes on the QP's receive CQ,
//! or is flushed with the QP), exactly as rxe copies it into `qp->resp.srq_wqe`. An
//! empty SRQ makes an RC QP answer RNR NAK and a UC QP drop the message. The limit
//! (`srq_limit`, armed by [`Rnic::create_srq`] or [`Rnic::modify_srq`] with
//! [`SrqAttrMask::LIMIT`]): when taking a WQE leaves fewer than `srq_limit`, one
//! [`AsyncEvent::SrqLimitReached`] is queued and the limit disarmed (set to 0) until
//! armed again (IBTA §10.2.9.3; rxe `get_srq_wqe`). Events are read with
//! [`Rnic::poll_async_event`].

use std::collections::VecDeque;

use super::Ctx;
use super::cq::Cq;
use super::device::Rnic;
use super::memory::resolve_sges;
use super::memory::{Access, Pd};
use super::qp::{Qp, QpState, VerbsError};
use super::responder::RecvWqe;
use super::trace::qp_event;
use super::wr::RecvWr;
use crate::wire::Qpn;

/// A shared receive queue handle (`struct ibv_srq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Srq(pub u32);

/// SRQ attributes (`struct ibv_srq_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Most WQEs the SRQ holds.
    pub max_wr: u32,
    /// Most scatter/gather entries per WQE.
    pub max_sge: u32,
    /// The limit: 0 = disarmed.
    pub srq_limit: u32,
}

/// `enum ibv_srq_attr_mask`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
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

/// Give `qp` a receive WQE from its SRQ when it uses one and holds none: called by the
/// responder right before it needs a WQE for an in-sequence message (rxe
/// `check_resource` → `get_srq_wqe`). Raises the limit event when due.
pub(crate) fn take_wqe(qp: &mut Qp, ctx: &mut Ctx<'_>) {
    let Some(srq) = qp.init.srq else { return };
    if !qp.resp.rq.is_empty() {
        return;
    }
    let Some(Some(s)) = ctx.srqs.get_mut(srq.0 as usize) else {
        return;
    };
    let Some(wqe) = s.rq.pop_front() else { return };
    qp_event!(
        ctx.now,
        ctx.dev,
        qp.qpn,
        "srq_wqe_taken",
        srq = srq.0,
        wr_id = wqe.wr_id,
        left = s.rq.len()
    );
    qp.resp.rq.push_back(wqe);
    if s.limit > 0 && (s.rq.len() as u32) < s.limit {
        s.limit = 0;
        ctx.raise(AsyncEvent::SrqLimitReached(srq));
    }
}

impl Rnic {
    /// `ibv_create_srq`: `attr.srq_limit` non-zero arms the limit at once.
    pub fn create_srq(&mut self, pd: Pd, attr: &SrqAttr) -> Result<Srq, VerbsError> {
        self.alive()?;
        if !self.mem.pd_exists(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        check_sizes(attr.max_wr, attr.max_sge, self.cfg.max_qp_wr)?;
        if attr.srq_limit > attr.max_wr {
            return Err(VerbsError::InvalidValue("srq_limit above max_wr"));
        }
        let s = SharedRq {
            pd,
            rq: VecDeque::new(),
            max_wr: attr.max_wr,
            max_sge: attr.max_sge.max(1),
            limit: attr.srq_limit,
        };
        // Numbers are never reused: a stale handle (or an event about a destroyed SRQ)
        // can never name a newer SRQ.
        self.srqs.push(Some(s));
        Ok(Srq(self.srqs.len() as u32 - 1))
    }

    fn srq_mut(&mut self, srq: Srq) -> Result<&mut SharedRq, VerbsError> {
        match self.srqs.get_mut(srq.0 as usize) {
            Some(Some(s)) => Ok(s),
            _ => Err(VerbsError::NotFound("shared receive queue")),
        }
    }

    /// `ibv_modify_srq`: resize ([`SrqAttrMask::MAX_WR`], not below the WQEs it holds)
    /// and/or arm the limit ([`SrqAttrMask::LIMIT`], at most `max_wr`), as rxe
    /// `rxe_srq_chk_attr` checks them.
    pub fn modify_srq(
        &mut self,
        srq: Srq,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), VerbsError> {
        let max_qp_wr = self.cfg.max_qp_wr;
        let s = self.srq_mut(srq)?;
        if mask.0 & !(SrqAttrMask::MAX_WR.0 | SrqAttrMask::LIMIT.0) != 0 {
            return Err(VerbsError::InvalidValue("unknown SRQ attribute mask bit"));
        }
        let max_wr = if mask.contains(SrqAttrMask::MAX_WR) {
            check_sizes(attr.max_wr, s.max_sge, max_qp_wr)?;
            if (attr.max_wr as usize) < s.rq.len() {
                return Err(VerbsError::InvalidValue(
                    "max_wr below the WQEs the SRQ holds",
                ));
            }
            attr.max_wr
        } else {
            s.max_wr
        };
        if mask.contains(SrqAttrMask::LIMIT) && attr.srq_limit > max_wr {
            return Err(VerbsError::InvalidValue("srq_limit above max_wr"));
        }
        s.max_wr = max_wr;
        if mask.contains(SrqAttrMask::LIMIT) {
            s.limit = attr.srq_limit;
        }
        Ok(())
    }

    /// `ibv_query_srq`.
    pub fn query_srq(&self, srq: Srq) -> Result<SrqAttr, VerbsError> {
        match self.srqs.get(srq.0 as usize) {
            Some(Some(s)) => Ok(SrqAttr {
                max_wr: s.max_wr,
                max_sge: s.max_sge,
                srq_limit: s.limit,
            }),
            _ => Err(VerbsError::NotFound("shared receive queue")),
        }
    }

    /// Receive WQEs the SRQ holds now (`None`: no such SRQ).
    pub fn srq_len(&self, srq: Srq) -> Option<usize> {
        match self.srqs.get(srq.0 as usize) {
            Some(Some(s)) => Some(s.rq.len()),
            _ => None,
        }
    }

    /// `ibv_destroy_srq`: refused (EBUSY) while a QP uses it. Its WQEs vanish without
    /// completions, as with any destroyed queue.
    pub fn destroy_srq(&mut self, srq: Srq) -> Result<(), VerbsError> {
        self.srq_mut(srq)?;
        if self.qps.iter().flatten().any(|q| q.init.srq == Some(srq)) {
            return Err(VerbsError::Resource(
                "shared receive queue still used by a QP",
            ));
        }
        self.srqs[srq.0 as usize] = None;
        Ok(())
    }

    /// `ibv_post_srq_recv` (one work request): checked like `post_recv` (local keys
    /// resolved against the SRQ's PD; a bad one completes in error when a QP uses it).
    pub fn post_srq_recv(&mut self, srq: Srq, wr: RecvWr) -> Result<(), VerbsError> {
        self.alive()?;
        let i = srq.0 as usize;
        let (pd, max_wr, max_sge, len) = {
            let s = self.srq_mut(srq)?;
            (s.pd, s.max_wr, s.max_sge, s.rq.len())
        };
        if len >= max_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        if wr.sg_list.len() > max_sge as usize {
            return Err(VerbsError::InvalidValue("more SGEs than the SRQ's max_sge"));
        }
        let total = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        let segs = resolve_sges(&self.mem, pd, &wr.sg_list, Access::LOCAL_WRITE);
        if let Some(Some(s)) = self.srqs.get_mut(i) {
            s.rq.push_back(RecvWqe {
                wr_id: wr.wr_id,
                segs,
                len: total,
            });
        }
        Ok(())
    }

    /// The type of QP `qpn` (`None`: no such QP).
    pub fn qp_type(&self, qpn: crate::wire::Qpn) -> Option<super::qp::QpType> {
        self.qps
            .iter()
            .flatten()
            .find(|q| q.qpn == qpn)
            .map(|q| q.init.qp_type)
    }

    /// The next asynchronous event (`ibv_get_async_event`), oldest first.
    #[must_use = "a drained event is gone"]
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.async_events.pop_front()
    }

    /// Asynchronous events waiting to be read ([`Rnic::poll_async_event`]).
    pub fn async_events_len(&self) -> usize {
        self.async_events.len()
    }

    /// Checks of `create_qp` for a QP on an SRQ: the SRQ exists and shares the QP's PD
    /// (IBTA §10.2.9.1: a QP and its SRQ are in one protection domain).
    pub(super) fn check_qp_srq(&self, pd: Pd, srq: Option<Srq>) -> Result<(), VerbsError> {
        let Some(srq) = srq else { return Ok(()) };
        match self.srqs.get(srq.0 as usize) {
            Some(Some(s)) if s.pd == pd => Ok(()),
            Some(Some(_)) => Err(VerbsError::InvalidValue(
                "the SRQ belongs to another protection domain",
            )),
            _ => Err(VerbsError::NotFound("shared receive queue")),
        }
    }

    /// True when the PD still has an SRQ (`dealloc_pd` refuses then).
    pub(super) fn pd_has_srq(&self, pd: Pd) -> bool {
        self.srqs.iter().flatten().any(|s| s.pd == pd)
    }
}

/// `post_recv` on a QP that takes its WQEs from an SRQ: EINVAL, as rxe `rxe_post_recv`.
pub(super) fn refuse_post_recv(qp: &Qp) -> Result<(), VerbsError> {
    if qp.init.srq.is_some() {
        return Err(VerbsError::InvalidValue(
            "post_recv on a QP created with an SRQ (post to the SRQ)",
        ));
    }
    if qp.state == QpState::Reset {
        return Err(VerbsError::WrongState(QpState::Reset));
    }
    Ok(())
}

fn check_sizes(max_wr: u32, max_sge: u32, max_qp_wr: u32) -> Result<(), VerbsError> {
    if max_wr == 0 || max_wr > max_qp_wr {
        return Err(VerbsError::InvalidValue(
            "SRQ max_wr must be 1..=max_srq_wr",
        ));
    }
    if max_sge > MAX_SRQ_SGE {
        return Err(VerbsError::InvalidValue("SRQ max_sge above max_srq_sge"));
    }
    Ok(())
}
