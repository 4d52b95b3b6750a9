//! `xrnic perf --cc-log FILE`: a CSV time series of each QP's DCQCN state and delivered
//! bytes, sampled by the client while it runs (what the DCQCN lab plots, `xrnic plot`).
//!
//! Contract: one header line, then one row per QP per sample:
//! `t_s,qp,qpn,rate_mbps,target_mbps,alpha,delivered_bytes,retransmitted_packets,rp_cnp_handled`.
//! `t_s` is seconds since the log was created; `qp` the QP's index in the run (0, 1, ...);
//! rate, target (Mb/s) and α are DCQCN's at that instant, all three empty with DCQCN off
//! (before a QP's first CNP, α is `rp_initial_alpha_value`);
//! `delivered_bytes` counts messages completed (acknowledged by the responder) × size;
//! the two counters are the QP's. Samples are taken at most every interval (the requester
//! loop calls [`CcLog::maybe_sample`] at least every 50 ms), plus a last one at the end.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::verbs::Qp;

/// The CSV header.
pub const HEADER: &str =
    "t_s,qp,qpn,rate_mbps,target_mbps,alpha,delivered_bytes,retransmitted_packets,rp_cnp_handled";

/// An open log.
#[derive(Debug)]
pub struct CcLog {
    out: BufWriter<File>,
    start: Instant,
    interval: Duration,
    next: Instant,
    size: u64,
}

impl CcLog {
    /// Create (truncate) `path`; messages are `size` bytes.
    pub fn create(path: &Path, interval: Duration, size: u64) -> io::Result<CcLog> {
        let mut out = BufWriter::new(File::create(path)?);
        writeln!(out, "{HEADER}")?;
        let start = Instant::now();
        Ok(CcLog {
            out,
            start,
            interval,
            next: start,
            size,
        })
    }

    /// Sample every QP if an interval has passed since the last sample. `done[i]`:
    /// messages QP `i` completed so far.
    pub fn maybe_sample(&mut self, now: Instant, qps: &[&Qp], done: &[u64]) -> io::Result<()> {
        if now < self.next {
            return Ok(());
        }
        self.sample(now, qps, done)?;
        self.next += self.interval;
        if self.next <= now {
            // Late (a slow loop): the next sample one interval from now, not a burst.
            self.next = now + self.interval;
        }
        Ok(())
    }

    fn sample(&mut self, now: Instant, qps: &[&Qp], done: &[u64]) -> io::Result<()> {
        let t = now.duration_since(self.start).as_secs_f64();
        for (i, (qp, &n)) in qps.iter().zip(done).enumerate() {
            let r = qp.rate_status();
            let c = qp.counters();
            let mbps = |v: u64| format!("{:.3}", v as f64 / 1e6);
            writeln!(
                self.out,
                "{t:.4},{i},{},{},{},{},{},{},{}",
                qp.qp_num().value(),
                r.map(|r| mbps(r.rate_bps)).unwrap_or_default(),
                r.map(|r| mbps(r.target_bps)).unwrap_or_default(),
                r.and_then(|r| r.alpha)
                    .map(|a| format!("{a:.5}"))
                    .unwrap_or_default(),
                n * self.size,
                c.map(|c| c.retransmitted_packets.to_string())
                    .unwrap_or_default(),
                r.map_or(0, |r| r.rp_cnp_handled),
            )?;
        }
        Ok(())
    }

    /// A last sample, and flush.
    pub fn finish(&mut self, qps: &[&Qp], done: &[u64]) -> io::Result<()> {
        self.sample(Instant::now(), qps, done)?;
        self.out.flush()
    }
}
