//! The data-path ops of `ibv_context.ops` that programs call inline (verbs.h:
//! `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_post_send`, `ibv_post_recv`,
//! `ibv_post_srq_recv`). Every slot a program may call is set: an op xrnic lacks
//! returns its documented error instead of jumping to NULL.

use crate::types::*;

/// Fill the ops of a new context.
pub fn install(ops: &mut ibv_context_ops) {
    ops.poll_cq = Some(crate::cq::poll_cq);
    ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    ops.post_send = Some(crate::qp::post_send);
    ops.post_recv = Some(crate::qp::post_recv);
    ops.post_srq_recv = Some(crate::srq::post_srq_recv);
}
