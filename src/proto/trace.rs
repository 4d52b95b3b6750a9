//! Why a frame is sent ([`TxReason`]) and the per-QP event hooks.
//!
//! Contract:
//! - [`Rnic::poll_transmit_with_reason`](super::Rnic::poll_transmit_with_reason) reports,
//!   with every frame, the decision that produced it: the requester's first transmission or
//!   one of its three kinds of resend (Go-Back-N after a NAK or an implied NAK, after the
//!   local ACK timeout, after an RNR wait), the responder's ACK / NAK / RNR NAK / READ
//!   response / atomic ACK, a response replayed from the responder's cache for a duplicate
//!   request, or a CNP from the congestion module. The engine's behaviour does not depend on
//!   it.
//! - Events go through the `tracing` crate (target `xrnic`, level DEBUG) with the fields
//!   `now_ns` (the virtual time the caller passed in, or for verbs the time of the last
//!   sans-IO call), `dev` (the device name, [`Rnic::set_name`](super::Rnic::set_name)),
//!   `qpn` and `ev` (the event kind), plus the fields of the kind. With no subscriber
//!   interested, a hook is one relaxed atomic load and a branch (the `tracing` callsite
//!   cache); nothing is formatted or allocated. Hooks that would compute something first
//!   check [`enabled`].

use crate::wire::NakCode;

/// Why a frame was sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TxReason {
    /// Requester: a request packet sent for the first time.
    #[default]
    Request,
    /// Requester: Go-Back-N after a NAK PSN sequence error (IBTA §9.7.5).
    RetransmitNak,
    /// Requester: Go-Back-N after an implied NAK, a later response that skips a READ or
    /// atomic response still missing (§9.7.5).
    RetransmitImplied,
    /// Requester: Go-Back-N after the local ACK timeout (§9.7.6).
    RetransmitTimeout,
    /// Requester: resent after waiting out an RNR NAK's timer (§9.7.5).
    RnrRetry,
    /// Responder: a positive ACK.
    Ack,
    /// Responder: an ACK for a duplicate SEND/WRITE, telling how far it is (§9.7.5).
    DuplicateAck,
    /// Responder: a NAK with this code.
    Nak(NakCode),
    /// Responder: an RNR NAK (no receive WQE).
    RnrNak,
    /// Responder: a READ response.
    ReadResponse,
    /// Responder: an atomic ACK.
    AtomicAck,
    /// Responder: READ responses or an atomic ACK sent again from the response cache for
    /// a duplicate request (§9.7.5, responder resources).
    DuplicateResponse,
    /// Congestion notification point: a CNP for CE-marked packets (RoCE v2 annex A17.9).
    Cnp,
}

impl TxReason {
    /// A resend of a request PSN or of a READ/atomic response: what
    /// `retransmitted_packets` counts (atomic replays excepted, see the counter).
    pub const fn is_retransmission(self) -> bool {
        matches!(
            self,
            TxReason::RetransmitNak
                | TxReason::RetransmitImplied
                | TxReason::RetransmitTimeout
                | TxReason::RnrRetry
        )
    }

    /// The frame is the obvious next one (first transmission, ACK, READ response, atomic
    /// ACK): nothing to explain.
    pub const fn is_obvious(self) -> bool {
        matches!(
            self,
            TxReason::Request | TxReason::Ack | TxReason::ReadResponse | TxReason::AtomicAck
        )
    }

    /// A short name, used in traces and capture comments.
    pub const fn name(self) -> &'static str {
        match self {
            TxReason::Request => "request",
            TxReason::RetransmitNak => "retransmit-nak",
            TxReason::RetransmitImplied => "retransmit-implied-nak",
            TxReason::RetransmitTimeout => "retransmit-timeout",
            TxReason::RnrRetry => "rnr-retry",
            TxReason::Ack => "ack",
            TxReason::DuplicateAck => "duplicate-ack",
            TxReason::Nak(_) => "nak",
            TxReason::RnrNak => "rnr-nak",
            TxReason::ReadResponse => "read-response",
            TxReason::AtomicAck => "atomic-ack",
            TxReason::DuplicateResponse => "duplicate-response",
            TxReason::Cnp => "cnp",
        }
    }

    /// One sentence for a capture comment; `None` for the obvious cases.
    pub fn comment(self) -> Option<String> {
        Some(match self {
            TxReason::Request | TxReason::Ack | TxReason::ReadResponse | TxReason::AtomicAck => {
                return None;
            }
            TxReason::RetransmitNak => {
                "retransmission: Go-Back-N after a NAK (PSN sequence error)".into()
            }
            TxReason::RetransmitImplied => {
                "retransmission: Go-Back-N after an implied NAK (a READ/atomic response is missing)"
                    .into()
            }
            TxReason::RetransmitTimeout => {
                "retransmission: Go-Back-N after the local ACK timeout".into()
            }
            TxReason::RnrRetry => "retransmission: RNR retry after the RNR NAK timer".into(),
            TxReason::DuplicateAck => {
                "ACK for a duplicate request (already executed, not executed again)".into()
            }
            TxReason::Nak(c) => format!("NAK {c:?}"),
            TxReason::RnrNak => "RNR NAK: no receive WQE posted".into(),
            TxReason::DuplicateResponse => {
                "retransmission: duplicate response from the responder's cache".into()
            }
            TxReason::Cnp => "CNP: CE-marked packets received for this QP".into(),
        })
    }
}

/// True when a subscriber wants the engine's events: hooks that compute something (not
/// just pass fields) check this first.
#[inline]
pub fn enabled() -> bool {
    tracing::enabled!(target: "xrnic", tracing::Level::DEBUG)
}

/// What an event's `now_ns` field is made of: an engine [`Instant`], or the
/// nanoseconds the congestion module's DCQCN model counts in.
///
/// [`Instant`]: super::Instant
pub trait TraceTime {
    fn trace_nanos(self) -> u64;
}

impl TraceTime for super::Instant {
    fn trace_nanos(self) -> u64 {
        self.as_nanos()
    }
}

impl TraceTime for u64 {
    fn trace_nanos(self) -> u64 {
        self
    }
}

/// Emit one engine event: `qp_event!(now, dev, qpn, "kind", field = value, ...)`.
macro_rules! qp_event {
    ($now:expr, $dev:expr, $qpn:expr, $ev:literal $(, $($f:tt)*)?) => {
        tracing::event!(
            target: "xrnic",
            tracing::Level::DEBUG,
            now_ns = $crate::proto::trace::TraceTime::trace_nanos($now),
            dev = $dev,
            qpn = $qpn.value(),
            ev = $ev
            $(, $($f)*)?
        )
    };
}
pub(crate) use qp_event;
