//! The DCQCN reaction point (RP) of one QP: Zhu et al., "Congestion Control for Large-Scale
//! RDMA Deployments", SIGCOMM 2015, with the ConnectX knobs of [`DcqcnParams`].
//!
//! Contract: sans-IO. Inputs are [`Dcqcn::on_cnp`], [`Dcqcn::on_bytes_sent`] and
//! [`Dcqcn::on_timer`], each with `now` in nanoseconds; outputs are [`Dcqcn::rate_bps`],
//! [`Dcqcn::target_bps`], [`Dcqcn::alpha`] and [`Dcqcn::poll_timeout`]. Every input first
//! runs everything that fell due up to `now` (increase-timer expirations, α decay), so a
//! caller may call late or early without changing the result.
//!
//! The algorithm as implemented (R_c current rate, R_t target rate, all rates in bit/s;
//! docs/congestion.md has the references for each reading):
//! - An unthrottled QP sends at the maximum rate (`rp_max_rate`, or the line rate) and has
//!   no timers. The first CNP throttles it: α ← `rp_initial_alpha_value`/1024 and, with
//!   `rp_rate_to_set_on_first_cnp` ≠ 0, R_c = R_t = that rate; then it cuts like any CNP.
//! - When a CNP cuts: with `rp_rate_reduce_monitor_period` M = 0 at once; otherwise at
//!   the first point of the grid first CNP + n·M after it (NVIDIA: "reduced at the
//!   beginning of the next rate_reduce_monitor_period interval"), so one cut per period
//!   however many CNPs came in it.
//! - The cut: R_t ← R_c if `rp_clamp_tgt_rate`, or if the byte counter raised the rate
//!   since the last cut, or (with `rp_clamp_tgt_rate_after_time_inc`) the timer did;
//!   R_c ← max(R_c·(1 − f), `rp_min_rate`), f = min(α·2^(10 − `rp_gd`),
//!   1 − `rp_min_dec_fac`/100). The timer, the byte counter and both stage counters
//!   restart.
//! - α, with g = `rp_dce_tcp_g`/1024 and K = `rp_dce_tcp_rtt`: ConnectX style, once per K
//!   on the grid first CNP + n·K, α ← g + (1 − g)·α if a CNP came in the period, else
//!   α ← (1 − g)·α (a cut at a grid point sees that point's update first); paper style,
//!   α ← (1 − g)·α + g right after each cut (the cut used the α before it) and
//!   α ← (1 − g)·α per full K since the last cut. Applied when the next input arrives
//!   rather than by a timer of its own (same values, no 1 µs wake-ups).
//! - Increase events: the timer fires every `rp_time_reset` µs after the last cut (event
//!   count T) and the byte counter every `rp_byte_reset`·64 bytes sent (event count BC).
//!   With F = `rp_threshold`: while max(T, BC) ≤ F fast recovery (R_t kept); when one
//!   count is past F additive increase (R_t += R_AI); when both are, hyper increase
//!   (R_t += i·R_HAI, i = min(T, BC) − F). Then R_t ← min(R_t, max) and
//!   R_c ← (R_t + R_c)/2.
//! - ConnectX style: once R_t and R_c are back at the maximum (within 1 bit/s) the QP is
//!   unthrottled again (the limiter is released; the next CNP is a "first CNP"). Paper
//!   style: it stays under control, its timer running.

use super::params::{DcqcnParams, DcqcnStyle, mbps};
use super::{CnpVerdict, RateController};
use crate::proto::time::Instant;

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
    /// The last cut (anchors the paper style's α periods).
    last_cut: u64,
    /// Paper style: α right after the last cut, and how many decay periods were applied
    /// since.
    alpha_at_cut: f64,
    alpha_periods: u64,
    /// The first CNP of this throttling: anchors the ConnectX style's α and monitor grids.
    anchor: u64,
    /// ConnectX style: α updates applied since `anchor`, and whether a CNP came since the
    /// last one.
    alpha_ticks: u64,
    alpha_cnp: bool,
    /// A cut owed at the next monitor-period grid point.
    cut_due: Option<u64>,
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
            anchor: 0,
            alpha_ticks: 0,
            alpha_cnp: false,
            cut_due: None,
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
        round_rate(self.rc)
    }

    /// R_t, the target rate, in bit/s.
    pub fn target_bps(&self) -> u64 {
        round_rate(self.rt)
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

    /// CNPs taken by this reaction point, and CNPs ignored, for this QP (every CNP for a
    /// DCQCN QP is taken: one inside a monitor period makes the cut at its end).
    pub fn cnp_counts(&self) -> (u64, u64) {
        (self.cnp_handled, self.cnp_ignored)
    }

    /// When a cut owed by a CNP inside the monitor period happens, if one is.
    pub fn cut_due(&self) -> Option<u64> {
        self.cut_due
    }

    /// When the increase timer fires next, or the owed cut happens.
    pub fn poll_timeout(&self) -> Option<u64> {
        match (self.timer_deadline, self.cut_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
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
        self.cnp_handled += 1;
        let monitor = self.p.monitor_period_ns();
        if !self.throttled {
            self.throttled = true;
            self.alpha = self.p.initial_alpha();
            self.alpha_at_cut = self.alpha;
            self.alpha_periods = 0;
            self.anchor = now;
            self.alpha_ticks = 0;
            // The first CNP sets α itself; it does not count for the first update.
            self.alpha_cnp = false;
            self.timer_events = 0;
            self.byte_events = 0;
            self.bytes = 0;
            self.timer_deadline = None;
            self.last_cut = now;
            if self.p.rp_rate_to_set_on_first_cnp != 0 {
                let min = mbps(self.p.rp_min_rate).min(self.max);
                let r = mbps(self.p.rp_rate_to_set_on_first_cnp).clamp(min, self.max);
                self.rc = r;
                self.rt = r;
            }
            if monitor == 0 {
                self.cut(now);
            } else {
                self.cut_due = Some(now.saturating_add(monitor));
                self.phase = Phase::Cut;
            }
            return CnpVerdict::Handled;
        }
        self.alpha_cnp = true;
        if monitor == 0 {
            self.cut(now);
        } else if self.cut_due.is_none() {
            // The next point of the grid anchor + n·M strictly after now.
            let n = now.saturating_sub(self.anchor) / monitor + 1;
            self.cut_due = Some(self.anchor.saturating_add(n.saturating_mul(monitor)));
        }
        CnpVerdict::Handled
    }

    /// The cut of step "cut" at `now` (α brought up to `now` by the caller).
    fn cut(&mut self, now: u64) {
        let clamp = self.p.rp_clamp_tgt_rate == 1
            || self.byte_events > 0
            || (self.p.rp_clamp_tgt_rate_after_time_inc == 1 && self.timer_events > 0);
        if clamp {
            self.rt = self.rc;
        }
        let min = mbps(self.p.rp_min_rate).min(self.max);
        let factor = self.alpha * 2f64.powi(10 - self.p.rp_gd as i32);
        let bound = 1.0 - f64::from(self.p.rp_min_dec_fac) / 100.0;
        let f = factor.min(bound).clamp(0.0, 1.0);
        self.rc = (self.rc * (1.0 - f)).max(min);
        if self.p.style == DcqcnStyle::Paper {
            let g = self.p.alpha_gain();
            self.alpha = (1.0 - g) * self.alpha + g;
            self.alpha_at_cut = self.alpha;
            self.alpha_periods = 0;
        }
        self.timer_events = 0;
        self.byte_events = 0;
        self.bytes = 0;
        self.last_cut = now;
        self.cut_due = None;
        self.timer_deadline = Some(now.saturating_add(self.p.time_reset_ns()));
        self.phase = Phase::Cut;
    }

    /// α up to `now`: the updates due at or before it.
    fn alpha_to(&mut self, now: u64) {
        let k = self.p.alpha_period_ns();
        let g = self.p.alpha_gain();
        // (1 − g)^n underflows to 0 long before n reaches i32::MAX for any g ≥ 1/1024,
        // and is 1 for g = 0.
        let pow = |n: u64| (1.0 - g).powi(n.min(i32::MAX as u64) as i32);
        match self.p.style {
            DcqcnStyle::Paper => {
                let periods = now.saturating_sub(self.last_cut) / k;
                if periods > self.alpha_periods {
                    self.alpha_periods = periods;
                    self.alpha = self.alpha_at_cut * pow(periods);
                }
            }
            DcqcnStyle::ConnectX => {
                let ticks = now.saturating_sub(self.anchor) / k;
                if ticks > self.alpha_ticks {
                    let mut n = ticks - self.alpha_ticks;
                    if self.alpha_cnp {
                        self.alpha = g + (1.0 - g) * self.alpha;
                        self.alpha_cnp = false;
                        n -= 1;
                    }
                    self.alpha *= pow(n);
                    self.alpha_ticks = ticks;
                }
            }
        }
    }

    fn advance(&mut self, now: u64) {
        if !self.throttled {
            return;
        }
        // Owed cuts and timer events in time order (a cut first when both are due at the
        // same time: it restarts the timer), α brought up to each.
        loop {
            let cut = self.cut_due.filter(|&t| t <= now);
            let timer = self.timer_deadline.filter(|&t| t <= now);
            match (cut, timer) {
                (Some(c), t) if t.is_none_or(|t| c <= t) => {
                    self.alpha_to(c);
                    self.cut(c);
                }
                (_, Some(t)) => {
                    self.alpha_to(t);
                    self.timer_events = self.timer_events.saturating_add(1);
                    self.timer_deadline = Some(t.saturating_add(self.p.time_reset_ns()));
                    self.increase();
                    if !self.throttled {
                        return;
                    }
                }
                _ => break,
            }
        }
        self.alpha_to(now);
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
        if self.p.style == DcqcnStyle::ConnectX
            && self.cut_due.is_none()
            && self.rt >= self.max
            && self.max - self.rc < 1.0
        {
            // Back at full speed: release the limiter.
            self.rc = self.max;
            self.rt = self.max;
            self.throttled = false;
            self.phase = Phase::Unthrottled;
            self.timer_deadline = None;
            self.bytes = 0;
        } else if self.p.style == DcqcnStyle::Paper
            && self.rt >= self.max
            && self.max - self.rc < 1.0
        {
            // Back at full speed but not released: nothing is left to increase, so the
            // timer stops until the next cut (α keeps decaying; the next CNP cuts from it).
            self.rc = self.max;
            self.timer_deadline = None;
        }
    }
}

/// The engine's [`Instant`]s become the nanoseconds of the algorithm's own arithmetic (its
/// periods are grids of nanoseconds from the first CNP) here, at the boundary.
impl RateController for Dcqcn {
    fn on_cnp(&mut self, now: Instant) -> CnpVerdict {
        Dcqcn::on_cnp(self, now.as_nanos())
    }
    fn on_bytes_sent(&mut self, now: Instant, bytes: u64) {
        Dcqcn::on_bytes_sent(self, now.as_nanos(), bytes)
    }
    fn on_timer(&mut self, now: Instant) {
        Dcqcn::on_timer(self, now.as_nanos())
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Dcqcn::poll_timeout(self).map(Instant::from_nanos)
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
    fn stage_state(&self) -> (u32, u32, bool) {
        (self.timer_events, self.byte_events, self.cut_due.is_some())
    }
}

/// `x.round() as u64` for a rate (finite, at least 0). The pacer asks for the rate at
/// every frame, and `f64::round` is a call into libm on x86-64 without SSE4.1; a whole
/// rate (the line rate, where a QP without congestion sits) needs no rounding.
#[inline]
fn round_rate(x: f64) -> u64 {
    let n = x as u64;
    if n as f64 == x { n } else { x.round() as u64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1000;
    const LINE: u64 = 10_000_000_000;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn round_rate_rounds_like_f64_round() {
        for x in [
            0.0,
            0.4,
            0.5,
            1.5,
            2.5,
            1e9,
            1e9 + 0.49,
            1e9 + 0.5,
            LINE as f64 / 3.0,
            2.0 * LINE as f64 / 3.0,
            400e9 + 0.75,
        ] {
            assert_eq!(round_rate(x), x.round() as u64, "{x}");
        }
    }

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
        // The cut comes at the end of the first monitor period (4 µs), then the timer.
        assert_eq!(rp.poll_timeout(), Some(20_004 * US));
        rp.on_timer(20_004 * US);
        assert!(rp.rate_bps() < LINE);
        assert_eq!(rp.poll_timeout(), Some(20_304 * US));
    }

    /// NVIDIA (mstflint's roce_cc_ecn register, rpg_gd): "the flow rate is reduced at the
    /// beginning of the next rate_reduce_monitor_period interval"; HPCC's
    /// CheckRateDecreaseMlx does the same. A CNP inside the period is not dropped.
    #[test]
    fn a_cnp_inside_the_monitor_period_cuts_at_its_end() {
        let mut rp = Dcqcn::new(DcqcnParams::connectx(), LINE);
        assert_eq!(rp.on_cnp(100 * US), CnpVerdict::Handled);
        rp.on_timer(104 * US);
        let r = rp.rate();
        assert!(r < LINE as f64);
        // Two CNPs inside the next period: nothing changes until its end, then one cut.
        assert_eq!(rp.on_cnp(105 * US), CnpVerdict::Handled);
        assert_eq!(rp.on_cnp(106 * US), CnpVerdict::Handled);
        assert_eq!(rp.rate(), r);
        assert_eq!(rp.cut_due(), Some(108 * US));
        rp.on_timer(107 * US);
        assert_eq!(rp.rate(), r);
        rp.on_timer(108 * US);
        let r2 = rp.rate();
        assert!(r2 < r, "the deferred cut happened");
        rp.on_timer(120 * US);
        assert_eq!(rp.rate(), r2, "one cut for both CNPs");
        assert_eq!(rp.cnp_counts(), (3, 0));
    }

    /// NVIDIA's register text: α = cnp_received·g + (1 − g)·α, "dceTcpG is divided by
    /// 2^10": rp_dce_tcp_g is the gain, not the retention.
    #[test]
    fn dce_tcp_g_is_the_gain_of_the_per_period_update() {
        let mut p = DcqcnParams::connectx();
        p.rp_dce_tcp_g = 64; // g = 1/16
        p.rp_dce_tcp_rtt = 10;
        p.rp_rate_reduce_monitor_period = 0;
        p.rp_initial_alpha_value = 512;
        let g = 64.0 / 1024.0;
        let mut rp = Dcqcn::new(p, LINE);
        rp.on_cnp(0);
        // The first CNP sets α and cuts at once (M = 0) with it: f = α/2.
        assert!(close(rp.alpha(), 0.5));
        assert!(close(rp.rate(), LINE as f64 * 0.75));
        // A period without a CNP: α ← (1 − g)α.
        rp.on_timer(10 * US);
        assert!(close(rp.alpha(), 0.5 * (1.0 - g)), "{}", rp.alpha());
        // A CNP in the second period: at its end α ← g + (1 − g)α.
        rp.on_cnp(15 * US);
        rp.on_timer(20 * US);
        let want = g + (1.0 - g) * 0.5 * (1.0 - g);
        assert!(close(rp.alpha(), want), "{} vs {want}", rp.alpha());
        // Three quiet periods: three decays.
        rp.on_timer(50 * US);
        assert!(close(rp.alpha(), want * (1.0 - g).powi(3)));
    }

    /// NVIDIA: "the target rate should be updated if the transmission rate was increased
    /// due to the timer, and not only due to the byte counter": a byte-counter increase
    /// always clamps; a timer increase clamps only with rp_clamp_tgt_rate_after_time_inc.
    #[test]
    fn clamp_after_a_byte_counter_increase_and_after_a_timer_one_with_the_flag() {
        for ati in [0, 1] {
            let mut p = DcqcnParams::connectx();
            p.rp_rate_reduce_monitor_period = 0;
            p.rp_clamp_tgt_rate = 0;
            p.rp_clamp_tgt_rate_after_time_inc = ati;
            // Byte counter: Rt ← Rc whatever the flag.
            let mut rp = Dcqcn::new(p, LINE);
            rp.on_cnp(0);
            rp.on_bytes_sent(US, p.byte_reset_bytes());
            let rc = rp.rate();
            assert!(rc < rp.target());
            rp.on_cnp(2 * US);
            assert!(close(rp.target(), rc), "ati {ati}: byte increase clamps");
            // Timer: only with the flag.
            let mut rp = Dcqcn::new(p, LINE);
            rp.on_cnp(0);
            rp.on_timer(300 * US);
            let rc = rp.rate();
            let rt = rp.target();
            rp.on_cnp(301 * US);
            let want = if ati == 1 { rc } else { rt };
            assert!(close(rp.target(), want), "ati {ati}: timer increase");
        }
    }

    #[test]
    fn min_dec_fac_100_never_cuts() {
        let mut p = DcqcnParams::connectx();
        p.rp_min_dec_fac = 100;
        let mut rp = Dcqcn::new(p, LINE);
        rp.on_cnp(0);
        rp.on_cnp(10 * US);
        rp.on_timer(20 * US);
        assert_eq!(rp.rate_bps(), LINE);
    }

    /// NVIDIA: "the rate that is set for the flow when a rate limiter is allocated to it
    /// upon first CNP"; the CNP then reduces it like any other (HPCC: m_rateOnFirstCNP,
    /// then CheckRateDecreaseMlx).
    #[test]
    fn first_cnp_sets_the_rate_then_cuts() {
        let mut p = DcqcnParams::connectx();
        p.rp_rate_to_set_on_first_cnp = 2000;
        let mut rp = Dcqcn::new(p, LINE);
        rp.on_cnp(0);
        assert_eq!(
            (rp.rate_bps(), rp.target_bps()),
            (2_000_000_000, 2_000_000_000)
        );
        rp.on_timer(4 * US);
        assert!(rp.rate_bps() < 2_000_000_000, "{}", rp.rate_bps());
        assert_eq!(rp.target_bps(), 2_000_000_000);
    }

    #[test]
    fn connectx_recovers_to_unthrottled_on_timer_alone() {
        let mut rp = Dcqcn::new(DcqcnParams::connectx(), 1_000_000_000);
        rp.on_cnp(0);
        // Additive 5 Mb/s per 300 µs from ~500 Mb/s: a few hundred events at most.
        rp.on_timer(1_000_000_000);
        assert!(!rp.is_throttled());
        assert_eq!(rp.rate_bps(), 1_000_000_000);
        assert_eq!(rp.poll_timeout(), None);
        assert_eq!(rp.phase(), Phase::Unthrottled);
    }

    /// The paper has no release: back at line rate the QP stays under control, α keeps
    /// decaying, and the next CNP cuts by the decayed α/2 instead of restarting at α = 1.
    #[test]
    fn paper_profile_is_not_released_at_line_rate() {
        let line = 1_000_000_000u64;
        let mut rp = Dcqcn::new(DcqcnParams::paper(), line);
        rp.on_cnp(0);
        assert_eq!(rp.rate_bps(), line / 2);
        rp.on_timer(2_000_000_000);
        assert_eq!(rp.rate_bps(), line);
        assert!(rp.is_throttled(), "not released");
        assert_eq!(rp.poll_timeout(), None, "nothing left to increase");
        let a = rp.alpha();
        assert!(a < 0.01, "α decayed: {a}");
        rp.on_cnp(2_000_000_000);
        assert!(close(rp.rate(), line as f64 * (1.0 - a / 2.0)));
    }
}
