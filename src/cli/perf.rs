//! `xrnic perf write|read|send|atomic`: the perftest bandwidth tests (`ib_write_bw`,
//! `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw` of perftest 4.5-0.17) on an xrnic device, so
//! that they pair with themselves and with the stock tools.
//!
//! Contract:
//! - The TCP exchange is perftest's ([`crate::oob::perftest`]; docs/oob.md). Nothing about
//!   the test travels there: give both sides the same `-s`, `-n`/`-D`, `-q`, `-A`.
//! - Defaults as perftest 4.5 (perftest_parameters.h): size 65536 (atomic 8), 5000
//!   iterations, tx depth 128, rx depth 512 (send), TCP port 18515, duration 5 s with
//!   `-D` and a margin of a quarter of it, CQ moderation 100 (1 above 8 KiB messages,
//!   at most the tx depth), path MTU = the port's active MTU, atomic FETCH_AND_ADD of 1
//!   (CMP_AND_SWAP compares with 0 and swaps in 0).
//! - Roles as perftest: for write, read and atomic the client is the requester and the
//!   server passive (its driver answers; it prints the client's report, which arrives in
//!   the final exchange); for send the server posts receives, measures on its own and
//!   prints its own report (without peak, as perftest's send server).
//! - Addresses as perftest (`increase_loc_addr`/`increase_rem_addr`): message `n` of a QP
//!   uses offset `(n mod (cycle_buffer / INC)) * INC` with `INC` the size rounded up to the
//!   cache line, when `size <= cycle_buffer / 2`; offset 0 otherwise. Receives (send) use
//!   the same offsets, so message `n` lands at the offset it was sent from.
//! - Report math as perftest's `print_report_bw`: average over the first post to the last
//!   completion; peak = the best `(t_completed[j] - t_posted[i]) / (j - i + 1)` over the
//!   moderated completions (none above 20000 iterations, with `-D`, and on a send server,
//!   where perftest prints 0); MB/sec = 2^20 bytes/s, Gb/sec (`--report_gbits`) = 10^9
//!   bit/s; MsgRate in Mpps. With `-D`: only completions between warm-up and cool-down
//!   (`margin = D / 4` s each) count, over the sampling time.
//! - `--json` adds one last line: a JSON object with `test`, `size`, `iters`, `mtu`,
//!   `bw_avg_gbps`, `bw_peak_gbps`, `msg_rate_mpps`, `qps` (each QP's `qpn`, `bytes`,
//!   `bw_avg_gbps`, `retransmitted_packets`, and DCQCN's `rate_bps`, `target_bps`,
//!   `alpha`, `rp_cnp_handled`: null with DCQCN off) and `counters` (device — including
//!   `np_cnp_sent`, `np_ecn_marked_roce_packets`, `rp_cnp_handled`, `rp_cnp_ignored` —,
//!   driver, port, and `congestion`: DCQCN's parameters, counters and per-QP rates, null
//!   when off).
//! - Congestion control: `--dcqcn`, `--cc-profile`, `--cc-param`, `--tclass`
//!   ([`super::cc`]); the client's `--cc-log FILE` samples each QP's rate, target rate, α,
//!   delivered bytes and retransmissions every `--cc-log-interval` ms into a CSV
//!   ([`super::cclog`]).
//! - `--verify` (both sides must be xrnic: the stock tools send their own buffer contents
//!   and check nothing): a write/send client sends [`pattern`] bytes, and the server checks
//!   at the end that every offset messages landed at holds them; a read server fills its
//!   buffer with the pattern and the client checks what it read; an atomic server checks
//!   that each 8-byte counter equals 1 × the number of FETCH_AND_ADDs that targeted it (0
//!   for CMP_AND_SWAP). Not with `-D` (the number of messages is not known to the server).
//! - `--verify-stock` (the peer is the stock perftest, which checks nothing): where the
//!   data lands in our buffer (write and send server, read client), every byte of every
//!   offset messages used must be the peer's: perftest fills its buffer with glibc
//!   `rand()` bytes after `srand(time(NULL))` ([`super::perftest_buf`]), so the seed is
//!   searched near our clock and the whole expected content derived from it. An atomic
//!   server checks its counters with `--verify` against the stock client too (perftest
//!   adds 1, and compares 0 / swaps 0, like us).
//! - `--pcap FILE` writes the device's own capture ([`crate::driver::tap`]), on either role;
//!   SIGINT/SIGTERM flush it (and remove the stat snapshot) before exiting with status 130
//!   (`cli::close_on_signal`).
//! - The device: `--netdev IF` (the software backend) or `-d`/`--device NAME`, an RDMA
//!   device through libibverbs (the offload backend, docs/offload.md; `xrnic_IF` names the
//!   software device); with the offload backend `--json`'s `counters` are the kernel's
//!   (`{"hw": {...}}`, sysfs hw_counters).
//! - Exit status 0 on success, 1 on a failed run (one line on stderr), 2 for usage errors.

use std::net::IpAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::oob::perftest::{
    BwReport, BwTest, Client, Config, Negotiated, PerftestDest, Server, Session,
};
use crate::proto::qp::MAX_RD_ATOMIC;
use crate::proto::{Access, Mtu, RecvWr, SendFlags, SendWr, WcStatus, WrOpcode};
use crate::verbs::{self, ConnectOpts, Device, DeviceOptions, Mr, Qp, Remote, netdev};
use crate::wire::Psn;

mod report;
mod verify;

pub use report::{
    Measured, addr_step, bw_report, pattern, peak_secs_per_msg, report_line, slot_offset, slots,
};
use report::{address_lines, to_gbps};
use verify::{verify_atomics, verify_slots, verify_stock};

/// perftest's `RESULT_LINE`.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";
/// perftest's `RESULT_FMT` (MB/sec) and `RESULT_FMT_G` (Gb/sec).
pub const RESULT_FMT: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
pub const RESULT_FMT_G: &str =
    " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]";

/// perftest `DEF_CQ_MOD`, and the size above which moderation is off
/// (`MSG_SIZE_CQ_MOD_LIMIT`).
const DEF_CQ_MOD: u32 = 100;
const MSG_SIZE_CQ_MOD_LIMIT: u32 = 8192;
/// perftest turns the peak off above this many iterations (its O(n²/cq_mod) search).
const PEAK_MAX_ITERS: u64 = 20000;
/// Give up when no completion came for this long.
const SILENCE: Duration = Duration::from_secs(30);
/// `ATOMIC_ADD_VALUE` / `ATOMIC_SWAP_VALUE` (perftest_resources.h).
const ATOMIC_ADD: u64 = 1;
const ATOMIC_SWAP: u64 = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PerfTest {
    Write,
    Read,
    Send,
    Atomic,
}

impl PerfTest {
    fn bw_test(self) -> BwTest {
        match self {
            PerfTest::Write => BwTest::Write,
            PerfTest::Read => BwTest::Read,
            PerfTest::Send => BwTest::Send,
            PerfTest::Atomic => BwTest::Atomic,
        }
    }

    fn name(self) -> &'static str {
        match self {
            PerfTest::Write => "write",
            PerfTest::Read => "read",
            PerfTest::Send => "send",
            PerfTest::Atomic => "atomic",
        }
    }

    /// perftest's test title (`testsStr` in perftest_parameters.c).
    fn title(self) -> &'static str {
        match self {
            PerfTest::Write => "RDMA_Write",
            PerfTest::Read => "RDMA_Read",
            PerfTest::Send => "Send",
            PerfTest::Atomic => "Atomic",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AtomicType {
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
}

#[derive(Clone, Debug, clap::Args)]
pub struct PerfArgs {
    /// Which test: write (ib_write_bw), read (ib_read_bw), send (ib_send_bw), atomic
    /// (ib_atomic_bw).
    #[arg(value_enum)]
    pub test: PerfTest,
    /// The network interface the software device runs on.
    #[arg(long, value_name = "IF", required_unless_present = "device")]
    pub netdev: Option<String>,
    /// An RDMA device (rxe0, mlx5_0: the offload backend, through libibverbs), or
    /// `xrnic_<IF>` for the software device on IF (perftest's -d / --ib-dev).
    #[arg(
        short = 'd',
        long,
        visible_alias = "ib-dev",
        value_name = "DEV",
        conflicts_with = "netdev"
    )]
    pub device: Option<String>,
    /// Message size in bytes (default 65536; atomic: 8, the only size).
    #[arg(short, long, value_parser = clap::value_parser!(u32).range(1..=8_388_608))]
    pub size: Option<u32>,
    /// Number of messages per QP (default 5000).
    #[arg(short = 'n', long, conflicts_with = "duration", value_parser = clap::value_parser!(u64).range(5..=100_000_000))]
    pub iters: Option<u64>,
    /// Run for this many seconds instead (perftest -D): a quarter of it warms up, a quarter
    /// cools down, the middle is measured.
    #[arg(short = 'D', long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub duration: Option<u64>,
    /// Path MTU (default: the port's active MTU).
    #[arg(short, long, value_parser = parse_mtu)]
    pub mtu: Option<u32>,
    /// Local GID index (default: the first IPv4-mapped GID).
    #[arg(short = 'x', long = "gid-index", value_parser = clap::value_parser!(u8).range(0..=64))]
    pub gid_index: Option<u8>,
    /// Number of QPs.
    #[arg(short = 'q', long = "qp", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub num_qps: u32,
    /// Listen on / connect to this TCP port.
    #[arg(short, long, default_value_t = 18515)]
    pub port: u16,
    /// Atomic operation (atomic test only).
    #[arg(short = 'A', long = "atomic_type", value_enum)]
    pub atomic_type: Option<AtomicType>,
    /// Send queue depth: messages in flight per QP.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=15000))]
    pub tx_depth: u32,
    /// The QPs' local ACK timeout, 4.096 µs · 2^N (IBTA 9.7.6.1.3; perftest's -u):
    /// 14 (67 ms) by default, as perftest.
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    pub qp_timeout: u8,
    /// Receive queue depth (send server).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub rx_depth: u32,
    /// Report bandwidth in Gb/sec instead of MB/sec.
    #[arg(long = "report_gbits", alias = "report-gbits")]
    pub report_gbits: bool,
    /// Print one more line: the results as a JSON object.
    #[arg(long)]
    pub json: bool,
    /// Check the data (both sides xrnic; see the module documentation).
    #[arg(long)]
    pub verify: bool,
    /// The peer is the stock perftest: check that every byte that landed in our buffer is
    /// the peer's (its buffer holds glibc rand() after srand(time), the seed searched near
    /// our clock). For a write or send server and a read client; needs -n.
    #[arg(long, conflicts_with = "verify")]
    pub verify_stock: bool,
    /// Do not write stat snapshots to /run/xrnic.
    #[arg(long)]
    pub no_stat: bool,
    /// When the device closes, write its last stat snapshot (`running: false`: the
    /// counters at close, as `xrnic stat --json` shows a live one) to FILE; the snapshot
    /// in /run/xrnic is removed on close.
    #[arg(long, value_name = "FILE")]
    pub final_stat: Option<std::path::PathBuf>,
    /// Write a pcapng of every frame the device sends and receives, taken inside the
    /// driver (tcpdump does not see AF_XDP traffic), with a comment on each frame that is
    /// not the obvious next one (docs/observability.md).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
    /// Testing: drop this fraction of received frames in the driver.
    #[arg(long, hide = true, default_value_t = 0.0, value_parser = parse_fraction)]
    pub rx_drop: f64,
    #[command(flatten)]
    pub cc: super::cc::CcArgs,
    /// Client: write a CSV time series of each QP's DCQCN rate, target rate, α, delivered
    /// bytes and retransmissions to FILE (see `xrnic plot`).
    #[arg(long = "cc-log", value_name = "FILE")]
    pub cc_log: Option<std::path::PathBuf>,
    /// Sampling interval of --cc-log, in milliseconds.
    #[arg(long = "cc-log-interval", value_name = "MS", default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub cc_log_interval: u64,
    /// Connect to this server; without it, be the server.
    pub server: Option<String>,
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a fraction between 0 and 1")),
    }
}

fn parse_mtu(s: &str) -> Result<u32, String> {
    let v: u32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    Mtu::from_bytes(v)
        .map(|_| v)
        .ok_or_else(|| format!("{v} is not an IB MTU (256, 512, 1024, 2048 or 4096)"))
}

/// Why a run stopped.
#[derive(Debug)]
pub enum PerfError {
    /// A combination of options that cannot run (exit status 2).
    Usage(String),
    /// Anything else (exit status 1).
    Run(String),
}

impl From<String> for PerfError {
    fn from(s: String) -> Self {
        PerfError::Run(s)
    }
}

/// `xrnic perf`.
pub fn run(args: &PerfArgs) -> ExitCode {
    match perf(args) {
        Ok(_) => ExitCode::SUCCESS,
        Err(PerfError::Usage(m)) => {
            eprintln!("xrnic perf: {m}");
            ExitCode::from(2)
        }
        Err(PerfError::Run(m)) => {
            eprintln!("xrnic perf: {m}");
            ExitCode::FAILURE
        }
    }
}

/// The options after defaults and checks.
#[derive(Clone, Debug)]
struct Plan {
    test: PerfTest,
    size: u32,
    /// Iteration mode: messages per QP. `None` with `-D`.
    iters: Option<u64>,
    duration: Option<u64>,
    atomic: AtomicType,
    qps: usize,
    tx_depth: u32,
    rx_depth: u32,
    cq_mod: u32,
    no_peak: bool,
    gbits: bool,
}

fn plan(args: &PerfArgs) -> Result<Plan, PerfError> {
    let usage = |m: &str| Err(PerfError::Usage(m.to_string()));
    let size = match (args.test, args.size) {
        (PerfTest::Atomic, None | Some(8)) => 8,
        (PerfTest::Atomic, Some(s)) => {
            return usage(&format!(
                "atomic operations are 8 bytes: -s {s} is not possible (leave -s out or give 8)"
            ));
        }
        (_, s) => s.unwrap_or(65536),
    };
    if args.atomic_type.is_some() && args.test != PerfTest::Atomic {
        return usage("-A/--atomic_type applies to the atomic test only");
    }
    if args.verify && args.duration.is_some() {
        return usage(
            "--verify needs a known number of messages: use -n, not -D (the server cannot \
             tell how many arrived)",
        );
    }
    if args.verify_stock {
        let ok = match args.test {
            PerfTest::Write | PerfTest::Send => args.server.is_none(),
            PerfTest::Read => args.server.is_some(),
            PerfTest::Atomic => false,
        };
        if !ok {
            return usage(
                "--verify-stock checks data that lands in our buffer: a write or send server, \
                 or a read client (an atomic server checks its counters with --verify)",
            );
        }
        if args.duration.is_some() {
            return usage("--verify-stock needs a known number of messages: use -n, not -D");
        }
    }
    if args.cc_log.is_some() && args.server.is_none() {
        return usage(
            "--cc-log is sampled by the client (the requester whose rate DCQCN controls); \
             give it on the side that connects",
        );
    }
    let iters = match args.duration {
        Some(_) => None,
        None => Some(args.iters.unwrap_or(5000)),
    };
    // perftest_parameters.c: moderation off for large messages, at most the tx depth.
    let mut cq_mod = if size > MSG_SIZE_CQ_MOD_LIMIT {
        1
    } else {
        DEF_CQ_MOD
    };
    cq_mod = cq_mod.min(args.tx_depth);
    let server_of_send = args.test == PerfTest::Send && args.server.is_none();
    let no_peak = iters.is_none_or(|n| n > PEAK_MAX_ITERS) || server_of_send;
    Ok(Plan {
        test: args.test,
        size,
        iters,
        duration: args.duration,
        atomic: args.atomic_type.unwrap_or(AtomicType::FetchAndAdd),
        qps: args.num_qps as usize,
        tx_depth: args.tx_depth,
        rx_depth: args.rx_depth,
        cq_mod,
        no_peak,
        gbits: args.report_gbits,
    })
}

/// One QP of ours with its buffer.
struct Lane {
    qp: Qp,
    mr: Mr,
    dest: PerftestDest,
}

/// The whole run; prints like perftest and returns our report.
pub fn perf(args: &PerfArgs) -> Result<BwReport, PerfError> {
    let p = plan(args)?;
    let opts = device_options(args)?;
    super::close_on_signal("perf");
    let (dev, ifname) = super::open_device(args.netdev.as_deref(), args.device.as_deref(), &opts)?;
    let ifname = ifname.as_str();
    let (gidx, my_gid) = super::pick_gid(&dev, ifname, args.gid_index, "-x")?;
    let mtu = path_mtu(&dev, ifname, args.mtu)?;
    let mut session = open_session(args, &p, mtu)?;
    let neg = session.negotiated().clone();
    let is_client = args.server.is_some();
    let res = create_resources(&dev, &p, is_client, my_gid, u64::from(neg.cycle_buffer))?;
    let remote = connect_lanes(args, &mut session, &res, &neg, gidx)?;
    print_header(&p, &neg, gidx, &res.lanes, &remote);
    let geometry = Geometry {
        size: p.size,
        cycle: u64::from(neg.cycle_buffer),
        line: u64::from(neg.cache_line_size),
    };
    let (report, per_qp) = if is_client {
        run_as_client(args, &p, &res, &remote, session, geometry)?
    } else if p.test == PerfTest::Send {
        run_as_send_server(args, &p, &res, session, geometry)?
    } else {
        serve_passively(args, &p, &res.lanes, session, geometry)?
    };
    println!("{}", report_line(&report, p.gbits));
    println!("{RESULT_LINE}");
    if args.verify {
        println!("verify: every byte as expected");
    }
    if args.verify_stock {
        println!("verify: every byte as in the peer's buffer");
    }
    if args.json {
        let role = if is_client { "client" } else { "server" };
        println!(
            "{}",
            report_json(&p, &report, &res.lanes, &per_qp, role, &neg, &dev)
        );
    }
    Ok(report)
}

/// The device's options from the command line.
fn device_options(args: &PerfArgs) -> Result<DeviceOptions, PerfError> {
    Ok(DeviceOptions {
        seed: u64::from(std::process::id()),
        stat_dir: (!args.no_stat).then(|| verbs::STAT_DIR.into()),
        final_stat: args.final_stat.clone(),
        pcap: args.pcap.clone(),
        rx_drop: args.rx_drop,
        dcqcn: args.cc.dcqcn().map_err(PerfError::Usage)?,
        ..DeviceOptions::default()
    })
}

/// The path MTU asked for (`-m`), or the port's active MTU; never above the active one.
fn path_mtu(dev: &Device, ifname: &str, asked: Option<u32>) -> Result<u32, PerfError> {
    let active = dev.query_port().active_mtu.bytes();
    let mtu = asked.unwrap_or(active);
    if mtu > active {
        return Err(PerfError::Run(format!(
            "path MTU {mtu} is above the active MTU {active} of {ifname} (interface MTU {})",
            dev.query_port().netdev_mtu
        )));
    }
    Ok(mtu)
}

/// perftest's out-of-band connection: to the server, or from the one client accepted.
fn open_session(args: &PerfArgs, p: &Plan, mtu: u32) -> Result<Session, PerfError> {
    let mut config = Config::new(p.test.bw_test());
    config.mtu = mtu;
    if let Some(d) = p.duration {
        config.test_timeout = Duration::from_secs(d + 60);
    }
    let session = match &args.server {
        Some(host) => {
            let r = match host.parse::<IpAddr>() {
                Ok(ip) => Client::connect((ip, args.port), config),
                Err(_) => Client::connect((host.as_str(), args.port), config),
            };
            r.map_err(|e| format!("Couldn't connect to {host}:{}: {e}", args.port))?
        }
        None => {
            let server = Server::bind(("::", args.port))
                .or_else(|_| Server::bind(("0.0.0.0", args.port)))
                .map_err(|err| match err.kind() {
                    std::io::ErrorKind::AddrInUse => {
                        format!("Couldn't listen to port {}: TCP port in use", args.port)
                    }
                    _ => format!("Couldn't listen to port {}: {err}", args.port),
                })?;
            server
                .accept(config)
                .map_err(|e| format!("Couldn't set up the connection with the client: {e}"))?
        }
    };
    Ok(session)
}

/// The run's verbs objects. Fields drop in this order: the QPs and MRs, the CQ, the PD.
struct Resources {
    lanes: Vec<Lane>,
    cq: verbs::Cq,
    /// The lanes' PD, held until the end of the run.
    _pd: verbs::Pd,
    /// The RDMA READs and atomics we take in flight (perftest's out_reads).
    out_reads: u16,
}

/// Resources (perftest ctx_init): one buffer per QP covering every offset the peer
/// may target (`cycle`, the negotiated cycle buffer), one CQ for all QPs.
fn create_resources(
    dev: &Device,
    p: &Plan,
    is_client: bool,
    my_gid: verbs::Gid,
    cycle: u64,
) -> Result<Resources, PerfError> {
    let e = |what: &'static str| move |err: verbs::Error| format!("{what}: {err}");
    let pd = dev.alloc_pd().map_err(e("Couldn't allocate PD"))?;
    let depth = if is_client || p.test != PerfTest::Send {
        p.tx_depth
    } else {
        p.rx_depth
    };
    let cq = dev
        .create_cq(depth as usize * p.qps + 1)
        .map_err(e("Couldn't create CQ"))?;
    let buf_len = u64::from(p.size).max(cycle) as usize;
    let out_reads = match p.test {
        // perftest announces the device's max_qp_rd_atom, which is MAX_RD_ATOMIC (128, as
        // rxe), the most modify_qp takes; the min() keeps that true if the two ever drift
        // apart.
        PerfTest::Read | PerfTest::Atomic => dev
            .query_device()
            .max_qp_rd_atom
            .min(u32::from(MAX_RD_ATOMIC)) as u16,
        _ => 1,
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(
        u64::from(std::process::id())
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
    );
    let mut lanes = Vec::with_capacity(p.qps);
    for q in 0..p.qps {
        let mr = pd
            .reg_mr(buf_len, Access::ALL)
            .map_err(e("Couldn't register MR"))?;
        // The requester of write/send sends the pattern; a read server serves it.
        let fill = match p.test {
            PerfTest::Write | PerfTest::Send => is_client,
            PerfTest::Read => !is_client,
            PerfTest::Atomic => false,
        };
        if fill {
            mr.with_mut(|b| {
                for (i, x) in b.iter_mut().enumerate() {
                    *x = pattern(q, i);
                }
            })
            .map_err(e("Couldn't fill the buffer"))?;
        }
        let qp = pd
            .create_qp(&verbs::QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                max_send_wr: p.tx_depth,
                max_recv_wr: p.rx_depth,
                sq_sig_all: false,
            })
            .map_err(e("Couldn't create QP"))?;
        let dest = PerftestDest {
            lid: 0,
            out_reads,
            qpn: qp.qp_num(),
            psn: Psn::new(rng.random_range(0..=Psn::MAX)),
            rkey: mr.rkey(),
            vaddr: mr.addr(),
            gid: my_gid,
            srqn: 0,
        };
        lanes.push(Lane { qp, mr, dest });
    }
    Ok(Resources {
        lanes,
        cq,
        _pd: pd,
        out_reads,
    })
}

/// Exchange the QPs' addresses with the peer, connect each QP to its peer's (perftest
/// ctx_connect) and exchange again once connected: the peer's addresses.
fn connect_lanes(
    args: &PerfArgs,
    session: &mut Session,
    res: &Resources,
    neg: &Negotiated,
    gidx: u8,
) -> Result<Vec<PerftestDest>, PerfError> {
    let mine: Vec<PerftestDest> = res.lanes.iter().map(|l| l.dest).collect();
    let remote = session
        .exchange_keys(&mine)
        .map_err(|e| format!("Couldn't exchange keys: {e}"))?;
    for (l, r) in res.lanes.iter().zip(&remote) {
        if crate::proto::gid_is_ipv4(&l.dest.gid) != crate::proto::gid_is_ipv4(&r.gid) {
            // perftest ctx_check_gid_compatibility.
            return Err(PerfError::Run(format!(
                "the peer's GID {} and ours {} are not of the same IP version (choose the \
                 GID with -x on both sides)",
                netdev::gid_text(&r.gid),
                netdev::gid_text(&l.dest.gid)
            )));
        }
        l.qp.connect(
            &Remote {
                qpn: r.qpn,
                psn: r.psn.value(),
                gid: r.gid,
            },
            l.dest.psn.value(),
            gidx,
            &ConnectOpts {
                access: Access::ALL,
                path_mtu: Mtu::from_bytes(neg.mtu).unwrap_or_default(),
                // perftest ctx_modify_qp_to_rtr/rts: the peer's out_reads is our
                // max_rd_atomic, ours our max_dest_rd_atomic.
                // (A peer announcing more than MAX_RD_ATOMIC gets at most that in flight,
                // which it allows.)
                max_rd_atomic: r.out_reads.clamp(1, u16::from(MAX_RD_ATOMIC)) as u8,
                max_dest_rd_atomic: res.out_reads.clamp(1, u16::from(MAX_RD_ATOMIC)) as u8,
                hop_limit: 0xff,
                traffic_class: args.cc.tclass.unwrap_or(0),
                timeout: args.qp_timeout,
                ..ConnectOpts::default()
            },
        )
        .map_err(|err| format!("Couldn't connect to remote QP: {err}"))?;
    }
    let remote = session
        .finish_setup(&mine)
        .map_err(|e| format!("Couldn't exchange keys after connecting: {e}"))?;
    Ok(remote)
}

/// perftest's banner: the test, its parameters, both sides' addresses, the table's head.
fn print_header(p: &Plan, neg: &Negotiated, gidx: u8, lanes: &[Lane], remote: &[PerftestDest]) {
    println!("{RESULT_LINE}");
    let title = match p.test {
        PerfTest::Atomic => format!(
            "Atomic {} BW Test",
            match p.atomic {
                AtomicType::FetchAndAdd => "FETCH_AND_ADD",
                AtomicType::CmpAndSwap => "CMP_AND_SWAP",
            }
        ),
        t => format!("{} BW Test", t.title()),
    };
    println!("                    {title}");
    println!(
        " Number of qps   : {}\t\tTransport type : IB\n Connection type : RC\t\tUsing SRQ      : OFF",
        p.qps
    );
    println!(
        " TX depth        : {}\n Mtu             : {}[B]\n Link type       : Ethernet\n GID index       : {gidx}",
        p.tx_depth, neg.mtu
    );
    match p.duration {
        Some(d) => println!(" Duration        : {d}[sec]"),
        None => println!(" Number of iters : {}", p.iters.unwrap_or(0)),
    }
    println!("{RESULT_LINE}");
    for (l, r) in lanes.iter().zip(remote) {
        println!("{}", address_lines("local", &l.dest, p.test));
        println!("{}", address_lines("remote", r, p.test));
    }
    println!("{RESULT_LINE}");
    println!("{}", if p.gbits { RESULT_FMT_G } else { RESULT_FMT });
}

/// The client: run the requester (with its `--cc-log`), verify, and send the server our
/// report. Our report and the messages per QP.
fn run_as_client(
    args: &PerfArgs,
    p: &Plan,
    res: &Resources,
    remote: &[PerftestDest],
    mut session: Session,
    geometry: Geometry,
) -> Result<(BwReport, Vec<u64>), PerfError> {
    let lanes = &res.lanes;
    // send_bw syncs here (the server has posted its receives); the others do not.
    session
        .start_run()
        .map_err(|e| format!("sync before run: {e}"))?;
    let mut log = match &args.cc_log {
        Some(path) => Some(
            super::cclog::CcLog::create(
                path,
                Duration::from_millis(args.cc_log_interval),
                u64::from(p.size),
            )
            .map_err(|e| format!("--cc-log {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let run = run_requester(p, lanes, remote, &res.cq, geometry, log.as_mut())?;
    if let Some(l) = log.as_mut() {
        let qps: Vec<&Qp> = lanes.iter().map(|l| &l.qp).collect();
        l.finish(&qps, &run.per_qp_done)
            .map_err(|e| format!("--cc-log: {e}"))?;
    }
    session.end_run().map_err(|e| e.to_string())?;
    let report = bw_report(u64::from(p.size), &run.measured, p.gbits);
    if args.verify && p.test == PerfTest::Read {
        verify_slots(lanes, geometry, p.iters.unwrap_or(0), "read")?;
    }
    if args.verify_stock {
        verify_stock(lanes, geometry, p.iters.unwrap_or(0), "read")?;
    }
    session
        .finish(&report)
        .map_err(|e| format!("Couldn't end the test with the server: {e}"))?;
    Ok((report, run.per_qp))
}

/// The send_bw server: receive and count, then verify. Our report and the messages per
/// QP.
fn run_as_send_server(
    args: &PerfArgs,
    p: &Plan,
    res: &Resources,
    mut session: Session,
    geometry: Geometry,
) -> Result<(BwReport, Vec<u64>), PerfError> {
    let lanes = &res.lanes;
    let run = run_receiver(p, lanes, &res.cq, &mut session, geometry)?;
    session.end_run().map_err(|e| e.to_string())?;
    session
        .finish(&BwReport::default())
        .map_err(|e| format!("Couldn't end the test with the client: {e}"))?;
    if args.verify {
        verify_slots(lanes, geometry, p.iters.unwrap_or(0), "send")?;
    }
    if args.verify_stock {
        verify_stock(lanes, geometry, p.iters.unwrap_or(0), "send")?;
    }
    Ok((
        bw_report(u64::from(p.size), &run.measured, p.gbits),
        run.per_qp,
    ))
}

/// The server of write, read and atomic: passive, the driver answers; the client's
/// report comes at the end, then the verification. That report and its messages per QP.
fn serve_passively(
    args: &PerfArgs,
    p: &Plan,
    lanes: &[Lane],
    session: Session,
    geometry: Geometry,
) -> Result<(BwReport, Vec<u64>), PerfError> {
    let peer = session
        .finish(&BwReport::default())
        .map_err(|e| format!("Couldn't end the test with the client: {e}"))?
        .unwrap_or_default();
    if args.verify {
        match p.test {
            PerfTest::Write => verify_slots(lanes, geometry, p.iters.unwrap_or(0), "write")?,
            PerfTest::Atomic => verify_atomics(lanes, geometry, p)?,
            _ => {}
        }
    }
    if args.verify_stock {
        verify_stock(lanes, geometry, p.iters.unwrap_or(0), "write")?;
    }
    let per = peer.iters / p.qps as u64;
    Ok((peer, vec![per; p.qps]))
}

/// `--json`'s object: the run's figures, each QP's bytes, rate and DCQCN state, and the
/// device's counters.
fn report_json(
    p: &Plan,
    report: &BwReport,
    lanes: &[Lane],
    per_qp: &[u64],
    role: &str,
    neg: &Negotiated,
    dev: &Device,
) -> serde_json::Value {
    let secs = if report.bw_avg > 0.0 {
        to_gbps(report.bw_avg, p.gbits).recip() * 8.0 * report.size as f64 * report.iters as f64
            / 1e9
    } else {
        0.0
    };
    let qps: Vec<_> = lanes
        .iter()
        .zip(per_qp)
        .map(|(l, &msgs)| {
            let bytes = msgs * u64::from(p.size);
            let rate = l.qp.rate_status();
            json!({
                "qpn": l.qp.qp_num().value(),
                "bytes": bytes,
                "bw_avg_gbps": if secs > 0.0 { bytes as f64 * 8.0 / secs / 1e9 } else { 0.0 },
                "retransmitted_packets": l.qp.counters().ok().map(|c| c.retransmitted_packets),
                "rate_bps": rate.map(|r| r.rate_bps),
                "target_bps": rate.map(|r| r.target_bps),
                "alpha": rate.and_then(|r| r.alpha),
                "rp_cnp_handled": rate.map(|r| r.rp_cnp_handled),
            })
        })
        .collect();
    json!({
        "test": p.test.name(),
        "role": role,
        "size": p.size,
        "iters": report.iters,
        "mtu": neg.mtu,
        "duration": p.duration,
        "bw_avg_gbps": to_gbps(report.bw_avg, p.gbits),
        "bw_peak_gbps": to_gbps(report.bw_peak, p.gbits),
        "msg_rate_mpps": report.msg_rate_avg,
        "qps": qps,
        "counters": counters_json(dev),
    })
}

/// The `counters` of `--json`: the engine's (software backend), or the kernel's counters
/// of the RDMA device (offload backend: `hw`, from sysfs; null when it has none).
fn counters_json(dev: &Device) -> serde_json::Value {
    match dev.backend() {
        verbs::Backend::Software => json!({
            "device": dev.counters().ok(),
            "driver": dev.driver_stats().ok(),
            "port": dev.io_stats().ok(),
            "congestion": dev.congestion(),
        }),
        verbs::Backend::Offload => json!({
            "hw": verbs::hw_counters(dev.name())
                .ok()
                .map(|v| v.into_iter().map(|(k, n)| (k, json!(n))).collect::<serde_json::Map<_, _>>()),
        }),
    }
}

#[derive(Clone, Copy, Debug)]
struct Geometry {
    size: u32,
    cycle: u64,
    line: u64,
}

impl Geometry {
    fn offset(&self, n: u64) -> u64 {
        slot_offset(n, self.size.into(), self.cycle, self.line)
    }
    fn slots(&self) -> u64 {
        slots(self.size.into(), self.cycle, self.line)
    }
}

struct RunResult {
    measured: Measured,
    /// Messages completed per QP (in the sampling window with -D).
    per_qp: Vec<u64>,
    /// Messages completed per QP over the whole run.
    per_qp_done: Vec<u64>,
}

/// -D phases (perftest `catch_alarm`): warm-up, sampling, cool-down.
struct Phases {
    sample_start: Instant,
    sample_end: Instant,
    end: Instant,
}

impl Phases {
    fn new(start: Instant, duration: u64) -> Phases {
        let margin = Duration::from_secs(duration / 4);
        let sample = Duration::from_secs(duration) - 2 * margin;
        Phases {
            sample_start: start + margin,
            sample_end: start + margin + sample,
            end: start + 2 * margin + sample,
        }
    }
}

/// The client's loop (perftest `run_iter_bw`): per QP, post while fewer than `tx_depth`
/// are outstanding, every `cq_mod`-th (and the last) signaled; then poll.
fn run_requester(
    p: &Plan,
    lanes: &[Lane],
    remote: &[PerftestDest],
    cq: &verbs::Cq,
    g: Geometry,
    mut log: Option<&mut super::cclog::CcLog>,
) -> Result<RunResult, String> {
    let total = p.iters.map(|n| n * p.qps as u64);
    let keep_times = !p.no_peak;
    let cap = if keep_times {
        total.unwrap_or(0) as usize
    } else {
        0
    };
    let mut posted_t: Vec<f64> = Vec::with_capacity(cap);
    let mut completed_t: Vec<f64> = Vec::with_capacity(cap);
    let mut scnt = vec![0u64; p.qps];
    let mut ccnt = vec![0u64; p.qps];
    let mut sampled = vec![0u64; p.qps];
    let (mut totscnt, mut totccnt) = (0u64, 0u64);
    let cq_mod = u64::from(p.cq_mod);
    let tx_depth = u64::from(p.tx_depth);
    let start = Instant::now();
    let phases = p.duration.map(|d| Phases::new(start, d));
    let mut first_post: Option<Instant> = None;
    let mut last_completion = start;
    let mut wcs = Vec::with_capacity(64);
    let mut quiet_since = Instant::now();
    let qps: Vec<&Qp> = lanes.iter().map(|l| &l.qp).collect();
    loop {
        let now = Instant::now();
        if let Some(l) = log.as_deref_mut() {
            l.maybe_sample(now, &qps, &ccnt)
                .map_err(|e| format!("--cc-log: {e}"))?;
        }
        let ended = phases.as_ref().is_some_and(|ph| now >= ph.end);
        match total {
            Some(t) if totccnt >= t => break,
            None if ended => break,
            _ => {}
        }
        if !ended {
            for (q, lane) in lanes.iter().enumerate() {
                while total.is_none_or(|_| scnt[q] < p.iters.unwrap_or(0))
                    && scnt[q] - ccnt[q] < tx_depth
                {
                    let n = scnt[q];
                    let last = p.iters.is_some_and(|it| n + 1 == it);
                    let signaled = (n + 1) % cq_mod == 0 || last;
                    let wr = work_request(p, lane, &remote[q], g, n, q, signaled);
                    let t = Instant::now();
                    if keep_times {
                        posted_t.push(t.duration_since(start).as_secs_f64());
                    }
                    first_post.get_or_insert(t);
                    lane.qp
                        .post_send(wr)
                        .map_err(|e| format!("Couldn't post send: qp {q} scnt={n}: {e}"))?;
                    scnt[q] += 1;
                    totscnt += 1;
                }
            }
        }
        if totccnt >= totscnt {
            continue;
        }
        wcs.clear();
        let wait = match &phases {
            Some(ph) => ph
                .end
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50)),
            None => Duration::from_millis(50),
        };
        if cq.wait_into(64, wait, &mut wcs) == 0 {
            if quiet_since.elapsed() > SILENCE {
                return Err(format!(
                    "no completion for {SILENCE:?} ({totccnt} of {totscnt} posted completed)"
                ));
            }
            continue;
        }
        quiet_since = Instant::now();
        let t = Instant::now();
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "Completion with error at client: status {} ({}), after {totccnt} \
                     completions",
                    wc.status.as_str(),
                    wc.status as u32
                ));
            }
            let q = (wc.wr_id >> 40) as usize;
            let done = wc.wr_id & ((1 << 40) - 1);
            let Some(c) = ccnt.get_mut(q) else {
                return Err(format!("completion for unknown wr_id {:#x}", wc.wr_id));
            };
            let credit = done.saturating_sub(*c);
            *c = done.max(*c);
            totccnt += credit;
            if keep_times {
                completed_t.resize(totccnt as usize, t.duration_since(start).as_secs_f64());
            }
            last_completion = t;
            if let Some(ph) = &phases {
                if t >= ph.sample_start && t < ph.sample_end {
                    sampled[q] += credit;
                }
            }
        }
    }
    let measured = match (&phases, p.iters) {
        (Some(ph), _) => Measured {
            iters: sampled.iter().sum(),
            secs: (ph.sample_end - ph.sample_start).as_secs_f64(),
            peak_secs_per_msg: 0.0,
        },
        (None, _) => Measured {
            iters: totccnt,
            secs: first_post.map_or(0.0, |f| (last_completion - f).as_secs_f64()),
            peak_secs_per_msg: if keep_times {
                peak_secs_per_msg(&posted_t, &completed_t, p.cq_mod as usize)
            } else {
                0.0
            },
        },
    };
    let per_qp = if phases.is_some() {
        sampled
    } else {
        ccnt.clone()
    };
    Ok(RunResult {
        measured,
        per_qp,
        per_qp_done: ccnt,
    })
}

/// Message `n` of QP `q`. `wr_id` = QP index << 40 | messages done when it completes.
fn work_request(
    p: &Plan,
    lane: &Lane,
    rem: &PerftestDest,
    g: Geometry,
    n: u64,
    q: usize,
    signaled: bool,
) -> SendWr {
    let off = g.offset(n);
    let opcode = match (p.test, p.atomic) {
        (PerfTest::Write, _) => WrOpcode::RdmaWrite,
        (PerfTest::Read, _) => WrOpcode::RdmaRead,
        (PerfTest::Send, _) => WrOpcode::Send,
        (PerfTest::Atomic, AtomicType::FetchAndAdd) => WrOpcode::AtomicFetchAndAdd,
        (PerfTest::Atomic, AtomicType::CmpAndSwap) => WrOpcode::AtomicCmpAndSwp,
    };
    let mut wr = SendWr::new(((q as u64) << 40) | (n + 1), opcode);
    wr.send_flags = if signaled {
        SendFlags::SIGNALED
    } else {
        SendFlags(0)
    };
    wr.sg_list = vec![lane.mr.sge(off as usize, p.size)];
    match p.test {
        PerfTest::Write | PerfTest::Read => {
            wr.rdma.remote_addr = rem.vaddr + off;
            wr.rdma.rkey = rem.rkey;
        }
        PerfTest::Atomic => {
            wr.atomic.remote_addr = rem.vaddr + off;
            wr.atomic.rkey = rem.rkey;
            wr.atomic.compare_add = match p.atomic {
                AtomicType::FetchAndAdd => ATOMIC_ADD,
                AtomicType::CmpAndSwap => 0,
            };
            wr.atomic.swap = ATOMIC_SWAP;
        }
        PerfTest::Send => {}
    }
    wr
}

/// The send server (perftest `run_iter_bw_server`): receives posted before the sync,
/// reposted as they complete; measured from the first receive to the last.
fn run_receiver(
    p: &Plan,
    lanes: &[Lane],
    cq: &verbs::Cq,
    session: &mut Session,
    g: Geometry,
) -> Result<RunResult, String> {
    let mut rposted = vec![0u64; p.qps];
    let post = |q: usize, n: u64| -> Result<(), String> {
        lanes[q]
            .qp
            .post_recv(RecvWr {
                wr_id: q as u64,
                sg_list: vec![lanes[q].mr.sge(g.offset(n) as usize, p.size)],
            })
            .map_err(|e| format!("Couldn't post receive: qp {q}: {e}"))
    };
    let want = p.iters;
    for (q, posted) in rposted.iter_mut().enumerate() {
        let n = want.map_or(u64::from(p.rx_depth), |w| w.min(p.rx_depth.into()));
        for i in 0..n {
            post(q, i)?;
        }
        *posted = n;
    }
    session
        .start_run()
        .map_err(|e| format!("sync before run: {e}"))?;
    let total = want.map(|w| w * p.qps as u64);
    let mut rcnt = vec![0u64; p.qps];
    let mut sampled = vec![0u64; p.qps];
    let mut tot = 0u64;
    let mut first: Option<Instant> = None;
    let mut phases: Option<Phases> = None;
    let mut last = Instant::now();
    let mut wcs = Vec::with_capacity(64);
    let mut quiet_since = Instant::now();
    loop {
        if total.is_some_and(|t| tot >= t) || phases.as_ref().is_some_and(|ph| last >= ph.end) {
            break;
        }
        wcs.clear();
        if cq.wait_into(64, Duration::from_millis(50), &mut wcs) == 0 {
            if let Some(ph) = &phases {
                if Instant::now() >= ph.end {
                    break;
                }
            }
            if quiet_since.elapsed() > SILENCE {
                return Err(format!(
                    "no message for {SILENCE:?} ({tot} received; are -n/-q the same on both \
                     sides?)"
                ));
            }
            continue;
        }
        quiet_since = Instant::now();
        let t = Instant::now();
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "Completion with error at server: status {} ({}), after {tot} receives",
                    wc.status.as_str(),
                    wc.status as u32
                ));
            }
            let q = wc.wr_id as usize;
            if q >= p.qps {
                return Err(format!("completion for unknown wr_id {}", wc.wr_id));
            }
            if wc.byte_len != p.size {
                return Err(format!(
                    "qp {q} message {} has {} bytes, expected {} (is -s the same on both \
                     sides?)",
                    rcnt[q], wc.byte_len, p.size
                ));
            }
            if first.is_none() {
                first = Some(t);
                if let Some(d) = p.duration {
                    phases = Some(Phases::new(t, d));
                }
            }
            rcnt[q] += 1;
            tot += 1;
            if let Some(ph) = &phases {
                if t >= ph.sample_start && t < ph.sample_end {
                    sampled[q] += 1;
                }
            }
            last = t;
            if want.is_none_or(|w| rposted[q] < w) {
                post(q, rposted[q])?;
                rposted[q] += 1;
            }
        }
    }
    let measured = match &phases {
        Some(ph) => Measured {
            iters: sampled.iter().sum(),
            secs: (ph.sample_end - ph.sample_start).as_secs_f64(),
            peak_secs_per_msg: 0.0,
        },
        None => Measured {
            iters: tot,
            secs: first.map_or(0.0, |f| (last - f).as_secs_f64()),
            peak_secs_per_msg: 0.0,
        },
    };
    let per_qp = if phases.is_some() {
        sampled
    } else {
        rcnt.clone()
    };
    Ok(RunResult {
        measured,
        per_qp,
        per_qp_done: rcnt,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_cycle_like_perftest() {
        // 8-byte atomics: 64-byte steps over a 4 KiB cycle buffer, 64 slots.
        assert_eq!(addr_step(8, 64), 64);
        assert_eq!(slots(8, 4096, 64), 64);
        assert_eq!(slot_offset(0, 8, 4096, 64), 0);
        assert_eq!(slot_offset(63, 8, 4096, 64), 63 * 64);
        assert_eq!(slot_offset(64, 8, 4096, 64), 0);
        // 100 bytes round up to 128; 2048 is half the buffer: 2 slots.
        assert_eq!(addr_step(100, 64), 128);
        assert_eq!(slot_offset(33, 100, 4096, 64), 128);
        assert_eq!(slots(2048, 4096, 64), 2);
        assert_eq!(slot_offset(3, 2048, 4096, 64), 2048);
        // Above half the cycle buffer: always offset 0.
        assert_eq!(slots(2049, 4096, 64), 1);
        assert_eq!(slot_offset(7, 65536, 4096, 64), 0);
    }

    #[test]
    fn report_math_is_perftests() {
        // 5000 messages of 64 KiB in 0.3 s.
        let m = Measured {
            iters: 5000,
            secs: 0.3,
            peak_secs_per_msg: 0.25 / 5000.0,
        };
        let r = bw_report(65536, &m, false);
        let mb = 65536.0 * 5000.0 / 0.3 / 1_048_576.0;
        assert!((r.bw_avg - mb).abs() < 1e-9);
        assert!((r.msg_rate_avg - 5000.0 / 0.3 / 1e6).abs() < 1e-12);
        assert!((r.bw_peak - 65536.0 * 5000.0 / 0.25 / 1_048_576.0).abs() < 1e-6);
        let g = bw_report(65536, &m, true);
        assert!((g.bw_avg - 65536.0 * 8.0 * 5000.0 / 0.3 / 1e9).abs() < 1e-9);
        assert!((to_gbps(r.bw_avg, false) - g.bw_avg).abs() < 1e-9);
        assert_eq!(bw_report(8, &Measured::default(), false).bw_avg, 0.0);
    }

    #[test]
    fn peak_is_the_best_moderated_window() {
        // 4 messages posted at 0,1,2,3; completions (cq_mod 2) at 5 (for 0..2) and 6
        // (for 2..4). Windows: i=0: j=1 → 5/2, j=3 → 6/4; i=1: j=1 → 4/1, j=3 → 5/3;
        // i=2: j=3 → 4/2; i=3: j=3 → 3. Start: completed[0] - posted[0] = 5.
        let posted = [0.0, 1.0, 2.0, 3.0];
        let completed = [5.0, 5.0, 6.0, 6.0];
        assert!((peak_secs_per_msg(&posted, &completed, 2) - 1.5).abs() < 1e-12);
        // A ragged tail (5 messages, cq_mod 2): the last completion counts too.
        let posted = [0.0, 0.0, 0.0, 0.0, 0.0];
        let completed = [4.0, 4.0, 8.0, 8.0, 5.0];
        assert!((peak_secs_per_msg(&posted, &completed, 2) - 1.0).abs() < 1e-12);
        assert_eq!(peak_secs_per_msg(&[], &[], 1), 0.0);
    }

    #[test]
    fn result_lines_match_perftests_formats() {
        let r = BwReport {
            size: 65536,
            iters: 5000,
            bw_peak: 1090.52,
            bw_avg: 1090.02,
            msg_rate_avg: 0.01744,
            ..BwReport::default()
        };
        assert_eq!(
            report_line(&r, false),
            " 65536      5000             1090.52            1090.02\t\t   0.017440"
        );
        let small = BwReport {
            size: 8,
            iters: 100,
            bw_peak: 0.0,
            bw_avg: 0.05,
            msg_rate_avg: 0.5,
            ..BwReport::default()
        };
        assert_eq!(
            report_line(&small, true),
            " 8          100           0.000000            0.050000            0.500000"
        );
        assert_eq!(RESULT_LINE.len(), 87);
    }

    #[test]
    fn pattern_is_never_zero_and_depends_on_qp_and_offset() {
        assert!((0..100_000).all(|i| pattern(0, i) != 0 && pattern(3, i) != 0));
        assert_ne!(pattern(0, 5), pattern(1, 5));
        assert_ne!(pattern(0, 5), pattern(0, 6));
        // Two messages of 64 bytes at different offsets differ.
        let a: Vec<u8> = (0..64).map(|i| pattern(0, i)).collect();
        let b: Vec<u8> = (64..128).map(|i| pattern(0, i)).collect();
        assert_ne!(a, b);
    }

    fn args(v: &[&str]) -> PerfArgs {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct W {
            #[command(flatten)]
            a: PerfArgs,
        }
        let mut all = vec!["perf"];
        all.extend_from_slice(v);
        W::try_parse_from(all).expect("parse").a
    }

    #[test]
    fn the_device_is_a_netdev_or_an_rdma_device_never_both() {
        use clap::Parser;
        #[derive(clap::Parser, Debug)]
        struct W {
            #[command(flatten)]
            a: PerfArgs,
        }
        let a = args(&["write", "-d", "rxe0"]);
        assert_eq!((a.device.as_deref(), a.netdev), (Some("rxe0"), None));
        let a = args(&["read", "--ib-dev", "mlx5_0", "10.0.0.1"]);
        assert_eq!(a.device.as_deref(), Some("mlx5_0"));
        assert!(W::try_parse_from(["perf", "write", "-d", "rxe0", "--netdev", "eth0"]).is_err());
        assert!(W::try_parse_from(["perf", "write"]).is_err());
    }

    /// perftest's -u: the QPs' local ACK timeout exponent, 14 unless given, 1..=31.
    #[test]
    fn qp_timeout_is_perftests_u() {
        use clap::Parser;
        #[derive(clap::Parser, Debug)]
        struct W {
            #[command(flatten)]
            a: PerfArgs,
        }
        assert_eq!(args(&["write", "--netdev", "x"]).qp_timeout, 14);
        assert_eq!(args(&["write", "--netdev", "x", "-u", "18"]).qp_timeout, 18);
        assert_eq!(
            args(&["write", "--netdev", "x", "--qp-timeout", "31"]).qp_timeout,
            31
        );
        for bad in ["0", "32", "x"] {
            assert!(
                W::try_parse_from(["perf", "write", "--netdev", "x", "-u", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn plan_defaults_and_usage_errors() {
        let p = plan(&args(&["write", "--netdev", "x"])).unwrap();
        assert_eq!(
            (p.size, p.iters, p.tx_depth, p.cq_mod, p.no_peak),
            (65536, Some(5000), 128, 1, false)
        );
        let p = plan(&args(&["atomic", "--netdev", "x", "1.2.3.4"])).unwrap();
        assert_eq!(
            (p.size, p.cq_mod, p.atomic),
            (8, 100, AtomicType::FetchAndAdd)
        );
        let p = plan(&args(&["write", "--netdev", "x", "-s", "8", "-t", "16"])).unwrap();
        assert_eq!(p.cq_mod, 16);
        let p = plan(&args(&["send", "--netdev", "x", "-n", "100"])).unwrap();
        assert!(p.no_peak, "a send server reports no peak");
        for ok in [
            &["write", "--netdev", "x", "--verify-stock"][..],
            &["send", "--netdev", "x", "--verify-stock"],
            &["read", "--netdev", "x", "--verify-stock", "1.2.3.4"],
        ] {
            assert!(plan(&args(ok)).is_ok(), "{ok:?}");
        }
        let p = plan(&args(&["write", "--netdev", "x", "-D", "4"])).unwrap();
        assert_eq!((p.iters, p.no_peak), (None, true));
        for bad in [
            &["atomic", "--netdev", "x", "-s", "16"][..],
            &["write", "--netdev", "x", "-A", "CMP_AND_SWAP"],
            &["write", "--netdev", "x", "-D", "3", "--verify"],
            // --verify-stock: only where the data lands in our buffer, and with -n.
            &["write", "--netdev", "x", "--verify-stock", "1.2.3.4"],
            &["read", "--netdev", "x", "--verify-stock"],
            &["send", "--netdev", "x", "--verify-stock", "1.2.3.4"],
            &["atomic", "--netdev", "x", "--verify-stock"],
            &["write", "--netdev", "x", "-D", "3", "--verify-stock"],
        ] {
            assert!(
                matches!(plan(&args(bad)), Err(PerfError::Usage(_))),
                "{bad:?}"
            );
        }
    }
}
