//! Transport timer durations (IBTA §9.7.6, table 45) and retry budgets.
//!
//! Contract: the engine never reads a clock. Every deadline is `now + duration` computed
//! from the [`Instant`](super::Instant) the caller passed in, and the caller learns the
//! earliest deadline from `Rnic::poll_timeout`.

use std::time::Duration;

/// The local ACK timeout of IBTA §9.7.6 / §11.2: 4.096 µs × 2^timeout; 0 means
/// "infinite" (no retransmission timer).
pub const fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        None
    } else {
        // 4096 ns × 2^t, t ≤ 31: at most 8.8e12 ns, no overflow.
        Some(Duration::from_nanos(4096u64 << (timeout & 0x1f)))
    }
}

/// The RNR NAK timer of IBTA table 45 for a 5-bit timer code (the wire layer's table).
pub const fn rnr_timer(code: u8) -> Duration {
    Duration::from_nanos(crate::wire::rnr_timer_ns(code))
}

/// `rnr_retry` and `retry_cnt` counters; rnr_retry 7 means "retry forever" (IBTA
/// §9.7.5; retry_cnt 7 means seven retries, as on hardware, unlike rxe).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetryBudget {
    pub retry_left: u8,
    pub rnr_left: u8,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeout_table() {
        assert_eq!(local_ack_timeout(0), None);
        assert_eq!(local_ack_timeout(1), Some(Duration::from_nanos(8192)));
        // 14 → 67.1 ms, the common setting.
        assert_eq!(
            local_ack_timeout(14),
            Some(Duration::from_nanos(67_108_864))
        );
        assert_eq!(rnr_timer(12), Duration::from_micros(640));
    }
}
