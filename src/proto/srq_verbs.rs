//! The verbs of shared receive queues and asynchronous events on [`Rnic`]
//! (`ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`, `ibv_destroy_srq`,
//! `ibv_post_srq_recv`, `ibv_get_async_event`): what they check and what they change in
//! the device's SRQ table (the SRQ's state and rules: [`super::srq`]). Above `device` in
//! the import order (tests/layering.rs): the device calls none of them.

use std::collections::VecDeque;

use crate::wire::Qpn;

use super::device::Rnic;
use super::memory::{Access, Pd, resolve_sges};
use super::qp::{QpType, VerbsError};
use super::responder::RecvWqe;
use super::srq::{AsyncEvent, MAX_SRQ_SGE, SharedRq, Srq, SrqAttr, SrqAttrMask};
use super::wr::RecvWr;

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
            return Err(VerbsError::InUse("shared receive queue still used by a QP"));
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
    pub fn qp_type(&self, qpn: Qpn) -> Option<QpType> {
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
