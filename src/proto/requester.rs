//! The requester: turns send work requests into request packets (IBTA vol. 1 §9.7.1 PSNs,
//! §9.7.2 segmentation, §9.7.4 requester behaviour; rxe's `rxe_req.c` plays this role).
//!
//! Contract: `Requester::next_packet` returns the next request packet to put on the wire,
//! or `None` when nothing may be sent now (queue empty, window full, max_rd_atomic reached,
//! fence, credits, RNR wait, SQ draining). It never completes work requests: the completer
//! does, in posting order. Retransmission is Go-Back-N: `Requester::rewind` moves the
//! transmit point back to a PSN and packets from there are emitted again with the PSNs
//! they had the first time.

use std::collections::VecDeque;

use crate::wire::{AtomicEthRepr, BthFields, Opcode, Psn, Qpn, RethRepr};

use super::config::Config;
use super::congestion::CongestionControl;
use super::counters::QpCounters;
use super::cq::WcStatus;
use super::memory::MemTable;
use super::memory::{Payload, Segs, borrow_run, gather, readable};
use super::packet::{Tx, TxBufs, TxExt, TxPacket};
use super::read_credit::{Held, ReadBounds, ReadPool};
use super::time::Instant;
use super::timers::{Timer, TimerTable, local_ack_timeout, local_ack_timeout_ns};
use super::trace::{Event, TxReason, qp_event};
use super::wr::{SendFlags, SendWr, WrOpcode};

/// One send work request in the send queue.
#[derive(Debug)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    /// Checked scatter/gather list, or the local error the WR will complete with when it
    /// reaches the head of the queue (so completions stay in order).
    pub segs: Result<Segs, WcStatus>,
    pub len: u32,
    /// PSN of the first packet (requests) or first response (READ), once started.
    pub first_psn: Psn,
    /// PSNs the message occupies: packets for SEND/WRITE, response packets for READ.
    pub npkts: u32,
    pub started: bool,
    /// Packets acknowledged (SEND/WRITE) or response packets received (READ).
    pub acked_pkts: u32,
    /// READ: response packets each of its READ requests asks for (the last one: the rest),
    /// fixed when it starts (`super::read_credit`); 0 otherwise.
    pub part_pkts: u32,
    /// READ: response packets asked for so far, the end of the last part issued.
    pub issued_pkts: u32,
}

impl SendWqe {
    /// A work request as posted, not started.
    pub fn new(wr: SendWr, segs: Result<Segs, WcStatus>, len: u32) -> SendWqe {
        SendWqe {
            wr,
            segs,
            len,
            first_psn: Psn::new(0),
            npkts: 0,
            started: false,
            acked_pkts: 0,
            part_pkts: 0,
            issued_pkts: 0,
        }
    }

    /// READ: response packet `k` is the last its READ request asks for (the LAST or ONLY
    /// of a part, IBTA vol. 1 §9.7.4 READ response segmentation per request).
    pub fn ends_request(&self, k: u32) -> bool {
        k + 1 == self.npkts || (self.part_pkts > 0 && (k + 1) % self.part_pkts == 0)
    }

    /// READ: the end (exclusive) of the part response packet `k` belongs to.
    fn part_end(&self, k: u32) -> u32 {
        match self.part_pkts {
            0 => self.npkts,
            p => (k / p + 1).saturating_mul(p).min(self.npkts),
        }
    }

    /// READ: its READ requests issued and not fully answered (each counts against
    /// max_rd_atomic as a READ of its own).
    fn parts_outstanding(&self) -> u32 {
        let p = self.part_pkts.max(1);
        let done = if self.acked_pkts >= self.npkts {
            self.npkts.div_ceil(p)
        } else {
            self.acked_pkts / p
        };
        self.issued_pkts.div_ceil(p).saturating_sub(done)
    }

    pub fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts - 1)
    }
    /// True when `p` is one of this message's PSNs.
    pub fn holds(&self, p: Psn) -> bool {
        self.started && !p.before(self.first_psn) && !p.after(self.last_psn())
    }
}

/// Where a request packet's payload is, once found.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ReqPayload<'a> {
    /// Borrowed from a region (or empty).
    Bytes(&'a [u8]),
    /// The first bytes of the gather buffer.
    Scratch(usize),
    /// A region's bytes found gone after all: nothing goes out this time.
    Unreadable,
}

/// A request packet, before addressing and framing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReqPacket<'a> {
    pub opcode: Opcode,
    pub psn: Psn,
    pub ack_req: bool,
    pub solicited: bool,
    pub ext: TxExt,
    pub payload: ReqPayload<'a>,
    /// A PSN sent before: counts as a retransmission.
    pub retransmit: bool,
    /// Why it is sent: `Request`, or the cause of the last rewind for a retransmission.
    pub reason: TxReason,
    /// The packet starts this work request (its wr_id), for the trace.
    pub started_wr: Option<u64>,
}

/// Limits the requester obeys, from the QP attributes and the device configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReqLimits {
    pub mtu: u32,
    pub max_rd_atomic: u32,
    pub max_unacked: u32,
    pub ack_every: u32,
    /// SQD: do not start new work requests.
    pub draining: bool,
    /// The READ credit bounds (`super::read_credit`).
    pub read: ReadBounds,
}

/// Bytes beyond the path MTU a data frame may carry (Ethernet, VLAN, IPv6, UDP, BTH, RETH,
/// ImmDt, ICRC), so the pacer is asked for a whole frame before one is built.
pub(crate) const PACING_HEADROOM: usize = 128;

/// What the requester's turn ([`Requester::poll_transmit`]) needs from its QP and its
/// device besides itself.
pub(crate) struct ReqTxEnv<'e> {
    pub cfg: &'e Config,
    /// The device's congestion control, when on (DCQCN pacing and AckReq cadence).
    pub cc: Option<&'e mut CongestionControl>,
    pub counters: &'e mut QpCounters,
    pub qpn: Qpn,
    /// The device name, for trace events.
    pub dev: &'static str,
    pub now: Instant,
    /// The path MTU in bytes.
    pub mtu: u32,
    /// The QP's local ACK timeout exponent (`ibv_qp_attr.timeout`).
    pub timeout: u8,
    pub max_rd_atomic: u8,
    /// SQD: do not start new work requests.
    pub draining: bool,
    /// A UC QP: UC opcodes, no AckReq, no retransmission timer.
    pub uc: bool,
    /// The device's READ response count (`super::read_credit`).
    pub read_pool: &'e ReadPool,
}

/// Requester state of one QP, private behind the methods below.
#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// The QP went RTS -> SQD with messages still outstanding: IBV_EVENT_SQ_DRAINED is
    /// owed once the last of them completes ([`Requester::drained_now`]).
    sq_drain_owed: bool,
    sq: VecDeque<SendWqe>,
    /// The next PSN a new message gets (sq_psn).
    next_psn: Psn,
    /// The first PSN never sent: packets before it are retransmissions.
    high_psn: Psn,
    /// Index in `sq` of the WR being transmitted (`sq.len()` = none).
    tx_idx: usize,
    /// Packet index in that WR.
    tx_pkt: u32,
    /// READ/atomic WRs started and not completed.
    rd_atomic_outstanding: u32,
    /// Receive-consuming messages started and not completed (for credits).
    recv_msgs_inflight: u32,
    /// Credits from the last ACK when honoured; `None` = unlimited.
    credits: Option<u32>,
    pkts_since_ack_req: u32,
    /// The retransmission (local ACK timeout) and RNR wait timers.
    timers: TimerTable,
    retry_left: u8,
    rnr_left: u8,
    /// The PSN of the last NAK- or implied-NAK-driven Go-Back-N, until progress is made:
    /// a burst of out-of-order responses triggers one retransmission, not one each.
    gbn_from: Option<Psn>,
    /// Why the transmit point last went back: the reason retransmissions carry.
    resend_reason: TxReason,
    /// The time and oldest unacknowledged PSN of the last progress after which packets
    /// were still outstanding: where the next progress measures how fast the peer
    /// acknowledges ([`Requester::ack_pace_ns`]). A timeout or Go-Back-N in between
    /// stays in the sample: the timer must outlast what the path really takes,
    /// recovery included (an expiry with nothing lost is what the pace is for).
    pace_from: Option<(super::time::Instant, Psn)>,
    /// Nanoseconds per acknowledged packet, a moving average over progress events (3/4
    /// of the old value, 1/4 of the new sample): how fast the path delivers.
    ack_pace_ns: Option<u64>,
    /// [`Requester::paced_ack_every`]'s last (pace, timeout, packets per quarter timeout).
    pace_memo: Option<(u64, u64, u32)>,
    /// READ response packets asked for and not yet received (`super::read_credit`).
    read_pkts_out: u32,
    /// The device's count of the same, once the first packet went out.
    read_pool: Option<ReadPool>,
    /// The next READ part waits for the device's bound (the device wakes the QP).
    read_held_dev: bool,
}

impl Drop for Requester {
    /// A QP destroyed or reset mid-READ gives its READ credit back to the device.
    fn drop(&mut self) {
        if let Some(p) = &self.read_pool {
            p.sub(self.read_pkts_out);
        }
    }
}

impl Requester {
    /// AckReq at least every this many packets so that, at the measured acknowledgement
    /// pace, an ACK comes back within a quarter of the local ACK timeout `timeout_ns`:
    /// on a path slower than `ack_every` packets per timeout (a TCG guest moves ~1 MB/s,
    /// so 64 packets of 1 KiB take about as long as perftest's 67 ms timeout) the timer
    /// would otherwise expire between ACKs with nothing lost, and each expiry resends a
    /// window behind the packets still queued at the receiver. `ack_every` when the pace
    /// is not known yet or fast enough.
    pub fn paced_ack_every(&mut self, ack_every: u32, timeout_ns: Option<u64>) -> u32 {
        match (self.ack_pace_ns, timeout_ns) {
            (Some(ns), Some(t)) => {
                // The division once per new pace or timeout, not once per packet.
                let n = match self.pace_memo {
                    Some((ns0, t0, n)) if ns0 == ns && t0 == t => n,
                    _ => {
                        let n = u32::try_from((t / 4) / ns.max(1)).unwrap_or(u32::MAX);
                        self.pace_memo = Some((ns, t, n));
                        n
                    }
                };
                n.clamp(1, ack_every.max(1))
            }
            _ => ack_every,
        }
    }

    /// `IBV_QP_SQ_PSN` set by modify (IBTA vol. 1 §10.3, §9.7.1): the next message starts
    /// at `psn`, and nothing before it counts as sent.
    pub(crate) fn set_sq_psn(&mut self, psn: Psn) {
        self.next_psn = psn;
        self.high_psn = psn;
    }

    /// The PSN the next new message gets (sq_psn, as `ibv_query_qp` reports it).
    pub(crate) fn next_psn(&self) -> Psn {
        self.next_psn
    }

    /// A UD datagram's PSN: one per datagram, never retransmitted (IBTA vol. 1 §9.8.3).
    pub(crate) fn take_psn(&mut self) -> Psn {
        let psn = self.next_psn;
        self.next_psn = psn.add(1);
        psn
    }

    /// `IBV_QP_RETRY_CNT` set by modify: the retry budget the next timeout or sequence
    /// NAK draws on (IBTA vol. 1 §9.7.6.1.3).
    pub(crate) fn set_retry_cnt(&mut self, retry_cnt: u8) {
        self.retry_left = retry_cnt;
    }

    /// `IBV_QP_RNR_RETRY` set by modify: the RNR retry budget (IBTA vol. 1 §9.7.5.2.8).
    pub(crate) fn set_rnr_retry(&mut self, rnr_retry: u8) {
        self.rnr_left = rnr_retry;
    }

    /// Retries left before a timeout or sequence NAK fails the head WR.
    pub(crate) fn retry_left(&self) -> u8 {
        self.retry_left
    }

    /// RNR retries left before an RNR NAK fails the head WR.
    pub(crate) fn rnr_left(&self) -> u8 {
        self.rnr_left
    }

    /// Whether IBV_EVENT_SQ_DRAINED is owed (the QP entered SQD) or not (it left SQD).
    pub(crate) fn owe_sq_drained(&mut self, owed: bool) {
        self.sq_drain_owed = owed;
    }

    /// Send WRs posted and not completed.
    pub(crate) fn sq_len(&self) -> usize {
        self.sq.len()
    }

    /// Send WRs started (some packet sent) and not completed.
    pub(crate) fn sq_started(&self) -> usize {
        self.sq.iter().filter(|w| w.started).count()
    }

    /// Post a send WR at the tail of the send queue (`ibv_post_send`).
    pub(crate) fn post(&mut self, wqe: SendWqe) {
        self.sq.push_back(wqe);
    }

    /// The QP's timer table (retransmission, RNR wait, DCQCN rate and pacer).
    pub(crate) fn timers(&self) -> &TimerTable {
        &self.timers
    }

    /// The QP's timer table, to arm or stop its timers.
    pub(crate) fn timers_mut(&mut self) -> &mut TimerTable {
        &mut self.timers
    }

    /// The local error the head WR completes with, when it failed locally (at post time,
    /// or when its bytes were found gone) and is at the transmit point.
    pub(crate) fn head_local_error(&self) -> Option<WcStatus> {
        if self.tx_idx != 0 {
            return None;
        }
        self.sq.front()?.segs.as_ref().err().copied()
    }

    /// Take the head WR off the send queue to complete it (IBTA vol. 1 §9.7.4: in posting
    /// order): it no longer counts against max_rd_atomic or the credits, the transmit
    /// point follows, and with nothing outstanding the retransmission timer stops.
    pub(crate) fn pop_completed(&mut self) -> Option<SendWqe> {
        let w = self.sq.pop_front()?;
        if w.started {
            if w.wr.opcode == WrOpcode::RdmaRead {
                // Completed (all answered) or flushed: what it still counts goes back.
                self.rd_atomic_outstanding = self
                    .rd_atomic_outstanding
                    .saturating_sub(w.parts_outstanding());
                self.read_returned(w.issued_pkts.saturating_sub(w.acked_pkts));
            } else if w.wr.opcode.is_read_or_atomic() {
                self.rd_atomic_outstanding = self.rd_atomic_outstanding.saturating_sub(1);
            }
            if w.wr.opcode.consumes_recv() {
                self.recv_msgs_inflight = self.recv_msgs_inflight.saturating_sub(1);
            }
        }
        if self.tx_idx == 0 {
            // We were (re)transmitting the WR that just completed: carry on with the next
            // one from its oldest unacknowledged packet.
            self.tx_pkt = match self.sq.front() {
                Some(f) if f.started => f.acked_pkts,
                _ => 0,
            };
        } else {
            self.tx_idx -= 1;
        }
        if !self.outstanding() {
            self.timers.stop(Timer::Retransmit);
        }
        Some(w)
    }

    /// UC (IBTA vol. 1 §9.4: completion on transmission): the packets of the head WR sent
    /// so far count as done.
    pub(crate) fn sent_counts_as_acked(&mut self) {
        if self.tx_idx == 0 {
            let k = self.tx_pkt;
            if let Some(w) = self.sq.front_mut().filter(|w| w.started) {
                w.acked_pkts = k;
            }
        }
    }

    /// The length of the head WR when all of it has been sent (the transmit point is past
    /// it), for UC's completion on transmission.
    pub(crate) fn head_sent_len(&self) -> Option<u32> {
        (self.tx_idx > 0).then(|| self.sq.front().map_or(0, |w| w.len))
    }

    /// The heap bytes the send queue holds, with `spilled` the bytes of one WR's checked
    /// segments beyond the QP (for the resource listing).
    pub(crate) fn heap_bytes(&self, spilled: impl Fn(&Segs) -> usize) -> usize {
        use core::mem::size_of;
        let wrs: usize = self
            .sq
            .iter()
            .map(|w| {
                w.wr.sg_list.capacity() * size_of::<super::wr::Sge>()
                    + w.segs.as_ref().map_or(0, &spilled)
            })
            .sum();
        self.sq.capacity() * size_of::<SendWqe>() + wrs
    }

    /// True when a packet with PSN `psn` was sent (it lies before the first PSN never
    /// sent): a response to anything else is a ghost (IBTA vol. 1 §9.7.4).
    pub(crate) fn sent(&self, psn: Psn) -> bool {
        psn.before(self.high_psn)
    }

    /// The credits of the last ACK, when honoured (IBTA vol. 1 §9.7.7); `None` =
    /// unlimited.
    pub(crate) fn set_credits(&mut self, credits: Option<u32>) {
        self.credits = credits;
    }

    /// The head WR of the send queue (the oldest not completed).
    pub(crate) fn head(&self) -> Option<&SendWqe> {
        self.sq.front()
    }

    /// The peer acknowledged `n` packets (or response packets) of the head WR. For a
    /// READ, the responses in give their credit back, and each part fully answered its
    /// max_rd_atomic slot.
    pub(crate) fn head_acked(&mut self, n: u32) {
        let Some(w) = self.sq.front_mut() else {
            return;
        };
        if w.wr.opcode != WrOpcode::RdmaRead {
            w.acked_pkts = n;
            return;
        }
        let (parts0, acked0) = (w.parts_outstanding(), w.acked_pkts);
        w.acked_pkts = n;
        let parts_done = parts0.saturating_sub(w.parts_outstanding());
        self.rd_atomic_outstanding = self.rd_atomic_outstanding.saturating_sub(parts_done);
        self.read_returned(n.saturating_sub(acked0));
    }

    /// `n` READ response packets no longer outstanding (in, or their WR flushed).
    fn read_returned(&mut self, n: u32) {
        let n = n.min(self.read_pkts_out);
        self.read_pkts_out -= n;
        if let Some(p) = &self.read_pool {
            p.sub(n);
        }
    }

    /// READ response packets this QP asked for and has not received.
    #[cfg(test)]
    pub(crate) fn read_outstanding(&self) -> u32 {
        self.read_pkts_out
    }

    /// READ requests (parts) and atomics in flight, against max_rd_atomic.
    #[cfg(test)]
    pub(crate) fn rd_atomic_in_flight(&self) -> u32 {
        self.rd_atomic_outstanding
    }

    /// The next READ part waits for room under the device's bound: the device wakes this
    /// QP when responses to any QP free some (`super::read_credit`).
    pub(crate) fn read_held_by_device(&self) -> bool {
        self.read_held_dev
    }

    /// Use one retry of retry_cnt (a timeout or a sequence NAK, IBTA vol. 1 §9.7.6.1.3):
    /// false when none is left.
    pub(crate) fn take_retry(&mut self) -> bool {
        if self.retry_left == 0 {
            return false;
        }
        self.retry_left -= 1;
        true
    }

    /// Use one RNR retry of rnr_retry (IBTA vol. 1 §9.7.5.2.8): false when none is left.
    pub(crate) fn take_rnr_retry(&mut self) -> bool {
        if self.rnr_left == 0 {
            return false;
        }
        self.rnr_left -= 1;
        true
    }

    /// True when a NAK- or implied-NAK-driven Go-Back-N from `p` already ran and no
    /// progress came since: a burst of out-of-order responses rewinds once, not once each.
    pub(crate) fn going_back_from(&self, p: Psn) -> bool {
        self.gbn_from == Some(p)
    }

    /// Go-Back-N from `p` for a NAK or implied NAK (IBTA vol. 1 §9.7.4, §9.7.5): the
    /// packets from `p` on go out again, tagged `reason`.
    pub(crate) fn go_back(&mut self, p: Psn, reason: TxReason) {
        self.gbn_from = Some(p);
        self.resend_reason = reason;
        self.rewind(p);
    }

    /// An RNR NAK for `psn` with timer code `timer` (IBTA vol. 1 §9.7.5.2.8, table 45):
    /// send nothing until `now` + the timer, then resend from `psn`. The ACK timer stops
    /// meanwhile: the peer told us why it is silent.
    pub(crate) fn wait_rnr(&mut self, now: Instant, timer: u8, psn: Psn) {
        self.timers
            .arm(Timer::RnrWait, now, Some(super::timers::rnr_timer(timer)));
        self.timers.stop(Timer::Retransmit);
        self.gbn_from = None;
        self.resend_reason = TxReason::RnrRetry;
        self.rewind(psn);
    }

    /// The local ACK timeout expired with work outstanding (IBTA vol. 1 §9.7.6): resend
    /// from the oldest unacknowledged PSN and re-arm the timer for `timeout` (the QP's
    /// exponent). Returns that PSN.
    pub(crate) fn go_back_on_timeout(&mut self, now: Instant, timeout: u8) -> Psn {
        let una = self.una();
        self.gbn_from = None;
        self.resend_reason = TxReason::RetransmitTimeout;
        self.rewind(una);
        self.timers
            .arm(Timer::Retransmit, now, local_ack_timeout(timeout));
        una
    }

    /// Forward progress at `now` (IBTA vol. 1 §9.7.6): refill the retry budgets to
    /// retry_cnt and rnr_retry, restart the ACK timer for `timeout` (the QP's exponent),
    /// and measure how fast the peer acknowledges (`paced_ack_every` follows it).
    pub(crate) fn progress(&mut self, now: Instant, retry_cnt: u8, rnr_retry: u8, timeout: u8) {
        let una = self.una();
        if let Some((t0, u0)) = self.pace_from {
            let acked = una.diff(u0);
            if acked > 0 {
                let sample = super::time::duration_nanos(now - t0) / acked as u64;
                self.ack_pace_ns = Some(match self.ack_pace_ns {
                    Some(old) => (old.saturating_mul(3) / 4).saturating_add(sample / 4),
                    None => sample,
                });
            }
        }
        self.pace_from = self.outstanding().then_some((now, una));
        self.retry_left = retry_cnt;
        self.rnr_left = rnr_retry;
        self.gbn_from = None;
        self.timers
            .arm(Timer::Retransmit, now, local_ack_timeout(timeout));
    }

    /// Oldest PSN not yet acknowledged (or the next new PSN when nothing is outstanding).
    pub fn una(&self) -> Psn {
        match self.sq.front() {
            Some(w) if w.started => w.first_psn.add(w.acked_pkts),
            _ => self.next_psn,
        }
    }

    /// True when some started WR waits for an acknowledgement.
    pub fn outstanding(&self) -> bool {
        self.sq.front().is_some_and(|w| w.started)
    }

    /// The owed SQ_DRAINED is due now (the last outstanding message completed): true
    /// once, clearing the debt.
    pub fn drained_now(&mut self) -> bool {
        let due = self.sq_drain_owed && !self.outstanding();
        if due {
            self.sq_drain_owed = false;
        }
        due
    }

    /// Move the transmit point back to PSN `p` (Go-Back-N, IBTA §9.7.4 requester retry).
    pub fn rewind(&mut self, p: Psn) {
        match self.sq.iter().position(|w| w.holds(p)) {
            Some(i) => {
                self.tx_idx = i;
                self.tx_pkt = p.diff(self.sq[i].first_psn) as u32;
            }
            None => {
                self.tx_idx = self
                    .sq
                    .iter()
                    .position(|w| !w.started)
                    .unwrap_or(self.sq.len());
                self.tx_pkt = 0;
            }
        }
    }

    /// The requester's turn at the wire: the next request packet of the QP, with its
    /// payload (borrowed from a region or gathered into `bufs.scratch`), the AckReq
    /// cadence and the DCQCN pacing decided, the retransmission timer armed and the
    /// retransmission counted. `None` when it has nothing to send now (paced, an RNR
    /// wait, the window full, the queue empty, or the head WR's bytes just found gone:
    /// the caller's `fail_local_error_at_head` then fails it).
    // Inlined into its one caller, `transmit_qp`: the packet description stays in
    // registers instead of being returned through memory (as `next_packet` into this).
    #[inline(always)]
    pub fn poll_transmit<'a>(&mut self, env: ReqTxEnv<'_>, bufs: TxBufs<'a>) -> Option<Tx<'a>> {
        let ReqTxEnv {
            cfg,
            cc,
            counters,
            qpn,
            dev,
            now,
            mtu,
            timeout,
            max_rd_atomic,
            draining,
            uc,
            read_pool,
        } = env;
        if self.read_pool.is_none() {
            self.read_pool = Some(read_pool.clone());
        }
        // Nothing at the send position (`next_packet` would find no WR): no packet, and
        // no question to the congestion control, whose refusal would only arm a pacer
        // hold, and a timer, for a QP with nothing to send. The call after every packet
        // sent ends here, which keeps the rate look-ups off each step's path.
        self.sq.get(self.tx_idx)?;
        // A throttled QP asks for ACKs often enough that one comes back within a quarter
        // of its local ACK timeout: at a DCQCN rate of a few Mb/s, 64 packets take longer
        // than the timeout itself, which would then expire with nothing lost (§9.7.6.1:
        // the timer restarts only on progress).
        let ack_every = match &cc {
            Some(cc) => local_ack_timeout(timeout)
                .and_then(|t| {
                    cc.throttled_packets_within(qpn, t / 4, mtu as usize + PACING_HEADROOM)
                })
                .map_or(cfg.ack_every, |n| n.clamp(1, cfg.ack_every)),
            None => cfg.ack_every,
        };
        // At the pace the peer acknowledges (a slow path: an emulated guest), an ACK
        // comes back within a quarter of the local ACK timeout too.
        let ack_every = self.paced_ack_every(ack_every, local_ack_timeout_ns(timeout));
        let lim = ReqLimits {
            mtu,
            max_rd_atomic: u32::from(max_rd_atomic),
            max_unacked: cfg.max_unacked_psns,
            ack_every,
            draining,
            read: ReadBounds::of(cfg),
        };
        // DCQCN: the requester's frames leave at the QP's current rate.
        if let Some(cc) = cc {
            if !cc.may_send(now, qpn, mtu as usize + PACING_HEADROOM) {
                return None;
            }
        }
        let TxBufs { mem, scratch } = bufs;
        let idle = !self.outstanding();
        let p = self.next_packet(&lim, mem, scratch, cfg.honour_credits, now, counters)?;
        if idle {
            // The first packet after the QP had nothing outstanding: the pace sample
            // starts here, not at the last ACK before the idle time (a QP that sends one
            // message a second would otherwise measure a second per packet and ask for an
            // ACK on every packet, `paced_ack_every`).
            self.pace_from = Some((now, p.psn));
        }
        if let Some(wr_id) = p.started_wr {
            qp_event!(
                now,
                dev,
                qpn,
                Event::WqeStarted,
                wr_id = wr_id,
                first_psn = p.psn.value()
            );
        }
        if p.retransmit {
            counters.retransmitted_packets += 1;
        }
        if !self.timers.is_armed(Timer::Retransmit) && !uc {
            self.timers
                .arm(Timer::Retransmit, now, local_ack_timeout(timeout));
            if let Some(at) = self.timers.get(Timer::Retransmit) {
                qp_event!(
                    now,
                    dev,
                    qpn,
                    Event::TimerArmed,
                    timer = "ack",
                    at_ns = at.as_nanos()
                );
            }
        }
        // `next_packet` checked the bytes of a `Mem` payload in this same call (a region
        // gone meanwhile fails the WR instead, LOC_PROT_ERR).
        let scratch: &'a Vec<u8> = scratch;
        let payload = match p.payload {
            ReqPayload::Bytes(b) => b,
            ReqPayload::Scratch(n) => &scratch[..n],
            ReqPayload::Unreadable => return Some(Tx::Unreadable),
        };
        // UC: the RC opcode's UC twin (IBTA §9.2.1, table 38), no AckReq.
        let (opcode, ack_req) = if uc {
            (Opcode(p.opcode.0 | 0x20), false)
        } else {
            (p.opcode, p.ack_req)
        };
        Some(Tx::Send(TxPacket {
            bth: BthFields {
                opcode,
                psn: p.psn,
                ack_req,
                solicited: p.solicited,
            },
            ext: p.ext,
            payload,
            reason: p.reason,
        }))
    }

    /// The next request packet, advancing the transmit point: the requester's steps in
    /// the order rxe's `rxe_requester` takes them (IBTA vol. 1 §9.7.2, §9.7.4), each a
    /// function named after its rule.
    // Inlined into its one caller (the per-packet transmit path): the packet stays in
    // registers instead of being returned through memory.
    #[inline]
    pub fn next_packet<'a>(
        &mut self,
        lim: &ReqLimits,
        mem: &'a MemTable,
        scratch: &mut Vec<u8>,
        honour_credits: bool,
        now: Instant,
        counters: &mut QpCounters,
    ) -> Option<ReqPacket<'a>> {
        if self.in_rnr_wait(now) {
            return None;
        }
        let una = self.una();
        let idx = self.tx_idx;
        let borrowed = self.check_payload(idx, lim.mtu, mem)?;
        let new_part = self.check_read_credit(idx, lim, counters)?;
        // Looked up again only when starting it changed it (once per message).
        let started_wr = if self.sq[idx].started {
            None
        } else {
            Some(self.start_message(idx, lim, honour_credits, una)?)
        };
        let k = self.tx_pkt;
        let psn = self.sq[idx].first_psn.add(k);
        // A READ's later parts are bounded by its READ credit instead of the PSN window
        // (their PSNs stand for responses, which the credit counts).
        let later_part = k > 0 && self.sq[idx].wr.opcode == WrOpcode::RdmaRead;
        if !later_part && !window_open(psn, una, lim.max_unacked) {
            return None;
        }
        let (opcode, ext, payload, end) =
            self.request_headers(idx, k, lim.mtu, mem, scratch, borrowed)?;
        let w = &self.sq[idx];
        let op = w.wr.opcode;
        let solicited = solicited(w, end);
        // A READ request stands for all the response PSNs of its part.
        let (reserve_end, wr_done) = if op == WrOpcode::RdmaRead {
            let pe = w.part_end(k);
            (w.first_psn.add(pe), pe == w.npkts)
        } else {
            (psn.add(1), op.is_read_or_atomic() || end)
        };
        if new_part {
            self.issue_read_part(idx, k, counters);
        }
        let ack_req = self.ack_req(psn, una, end, lim);
        let retransmit = psn.before(self.high_psn);
        self.advance(wr_done, reserve_end);
        Some(ReqPacket {
            opcode,
            psn,
            ack_req,
            solicited,
            ext,
            payload,
            retransmit,
            reason: if retransmit {
                self.resend_reason
            } else {
                TxReason::Request
            },
            started_wr,
        })
    }

    /// Rule: a READ part not asked for yet goes out only within max_rd_atomic (each part
    /// is a READ request of its own, IBTA vol. 1 §9.7.4 / C9-151) and the READ credit
    /// (`super::read_credit`): `None` while held (counted by the bound that held it),
    /// else whether the packet at the transmit point is such a new part. Checked before
    /// a READ starts, so a held READ takes no PSNs.
    #[inline(always)]
    fn check_read_credit(
        &mut self,
        idx: usize,
        lim: &ReqLimits,
        counters: &mut QpCounters,
    ) -> Option<bool> {
        let w = &self.sq[idx];
        if w.wr.opcode != WrOpcode::RdmaRead {
            return Some(false);
        }
        let n = if w.started {
            let k = self.tx_pkt;
            if k < w.issued_pkts {
                // A retry of a part already asked for: its credit is counted.
                return Some(false);
            }
            w.part_end(k) - k
        } else {
            let npkts = w.len.div_ceil(lim.mtu).max(1);
            lim.read.part_pkts(lim.max_rd_atomic, npkts)
        };
        if self.rd_atomic_outstanding >= lim.max_rd_atomic {
            return None;
        }
        let dev_out = self.read_pool.as_ref().map_or(0, ReadPool::outstanding);
        match lim.read.admit(n, self.read_pkts_out, dev_out) {
            Ok(()) => {
                self.read_held_dev = false;
                Some(true)
            }
            Err(Held::Qp) => {
                counters.read_held_qp_credit += 1;
                None
            }
            Err(Held::Device) => {
                counters.read_held_device_credit += 1;
                self.read_held_dev = true;
                if let Some(p) = &self.read_pool {
                    p.mark_held();
                }
                if idx == 0 && self.read_pkts_out == 0 {
                    // Nothing of this QP is in flight: no ACK timeout may run out while
                    // it waits for other QPs' responses (it is re-armed on sending).
                    self.timers.stop(Timer::Retransmit);
                }
                None
            }
        }
    }

    /// A new READ part of the WR at `idx` goes out from response packet `k`: it takes a
    /// max_rd_atomic slot and its responses' credit.
    #[inline(always)]
    fn issue_read_part(&mut self, idx: usize, k: u32, counters: &mut QpCounters) {
        let w = &mut self.sq[idx];
        let end = w.part_end(k);
        let n = end - k;
        w.issued_pkts = end;
        self.rd_atomic_outstanding += 1;
        self.read_pkts_out += n;
        if let Some(p) = &self.read_pool {
            p.add(n);
        }
        if k > 0 {
            counters.read_requests_split += 1;
        }
    }

    /// Rule: nothing is sent while an RNR NAK's timer runs (IBTA vol. 1 §9.7.5.2.8; rxe
    /// `rnr_nak_timer`).
    #[inline(always)]
    fn in_rnr_wait(&self, now: Instant) -> bool {
        self.timers.get(Timer::RnrWait).is_some_and(|t| now < t)
    }

    /// Rule: the WR at the transmit point `idx` may send its next packet only when its
    /// bytes are still there (the region may have been deregistered since the post): else
    /// the WR fails LOC_PROT_ERR, as rxe's `copy_data` failure does, and nothing is sent
    /// for it. A WR failed locally waits at the head for its error completion (see
    /// `transmit_qp`). Skips what the peer acknowledged while the requester went back.
    /// `None`: nothing to send; else the packet's bytes when one owned segment holds
    /// them (found once, here).
    #[inline(always)]
    fn check_payload<'a>(
        &mut self,
        idx: usize,
        mtu: u32,
        mem: &'a MemTable,
    ) -> Option<Option<&'a [u8]>> {
        let w = self.sq.get(idx)?;
        if idx == 0 && w.started && self.tx_pkt < w.acked_pkts {
            // Acknowledged while we were going back: skip what the peer already has.
            self.tx_pkt = w.acked_pkts;
        }
        let Ok(segs) = &w.segs else {
            return None;
        };
        if w.wr.opcode.is_read_or_atomic() {
            return Some(None);
        }
        let k = if w.started { self.tx_pkt } else { 0 };
        let (off, len) = segment_range(w, k, mtu);
        let borrowed = borrow_run(mem, segs, off, len);
        if borrowed.is_none() && !readable(mem, segs, off, len) {
            self.sq[idx].segs = Err(WcStatus::LocProtErr);
            return None;
        }
        Some(borrowed)
    }

    /// Rule: starting a new message, every limit applies (IBTA vol. 1 §9.7.4
    /// max_rd_atomic, §9.7.7 credits, the FENCE rule of §10.8, SQD draining, the PSN
    /// window; rxe `req_next_wqe`, `check_init_depth`): `None` while one holds it back.
    /// Else the WR gets its PSNs (§9.7.1: one per packet, one per response packet for a
    /// READ, one for an atomic) and its wr_id is returned for the trace.
    #[inline(always)]
    fn start_message(
        &mut self,
        idx: usize,
        lim: &ReqLimits,
        honour_credits: bool,
        una: Psn,
    ) -> Option<u64> {
        let w = &self.sq[idx];
        if lim.draining {
            return None;
        }
        let op = w.wr.opcode;
        // A READ's parts are checked against max_rd_atomic one by one (`check_read_credit`).
        let atomic = op.is_read_or_atomic() && op != WrOpcode::RdmaRead;
        if atomic && self.rd_atomic_outstanding >= lim.max_rd_atomic {
            return None;
        }
        if w.wr.send_flags.contains(SendFlags::FENCE) && self.rd_atomic_outstanding > 0 {
            return None;
        }
        if honour_credits && op.consumes_recv() {
            if let Some(c) = self.credits {
                // With no credit one message may still go, as a probe (§9.7.7).
                if self.recv_msgs_inflight >= c.max(1) {
                    return None;
                }
            }
        }
        if self.next_psn.diff(una) >= lim.max_unacked as i32 {
            return None;
        }
        let npkts = match op {
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => 1,
            _ => w.len.div_ceil(lim.mtu).max(1),
        };
        let first = self.next_psn;
        let w = &mut self.sq[idx];
        w.first_psn = first;
        w.npkts = npkts;
        w.started = true;
        w.acked_pkts = 0;
        w.issued_pkts = 0;
        w.part_pkts = if op == WrOpcode::RdmaRead {
            lim.read.part_pkts(lim.max_rd_atomic, npkts)
        } else {
            0
        };
        self.next_psn = first.add(npkts);
        if atomic {
            self.rd_atomic_outstanding += 1;
        }
        if op.consumes_recv() {
            self.recv_msgs_inflight += 1;
        }
        self.tx_pkt = 0;
        Some(w.wr.wr_id)
    }

    /// The opcode, extension headers and payload of packet `k` of the WR at `idx`, and
    /// whether it ends its message: a READ request ([`read_request_ext`]), an atomic
    /// ([`atomic_request`]) or a SEND/WRITE segment ([`Requester::data_payload`],
    /// [`data_ext`], [`segment_opcode`]). `None` when the payload could not be gathered.
    #[inline(always)]
    fn request_headers<'a>(
        &mut self,
        idx: usize,
        k: u32,
        mtu: u32,
        mem: &'a MemTable,
        scratch: &mut Vec<u8>,
        borrowed: Option<&'a [u8]>,
    ) -> Option<(Opcode, TxExt, ReqPayload<'a>, bool)> {
        let w = &self.sq[idx];
        let op = w.wr.opcode;
        let no_payload = ReqPayload::Bytes(&[]);
        match op {
            WrOpcode::RdmaRead => Some((
                Opcode::RC_READ_REQUEST,
                read_request_ext(w, k, w.part_end(k), mtu),
                no_payload,
                true,
            )),
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
                let (opcode, ext) = atomic_request(w);
                Some((opcode, ext, no_payload, true))
            }
            _ => {
                let payload = self.data_payload(idx, k, mtu, mem, scratch, borrowed)?;
                let w = &self.sq[idx];
                let only = w.npkts == 1;
                let first = k == 0;
                let end = k + 1 == w.npkts;
                let ext = data_ext(w, first, end);
                Some((segment_opcode(op, only, first, end), ext, payload, end))
            }
        }
    }

    /// The payload of SEND/WRITE packet `k` of the WR at `idx`: the bytes `check_payload`
    /// borrowed, else gathered into `scratch`. Checked by `readable` before; a copy can
    /// still fail on another process's memory (the process died meanwhile): then nothing
    /// is sent and the WR fails LOC_PROT_ERR at the head, as for a region gone (`None`).
    #[inline(always)]
    fn data_payload<'a>(
        &mut self,
        idx: usize,
        k: u32,
        mtu: u32,
        mem: &'a MemTable,
        scratch: &mut Vec<u8>,
        borrowed: Option<&'a [u8]>,
    ) -> Option<ReqPayload<'a>> {
        if let Some(b) = borrowed {
            return Some(ReqPayload::Bytes(b));
        }
        let w = &self.sq[idx];
        let (off, len) = segment_range(w, k, mtu);
        let gathered = match &w.segs {
            Ok(segs) => gather(mem, segs, off, len, scratch),
            Err(_) => Some(Payload::None),
        };
        match gathered {
            None => {
                self.sq[idx].segs = Err(WcStatus::LocProtErr);
                None
            }
            Some(Payload::None) => Some(ReqPayload::Bytes(&[])),
            Some(Payload::Scratch(n)) => Some(ReqPayload::Scratch(n)),
            Some(Payload::Mem { mem: m, skip, len }) => Some(
                mem.bytes(m, skip, len)
                    .map_or(ReqPayload::Unreadable, ReqPayload::Bytes),
            ),
        }
    }

    /// Rule: AckReq (IBTA vol. 1 §9.7.2; rxe): on the last packet of every message, at
    /// least every `ack_every` packets, and when the window is about to close.
    #[inline(always)]
    fn ack_req(&mut self, psn: Psn, una: Psn, end: bool, lim: &ReqLimits) -> bool {
        self.pkts_since_ack_req += 1;
        let window_edge = psn.diff(una) + 1 >= lim.max_unacked as i32;
        let ack_req = end || self.pkts_since_ack_req >= lim.ack_every || window_edge;
        if ack_req {
            self.pkts_since_ack_req = 0;
        }
        ack_req
    }

    /// Advance the transmit point past the packet just built (to the next WR when
    /// `wr_done`) and the first PSN never sent to `reserve_end` (rxe `update_wqe_state`,
    /// `update_state`).
    #[inline(always)]
    fn advance(&mut self, wr_done: bool, reserve_end: Psn) {
        if wr_done {
            self.tx_idx += 1;
            self.tx_pkt = 0;
        } else if let Some(w) = self
            .sq
            .get(self.tx_idx)
            .filter(|w| w.wr.opcode == WrOpcode::RdmaRead)
        {
            // The next part of the READ.
            self.tx_pkt = w.part_end(self.tx_pkt);
        } else {
            self.tx_pkt += 1;
        }
        if reserve_end.after(self.high_psn) {
            self.high_psn = reserve_end;
        }
    }
}

/// Rule: a packet goes out only within `max_unacked` PSNs of the oldest unacknowledged
/// one (the requester's window, IBTA vol. 1 §9.7.1; the oldest itself always may).
#[inline(always)]
fn window_open(psn: Psn, una: Psn, max_unacked: u32) -> bool {
    psn == una || psn.diff(una) < max_unacked as i32
}

/// The byte offset and length of packet `k` of `w` at path MTU `mtu` (IBTA vol. 1 §9.7.2
/// segmentation).
#[inline(always)]
fn segment_range(w: &SendWqe, k: u32, mtu: u32) -> (usize, usize) {
    let off = k as usize * mtu as usize;
    let len = (w.len as usize - off.min(w.len as usize)).min(mtu as usize);
    (off, len)
}

/// Rule: a READ request's RETH (IBTA vol. 1 §9.3.2) for response packets `k` up to
/// `end` (a part, `super::read_credit`); a retried READ asks only for the responses still
/// missing from packet `k` on (§9.7.4).
#[inline(always)]
fn read_request_ext(w: &SendWqe, k: u32, end: u32, mtu: u32) -> TxExt {
    let off = u64::from(k) * u64::from(mtu);
    let stop = (u64::from(end) * u64::from(mtu)).min(u64::from(w.len));
    TxExt::Reth(RethRepr {
        va: w.wr.rdma.remote_addr.wrapping_add(off),
        rkey: w.wr.rdma.rkey,
        dma_len: stop.saturating_sub(off) as u32,
    })
}

/// Rule: an atomic's opcode and AtomicETH (IBTA vol. 1 §9.3.3): compare-and-swap carries
/// swap and compare, fetch-and-add the addend.
#[inline(always)]
fn atomic_request(w: &SendWqe) -> (Opcode, TxExt) {
    let a = &w.wr.atomic;
    if w.wr.opcode == WrOpcode::AtomicCmpAndSwp {
        let eth = AtomicEthRepr {
            va: a.remote_addr,
            rkey: a.rkey,
            swap_add: a.swap,
            compare: a.compare_add,
        };
        (Opcode::RC_CMP_SWAP, TxExt::Atomic(eth))
    } else {
        let eth = AtomicEthRepr {
            va: a.remote_addr,
            rkey: a.rkey,
            swap_add: a.compare_add,
            compare: 0,
        };
        (Opcode::RC_FETCH_ADD, TxExt::Atomic(eth))
    }
}

/// Rule: the extension headers of a SEND/WRITE segment (IBTA vol. 1 §9.3, §9.4): RETH on
/// the first packet of a WRITE, ImmDt or IETH on the last of a message with immediate or
/// invalidate.
#[inline(always)]
fn data_ext(w: &SendWqe, first: bool, end: bool) -> TxExt {
    let op = w.wr.opcode;
    let imm = matches!(op, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
    let write = matches!(op, WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm);
    let reth = RethRepr {
        va: w.wr.rdma.remote_addr,
        rkey: w.wr.rdma.rkey,
        dma_len: w.len,
    };
    match (
        write && first,
        end && imm,
        end && op == WrOpcode::SendWithInv,
    ) {
        (true, true, _) => TxExt::RethImm(reth, w.wr.imm_data),
        (true, false, _) => TxExt::Reth(reth),
        (false, true, _) => TxExt::Imm(w.wr.imm_data),
        (false, false, true) => TxExt::Ieth(w.wr.invalidate_rkey),
        (false, false, false) => TxExt::None,
    }
}

/// Rule: the solicited event bit (IBTA vol. 1 §9.2.3 SE, §10.7.2.1): on the last packet
/// of a SEND or WRITE with immediate posted with IBV_SEND_SOLICITED.
#[inline(always)]
fn solicited(w: &SendWqe, end: bool) -> bool {
    end && w.wr.send_flags.contains(SendFlags::SOLICITED)
        && matches!(
            w.wr.opcode,
            WrOpcode::Send
                | WrOpcode::SendWithImm
                | WrOpcode::SendWithInv
                | WrOpcode::RdmaWriteWithImm
        )
}

// Inlined: once per packet, a jump table the caller's branches can feed directly.
#[inline]
fn segment_opcode(op: WrOpcode, only: bool, first: bool, end: bool) -> Opcode {
    use WrOpcode as W;
    match (op, only, first, end) {
        (W::Send, true, ..) => Opcode::RC_SEND_ONLY,
        (W::SendWithImm, true, ..) => Opcode::RC_SEND_ONLY_IMM,
        (W::SendWithInv, true, ..) => Opcode::RC_SEND_ONLY_INV,
        (W::Send | W::SendWithImm | W::SendWithInv, false, true, _) => Opcode::RC_SEND_FIRST,
        (W::Send, false, false, true) => Opcode::RC_SEND_LAST,
        (W::SendWithImm, false, false, true) => Opcode::RC_SEND_LAST_IMM,
        (W::SendWithInv, false, false, true) => Opcode::RC_SEND_LAST_INV,
        (W::Send | W::SendWithImm | W::SendWithInv, ..) => Opcode::RC_SEND_MIDDLE,
        (W::RdmaWrite, true, ..) => Opcode::RC_WRITE_ONLY,
        (W::RdmaWriteWithImm, true, ..) => Opcode::RC_WRITE_ONLY_IMM,
        (_, false, true, _) => Opcode::RC_WRITE_FIRST,
        (W::RdmaWrite, false, false, true) => Opcode::RC_WRITE_LAST,
        (W::RdmaWriteWithImm, false, false, true) => Opcode::RC_WRITE_LAST_IMM,
        _ => Opcode::RC_WRITE_MIDDLE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_opcodes() {
        use WrOpcode as W;
        assert_eq!(
            segment_opcode(W::Send, true, true, true),
            Opcode::RC_SEND_ONLY
        );
        assert_eq!(
            segment_opcode(W::Send, false, true, false),
            Opcode::RC_SEND_FIRST
        );
        assert_eq!(
            segment_opcode(W::SendWithImm, false, false, false),
            Opcode::RC_SEND_MIDDLE
        );
        assert_eq!(
            segment_opcode(W::SendWithImm, false, false, true),
            Opcode::RC_SEND_LAST_IMM
        );
        assert_eq!(
            segment_opcode(W::SendWithInv, false, false, true),
            Opcode::RC_SEND_LAST_INV
        );
        assert_eq!(
            segment_opcode(W::SendWithInv, true, true, true),
            Opcode::RC_SEND_ONLY_INV
        );
        assert_eq!(
            segment_opcode(W::RdmaWrite, false, true, false),
            Opcode::RC_WRITE_FIRST
        );
        assert_eq!(
            segment_opcode(W::RdmaWriteWithImm, false, true, false),
            Opcode::RC_WRITE_FIRST
        );
        assert_eq!(
            segment_opcode(W::RdmaWrite, false, false, false),
            Opcode::RC_WRITE_MIDDLE
        );
        assert_eq!(
            segment_opcode(W::RdmaWrite, false, false, true),
            Opcode::RC_WRITE_LAST
        );
        assert_eq!(
            segment_opcode(W::RdmaWriteWithImm, false, false, true),
            Opcode::RC_WRITE_LAST_IMM
        );
        assert_eq!(
            segment_opcode(W::RdmaWriteWithImm, true, true, true),
            Opcode::RC_WRITE_ONLY_IMM
        );
    }
}
