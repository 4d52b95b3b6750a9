//! `make bench-net` sections (h) and (i): aggregate RDMA WRITE goodput over many RC QPs
//! on one device pair, and one QP's WRITE beside one kernel TCP stream with the CPU both
//! spend per byte moved.
//!
//! (h) N RC QPs (1, 16, 256, 4 096, 10 000) between one xrnic device on each end of the
//! veth pair, all on one CQ, one MR per side. The client posts round robin over its QPs
//! with the same total in flight for every N ([`WINDOW`] messages of [`MSG`] bytes, at
//! most `WINDOW / N` (at least 1) on one QP), so the wire sees the same load and only the
//! number of QPs sharing it changes: with 10 000 QPs at most `WINDOW` QPs have work at
//! any time and the rest wait their turn, which is what costs an RNIC whose per-QP work
//! grows with the QPs it holds. Goodput is the bytes of the WRITEs completed in the
//! measured seconds. The memory per QP is the growth of the process's resident set from
//! before the QPs were created to after they were connected, over the 2 N QPs (both ends
//! live in this process).
//!
//! (i) The same harness with one QP and 64 KiB messages (perftest's ib_write_bw shape:
//! 128 in flight), and one kernel TCP stream between the same two namespaces (a std
//! `TcpStream`, 64 KiB writes). CPU: `getrusage(RUSAGE_SELF)` over the measured seconds,
//! user and system, both ends and every thread (xrnic's driver threads, the kernel's
//! softirq work when it runs on a thread of this process); the kernel's own threads
//! (ksoftirqd) are not counted, for either.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use xrnic::driver::DriverStats;
use xrnic::proto::DeviceCounters;
use xrnic::verbs::{
    Access, ConnectOpts, Cq, Device, DeviceOptions, Mr, Mtu, Qp, QpInitAttr, Remote, SendFlags,
    SendWr, WcStatus, WorkCompletion, WrOpcode,
};
use xrnic_netns::{Side, VethPair};

/// The QP counts of section (h).
pub const QP_COUNTS: [usize; 5] = [1, 16, 256, 4096, 10_000];
/// Messages in flight in total, whatever the number of QPs: 32 of 16 KiB are 128
/// packets, the PSN window of one QP (`Config::max_unacked_psns`), so one QP can keep
/// them all in flight and N QPs never put more on the wire than one (more would overflow
/// the AF_XDP rings and measure loss recovery, not the QPs).
pub const WINDOW: usize = 32;
/// Bytes per WRITE in section (h): 4 frames at path MTU 4096.
pub const MSG: u32 = 16 * 1024;

/// One measurement of the many-QP harness.
#[derive(Clone, Copy, Debug)]
pub struct QpsResult {
    pub qps: usize,
    pub gbps: f64,
    /// Resident-set growth per QP (both ends' QPs counted), bytes.
    pub mem_per_qp: f64,
    /// CPU seconds (user, system) of the whole process in the measured interval.
    pub cpu_user: f64,
    pub cpu_sys: f64,
    /// Bytes completed in the measured interval.
    pub bytes: u64,
}

impl QpsResult {
    /// CPU seconds per GB (10^9 bytes) moved.
    pub fn cpu_per_gb(&self) -> f64 {
        (self.cpu_user + self.cpu_sys) / (self.bytes as f64 / 1e9)
    }
}

/// Resident set of this process, bytes (`VmRSS` of `/proc/self/status`, in kB).
fn rss_bytes() -> Result<u64, String> {
    let s = std::fs::read_to_string("/proc/self/status").map_err(|e| format!("status: {e}"))?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| "/proc/self/status: no VmRSS".to_string())
}

/// (user, system) CPU seconds of the whole process so far, every thread: fields 14 and
/// 15 of `/proc/self/stat` (proc(5)), in USER_HZ ticks, which Linux fixes at 100 on the
/// architectures xrnic builds for (what `getrusage(RUSAGE_SELF)` sums, at 10 ms
/// resolution: enough over seconds).
fn cpu_secs() -> Result<(f64, f64), String> {
    let s = std::fs::read_to_string("/proc/self/stat").map_err(|e| format!("stat: {e}"))?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = s.rsplit_once(')').map(|(_, r)| r).ok_or("stat: no ')'")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| -> Result<f64, String> {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .map(|t| t / 100.0)
            .ok_or_else(|| format!("stat: no field {}", i + 3))
    };
    // After ')': field 3 is at index 0, so utime (14) at 11 and stime (15) at 12.
    Ok((tick(11)?, tick(12)?))
}

/// The devices run DCQCN (the default), or not with `XRNIC_BENCH_CC=off` (what the other
/// sections' `bench_cc` reads): to see what congestion control costs with many QPs.
fn open(pair: &VethPair, side: Side) -> Result<Device, String> {
    let mut opts = DeviceOptions::default();
    if std::env::var("XRNIC_BENCH_CC").as_deref() == Ok("off") {
        opts.dcqcn = None;
    }
    pair.run_in(side, || Device::open_with(&pair.end(side).ifname, &opts))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("open device on {side:?}: {e}"))
}

/// The QP counts to run: `XRNIC_BENCH_QPS=1,256` (for profiling one of them), else
/// [`QP_COUNTS`]. An unparsable list is an error, not ignored.
pub fn qp_counts() -> Result<Vec<usize>, String> {
    let Ok(v) = std::env::var("XRNIC_BENCH_QPS") else {
        return Ok(QP_COUNTS.to_vec());
    };
    let n: Vec<usize> = v
        .split(',')
        .map(|x| x.trim().parse::<usize>().ok().filter(|n| *n > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("XRNIC_BENCH_QPS={v:?}: give QP counts, e.g. 1,256"))?;
    Ok(n)
}

/// Both drivers' counters from `s0` to `s1`, per message of `msgs`, as one line.
type Snap = (DriverStats, DriverStats, DeviceCounters, DeviceCounters);

fn stats_line(s0: Snap, s1: Snap, msgs: u64) -> String {
    let m = msgs.max(1) as f64;
    let side = |x: &DriverStats, y: &DriverStats| {
        format!(
            "frames out {:.2} in {:.2}, loop {:.2}, app steps {:.2}, sleeps {:.2}, kicks {:.2}, \
             deferred acks {:.2}, cq waits {:.2}, cq wakeups {:.2}",
            (y.frames_out - x.frames_out) as f64 / m,
            (y.frames_in - x.frames_in) as f64 / m,
            (y.iterations - x.iterations) as f64 / m,
            (y.app_steps - x.app_steps) as f64 / m,
            (y.sleeps - x.sleeps) as f64 / m,
            (y.app_wakeups - x.app_wakeups) as f64 / m,
            (y.acks_deferred - x.acks_deferred) as f64 / m,
            (y.cq_waits - x.cq_waits) as f64 / m,
            (y.cq_wakeups - x.cq_wakeups) as f64 / m,
        )
    };
    let dev = |x: &DeviceCounters, y: &DeviceCounters| {
        format!(
            "acks sent {:.2} received {:.2}, naks sent {:.2}, cnps {:.2}, retransmitted {:.2}, \
             duplicates {:.2}",
            (y.qp.acks_sent - x.qp.acks_sent) as f64 / m,
            (y.qp.acks_received - x.qp.acks_received) as f64 / m,
            (y.qp.naks_sent - x.qp.naks_sent) as f64 / m,
            (y.np_cnp_sent - x.np_cnp_sent) as f64 / m,
            (y.qp.retransmitted_packets - x.qp.retransmitted_packets) as f64 / m,
            (y.qp.duplicate_request - x.qp.duplicate_request) as f64 / m,
        )
    };
    format!(
        "per message: A (requester): {}; {}; B (responder): {}; {}",
        side(&s0.0, &s1.0),
        dev(&s0.2, &s1.2),
        side(&s0.1, &s1.1),
        dev(&s0.3, &s1.3)
    )
}

/// The per-QP cap on messages in flight for `n` QPs and a total `window`.
pub fn per_qp_depth(n: usize, window: usize) -> usize {
    (window / n.max(1)).max(1)
}

/// The round-robin poster: which QP gets the next message. Starts after the QP that got
/// the last one and skips QPs at their cap; None when the total window is full (or every
/// QP is at its cap).
pub struct RoundRobin {
    next: usize,
    outstanding: Vec<usize>,
    total: usize,
    cap: usize,
    window: usize,
}

impl RoundRobin {
    pub fn new(n: usize, window: usize) -> Self {
        RoundRobin {
            next: 0,
            outstanding: vec![0; n],
            total: 0,
            cap: per_qp_depth(n, window),
            window,
        }
    }

    /// The QP to post on next, counted as posted.
    pub fn post(&mut self) -> Option<usize> {
        if self.total >= self.window {
            return None;
        }
        let n = self.outstanding.len();
        for _ in 0..n {
            let q = self.next;
            self.next = if q + 1 < n { q + 1 } else { 0 };
            if self.outstanding[q] < self.cap {
                self.outstanding[q] += 1;
                self.total += 1;
                return Some(q);
            }
        }
        None
    }

    /// One message of QP `q` completed.
    pub fn complete(&mut self, q: usize) {
        if let Some(o) = self.outstanding.get_mut(q) {
            if *o > 0 {
                *o -= 1;
                self.total -= 1;
            }
        }
    }
}

/// `n` RC QPs from A to B, WRITEs of `msg` bytes, `window` in flight in total, for
/// `dur` after a warm-up of a quarter of it.
pub fn run_qps(
    pair: &VethPair,
    n: usize,
    msg: u32,
    window: usize,
    dur: Duration,
) -> Result<QpsResult, String> {
    let a = open(pair, Side::A)?;
    let b = open(pair, Side::B)?;
    let depth = per_qp_depth(n, window);
    let rss0 = rss_bytes()?;
    let e = |what: &'static str| move |err: xrnic::verbs::Error| format!("{what}: {err}");
    let (pda, pdb) = (
        a.alloc_pd().map_err(e("alloc_pd"))?,
        b.alloc_pd().map_err(e("alloc_pd"))?,
    );
    let cqa = a.create_cq(window + 1).map_err(e("create_cq"))?;
    let cqb = b.create_cq(1).map_err(e("create_cq"))?;
    // One buffer per side, `window` messages long: every message has its own slot.
    let region = msg as usize * window;
    let mra = pda.reg_mr(region, Access::ALL).map_err(e("reg_mr"))?;
    let mrb = pdb.reg_mr(region, Access::ALL).map_err(e("reg_mr"))?;
    fn init(cq: &Cq, wr: usize) -> QpInitAttr<'_> {
        QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            max_send_wr: wr as u32,
            max_recv_wr: 1,
            sq_sig_all: true,
        }
    }
    let mut qa: Vec<Qp> = Vec::with_capacity(n);
    let mut qb: Vec<Qp> = Vec::with_capacity(n);
    for _ in 0..n {
        qa.push(pda.create_qp(&init(&cqa, depth)).map_err(e("create_qp"))?);
        qb.push(pdb.create_qp(&init(&cqb, 1)).map_err(e("create_qp"))?);
    }
    let o = ConnectOpts {
        access: Access::ALL,
        path_mtu: Mtu::Mtu4096,
        // 4.096 µs * 2^14 ≈ 67 ms, perftest's and rc_pingpong's.
        timeout: 14,
        ..ConnectOpts::default()
    };
    let gid = |d: &Device| d.query_gid(1).ok_or("no GID at index 1".to_string());
    let (ga, gb) = (gid(&a)?, gid(&b)?);
    for (i, (x, y)) in qa.iter().zip(&qb).enumerate() {
        let psn = (i as u32 * 7919) & 0xff_ffff;
        x.connect(
            &Remote {
                qpn: y.qp_num(),
                psn,
                gid: gb,
            },
            psn,
            1,
            &o,
        )
        .map_err(e("connect A"))?;
        y.connect(
            &Remote {
                qpn: x.qp_num(),
                psn,
                gid: ga,
            },
            psn,
            1,
            &o,
        )
        .map_err(e("connect B"))?;
    }
    let rss1 = rss_bytes()?;
    let mem_per_qp = rss1.saturating_sub(rss0) as f64 / (2 * n) as f64;

    let wr = |q: usize, slot: usize, mr: &Mr| {
        let mut w = SendWr::new(q as u64, WrOpcode::RdmaWrite);
        w.send_flags = SendFlags::SIGNALED;
        let off = slot * msg as usize;
        w.sg_list = vec![mr.sge(off, msg)];
        w.rdma.remote_addr = mrb.addr() + off as u64;
        w.rdma.rkey = mrb.rkey();
        w
    };
    let mut rr = RoundRobin::new(n, window);
    let mut slot = 0usize;
    let mut wcs: Vec<WorkCompletion> = Vec::with_capacity(64);
    let start = Instant::now();
    let warm = start + dur / 4;
    let end = warm + dur;
    let mut measuring = false;
    let (mut bytes, mut cpu0) = (0u64, (0.0, 0.0));
    let want_stats = std::env::var_os("XRNIC_BENCH_QPS_STATS").is_some();
    let snap = || -> Result<Snap, String> {
        Ok((
            a.driver_stats().map_err(e("driver_stats"))?,
            b.driver_stats().map_err(e("driver_stats"))?,
            a.counters().map_err(e("counters"))?,
            b.counters().map_err(e("counters"))?,
        ))
    };
    let mut stats0 = None;
    let mut last_progress = Instant::now();
    loop {
        let now = Instant::now();
        if !measuring && now >= warm {
            measuring = true;
            cpu0 = cpu_secs()?;
            if want_stats {
                stats0 = Some(snap()?);
            }
        }
        if now >= end {
            break;
        }
        while let Some(q) = rr.post() {
            qa[q]
                .post_send(wr(q, slot, &mra))
                .map_err(|err| format!("post_send on QP {q} of {n}: {err}"))?;
            slot = if slot + 1 < window { slot + 1 } else { 0 };
        }
        wcs.clear();
        if cqa.wait_into(64, Duration::from_millis(50), &mut wcs) == 0 {
            if last_progress.elapsed() > Duration::from_secs(10) {
                return Err(format!("{n} QPs: no completion for 10 s"));
            }
            continue;
        }
        last_progress = Instant::now();
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(format!("{n} QPs: completion {}", wc.status.as_str()));
            }
            rr.complete(wc.wr_id as usize);
            if measuring {
                bytes += u64::from(msg);
            }
        }
    }
    let cpu1 = cpu_secs()?;
    let secs = (Instant::now() - warm).as_secs_f64();
    // With `XRNIC_BENCH_QPS_STATS` set: both drivers' counters over the measured
    // interval, per message completed (what docs/performance.md "Many QPs" reads).
    if let Some(s0) = stats0 {
        println!(
            "          {n} QPs, {}",
            stats_line(s0, snap()?, bytes / u64::from(msg))
        );
    }
    Ok(QpsResult {
        qps: n,
        gbps: bytes as f64 * 8.0 / secs / 1e9,
        mem_per_qp,
        cpu_user: cpu1.0 - cpu0.0,
        cpu_sys: cpu1.1 - cpu0.1,
        bytes,
    })
}

/// One TCP stream A → B on the bare veth pair, 64 KiB writes, for `dur` after a quarter
/// of it of warm-up: (Gbit/s, CPU user s, CPU system s, bytes) over the measured part.
pub fn tcp_stream(pair: &VethPair, dur: Duration) -> Result<(f64, f64, f64, u64), String> {
    let b_addr = (pair.end(Side::B).ipv4, 18600);
    let listener = pair
        .run_in(Side::B, || TcpListener::bind(b_addr))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("tcp bind: {e}"))?;
    std::thread::scope(|sc| {
        let sink = sc.spawn(move || -> Result<u64, String> {
            let (mut s, _) = listener.accept().map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; 1 << 16];
            let mut total = 0u64;
            loop {
                match s.read(&mut buf) {
                    Ok(0) => return Ok(total),
                    Ok(k) => total += k as u64,
                    Err(e) => return Err(format!("tcp read: {e}")),
                }
            }
        });
        let mut s = pair
            .run_in(Side::A, || TcpStream::connect(b_addr))
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("tcp connect: {e}"))?;
        let buf = vec![0x5au8; 1 << 16];
        let start = Instant::now();
        let warm = start + dur / 4;
        let end = warm + dur;
        let (mut bytes, mut cpu0, mut measuring) = (0u64, (0.0, 0.0), false);
        loop {
            let now = Instant::now();
            if !measuring && now >= warm {
                measuring = true;
                cpu0 = cpu_secs()?;
            }
            if now >= end {
                break;
            }
            s.write_all(&buf).map_err(|e| format!("tcp write: {e}"))?;
            if measuring {
                bytes += buf.len() as u64;
            }
        }
        let cpu1 = cpu_secs()?;
        let secs = (Instant::now() - warm).as_secs_f64();
        drop(s);
        let got = sink.join().map_err(|_| "tcp sink panicked".to_string())??;
        if got < bytes {
            return Err(format!("tcp: {got} bytes received of {bytes} sent"));
        }
        Ok((
            bytes as f64 * 8.0 / secs / 1e9,
            cpu1.0 - cpu0.0,
            cpu1.1 - cpu0.1,
            bytes,
        ))
    })
}
