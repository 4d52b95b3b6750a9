//! A token-bucket pacer per QP: "may this frame of N bytes leave at `now`, else when?".
//!
//! Contract: sans-IO and exact; times are engine [`Instant`]s. Tokens are kept as integers in units of 10⁻⁹ bit
//! (rate in bit/s × time in ns), so no rounding drifts over a long run. The bucket holds at
//! most `burst` bytes and starts full.
//! - [`Pacer::next_send_time`] answers when a frame of `len` bytes may leave: `now` if the
//!   bucket holds `min(len, burst)` bytes, else the first nanosecond it will.
//! - [`Pacer::consume`] takes the frame's bytes; the bucket may go into debt when a frame is
//!   larger than the burst, which later frames repay.
//! - [`Pacer::set_rate`] changes the rate at `now`: tokens earned so far are credited at
//!   the old rate, later ones at the new, so a cut or a raise from the reaction point
//!   applies to the very next frame.
//!
//! Guarantee (checked by tests/congestion.rs): a sender that only sends when allowed sends,
//! over any interval starting at creation, at most `rate × t + max(burst, largest frame)`
//! bytes, and a sender that always sends as soon as allowed sends at least
//! `rate × t − largest frame` bytes.
//!
//! Burst size: the caller picks it. It must cover what the driver sends per wake-up (a
//! burst of 0 would pace every frame individually); [`Pacer::DEFAULT_BURST`] is 16 KiB —
//! four 4 KiB-MTU frames, the queue a single QP may add at the bottleneck beyond its rate.

use crate::proto::time::Instant;

/// Bytes to token units (10⁻⁹ bit).
const UNITS_PER_BYTE: i128 = 8 * 1_000_000_000;

/// A token bucket.
#[derive(Clone, Debug)]
pub struct Pacer {
    rate_bps: u64,
    burst: u64,
    /// Tokens at `last`, in 10⁻⁹ bit; negative while in debt.
    tokens: i128,
    last: Instant,
}

impl Pacer {
    /// The default bucket size in bytes.
    pub const DEFAULT_BURST: u64 = 16 * 1024;

    /// A full bucket of `burst_bytes` filling at `rate_bps`, starting at `now`.
    pub fn new(now: Instant, rate_bps: u64, burst_bytes: u64) -> Self {
        Pacer {
            rate_bps,
            burst: burst_bytes,
            tokens: i128::from(burst_bytes) * UNITS_PER_BYTE,
            last: now,
        }
    }

    /// The current rate in bit/s.
    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }

    /// The bucket size in bytes.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    fn cap(&self) -> i128 {
        i128::from(self.burst) * UNITS_PER_BYTE
    }

    fn tokens_at(&self, now: Instant) -> i128 {
        let dt = (now - self.last).as_nanos();
        let earned = i128::from(self.rate_bps) * dt as i128;
        (self.tokens + earned).min(self.cap().max(self.tokens))
    }

    /// Whole bytes in the bucket at `now` (negative while in debt).
    pub fn available(&self, now: Instant) -> i64 {
        (self.tokens_at(now) / UNITS_PER_BYTE) as i64
    }

    fn refill(&mut self, now: Instant) {
        if now > self.last {
            self.tokens = self.tokens_at(now);
            self.last = now;
        }
    }

    /// Change the rate from `now` on.
    pub fn set_rate(&mut self, now: Instant, rate_bps: u64) {
        self.refill(now);
        self.rate_bps = rate_bps;
    }

    /// When a frame of `len` bytes may leave: `now` if it may leave now, otherwise the
    /// first time at which it may; [`Instant::MAX`] at rate 0.
    pub fn next_send_time(&self, now: Instant, len: usize) -> Instant {
        let need = i128::from((len as u64).min(self.burst)) * UNITS_PER_BYTE;
        let have = self.tokens_at(now);
        if have >= need {
            return now;
        }
        if self.rate_bps == 0 {
            return Instant::MAX;
        }
        let rate = i128::from(self.rate_bps);
        let wait = (need - have + rate - 1) / rate;
        // `wait` is positive here and saturates with the addition.
        now + std::time::Duration::from_nanos(u64::try_from(wait).unwrap_or(u64::MAX))
    }

    /// May a frame of `len` bytes leave at `now`?
    pub fn may_send(&self, now: Instant, len: usize) -> bool {
        self.next_send_time(now, len) <= now
    }

    /// A frame of `len` bytes left at `now`.
    pub fn consume(&mut self, now: Instant, len: usize) {
        self.refill(now);
        self.tokens -= i128::from(len as u64) * UNITS_PER_BYTE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    #[test]
    fn full_bucket_then_paced() {
        // 8 Mb/s = 1 byte per µs.
        let mut p = Pacer::new(t(0), 8_000_000, 1000);
        assert!(p.may_send(t(0), 1000));
        p.consume(t(0), 1000);
        assert_eq!(p.next_send_time(t(0), 100), t(100_000));
        assert!(!p.may_send(t(99_999), 100));
        assert!(p.may_send(t(100_000), 100));
        // The bucket never holds more than the burst.
        assert_eq!(p.available(t(10_000_000_000)), 1000);
    }

    #[test]
    fn frames_larger_than_the_burst_go_into_debt() {
        let mut p = Pacer::new(t(0), 8_000_000, 1000);
        assert!(p.may_send(t(0), 4000));
        p.consume(t(0), 4000);
        assert_eq!(p.available(t(0)), -3000);
        // 3000 µs to repay, then 100 more for the next 100 bytes.
        assert_eq!(p.next_send_time(t(0), 100), t(3_100_000));
    }

    #[test]
    fn rate_change_applies_from_now() {
        let mut p = Pacer::new(t(0), 8_000_000, 1000);
        p.consume(t(0), 1000);
        p.set_rate(t(50_000), 16_000_000); // 50 bytes earned at the old rate
        assert_eq!(p.next_send_time(t(50_000), 150), t(100_000));
        p.set_rate(t(50_000), 0);
        assert_eq!(p.next_send_time(t(50_000), 150), Instant::MAX);
    }
}
