//! A simulated Ethernet link and a two-device harness, on virtual time.
//!
//! Contract: [`Link`] carries real frame bytes (as emitted by `FrameRepr::emit`) between two
//! sides, with seeded loss, reordering, duplication, single-bit corruption, a fixed
//! propagation delay and a serialization rate. The PRNG is `rand_chacha::ChaCha8Rng`
//! seeded explicitly: the same seed and the same sequence of calls give the same run.
//! Corruption flips one uniformly chosen bit anywhere in the frame. The receiver drops it
//! by structure (Ethernet address, IP checksum, lengths), or by the ICRC; a flip in a field
//! that neither covers (source MAC, UDP checksum, IPv6 traffic class/flow label/hop limit,
//! BTH byte 4 FECN/BECN/reserved) is harmless by design of RoCE v2 and goes through.
//!
//! [`Pair`] runs two [`Rnic`]s over one link: it delivers due frames, runs due timers and
//! lets each side transmit only when its side of the link is free (a NIC's transmit queue
//! is drained at line rate, so in-flight data is bounded by the bandwidth-delay product,
//! not by how fast the engine can produce frames). A frame due as soon as it is sent (zero
//! delay and infinite rate) reaches its receiver before the sender builds the next one.
//! It never reads a clock.
//!
//! With [`Pair::pcap`] set, every frame a device transmits is written to a pcapng file on
//! that device's interface (0 = A, 1 = B), as the device emitted it, before the link
//! touches it, at the virtual time it was sent (nanoseconds since the start of the run, so
//! Wireshark shows dates in January 1970). Frames are recorded once, at their sender:
//! what each device received is what the other sent, minus what the comments say the
//! link did (dropped, duplicated, corrupted, delayed past later frames). Every frame that
//! is not the obvious next one carries a comment with the engine's [`TxReason`].

pub mod dumbbell;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::io::pcap_out::{Direction, Interface, PcapNgOut};
use crate::proto::Instant;
use crate::proto::verdict::RxTally;
use crate::proto::{
    Access, AddressVector, AttrMask, Config, Cq, MAX_FRAME_LEN, Mtu, Pd, QpAttr, QpInitAttr,
    QpState, Rnic, TxReason, VerbsError, ipv4_gid,
};
use crate::wire::{Psn, Qpn, mark_ce};

/// One end of the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    A,
    B,
}

impl Side {
    pub fn other(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
    fn idx(self) -> usize {
        self as usize
    }
}

/// Link impairments. Probabilities are per frame, in `0.0..=1.0`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkConfig {
    pub loss: f64,
    pub reorder: f64,
    pub dup: f64,
    pub corrupt: f64,
    /// One-way propagation delay.
    pub delay_ns: u64,
    /// A reordered frame is held back by up to this much extra.
    pub reorder_extra_ns: u64,
    /// Serialization rate in bits per second; 0 = infinite.
    pub bandwidth_bps: u64,
    /// Probability that the link sets CE on an ECN-capable IPv4/IPv6 frame, as a
    /// congested ECN switch would (RFC 3168); the ICRC does not cover the ECN bits.
    pub ce_mark: f64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            loss: 0.0,
            reorder: 0.0,
            dup: 0.0,
            corrupt: 0.0,
            delay_ns: 2_000,
            reorder_extra_ns: 20_000,
            bandwidth_bps: 25_000_000_000,
            ce_mark: 0.0,
        }
    }
}

/// What the link did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinkStats {
    pub frames_sent: u64,
    pub frames_delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub reordered: u64,
    pub ce_marked: u64,
}

/// What the link did to one frame put on it ([`Link::send`], [`Link::send_owned`]).
#[must_use = "the fate says whether the frame reaches the other side"]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkFate {
    /// Dropped: it never arrives.
    pub lost: bool,
    /// Delivered twice.
    pub duplicated: bool,
    /// A bit flipped on its way (one of the copies, when duplicated).
    pub corrupted: bool,
    /// Marked CE (congestion experienced).
    pub ce_marked: bool,
    /// Delayed past later frames (one of the copies, when duplicated).
    pub reordered: bool,
}

impl LinkFate {
    /// What the link did, in words (a capture comment); empty for a frame delivered as
    /// sent.
    pub fn describe(self) -> Vec<&'static str> {
        [
            (self.lost, "the link drops this frame"),
            (self.duplicated, "the link delivers this frame twice"),
            (
                self.corrupted,
                "the link flips a bit of this frame on its way",
            ),
            (
                self.ce_marked,
                "the link marks this frame CE (congestion experienced)",
            ),
            (self.reordered, "the link delays this frame past later ones"),
        ]
        .into_iter()
        .filter_map(|(on, what)| on.then_some(what))
        .collect()
    }
}

#[derive(Debug)]
struct InFlight {
    at: Instant,
    seq: u64,
    to: Side,
    bytes: Vec<u8>,
    /// The frame is `bytes[..len]`; buffers keep their full size to be reused as is.
    len: usize,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// A lossy, delaying, rate-limited full-duplex link.
#[derive(Debug)]
pub struct Link {
    pub cfg: LinkConfig,
    rng: ChaCha8Rng,
    /// Frames held back for reordering, by arrival time.
    queue: BinaryHeap<Reverse<InFlight>>,
    /// All other frames, per destination: their arrival times only grow (the sender's
    /// side of the wire is serialized and the delay is constant), so a FIFO suffices.
    fifo: [std::collections::VecDeque<InFlight>; 2],
    busy_until: [Instant; 2],
    seq: u64,
    pool: Vec<Vec<u8>>,
    pub stats: LinkStats,
}

impl Link {
    pub fn new(cfg: LinkConfig, seed: u64) -> Self {
        Link {
            cfg,
            rng: ChaCha8Rng::seed_from_u64(seed),
            queue: BinaryHeap::new(),
            fifo: Default::default(),
            busy_until: [Instant::ZERO; 2],
            seq: 0,
            pool: Vec::new(),
            stats: LinkStats::default(),
        }
    }

    /// When side `from` may start sending its next frame.
    pub fn ready_at(&self, from: Side) -> Instant {
        self.busy_until[from.idx()]
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random_bool(p.min(1.0))
    }

    fn buffer(&mut self, data: &[u8]) -> Vec<u8> {
        let mut v = self.pool.pop().unwrap_or_default();
        if v.len() < data.len() {
            v.resize(data.len(), 0);
        }
        v[..data.len()].copy_from_slice(data);
        v
    }

    /// Give a delivered frame's buffer back for reuse.
    pub fn recycle(&mut self, v: Vec<u8>) {
        if self.pool.len() < 1024 {
            self.pool.push(v);
        }
    }

    /// A buffer for the next frame, reused from delivered frames (any length).
    pub fn take_buffer(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_default()
    }

    /// A link that neither impairs, delays nor rate-limits (every probability 0, delay 0,
    /// infinite rate).
    pub fn is_ideal(&self) -> bool {
        let c = &self.cfg;
        c.loss <= 0.0
            && c.reorder <= 0.0
            && c.dup <= 0.0
            && c.corrupt <= 0.0
            && c.ce_mark <= 0.0
            && c.delay_ns == 0
            && c.bandwidth_bps == 0
    }

    /// Account for one frame sent by `from` at `now` and delivered at once, which the
    /// caller hands to the receiver itself: only on an ideal link ([`Link::is_ideal`])
    /// with nothing in flight, where it is due at once and nothing can come before it.
    /// The statistics, the wire's busy time and the PRNG (never drawn from at probability
    /// 0) end as `send_owned` followed by `pop_due` would leave them.
    pub fn pass_through(&mut self, now: Instant, from: Side) {
        debug_assert!(self.is_ideal() && self.in_flight() == 0);
        self.stats.frames_sent += 1;
        self.stats.frames_delivered += 1;
        let b = &mut self.busy_until[from.idx()];
        *b = now.max(*b);
        self.seq += 1;
    }

    /// Put a frame on the wire from `from` at `now`; what the link does to it.
    pub fn send(&mut self, now: Instant, from: Side, frame: &[u8]) -> LinkFate {
        let b = self.buffer(frame);
        self.send_owned(now, from, b, frame.len())
    }

    /// Put the frame `buf[..len]` on the wire, handing over the buffer (no copy); what
    /// the link does to it.
    pub fn send_owned(&mut self, now: Instant, from: Side, buf: Vec<u8>, len: usize) -> LinkFate {
        let mut fate = LinkFate::default();
        let len = len.min(buf.len());
        self.stats.frames_sent += 1;
        let start = now.max(self.busy_until[from.idx()]);
        let ser = Duration::from_nanos(if self.cfg.bandwidth_bps == 0 {
            0
        } else {
            (len as u64 * 8 * 1_000_000_000).div_ceil(self.cfg.bandwidth_bps)
        });
        self.busy_until[from.idx()] = start + ser;
        if self.chance(self.cfg.loss) {
            self.stats.lost += 1;
            self.recycle(buf);
            fate.lost = true;
            return fate;
        }
        let dup = if self.chance(self.cfg.dup) {
            self.stats.duplicated += 1;
            fate.duplicated = true;
            Some(self.buffer(&buf[..len]))
        } else {
            None
        };
        for mut bytes in std::iter::once(buf).chain(dup) {
            let mut at = start + ser + Duration::from_nanos(self.cfg.delay_ns);
            let reordered = self.chance(self.cfg.reorder) && self.cfg.reorder_extra_ns > 0;
            if reordered {
                self.stats.reordered += 1;
                fate.reordered = true;
                at += Duration::from_nanos(self.rng.random_range(1..=self.cfg.reorder_extra_ns));
            }
            if self.cfg.ce_mark > 0.0 && self.chance(self.cfg.ce_mark) && mark_ce(&mut bytes[..len])
            {
                self.stats.ce_marked += 1;
                fate.ce_marked = true;
            }
            if self.chance(self.cfg.corrupt) && len > 0 {
                self.stats.corrupted += 1;
                fate.corrupted = true;
                let bit = self.rng.random_range(0..len * 8);
                bytes[bit / 8] ^= 1 << (bit % 8);
            }
            self.seq += 1;
            let f = InFlight {
                at,
                seq: self.seq,
                to: from.other(),
                bytes,
                len,
            };
            if reordered {
                self.queue.push(Reverse(f));
            } else {
                self.fifo[from.other().idx()].push_back(f);
            }
        }
        fate
    }

    /// The queue holding the earliest frame: 0/1 the FIFOs, 2 the reorder heap.
    fn earliest(&self) -> Option<(usize, Instant)> {
        let key = |f: &InFlight| (f.at, f.seq);
        [
            self.fifo[0].front().map(key),
            self.fifo[1].front().map(key),
            self.queue.peek().map(|r| key(&r.0)),
        ]
        .into_iter()
        .enumerate()
        .filter_map(|(i, k)| k.map(|k| (i, k)))
        .min_by_key(|&(_, k)| k)
        .map(|(i, (at, _))| (i, at))
    }

    /// When the next frame arrives somewhere.
    pub fn next_delivery(&self) -> Option<Instant> {
        self.earliest().map(|(_, at)| at)
    }

    /// A frame due at `now`: the side it arrives at, its buffer and its length
    /// (the frame is `buf[..len]`; give the buffer back with [`Link::recycle`]).
    pub fn pop_due(&mut self, now: Instant) -> Option<(Side, Vec<u8>, usize)> {
        let (q, at) = self.earliest()?;
        if at > now {
            return None;
        }
        let f = match q {
            0 | 1 => self.fifo[q].pop_front()?,
            _ => self.queue.pop()?.0,
        };
        self.stats.frames_delivered += 1;
        Some((f.to, f.bytes, f.len))
    }

    /// Frames still in flight.
    pub fn in_flight(&self) -> usize {
        self.queue.len() + self.fifo[0].len() + self.fifo[1].len()
    }
}

/// Two devices joined by a [`Link`], stepping virtual time.
#[derive(Debug)]
pub struct Pair {
    pub a: Rnic,
    pub b: Rnic,
    pub link: Link,
    /// Virtual time.
    pub now: Instant,
    /// When set, every frame a side transmits is recorded here (time, sender, bytes),
    /// before the link impairs it: a capture of the wire for tests.
    pub capture: Option<Vec<(Instant, Side, Vec<u8>)>>,
    /// When set, every transmitted frame goes into this pcapng (see the module docs).
    pub pcap: Option<SimPcap>,
    /// The verdicts each side's engine gave the frames it received (A, B).
    pub verdicts: [RxTally; 2],
    buf: Vec<u8>,
}

/// The pcapng output of a [`Pair`]: the writer, the first write error (writing stops
/// there), and the number of comments that name a retransmission.
#[derive(Debug)]
pub struct SimPcap {
    pub out: PcapNgOut<std::io::BufWriter<std::fs::File>>,
    pub error: Option<String>,
    pub retransmission_comments: u64,
}

impl SimPcap {
    /// Create `path` with one interface per side.
    pub fn create(path: &std::path::Path) -> Result<Self, String> {
        let ifs = [Side::A, Side::B].map(|s| Interface {
            name: format!("xrnic-sim-{s:?}"),
            description: format!(
                "xrnic sim device {s:?}: frames as it sent them, before the simulated link; \
                 timestamps are virtual time since the start of the run"
            ),
        });
        Ok(SimPcap {
            out: PcapNgOut::create(path, &ifs)?,
            error: None,
            retransmission_comments: 0,
        })
    }

    fn record(&mut self, at: Instant, side: Side, frame: &[u8], reason: TxReason, fate: &[&str]) {
        if self.error.is_some() {
            return;
        }
        let mut parts: Vec<String> = reason.comment().into_iter().collect();
        parts.extend(fate.iter().map(|f| f.to_string()));
        if reason.is_retransmission() || reason == TxReason::DuplicateResponse {
            self.retransmission_comments += 1;
        }
        let comment = (!parts.is_empty()).then(|| parts.join("; "));
        if let Err(e) = self.out.write(
            side.idx() as u32,
            at.as_nanos(),
            frame,
            Some(Direction::Outbound),
            comment.as_deref(),
        ) {
            self.error = Some(e.to_string());
        }
    }

    /// Flush the file; the first error met while writing, if any.
    pub fn finish(self) -> Result<u64, String> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let n = self.out.packets();
        self.out.finish().map_err(|e| e.to_string())?;
        Ok(n)
    }
}

/// The MAC addresses and GIDs the pair uses: 192.0.2.1 / fd00::1 for A, .2 / ::2 for B.
pub fn side_config(side: Side) -> Config {
    let n = match side {
        Side::A => 1,
        Side::B => 2,
    };
    let mut v6 = [0u8; 16];
    v6[0] = 0xfd;
    v6[15] = n;
    Config {
        mac: [0x02, 0, 0, 0, 0, n],
        gids: vec![ipv4_gid([192, 0, 2, n]), v6],
        ..Config::default()
    }
}

impl Pair {
    pub fn new(link: LinkConfig, seed: u64) -> Self {
        Self::with_configs(side_config(Side::A), side_config(Side::B), link, seed)
    }

    pub fn with_configs(a: Config, b: Config, link: LinkConfig, seed: u64) -> Self {
        Pair {
            a: Rnic::new(a),
            b: Rnic::new(b),
            link: Link::new(link, seed),
            now: Instant::ZERO,
            capture: None,
            pcap: None,
            verdicts: Default::default(),
            buf: vec![0; MAX_FRAME_LEN],
        }
    }

    pub fn dev(&mut self, s: Side) -> &mut Rnic {
        match s {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Do everything due at `now`; returns true if anything happened.
    fn work_now(&mut self) -> bool {
        let mut did = self.deliver_due();
        // Whether frames may skip the link's queue (see `Link::pass_through`): asked once
        // here rather than per frame.
        let ideal = self.pcap.is_none() && self.link.is_ideal();
        for s in [Side::A, Side::B] {
            let now = self.now;
            if self.dev(s).poll_timeout().is_some_and(|t| t <= now) {
                self.dev(s).handle_timeout(now);
                did = true;
            }
        }
        for s in [Side::A, Side::B] {
            // Transmit while the wire is free; with infinite bandwidth, drain (bounded).
            for _ in 0..4096 {
                if self.link.ready_at(s) > self.now {
                    break;
                }
                let now = self.now;
                if self.buf.len() < MAX_FRAME_LEN {
                    self.buf.resize(MAX_FRAME_LEN, 0);
                }
                let (tx, rx) = match s {
                    Side::A => (&mut self.a, &mut self.b),
                    Side::B => (&mut self.b, &mut self.a),
                };
                match tx.poll_transmit_with_reason(now, &mut self.buf) {
                    Some((n, reason)) => {
                        did = true;
                        if let Some(c) = self.capture.as_mut() {
                            c.push((now, s, self.buf[..n].to_vec()));
                        }
                        if ideal && self.link.in_flight() == 0 {
                            self.link.pass_through(now, s);
                            // An ideal link with nothing in flight: the frame is due at
                            // once and nothing can come before it, so the receiver takes
                            // it straight from the sender's buffer (what `send_owned`
                            // followed by `deliver_due` would do, without the queue).
                            let v = rx.handle_frame(now, &self.buf[..n]);
                            self.verdicts[s.other().idx()].add(v);
                            continue;
                        }
                        // The frame's buffer goes onto the link; the next frame gets one
                        // from its pool.
                        let buf = std::mem::replace(&mut self.buf, self.link.take_buffer());
                        let copy = self.pcap.is_some().then(|| buf[..n].to_vec());
                        let fate = self.link.send_owned(now, s, buf, n);
                        if let (Some(p), Some(frame)) = (self.pcap.as_mut(), copy) {
                            p.record(now, s, &frame, reason, &fate.describe());
                        }
                        // On a zero-delay link the frame is due already: hand it over
                        // before the next one is built, as a wire would, rather than
                        // after up to a window of frames (which also keeps the frame
                        // buffers few and cache-warm; nothing changes when delay > 0).
                        self.deliver_due();
                    }
                    None => break,
                }
            }
        }
        did
    }

    /// Hand every frame due now to its receiver; returns true if there was one.
    fn deliver_due(&mut self) -> bool {
        let mut did = false;
        while let Some((to, bytes, len)) = self.link.pop_due(self.now) {
            let now = self.now;
            let v = self.dev(to).handle_frame(now, &bytes[..len]);
            self.verdicts[to.idx()].add(v);
            self.link.recycle(bytes);
            did = true;
        }
        did
    }

    /// Advance: do what is due now, else move time to the next event. Returns false when
    /// nothing is left to happen (no frame in flight, no timer, nothing to send).
    pub fn step(&mut self) -> bool {
        if self.work_now() {
            return true;
        }
        let mut next = [
            self.link.next_delivery(),
            self.a.poll_timeout(),
            self.b.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        // A side held back by the wire may have more to send once it is free.
        for s in [Side::A, Side::B] {
            let r = self.link.ready_at(s);
            if r > self.now {
                next = Some(next.map_or(r, |n| n.min(r)));
            }
        }
        match next {
            Some(t) if t > self.now => {
                self.now = t;
                true
            }
            _ => false,
        }
    }

    /// Step until `done` holds, nothing is left to do, or virtual time passes `limit`.
    /// Returns whether `done` held.
    pub fn run_until(&mut self, limit: Instant, mut done: impl FnMut(&mut Pair) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.now > limit || !self.step() {
                return done(self);
            }
        }
    }

    /// Create and connect one QP (of `o.qp_type`) on each side (RESET → INIT → RTR → RTS).
    pub fn connect(&mut self, o: &ConnectOpts) -> Result<RcPair, VerbsError> {
        let mut ends = Vec::new();
        for s in [Side::A, Side::B] {
            let d = self.dev(s);
            let pd = d.alloc_pd();
            let cq = d.create_cq(o.cq_size);
            ends.push(QpEnd { pd, cq, srq: None });
        }
        self.connect_ends(o, ends[0], ends[1])
    }

    /// Create one QP of `o.qp_type` on each side from the given PD, CQ and SRQ, and
    /// connect them (RESET → INIT → RTR → RTS, with the UC masks for UC).
    pub fn connect_ends(
        &mut self,
        o: &ConnectOpts,
        a: QpEnd,
        b: QpEnd,
    ) -> Result<RcPair, VerbsError> {
        let mut qpns = Vec::new();
        for (s, e) in [(Side::A, a), (Side::B, b)] {
            let init = QpInitAttr {
                send_cq: e.cq,
                recv_cq: e.cq,
                max_send_wr: o.max_wr,
                max_recv_wr: o.max_wr,
                sq_sig_all: false,
                qp_type: o.qp_type,
                srq: e.srq,
            };
            qpns.push(self.dev(s).create_qp(e.pd, &init)?);
        }
        let (pa, ca, qa) = (a.pd, a.cq, qpns[0]);
        let (pb, cb, qb) = (b.pd, b.cq, qpns[1]);
        let uc = o.qp_type == crate::proto::QpType::Uc;
        for (s, me, peer) in [(Side::A, qa, qb), (Side::B, qb, qa)] {
            let peer_side = s.other();
            let pcfg = side_config(peer_side);
            let gi = usize::from(o.ipv6);
            let av = AddressVector {
                dmac: pcfg.mac,
                dgid: pcfg.gids[gi],
                sgid_index: gi as u8,
                traffic_class: o.traffic_class,
                hop_limit: 64,
                flow_label: 0,
                vlan_tci: None,
            };
            let (sq_psn, rq_psn) = match s {
                Side::A => (o.psn_a, o.psn_b),
                Side::B => (o.psn_b, o.psn_a),
            };
            let d = self.dev(s);
            let mut attr = QpAttr::rc_init(o.access);
            d.modify_qp(me, &attr, AttrMask::RC_INIT)?;
            attr.qp_state = QpState::Rtr;
            attr.ah_attr = av;
            attr.path_mtu = o.mtu;
            attr.dest_qp_num = peer;
            attr.rq_psn = rq_psn;
            attr.max_dest_rd_atomic = o.max_rd_atomic;
            attr.min_rnr_timer = o.min_rnr_timer;
            let rtr = if uc {
                crate::proto::uc::UC_RTR
            } else {
                AttrMask::RC_RTR
            };
            d.modify_qp(me, &attr, rtr)?;
            attr.qp_state = QpState::Rts;
            attr.timeout = o.timeout;
            attr.retry_cnt = o.retry_cnt;
            attr.rnr_retry = o.rnr_retry;
            attr.sq_psn = sq_psn;
            attr.max_rd_atomic = o.max_rd_atomic;
            let rts = if uc {
                crate::proto::uc::UC_RTS
            } else {
                AttrMask::RC_RTS
            };
            d.modify_qp(me, &attr, rts)?;
        }
        Ok(RcPair {
            pd_a: pa,
            pd_b: pb,
            cq_a: ca,
            cq_b: cb,
            qp_a: qa,
            qp_b: qb,
        })
    }
}

/// Options of [`Pair::connect`].
#[derive(Clone, Copy, Debug)]
pub struct ConnectOpts {
    pub mtu: Mtu,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub access: Access,
    pub ipv6: bool,
    pub traffic_class: u8,
    pub psn_a: Psn,
    pub psn_b: Psn,
    pub max_wr: u32,
    pub cq_size: usize,
    /// RC (default) or UC.
    pub qp_type: crate::proto::QpType,
}

impl Default for ConnectOpts {
    fn default() -> Self {
        ConnectOpts {
            mtu: Mtu::Mtu1024,
            // 4.096 µs × 2^8 ≈ 1 ms: quick retries on a simulated link.
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            access: Access::ALL,
            ipv6: false,
            traffic_class: 0,
            // Both start close to the 2^24 wrap, so every run crosses it.
            psn_a: Psn::new(0xff_ff00),
            psn_b: Psn::new(0xff_fff0),
            max_wr: 4096,
            cq_size: 65536,
            qp_type: crate::proto::QpType::Rc,
        }
    }
}

/// What one side's QP of [`Pair::connect_ends`] is made from.
#[derive(Clone, Copy, Debug)]
pub struct QpEnd {
    pub pd: Pd,
    pub cq: Cq,
    pub srq: Option<crate::proto::Srq>,
}

/// The objects [`Pair::connect`] created.
#[derive(Clone, Copy, Debug)]
pub struct RcPair {
    pub pd_a: Pd,
    pub pd_b: Pd,
    pub cq_a: Cq,
    pub cq_b: Cq,
    pub qp_a: Qpn,
    pub qp_b: Qpn,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_is_deterministic_and_impairs() {
        let cfg = LinkConfig {
            loss: 0.1,
            reorder: 0.1,
            dup: 0.1,
            corrupt: 0.1,
            ..LinkConfig::default()
        };
        let run = |seed| {
            let mut l = Link::new(cfg, seed);
            let mut out = vec![];
            for i in 0..2000u64 {
                let _ = l.send(Instant::from_nanos(i * 1000), Side::A, &[i as u8; 100]);
            }
            while let Some((to, b, n)) = l.pop_due(Instant::MAX) {
                assert_eq!(to, Side::B);
                out.push(b[..n].to_vec());
            }
            (l.stats, out)
        };
        let (s1, o1) = run(7);
        let (s2, o2) = run(7);
        assert_eq!(s1, s2);
        assert_eq!(o1, o2);
        assert!(s1.lost > 100 && s1.lost < 300, "{s1:?}");
        assert!(s1.duplicated > 100 && s1.corrupted > 100 && s1.reordered > 100);
        assert_eq!(s1.frames_delivered, 2000 - s1.lost + s1.duplicated);
        let flipped = o1
            .iter()
            .filter(|b| b.iter().filter(|&&x| x != b[0]).count() == 1)
            .count();
        assert!(flipped > 100, "corrupted frames differ in one byte");
        let (s3, _) = run(8);
        assert_ne!(s1, s3, "another seed, another run");
    }

    #[test]
    fn bandwidth_and_delay_set_arrival_time() {
        let mut l = Link::new(
            LinkConfig {
                delay_ns: 1000,
                bandwidth_bps: 8_000_000_000,
                ..LinkConfig::default()
            },
            1,
        );
        let t = Instant::from_nanos;
        let _ = l.send(t(0), Side::A, &[0; 1000]);
        assert_eq!(l.ready_at(Side::A), t(1000));
        let _ = l.send(t(0), Side::A, &[0; 1000]);
        assert_eq!(l.ready_at(Side::A), t(2000));
        assert_eq!(l.next_delivery(), Some(t(2000)));
        assert!(l.pop_due(t(1999)).is_none());
        assert!(l.pop_due(t(2000)).is_some());
        assert_eq!(l.next_delivery(), Some(t(3000)));
    }
    /// The direct hand-over on an ideal link (`Link::pass_through`) is the queue's
    /// behaviour without the queue: the same workload run through it and through the
    /// general path (forced by a pcap, which takes every frame through `send_owned`)
    /// gives the same frames at the same virtual times, the same link statistics,
    /// counters, completions and memory.
    #[test]
    fn ideal_link_hand_over_equals_the_queue() {
        use crate::proto::{
            AtomicInfo, MrInfo, RdmaInfo, RecvWr, SendWr, Sge, WcStatus, WorkCompletion, WrOpcode,
        };
        let ideal = LinkConfig {
            delay_ns: 0,
            bandwidth_bps: 0,
            ..LinkConfig::default()
        };
        assert!(Link::new(ideal, 1).is_ideal());
        assert!(!Link::new(LinkConfig::default(), 1).is_ideal());
        let run = |pcap: Option<&std::path::Path>| {
            let mut p = Pair::new(ideal, 3);
            p.capture = Some(Vec::new());
            p.pcap = pcap.map(|f| SimPcap::create(f).unwrap());
            let c = p.connect(&ConnectOpts::default()).unwrap();
            let ma = p.a.reg_mr(c.pd_a, 1 << 16, Access::ALL).unwrap();
            let mb = p.b.reg_mr(c.pd_b, 1 << 16, Access::ALL).unwrap();
            for (i, x) in p.a.mr_bytes_mut(ma.lkey).unwrap().iter_mut().enumerate() {
                *x = (i * 7) as u8;
            }
            for (i, x) in p.b.mr_bytes_mut(mb.lkey).unwrap().iter_mut().enumerate() {
                *x = (i * 13) as u8;
            }
            let sge = |m: &MrInfo, off: u64, length: u32| {
                vec![Sge {
                    addr: m.addr + off,
                    length,
                    lkey: m.lkey,
                }]
            };
            p.a.post_recv(
                c.qp_a,
                RecvWr {
                    wr_id: 50,
                    sg_list: sge(&ma, 40_000, 5000),
                },
            )
            .unwrap();
            let mut wrs = Vec::new();
            for (k, len) in [(0u64, 10_000u32), (1, 1), (2, 1024), (3, 4097)] {
                let mut w = SendWr::new(k, WrOpcode::RdmaWrite);
                w.sg_list = sge(&ma, k * 10_000, len);
                w.rdma = RdmaInfo {
                    remote_addr: mb.addr + k * 12_000,
                    rkey: mb.rkey,
                };
                wrs.push(w);
            }
            let mut r = SendWr::new(4, WrOpcode::RdmaRead);
            r.sg_list = sge(&ma, 50_000, 3000);
            r.rdma = RdmaInfo {
                remote_addr: mb.addr + 60_000,
                rkey: mb.rkey,
            };
            wrs.push(r);
            let mut f = SendWr::new(5, WrOpcode::AtomicFetchAndAdd);
            f.sg_list = sge(&ma, 56_000, 8);
            f.atomic = AtomicInfo {
                remote_addr: mb.addr + 64_000,
                rkey: mb.rkey,
                compare_add: 5,
                swap: 0,
            };
            wrs.push(f);
            for w in wrs {
                p.a.post_send(c.qp_a, w).unwrap();
            }
            let mut s = SendWr::new(60, WrOpcode::SendWithImm);
            s.sg_list = sge(&mb, 0, 4500);
            s.imm_data = 0x1234;
            p.b.post_send(c.qp_b, s).unwrap();
            let mut wcs: Vec<WorkCompletion> = Vec::new();
            p.run_until(Instant::from_nanos(1_000_000_000), |p| {
                p.a.poll_cq(c.cq_a, usize::MAX, &mut wcs);
                p.b.poll_cq(c.cq_b, usize::MAX, &mut wcs);
                wcs.len() >= 8
            });
            assert!(
                wcs.len() == 8 && wcs.iter().all(|w| w.status == WcStatus::Success),
                "{wcs:?}"
            );
            let queue_used = !p.link.pool.is_empty();
            if let Some(pc) = p.pcap.take() {
                pc.finish().unwrap();
            }
            let mem = (
                p.a.mr_bytes(ma.lkey).unwrap().to_vec(),
                p.b.mr_bytes(mb.lkey).unwrap().to_vec(),
            );
            (
                p.capture.take().unwrap(),
                p.link.stats,
                p.a.counters(),
                p.b.counters(),
                p.now,
                wcs,
                mem,
                queue_used,
            )
        };
        let file =
            std::env::temp_dir().join(format!("xrnic-sim-hand-over-{}.pcapng", std::process::id()));
        let direct = run(None);
        let queued = run(Some(&file));
        let _ = std::fs::remove_file(&file);
        assert!(!direct.7, "the ideal link handed every frame over directly");
        assert!(queued.7, "with a pcap every frame went through the queue");
        assert!(direct.0.len() >= 25, "{} frames", direct.0.len());
        assert_eq!(direct.0, queued.0, "frames, senders and times");
        assert_eq!(direct.1, queued.1, "link statistics");
        assert_eq!(direct.1.frames_sent, direct.0.len() as u64);
        assert_eq!(direct.1.frames_delivered, direct.1.frames_sent);
        assert_eq!(
            (direct.2, direct.3),
            (queued.2, queued.3),
            "device counters"
        );
        assert_eq!(direct.4, queued.4, "virtual time");
        assert_eq!(direct.5, queued.5, "completions");
        assert!(direct.6 == queued.6, "memory of both sides");
    }
}
