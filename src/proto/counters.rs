//! Counters per QP and per device, named like the mlx5 / rdma-core hw counters users know
//! (`rdma statistic show`, `/sys/class/infiniband/*/ports/*/hw_counters`).
//!
//! Contract: plain `u64` fields, only ever incremented; readable at any time by copy.

use serde::Serialize;

/// Counters of one QP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QpCounters {
    pub packets_sent: u64,
    pub bytes_sent: u64,
    pub packets_received: u64,
    pub bytes_received: u64,
    /// Requester packets sent again (Go-Back-N after a NAK, a timeout or an implied NAK).
    pub retransmitted_packets: u64,
    /// NAKs (sequence error, invalid request, access or operational error) sent.
    pub naks_sent: u64,
    pub naks_received: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    pub acks_sent: u64,
    pub acks_received: u64,
    /// Responder: a request with a PSN after the expected one (mlx5 `out_of_sequence`).
    pub out_of_sequence: u64,
    /// Requester: NAK PSN sequence error received (mlx5 `packet_seq_err`).
    pub packet_seq_err: u64,
    /// Responder: a request with a PSN before the expected one (mlx5 `duplicate_request`).
    pub duplicate_request: u64,
    /// Requester: responses for PSNs already acknowledged.
    pub duplicate_response: u64,
    /// Requester: responses (ACK, NAK, READ response, atomic ACK) for a PSN it never
    /// sent, dropped (IBTA vol. 1 §9.7.4 response PSN validation; a "ghost" ACK).
    pub ghost_responses: u64,
    /// Requester: the retransmission timer expired (mlx5 `local_ack_timeout_err`).
    pub local_ack_timeout_err: u64,
    /// Requester: rnr_retry exhausted (mlx5 `rnr_nak_retry_err`).
    pub rnr_nak_retry_err: u64,
    /// Requester: retry_cnt exhausted.
    pub retry_exceeded_err: u64,
    /// Requester: a response for a later PSN showed a read/atomic response missing
    /// (mlx5 `implied_nak_seq_err`).
    pub implied_nak_seq_err: u64,
    /// Responder: a SEND found no receive WQE (mlx5 `out_of_buffer`).
    pub out_of_buffer: u64,
    /// Responder: R_Key, bounds, PD, permission or alignment violations.
    pub remote_access_errors: u64,
    /// Responder: malformed or out-of-order opcodes, length errors.
    pub invalid_requests: u64,
    /// Responses or requests that arrived in a state that cannot take them.
    pub dropped_wrong_state: u64,
    /// Requests dropped unanswered because the process owning the target memory is gone
    /// (a killed service client before its teardown); the QP then moves to ERR.
    pub dropped_owner_gone: u64,
    /// Atomic operations executed (never twice for one PSN).
    pub atomics_executed: u64,
    /// Duplicate READ / atomic requests answered from the response cache.
    pub responses_replayed: u64,
    /// Responder: READ/atomic requests that arrived while `max_dest_rd_atomic` responses
    /// were still unsent (the requester exceeds the responder resources it was given).
    /// Served, as rxe does; each recycled the oldest cached response, whose duplicate
    /// can then no longer be replayed (docs/transport.md, "Responder resources").
    pub rd_atomic_over_limit: u64,
    /// UC responder: messages dropped whole or in part (a PSN gap, a missing FIRST, a
    /// refused packet, no receive WQE): never delivered (IBTA §9.4, rxe `drop_msg`).
    pub uc_messages_dropped: u64,
    /// UC responder: packets discarded while dropping those messages.
    pub uc_packets_dropped: u64,
    /// Requester: READ requests sent for the later parts of READs split to fit the READ
    /// credit (docs/transport.md, "READ credit").
    pub read_requests_split: u64,
    /// Requester: a READ part held back because the QP's READ credit was used up.
    pub read_held_qp_credit: u64,
    /// Requester: a READ part held back because the device's READ credit was used up.
    pub read_held_device_credit: u64,
}

impl QpCounters {
    /// Add every field of `o` to `self`.
    pub fn add(&mut self, o: &QpCounters) {
        macro_rules! sum {
            ($($f:ident),*) => { $( self.$f += o.$f; )* };
        }
        sum!(
            packets_sent,
            bytes_sent,
            packets_received,
            bytes_received,
            retransmitted_packets,
            naks_sent,
            naks_received,
            rnr_naks_sent,
            rnr_naks_received,
            acks_sent,
            acks_received,
            out_of_sequence,
            packet_seq_err,
            duplicate_request,
            duplicate_response,
            ghost_responses,
            local_ack_timeout_err,
            rnr_nak_retry_err,
            retry_exceeded_err,
            implied_nak_seq_err,
            out_of_buffer,
            remote_access_errors,
            invalid_requests,
            dropped_wrong_state,
            dropped_owner_gone,
            atomics_executed,
            responses_replayed,
            rd_atomic_over_limit,
            uc_messages_dropped,
            uc_packets_dropped,
            read_requests_split,
            read_held_qp_credit,
            read_held_device_credit
        );
    }
}

/// Counters of a device: the sum over its QPs (live and destroyed) plus frame-level drops
/// that belong to no QP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceCounters {
    pub qp: QpCounters,
    /// Frames every layer below the transport refused (truncated, bad lengths, bad IPv4
    /// checksum, not RoCE, unknown opcode, bad pad), plus bad ICRCs.
    pub malformed_frames_dropped: u64,
    /// Of those, frames whose ICRC was wrong.
    pub icrc_errors: u64,
    /// Frames addressed to another MAC or IP address.
    pub wrong_address_dropped: u64,
    /// Frames for a QP that does not exist, or from a peer that is not the QP's.
    pub unknown_qp_dropped: u64,
    /// Well-formed frames of a service this engine does not run (RD, XRC; CNPs while
    /// congestion control is off).
    pub unsupported_dropped: u64,
    /// RC frames whose BTH P_Key matches no entry of the P_Key table (IBTA §10.9;
    /// rxe `check_keys` counts them in the port's `bad_pkey_cntr`).
    pub bad_pkey_dropped: u64,
    /// Completions lost to full CQs.
    pub cq_overruns: u64,
    /// Congestion control (mlx5 names; 0 while it is off): CNPs this device sent as
    /// notification point for CE-marked RoCE packets it received ...
    pub np_cnp_sent: u64,
    pub np_ecn_marked_roce_packets: u64,
    /// ... and CNPs it received as reaction point: a rate cut, or ignored (monitor period,
    /// unknown QP).
    pub rp_cnp_handled: u64,
    pub rp_cnp_ignored: u64,
}
