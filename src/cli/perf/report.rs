//! perftest's buffer addressing and its report: which offset each message uses
//! (`increase_loc_addr` / `increase_rem_addr`), the pattern the verifying tools write,
//! the bandwidth, peak and message-rate math of `print_report_bw`, and the lines perftest
//! prints (`REPORT_FMT`, the address lines of `ctx_print_pingpong_data`).

use super::PerfTest;
use crate::oob::perftest::{BwReport, PerftestDest};

/// The byte the verifying tools put at offset `i` of QP `qp`'s buffer: position-dependent
/// (a message landing at the wrong offset or on the wrong QP shows), never all zero over
/// a message (a message that never landed shows).
pub fn pattern(qp: usize, i: usize) -> u8 {
    ((i % 251) as u8).wrapping_add((qp as u8).wrapping_mul(37)) | 1
}

/// perftest `INC(size, cache_line)`: the size rounded up to the cache line, at least one.
pub fn addr_step(size: u64, cache_line: u64) -> u64 {
    if size > cache_line {
        size.div_ceil(cache_line) * cache_line
    } else {
        cache_line
    }
}

/// Distinct offsets messages cycle over (1: every message at offset 0).
pub fn slots(size: u64, cycle_buffer: u64, cache_line: u64) -> u64 {
    if size <= cycle_buffer / 2 {
        (cycle_buffer / addr_step(size, cache_line)).max(1)
    } else {
        1
    }
}

/// Offset of message `n` in its QP's buffer (perftest `increase_loc_addr` /
/// `increase_rem_addr`).
pub fn slot_offset(n: u64, size: u64, cycle_buffer: u64, cache_line: u64) -> u64 {
    (n % slots(size, cycle_buffer, cache_line)) * addr_step(size, cache_line)
}

/// What one side measured (or, on a passive server, what the client reported).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measured {
    /// Messages counted (perftest's `iters` of the report: all QPs).
    pub iters: u64,
    pub secs: f64,
    /// Best rate: seconds per message in the best window (0: no peak).
    pub peak_secs_per_msg: f64,
}

/// The report of `print_report_bw` in the chosen unit.
pub fn bw_report(size: u64, m: &Measured, gbits: bool) -> BwReport {
    let unit = if gbits { 125_000_000.0 } else { 1_048_576.0 };
    let (bw_avg, rate) = if m.secs > 0.0 {
        (
            size as f64 * m.iters as f64 / m.secs / unit,
            m.iters as f64 / m.secs / 1e6,
        )
    } else {
        (0.0, 0.0)
    };
    let bw_peak = if m.peak_secs_per_msg > 0.0 {
        size as f64 / m.peak_secs_per_msg / unit
    } else {
        0.0
    };
    BwReport {
        size,
        iters: m.iters,
        bw_peak,
        bw_avg,
        msg_rate_avg: rate,
        ..BwReport::default()
    }
}

/// perftest's peak search: `posted[i]` is when message `i` (all QPs, post order) was
/// posted, `completed[j]` when the `j + 1`-th completion was known (seconds); the best
/// `(completed[j] - posted[i]) / (j - i + 1)` over `j` at the ends of moderation groups
/// (`cq_mod`) and the last one, starting from the first message's own latency.
pub fn peak_secs_per_msg(posted: &[f64], completed: &[f64], cq_mod: usize) -> f64 {
    let n = posted.len().min(completed.len());
    if n == 0 {
        return 0.0;
    }
    let cq_mod = cq_mod.max(1);
    let mut best = completed[0] - posted[0];
    for (i, &p) in posted.iter().enumerate().take(n) {
        let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
        while j < n {
            best = best.min((completed[j] - p) / (j - i + 1) as f64);
            j += cq_mod;
        }
        if n % cq_mod != 0 {
            let j = n - 1;
            best = best.min((completed[j] - p) / (j - i + 1) as f64);
        }
    }
    best.max(0.0)
}

/// perftest's result line (`REPORT_FMT`, or `REPORT_FMT_EXT` for small Gb/sec figures).
pub fn report_line(r: &BwReport, gbits: bool) -> String {
    if gbits && r.bw_avg < 0.1 {
        format!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
            r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate_avg
        )
    } else {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate_avg
        )
    }
}

/// A report value in Gb/s whatever the unit it was computed in.
pub(super) fn to_gbps(v: f64, gbits: bool) -> f64 {
    if gbits {
        v
    } else {
        v * 1_048_576.0 * 8.0 / 1e9
    }
}

/// C's `%#0Nx`: `0x` and zero-padding to N characters in all, or just zeros for 0.
fn alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        format!("{:0width$}", 0)
    } else {
        format!("{v:#0width$x}")
    }
}

/// perftest `ctx_print_pingpong_data`: `BASIC_ADDR_FMT`, `READ_FMT`, `RDMA_FMT`,
/// `PERF_GID_FMT` (GID bytes in decimal, as perftest prints them).
pub(super) fn address_lines(side: &str, d: &PerftestDest, test: PerfTest) -> String {
    let mut s = format!(
        " {side} address: LID {} QPN {} PSN {}",
        alt_hex(d.lid.into(), 4),
        alt_hex(d.qpn.value().into(), 6),
        alt_hex(d.psn.value().into(), 6)
    );
    if matches!(test, PerfTest::Read | PerfTest::Atomic) {
        s.push_str(&format!(" OUT {}", alt_hex(d.out_reads.into(), 4)));
    }
    if test != PerfTest::Send {
        s.push_str(&format!(
            " RKey {} VAddr {}",
            alt_hex(d.rkey.0.into(), 8),
            alt_hex(d.vaddr, 16)
        ));
    }
    let gid: Vec<String> = d.gid.iter().map(|b| format!("{b:02}")).collect();
    s.push_str(&format!("\n GID: {}", gid.join(":")));
    s
}

#[cfg(test)]
mod tests {
    use super::alt_hex;

    #[test]
    fn c_alternate_hex() {
        assert_eq!(alt_hex(0, 4), "0000");
        assert_eq!(alt_hex(0x11, 6), "0x0011");
        assert_eq!(alt_hex(0xabcdef, 6), "0xabcdef");
    }
}
