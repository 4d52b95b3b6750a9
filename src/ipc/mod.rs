//! The protocol between a process and the device service (`xrnic up IF`, docs/rnic.md
//! "One device, many processes"): what the service and its clients say to each other.
//! Both sides import it and it imports neither: the client side is `src/verbs/remote.rs`,
//! the service `src/service/`.
//!
//! - `connect`: the service's socket name, its listener and whether to trust it.
//! - `msg`: the control messages ([`Req`], [`Resp`]), JSON datagrams on the
//!   SOCK_SEQPACKET socket.
//! - `event`: asynchronous events as `enum ibv_event_type` values.
//! - `res`: `xrnic res` through the service ([`ResDoc`]) and its pages.
//! - `ring`: the fixed layouts of the ring slots (the rings are [`crate::io::shm`]).
//!
//! Contract: every decoder here takes untrusted input (the service decodes what a client
//! wrote) and returns `None` / an error for anything that is not a valid value; nothing
//! panics.

mod connect;
mod event;
mod msg;
mod res;
mod ring;

pub use connect::{
    Listener, VERIFIED_PIDS_ENV, connect_any, connect_service, impostor, socket_name, trusted,
};
pub use event::{
    EV_COMM_EST, EV_CQ_ERR, EV_DEVICE_FATAL, EV_PORT_ACTIVE, EV_PORT_ERR, EV_QP_ACCESS_ERR,
    EV_QP_FATAL, EV_QP_LAST_WQE_REACHED, EV_QP_REQ_ERR, EV_SQ_DRAINED, EV_SRQ_LIMIT_REACHED,
    decode_event, encode_event, encode_qp_event,
};
pub use msg::*;
pub use res::{AhRes, ClientRes, CqRes, MrRes, QpRes, RES_PAGE, RelayCounters, ResDoc, SrqRes};
pub use ring::{
    CQ_SLOT_BYTES, CQ_WORDS, MAX_SGE, SQ_SLOT_BYTES, SQ_SLOTS, SQ_WORDS, UdTarget, Work, decode_wc,
    decode_work, encode_recv, encode_send, encode_send_ud, encode_srq_recv, encode_wc,
};
