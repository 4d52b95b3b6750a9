//! DCQCN end to end on virtual time: two engines, A writing 8 MiB to B through a 1 Gb/s
//! bottleneck that marks CE on ECN-capable frames while its queue holds more than 20 KB
//! (a step-marking switch, the CP). A's NIC runs at 10 Gb/s. With congestion control on,
//! B's notification point sends CNPs, A's reaction point cuts its rate and its pacer holds
//! the frames back, so the bottleneck queue stays short; without it, the queue sits at the
//! transport's window. Ratios are against the run without congestion control.

#[path = "transport_common/mod.rs"]
mod common;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use xrnic::proto::{Instant, RxVerdict};

use common::{mr, send_wr, sge};
use xrnic::proto::congestion::{Algorithm, CongestionControl, DcqcnParams, Pacer};
use xrnic::proto::{Access, RdmaInfo, Rnic, WcStatus, WorkCompletion, WrOpcode};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair, Side};

const LINE: u64 = 10_000_000_000;
const BOTTLENECK: u64 = 1_000_000_000;
const DELAY: u64 = 2_000;
const MARK_ABOVE: usize = 20_000;
const TOTAL: usize = 8 << 20;
const CHUNK: usize = 64 << 10;

fn ser_ns(len: usize, rate: u64) -> u64 {
    ((len as u64 * 8 * 1_000_000_000).div_ceil(rate)).max(1)
}

#[derive(Debug)]
struct Outcome {
    finish_ns: u64,
    /// Time-averaged bottleneck queue over the second half of the run, bytes.
    avg_queue: f64,
    max_queue: usize,
    marked: u64,
    cnp_sent: u64,
    cnp_handled: u64,
    min_rate: u64,
}

fn run(cc: bool) -> Outcome {
    let mut p = Pair::new(LinkConfig::default(), 1);
    let c = p.connect(&ConnectOpts::default()).expect("connect");
    if cc {
        for s in [Side::A, Side::B] {
            p.dev(s).enable_congestion_control(CongestionControl::new(
                Algorithm::Dcqcn(DcqcnParams::connectx()),
                LINE,
                Pacer::DEFAULT_BURST,
            ));
        }
    }
    let src = mr(&mut p, Side::A, &c, TOTAL, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, TOTAL, Access::ALL);
    let pattern: Vec<u8> = (0..TOTAL).map(|i| (i * 7 + i / 4093) as u8).collect();
    p.dev(Side::A)
        .mr_bytes_mut(src.lkey)
        .unwrap()
        .copy_from_slice(&pattern);
    for (k, off) in (0..TOTAL).step_by(CHUNK).enumerate() {
        let mut w = send_wr(
            k as u64,
            WrOpcode::RdmaWrite,
            sge(&src, off as u64, CHUNK as u32),
        );
        w.rdma = RdmaInfo {
            remote_addr: dst.addr + off as u64,
            rkey: dst.rkey,
        };
        p.dev(Side::A).post_send(c.qp_a, w).unwrap();
    }
    let wrs = TOTAL / CHUNK;

    let Pair {
        a: ref mut dev_a,
        b: ref mut dev_b,
        ..
    } = p;
    let mut now = 0u64;
    let mut seq = 0u64;
    let mut buf = vec![0u8; xrnic::proto::MAX_FRAME_LEN];
    let mut to_b: BinaryHeap<Reverse<(u64, u64, Vec<u8>)>> = BinaryHeap::new();
    let mut to_a: BinaryHeap<Reverse<(u64, u64, Vec<u8>)>> = BinaryHeap::new();
    let mut queue: VecDeque<Vec<u8>> = VecDeque::new();
    let mut queue_bytes = 0usize;
    let (mut a_free, mut bn_free) = (0u64, 0u64);
    let mut samples: Vec<(u64, usize)> = Vec::new();
    let mut wcs: Vec<WorkCompletion> = Vec::new();
    let mut out = Outcome {
        finish_ns: 0,
        avg_queue: 0.0,
        max_queue: 0,
        marked: 0,
        cnp_sent: 0,
        cnp_handled: 0,
        min_rate: LINE,
    };
    let deliver = |heap: &mut BinaryHeap<Reverse<(u64, u64, Vec<u8>)>>, dev: &mut Rnic, now| {
        while heap.peek().is_some_and(|Reverse((t, _, _))| *t <= now) {
            let Reverse((_, _, f)) = heap.pop().unwrap();
            assert_eq!(
                dev.handle_frame(Instant::from_nanos(now), &f),
                RxVerdict::Taken
            );
        }
    };
    while wcs.len() < wrs {
        assert!(now < 10_000_000_000, "stuck at {now} ns");
        deliver(&mut to_b, dev_b, now);
        deliver(&mut to_a, dev_a, now);
        for d in [&mut *dev_a, &mut *dev_b] {
            if d.poll_timeout().is_some_and(|t| t.as_nanos() <= now) {
                d.handle_timeout(Instant::from_nanos(now));
            }
        }
        while a_free <= now {
            let Some(n) = dev_a.poll_transmit(Instant::from_nanos(now), &mut buf) else {
                break;
            };
            let mut f = buf[..n].to_vec();
            if queue_bytes > MARK_ABOVE && xrnic::wire::mark_ce(&mut f) {
                out.marked += 1;
            }
            queue_bytes += n;
            queue.push_back(f);
            a_free = now + ser_ns(n, LINE);
        }
        for _ in 0..1000 {
            let Some(n) = dev_b.poll_transmit(Instant::from_nanos(now), &mut buf) else {
                break;
            };
            seq += 1;
            to_a.push(Reverse((now + DELAY, seq, buf[..n].to_vec())));
        }
        if bn_free <= now {
            if let Some(f) = queue.pop_front() {
                queue_bytes -= f.len();
                bn_free = now + ser_ns(f.len(), BOTTLENECK);
                seq += 1;
                to_b.push(Reverse((bn_free + DELAY, seq, f)));
            }
        }
        samples.push((now, queue_bytes));
        out.max_queue = out.max_queue.max(queue_bytes);
        if let Some(s) = dev_a.congestion().and_then(|cc| cc.qp_status(c.qp_a)) {
            out.min_rate = out.min_rate.min(s.rate_bps);
        }
        dev_a.poll_cq(c.cq_a, usize::MAX, &mut wcs);

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
        .min();
        match next {
            Some(t) if t > now => now = t,
            // Everything due at `now` was run above: a deadline still at or before `now`
            // would spin the engine.
            Some(t) => panic!("stale deadline {t} at {now}"),
            None => break,
        }
    }
    assert_eq!(wcs.len(), wrs, "every WRITE completed");
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert!(
        dev_b.mr_bytes(dst.lkey).unwrap() == &pattern[..],
        "every byte arrived"
    );
    out.finish_ns = now;
    // Time-weighted queue over the second half.
    let half = now / 2;
    let mut area = 0f64;
    for w in samples.windows(2) {
        let (t0, q) = w[0];
        let t1 = w[1].0;
        if t1 > half {
            area += q as f64 * (t1 - t0.max(half)) as f64;
        }
    }
    out.avg_queue = area / (now - half) as f64;
    if let Some(cc) = dev_b.congestion() {
        out.cnp_sent = cc.counters().np_cnp_sent;
    }
    if let Some(cc) = dev_a.congestion() {
        out.cnp_handled = cc.counters().rp_cnp_handled;
    }
    out
}

#[test]
fn dcqcn_keeps_the_bottleneck_queue_short() {
    let base = run(false);
    let dcqcn = run(true);
    eprintln!("without congestion control: {base:?}");
    eprintln!("with DCQCN (ConnectX defaults): {dcqcn:?}");
    // Without congestion control data is not ECN-capable: nothing is marked, no CNPs.
    assert_eq!((base.marked, base.cnp_sent, base.cnp_handled), (0, 0, 0));
    // With it: CE marks, CNPs from B, cuts at A.
    assert!(dcqcn.marked > 0 && dcqcn.cnp_sent > 0 && dcqcn.cnp_handled > 0);
    assert!(dcqcn.cnp_handled <= dcqcn.cnp_sent);
    assert!(
        dcqcn.min_rate < BOTTLENECK,
        "A was slowed below the bottleneck rate"
    );
    // The queue: well below the window-sized standing queue of the baseline.
    assert!(
        dcqcn.avg_queue * 4.0 < base.avg_queue,
        "queue {:.0} B with DCQCN vs {:.0} B without",
        dcqcn.avg_queue,
        base.avg_queue
    );
    // And the bottleneck stays used: at most 1.5× the baseline's completion time.
    assert!(
        dcqcn.finish_ns * 2 <= base.finish_ns * 3,
        "{} ns with DCQCN vs {} ns without",
        dcqcn.finish_ns,
        base.finish_ns
    );
}
