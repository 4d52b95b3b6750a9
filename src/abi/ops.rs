//! The ops tables of a context: the data-path ops of `ibv_context.ops` that programs call
//! inline (verbs.h: `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_post_send`,
//! `ibv_post_recv`, `ibv_post_srq_recv`), and [`OPS`], the destroy verbs through which
//! closing a context reaches its objects (crate::context `Ops`, as a provider fills
//! libibverbs/driver.h's `verbs_context_ops`). Every slot a program may call is set: an op
//! xrnic lacks returns its documented error instead of jumping to NULL.

use crate::context::Ops;
use crate::types::*;
use crate::{ah, cq, mr, qp, srq};

/// Fill the ops of a new context.
pub fn install(ops: &mut ibv_context_ops) {
    ops.poll_cq = Some(cq::poll_cq);
    ops.req_notify_cq = Some(cq::req_notify_cq);
    ops.post_send = Some(qp::post_send);
    ops.post_recv = Some(qp::post_recv);
    ops.post_srq_recv = Some(srq::post_srq_recv);
}

/// Fill the extended ops of a new context (`verbs_context`, reached by verbs.h's inline
/// `ibv_create_qp_ex`, `ibv_create_cq_ex`, `ibv_query_rt_values_ex`).
pub fn install_ex(v: &mut verbs_context) {
    v.create_qp_ex = Some(qp::create_qp_ex);
    v.create_cq_ex = Some(cq::create_cq_ex);
    v.query_rt_values = Some(cq::query_rt_values);
}

/// The destroy verbs of every context.
pub static OPS: Ops = Ops {
    destroy_qp: qp::ibv_destroy_qp,
    destroy_srq: srq::ibv_destroy_srq,
    destroy_ah: ah::ibv_destroy_ah,
    dereg_mr: mr::ibv_dereg_mr,
    destroy_cq: cq::ibv_destroy_cq,
    dealloc_pd: mr::ibv_dealloc_pd,
};
