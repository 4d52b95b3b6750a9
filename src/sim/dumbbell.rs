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
    Access, Instant, MAX_FRAME_LEN, Mtu, RdmaInfo, SendFlags, SendWr, Sge, WcStatus,
    WorkCompletion, WrOpcode,
};
use crate::sim::{ConnectOpts, LinkConfig, Pair, QpEnd, Side};

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

type Heap = BinaryHeap<Reverse<(u64, u64, Vec<u8>)>>;

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
    let mut res = DumbbellResult::default();
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
        match p.connect_ends(&opts, ends[0], ends[1]) {
            Ok(c) => qps.push(c.qp_a),
            Err(_) => {
                res.errors += 1;
                return res;
            }
        }
    }
    let len = msg as usize * depth as usize;
    let (Ok(src), Ok(dst)) = (
        p.a.reg_mr(ends[0].pd, len, Access::LOCAL_WRITE),
        p.b.reg_mr(ends[1].pd, len, Access::ALL),
    ) else {
        res.errors += 1;
        return res;
    };
    let post = |d: &mut crate::proto::Rnic, qp, k: u64| {
        let slot = k % u64::from(depth);
        let mut w = SendWr::new(k, WrOpcode::RdmaWrite);
        w.sg_list = vec![Sge {
            addr: src.addr + slot * u64::from(msg),
            length: msg,
            lkey: src.lkey,
        }];
        w.rdma = RdmaInfo {
            remote_addr: dst.addr + slot * u64::from(msg),
            rkey: dst.rkey,
        };
        w.send_flags = SendFlags::SIGNALED;
        d.post_send(qp, w).is_ok()
    };
    let Pair {
        a: ref mut dev_a,
        b: ref mut dev_b,
        ..
    } = p;
    let mut next_wr = vec![0u64; n];
    for (i, &qp) in qps.iter().enumerate() {
        for _ in 0..depth {
            if !post(dev_a, qp, next_wr[i]) {
                res.errors += 1;
            }
            next_wr[i] += 1;
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let (lo, hi) = (cfg.duration_ns / 4, cfg.duration_ns * 3 / 4);
    let mut done_bytes = vec![[0u64; 2]; n];
    let mut busy_bytes = 0u64;
    let mut now = 0u64;
    let mut seq = 0u64;
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let (mut to_b, mut to_a): (Heap, Heap) = (BinaryHeap::new(), BinaryHeap::new());
    let mut queue: VecDeque<Vec<u8>> = VecDeque::new();
    let mut q_bytes = 0u64;
    let mut avg = 0f64;
    let mut red_count: i64 = -1;
    let mut idle_since: Option<u64> = Some(0);
    let (mut a_free, mut bn_free) = (0u64, 0u64);
    let mut q_area = 0f64;
    let mut last_t = 0u64;
    let mut wcs: Vec<WorkCompletion> = Vec::new();
    let w = 0.5f64.powi(cfg.red.wlog.min(31) as i32);
    let deliver = |heap: &mut Heap, dev: &mut crate::proto::Rnic, now| {
        while heap.peek().is_some_and(|Reverse((t, _, _))| *t <= now) {
            if let Some(Reverse((_, _, f))) = heap.pop() {
                let _ = dev.handle_frame(Instant::from_nanos(now), &f);
            }
        }
    };
    while now <= cfg.duration_ns {
        // Queue area over the measured window.
        if now > lo && last_t < hi {
            let (t0, t1) = (last_t.max(lo), now.min(hi));
            if t1 > t0 {
                q_area += q_bytes as f64 * (t1 - t0) as f64;
            }
        }
        last_t = now;
        deliver(&mut to_b, dev_b, now);
        deliver(&mut to_a, dev_a, now);
        for d in [&mut *dev_a, &mut *dev_b] {
            if d.poll_timeout().is_some_and(|t| t.as_nanos() <= now) {
                d.handle_timeout(Instant::from_nanos(now));
            }
        }
        while a_free <= now {
            let Some(len) = dev_a.poll_transmit(Instant::from_nanos(now), &mut buf) else {
                break;
            };
            a_free = now + ser_ns(len, cfg.line_rate_bps);
            let mut f = buf[..len].to_vec();
            // RED at arrival (Linux red_enqueue): the average first, idle time decaying
            // it as if empty frames of this size had arrived meanwhile.
            if let Some(t0) = idle_since.take() {
                let m = now.saturating_sub(t0) / ser_ns(len, cfg.bottleneck_bps);
                avg *= (1.0 - w).powi(m.min(i32::MAX as u64) as i32);
            }
            avg = (1.0 - w) * avg + w * q_bytes as f64;
            let mut drop = q_bytes + len as u64 > cfg.red.limit;
            if !drop && avg >= cfg.red.min as f64 {
                let mark = if avg >= cfg.red.max as f64 {
                    red_count = -1;
                    true
                } else {
                    red_count += 1;
                    let pb = cfg.red.max_p * (avg - cfg.red.min as f64)
                        / (cfg.red.max - cfg.red.min).max(1) as f64;
                    let pa = pb / (1.0 - (red_count as f64) * pb).max(1e-9);
                    let hit = red_count > 0 && (pa >= 1.0 || rng.random_bool(pa.clamp(0.0, 1.0)));
                    if hit {
                        red_count = 0;
                    }
                    hit
                };
                if mark {
                    if crate::wire::mark_ce(&mut f) {
                        res.ce_marked += 1;
                    } else {
                        drop = true;
                    }
                }
            } else if avg < cfg.red.min as f64 {
                red_count = -1;
            }
            if drop {
                res.dropped += 1;
                continue;
            }
            q_bytes += len as u64;
            queue.push_back(f);
        }
        for _ in 0..4096 {
            let Some(len) = dev_b.poll_transmit(Instant::from_nanos(now), &mut buf) else {
                break;
            };
            seq += 1;
            to_a.push(Reverse((now + cfg.delay_ns, seq, buf[..len].to_vec())));
        }
        if bn_free <= now {
            if let Some(f) = queue.pop_front() {
                q_bytes -= f.len() as u64;
                bn_free = now + ser_ns(f.len(), cfg.bottleneck_bps);
                if now >= lo && now < hi {
                    busy_bytes += f.len() as u64;
                }
                seq += 1;
                to_b.push(Reverse((bn_free + cfg.delay_ns, seq, f)));
                if queue.is_empty() {
                    idle_since = Some(bn_free);
                }
            }
        }
        wcs.clear();
        dev_a.poll_cq(ends[0].cq, usize::MAX, &mut wcs);
        for wc in &wcs {
            let Some(i) = qps.iter().position(|&q| q == wc.qp_num) else {
                continue;
            };
            if wc.status != WcStatus::Success {
                res.errors += 1;
                continue;
            }
            for (k, t) in [lo, hi].into_iter().enumerate() {
                if now <= t {
                    done_bytes[i][k] += u64::from(msg);
                }
            }
            if now < cfg.duration_ns && post(dev_a, qps[i], next_wr[i]) {
                next_wr[i] += 1;
            }
        }
        let next = [
            to_b.peek().map(|Reverse((t, _, _))| *t),
            to_a.peek().map(|Reverse((t, _, _))| *t),
            dev_a.poll_timeout().map(Instant::as_nanos),
            dev_b.poll_timeout().map(Instant::as_nanos),
            Some(a_free).filter(|&t| t > now),
            Some(bn_free).filter(|&t| t > now && !queue.is_empty()),
        ]
        .into_iter()
        .flatten()
        .filter(|&t| t > now)
        .min();
        match next {
            Some(t) => now = t,
            None => break,
        }
    }
    let win_s = (hi - lo) as f64 / 1e9;
    // done_bytes[i] = [bytes completed by lo, by hi]: the window's share is the difference.
    res.per_qp_mbps = done_bytes
        .iter()
        .map(|d| d[1].saturating_sub(d[0]) as f64 * 8.0 / win_s / 1e6)
        .collect();
    res.goodput_mbps = res.per_qp_mbps.iter().sum();
    res.utilization = res.goodput_mbps * 1e6 / cfg.bottleneck_bps as f64;
    res.jain = jain(&res.per_qp_mbps);
    res.link_busy = busy_bytes as f64 * 8.0 / win_s / cfg.bottleneck_bps as f64;
    res.mean_queue_bytes = q_area / (hi - lo).max(1) as f64;
    if let Some(c) = dev_b.congestion() {
        res.np_cnp_sent = c.counters().np_cnp_sent;
    }
    if let Some(c) = dev_a.congestion() {
        res.rp_cnp_handled = c.counters().rp_cnp_handled;
    }
    res.retransmitted_packets = dev_a.counters().qp.retransmitted_packets;
    res
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
