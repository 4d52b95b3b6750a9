//! What the trace hooks cost when tracing is off, on the transport benchmark's workload
//! (a lossless simulated pair doing batches of 16 × 64 KiB RDMA WRITEs, path MTU 1024).
//!
//! The hooks cannot be compiled out and back in within one process, so the off-cost is
//! measured from its parts, all in this run, alternating:
//! - T: ns per batch with no subscriber (what every user gets without `--trace`);
//! - N: hook executions per batch, counted by a subscriber that counts every callsite
//!   hit (`register_callsite` says "sometimes", `enabled` counts and says no, so nothing
//!   is recorded and every hook is reached);
//! - c: ns per disabled hook, timed on a loop of the same macro with the same field kinds.
//!
//! The off-cost ratio is T / (T − N·c); goal ≤ 1.03. Also printed: the ratio with
//! tracing on into a JSON sink (`--trace` to /dev/null), for scale.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use xrnic::proto::{Access, Mtu, RdmaInfo, SendWr, Sge, WrOpcode};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair, RcPair};

const MSG: u32 = 65536;
const BATCH: u64 = 16;

struct Bench {
    pair: Pair,
    c: RcPair,
    wrs: Vec<SendWr>,
    wcs: Vec<xrnic::proto::WorkCompletion>,
}

fn setup() -> Bench {
    let link = LinkConfig {
        delay_ns: 0,
        bandwidth_bps: 0,
        ..LinkConfig::default()
    };
    let mut pair = Pair::new(link, 1);
    let c = pair
        .connect(&ConnectOpts {
            mtu: Mtu::Mtu1024,
            ..ConnectOpts::default()
        })
        .expect("connect");
    let n = (MSG as u64 * BATCH) as usize;
    let src = pair
        .a
        .reg_mr(c.pd_a, n, Access::LOCAL_WRITE)
        .expect("reg_mr");
    let dst = pair.b.reg_mr(c.pd_b, n, Access::ALL).expect("reg_mr");
    let wrs = (0..BATCH)
        .map(|i| {
            let mut w = SendWr::new(i, WrOpcode::RdmaWrite);
            w.sg_list = vec![Sge {
                addr: src.addr + i * MSG as u64,
                length: MSG,
                lkey: src.lkey,
            }];
            w.rdma = RdmaInfo {
                remote_addr: dst.addr + i * MSG as u64,
                rkey: dst.rkey,
            };
            w
        })
        .collect();
    Bench {
        pair,
        c,
        wrs,
        wcs: Vec::new(),
    }
}

impl Bench {
    fn run_batch(&mut self) {
        for w in &self.wrs {
            self.pair.a.post_send(self.c.qp_a, w.clone()).expect("post");
        }
        let mut got = 0;
        let (cq, wcs) = (self.c.cq_a, &mut self.wcs);
        self.pair.run_until(xrnic::proto::Instant::MAX, |p| {
            wcs.clear();
            got += p.a.poll_cq(cq, usize::MAX, wcs);
            got as u64 >= BATCH
        });
        assert_eq!(got as u64, BATCH);
    }
}

/// Counts every hook reached; records nothing.
struct Counter(AtomicU64);

impl tracing::Subscriber for Counter {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        self.0.fetch_add(1, Ordering::Relaxed);
        false
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn time(f: &mut impl FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_nanos() as f64
}

const HOOK_LOOP: u64 = 1_000_000;

/// `HOOK_LOOP` disabled hooks shaped like the engine's (five fields, one Debug).
fn hooks() {
    for i in 0..HOOK_LOOP {
        let x = black_box(i);
        tracing::event!(
            target: "xrnic",
            tracing::Level::DEBUG,
            now_ns = x,
            dev = "A",
            qpn = x as u32,
            ev = xrnic::proto::trace::Event::PsnWindow.as_str(),
            una = ?x
        );
    }
}

fn main() {
    let mut b = setup();
    b.run_batch();
    let counter = std::sync::Arc::new(Counter(AtomicU64::new(0)));
    tracing::subscriber::with_default(counter.clone(), || b.run_batch());
    let hooks_per_batch = counter.0.load(Ordering::Relaxed) as f64;

    let sink = || xrnic::trace_out::json_lines_to(std::io::sink);
    let (mut off, mut on, mut hook) = (f64::MAX, f64::MAX, f64::MAX);
    let mut run = || b.run_batch();
    for _ in 0..30 {
        off = off.min(time(&mut run));
        hook = hook.min(time(&mut || hooks()) / HOOK_LOOP as f64);
        let s = sink();
        on = on.min(tracing::subscriber::with_default(s, || time(&mut run)));
    }
    let off_cost = hooks_per_batch * hook;
    let ratio = off / (off - off_cost).max(1.0);
    let packets = (BATCH * u64::from(MSG / 1024)) as f64;
    eprintln!(
        "trace_cost: 16 x 64 KiB WRITE, MTU 1024: {:.0} ns/packet with tracing off; {:.1} hooks/packet at {:.2} ns each when off => off-cost ratio {:.4} (goal <= 1.03); tracing on into a JSON sink: ratio {:.2}",
        off / packets,
        hooks_per_batch / packets,
        hook,
        ratio,
        on / off
    );
}
