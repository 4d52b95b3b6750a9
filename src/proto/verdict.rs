//! What became of one received frame: the verdict [`Rnic::handle_frame`] returns, and the
//! one place that turns a verdict into counters (`Rnic::count_rx`, src/proto/device.rs).
//!
//! Contract: every frame gets exactly one verdict; every verdict but [`RxVerdict::Taken`]
//! moves exactly one drop counter (a bad ICRC moves `icrc_errors` and, as one of them,
//! `malformed_frames_dropped`). A verdict reached at a QP (taken, wrong state, wrong
//! service, bad Q_Key, no receive WQE) also counts the frame in that QP's
//! `packets_received` / `bytes_received`; the frame-level ones do not touch any QP (a
//! frame from another peer is not the QP's: IBTA §9.6, packet source validation). What
//! the transport does with a taken frame (a NAK, a duplicate, a UC message dropped) has
//! its own QP counters (see `super::counters`).
//!
//! [`Rnic::handle_frame`]: super::Rnic::handle_frame

/// The verdict of [`super::Rnic::handle_frame`] on one frame. The counter each moves is
/// [`RxVerdict::counter`].
#[must_use = "a frame's verdict says whether the engine took it"]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RxVerdict {
    /// The engine took the frame: its QP's transport handled it (which may still answer
    /// it with a NAK or find it a duplicate), or congestion control took a CNP.
    Taken,
    /// A header did not parse, a length or the IPv4 checksum was wrong, not RoCE v2, an
    /// unknown opcode or a bad pad count.
    Malformed,
    /// The ICRC was wrong (IBTA annex A17.3.3).
    BadIcrc,
    /// Addressed to another MAC address, or to an IP address that is no GID of ours.
    WrongAddress,
    /// A well-formed frame of a service this engine does not run (RD, XRC; a CNP while
    /// congestion control is off).
    Unsupported,
    /// The BTH P_Key matches no entry of the P_Key table (IBTA §10.9).
    BadPkey,
    /// No QP has the BTH destination QPN, or the QP is of another type (an RC or UC
    /// packet for a UD QP, a UD packet for a connected one: rxe `check_type_state`).
    UnknownQp,
    /// A connected QP's frame from an address that is not its peer (IBTA §9.6).
    WrongPeer,
    /// The QP cannot take the packet in its state (RESET/INIT; a UD QP before RTR; a UC
    /// QP sent a response opcode).
    WrongState,
    /// An opcode of the other connected service (a UC opcode for an RC QP, or the
    /// reverse).
    WrongService,
    /// A UD datagram whose DETH Q_Key is not the QP's (IBTA §10.2.4, rxe `check_keys`).
    BadQkey,
    /// A UD datagram that found no receive WQE (IBTA §9.8.3.1: silently dropped).
    NoRecvWqe,
}

impl RxVerdict {
    /// Every verdict, for tests and documentation tables.
    pub const ALL: [RxVerdict; 12] = [
        RxVerdict::Taken,
        RxVerdict::Malformed,
        RxVerdict::BadIcrc,
        RxVerdict::WrongAddress,
        RxVerdict::Unsupported,
        RxVerdict::BadPkey,
        RxVerdict::UnknownQp,
        RxVerdict::WrongPeer,
        RxVerdict::WrongState,
        RxVerdict::WrongService,
        RxVerdict::BadQkey,
        RxVerdict::NoRecvWqe,
    ];

    /// True when the engine took the frame.
    pub const fn is_taken(self) -> bool {
        matches!(self, RxVerdict::Taken)
    }

    /// True when the verdict was reached at a QP (which counts the frame as received).
    pub const fn at_qp(self) -> bool {
        matches!(
            self,
            RxVerdict::Taken
                | RxVerdict::WrongState
                | RxVerdict::WrongService
                | RxVerdict::BadQkey
                | RxVerdict::NoRecvWqe
        )
    }

    /// The counter the verdict moves, as `xrnic stat` names it (device counters bare, QP
    /// counters `qp.`, UD counters `ud.`); `None` for a taken frame. For
    /// [`RxVerdict::WrongState`] at a UD QP the counter is `ud.wrong_state_dropped`.
    pub const fn counter(self) -> Option<&'static str> {
        Some(match self {
            RxVerdict::Taken => return None,
            RxVerdict::Malformed => "malformed_frames_dropped",
            RxVerdict::BadIcrc => "icrc_errors",
            RxVerdict::WrongAddress => "wrong_address_dropped",
            RxVerdict::Unsupported => "unsupported_dropped",
            RxVerdict::BadPkey => "bad_pkey_dropped",
            RxVerdict::UnknownQp | RxVerdict::WrongPeer => "unknown_qp_dropped",
            RxVerdict::WrongState => "qp.dropped_wrong_state",
            RxVerdict::WrongService => "qp.invalid_requests",
            RxVerdict::BadQkey => "ud.bad_qkey_dropped",
            RxVerdict::NoRecvWqe => "ud.no_recv_wqe_dropped",
        })
    }

    /// Why the frame was not taken, in a few words (capture comments); `None` when taken.
    pub const fn reason(self) -> Option<&'static str> {
        Some(match self {
            RxVerdict::Taken => return None,
            RxVerdict::Malformed => "malformed (a header or length is wrong)",
            RxVerdict::BadIcrc => "bad ICRC",
            RxVerdict::WrongAddress => "addressed to another MAC or IP address",
            RxVerdict::Unsupported => "a service this engine does not run (RD, XRC, CNP)",
            RxVerdict::BadPkey => "the P_Key matches no P_Key table entry",
            RxVerdict::UnknownQp => "no such QP (or a QP of another type)",
            RxVerdict::WrongPeer => "not from the QP's peer",
            RxVerdict::WrongState => "the QP cannot take it in its state",
            RxVerdict::WrongService => "an opcode of the QP's other connected service",
            RxVerdict::BadQkey => "the Q_Key is not the QP's",
            RxVerdict::NoRecvWqe => "a datagram with no receive WQE posted",
        })
    }
}

/// How many frames got each verdict (the simulator keeps one per side).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxTally([u64; RxVerdict::ALL.len()]);

impl RxTally {
    /// Count one verdict.
    #[inline(always)]
    pub fn add(&mut self, v: RxVerdict) {
        self.0[v as usize] += 1;
    }

    /// Frames that got `v`.
    pub fn get(&self, v: RxVerdict) -> u64 {
        self.0[v as usize]
    }

    /// Frames not taken.
    pub fn refused(&self) -> u64 {
        self.0.iter().sum::<u64>() - self.get(RxVerdict::Taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_each_verdict_once_in_discriminant_order() {
        for (i, v) in RxVerdict::ALL.into_iter().enumerate() {
            assert_eq!(v as usize, i, "{v:?}");
        }
    }

    #[test]
    fn only_taken_moves_no_counter() {
        for v in RxVerdict::ALL {
            assert_eq!(v.counter().is_none(), v.is_taken(), "{v:?}");
            assert_eq!(v.reason().is_none(), v.is_taken(), "{v:?}");
        }
    }
}
