//! The DCQCN reaction point (RP) of one QP: Zhu et al., "Congestion Control for Large-Scale
//! RDMA Deployments", SIGCOMM 2015, with the ConnectX knobs of [`DcqcnParams`].
//!
//! Contract: sans-IO. Inputs are [`Dcqcn::on_cnp`], [`Dcqcn::on_bytes_sent`] and
//! [`Dcqcn::on_timer`], each with `now` in nanoseconds; outputs are [`Dcqcn::rate_bps`],
//! [`Dcqcn::target_bps`], [`Dcqcn::alpha`] and [`Dcqcn::poll_timeout`]. Every input first
//! runs everything that fell due up to `now` (increase-timer expirations, α decay), so a
//! caller may call late or early without changing the result.
//!
//! The algorithm as implemented (R_c current rate, R_t target rate, all rates in bit/s):
//! - An unthrottled QP sends at the maximum rate (`rp_max_rate`, or the line rate) and has
//!   no timers. The first CNP throttles it: α ← `rp_initial_alpha_value`/1024, then the
//!   cut below (or, with `rp_rate_to_set_on_first_cnp` ≠ 0, R_c = R_t = that rate).
//! - Cut on a handled CNP: R_t ← R_c if `rp_clamp_tgt_rate`, or if
//!   `rp_clamp_tgt_rate_after_time_inc` and the timer raised the rate since the last cut;
//!   R_c ← max(R_c·(1 − f), `rp_min_rate`) with f = min(α·2^(10 − `rp_gd`),
//!   1 − `rp_min_dec_fac`/100); then α ← (1 − g)·α + g. The cut uses α from before the
//!   CNP, as in the paper. The timer, the byte counter and both stage counters restart.
//! - A CNP less than `rp_rate_reduce_monitor_period` after the last cut is ignored.
//! - α decay: for every full `rp_dce_tcp_rtt` period (the paper's K) since the last
//!   handled CNP, α ← (1 − g)·α. Nothing reads α between inputs, so it is applied when the
//!   next input arrives instead of by a timer of its own (same values, no 1 µs wake-ups).
//! - Increase events: the timer fires every `rp_time_reset` µs after the last cut (event
//!   count T) and the byte counter every `rp_byte_reset`·64 bytes sent (event count BC).
//!   With F = `rp_threshold`: while max(T, BC) ≤ F fast recovery (R_t kept); when one
//!   count is past F additive increase (R_t += R_AI); when both are, hyper increase
//!   (R_t += i·R_HAI, i = min(T, BC) − F). Then R_t ← min(R_t, max) and
//!   R_c ← (R_t + R_c)/2.
//! - Once R_t and R_c are back at the maximum (within 1 bit/s) the QP is unthrottled
//!   again (ConnectX releases its rate limiter; the next CNP is a "first CNP" again).
//!
//! Unverified against ConnectX: the exact meaning of `rp_gd`, of the clamp flags and of
//! `rp_byte_reset`'s unit, whether CNPs ignored by the monitor period still raise α (here
//! they do not), and the per-period α update of NVIDIA's description (here: per CNP, as in
//! the paper). See docs/congestion.md.

use super::params::{DcqcnParams, mbps};
use super::{CnpVerdict, RateController};

/// Which phase the last increase event was in (for tracing and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not throttled: sending at the maximum rate.
    Unthrottled,
    /// Throttled, no increase event since the last cut.
    Cut,
    FastRecovery,
    AdditiveIncrease,
    HyperIncrease,
}

/// The reaction point of one QP.
#[derive(Clone, Debug)]
pub struct Dcqcn {
    p: DcqcnParams,
    /// The rate cap, bit/s.
    max: f64,
    rc: f64,
    rt: f64,
    alpha: f64,
    throttled: bool,
    phase: Phase,
    /// Timer expirations since the last cut (T).
    timer_events: u32,
    /// Byte-counter expirations since the last cut (BC).
    byte_events: u32,
    /// Bytes sent since the last byte-counter expiration.
    bytes: u64,
    /// When the increase timer fires next (only while throttled).
    timer_deadline: Option<u64>,
    /// The last cut, which also anchors the α periods.
    last_cut: u64,
    /// α right after the last handled CNP, and how many decay periods were applied since.
    alpha_at_cut: f64,
    alpha_periods: u64,
    cnp_handled: u64,
    cnp_ignored: u64,
}

impl Dcqcn {
    /// A reaction point for a QP on a port of `line_rate_bps`.
    pub fn new(params: DcqcnParams, line_rate_bps: u64) -> Self {
        let line = line_rate_bps as f64;
        let max = if params.rp_max_rate == 0 {
            line
        } else {
            mbps(params.rp_max_rate).min(line)
        };
        Dcqcn {
            p: params,
            max,
            rc: max,
            rt: max,
            alpha: params.initial_alpha(),
            throttled: false,
            phase: Phase::Unthrottled,
            timer_events: 0,
            byte_events: 0,
            bytes: 0,
            timer_deadline: None,
            last_cut: 0,
            alpha_at_cut: params.initial_alpha(),
            alpha_periods: 0,
            cnp_handled: 0,
            cnp_ignored: 0,
        }
    }

    /// The parameters in use.
    pub fn params(&self) -> &DcqcnParams {
        &self.p
    }

    /// R_c, the rate the QP may send at, in bit/s.
    pub fn rate_bps(&self) -> u64 {
        self.rc.round() as u64
    }

    /// R_t, the target rate, in bit/s.
    pub fn target_bps(&self) -> u64 {
        self.rt.round() as u64
    }

    /// R_c without rounding.
    pub fn rate(&self) -> f64 {
        self.rc
    }

    /// R_t without rounding.
    pub fn target(&self) -> f64 {
        self.rt
    }

    /// α as of the last input.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// True while the QP is rate-limited.
    pub fn is_throttled(&self) -> bool {
        self.throttled
    }

    /// The phase of the last event.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Timer and byte-counter expirations since the last cut (T, BC).
    pub fn stage_counts(&self) -> (u32, u32) {
        (self.timer_events, self.byte_events)
    }

    /// The time of the last cut.
    pub fn last_cut(&self) -> u64 {
        self.last_cut
    }

    /// CNPs that cut the rate, and CNPs ignored (monitor period), for this QP.
    pub fn cnp_counts(&self) -> (u64, u64) {
        (self.cnp_handled, self.cnp_ignored)
    }

    /// When the increase timer fires next.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.timer_deadline
    }

    /// Run whatever is due at `now` (timer expirations, α decay).
    pub fn on_timer(&mut self, now: u64) {
        self.advance(now);
    }

    /// `bytes` were sent at `now`: feed the byte counter.
    pub fn on_bytes_sent(&mut self, now: u64, bytes: u64) {
        self.advance(now);
        if !self.throttled {
            return;
        }
        let b = self.p.byte_reset_bytes();
        if b == 0 {
            return;
        }
        self.bytes = self.bytes.saturating_add(bytes);
        while self.throttled && self.bytes >= b {
            self.bytes -= b;
            self.byte_events = self.byte_events.saturating_add(1);
            self.increase();
        }
    }

    /// A CNP for this QP arrived at `now`.
    pub fn on_cnp(&mut self, now: u64) -> CnpVerdict {
        self.advance(now);
        let monitor = self.p.monitor_period_ns();
        if self.throttled && monitor > 0 && now.saturating_sub(self.last_cut) < monitor {
            self.cnp_ignored += 1;
            return CnpVerdict::Ignored;
        }
        self.cnp_handled += 1;
        let first = !self.throttled;
        let min = mbps(self.p.rp_min_rate).min(self.max);
        if first {
            self.throttled = true;
            self.alpha = self.p.initial_alpha();
        }
        if first && self.p.rp_rate_to_set_on_first_cnp != 0 {
            let r = mbps(self.p.rp_rate_to_set_on_first_cnp).clamp(min, self.max);
            self.rc = r;
            self.rt = r;
        } else {
            let clamp = self.p.rp_clamp_tgt_rate == 1
                || (self.p.rp_clamp_tgt_rate_after_time_inc == 1 && self.timer_events > 0);
            if clamp {
                self.rt = self.rc;
            }
            let factor = self.alpha * 2f64.powi(10 - self.p.rp_gd as i32);
            let bound = 1.0 - f64::from(self.p.rp_min_dec_fac) / 100.0;
            let f = factor.min(bound).clamp(0.0, 1.0);
            self.rc = (self.rc * (1.0 - f)).max(min);
        }
        let g = self.p.alpha_gain();
        self.alpha = (1.0 - g) * self.alpha + g;
        self.alpha_at_cut = self.alpha;
        self.alpha_periods = 0;
        self.timer_events = 0;
        self.byte_events = 0;
        self.bytes = 0;
        self.last_cut = now;
        self.timer_deadline = Some(now.saturating_add(self.p.time_reset_ns()));
        self.phase = Phase::Cut;
        CnpVerdict::Handled
    }

    fn advance(&mut self, now: u64) {
        if !self.throttled {
            return;
        }
        // α: one decay per full period since the last cut not applied yet.
        let k = self.p.alpha_period_ns();
        let periods = now.saturating_sub(self.last_cut) / k;
        if periods > self.alpha_periods {
            self.alpha_periods = periods;
            // (1 − g)^n underflows to 0 long before n reaches i32::MAX for any g ≥ 1/1024
            // except g = 0, where the power is 1 anyway.
            let n = periods.min(i32::MAX as u64) as i32;
            self.alpha = self.alpha_at_cut * (1.0 - self.p.alpha_gain()).powi(n);
        }
        while let Some(d) = self.timer_deadline {
            if d > now {
                break;
            }
            self.timer_events = self.timer_events.saturating_add(1);
            self.timer_deadline = Some(d.saturating_add(self.p.time_reset_ns()));
            self.increase();
        }
    }

    /// One increase event (timer or byte counter); the caller bumped its count.
    fn increase(&mut self) {
        let f = self.p.rp_threshold;
        let hi = self.timer_events.max(self.byte_events);
        let lo = self.timer_events.min(self.byte_events);
        if hi <= f {
            self.phase = Phase::FastRecovery;
        } else if lo <= f {
            self.phase = Phase::AdditiveIncrease;
            self.rt += mbps(self.p.rp_ai_rate);
        } else {
            self.phase = Phase::HyperIncrease;
            self.rt += f64::from(lo - f) * mbps(self.p.rp_hai_rate);
        }
        self.rt = self.rt.min(self.max);
        self.rc = (self.rt + self.rc) / 2.0;
        if self.rt >= self.max && self.max - self.rc < 1.0 {
            // Back at full speed: release the limiter.
            self.rc = self.max;
            self.rt = self.max;
            self.throttled = false;
            self.phase = Phase::Unthrottled;
            self.timer_deadline = None;
            self.bytes = 0;
        }
    }
}

impl RateController for Dcqcn {
    fn on_cnp(&mut self, now: u64) -> CnpVerdict {
        Dcqcn::on_cnp(self, now)
    }
    fn on_bytes_sent(&mut self, now: u64, bytes: u64) {
        Dcqcn::on_bytes_sent(self, now, bytes)
    }
    fn on_timer(&mut self, now: u64) {
        Dcqcn::on_timer(self, now)
    }
    fn poll_timeout(&self) -> Option<u64> {
        Dcqcn::poll_timeout(self)
    }
    fn rate_bps(&self) -> u64 {
        Dcqcn::rate_bps(self)
    }
    fn target_bps(&self) -> u64 {
        Dcqcn::target_bps(self)
    }
    fn alpha(&self) -> Option<f64> {
        Some(self.alpha)
    }
    fn name(&self) -> &'static str {
        "dcqcn"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1000;
    const LINE: u64 = 10_000_000_000;

    #[test]
    fn unthrottled_until_the_first_cnp() {
        let mut rp = Dcqcn::new(DcqcnParams::connectx(), LINE);
        assert_eq!((rp.rate_bps(), rp.target_bps()), (LINE, LINE));
        assert_eq!(rp.poll_timeout(), None);
        rp.on_bytes_sent(5 * US, 1 << 30);
        rp.on_timer(10_000 * US);
        assert_eq!(rp.rate_bps(), LINE);
        assert_eq!(rp.on_cnp(20_000 * US), CnpVerdict::Handled);
        assert!(rp.is_throttled());
        assert_eq!(rp.poll_timeout(), Some(20_300 * US));
    }

    #[test]
    fn monitor_period_ignores_close_cnps() {
        let mut rp = Dcqcn::new(DcqcnParams::connectx(), LINE);
        assert_eq!(rp.on_cnp(100 * US), CnpVerdict::Handled);
        let r = rp.rate();
        assert_eq!(rp.on_cnp(103 * US), CnpVerdict::Ignored);
        assert_eq!(rp.rate(), r);
        assert_eq!(rp.on_cnp(104 * US), CnpVerdict::Handled);
        assert!(rp.rate() < r);
        assert_eq!(rp.cnp_counts(), (2, 1));
    }

    #[test]
    fn min_dec_fac_100_never_cuts() {
        let mut p = DcqcnParams::connectx();
        p.rp_min_dec_fac = 100;
        let mut rp = Dcqcn::new(p, LINE);
        rp.on_cnp(0);
        rp.on_cnp(10 * US);
        assert_eq!(rp.rate_bps(), LINE);
    }

    #[test]
    fn first_cnp_rate() {
        let mut p = DcqcnParams::connectx();
        p.rp_rate_to_set_on_first_cnp = 2000;
        let mut rp = Dcqcn::new(p, LINE);
        rp.on_cnp(0);
        assert_eq!(
            (rp.rate_bps(), rp.target_bps()),
            (2_000_000_000, 2_000_000_000)
        );
        // The second one cuts normally.
        rp.on_cnp(10 * US);
        assert!(rp.rate_bps() < 2_000_000_000);
    }

    #[test]
    fn recovers_to_unthrottled_on_timer_alone() {
        let mut rp = Dcqcn::new(DcqcnParams::connectx(), 1_000_000_000);
        rp.on_cnp(0);
        // Additive 5 Mb/s per 300 µs from ~500 Mb/s: a few hundred events at most.
        rp.on_timer(1_000_000_000);
        assert!(!rp.is_throttled());
        assert_eq!(rp.rate_bps(), 1_000_000_000);
        assert_eq!(rp.poll_timeout(), None);
        assert_eq!(rp.phase(), Phase::Unthrottled);
    }
}
