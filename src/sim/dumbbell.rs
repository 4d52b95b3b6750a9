//! A dumbbell on virtual time: `qps` RC QPs on device A write to device B through one
//! bottleneck port, the loop DCQCN runs in, so its parameters can be tuned in seconds
//! before a run through the lab's real switch (docs/congestion.md, "Lab").
//!
//! Contract: deterministic for given [`DumbbellConfig`] (no PRNG but a seeded one for
//! RED's marking draws). A's frames leave at A's line rate into the bottleneck queue, which
//! is served at `bottleneck_bps` and marks or drops like Linux `sch_red` (an EWMA of the
//! queue length in bytes with weight `2^-wlog` taken at each arrival, marking probability
//! rising from 0 at `min` to `max_p` at `max`, every ECN-capable frame marked above `max`
//! and every other one dropped, a tail drop at `limit`); then `delay_ns` to B. B's frames
//! (ACKs, CNPs) reach A after `delay_ns`, unqueued. Each QP keeps `depth` RDMA WRITEs of
//! `msg_bytes` outstanding for `duration_ns`; the figures are taken over the middle half,
//! as perftest's `-D` does.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::proto::congestion::{Algorithm, CongestionControl, DcqcnParams, Pacer};
use crate::proto::{
    Access, Instant, MAX_FRAME_LEN, MrInfo, Mtu, RdmaInfo, SendFlags, SendWr, Sge, WcStatus,
    WorkCompletion, WrOpcode,
};
use crate::sim::{ConnectOpts, LinkConfig, Pair, QpEnd, Side};
use crate::wire::Qpn;

/// The bottleneck's RED, in Linux `tc qdisc add … red` terms.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct RedConfig {
    /// `min`, bytes of average queue where marking starts.
    pub min: u64,
    /// `max`, bytes where the probability reaches `max_p`; above it every frame is marked.
    pub max: u64,
    /// `probability`.
    pub max_p: f64,
    /// `limit`: the hard queue size in bytes.
    pub limit: u64,
    /// The EWMA weight is 2^-wlog (tc derives it from `burst`; 3 for the lab's
    /// `min 15000 avpkt 4200 burst 6`, as for `avpkt 1100 burst 20`).
    pub wlog: u32,
}

impl RedConfig {
    /// The lab's `red limit 2000000 min 15000 max 45000 avpkt 4200 burst 6 probability 0.2`
    /// (docs/congestion.md, "Lab").
    pub const LAB: RedConfig = RedConfig {
        min: 15_000,
        max: 45_000,
        max_p: 0.2,
        limit: 2_000_000,
        wlog: 3,
    };
}

/// One dumbbell run.
#[derive(Clone, Copy, Debug)]
pub struct DumbbellConfig {
    pub qps: u32,
    pub line_rate_bps: u64,
    pub bottleneck_bps: u64,
    /// One way, each direction.
    pub delay_ns: u64,
    pub red: RedConfig,
    /// DCQCN on both devices (data ECT(0)); `None`: no congestion control (Not-ECT).
    pub dcqcn: Option<DcqcnParams>,
    pub duration_ns: u64,
    pub msg_bytes: u32,
    pub depth: u32,
    pub seed: u64,
    /// The QPs' local ACK timeout exponent (4.096 µs · 2^timeout, IBTA 9.7.6.1.3).
    pub timeout: u8,
    /// The QPs' path MTU.
    pub mtu: Mtu,
}

impl Default for DumbbellConfig {
    fn default() -> Self {
        DumbbellConfig {
            qps: 2,
            line_rate_bps: 10_000_000_000,
            bottleneck_bps: 50_000_000,
            delay_ns: 500_000,
            red: RedConfig::LAB,
            dcqcn: Some(DcqcnParams::connectx()),
            duration_ns: 10_000_000_000,
            msg_bytes: 65536,
            depth: 16,
            seed: 1,
            // perftest's timeout 14 (67 ms).
            timeout: 14,
            mtu: Mtu::Mtu1024,
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DumbbellResult {
    /// Payload goodput of each QP over the middle half, Mb/s.
    pub per_qp_mbps: Vec<f64>,
    pub goodput_mbps: f64,
    /// Goodput over the bottleneck rate.
    pub utilization: f64,
    /// Jain's index over the QPs' goodputs.
    pub jain: f64,
    /// Wire bytes the bottleneck sent in the middle half over what it could have.
    pub link_busy: f64,
    pub np_cnp_sent: u64,
    pub rp_cnp_handled: u64,
    pub ce_marked: u64,
    pub dropped: u64,
    pub retransmitted_packets: u64,
    /// Time-averaged bottleneck queue over the middle half, bytes.
    pub mean_queue_bytes: f64,
    pub errors: u64,
}

fn ser_ns(len: usize, rate: u64) -> u64 {
    ((len as u64 * 8 * 1_000_000_000).div_ceil(rate.max(1))).max(1)
}

/// Jain's fairness index of `x` (1 when all are equal; 0 for no traffic).
pub fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    if q <= 0.0 {
        0.0
    } else {
        s * s / (x.len() as f64 * q)
    }
}

/// Run the dumbbell; never panics on any configuration (a connect or MR failure is
/// counted in `errors` and ends the run).
pub fn run(cfg: &DumbbellConfig) -> DumbbellResult {
    let Some(mut d) = Dumbbell::set_up(cfg) else {
        return DumbbellResult {
            errors: 1,
            ..DumbbellResult::default()
        };
    };
    d.post_initial_writes();
    while d.now <= cfg.duration_ns {
        d.account_queue_area();
        deliver(&mut d.to_b, &mut d.pair.b, d.now);
        deliver(&mut d.to_a, &mut d.pair.a, d.now);
        d.fire_due_timers();
        d.a_transmits_into_bottleneck();
        d.b_transmits_to_a();
        d.bottleneck_serves();
        d.complete_and_repost();
        match d.next_event() {
            Some(t) => d.now = t,
            None => break,
        }
    }
    d.result()
}

/// The frames in flight on one direction of the link: (arrival time, tie-break
/// sequence, frame), earliest first.
type Heap = BinaryHeap<Reverse<(u64, u64, Vec<u8>)>>;

/// The frames of `heap` due by `now`, into `dev`.
fn deliver(heap: &mut Heap, dev: &mut crate::proto::Rnic, now: u64) {
    while heap.peek().is_some_and(|Reverse((t, _, _))| *t <= now) {
        if let Some(Reverse((_, _, f))) = heap.pop() {
            let _ = dev.handle_frame(Instant::from_nanos(now), &f);
        }
    }
}

/// The RDMA WRITEs every QP posts: message `k` from A's slot `k % depth` to B's.
#[derive(Clone, Copy)]
struct Writes {
    src: MrInfo,
    dst: MrInfo,
    msg: u32,
    depth: u32,
}

impl Writes {
    fn post(&self, d: &mut crate::proto::Rnic, qp: Qpn, k: u64) -> bool {
        let slot = k % u64::from(self.depth);
        let mut w = SendWr::new(k, WrOpcode::RdmaWrite);
        w.sg_list = vec![Sge {
            addr: self.src.addr + slot * u64::from(self.msg),
            length: self.msg,
            lkey: self.src.lkey,
        }];
        w.rdma = RdmaInfo {
            remote_addr: self.dst.addr + slot * u64::from(self.msg),
            rkey: self.dst.rkey,
        };
        w.send_flags = SendFlags::SIGNALED;
        d.post_send(qp, w).is_ok()
    }
}

/// What RED does with an arriving frame.
enum RedVerdict {
    Enqueue,
    /// Mark it CE (dropped instead when it is not ECN-capable).
    Mark,
    Drop,
}

/// Linux `sch_red`'s state: the queue's average and the count since the last mark.
struct Red {
    cfg: RedConfig,
    /// The EWMA weight, 2^-wlog.
    w: f64,
    avg: f64,
    count: i64,
    /// When the queue went empty, while it is.
    idle_since: Option<u64>,
    rng: ChaCha8Rng,
}

impl Red {
    fn new(cfg: RedConfig, seed: u64) -> Self {
        Red {
            cfg,
            w: 0.5f64.powi(cfg.wlog.min(31) as i32),
            avg: 0.0,
            count: -1,
            idle_since: Some(0),
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// RED at arrival (Linux red_enqueue) of a frame of `len` bytes onto `q_bytes`: the
    /// average first, idle time decaying it as if empty frames of this size had arrived
    /// meanwhile (`bottleneck_bps` serves them), then the tail drop and the marking draw.
    fn on_arrival(
        &mut self,
        now: u64,
        len: usize,
        q_bytes: u64,
        bottleneck_bps: u64,
    ) -> RedVerdict {
        let (cfg, w) = (self.cfg, self.w);
        if let Some(t0) = self.idle_since.take() {
            let m = now.saturating_sub(t0) / ser_ns(len, bottleneck_bps);
            self.avg *= (1.0 - w).powi(m.min(i32::MAX as u64) as i32);
        }
        self.avg = (1.0 - w) * self.avg + w * q_bytes as f64;
        let tail_drop = q_bytes + len as u64 > cfg.limit;
        if !tail_drop && self.avg >= cfg.min as f64 {
            if self.draw_mark() {
                return RedVerdict::Mark;
            }
        } else if self.avg < cfg.min as f64 {
            self.count = -1;
        }
        if tail_drop {
            RedVerdict::Drop
        } else {
            RedVerdict::Enqueue
        }
    }

    /// Whether to mark, the average being at least `min`: always above `max`; between
    /// them with the probability rising to `max_p`, spread by the count since the last
    /// mark (Linux red_action).
    fn draw_mark(&mut self) -> bool {
        let cfg = self.cfg;
        if self.avg >= cfg.max as f64 {
            self.count = -1;
            return true;
        }
        self.count += 1;
        let pb = cfg.max_p * (self.avg - cfg.min as f64) / (cfg.max - cfg.min).max(1) as f64;
        let pa = pb / (1.0 - (self.count as f64) * pb).max(1e-9);
        let hit = self.count > 0 && (pa >= 1.0 || self.rng.random_bool(pa.clamp(0.0, 1.0)));
        if hit {
            self.count = 0;
        }
        hit
    }
}

/// One run: the pair, its QPs, the link both ways, the bottleneck's queue and what is
/// measured.
struct Dumbbell<'c> {
    cfg: &'c DumbbellConfig,
    pair: Pair,
    /// A's CQ, which all its QPs share.
    cq_a: crate::proto::Cq,
    qps: Vec<Qpn>,
    writes: Writes,
    /// Each QP's next work request id.
    next_wr: Vec<u64>,
    /// The measured window: the middle half of the run.
    lo: u64,
    hi: u64,
    now: u64,
    /// Tie-break of frames due at the same time: the order they were sent.
    seq: u64,
    buf: Vec<u8>,
    to_b: Heap,
    to_a: Heap,
    /// When A's line is free again.
    a_free: u64,
    /// The bottleneck's queue and the bytes in it.
    queue: VecDeque<Vec<u8>>,
    q_bytes: u64,
    /// When the bottleneck is free again.
    bn_free: u64,
    red: Red,
    /// Bytes the bottleneck sent in the window.
    busy_bytes: u64,
    /// The queue's bytes integrated over the window, and when it was last integrated.
    q_area: f64,
    last_t: u64,
    /// Bytes each QP completed by `lo` and by `hi`.
    done_bytes: Vec<[u64; 2]>,
    wcs: Vec<WorkCompletion>,
    res: DumbbellResult,
}

impl<'c> Dumbbell<'c> {
    /// The pair with congestion control as configured, `qps` QPs from A to B sharing one
    /// PD and CQ per side, and the memory; `None` when a connect or MR fails.
    fn set_up(cfg: &'c DumbbellConfig) -> Option<Self> {
        let n = cfg.qps.clamp(1, 1024) as usize;
        let depth = cfg.depth.clamp(1, 256);
        let msg = cfg.msg_bytes.clamp(1, 1 << 20);
        let mut p = Pair::new(LinkConfig::default(), cfg.seed);
        p.a.set_name("A");
        p.b.set_name("B");
        if let Some(params) = cfg.dcqcn {
            for s in [Side::A, Side::B] {
                let mut cc = CongestionControl::new(
                    Algorithm::Dcqcn(params),
                    cfg.line_rate_bps,
                    Pacer::DEFAULT_BURST,
                );
                // As on a real port (docs/congestion.md): QPs at full rate are not paced.
                cc.set_pace_unthrottled(false);
                p.dev(s).enable_congestion_control(cc);
            }
        }
        let ends: Vec<QpEnd> = [Side::A, Side::B]
            .into_iter()
            .map(|s| {
                let d = p.dev(s);
                QpEnd {
                    pd: d.alloc_pd(),
                    cq: d.create_cq(1 << 20),
                    srq: None,
                }
            })
            .collect();
        let opts = ConnectOpts {
            max_wr: depth.max(16),
            timeout: cfg.timeout.clamp(1, 31),
            mtu: cfg.mtu,
            ..ConnectOpts::default()
        };
        let mut qps = Vec::new();
        for _ in 0..n {
            qps.push(p.connect_ends(&opts, ends[0], ends[1]).ok()?.qp_a);
        }
        let len = msg as usize * depth as usize;
        let (Ok(src), Ok(dst)) = (
            p.a.reg_mr(ends[0].pd, len, Access::LOCAL_WRITE),
            p.b.reg_mr(ends[1].pd, len, Access::ALL),
        ) else {
            return None;
        };
        Some(Dumbbell {
            cfg,
            pair: p,
            cq_a: ends[0].cq,
            qps,
            writes: Writes {
                src,
                dst,
                msg,
                depth,
            },
            next_wr: vec![0u64; n],
            lo: cfg.duration_ns / 4,
            hi: cfg.duration_ns * 3 / 4,
            now: 0,
            seq: 0,
            buf: vec![0u8; MAX_FRAME_LEN],
            to_b: BinaryHeap::new(),
            to_a: BinaryHeap::new(),
            a_free: 0,
            queue: VecDeque::new(),
            q_bytes: 0,
            bn_free: 0,
            red: Red::new(cfg.red, cfg.seed),
            busy_bytes: 0,
            q_area: 0.0,
            last_t: 0,
            done_bytes: vec![[0u64; 2]; n],
            wcs: Vec::new(),
            res: DumbbellResult::default(),
        })
    }

    /// `depth` WRITEs on every QP.
    fn post_initial_writes(&mut self) {
        for (i, &qp) in self.qps.iter().enumerate() {
            for _ in 0..self.writes.depth {
                if !self.writes.post(&mut self.pair.a, qp, self.next_wr[i]) {
                    self.res.errors += 1;
                }
                self.next_wr[i] += 1;
            }
        }
    }

    /// The queue's bytes since the last event, over the measured window.
    fn account_queue_area(&mut self) {
        let (now, lo, hi) = (self.now, self.lo, self.hi);
        if now > lo && self.last_t < hi {
            let (t0, t1) = (self.last_t.max(lo), now.min(hi));
            if t1 > t0 {
                self.q_area += self.q_bytes as f64 * (t1 - t0) as f64;
            }
        }
        self.last_t = now;
    }

    fn fire_due_timers(&mut self) {
        let now = self.now;
        for d in [&mut self.pair.a, &mut self.pair.b] {
            if d.poll_timeout().is_some_and(|t| t.as_nanos() <= now) {
                d.handle_timeout(Instant::from_nanos(now));
            }
        }
    }

    /// A's frames leave at its line rate into the bottleneck's queue, through RED.
    fn a_transmits_into_bottleneck(&mut self) {
        let now = self.now;
        while self.a_free <= now {
            let Some(len) = self
                .pair
                .a
                .poll_transmit(Instant::from_nanos(now), &mut self.buf)
            else {
                break;
            };
            self.a_free = now + ser_ns(len, self.cfg.line_rate_bps);
            let mut f = self.buf[..len].to_vec();
            let drop = match self
                .red
                .on_arrival(now, len, self.q_bytes, self.cfg.bottleneck_bps)
            {
                RedVerdict::Enqueue => false,
                RedVerdict::Mark if crate::wire::mark_ce(&mut f) => {
                    self.res.ce_marked += 1;
                    false
                }
                RedVerdict::Mark | RedVerdict::Drop => true,
            };
            if drop {
                self.res.dropped += 1;
                continue;
            }
            self.q_bytes += len as u64;
            self.queue.push_back(f);
        }
    }

    /// B's frames (ACKs, CNPs) reach A after the delay, unqueued.
    fn b_transmits_to_a(&mut self) {
        let now = self.now;
        for _ in 0..4096 {
            let Some(len) = self
                .pair
                .b
                .poll_transmit(Instant::from_nanos(now), &mut self.buf)
            else {
                break;
            };
            self.seq += 1;
            self.to_a.push(Reverse((
                now + self.cfg.delay_ns,
                self.seq,
                self.buf[..len].to_vec(),
            )));
        }
    }

    /// The bottleneck, when free, sends the frame at the head of its queue toward B.
    fn bottleneck_serves(&mut self) {
        let now = self.now;
        if self.bn_free > now {
            return;
        }
        if let Some(f) = self.queue.pop_front() {
            self.q_bytes -= f.len() as u64;
            self.bn_free = now + ser_ns(f.len(), self.cfg.bottleneck_bps);
            if now >= self.lo && now < self.hi {
                self.busy_bytes += f.len() as u64;
            }
            self.seq += 1;
            self.to_b
                .push(Reverse((self.bn_free + self.cfg.delay_ns, self.seq, f)));
            if self.queue.is_empty() {
                self.red.idle_since = Some(self.bn_free);
            }
        }
    }

    /// A's completions counted toward the window's bytes, each QP's WRITE reposted
    /// until the end of the run.
    fn complete_and_repost(&mut self) {
        let now = self.now;
        self.wcs.clear();
        self.pair.a.poll_cq(self.cq_a, usize::MAX, &mut self.wcs);
        for wc in &self.wcs {
            let Some(i) = self.qps.iter().position(|&q| q == wc.qp_num) else {
                continue;
            };
            if wc.status != WcStatus::Success {
                self.res.errors += 1;
                continue;
            }
            for (k, t) in [self.lo, self.hi].into_iter().enumerate() {
                if now <= t {
                    self.done_bytes[i][k] += u64::from(self.writes.msg);
                }
            }
            if now < self.cfg.duration_ns
                && self
                    .writes
                    .post(&mut self.pair.a, self.qps[i], self.next_wr[i])
            {
                self.next_wr[i] += 1;
            }
        }
    }

    /// The next time anything happens: a frame arrives, a timer fires, A's line or the
    /// busy bottleneck frees up.
    fn next_event(&self) -> Option<u64> {
        let now = self.now;
        [
            self.to_b.peek().map(|Reverse((t, _, _))| *t),
            self.to_a.peek().map(|Reverse((t, _, _))| *t),
            self.pair.a.poll_timeout().map(Instant::as_nanos),
            self.pair.b.poll_timeout().map(Instant::as_nanos),
            Some(self.a_free).filter(|&t| t > now),
            Some(self.bn_free).filter(|&t| t > now && !self.queue.is_empty()),
        ]
        .into_iter()
        .flatten()
        .filter(|&t| t > now)
        .min()
    }

    /// The figures over the measured window, and the devices' counters.
    fn result(mut self) -> DumbbellResult {
        let (lo, hi, cfg) = (self.lo, self.hi, self.cfg);
        let res = &mut self.res;
        let win_s = (hi - lo) as f64 / 1e9;
        // done_bytes[i] = [bytes completed by lo, by hi]: the window's share is the difference.
        res.per_qp_mbps = self
            .done_bytes
            .iter()
            .map(|d| d[1].saturating_sub(d[0]) as f64 * 8.0 / win_s / 1e6)
            .collect();
        res.goodput_mbps = res.per_qp_mbps.iter().sum();
        res.utilization = res.goodput_mbps * 1e6 / cfg.bottleneck_bps as f64;
        res.jain = jain(&res.per_qp_mbps);
        res.link_busy = self.busy_bytes as f64 * 8.0 / win_s / cfg.bottleneck_bps as f64;
        res.mean_queue_bytes = self.q_area / (hi - lo).max(1) as f64;
        if let Some(c) = self.pair.b.congestion() {
            res.np_cnp_sent = c.counters().np_cnp_sent;
        }
        if let Some(c) = self.pair.a.congestion() {
            res.rp_cnp_handled = c.counters().rp_cnp_handled;
        }
        res.retransmitted_packets = self.pair.a.counters().qp.retransmitted_packets;
        self.res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index() {
        assert_eq!(jain(&[5.0, 5.0, 5.0]), 1.0);
        assert!((jain(&[1.0, 0.0]) - 0.5).abs() < 1e-12);
        assert_eq!(jain(&[0.0, 0.0]), 0.0);
    }

    /// Without congestion control the data is not ECN-capable: RED drops instead of
    /// marking, and nothing is marked; with DCQCN frames are marked, CNPs flow and
    /// nothing is dropped at the lab's queue.
    #[test]
    fn red_marks_ecn_capable_frames_and_drops_the_others() {
        let base = DumbbellConfig {
            duration_ns: 400_000_000,
            ..DumbbellConfig::default()
        };
        let off = run(&DumbbellConfig {
            dcqcn: None,
            ..base
        });
        assert_eq!(off.ce_marked, 0, "{off:?}");
        assert!(off.dropped > 0 && off.retransmitted_packets > 0, "{off:?}");
        let on = run(&base);
        assert!(on.ce_marked > 0 && on.np_cnp_sent > 0, "{on:?}");
        assert!(on.rp_cnp_handled > 0, "{on:?}");
        assert_eq!(on.errors, 0, "{on:?}");
    }

    /// The start burst of 8 QPs (8 × 128 PSNs of 1 KiB frames, ≈ 1.1 MB) waits in a deep
    /// bottleneck queue, each QP's frames interleaved with the 7 others: a QP asks for an
    /// ACK every 64 packets, whose answer then comes 8 × 64 frames (≈ 90 ms) later, so
    /// with perftest's timeout 14 (67 ms) its local ACK timer expires with nothing lost
    /// (IBTA 9.7.6.1.3) and it goes back N; with timeout 18 (1.07 s) nothing is resent.
    /// The lab's reason for `-u 18`.
    #[test]
    fn a_timeout_shorter_than_the_start_burst_queue_resends_and_a_longer_one_does_not() {
        let base = DumbbellConfig {
            qps: 8,
            duration_ns: 300_000_000,
            red: RedConfig {
                limit: 4_000_000,
                ..RedConfig::LAB
            },
            ..DumbbellConfig::default()
        };
        // (Its go-back-N bursts then overflow even this queue a little.)
        let short = run(&base);
        assert!(short.retransmitted_packets > 0, "{short:?}");
        let long = run(&DumbbellConfig {
            timeout: 18,
            ..base
        });
        assert_eq!(long.dropped, 0, "{long:?}");
        assert_eq!(long.retransmitted_packets, 0, "{long:?}");
        assert_eq!(long.errors, 0, "{long:?}");
    }

    /// The path MTU reaches the QPs: a QP's 128-PSN window is 4 times the bytes at 4096
    /// (never cut, so every window sits in the queue), and the same link time carries
    /// about 3.8 times fewer frames, each marked above K_max.
    #[test]
    fn the_path_mtu_sets_the_frame_size() {
        let base = DumbbellConfig {
            qps: 1,
            duration_ns: 200_000_000,
            dcqcn: Some(DcqcnParams {
                // Never cut: the same offered load in both runs, every frame above
                // K_max marked.
                rp_min_dec_fac: 100,
                ..DcqcnParams::connectx()
            }),
            ..DumbbellConfig::default()
        };
        let small = run(&base);
        let big = run(&DumbbellConfig {
            mtu: Mtu::Mtu4096,
            ..base
        });
        assert!(
            small.ce_marked > 0 && big.ce_marked > 0,
            "{small:?} {big:?}"
        );
        assert!(
            big.mean_queue_bytes > 3.0 * small.mean_queue_bytes,
            "{small:?} {big:?}"
        );
        assert!(small.ce_marked > 2 * big.ce_marked, "{small:?} {big:?}");
    }
}
