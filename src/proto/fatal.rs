//! The device going away (IBV_EVENT_DEVICE_FATAL): what the engine does when its
//! interface is deleted. The kernel's uverbs does the same for a device unregistered
//! under a running program (uverbs_main.c `ib_uverbs_free_hw_resources`): one
//! DEVICE_FATAL on the async queue, and from then on every verb that needs the device
//! fails (EIO in libibverbs). Unlike a hardware device, whose queues simply stop, the
//! engine still holds the work requests: every QP moves to ERR and its outstanding WRs
//! complete with IBV_WC_WR_FLUSH_ERR (IBTA vol. 1 §10.3.1 ERR state, §11.6.3.2
//! unaffiliated events), so a program blocked on a CQ sees them. Destroys, deregisters
//! and polls keep working, so that the program can clean up.

use super::device::Rnic;
use crate::proto::qp::{QpState, VerbsError};
use crate::proto::srq::{AsyncEvent, MAX_ASYNC_EVENTS};

impl Rnic {
    /// The device is gone: every QP to ERR (its WRs flushed), IBV_EVENT_DEVICE_FATAL
    /// raised, and verbs that need the device refused from now on
    /// ([`VerbsError::DeviceFatal`]). Only the first call does anything.
    pub fn device_fatal(&mut self) {
        if self.fatal {
            return;
        }
        self.fatal = true;
        let now = self.last_now;
        for i in 0..self.qps.len() {
            if let Some((qp, mut ctx)) = self.split_slot(i, now) {
                if qp.state != QpState::Err {
                    qp.enter_error(&mut ctx);
                }
            }
            self.touch(i);
        }
        // Always queued (past the cap if need be): the one event that tells the owner.
        if self.async_events.len() >= MAX_ASYNC_EVENTS {
            self.async_events.pop_front();
        }
        self.async_events.push_back(AsyncEvent::DeviceFatal);
    }

    /// Whether [`Rnic::device_fatal`] was called.
    pub fn is_fatal(&self) -> bool {
        self.fatal
    }

    /// `Err(DeviceFatal)` once the device is gone: the first check of each verb that
    /// needs the device.
    pub(in crate::proto) fn alive(&self) -> Result<(), VerbsError> {
        if self.fatal {
            Err(VerbsError::DeviceFatal)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::proto::{
        Access, AsyncEvent, AttrMask, QpAttr, QpInitAttr, QpState, QpType, RecvWr, SendWr, Sge,
        SrqAttr, VerbsError, WcStatus, WrOpcode,
    };
    use crate::sim::{ConnectOpts, LinkConfig, Pair};

    #[test]
    fn a_fatal_device_flushes_every_qp_raises_one_event_and_refuses_verbs() {
        let mut p = Pair::new(LinkConfig::default(), 1);
        let c = p.connect(&ConnectOpts::default()).unwrap();
        let mr = p.a.reg_mr(c.pd_a, 4096, Access::LOCAL_WRITE).unwrap();
        let sge = Sge {
            addr: mr.addr,
            length: 64,
            lkey: mr.lkey,
        };
        for id in 1..=3 {
            p.a.post_recv(
                c.qp_a,
                RecvWr {
                    wr_id: id,
                    sg_list: vec![sge],
                },
            )
            .unwrap();
        }
        // A QP still in RESET holds nothing, and goes to ERR too.
        let init = QpInitAttr {
            send_cq: c.cq_a,
            recv_cq: c.cq_a,
            max_send_wr: 16,
            max_recv_wr: 16,
            sq_sig_all: false,
            qp_type: QpType::Rc,
            srq: None,
        };
        let idle = p.a.create_qp(c.pd_a, &init).unwrap();
        while p.a.poll_async_event().is_some() {}
        p.a.device_fatal();
        p.a.device_fatal();
        let mut out = Vec::new();
        p.a.poll_cq(c.cq_a, 16, &mut out);
        let ids: Vec<u64> = out.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, [1, 2, 3]);
        assert!(
            out.iter().all(|w| w.status == WcStatus::WrFlushErr),
            "{out:?}"
        );
        assert_eq!(p.a.query_qp(c.qp_a).unwrap().qp_state, QpState::Err);
        assert_eq!(p.a.query_qp(idle).unwrap().qp_state, QpState::Err);
        assert_eq!(p.a.poll_async_event(), Some(AsyncEvent::DeviceFatal));
        assert_eq!(p.a.poll_async_event(), None, "raised once");
        assert!(p.a.is_fatal());
        // Verbs that need the device fail; nothing is queued by them.
        let mut wr = SendWr::new(9, WrOpcode::Send);
        wr.sg_list = vec![sge];
        assert_eq!(p.a.post_send(c.qp_a, wr), Err(VerbsError::DeviceFatal));
        let r = RecvWr {
            wr_id: 9,
            sg_list: vec![sge],
        };
        assert_eq!(p.a.post_recv(c.qp_a, r), Err(VerbsError::DeviceFatal));
        assert_eq!(
            p.a.reg_mr(c.pd_a, 64, Access::LOCAL_WRITE).err(),
            Some(VerbsError::DeviceFatal)
        );
        assert_eq!(
            p.a.create_qp(c.pd_a, &init).err(),
            Some(VerbsError::DeviceFatal)
        );
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..QpAttr::default()
        };
        assert_eq!(
            p.a.modify_qp(c.qp_a, &reset, AttrMask::STATE),
            Err(VerbsError::DeviceFatal)
        );
        assert_eq!(
            p.a.create_srq(
                c.pd_a,
                &SrqAttr {
                    max_wr: 4,
                    max_sge: 1,
                    srq_limit: 0
                }
            )
            .err(),
            Some(VerbsError::DeviceFatal)
        );
        out.clear();
        assert_eq!(p.a.poll_cq(c.cq_a, 16, &mut out), 0);
        // Clean-up still works.
        p.a.destroy_qp(idle).unwrap();
        p.a.destroy_qp(c.qp_a).unwrap();
        p.a.dereg_mr(mr.lkey).unwrap();
        p.a.destroy_cq(c.cq_a).unwrap();
        p.a.dealloc_pd(c.pd_a).unwrap();
        // The other side is untouched.
        assert!(!p.b.is_fatal());
    }
}
