//! Shared receive queues (`struct ibv_srq`), UC QP creation and the device's async
//! events, on the software backend (see `crate::proto::srq` for the rules).
//!
//! A QP created on an SRQ ([`Pd::create_qp_ext`]) keeps the SRQ alive; the engine's
//! SRQ goes when the last [`Srq`] handle and the last such QP are gone, or at
//! [`Srq::destroy`], which fails (EBUSY) while a QP still uses it.

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
    inner: Arc<SrqInner>,
}

impl Pd {
    /// `ibv_create_srq` (software backend).
    pub fn create_srq(&self, attr: &SrqAttr) -> Result<Srq> {
        match &self.kind {
            PdKind::Soft(pd) => {
                let srq = pd.shared.lock().rnic.create_srq(pd.pd, attr)?;
                Ok(Srq {
                    inner: Arc::new(SrqInner {
                        pd: pd.clone(),
                        srq,
                        destroyed: AtomicBool::new(false),
                    }),
                })
            }
            PdKind::Verbs(_) => Err(Error::Unsupported {
                what: "shared receive queues",
                backend: Backend::Offload,
            }),
            PdKind::Svc(_) => Err(Error::Unsupported {
                what: "shared receive queues through the device service",
                backend: Backend::Software,
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
        let (PdKind::Soft(pd), CqKind::Soft(scq), CqKind::Soft(rcq)) =
            (&self.kind, &init.send_cq.kind, &init.recv_cq.kind)
        else {
            return match &self.kind {
                PdKind::Verbs(_) => Err(Error::Unsupported {
                    what: "UC QPs and SRQs",
                    backend: Backend::Offload,
                }),
                PdKind::Svc(_) => Err(Error::Unsupported {
                    what: "UC QPs and SRQs through the device service",
                    backend: Backend::Software,
                }),
                PdKind::Soft(_) => Err(Error::DeviceMismatch),
            };
        };
        if !Arc::ptr_eq(&pd.shared, &scq.shared)
            || !Arc::ptr_eq(&pd.shared, &rcq.shared)
            || srq.is_some_and(|s| !Arc::ptr_eq(&pd.shared, &s.inner.pd.shared))
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
            srq: srq.map(|s| s.inner.srq),
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
                _srq: srq.map(|s| s.inner.clone()),
            },
        })
    }
}

impl Srq {
    fn with<T>(&self, f: impl FnOnce(&mut proto::Rnic, proto::Srq) -> T) -> T {
        f(&mut self.inner.pd.shared.lock().rnic, self.inner.srq)
    }

    /// `ibv_post_srq_recv` (one work request).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        Ok(self.with(|r, s| r.post_srq_recv(s, wr))?)
    }

    /// `ibv_modify_srq`: resize and/or arm the limit.
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        Ok(self.with(|r, s| r.modify_srq(s, attr, mask))?)
    }

    /// `ibv_query_srq`.
    pub fn query(&self) -> Result<SrqAttr> {
        Ok(self.with(|r, s| r.query_srq(s))?)
    }

    /// Receive WQEs the SRQ holds now.
    pub fn len(&self) -> usize {
        self.with(|r, s| r.srq_len(s)).unwrap_or(0)
    }

    /// True when the SRQ holds no receive WQE.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The engine's number of this SRQ (what [`AsyncEvent::SrqLimitReached`] names).
    pub fn srq_num(&self) -> u32 {
        self.inner.srq.0
    }

    /// `ibv_destroy_srq`: fails with the engine's "still used" error (EBUSY in
    /// libibverbs) while a QP uses the SRQ; the SRQ stays usable then.
    pub fn destroy(self) -> Result<()> {
        self.with(|r, s| r.destroy_srq(s))?;
        self.inner.destroyed.store(true, Ordering::Relaxed);
        Ok(())
    }
}

impl super::Cq {
    /// The engine's handle of this CQ (what [`AsyncEvent::CqErr`] names): through the
    /// device service, the service's handle of it, which the forwarded CQ_ERR names
    /// (src/service/wire.rs `decode_event`); `None` on the offload backend.
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
