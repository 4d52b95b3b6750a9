//! Shared receive queues (`struct ibv_srq`), UC QP creation and the device's async
//! events, on the software backend (see `crate::proto::srq` for the rules).
//!
//! A QP created on an SRQ ([`Pd::create_qp_ext`]) keeps the SRQ alive; the engine's
//! SRQ goes when the last [`Srq`] handle and the last such QP are gone, or at
//! [`Srq::destroy`], which fails (EBUSY) while a QP still uses it. Through the device
//! service the same holds, the service keeping the SRQ (src/service/objects.rs) and
//! [`Srq::post_recv`] going through the submission ring.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Backend, CqKind, Device, Error, Pd, PdInner, PdKind, Qp, QpInitAttr, QpKind, Result};
use crate::proto::{self, AsyncEvent, QpType, RecvWr, SrqAttr, SrqAttrMask};

#[derive(Debug)]
pub(super) struct SrqInner {
    pd: Arc<PdInner>,
    srq: proto::Srq,
    destroyed: AtomicBool,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        if !self.destroyed.load(Ordering::Relaxed) {
            // Every QP on this SRQ holds this SrqInner: none is left, this succeeds.
            if let Err(e) = self.pd.shared.lock().rnic.destroy_srq(self.srq) {
                tracing::error!("destroy_srq: {e}");
            }
        }
    }
}

/// A shared receive queue (`struct ibv_srq`).
#[derive(Clone, Debug)]
pub struct Srq {
    kind: SrqKind,
}

#[derive(Clone, Debug)]
enum SrqKind {
    Soft(Arc<SrqInner>),
    Svc(Arc<super::remote::RemoteSrq>),
}

impl Pd {
    /// `ibv_create_srq` (software backend).
    pub fn create_srq(&self, attr: &SrqAttr) -> Result<Srq> {
        match &self.kind {
            PdKind::Soft(pd) => {
                let srq = pd.shared.lock().rnic.create_srq(pd.pd, attr)?;
                Ok(Srq {
                    kind: SrqKind::Soft(Arc::new(SrqInner {
                        pd: pd.clone(),
                        srq,
                        destroyed: AtomicBool::new(false),
                    })),
                })
            }
            PdKind::Svc(pd) => Ok(Srq {
                kind: SrqKind::Svc(Arc::new(super::remote::RemoteSrq::create(pd, attr)?)),
            }),
            PdKind::Verbs(_) => Err(Error::Unsupported {
                what: "shared receive queues",
                backend: Backend::Offload,
            }),
        }
    }

    /// `ibv_create_qp` with a QP type (RC or UC) and, optionally, an SRQ its receive
    /// WQEs come from (`ibv_qp_init_attr.qp_type` and `.srq`).
    pub fn create_qp_ext(
        &self,
        init: &QpInitAttr<'_>,
        qp_type: QpType,
        srq: Option<&Srq>,
    ) -> Result<Qp> {
        if qp_type == QpType::Rc && srq.is_none() {
            return self.create_qp(init);
        }
        if let (PdKind::Svc(pd), CqKind::Svc(scq), CqKind::Svc(rcq)) =
            (&self.kind, &init.send_cq.kind, &init.recv_cq.kind)
        {
            let srq = match srq.map(|s| &s.kind) {
                None => None,
                Some(SrqKind::Svc(s)) => Some(s),
                Some(SrqKind::Soft(_)) => return Err(Error::DeviceMismatch),
            };
            return super::remote::create_qp(&self.dev, pd, [scq, rcq], init, qp_type, srq);
        }
        let srq = match srq.map(|s| &s.kind) {
            None => None,
            Some(SrqKind::Soft(s)) => Some(s),
            Some(SrqKind::Svc(_)) => return Err(Error::DeviceMismatch),
        };
        let (PdKind::Soft(pd), CqKind::Soft(scq), CqKind::Soft(rcq)) =
            (&self.kind, &init.send_cq.kind, &init.recv_cq.kind)
        else {
            return match &self.kind {
                PdKind::Verbs(_) => Err(Error::Unsupported {
                    what: "UC QPs and SRQs",
                    backend: Backend::Offload,
                }),
                PdKind::Svc(_) | PdKind::Soft(_) => Err(Error::DeviceMismatch),
            };
        };
        if !Arc::ptr_eq(&pd.shared, &scq.shared)
            || !Arc::ptr_eq(&pd.shared, &rcq.shared)
            || srq.is_some_and(|s| !Arc::ptr_eq(&pd.shared, &s.pd.shared))
        {
            return Err(Error::DeviceMismatch);
        }
        let attr = proto::QpInitAttr {
            send_cq: scq.cq,
            recv_cq: rcq.cq,
            max_send_wr: init.max_send_wr,
            max_recv_wr: init.max_recv_wr,
            sq_sig_all: init.sq_sig_all,
            qp_type,
            srq: srq.map(|s| s.srq),
        };
        let qpn = {
            let mut g = pd.shared.lock();
            let q = g.rnic.create_qp(pd.pd, &attr)?;
            g.qps.insert(q, ());
            q
        };
        Ok(Qp {
            qpn,
            dev: self.dev.clone(),
            kind: QpKind::Soft {
                pd: pd.clone(),
                _cqs: [scq.clone(), rcq.clone()],
                _srq: srq.cloned(),
            },
        })
    }
}

impl Srq {
    fn with<T>(i: &SrqInner, f: impl FnOnce(&mut proto::Rnic, proto::Srq) -> T) -> T {
        f(&mut i.pd.shared.lock().rnic, i.srq)
    }

    /// `ibv_post_srq_recv` (one work request). Through the device service the post goes
    /// through the ring and returns once the service has put it in the SRQ, or failed
    /// as here when the SRQ is full (src/verbs/remote.rs `post_srq_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        match &self.kind {
            SrqKind::Soft(i) => Ok(Self::with(i, |r, s| r.post_srq_recv(s, wr))?),
            SrqKind::Svc(s) => s.post_recv(&wr),
        }
    }

    /// `ibv_modify_srq`: resize and/or arm the limit.
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        match &self.kind {
            SrqKind::Soft(i) => Ok(Self::with(i, |r, s| r.modify_srq(s, attr, mask))?),
            SrqKind::Svc(s) => s.modify(attr, mask.0),
        }
    }

    /// `ibv_query_srq`.
    pub fn query(&self) -> Result<SrqAttr> {
        match &self.kind {
            SrqKind::Soft(i) => Ok(Self::with(i, |r, s| r.query_srq(s))?),
            SrqKind::Svc(s) => Ok(s.query()?.0),
        }
    }

    /// Receive WQEs the SRQ holds now.
    pub fn len(&self) -> usize {
        match &self.kind {
            SrqKind::Soft(i) => Self::with(i, |r, s| r.srq_len(s)).unwrap_or(0),
            SrqKind::Svc(s) => s.query().map_or(0, |q| q.1),
        }
    }

    /// True when the SRQ holds no receive WQE.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The engine's number of this SRQ (what [`AsyncEvent::SrqLimitReached`] names);
    /// through the device service, the service's handle of it, which the forwarded
    /// event names (src/ipc/event.rs `decode_event`).
    pub fn srq_num(&self) -> u32 {
        match &self.kind {
            SrqKind::Soft(i) => i.srq.0,
            SrqKind::Svc(s) => s.id,
        }
    }

    /// `ibv_destroy_srq`: fails with the engine's "still used" error (EBUSY in
    /// libibverbs) while a QP uses the SRQ; the SRQ stays usable then.
    pub fn destroy(self) -> Result<()> {
        match &self.kind {
            SrqKind::Soft(i) => {
                Self::with(i, |r, s| r.destroy_srq(s))?;
                i.destroyed.store(true, Ordering::Relaxed);
            }
            SrqKind::Svc(s) => s.destroy()?,
        }
        Ok(())
    }
}

impl super::Cq {
    /// The engine's handle of this CQ (what [`AsyncEvent::CqErr`] names): through the
    /// device service, the service's handle of it, which the forwarded CQ_ERR names
    /// (src/ipc/event.rs `decode_event`); `None` on the offload backend.
    pub fn engine_cq(&self) -> Option<proto::Cq> {
        match &self.kind {
            super::CqKind::Soft(c) => Some(c.cq),
            super::CqKind::Svc(c) => Some(proto::Cq(c.id)),
            _ => None,
        }
    }
}

impl Device {
    /// The next asynchronous event (`ibv_get_async_event` without blocking), oldest
    /// first; `None` when there is none (and on the offload backend, whose events
    /// libibverbs delivers on its own async fd).
    #[must_use]
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        if let super::DevBackend::Svc { conn, .. } = &self.inner.backend {
            return conn.poll_event();
        }
        self.inner.soft()?.lock().rnic.poll_async_event()
    }
}
