//! The responder: executes inbound requests and queues their responses (IBTA vol. 1
//! §9.7.5 responder behaviour, §9.7.5 validation, §9.7.5 responses; rxe's
//! `rxe_resp.c` plays this role).
//!
//! This module holds the responder's state (`Responder`) and what it sends
//! (`Responder::poll_transmit`); it works on no QP. Executing a request on a whole QP
//! is `super::execute`, above the QP in proto/'s import order.
//!
//! Contract: `execute::handle_request` checks one request packet in the order the spec gives
//! (PSN, opcode sequence, length, receive WQE, R_Key/bounds/rights), then either executes
//! it or turns the fault into a NAK; it never panics on peer input. Responses (ACK, NAK,
//! RNR NAK, READ responses, atomic ACKs) go into an ordered queue drained by
//! `Responder::next_response`, so that they leave in PSN order: an ACK for a later PSN
//! must never overtake an earlier READ response, or the requester would see an implied
//! NAK. Consecutive plain ACKs coalesce into the newest.

use std::collections::VecDeque;

use crate::wire::{
    AethRepr, AtomicEthRepr, BthFields, Msn, NakCode, Opcode, Psn, Syndrome, aeth_credits,
};

use super::counters::QpCounters;
use super::cq::WcStatus;
use super::memory::{MemRef, MemTable, Payload, Segs};
use super::packet::{Tx, TxBufs, TxExt, TxPacket};
use super::trace::TxReason;

/// A posted receive.
#[derive(Debug)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub segs: Result<Segs, WcStatus>,
    pub len: u64,
}

/// A multi-packet message being received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InProgress {
    None,
    /// SEND FIRST/MIDDLE seen; bytes written into the head receive WQE.
    Send {
        written: u32,
    },
    /// WRITE FIRST/MIDDLE seen.
    Write {
        mem: Option<MemRef>,
        dma_len: u32,
        written: u32,
    },
}

/// A READ or atomic kept for answering duplicates (IBTA §9.7.5: responder resources for RDMA READ and atomics).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cached {
    pub npkts: u32,
    /// Where its PSNs end on the responder's unwrapped PSN count
    /// ([`Responder::psn_count`]): a 24-bit PSN names it only within 2^23 PSNs.
    pub end_count: u64,
    pub msn: Msn,
    /// For READs: the region the R_Key named; for atomics, the original value.
    pub kind: CachedKind,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum CachedKind {
    /// The request's R_Key and range, and the registration it was checked against.
    Read {
        rkey: u32,
        va: u64,
        len: u32,
        serial: u64,
    },
    /// The original value, and the request itself: a duplicate must match it exactly.
    Atomic {
        orig: u64,
        req: AtomicEthRepr,
        cmp_swap: bool,
    },
}

/// One queued response.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RespOut {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: Msn,
        /// The answer to a duplicate SEND/WRITE.
        dup: bool,
    },
    Read {
        first_psn: Psn,
        npkts: u32,
        sent: u32,
        mem: MemRef,
        len: u32,
        msn: Msn,
        /// Responses before this PSN were sent before: they count as retransmitted.
        replay_end: Psn,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: Msn,
        /// Replayed from the cache for a duplicate request.
        replay: bool,
    },
}

/// A response packet, before addressing and framing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RespPacket {
    pub opcode: Opcode,
    pub psn: Psn,
    pub ext: TxExt,
    pub payload: Payload,
    pub is_nak: bool,
    pub is_rnr: bool,
    /// A READ response sent again for a duplicate request.
    pub replay: bool,
    /// Why it is sent.
    pub reason: TxReason,
    /// A NAK sent instead of READ responses whose region went away.
    pub region_gone: bool,
}

/// The UC responder's state (src/proto/uc.rs) kept besides the RC `Responder` fields it
/// reuses (`epsn`, `cur`, `rq`).
#[derive(Debug, Default)]
pub(crate) struct UcResp {
    /// The rest of the current message is being dropped (rxe `resp.drop_msg`).
    pub drop_msg: bool,
}

/// Responder state of one QP. Its fields are private: the step modules that apply the
/// responder's rules (`super::execute` for RC, `super::uc`) and every other file go
/// through the methods below, each named for the transition it makes.
#[derive(Debug, Default)]
pub(crate) struct Responder {
    rq: VecDeque<RecvWqe>,
    /// Expected PSN.
    epsn: Psn,
    msn: Msn,
    /// A PSN sequence error NAK was sent and the expected PSN has not arrived since
    /// (§9.7.5: one NAK per sequence error).
    nak_seq_sent: bool,
    cur: Option<InProgress>,
    cache: VecDeque<Cached>,
    out: VecDeque<RespOut>,
    pkts_since_ack: u32,
    /// A class A/C error NAK is queued: stop executing; enter ERR once it is sent.
    fatal: bool,
    /// IBV_EVENT_COMM_EST was raised ([`comm_est`]); cleared by RESET.
    comm_est: bool,
    /// PSNs consumed since the QP was created, not wrapped: ages the response cache.
    psn_count: u64,
    /// The PSN of the newest SEND/WRITE packet executed (rxe `ack_psn` − 1): what an ACK
    /// for a duplicate SEND/WRITE carries.
    ack_psn: Psn,
}

impl Cached {
    /// True when the request PSN at unwrapped count `at` is one of this entry's.
    pub(crate) fn holds(&self, at: u64) -> bool {
        at < self.end_count && at + u64::from(self.npkts) >= self.end_count
    }
}

impl Responder {
    /// `IBV_QP_RQ_PSN` set by modify (IBTA vol. 1 §10.3, §9.7.1): the PSN expected next.
    /// No SEND/WRITE executed yet: a duplicate's ACK names the PSN before the first.
    pub(crate) fn set_rq_psn(&mut self, psn: Psn) {
        self.epsn = psn;
        self.ack_psn = psn.sub(1);
    }

    /// The PSN expected next (rq_psn, as `ibv_query_qp` reports it).
    #[inline]
    pub(crate) fn epsn(&self) -> Psn {
        self.epsn
    }

    /// The MSN: messages completed by this responder (IBTA vol. 1 §9.7.5.1.1).
    #[inline]
    pub(crate) fn msn(&self) -> Msn {
        self.msn
    }

    /// PSNs consumed since the QP was created, not wrapped (the response cache's age).
    #[inline]
    pub(crate) fn psn_count(&self) -> u64 {
        self.psn_count
    }

    /// The PSN of the newest SEND/WRITE packet executed: what an ACK for a duplicate
    /// SEND/WRITE carries.
    #[inline]
    pub(crate) fn ack_psn(&self) -> Psn {
        self.ack_psn
    }

    /// A class A/C error NAK is queued ([`Responder::fail`]): nothing more executes.
    #[inline]
    pub(crate) fn is_fatal(&self) -> bool {
        self.fatal
    }

    /// IBV_EVENT_COMM_EST was raised since the last RESET.
    #[inline]
    pub(crate) fn established(&self) -> bool {
        self.comm_est
    }

    /// Record that IBV_EVENT_COMM_EST was raised (IBTA vol. 1 §11.6.3.1: once).
    #[inline]
    pub(crate) fn mark_established(&mut self) {
        self.comm_est = true;
    }

    /// A PSN sequence error NAK was sent and the expected PSN has not arrived since.
    #[inline]
    pub(crate) fn sequence_nak_sent(&self) -> bool {
        self.nak_seq_sent
    }

    /// A NAK that waits for the expected PSN (sequence error or RNR) was queued: no
    /// other such NAK until that PSN arrives (IBTA vol. 1 §9.7.5.2: one per error).
    #[inline]
    pub(crate) fn note_waiting_nak(&mut self) {
        self.nak_seq_sent = true;
    }

    /// The expected PSN arrived: a later sequence error gets its NAK again.
    #[inline]
    pub(crate) fn expected_psn_arrived(&mut self) {
        self.nak_seq_sent = false;
    }

    /// The multi-packet message being received, `InProgress::None` between messages.
    #[inline]
    pub(crate) fn in_progress(&self) -> InProgress {
        self.cur.unwrap_or(InProgress::None)
    }

    /// The message being received, to update its byte count in place.
    #[inline]
    pub(crate) fn in_progress_mut(&mut self) -> Option<&mut InProgress> {
        self.cur.as_mut()
    }

    /// A FIRST packet started (or a MIDDLE continued) the message `m`.
    #[inline]
    pub(crate) fn continue_message(&mut self, m: InProgress) {
        self.cur = Some(m);
    }

    /// The message in progress is abandoned without completing (a UC message dropped, a
    /// fault): the next FIRST/ONLY starts afresh.
    #[inline]
    pub(crate) fn abandon_message(&mut self) {
        self.cur = None;
    }

    /// A message's last packet was executed: no message in progress, MSN + 1 (IBTA
    /// vol. 1 §9.7.5.1.1). Returns the new MSN.
    #[inline]
    pub(crate) fn complete_message(&mut self) -> Msn {
        self.cur = None;
        self.msn = self.msn.next();
        self.msn
    }

    /// The request packet at the expected PSN, covering `npsn` PSNs, was accepted: the
    /// expected PSN moves past it (§9.7.5.1.1) and one more packet waits for an ACK.
    #[inline]
    pub(crate) fn accept_packet(&mut self, npsn: u32) {
        self.epsn = self.epsn.add(npsn);
        self.psn_count += u64::from(npsn);
        self.pkts_since_ack += 1;
    }

    /// The expected PSN, set by a UC message that resynchronised on its FIRST/ONLY
    /// packet (UC has no ACKs, so no packet count or cache age moves).
    #[inline]
    pub(crate) fn resync_epsn(&mut self, psn: Psn) {
        self.epsn = psn;
    }

    /// Request packets accepted since the last ACK was queued (the coalescing count).
    #[inline]
    pub(crate) fn pkts_since_ack(&self) -> u32 {
        self.pkts_since_ack
    }

    /// The SEND/WRITE packet at `psn` was executed: an ACK for a later duplicate names it.
    #[inline]
    pub(crate) fn note_executed(&mut self, psn: Psn) {
        self.ack_psn = psn;
    }

    /// Responses queued and not yet fully sent.
    #[inline]
    pub(crate) fn queued_responses(&self) -> usize {
        self.out.len()
    }

    /// Queue a READ or atomic response (a new one, or a replay from the cache).
    #[inline]
    pub(crate) fn queue_response(&mut self, r: RespOut) {
        self.out.push_back(r);
    }

    /// Keep a READ or atomic for answering its duplicates, evicting the oldest past `cap`
    /// entries (rxe's ring of `max_dest_rd_atomic` resources).
    pub(crate) fn cache_response(&mut self, c: Cached, cap: usize) {
        while self.cache.len() >= cap {
            self.cache.pop_front();
        }
        self.cache.push_back(c);
    }

    /// The head receive WR, left in place (a multi-packet SEND writes into it).
    #[inline]
    pub(crate) fn head_recv(&self) -> Option<&RecvWqe> {
        self.rq.front()
    }

    /// Receive WRs posted and not completed.
    pub(crate) fn rq_len(&self) -> usize {
        self.rq.len()
    }

    /// Post a receive WR at the tail of the receive queue (`ibv_post_recv`).
    pub(crate) fn post_recv(&mut self, wqe: RecvWqe) {
        self.rq.push_back(wqe);
    }

    /// Take the head receive WR (a UD datagram's, or to flush it).
    pub(crate) fn take_recv(&mut self) -> Option<RecvWqe> {
        self.rq.pop_front()
    }

    /// A class A/C error NAK was queued and everything queued has been sent: the QP goes
    /// to ERR now (IBTA vol. 1 §9.9; rxe `do_class_ac_error`).
    pub(crate) fn error_due(&self) -> bool {
        self.fatal && self.out.is_empty()
    }

    /// The QP enters ERR: requests already executed keep their answer, an ACK or an
    /// atomic response queued before the move still leaves (the QP sends nothing else in
    /// ERR). rxe sends its ACK in the same responder pass that executed the request
    /// (rxe_resp.c, RESPST_ACKNOWLEDGE), so a program that moves its QP to ERR right after
    /// a receive completion (librdmacm's rdma_disconnect) never leaves the peer retrying a
    /// request it executed. READ responses are not sent: their data is read at transmit
    /// time, and a QP in ERR touches no memory. The message in progress is abandoned.
    pub(crate) fn keep_executed_answers(&mut self) {
        self.out.retain(|o| {
            matches!(
                o,
                RespOut::Ack {
                    syndrome: Syndrome::Ack { .. },
                    ..
                } | RespOut::Atomic { .. }
            )
        });
        self.cur = None;
    }

    /// Drop every queued response, as if lost (tests of what the requester does without
    /// them).
    #[cfg(test)]
    pub(crate) fn drop_queued_responses(&mut self) {
        self.out.clear();
    }

    /// The heap bytes the receive queue, the response cache and the response queue hold,
    /// with `spilled` the bytes of one WR's checked segments beyond the QP (for the
    /// resource listing).
    pub(crate) fn heap_bytes(&self, spilled: impl Fn(&Segs) -> usize) -> usize {
        use core::mem::size_of;
        let wrs: usize = self
            .rq
            .iter()
            .map(|r| r.segs.as_ref().map_or(0, &spilled))
            .sum();
        self.rq.capacity() * size_of::<RecvWqe>()
            + wrs
            + self.cache.capacity() * size_of::<Cached>()
            + self.out.capacity() * size_of::<RespOut>()
    }

    /// A class A/C error (IBTA vol. 1 §9.9; rxe `do_class_ac_error`): stop executing and
    /// abandon the message in progress; the QP enters ERR once the queue is sent
    /// ([`Responder::error_due`]).
    pub(crate) fn fail(&mut self) {
        self.fatal = true;
        self.cur = None;
    }

    /// Drop the cached READs and atomics too old to be named by a duplicate: a 24-bit PSN
    /// names a request only within 2^23 PSNs of the expected one (IBTA vol. 1 §9.7.5), so
    /// entries older than that window can never match, and an entry made 2^24 PSNs ago for
    /// the same 24-bit PSN must not.
    pub(crate) fn age_cache(&mut self) {
        while self
            .cache
            .front()
            .is_some_and(|c| c.end_count + (1 << 23) <= self.psn_count)
        {
            self.cache.pop_front();
        }
    }

    /// READ/atomic responses queued for new (not duplicate) requests and not fully sent:
    /// the responder resources in use (a response not fully sent is one the requester still
    /// waits for).
    pub(crate) fn rd_atomic_in_use(&self) -> usize {
        self.out
            .iter()
            .filter(|o| match o {
                RespOut::Read {
                    first_psn,
                    replay_end,
                    ..
                } => replay_end == first_psn,
                RespOut::Atomic { replay, .. } => !replay,
                RespOut::Ack { .. } => false,
            })
            .count()
    }

    /// Queue the replay `fresh` of the READ with MSN `msn`. Still sending that READ's
    /// responses: restart them in place (keeps the PSN order of the queue) instead of sending
    /// both runs. Only the responses that already left are retransmissions; the rest go out
    /// for the first time.
    pub(crate) fn queue_read_replay(&mut self, mut fresh: RespOut, msn: Msn) {
        let queued = self
            .out
            .iter_mut()
            .find(|o| matches!(o, RespOut::Read { msn: m, .. } if *m == msn));
        match queued {
            Some(o) => {
                if let (
                    RespOut::Read {
                        first_psn,
                        sent,
                        replay_end: old_end,
                        ..
                    },
                    RespOut::Read { replay_end, .. },
                ) = (&*o, &mut fresh)
                {
                    // Sent before: by this run so far, or by an earlier one it replaced.
                    let here = first_psn.add(*sent);
                    *replay_end = if old_end.after(here) { *old_end } else { here };
                }
                *o = fresh;
            }
            None => self.out.push_back(fresh),
        }
    }

    /// The newest cached response of the kind `is_kind` accepts that holds the request
    /// PSN at unwrapped count `at` (a duplicate READ or atomic, IBTA §9.7.5.1.2).
    pub(crate) fn cached(
        &self,
        at: Option<u64>,
        is_kind: impl Fn(&CachedKind) -> bool,
    ) -> Option<Cached> {
        let at = at?;
        self.cache
            .iter()
            .rev()
            .find(|c| is_kind(&c.kind) && c.holds(at))
            .copied()
    }

    /// Queue an ACK/NAK; returns the PSN of a queued plain ACK it replaced, if any.
    pub(crate) fn push_ack(
        &mut self,
        cap: usize,
        psn: Psn,
        syndrome: Syndrome,
        msn: Msn,
        dup: bool,
    ) -> Option<Psn> {
        // The same RNR NAK again (a peer resending the PSN before we answered): one is
        // enough.
        if let (
            Syndrome::RnrNak { .. },
            Some(RespOut::Ack {
                psn: p,
                syndrome: s,
                ..
            }),
        ) = (syndrome, self.out.back())
        {
            if *p == psn && *s == syndrome {
                return None;
            }
        }
        // Coalesce: a newer plain ACK replaces a queued plain ACK (never a NAK).
        let mut replaced = None;
        if let Syndrome::Ack { .. } = syndrome {
            if let Some(&RespOut::Ack {
                syndrome: Syndrome::Ack { .. },
                psn: old,
                ..
            }) = self.out.back()
            {
                self.out.pop_back();
                replaced = Some(old);
            }
        }
        // A full queue drops this ACK / RNR NAK / sequence NAK (as if lost on the wire:
        // the requester's timer recovers); the request stays counted by its own counter.
        if replaced.is_none() && self.out.len() >= cap {
            return None;
        }
        self.out.push_back(RespOut::Ack {
            psn,
            syndrome,
            msn,
            dup,
        });
        self.pkts_since_ack = 0;
        replaced
    }

    /// The syndrome of a positive ACK: unlimited credits like rxe, or the receive
    /// queue's real depth when `advertise` is on (IBTA table 46 credit codes).
    pub fn ack_syndrome(&self, advertise: bool) -> Syndrome {
        if !advertise {
            return Syndrome::ACK_UNLIMITED;
        }
        let have = self.rq.len() as u32;
        let mut code = 0u8;
        for c in 0..31u8 {
            if aeth_credits(c).is_some_and(|n| n <= have) {
                code = c;
            }
        }
        Syndrome::Ack { credit_code: code }
    }

    /// The responder's turn at the wire: the next response packet, its payload read
    /// (borrowed from an owned region, copied into `scratch` out of application memory,
    /// memory.rs), and the responder's send counters moved. `None` when nothing is
    /// queued. In ERR only the answers to requests executed before the move are left in
    /// `out` (`Qp::enter_error`).
    // Inlined into its one caller, `transmit_qp` (see `Requester::poll_transmit`).
    #[inline(always)]
    pub fn poll_transmit<'a>(
        &mut self,
        mtu: u32,
        advertise: bool,
        bufs: TxBufs<'a>,
        counters: &mut QpCounters,
    ) -> Option<Tx<'a>> {
        // Checked here first: most calls find nothing queued.
        if self.out.is_empty() {
            return None;
        }
        let TxBufs { mem, scratch } = bufs;
        let p = self.next_response(mtu, advertise, mem)?;
        if p.region_gone {
            counters.remote_access_errors += 1;
        }
        if p.replay {
            counters.retransmitted_packets += 1;
        }
        if p.is_nak {
            counters.naks_sent += 1;
        } else if p.is_rnr {
            counters.rnr_naks_sent += 1;
        } else if p.opcode == Opcode::RC_ACK {
            counters.acks_sent += 1;
        }
        // `next_response` checked the region of a READ response in this same call;
        // nothing can have freed it since.
        let payload = match p.payload {
            Payload::Mem { mem: m, skip, len } if mem.borrowable(m) => mem.bytes(m, skip, len),
            // Application memory is copied out, never borrowed (memory.rs).
            Payload::Mem { mem: m, skip, len } => {
                scratch.resize(len, 0);
                let buf = &mut scratch[..len];
                mem.read(m, skip, buf).then_some(&*buf)
            }
            _ => Some(&[][..]),
        };
        let Some(payload) = payload else {
            // A READ response out of another process's memory that is gone: the QP is
            // as good as destroyed (`execute::owner_gone`).
            return Some(match p.payload {
                Payload::Mem { mem: m, .. } if mem.owner_gone(m) => Tx::OwnerGone(p.psn),
                _ => Tx::Unreadable,
            });
        };
        Some(Tx::Send(TxPacket {
            bth: BthFields {
                opcode: p.opcode,
                psn: p.psn,
                ack_req: false,
                solicited: false,
            },
            ext: p.ext,
            payload,
            reason: p.reason,
        }))
    }

    /// The next response packet to send, advancing the queue (IBTA vol. 1 §9.7.5
    /// responses; rxe `acknowledge`, `read_reply`, `atomic_reply`): the queue's front
    /// entry becomes an ACK/NAK ([`ack_packet`]), an atomic ACK ([`atomic_ack_packet`])
    /// or the next READ response ([`Responder::next_read_response`]).
    pub fn next_response(
        &mut self,
        mtu: u32,
        advertise: bool,
        table: &MemTable,
    ) -> Option<RespPacket> {
        if self.out.is_empty() {
            return None;
        }
        let ack_syn = self.ack_syndrome(advertise);
        match *self.out.front()? {
            RespOut::Ack {
                psn,
                syndrome,
                msn,
                dup,
            } => {
                self.out.pop_front();
                Some(ack_packet(psn, syndrome, msn, dup, ack_syn))
            }
            RespOut::Atomic {
                psn,
                orig,
                msn,
                replay,
            } => {
                self.out.pop_front();
                Some(atomic_ack_packet(psn, orig, msn, replay, ack_syn))
            }
            RespOut::Read { .. } => self.next_read_response(mtu, ack_syn, table),
        }
    }

    /// Rule: the next packet of the READ response run at the front of the queue (IBTA
    /// vol. 1 §9.7.5, §9.3.4 table 35; rxe `read_reply`): FIRST/MIDDLE/LAST/ONLY, each but
    /// MIDDLE with an AETH carrying `ack_syn`. A response whose region went away (or is
    /// now another registration) becomes a NAK remote access error for its PSN instead,
    /// the rest of that READ is dropped and the QP fails once the queue is sent (rxe
    /// `read_reply` re-checks the MR per packet).
    fn next_read_response(
        &mut self,
        mtu: u32,
        ack_syn: Syndrome,
        table: &MemTable,
    ) -> Option<RespPacket> {
        let Some(RespOut::Read {
            first_psn,
            npkts,
            sent,
            mem,
            len,
            msn,
            replay_end,
        }) = self.out.front_mut()
        else {
            return None;
        };
        let k = *sent;
        let replay = first_psn.add(k).before(*replay_end);
        let off = k as usize * mtu as usize;
        let n = (*len as usize - off.min(*len as usize)).min(mtu as usize);
        if n > 0 && !table.live(*mem, off, n) {
            let psn = first_psn.add(k);
            let p = RespPacket {
                opcode: Opcode::RC_ACK,
                psn,
                ext: TxExt::Aeth(AethRepr {
                    syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                    msn: *msn,
                }),
                payload: Payload::None,
                is_nak: true,
                is_rnr: false,
                replay: false,
                region_gone: true,
                reason: TxReason::Nak(NakCode::RemoteAccessError),
            };
            self.out.pop_front();
            self.fatal = true;
            self.cur = None;
            return Some(p);
        }
        let opcode = read_response_opcode(*npkts, k);
        // Every READ response but MIDDLE carries an AETH (§9.3.4 table 35).
        let ext = if opcode != Opcode::RC_READ_RESPONSE_MIDDLE {
            TxExt::Aeth(AethRepr {
                syndrome: ack_syn,
                msn: *msn,
            })
        } else {
            TxExt::None
        };
        let p = RespPacket {
            opcode,
            psn: first_psn.add(k),
            ext,
            payload: if n == 0 {
                Payload::None
            } else {
                Payload::Mem {
                    mem: *mem,
                    skip: off,
                    len: n,
                }
            },
            is_nak: false,
            is_rnr: false,
            replay,
            region_gone: false,
            reason: if replay {
                TxReason::DuplicateResponse
            } else {
                TxReason::ReadResponse
            },
        };
        *sent += 1;
        if *sent >= *npkts {
            self.out.pop_front();
        }
        Some(p)
    }
}

/// Rule: an ACK, RNR NAK or NAK (IBTA vol. 1 §9.7.5.2, §9.3.5 AETH; rxe `send_ack`): a
/// positive ACK carries the credits of `ack_syn`, a NAK its own syndrome.
fn ack_packet(psn: Psn, syndrome: Syndrome, msn: Msn, dup: bool, ack_syn: Syndrome) -> RespPacket {
    let syndrome = match syndrome {
        Syndrome::Ack { .. } => ack_syn,
        s => s,
    };
    RespPacket {
        opcode: Opcode::RC_ACK,
        psn,
        ext: TxExt::Aeth(AethRepr { syndrome, msn }),
        payload: Payload::None,
        is_nak: matches!(syndrome, Syndrome::Nak(_)),
        is_rnr: matches!(syndrome, Syndrome::RnrNak { .. }),
        replay: false,
        region_gone: false,
        reason: match syndrome {
            Syndrome::Nak(c) => TxReason::Nak(c),
            Syndrome::RnrNak { .. } => TxReason::RnrNak,
            _ if dup => TxReason::DuplicateAck,
            _ => TxReason::Ack,
        },
    }
}

/// Rule: an atomic ACK with the original value (IBTA vol. 1 §9.7.5, §9.3.7 AtomicAckETH;
/// rxe `atomic_reply`). A replayed atomic ACK is a retransmitted packet like a replayed
/// READ response.
fn atomic_ack_packet(psn: Psn, orig: u64, msn: Msn, replay: bool, ack_syn: Syndrome) -> RespPacket {
    let aeth = AethRepr {
        syndrome: ack_syn,
        msn,
    };
    RespPacket {
        opcode: Opcode::RC_ATOMIC_ACK,
        psn,
        ext: TxExt::AethAtomicAck(aeth, orig),
        payload: Payload::None,
        is_nak: false,
        is_rnr: false,
        replay,
        region_gone: false,
        reason: if replay {
            TxReason::DuplicateResponse
        } else {
            TxReason::AtomicAck
        },
    }
}

/// The opcode of READ response `k` of `npkts` (IBTA vol. 1 §9.7.2 segmentation).
fn read_response_opcode(npkts: u32, k: u32) -> Opcode {
    match (npkts == 1, k == 0, k + 1 == npkts) {
        (true, ..) => Opcode::RC_READ_RESPONSE_ONLY,
        (false, true, _) => Opcode::RC_READ_RESPONSE_FIRST,
        (false, false, true) => Opcode::RC_READ_RESPONSE_LAST,
        _ => Opcode::RC_READ_RESPONSE_MIDDLE,
    }
}
