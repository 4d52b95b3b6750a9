//! `xrnic sim`: two RC QPs over the simulated link, a seeded workload, and a check of every
//! byte and every completion.
//!
//! Contract: [`simulate`] is deterministic for given [`SimParams`]. It posts `messages`
//! work requests from A to B (at most `depth` outstanding), and verifies: each send WR
//! completes exactly once, in posting order, with SUCCESS; SEND payloads and immediates at
//! B's receives; WRITE payloads in B's memory once A's completion arrives; READ payloads
//! in A's memory; atomic results against a model executed in PSN order, and B's atomic
//! words at the end; and that B executed each atomic once. [`run`] prints a summary (with
//! `--json`, the last line is one JSON object) and returns 0 only when all of it held.

use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::proto::Instant;
use crate::proto::{
    Access, MrInfo, Mtu, RdmaInfo, RecvWr, Rnic, SendFlags, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};
use crate::sim::{ConnectOpts, LinkConfig, LinkStats, Pair, RcPair};

/// Largest message `xrnic sim` sends.
pub const MAX_SIZE: u32 = 65536;
const SLOT: u64 = MAX_SIZE as u64;
const ATOMIC_WORDS: usize = 8;

/// Which operations the workload uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ops {
    Send,
    Write,
    Read,
    Atomic,
    Mixed,
}

/// Message sizes: one size, a uniform range, or a mix weighted toward edge cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeSpec {
    Fixed(u32),
    Range(u32, u32),
    /// 1/4 tiny (0..=64), 1/4 at MTU multiples ±1, 1/2 uniform in 0..=65536.
    Mix,
}

/// Parse `--size`: `N`, `A..B` (inclusive) or `mix`; at most 65536.
pub fn parse_size(s: &str) -> Result<SizeSpec, String> {
    let num = |t: &str| -> Result<u32, String> {
        let v: u32 = t
            .trim()
            .parse()
            .map_err(|_| format!("'{t}' is not a byte count"))?;
        if v > MAX_SIZE {
            return Err(format!("{v} is larger than the 65536-byte maximum"));
        }
        Ok(v)
    };
    if s == "mix" {
        return Ok(SizeSpec::Mix);
    }
    if let Some((a, b)) = s.split_once("..") {
        let (a, b) = (num(a)?, num(b)?);
        if a > b {
            return Err(format!("empty size range {a}..{b}"));
        }
        return Ok(SizeSpec::Range(a, b));
    }
    num(s).map(SizeSpec::Fixed)
}

fn parse_prob(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{v} is not a probability in 0..=1"));
    }
    Ok(v)
}

fn parse_mtu(s: &str) -> Result<u32, String> {
    let v: u32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    Mtu::from_bytes(v)
        .map(|_| v)
        .ok_or_else(|| format!("{v} is not a path MTU (256, 512, 1024, 2048 or 4096)"))
}

/// Arguments of `xrnic sim`.
#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    /// Operations to run.
    #[arg(long, value_enum, default_value = "mixed")]
    pub ops: Ops,
    /// Number of messages.
    #[arg(long, default_value_t = 1000)]
    pub messages: u64,
    /// Message size: N, A..B (inclusive, uniform) or "mix"; at most 65536.
    #[arg(long, default_value = "mix", value_parser = parse_size)]
    pub size: SizeSpec,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(long, default_value_t = 1024, value_parser = parse_mtu)]
    pub mtu: u32,
    /// Probability that the link drops a frame.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub loss: f64,
    /// Probability that the link delays a frame past later ones.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub reorder: f64,
    /// Probability that the link delivers a frame twice.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub dup: f64,
    /// Probability that the link flips one bit of a frame.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub corrupt: f64,
    /// PRNG seed (link and workload).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Use IPv6 GIDs instead of IPv4-mapped ones.
    #[arg(long)]
    pub ipv6: bool,
    /// Messages outstanding at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub depth: u32,
    /// One-way link delay in microseconds.
    #[arg(long, default_value_t = 2)]
    pub delay_us: u64,
    /// Link rate in Gbit/s (0 = infinite).
    #[arg(long, default_value_t = 25)]
    pub bandwidth_gbps: u64,
    /// Print the summary as one JSON object on the last line.
    #[arg(long)]
    pub json: bool,
    /// Write every frame both devices send to this pcapng file (virtual-time timestamps,
    /// a comment on each frame that is not the obvious next one).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
    /// Write the engines' per-QP events to this file as JSON lines.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,
    /// Print the QPs, MRs and CQs of both devices at the end (like `rdma resource show`).
    #[arg(long)]
    pub res: bool,
    /// Receive WRs B keeps posted (default: --depth); fewer than --depth SENDs in flight
    /// makes B answer with RNR NAKs.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub recv_depth: Option<u32>,
    /// B's application reposts a receive buffer this many microseconds after its
    /// completion (a slow consumer: SENDs that find no receive WQE get RNR NAKs).
    #[arg(long, default_value_t = 0)]
    pub recv_delay_us: u64,
    /// Probability that the link marks an ECN-capable frame CE (a congested switch).
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub ecn_mark: f64,
    /// Turn DCQCN congestion control on in both devices (data becomes ECN-capable).
    #[arg(long)]
    pub dcqcn: bool,
    /// DCQCN parameter set, as `xrnic perf` (implies --dcqcn).
    #[arg(long = "cc-profile", value_enum, value_name = "PROFILE")]
    pub cc_profile: Option<crate::cli::cc::CcProfile>,
    /// One DCQCN parameter by its mlx5 name in its raw unit, e.g. rp_ai_rate=10; repeat it
    /// or separate with commas (implies --dcqcn).
    #[arg(long = "cc-param", value_name = "NAME=VALUE", value_parser = crate::cli::cc::parse_cc_param)]
    pub cc_param: Vec<String>,
    /// Instead of the verified workload, a dumbbell: --qps QPs of A write to B through a
    /// bottleneck port of this rate (RED with ECN marking, --red), A's line at
    /// --bandwidth-gbps; prints goodput per QP, utilization, Jain fairness, CNPs.
    #[arg(long, value_name = "MBIT")]
    pub bottleneck_mbps: Option<u64>,
    /// Dumbbell: QPs writing through the bottleneck.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub qps: u32,
    /// Dumbbell: virtual run time in ms (the middle half is measured, as perftest -D).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(4..=3_600_000))]
    pub duration_ms: u64,
    /// Dumbbell: one-way delay each way, microseconds.
    #[arg(long, default_value_t = 500)]
    pub bottleneck_delay_us: u64,
    /// Dumbbell: the bottleneck's RED as `MIN,MAX,PROBABILITY,LIMIT[,WLOG]` (bytes, bytes,
    /// 0..1, bytes, EWMA weight 2^-WLOG); default the lab's 15000,45000,0.2,2000000,3.
    #[arg(long, value_name = "MIN,MAX,P,LIMIT[,WLOG]", value_parser = parse_red)]
    pub red: Option<crate::sim::dumbbell::RedConfig>,
    /// Dumbbell: the QPs' local ACK timeout, 4.096 µs · 2^N (IBTA 9.7.6.1.3, perftest's
    /// -u); 14 (67 ms) like perftest.
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    pub qp_timeout: u8,
}

/// Parse `--red MIN,MAX,P,LIMIT[,WLOG]`.
pub fn parse_red(s: &str) -> Result<crate::sim::dumbbell::RedConfig, String> {
    let f: Vec<&str> = s.split(',').map(str::trim).collect();
    if !(4..=5).contains(&f.len()) {
        return Err(format!("'{s}' is not MIN,MAX,PROBABILITY,LIMIT[,WLOG]"));
    }
    let int = |t: &str| -> Result<u64, String> {
        t.parse().map_err(|_| format!("'{t}' is not a byte count"))
    };
    let red = crate::sim::dumbbell::RedConfig {
        min: int(f[0])?,
        max: int(f[1])?,
        max_p: parse_prob(f[2])?,
        limit: int(f[3])?,
        wlog: match f.get(4) {
            Some(w) => w
                .parse::<u32>()
                .ok()
                .filter(|w| (1..=31).contains(w))
                .ok_or_else(|| format!("WLOG '{w}' is not 1..=31"))?,
            None => 3,
        },
    };
    if red.min >= red.max || red.max > red.limit {
        return Err(format!("RED needs MIN < MAX <= LIMIT, not '{s}'"));
    }
    Ok(red)
}

impl SimArgs {
    /// The DCQCN parameters asked for: `None` unless --dcqcn, --cc-profile or --cc-param.
    pub fn dcqcn_params(&self) -> Result<Option<crate::proto::congestion::DcqcnParams>, String> {
        if !self.dcqcn && self.cc_profile.is_none() && self.cc_param.is_empty() {
            return Ok(None);
        }
        let mut p = self
            .cc_profile
            .map_or_else(crate::proto::congestion::DcqcnParams::connectx, |c| {
                c.params()
            });
        for c in &self.cc_param {
            p.apply_all(c).map_err(|e| e.to_string())?;
        }
        Ok(Some(p))
    }
}

/// What [`simulate_with`] does besides [`SimParams`]: options that do not change the
/// workload's checks.
#[derive(Clone, Debug, Default)]
pub struct SimOptions {
    /// Receive WRs B keeps posted (default: the depth).
    pub recv_depth: Option<u32>,
    /// B reposts a consumed receive this long (virtual ns) after its completion.
    pub recv_delay_ns: u64,
    /// DCQCN on both devices, with these parameters.
    pub dcqcn: Option<crate::proto::congestion::DcqcnParams>,
    /// Write a pcapng of every transmitted frame here.
    pub pcap: Option<std::path::PathBuf>,
}

/// What [`simulate_with`] leaves besides the summary.
#[derive(Clone, Debug, Default)]
pub struct SimOutputs {
    /// The resources of A and B at the end.
    pub resources: Vec<crate::proto::resources::Resources>,
    /// Frames written to the pcapng.
    pub pcap_packets: u64,
    /// Frames whose pcapng comment names a retransmission.
    pub pcap_retransmission_comments: u64,
    /// CNPs sent by either device (congestion counters).
    pub cnps_sent: u64,
}

/// Everything [`simulate`] needs.
#[derive(Clone, Copy, Debug)]
pub struct SimParams {
    pub ops: Ops,
    pub messages: u64,
    pub size: SizeSpec,
    pub mtu: Mtu,
    pub link: LinkConfig,
    pub seed: u64,
    pub ipv6: bool,
    pub depth: u32,
}

impl From<&SimArgs> for SimParams {
    fn from(a: &SimArgs) -> Self {
        SimParams {
            ops: a.ops,
            messages: a.messages,
            size: a.size,
            mtu: Mtu::from_bytes(a.mtu).unwrap_or(Mtu::Mtu1024),
            link: LinkConfig {
                loss: a.loss,
                reorder: a.reorder,
                dup: a.dup,
                corrupt: a.corrupt,
                delay_ns: a.delay_us.saturating_mul(1000),
                bandwidth_bps: a.bandwidth_gbps.saturating_mul(1_000_000_000),
                ce_mark: a.ecn_mark,
                ..LinkConfig::default()
            },
            seed: a.seed,
            ipv6: a.ipv6,
            depth: a.depth,
        }
    }
}

/// The result of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SimSummary {
    pub ok: bool,
    pub messages: u64,
    pub messages_completed: u64,
    /// Completions with a status other than SUCCESS (both sides).
    pub errors: u64,
    /// Payload bytes compared at the destination (and at the requester for READ/atomics).
    pub bytes_verified: u64,
    /// Wrong bytes, wrong immediates, wrong lengths, out-of-order or unexpected completions.
    pub mismatches: u64,
    pub retransmitted_packets: u64,
    pub naks_sent: u64,
    pub rnr_naks_sent: u64,
    /// Duplicate requests at the responder plus duplicate responses at the requester.
    pub duplicates_received: u64,
    pub malformed_frames_dropped: u64,
    pub local_ack_timeouts: u64,
    pub atomics_posted: u64,
    pub atomics_executed: u64,
    pub packets_sent: u64,
    pub virtual_time_us: u64,
    pub link: LinkStats,
    /// Why the run stopped early, if it did.
    pub stalled: Option<String>,
    /// The first error completion, as "side wr_id opcode status".
    pub first_error: Option<String>,
}

/// splitmix64: the payload pattern and the workload's own PRNG (cheap, seedable).
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The payload of message `id`: 8-byte words of a hash of (seed, id, word index).
fn fill(seed: u64, id: u64, out: &mut [u8]) {
    let base = mix64(seed ^ id.wrapping_mul(0x2545_f491_4f6c_dd1d));
    for (w, chunk) in out.chunks_mut(8).enumerate() {
        let v = mix64(base.wrapping_add(w as u64)).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix64(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Send { imm: Option<u32> },
    Write { imm: Option<u32> },
    Read,
    Atomic { expect_orig: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Msg {
    id: u64,
    kind: Kind,
    len: u32,
    slot: u64,
}

fn pick_size(spec: SizeSpec, mtu: u32, r: &mut Rng) -> u32 {
    match spec {
        SizeSpec::Fixed(n) => n,
        SizeSpec::Range(a, b) => a + r.below(u64::from(b - a) + 1) as u32,
        SizeSpec::Mix => match r.below(4) {
            0 => r.below(65) as u32,
            1 => {
                let k = 1 + r.below(u64::from(MAX_SIZE / mtu)) as u32;
                (k * mtu + r.below(3) as u32)
                    .saturating_sub(1)
                    .min(MAX_SIZE)
            }
            _ => r.below(u64::from(MAX_SIZE) + 1) as u32,
        },
    }
}

/// Run the workload; never panics on any parameters.
pub fn simulate(p: &SimParams) -> SimSummary {
    simulate_with(p, &SimOptions::default()).0
}

/// [`simulate`] with the extra options; a pcapng that cannot be written stops the run
/// (`stalled` says why).
pub fn simulate_with(p: &SimParams, o: &SimOptions) -> (SimSummary, SimOutputs) {
    let mut out = SimOutputs::default();
    let s = simulate_inner(p, o, &mut out);
    (s, out)
}

fn simulate_inner(p: &SimParams, o: &SimOptions, out: &mut SimOutputs) -> SimSummary {
    let mut w = match Workload::set_up(p, o) {
        Ok(w) => w,
        Err(stalled) => {
            return SimSummary {
                messages: p.messages,
                stalled: Some(stalled),
                ..Default::default()
            };
        }
    };
    w.run_to_the_end();
    // Let the last ACKs and duplicates settle so counters are final.
    let pair = &mut w.pair;
    pair.run_until(pair.now + Duration::from_secs(1), |pr| {
        pr.link.in_flight() == 0
    });
    w.check_what_remains();
    w.take_counters();
    w.finish(out)
}

/// The five memory regions of the workload (A's one, B's four).
struct WorkloadMrs {
    /// A: sources and READ/atomic results.
    a_buf: MrInfo,
    /// B: receive buffers.
    b_recv: MrInfo,
    /// B: WRITE targets.
    b_write: MrInfo,
    /// B: READ sources.
    b_read: MrInfo,
    /// B: atomic words.
    b_atomic: MrInfo,
}

/// One run of [`simulate`]: the pair, its objects, the workload's PRNG and model, what is
/// outstanding, and the summary being counted.
struct Workload<'p> {
    p: &'p SimParams,
    o: &'p SimOptions,
    s: SimSummary,
    pair: Pair,
    c: RcPair,
    mrs: WorkloadMrs,
    depth: u64,
    rng: Rng,
    /// What B's atomic words hold once every atomic posted so far has executed.
    model: [u64; ATOMIC_WORDS],
    /// A's send WRs, in posting order.
    in_flight: std::collections::VecDeque<Msg>,
    /// The messages that complete a receive at B, in order.
    recv_expect: std::collections::VecDeque<Msg>,
    next_id: u64,
    wcs: Vec<WorkCompletion>,
    /// Receive buffers B's application gives back, and when.
    reposts: std::collections::VecDeque<(Instant, u64)>,
    scratch: Vec<u8>,
}

impl<'p> Workload<'p> {
    /// The pair with its capture and congestion control, connected, its memory registered
    /// and B's receives posted; the reason the run stalls when any of it fails.
    fn set_up(p: &'p SimParams, o: &'p SimOptions) -> Result<Self, String> {
        let depth = u64::from(p.depth.clamp(1, 256));
        let mut pair = Pair::new(p.link, p.seed);
        pair.a.set_name("A");
        pair.b.set_name("B");
        if let Some(path) = &o.pcap {
            pair.pcap = Some(crate::sim::SimPcap::create(path)?);
        }
        if let Some(params) = o.dcqcn {
            enable_dcqcn(&mut pair, p, params);
        }
        let recv_depth = u64::from(o.recv_depth.unwrap_or(p.depth).clamp(1, 256)).min(depth);
        let opts = ConnectOpts {
            mtu: p.mtu,
            ipv6: p.ipv6,
            ..ConnectOpts::default()
        };
        let c = pair
            .connect(&opts)
            .map_err(|e| format!("connect failed: {e}"))?;
        let mrs = register_mrs(&mut pair, &c, depth).map_err(|e| format!("reg_mr failed: {e}"))?;
        for slot in 0..recv_depth {
            if pair
                .b
                .post_recv(c.qp_b, recv_wr(&mrs.b_recv, slot))
                .is_err()
            {
                return Err("post_recv failed".into());
            }
        }
        Ok(Workload {
            p,
            o,
            s: SimSummary {
                messages: p.messages,
                ..Default::default()
            },
            pair,
            c,
            mrs,
            depth,
            rng: Rng(mix64(p.seed ^ 0x5157_4f52_4b4c_4f41)),
            model: [0u64; ATOMIC_WORDS],
            in_flight: Default::default(),
            recv_expect: Default::default(),
            next_id: 0,
            wcs: Vec::new(),
            reposts: Default::default(),
            scratch: vec![0u8; MAX_SIZE as usize],
        })
    }

    /// Post, check completions and step the link until every message is accounted for,
    /// or the run stalls.
    fn run_to_the_end(&mut self) {
        let limit = Instant::from_nanos(3_600_000_000_000);
        loop {
            if let Err(e) = self.post_while_room() {
                self.s.stalled = Some(e);
                break;
            }
            let room_freed = self.check_requester_completions();
            self.check_responder_completions();
            self.repost_due_receives();
            if self.all_accounted_for() {
                break;
            }
            if self.pair.now > limit {
                self.s.stalled = Some(format!(
                    "virtual time limit reached with {} outstanding",
                    self.in_flight.len()
                ));
                break;
            }
            let stepped = self.pair.step();
            if !stepped && !room_freed {
                if let Some(&(t, _)) = self.reposts.front() {
                    // Nothing happens until the next repost: jump there.
                    self.pair.now = self.pair.now.max(t);
                    continue;
                }
                self.s.stalled = Some(format!(
                    "no progress possible with {} outstanding",
                    self.in_flight.len()
                ));
                break;
            }
        }
    }

    fn all_accounted_for(&self) -> bool {
        self.s.messages_completed + self.s.mismatches >= self.p.messages
            && self.in_flight.is_empty()
            && self.next_id >= self.p.messages
    }

    /// Post the next messages while fewer than the depth are outstanding.
    fn post_while_room(&mut self) -> Result<(), String> {
        while self.next_id < self.p.messages && (self.in_flight.len() as u64) < self.depth {
            let (wr, m) = self.next_message();
            self.pair
                .a
                .post_send(self.c.qp_a, wr)
                .map_err(|e| format!("post_send failed: {e}"))?;
            if matches!(m.kind, Kind::Send { .. } | Kind::Write { imm: Some(_) }) {
                self.recv_expect.push_back(m);
            }
            self.in_flight.push_back(m);
            self.next_id += 1;
        }
        Ok(())
    }

    /// The next message drawn from the PRNG, its source (or READ source) filled and, for
    /// an atomic, the model updated: the work request and what to expect of it.
    fn next_message(&mut self) -> (SendWr, Msg) {
        let id = self.next_id;
        let slot = id % self.depth;
        let op = match self.p.ops {
            Ops::Mixed => match self.rng.below(20) {
                0..=5 => 0,
                6..=11 => 1,
                12..=16 => 2,
                _ => 3,
            },
            Ops::Send => 0,
            Ops::Write => 1,
            Ops::Read => 2,
            Ops::Atomic => 3,
        };
        let mut len = pick_size(self.p.size, self.p.mtu.bytes(), &mut self.rng);
        let with_imm = self.rng.below(4) == 0;
        let imm = with_imm.then(|| self.rng.next() as u32);
        let mut wr = SendWr::new(id, WrOpcode::Send);
        let kind = match op {
            0 | 1 => self.prepare_send_or_write(&mut wr, op == 0, id, slot, len, imm),
            2 => self.prepare_read(&mut wr, id, slot, len),
            _ => {
                len = 8;
                self.prepare_atomic(&mut wr)
            }
        };
        if let Kind::Send { imm: Some(v) } | Kind::Write { imm: Some(v) } = kind {
            wr.imm_data = v;
        }
        wr.sg_list = vec![Sge {
            addr: self.mrs.a_buf.addr + slot * SLOT,
            length: len,
            lkey: self.mrs.a_buf.lkey,
        }];
        wr.send_flags = SendFlags::SIGNALED;
        let m = Msg {
            id,
            kind,
            len,
            slot,
        };
        (wr, m)
    }

    /// A SEND (`send`) or WRITE of message `id` from A's slot, its payload filled.
    fn prepare_send_or_write(
        &mut self,
        wr: &mut SendWr,
        send: bool,
        id: u64,
        slot: u64,
        len: u32,
        imm: Option<u32>,
    ) -> Kind {
        if let Some(buf) = self.pair.a.mr_bytes_mut(self.mrs.a_buf.lkey) {
            let off = (slot * SLOT) as usize;
            fill(self.p.seed, id, &mut buf[off..off + len as usize]);
        }
        if send {
            wr.opcode = if imm.is_some() {
                WrOpcode::SendWithImm
            } else {
                WrOpcode::Send
            };
            Kind::Send { imm }
        } else {
            wr.opcode = if imm.is_some() {
                WrOpcode::RdmaWriteWithImm
            } else {
                WrOpcode::RdmaWrite
            };
            wr.rdma = RdmaInfo {
                remote_addr: self.mrs.b_write.addr + slot * SLOT,
                rkey: self.mrs.b_write.rkey,
            };
            Kind::Write { imm }
        }
    }

    /// A READ of message `id` from B's slot, which is filled with its payload.
    fn prepare_read(&mut self, wr: &mut SendWr, id: u64, slot: u64, len: u32) -> Kind {
        if let Some(buf) = self.pair.b.mr_bytes_mut(self.mrs.b_read.lkey) {
            let off = (slot * SLOT) as usize;
            fill(self.p.seed, id, &mut buf[off..off + len as usize]);
        }
        wr.opcode = WrOpcode::RdmaRead;
        wr.rdma = RdmaInfo {
            remote_addr: self.mrs.b_read.addr + slot * SLOT,
            rkey: self.mrs.b_read.rkey,
        };
        Kind::Read
    }

    /// A FETCH_AND_ADD or a COMPARE_AND_SWAP on one of B's atomic words, the model
    /// executing it in posting order (PSN order: what the responder does).
    fn prepare_atomic(&mut self, wr: &mut SendWr) -> Kind {
        let rng = &mut self.rng;
        let model = &mut self.model;
        let w = rng.below(ATOMIC_WORDS as u64) as usize;
        let expect_orig = model[w];
        wr.atomic.remote_addr = self.mrs.b_atomic.addr + 8 * w as u64;
        wr.atomic.rkey = self.mrs.b_atomic.rkey;
        if rng.below(2) == 0 {
            wr.opcode = WrOpcode::AtomicFetchAndAdd;
            wr.atomic.compare_add = rng.next() >> 8;
            model[w] = model[w].wrapping_add(wr.atomic.compare_add);
        } else {
            wr.opcode = WrOpcode::AtomicCmpAndSwp;
            // Half the compares match, so both outcomes are exercised.
            let hit = rng.below(2) == 0;
            wr.atomic.compare_add = if hit { model[w] } else { model[w] ^ 1 };
            wr.atomic.swap = rng.next();
            if hit {
                model[w] = wr.atomic.swap;
            }
        }
        self.s.atomics_posted += 1;
        Kind::Atomic { expect_orig }
    }

    /// Requester completions: exactly once, in order, SUCCESS, with the right data.
    /// Whether they freed room to post more (without the link having to do anything).
    fn check_requester_completions(&mut self) -> bool {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        self.pair.a.poll_cq(self.c.cq_a, usize::MAX, &mut wcs);
        let room_freed = !wcs.is_empty() && self.next_id < self.p.messages;
        for wc in &wcs {
            self.check_requester_completion(wc);
        }
        self.wcs = wcs;
        room_freed
    }

    fn check_requester_completion(&mut self, wc: &WorkCompletion) {
        let s = &mut self.s;
        let Some(m) = self.in_flight.pop_front() else {
            s.mismatches += 1;
            return;
        };
        if wc.status != WcStatus::Success {
            s.errors += 1;
            if s.first_error.is_none() {
                s.first_error = Some(format!(
                    "A wr_id {} {:?} {:?}",
                    wc.wr_id, wc.opcode, wc.status
                ));
            }
        }
        if wc.wr_id != m.id {
            s.mismatches += 1;
            return;
        }
        s.messages_completed += 1;
        if wc.status != WcStatus::Success {
            return;
        }
        let off = (m.slot * SLOT) as usize;
        let n = m.len as usize;
        let scratch = &mut self.scratch;
        let pair = &self.pair;
        match m.kind {
            Kind::Write { .. } => {
                fill(self.p.seed, m.id, &mut scratch[..n]);
                let ok = pair
                    .b
                    .mr_bytes(self.mrs.b_write.lkey)
                    .is_some_and(|b| b[off..off + n] == scratch[..n]);
                if ok {
                    s.bytes_verified += m.len as u64
                } else {
                    s.mismatches += 1
                }
            }
            Kind::Read => {
                fill(self.p.seed, m.id, &mut scratch[..n]);
                let ok = pair
                    .a
                    .mr_bytes(self.mrs.a_buf.lkey)
                    .is_some_and(|b| b[off..off + n] == scratch[..n]);
                if ok && wc.byte_len == m.len && wc.opcode == WcOpcode::RdmaRead {
                    s.bytes_verified += m.len as u64
                } else {
                    s.mismatches += 1
                }
            }
            Kind::Atomic { expect_orig } => {
                let got = pair.a.mr_bytes(self.mrs.a_buf.lkey).map(|b| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&b[off..off + 8]);
                    u64::from_ne_bytes(w)
                });
                if got == Some(expect_orig) {
                    s.bytes_verified += 8
                } else {
                    s.mismatches += 1
                }
            }
            Kind::Send { .. } => {}
        }
    }

    /// Responder completions: receives in order, bytes and immediates right; each consumed
    /// buffer queued for its repost.
    fn check_responder_completions(&mut self) {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        self.pair.b.poll_cq(self.c.cq_b, usize::MAX, &mut wcs);
        for wc in &wcs {
            self.check_responder_completion(wc);
        }
        self.wcs = wcs;
    }

    fn check_responder_completion(&mut self, wc: &WorkCompletion) {
        let s = &mut self.s;
        if wc.status != WcStatus::Success {
            s.errors += 1;
            if s.first_error.is_none() {
                s.first_error = Some(format!(
                    "B wr_id {} {:?} {:?}",
                    wc.wr_id, wc.opcode, wc.status
                ));
            }
            return;
        }
        let Some(m) = self.recv_expect.pop_front() else {
            s.mismatches += 1;
            return;
        };
        let slot = wc.wr_id;
        let n = m.len as usize;
        let scratch = &mut self.scratch;
        match m.kind {
            Kind::Send { imm } => {
                fill(self.p.seed, m.id, &mut scratch[..n]);
                let off = (slot * SLOT) as usize;
                let ok = wc.opcode == WcOpcode::Recv
                    && wc.byte_len == m.len
                    && wc.imm_data == imm
                    && self
                        .pair
                        .b
                        .mr_bytes(self.mrs.b_recv.lkey)
                        .is_some_and(|b| b[off..off + n] == scratch[..n]);
                if ok {
                    s.bytes_verified += m.len as u64
                } else {
                    s.mismatches += 1
                }
            }
            Kind::Write { imm } => {
                let ok = wc.opcode == WcOpcode::RecvRdmaWithImm
                    && wc.byte_len == m.len
                    && wc.imm_data == imm;
                if !ok {
                    s.mismatches += 1;
                }
            }
            _ => s.mismatches += 1,
        }
        self.reposts.push_back((
            self.pair.now + Duration::from_nanos(self.o.recv_delay_ns),
            slot,
        ));
    }

    /// The application gives receive buffers back after its delay.
    fn repost_due_receives(&mut self) {
        while self
            .reposts
            .front()
            .is_some_and(|&(t, _)| t <= self.pair.now)
        {
            let Some((_, slot)) = self.reposts.pop_front() else {
                break;
            };
            let wr = recv_wr(&self.mrs.b_recv, slot);
            if self.pair.b.post_recv(self.c.qp_b, wr).is_err() {
                self.s.mismatches += 1;
            }
        }
    }

    /// At the end: B's atomic words against the model, and no receive still expected.
    fn check_what_remains(&mut self) {
        let s = &mut self.s;
        if let Some(b) = self.pair.b.mr_bytes(self.mrs.b_atomic.lkey) {
            let ok = b.chunks(8).zip(self.model.iter()).all(|(w, m)| {
                let mut x = [0u8; 8];
                x.copy_from_slice(w);
                u64::from_ne_bytes(x) == *m
            });
            if ok && s.atomics_posted > 0 {
                s.bytes_verified += 8 * ATOMIC_WORDS as u64;
            } else if !ok {
                s.mismatches += 1;
            }
        }
        if !self.recv_expect.is_empty() {
            s.mismatches += self.recv_expect.len() as u64;
        }
    }

    /// Both devices' counters and the link's statistics into the summary; B must have
    /// executed each atomic once.
    fn take_counters(&mut self) {
        let s = &mut self.s;
        let pair = &self.pair;
        let (ca, cb) = (pair.a.counters(), pair.b.counters());
        s.retransmitted_packets = ca.qp.retransmitted_packets + cb.qp.retransmitted_packets;
        s.naks_sent = ca.qp.naks_sent + cb.qp.naks_sent;
        s.rnr_naks_sent = ca.qp.rnr_naks_sent + cb.qp.rnr_naks_sent;
        s.duplicates_received = ca.qp.duplicate_request
            + cb.qp.duplicate_request
            + ca.qp.duplicate_response
            + cb.qp.duplicate_response;
        s.malformed_frames_dropped = ca.malformed_frames_dropped + cb.malformed_frames_dropped;
        s.local_ack_timeouts = ca.qp.local_ack_timeout_err + cb.qp.local_ack_timeout_err;
        s.atomics_executed = cb.qp.atomics_executed;
        s.packets_sent = ca.qp.packets_sent + cb.qp.packets_sent;
        s.virtual_time_us = pair.now.as_nanos() / 1000;
        s.link = pair.link.stats;
        if s.atomics_executed != s.atomics_posted {
            s.mismatches += 1;
        }
    }

    /// The resources, CNPs and capture into `out`, and the summary's verdict.
    fn finish(mut self, out: &mut SimOutputs) -> SimSummary {
        let (s, pair) = (&mut self.s, &mut self.pair);
        out.resources = vec![pair.a.resources(), pair.b.resources()];
        out.cnps_sent = [&pair.a, &pair.b]
            .iter()
            .filter_map(|d| d.congestion().map(|c| c.counters().np_cnp_sent))
            .sum();
        if let Some(pc) = pair.pcap.take() {
            out.pcap_retransmission_comments = pc.retransmission_comments;
            match pc.finish() {
                Ok(n) => out.pcap_packets = n,
                Err(e) => s.stalled = Some(format!("cannot write the pcapng: {e}")),
            }
        }
        s.ok = s.stalled.is_none()
            && s.errors == 0
            && s.mismatches == 0
            && s.messages_completed == self.p.messages;
        self.s
    }
}

/// DCQCN on both devices, at the link's rate (100 Gbit/s for an infinite link).
fn enable_dcqcn(pair: &mut Pair, p: &SimParams, params: crate::proto::congestion::DcqcnParams) {
    use crate::proto::congestion::{Algorithm, CongestionControl};
    let line = if p.link.bandwidth_bps == 0 {
        100_000_000_000
    } else {
        p.link.bandwidth_bps
    };
    for d in [&mut pair.a, &mut pair.b] {
        d.enable_congestion_control(CongestionControl::new(
            Algorithm::Dcqcn(params),
            line,
            crate::proto::congestion::Pacer::DEFAULT_BURST,
        ));
    }
}

/// The workload's memory regions, `depth` slots each (B's atomic words apart).
fn register_mrs(
    pair: &mut Pair,
    c: &RcPair,
    depth: u64,
) -> Result<WorkloadMrs, crate::proto::VerbsError> {
    let reg = |d: &mut Rnic, pd, len: u64| d.reg_mr(pd, len as usize, Access::ALL);
    Ok(WorkloadMrs {
        a_buf: reg(&mut pair.a, c.pd_a, depth * SLOT)?,
        b_recv: reg(&mut pair.b, c.pd_b, depth * SLOT)?,
        b_write: reg(&mut pair.b, c.pd_b, depth * SLOT)?,
        b_read: reg(&mut pair.b, c.pd_b, depth * SLOT)?,
        b_atomic: reg(&mut pair.b, c.pd_b, 8 * ATOMIC_WORDS as u64)?,
    })
}

/// B's receive of buffer `slot`.
fn recv_wr(b_recv: &MrInfo, slot: u64) -> RecvWr {
    RecvWr {
        wr_id: slot,
        sg_list: vec![Sge {
            addr: b_recv.addr + slot * SLOT,
            length: MAX_SIZE,
            lkey: b_recv.lkey,
        }],
    }
}

/// `xrnic sim`: run, print, and return the exit code (0 all verified, 1 otherwise).
pub fn run(args: &SimArgs) -> i32 {
    use std::io::Write;
    let dcqcn = match args.dcqcn_params() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("xrnic sim: {e}");
            return 2;
        }
    };
    if let Some(mbps) = args.bottleneck_mbps {
        return run_dumbbell(args, mbps, dcqcn);
    }
    let opts = SimOptions {
        recv_depth: args.recv_depth,
        recv_delay_ns: args.recv_delay_us.saturating_mul(1000),
        dcqcn,
        pcap: args.pcap.clone(),
    };
    let params = SimParams::from(args);
    let (s, out) = match &args.trace {
        Some(path) => match crate::trace_out::json_lines(path) {
            Ok(sub) => tracing::subscriber::with_default(sub, || simulate_with(&params, &opts)),
            Err(e) => {
                eprintln!("xrnic sim: {e}");
                return 1;
            }
        },
        None => simulate_with(&params, &opts),
    };
    let mut text = format!(
        "xrnic sim: {} of {} messages completed, {} errors, {} mismatches, {} bytes verified\n",
        s.messages_completed, s.messages, s.errors, s.mismatches, s.bytes_verified
    );
    text += &format!(
        "  packets sent {}, retransmitted {}, NAKs {}, RNR NAKs {}, duplicates {}, malformed dropped {}\n",
        s.packets_sent,
        s.retransmitted_packets,
        s.naks_sent,
        s.rnr_naks_sent,
        s.duplicates_received,
        s.malformed_frames_dropped
    );
    text += &format!(
        "  link: {} frames, {} lost, {} duplicated, {} reordered, {} corrupted; virtual time {} us\n",
        s.link.frames_sent,
        s.link.lost,
        s.link.duplicated,
        s.link.reordered,
        s.link.corrupted,
        s.virtual_time_us
    );
    if let Some(p) = &args.pcap {
        text += &format!(
            "  pcapng: {} frames written to {}, {} with a retransmission comment\n",
            out.pcap_packets,
            p.display(),
            out.pcap_retransmission_comments
        );
    }
    if dcqcn.is_some() || args.ecn_mark > 0.0 {
        text += &format!(
            "  congestion: {} frames marked CE by the link, {} CNPs sent\n",
            s.link.ce_marked, out.cnps_sent
        );
    }
    if args.res {
        for r in &out.resources {
            text += &r.qp_lines();
            text += &r.mr_lines();
            text += &r.cq_lines();
        }
    }
    if let Some(why) = &s.stalled {
        text += &format!("  stopped early: {why}\n");
    }
    if let Some(e) = &s.first_error {
        text += &format!("  first error completion: {e}\n");
    }
    if args.json {
        match serde_json::to_string(&s) {
            Ok(j) => text += &format!("{j}\n"),
            Err(e) => {
                eprintln!("xrnic sim: cannot encode the summary: {e}");
                return 1;
            }
        }
    }
    // A closed pipe (`| head`) is not a reason to panic; the exit code still tells.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    if s.ok { 0 } else { 1 }
}

/// `xrnic sim --bottleneck-mbps`: the dumbbell (src/sim/dumbbell.rs), its figures and,
/// with --json, one JSON object as the last line; 0 when the run had no error.
fn run_dumbbell(
    args: &SimArgs,
    mbps: u64,
    dcqcn: Option<crate::proto::congestion::DcqcnParams>,
) -> i32 {
    use crate::sim::dumbbell::{DumbbellConfig, RedConfig, run};
    use std::io::Write;
    if mbps == 0 {
        eprintln!("xrnic sim: --bottleneck-mbps must be at least 1");
        return 2;
    }
    if args.pcap.is_some() {
        eprintln!("xrnic sim: --pcap is not available with --bottleneck-mbps");
        return 2;
    }
    let cfg = DumbbellConfig {
        qps: args.qps,
        line_rate_bps: args.bandwidth_gbps.max(1).saturating_mul(1_000_000_000),
        bottleneck_bps: mbps.saturating_mul(1_000_000),
        delay_ns: args.bottleneck_delay_us.saturating_mul(1000),
        red: args.red.unwrap_or(RedConfig::LAB),
        dcqcn,
        duration_ns: args.duration_ms.saturating_mul(1_000_000),
        msg_bytes: 65536,
        depth: args.depth,
        seed: args.seed,
        timeout: args.qp_timeout,
        mtu: crate::proto::Mtu::from_bytes(args.mtu).unwrap_or_default(),
    };
    let r = match &args.trace {
        Some(path) => match crate::trace_out::json_lines(path) {
            Ok(sub) => tracing::subscriber::with_default(sub, || run(&cfg)),
            Err(e) => {
                eprintln!("xrnic sim: {e}");
                return 1;
            }
        },
        None => run(&cfg),
    };
    let mut text = format!(
        "xrnic sim: {} QPs through {mbps} Mbit/s ({} DCQCN), middle half of {} ms\n",
        cfg.qps,
        if dcqcn.is_some() { "with" } else { "without" },
        args.duration_ms
    );
    text += &format!(
        "  goodput {:.2} Mb/s ({:.1} % of the bottleneck; per QP {}), Jain {:.3}, link busy {:.1} %\n",
        r.goodput_mbps,
        100.0 * r.utilization,
        r.per_qp_mbps
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(" / "),
        r.jain,
        100.0 * r.link_busy
    );
    text += &format!(
        "  CE marked {}, dropped {}, CNPs sent {} handled {}, retransmitted {}, mean queue {:.0} B, errors {}\n",
        r.ce_marked,
        r.dropped,
        r.np_cnp_sent,
        r.rp_cnp_handled,
        r.retransmitted_packets,
        r.mean_queue_bytes,
        r.errors
    );
    if args.json {
        match serde_json::to_string(&r) {
            Ok(j) => text += &format!("{j}\n"),
            Err(e) => {
                eprintln!("xrnic sim: cannot encode the summary: {e}");
                return 1;
            }
        }
    }
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    if r.errors == 0 { 0 } else { 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_specs_parse_and_refuse() {
        assert_eq!(parse_size("4096"), Ok(SizeSpec::Fixed(4096)));
        assert_eq!(parse_size("0..65536"), Ok(SizeSpec::Range(0, 65536)));
        assert_eq!(parse_size("mix"), Ok(SizeSpec::Mix));
        assert!(parse_size("65537").is_err());
        assert!(parse_size("9..3").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_prob("1.5").is_err());
        assert!(parse_mtu("1500").is_err());
        assert_eq!(parse_mtu("256"), Ok(256));
    }

    #[test]
    fn one_message_at_a_time_runs_to_the_end() {
        // Regression: with depth 1 the link is idle between messages; that is not a stall.
        let p = SimParams {
            ops: Ops::Mixed,
            messages: 50,
            size: SizeSpec::Range(0, 5000),
            mtu: Mtu::Mtu4096,
            link: LinkConfig::default(),
            seed: 32,
            ipv6: false,
            depth: 1,
        };
        let s = simulate(&p);
        assert!(s.ok, "{s:#?}");
        assert_eq!(s.messages_completed, 50);
    }

    #[test]
    fn a_small_lossy_mixed_run_verifies() {
        let p = SimParams {
            ops: Ops::Mixed,
            messages: 200,
            size: SizeSpec::Mix,
            mtu: Mtu::Mtu1024,
            link: LinkConfig {
                loss: 0.02,
                reorder: 0.02,
                dup: 0.02,
                corrupt: 0.02,
                ..LinkConfig::default()
            },
            seed: 3,
            ipv6: false,
            depth: 16,
        };
        let s = simulate(&p);
        assert!(s.ok, "{s:#?}");
        assert!(
            s.retransmitted_packets > 0 && s.malformed_frames_dropped > 0,
            "{s:#?}"
        );
        assert_eq!(s.atomics_executed, s.atomics_posted);
    }

    #[derive(Debug, clap::Parser)]
    struct W {
        #[command(flatten)]
        a: SimArgs,
    }

    fn args(v: &[&str]) -> Result<SimArgs, clap::Error> {
        use clap::Parser;
        let mut all = vec!["sim"];
        all.extend_from_slice(v);
        W::try_parse_from(all).map(|w| w.a)
    }

    #[test]
    fn cc_flags_pick_the_parameters_like_perf() {
        use crate::proto::congestion::DcqcnParams;
        assert_eq!(args(&[]).unwrap().dcqcn_params(), Ok(None));
        assert_eq!(
            args(&["--dcqcn"]).unwrap().dcqcn_params(),
            Ok(Some(DcqcnParams::connectx()))
        );
        let p = args(&[
            "--cc-profile",
            "paper",
            "--cc-param",
            "rp_ai_rate=7,rp_gd=12",
        ])
        .unwrap()
        .dcqcn_params()
        .unwrap()
        .expect("--cc-profile implies DCQCN");
        let mut want = DcqcnParams::paper();
        want.rp_ai_rate = 7;
        want.rp_gd = 12;
        assert_eq!(p, want);
        let p = args(&["--cc-param", "rp_time_reset=1000"])
            .unwrap()
            .dcqcn_params()
            .unwrap()
            .unwrap();
        assert_eq!((p.rp_time_reset, p.rp_ai_rate), (1000, 5));
        for bad in [
            &["--cc-param", "rp_nope=1"][..],
            &["--cc-param", "rp_gd=99"],
            &["--cc-profile", "dctcp"],
            &["--red", "45000,15000,0.2,400000"],
            &["--red", "1,2,3"],
            &["--red", "15000,45000,1.5,400000"],
            &["--qps", "0"],
        ] {
            let e = args(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
        let r = args(&["--red", "1000,2000,0.5,9000,4"])
            .unwrap()
            .red
            .unwrap();
        assert_eq!((r.min, r.max, r.limit, r.wlog), (1000, 2000, 9000, 4));
        assert_eq!(r.max_p, 0.5);
    }

    /// `--trace` on a dumbbell logs every CNP the sender takes with the reaction point's
    /// state after it and the bytes the QP sent: fields that let another model replay the
    /// run; the count matches the device counter.
    #[test]
    fn trace_logs_every_cnp_with_the_rate_state() {
        let path = std::env::temp_dir().join(format!("xrnic-sim-cnp-{}.jsonl", std::process::id()));
        let p = path.to_str().unwrap();
        let a = args(&[
            "--bottleneck-mbps",
            "50",
            "--bandwidth-gbps",
            "10",
            "--qps",
            "2",
            "--duration-ms",
            "300",
            "--dcqcn",
            "--cc-param",
            "rp_rate_to_set_on_first_cnp=25",
            "--trace",
            p,
        ])
        .unwrap();
        assert_eq!(run(&a), 0);
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let cnps: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| xrnic::trace_out::event_of(v) == Some(xrnic::proto::trace::Event::Cnp))
            .collect();
        assert!(cnps.len() > 10, "{} CNP events", cnps.len());
        let mut last_bytes = std::collections::HashMap::new();
        for v in &cnps {
            assert_eq!(v["dev"], "A", "{v}");
            for f in [
                "rate_bps",
                "target_bps",
                "timer_events",
                "byte_events",
                "bytes_sent",
            ] {
                assert!(v[f].is_u64(), "{f} in {v}");
            }
            assert!(v["alpha"].is_f64(), "{v}");
            assert!(v["cut_due"].is_boolean() && v["handled"] == true, "{v}");
            let rate = v["rate_bps"].as_u64().unwrap();
            assert!(rate <= v["target_bps"].as_u64().unwrap(), "{v}");
            // Bytes sent only grow, per QP; the first CNP of a QP set 25 Mb/s and owes
            // the cut (the 4 µs monitor period).
            let b = v["bytes_sent"].as_u64().unwrap();
            let prev = last_bytes.insert(v["qpn"].as_u64().unwrap(), b);
            if prev.is_none() {
                assert_eq!(rate, 25_000_000, "{v}");
                assert_eq!(v["cut_due"], true, "{v}");
            }
            let prev = prev.unwrap_or(0);
            assert!(b >= prev, "{v}");
        }
        // A second identical run traces the same CNPs (virtual time, seeded).
        let r = crate::sim::dumbbell::run(&crate::sim::dumbbell::DumbbellConfig {
            qps: 2,
            duration_ns: 300_000_000,
            dcqcn: a.dcqcn_params().unwrap(),
            ..Default::default()
        });
        assert_eq!(r.rp_cnp_handled, cnps.len() as u64);
    }
}
