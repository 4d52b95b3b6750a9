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
//! - The event kinds are the variants of [`Event`], listed once in the `events!` table below
//!   with their `ev` text: `qp_event!` takes a variant, the trace carries
//!   [`Event::as_str`], and the tools read it back with [`Event::from_str`]
//!   (`str::parse`), so nothing matches an event name as a string literal.

use std::fmt;
use std::str::FromStr;

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

/// Builds [`Event`] from one table of `Variant = "ev text"` rows: the enum, its
/// [`Event::ALL`] list and [`Event::as_str`] all come from the same rows, so a name cannot
/// be added to one and missed in another.
macro_rules! events {
    ($($(#[$doc:meta])* $variant:ident = $text:literal,)*) => {
        /// The kind of an engine event: the `ev` field of a trace line. The fields each
        /// kind carries are on its variant (docs/observability.md has the table).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Event {
            $($(#[$doc])* $variant,)*
        }

        impl Event {
            /// Every kind, in the table's order.
            pub const ALL: &'static [Event] = &[$(Event::$variant,)*];

            /// The `ev` text of the trace (`snake_case`).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Event::$variant => $text,)*
                }
            }
        }
    };
}

events! {
    /// `from`, `to`: a QP state change (modify_qp, or ERR after a fatal error).
    State = "state",
    /// `queue` (sq/rq), `wr_id`, `opcode` (sq), `len`: post_send / post_recv.
    WqePosted = "wqe_posted",
    /// `wr_id`, `first_psn`: the first packet of a send WR leaves.
    WqeStarted = "wqe_started",
    /// `queue`, `wr_id`, `status`, `signaled` (sq) / `byte_len` (rq): a WR completes.
    WqeCompleted = "wqe_completed",
    /// `srq`, `wr_id`, `left`: the responder took a receive WQE from a shared receive queue.
    SrqWqeTaken = "srq_wqe_taken",
    /// `una`, `next_psn`, `ack_deadline_ns`: an ACK or response moved the oldest
    /// unacknowledged PSN (restarts the ACK timer).
    PsnWindow = "psn_window",
    /// `psn`, `ack_req`, `replaces_psn`: the responder queued an ACK; `replaces_psn` when it
    /// coalesced a queued one.
    AckQueued = "ack_queued",
    /// `psn`, `syndrome`: the responder queued a NAK.
    NakQueued = "nak_queued",
    /// `psn`, `syndrome`: the requester got a NAK.
    NakReceived = "nak_received",
    /// `psn`, `syndrome`: a READ response or atomic ACK carried a NAK syndrome.
    NakInResponse = "nak_in_response",
    /// `from_psn`, `cause` (SeqNak, Implied, Timeout), `ack_deadline_ns` (Timeout): the
    /// requester rewinds (IBTA §9.7.5, §9.7.6).
    GoBackN = "go_back_n",
    /// `psn`, `opcode`: the responder saw a PSN it already executed (§9.7.5).
    DuplicateRequest = "duplicate_request",
    /// `psn`: the responder refused a SEND with Invalidate (REM_INV_REQ_ERR); the QP goes
    /// to ERR.
    InvalidateRefused = "invalidate_refused",
    /// `psn`: the process that owns the QP's memory is gone; the request is dropped and
    /// the QP goes to ERR.
    OwnerGone = "owner_gone",
    /// `timer` (ack), `at_ns`: the ACK timer starts from idle.
    TimerArmed = "timer_armed",
    /// `timer` (ack, rnr), `retry_left` (ack): the local ACK timeout, or the RNR wait is
    /// over.
    TimerFired = "timer_fired",
    /// `psn`, `timer_code`: the responder has no receive WQE.
    RnrNakQueued = "rnr_nak_queued",
    /// `psn`, `timer_code`: the requester got an RNR NAK.
    RnrNakReceived = "rnr_nak_received",
    /// `from_psn`, `wait_ns`, `until_ns`: the requester waits out an RNR NAK.
    RnrWait = "rnr_wait",
    /// `dest_qp`: the notification point sent a CNP (RoCE v2 annex A17.9).
    CnpSent = "cnp_sent",
    /// `verdict`: the device received a CNP for this QP.
    CnpReceived = "cnp_received",
    /// `handled`, `rate_bps`, `target_bps`, `alpha`, `timer_events`, `byte_events`,
    /// `cut_due`, `bytes_sent`: the DCQCN reaction point's state after a CNP.
    Cnp = "cnp",
    /// `rate_bps`, `target_bps`, `alpha`: DCQCN changed the QP's rate.
    RateUpdate = "rate_update",
    /// `wr_id`, `dest_qp`, `len`: a UD datagram left.
    UdSent = "ud_sent",
    /// `reason` (bad_qkey), `qkey`: a UD datagram was dropped.
    UdDropped = "ud_dropped",
    /// `psn`, `why`: a UC message was dropped (`why` names the cause).
    UcMessageDropped = "uc_message_dropped",
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `ev` text that names no [`Event`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownEvent(pub String);

impl fmt::Display for UnknownEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown engine event {:?}", self.0)
    }
}

impl std::error::Error for UnknownEvent {}

impl FromStr for Event {
    type Err = UnknownEvent;

    /// The variant whose [`as_str`](Event::as_str) is `s`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Event::ALL
            .iter()
            .copied()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| UnknownEvent(s.to_owned()))
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

/// Emit one engine event: `qp_event!(now, dev, qpn, Event::Kind, field = value, ...)`; the
/// `ev` field is the kind's [`Event::as_str`].
macro_rules! qp_event {
    ($now:expr, $dev:expr, $qpn:expr, $ev:path $(, $($f:tt)*)?) => {
        tracing::event!(
            target: "xrnic",
            tracing::Level::DEBUG,
            now_ns = $crate::proto::trace::TraceTime::trace_nanos($now),
            dev = $dev,
            qpn = $qpn.value(),
            ev = $crate::proto::trace::Event::as_str($ev)
            $(, $($f)*)?
        )
    };
}
pub(crate) use qp_event;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every kind's text parses back to that kind, and the texts are distinct.
    #[test]
    fn every_event_text_parses_back_to_itself() {
        for &e in Event::ALL {
            assert_eq!(e.as_str().parse::<Event>(), Ok(e));
            assert_eq!(e.to_string(), e.as_str());
        }
        let texts: BTreeSet<&str> = Event::ALL.iter().map(|e| e.as_str()).collect();
        assert_eq!(texts.len(), Event::ALL.len());
    }

    /// The kinds are exactly the names the engine's traces have always carried (the tools
    /// and the trace files written before the enum read the same text).
    #[test]
    fn the_event_names_are_the_traced_ones() {
        let names: BTreeSet<&str> = Event::ALL.iter().map(|e| e.as_str()).collect();
        let traced: BTreeSet<&str> = [
            "state",
            "wqe_posted",
            "wqe_started",
            "wqe_completed",
            "srq_wqe_taken",
            "psn_window",
            "ack_queued",
            "nak_queued",
            "nak_received",
            "nak_in_response",
            "go_back_n",
            "duplicate_request",
            "invalidate_refused",
            "owner_gone",
            "timer_armed",
            "timer_fired",
            "rnr_nak_queued",
            "rnr_nak_received",
            "rnr_wait",
            "cnp_sent",
            "cnp_received",
            "cnp",
            "rate_update",
            "ud_sent",
            "ud_dropped",
            "uc_message_dropped",
        ]
        .into_iter()
        .collect();
        assert_eq!(names, traced);
        assert_eq!(Event::ALL.len(), 26);
    }

    /// A text that names no kind is an error that quotes it.
    #[test]
    fn an_unknown_text_is_refused() {
        for s in ["", "State", "go-back-n", "retry_timeout", "state "] {
            let e = s.parse::<Event>().unwrap_err();
            assert_eq!(e, UnknownEvent(s.to_owned()));
            assert!(e.to_string().contains(&format!("{s:?}")), "{e}");
        }
    }
}
