//! `xrnic rc-pingpong`: `ibv_rc_pingpong` on an xrnic device (rdma-core
//! libibverbs/examples/rc_pingpong.c), so that it pairs with itself and with the stock
//! tool on rxe or hardware.
//!
//! Contract:
//! - Same options and defaults (`-p 18515 -s 4096 -n 1000 -m 1024 -r 500 -g`), the same
//!   TCP exchange ([`crate::oob::pingpong`]), the same QP setup (`pp_connect_ctx`: RTR with
//!   `min_rnr_timer 12`, `max_dest_rd_atomic 1`, hop limit 1; RTS with `timeout 14`,
//!   `retry_cnt 7`, `rnr_retry 7`), a random 24-bit PSN, the same ping-pong (the client
//!   sends first; each side sends again once its previous send and a receive completed;
//!   receives are reposted when at most one is left, `parse_single_wc`), and the same
//!   output lines ("local address: ...", "remote address: ...", "N bytes in S seconds =
//!   R Mbit/sec", "N iters in S seconds = U usec/iter").
//! - Completions: like the stock tool, polled by default (the empty polls receive and
//!   transmit on this thread, see [`crate::driver::poll`]) and waited for with `-e`
//!   (asleep on the device's socket, receiving on this thread: `Cq::wait_receiving`).
//!   Unlike the stock tool, the default polling backs off on a machine it shares: it
//!   yields the CPU after each empty poll, and after [`YIELD`] without a completion
//!   sleeps until the next one; `--busy-poll` never sleeps.
//! - Differences: `--netdev IF` (or `-d xrnic_IF`) names the software device, `-d NAME`
//!   (`--device NAME`) an RDMA device driven through libibverbs (the offload backend,
//!   docs/offload.md); `-l` is accepted and changes nothing; `-g` defaults to the first
//!   IPv4 GID (RoCE needs one, the stock default of none does not work on RoCE);
//!   after the run the device stays up until its QP has been quiet for 150 ms, so that a
//!   peer whose last ACK was lost still gets its retransmission answered (the stock tool
//!   exits at once, and its peer's last send can then fail on a lossy link). `--pcap
//!   FILE` writes the device's own capture ([`crate::driver::tap`]). SIGINT/SIGTERM flush it
//!   and remove the device's stat snapshot before exiting with status 130
//!   (`cli::close_on_signal`).
//! - `--verify` checks every received message: its length, and every byte equal to 0x7b,
//!   which is what ibv_rc_pingpong sends (`memset(ctx->buf, 0x7b, size)`, rc_pingpong.c);
//!   the one exception it makes is a stock client run with `-c`, which zeroes the first
//!   byte of each 4 KiB page before sending, so 0x00 is accepted there. The stock tool
//!   does not verify what it receives (its `-c` check is of its own buffer). We send 0x7b
//!   too, from a buffer separate from the receive buffer, and clear the receive buffer
//!   after each check so a message that never arrived cannot pass as the old one.
//! - Exit status 0 on success, 1 on any failure (with the reason on stderr), 2 for usage
//!   errors.

use std::net::IpAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::oob::pingpong::{PingpongDest, Server, client_exchange};
use crate::proto::{Access, AttrMask, Mtu, QpAttr, RecvWr, SendWr, WcStatus, WrOpcode};
use crate::verbs::{self, ConnectOpts, DeviceOptions, Remote, netdev};
use crate::wire::Psn;

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// What ibv_rc_pingpong fills its buffer with.
pub const FILL: u8 = 0x7b;
/// A stock client with `-c` writes 0 at each multiple of this (its page size).
const PAGE: usize = 4096;
/// How long the QP must be silent before the device closes (twice rc_pingpong's local
/// ACK timeout, 4.096 µs × 2^14 ≈ 67 ms, plus margin).
const QUIET: Duration = Duration::from_millis(150);
/// The longest the device stays up after the run.
const LINGER_MAX: Duration = Duration::from_secs(3);
/// Give up when no completion arrived for this long (the stock tool spins forever).
const SILENCE: Duration = Duration::from_secs(30);
/// Polling without completions: yield the CPU after each empty poll up to this long, then
/// sleep until a completion (a peer that slow, e.g. a guest under emulation, gains
/// nothing from our polling). Measured on the 2-core VM under load: spinning then
/// sleeping after a short while was far slower (140–210 µs) than either polling (14 µs)
/// or sleeping (27 µs) alone, so the switch to sleeping comes late. Yielding at once
/// rather than spinning first (50 µs): 11–29 µs against 32–187 µs in 8 interleaved pairs
/// on a loaded machine (docs/performance.md, "Round trip"): when the scheduler puts both
/// ends of a ping-pong on one CPU, each spin delays the peer's answer by the whole
/// spin; alone on its CPU, `sched_yield` returns at once.
pub const YIELD: Duration = Duration::from_millis(10);
/// Empty polls between two looks at the clock in the polling loop.
const CLOCK_EVERY: u32 = 64;

#[derive(Clone, Debug, clap::Args)]
pub struct PingpongArgs {
    /// The network interface the software device runs on.
    #[arg(long, value_name = "IF", required_unless_present = "ib_dev")]
    pub netdev: Option<String>,
    /// The device, as ibv_rc_pingpong names it: an RDMA device (rxe0, mlx5_0: the offload
    /// backend), or `xrnic_<IF>` for the software device on IF.
    #[arg(
        short = 'd',
        long = "ib-dev",
        visible_alias = "device",
        value_name = "DEV",
        conflicts_with = "netdev"
    )]
    pub ib_dev: Option<String>,
    /// Port of the device (there is one: 1).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=1))]
    pub ib_port: u8,
    /// Sleep on CQ events instead of polling the CQ.
    #[arg(short = 'e', long)]
    pub events: bool,
    /// Service level (accepted for compatibility; RoCE v2 has no SL on the wire).
    #[arg(short = 'l', long, default_value_t = 0)]
    pub sl: u8,
    /// Listen on / connect to this TCP port.
    #[arg(short, long, default_value_t = 18515)]
    pub port: u16,
    /// Size of each message.
    #[arg(short, long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=(1 << 30)))]
    pub size: u32,
    /// Path MTU.
    #[arg(short, long, default_value_t = 1024, value_parser = parse_mtu)]
    pub mtu: u32,
    /// Number of receives to post at a time.
    #[arg(short, long = "rx-depth", default_value_t = 500, value_parser = clap::value_parser!(u32).range(2..=16384))]
    pub rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: u32,
    /// Local GID index (default: the first IPv4-mapped GID).
    #[arg(short, long = "gid-idx")]
    pub gid_idx: Option<u8>,
    /// Check every received message (see the module documentation).
    #[arg(long)]
    pub verify: bool,
    /// Poll the CQ without ever sleeping (the default polls, and sleeps after a while
    /// without completions).
    #[arg(long, conflicts_with = "events")]
    pub busy_poll: bool,
    /// Testing: drop this fraction of received frames in the driver.
    #[arg(long, hide = true, default_value_t = 0.0)]
    pub rx_drop: f64,
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
    #[command(flatten)]
    pub cc: super::cc::CcArgs,
    /// Connect to this server; without it, be the server.
    pub server: Option<String>,
}

fn parse_mtu(s: &str) -> Result<u32, String> {
    let v: u32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    Mtu::from_bytes(v)
        .map(|_| v)
        .ok_or_else(|| format!("{v} is not an IB MTU (256, 512, 1024, 2048 or 4096)"))
}

/// What a run measured.
#[derive(Clone, Copy, Debug)]
pub struct Outcome {
    pub bytes: u64,
    pub usec: f64,
    pub verified: u64,
}

/// `xrnic rc-pingpong`.
pub fn run(args: &PingpongArgs) -> ExitCode {
    match pingpong(args) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xrnic rc-pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

fn gid_text(g: &[u8; 16]) -> String {
    netdev::gid_text(g)
}

/// The whole run; prints like rc_pingpong and returns what it measured.
pub fn pingpong(args: &PingpongArgs) -> Result<Outcome, String> {
    let opts = device_options(args)?;
    super::close_on_signal("rc-pingpong");
    let (dev, ifname) = super::open_device(args.netdev.as_deref(), args.ib_dev.as_deref(), &opts)?;
    let (gidx, my_gid) = super::pick_gid(&dev, &ifname, args.gid_idx, "-g")?;
    let ep = Endpoint::create(&dev, args)?;
    let routs = ep.post_recv(args.rx_depth);
    if routs < args.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    let mine = local_dest(&ep.qp, my_gid);
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        0,
        mine.qpn.value(),
        mine.psn.value(),
        gid_text(&my_gid)
    );
    exchange_and_connect(args, &ep.qp, &mine, gidx)?;
    let (usec, verified) = ep.ping_pong(args, routs)?;
    linger(&ep.qp);
    let bytes = u64::from(args.size) * u64::from(args.iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        args.iters,
        usec / 1e6,
        usec / f64::from(args.iters)
    );
    if args.verify {
        println!("verify: {verified} messages received, every byte as sent");
    }
    if args.rx_drop > 0.0 {
        // What the injected loss did (the device's snapshot goes when it closes).
        if let (Ok(d), Ok(c)) = (dev.driver_stats(), dev.counters()) {
            println!(
                "rx-drop: {} received frames dropped, {} packets retransmitted",
                d.fault_dropped, c.qp.retransmitted_packets
            );
        }
    }
    Ok(Outcome {
        bytes,
        usec,
        verified,
    })
}

/// The device's options from the command line.
fn device_options(args: &PingpongArgs) -> Result<DeviceOptions, String> {
    Ok(DeviceOptions {
        rx_drop: args.rx_drop,
        seed: u64::from(std::process::id()),
        stat_dir: (!args.no_stat).then(|| verbs::STAT_DIR.into()),
        final_stat: args.final_stat.clone(),
        pcap: args.pcap.clone(),
        dcqcn: args.cc.dcqcn()?,
        ..DeviceOptions::default()
    })
}

/// Our QP's address for the peer, with a random first PSN (rc_pingpong's lrand48).
fn local_dest(qp: &verbs::Qp, my_gid: verbs::Gid) -> PingpongDest {
    let seed = u64::from(std::process::id())
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
    let my_psn = rand_chacha::ChaCha8Rng::seed_from_u64(seed).random_range(0..=Psn::MAX);
    PingpongDest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: Psn::new(my_psn),
        gid: my_gid,
    }
}

/// Exchange addresses with the peer (as its client, or as the server of one client) and
/// connect our QP to its.
fn exchange_and_connect(
    args: &PingpongArgs,
    qp: &verbs::Qp,
    mine: &PingpongDest,
    gidx: u8,
) -> Result<(), String> {
    match &args.server {
        Some(host) => {
            let host_ip: Option<IpAddr> = host.parse().ok();
            let rem = match host_ip {
                Some(ip) => client_exchange((ip, args.port), mine, crate::oob::DEFAULT_TIMEOUT),
                None => client_exchange(
                    (host.as_str(), args.port),
                    mine,
                    crate::oob::DEFAULT_TIMEOUT,
                ),
            }
            .map_err(|err| format!("Couldn't connect to {host}:{}: {err}", args.port))?;
            print_remote(&rem);
            connect(args, qp, mine, gidx, &rem)?;
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
            let pending = server
                .accept()
                .map_err(|err| format!("Couldn't read remote address: {err}"))?;
            let rem = *pending.remote();
            connect(args, qp, mine, gidx, &rem)?;
            pending
                .reply(mine)
                .map_err(|err| format!("Couldn't send/recv local address: {err}"))?;
            print_remote(&rem);
        }
    }
    Ok(())
}

/// Our QP to RTS toward the peer's `rem`.
fn connect(
    args: &PingpongArgs,
    qp: &verbs::Qp,
    mine: &PingpongDest,
    gidx: u8,
    rem: &PingpongDest,
) -> Result<(), String> {
    if !rem.has_gid() {
        return Err(
            "the peer announced no GID: RoCE needs one (run ibv_rc_pingpong with -g)".into(),
        );
    }
    qp.connect(
        &Remote {
            qpn: rem.qpn,
            psn: rem.psn.value(),
            gid: rem.gid,
        },
        mine.psn.value(),
        gidx,
        &ConnectOpts {
            path_mtu: Mtu::from_bytes(args.mtu).unwrap_or_default(),
            traffic_class: args.cc.tclass.unwrap_or(0),
            ..ConnectOpts::default()
        },
    )
    .map_err(|err| format!("Couldn't connect to remote QP: {err}"))
}

/// The run's verbs objects (rc_pingpong's pp_context). Fields drop in this order: the
/// QP, the CQ, the MR, the PD.
struct Endpoint {
    qp: verbs::Qp,
    cq: verbs::Cq,
    /// [0, size): what we send; [size, 2 size): where receives land.
    mr: verbs::Mr,
    /// The PD of the MR and QP, held until the end of the run.
    _pd: verbs::Pd,
    /// The receive every message lands in.
    recv_wr: RecvWr,
    size: usize,
}

impl Endpoint {
    /// rc_pingpong's pp_init_ctx: PD, MR (its first half filled), CQ, and the QP in INIT.
    fn create(dev: &verbs::Device, args: &PingpongArgs) -> Result<Self, String> {
        let size = args.size as usize;
        let e = |what: &str| {
            let what = what.to_string();
            move |err: verbs::Error| format!("{what}: {err}")
        };
        let pd = dev.alloc_pd().map_err(e("Couldn't allocate PD"))?;
        let mr = pd
            .reg_mr(2 * size, Access::LOCAL_WRITE)
            .map_err(e("Couldn't register MR"))?;
        mr.with_mut(|b| b[..size].fill(FILL))
            .map_err(e("Couldn't fill the buffer"))?;
        let cq = dev
            .create_cq(args.rx_depth as usize + 1)
            .map_err(e("Couldn't create CQ"))?;
        let qp = pd
            .create_qp(&verbs::QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                max_send_wr: 1,
                max_recv_wr: args.rx_depth,
                sq_sig_all: false,
            })
            .map_err(e("Couldn't create QP"))?;
        qp.modify(&QpAttr::rc_init(Access::NONE), AttrMask::RC_INIT)
            .map_err(e("Failed to modify QP to INIT"))?;
        let recv_wr = RecvWr {
            wr_id: RECV_WRID,
            sg_list: vec![mr.sge(size, args.size)],
        };
        Ok(Endpoint {
            qp,
            cq,
            mr,
            _pd: pd,
            recv_wr,
            size,
        })
    }

    /// Post up to `n` receives; how many were posted.
    fn post_recv(&self, n: u32) -> u32 {
        (0..n)
            .take_while(|_| self.qp.post_recv(self.recv_wr.clone()).is_ok())
            .count() as u32
    }

    /// rc_pingpong's loop: the server sends first, then each side sends when both its last
    /// send and a receive completed, until `iters` each way; `routs` receives are posted.
    /// The time it took (µs) and the messages verified.
    fn ping_pong(&self, args: &PingpongArgs, mut routs: u32) -> Result<(f64, u64), String> {
        let send_wr = {
            let mut w = SendWr::new(SEND_WRID, WrOpcode::Send);
            w.sg_list = vec![self.mr.sge(0, args.size)];
            w
        };
        let mut pending = RECV_WRID;
        if args.server.is_some() {
            self.qp
                .post_send(send_wr.clone())
                .map_err(|err| format!("Couldn't post send: {err}"))?;
            pending |= SEND_WRID;
        }
        let start = Instant::now();
        let (mut rcnt, mut scnt, mut verified) = (0u32, 0u32, 0u64);
        let mut wcs = Vec::with_capacity(2);
        while rcnt < args.iters || scnt < args.iters {
            wcs.clear();
            if args.events {
                if self.cq.wait_receiving(2, SILENCE, &mut wcs) == 0 {
                    return Err(format!("no completion for {SILENCE:?}"));
                }
            } else {
                poll_completions(&self.cq, &mut wcs, args.busy_poll)?;
            }
            for wc in &wcs {
                if wc.status != WcStatus::Success {
                    return Err(format!(
                        "Failed status {} ({}) for wr_id {}",
                        wc.status.as_str(),
                        wc.status as u32,
                        wc.wr_id
                    ));
                }
                match wc.wr_id {
                    SEND_WRID => scnt += 1,
                    RECV_WRID => {
                        if args.verify {
                            check(&self.mr, self.size, wc.byte_len, rcnt)?;
                            verified += 1;
                        }
                        routs -= 1;
                        if routs <= 1 {
                            routs += self.post_recv(args.rx_depth - routs);
                            if routs < args.rx_depth {
                                return Err(format!("Couldn't post receive ({routs})"));
                            }
                        }
                        rcnt += 1;
                    }
                    other => return Err(format!("Completion for unknown wr_id {other}")),
                }
                pending &= !wc.wr_id;
                if scnt < args.iters && pending == 0 {
                    self.qp
                        .post_send(send_wr.clone())
                        .map_err(|err| format!("Couldn't post send: {err}"))?;
                    pending = RECV_WRID | SEND_WRID;
                }
            }
        }
        Ok((start.elapsed().as_secs_f64() * 1e6, verified))
    }
}

/// Poll `cq` until it gives completions, yielding the CPU between polls, then (unless
/// `never_sleep`) sleep until one comes; an error after [`SILENCE`] without any.
fn poll_completions(
    cq: &verbs::Cq,
    wcs: &mut Vec<verbs::WorkCompletion>,
    never_sleep: bool,
) -> Result<(), String> {
    let start = Instant::now();
    let mut idle = Duration::ZERO;
    let mut empty = 0u32;
    loop {
        if cq.poll_into(2, wcs) > 0 {
            return Ok(());
        }
        // The clock only every few empty polls: an empty poll costs about as much as
        // reading it, and YIELD and SILENCE are thousands of polls long.
        empty = empty.wrapping_add(1);
        if empty % CLOCK_EVERY == 0 {
            idle = start.elapsed();
        }
        if idle > SILENCE {
            return Err(format!("no completion for {SILENCE:?}"));
        }
        if idle < YIELD || never_sleep {
            // On a shared machine the peer, or this device's driver thread, may need
            // this CPU to produce what we wait for.
            std::thread::yield_now();
        } else if cq.wait_receiving(2, SILENCE - idle, wcs) > 0 {
            return Ok(());
        } else {
            idle = start.elapsed();
        }
    }
}

/// Keep the device up until the QP has received nothing for [`QUIET`] (at most
/// [`LINGER_MAX`]): if our last ACK was lost, the peer retransmits after its ACK timeout
/// and must still get an answer, or its last send fails with RETRY_EXC_ERR.
fn linger(qp: &verbs::Qp) {
    // An RDMA device has no per-QP receive counter to watch; like the stock tool, close.
    let received = || qp.counters().map(|c| c.packets_received);
    let Ok(mut last) = received() else {
        return;
    };
    let mut waited = Duration::ZERO;
    while waited < LINGER_MAX {
        std::thread::sleep(QUIET);
        waited += QUIET;
        let Ok(now) = received() else {
            return;
        };
        if now == last {
            return;
        }
        last = now;
    }
}

fn print_remote(rem: &PingpongDest) {
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        rem.lid,
        rem.qpn.value(),
        rem.psn.value(),
        gid_text(&rem.gid)
    );
}

/// Check the message in the receive half and clear it for the next one.
fn check(mr: &verbs::Mr, size: usize, byte_len: u32, n: u32) -> Result<(), String> {
    if byte_len as usize != size {
        return Err(format!(
            "verify: message {n} has {byte_len} bytes, expected {size}"
        ));
    }
    // Only the receive half is copied out and cleared (`Mr::with_mut` would copy the
    // whole region).
    let mut msg = vec![0u8; size];
    mr.read(size, &mut msg).map_err(|e| e.to_string())?;
    let bad = msg
        .iter()
        .enumerate()
        .find(|&(i, &x)| !(x == FILL || (x == 0 && i % PAGE == 0)))
        .map(|(i, &x)| (i, x));
    msg.fill(0);
    mr.write(size, &msg).map_err(|e| e.to_string())?;
    match bad {
        Some((i, x)) => Err(format!(
            "verify: message {n} byte {i} is 0x{x:02x}, expected 0x{FILL:02x}"
        )),
        None => Ok(()),
    }
}
