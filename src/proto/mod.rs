//! The RC transport core, sans-IO (IBTA vol. 1 chapters 9 and 10, RoCE v2 annex A17).
//!
//! Contract:
//! - No I/O, no clock, no threads. Time is an [`Instant`] on the caller's clock passed into
//!   every call that needs it (`now`); the engine only compares instants and adds
//!   `Duration`s to them, saturating ([`time`]). Given the same
//!   calls with the same arguments it produces the same frames, deadlines and completions.
//! - Input: [`Rnic::handle_frame`] takes one whole Ethernet frame. It parses it with
//!   `FrameView::parse`, verifies the ICRC and drops (and counts) anything malformed or not
//!   for us; it never panics on any input. [`Rnic::handle_timeout`] takes the passage of time.
//! - Output: [`Rnic::poll_transmit`] writes the next frame (the QP's header template,
//!   `wire::FrameTemplate`, patched per packet: the bytes `FrameRepr::emit` would write)
//!   into the caller's buffer; [`Rnic::poll_timeout`] says when to call `handle_timeout`;
//!   [`Rnic::poll_cq`] drains work completions.
//! - Verbs: `alloc_pd`, `reg_mr`, `create_cq`, `create_qp`, `modify_qp`, `query_qp`,
//!   `post_send`, `post_recv`, `poll_cq` behave like their libibverbs namesakes for RC QPs.
//!   The engine owns the bytes of every memory region (see [`memory`]).
//! - Protocol faults never surface as `Err` to the caller: they become NAKs on the wire,
//!   error completions and counters.
//!
//! Layout, in the import order (tests/layering.rs `PROTO_ORDER`, bottom first): the
//! leaves [`config`] (the device `Config`, `Mtu`), [`counters`], [`time`], [`trace`] (why
//! frames are sent, event hooks), [`verdict`] and `user_mem`; [`cq`], [`timers`], `sched`
//! and [`congestion`] (DCQCN: rate control, CNPs, pacing); [`wr`]; [`memory`] (PDs, MRs,
//! access checks); `packet` (one packet to send, as a side describes it); [`requester`]
//! and [`responder`] (each side's state and its `poll_transmit`); [`srq`] (the shared
//! receive queue's state, async events); [`qp`] (state machine and attributes, the UD
//! send queue); `framing` (a QP's header template), `execute` (the responder executing a
//! request on its QP) and [`resources`]; [`completer`], [`uc`] (the UC service) and
//! [`ud`] (the UD service and the GSI QP, docs/transport.md §9a) and [`mcast`] (the
//! multicast group table); [`device`] with the engine type [`Rnic`] that owns them all;
//! `srq_verbs` (the SRQ and async-event verbs of `Rnic`), `fatal` and `mcast_verbs` (the
//! multicast verbs and the delivery of a datagram to a group's QPs). Each imports only modules on rows below its own.

pub mod completer;
pub mod config;
pub mod congestion;
pub mod counters;
pub mod cq;
pub mod device;
mod execute;
mod fatal;
mod framing;
pub mod mcast;
mod mcast_verbs;
pub mod memory;
mod packet;
pub mod qp;
mod read_credit;
pub mod requester;
pub mod resources;
pub mod responder;
mod sched;
pub mod srq;
mod srq_verbs;
pub mod time;
pub mod timers;
pub mod trace;
pub mod uc;
pub mod ud;
mod user_mem;
pub mod verdict;
pub mod wr;

pub use counters::{DeviceCounters, QpCounters};
pub use cq::{Cq, WcOpcode, WcStatus, WorkCompletion};
pub use device::{Config, MAX_FRAME_LEN, Rnic};
pub use memory::{Access, AccessError, MrInfo, Pd, UserMem};
pub use qp::{
    AddressVector, AttrMask, Mtu, QpAttr, QpInitAttr, QpState, QpType, VerbsError, gid_is_ipv4,
    ipv4_gid,
};
pub use srq::{AsyncEvent, Srq, SrqAttr, SrqAttrMask};
pub use time::Instant;
pub use trace::TxReason;
pub use ud::{GRH_LEN, GSI_QKEY, GSI_QPN, UdCounters, UdDest};
pub use user_mem::AddressSpace;
pub use verdict::RxVerdict;
pub use wr::{AtomicInfo, RdmaInfo, RecvWr, SendFlags, SendWr, Sge, WrOpcode};

use crate::wire::NakCode;

/// What went wrong with a request at the responder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// No receive WQE: RNR NAK.
    Rnr,
    /// A NAK with this code.
    Nak(NakCode),
    /// SEND with Invalidate named a key that cannot be invalidated: rxe's class J (the
    /// receive completes REM_INV_REQ_ERR, the message is acknowledged, the QP goes to
    /// ERR).
    Invalidate,
    /// The memory the request targets belongs to a process that is gone
    /// ([`memory::MemTable::owner_gone`]): its QP is as good as destroyed. Nothing is
    /// sent (no NAK: the peer must see what a destroyed QP's peer sees, its retries go
    /// unanswered) and the QP moves to ERR, where it drops what follows (IBTA vol. 1
    /// §10.3.1) until its owner's teardown destroys it.
    Gone,
}

/// What the requester, responder and completer may touch besides their QP.
pub(crate) struct Ctx<'a> {
    pub mem: &'a mut memory::MemTable,
    pub cqs: &'a mut [Option<cq::CompletionQueue>],
    pub cfg: &'a Config,
    pub now: Instant,
    /// The device name, for trace events.
    pub dev: &'static str,
    /// The device's shared receive queues ([`srq`]).
    pub srqs: &'a mut [Option<srq::SharedRq>],
    /// Asynchronous events raised while handling the call.
    pub events: &'a mut std::collections::VecDeque<srq::AsyncEvent>,
}

impl Ctx<'_> {
    /// Add `wc` to `cq`; a full CQ drops it, counts the overrun and raises
    /// IBV_EVENT_CQ_ERR (rxe `rxe_cq_post`).
    pub fn complete(&mut self, cq: Cq, wc: WorkCompletion) {
        if let Some(Some(q)) = self.cqs.get_mut(cq.0 as usize)
            && !q.push(wc)
        {
            self.raise(srq::AsyncEvent::CqErr(cq));
        }
    }

    /// Queue an asynchronous event for [`Rnic::poll_async_event`]. A device whose owner
    /// never reads them keeps the first [`srq::MAX_ASYNC_EVENTS`]; later ones are
    /// dropped (the queue never grows without bound).
    pub fn raise(&mut self, ev: srq::AsyncEvent) {
        if self.events.len() < srq::MAX_ASYNC_EVENTS {
            self.events.push_back(ev);
        }
    }
}
