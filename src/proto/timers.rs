//! Transport timer durations (IBTA §9.7.6, table 45) and retry budgets.
//!
//! Contract: the engine never reads a clock. Every deadline is `now + duration` computed
//! from the [`Instant`] the caller passed in, and the caller learns the
//! earliest deadline from `Rnic::poll_timeout`.

use std::time::Duration;

use super::time::Instant;

/// The local ACK timeout of IBTA §9.7.6 / §11.2: 4.096 µs × 2^timeout; 0 means
/// "infinite" (no retransmission timer).
pub const fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    match local_ack_timeout_ns(timeout) {
        Some(ns) => Some(Duration::from_nanos(ns)),
        None => None,
    }
}

/// [`local_ack_timeout`] in nanoseconds: what the per-packet AckReq pacing compares
/// against (`Requester::paced_ack_every`), without a round trip through `Duration`.
pub const fn local_ack_timeout_ns(timeout: u8) -> Option<u64> {
    if timeout == 0 {
        None
    } else {
        // 4096 ns × 2^t, t ≤ 31: at most 8.8e12 ns, no overflow.
        Some(4096u64 << (timeout & 0x1f))
    }
}

/// The RNR NAK timer of IBTA table 45 for a 5-bit timer code (the wire layer's table).
pub const fn rnr_timer(code: u8) -> Duration {
    Duration::from_nanos(crate::wire::rnr_timer_ns(code))
}

/// The kinds of timer a QP runs, all in one table per QP. ACKs need none: consecutive plain
/// ACKs coalesce in the responder's queue and leave at the next transmit
/// (`responder::push_ack`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// The local ACK timeout (§9.7.6): armed when a request leaves with none running,
    /// restarted on progress, stopped while an RNR wait runs.
    Retransmit,
    /// Sending suspended after an RNR NAK until the responder's RNR timer ran out
    /// (§9.7.5, table 45).
    RnrWait,
    /// The congestion control's next event for the QP (`RateController::poll_timeout`):
    /// for DCQCN the rate-increase timer (`rp_time_reset`) or the cut owed at the end of
    /// the rate-reduce monitor period, whichever is first. α needs no timer of its own: it
    /// is brought up to date at each of these events and at each input
    /// (`congestion::dcqcn`).
    Rate,
    /// The DCQCN pacer refused the QP's next frame: when its bucket lets that frame go.
    Pacer,
}

impl Timer {
    const COUNT: usize = 4;
    /// The transport's own timers (§9.7.6): what `completer::handle_timeout` runs.
    pub const TRANSPORT: [Timer; 2] = [Timer::Retransmit, Timer::RnrWait];
    /// The congestion control's timers: what `CongestionControl::handle_qp_timeout` runs.
    pub const CONGESTION: [Timer; 2] = [Timer::Rate, Timer::Pacer];
}

/// One QP's timers: a deadline per [`Timer`] kind, the only place deadlines are written
/// (quinn-proto's `TimerTable` is the model). The device's scheduler orders QPs by
/// [`TimerTable::next_timeout`], so a QP is visited when one of its timers is due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerTable {
    at: [Option<Instant>; Timer::COUNT],
    /// The earliest of `at`, kept by every write: read twice per packet
    /// ([`TimerTable::next_timeout`]), written far less often.
    next: Option<Instant>,
}

impl TimerTable {
    /// Run `t` for `d` from `now`; `None` (an infinite timeout) stops it.
    pub fn arm(&mut self, t: Timer, now: Instant, d: Option<Duration>) {
        self.at[t as usize] = d.map(|d| now + d);
        self.next = self.earliest();
    }

    /// Run `t` until `at` (`None` stops it): for deadlines another module computes on a
    /// grid of its own (the congestion control's periods), not as `now + duration`.
    pub fn set(&mut self, t: Timer, at: Option<Instant>) {
        if self.at[t as usize] != at {
            self.at[t as usize] = at;
            self.next = self.earliest();
        }
    }

    /// Stop `t`.
    pub fn stop(&mut self, t: Timer) {
        if self.at[t as usize].is_some() {
            self.at[t as usize] = None;
            self.next = self.earliest();
        }
    }

    /// Stop the transport timers ([`Timer::TRANSPORT`]: a QP leaving RTS/SQD, or reset).
    /// The congestion control's stay: its state outlives the QP's state changes.
    pub fn stop_transport(&mut self) {
        for t in Timer::TRANSPORT {
            self.stop(t);
        }
    }

    /// When `t` fires, if it runs.
    #[must_use]
    pub fn get(&self, t: Timer) -> Option<Instant> {
        self.at[t as usize]
    }

    /// Whether `t` runs.
    #[must_use]
    pub fn is_armed(&self, t: Timer) -> bool {
        self.at[t as usize].is_some()
    }

    /// Whether `t` runs and is due at `now`.
    #[must_use]
    pub fn is_expired(&self, t: Timer, now: Instant) -> bool {
        self.at[t as usize].is_some_and(|at| at <= now)
    }

    /// Whether any of `ts` runs and is due at `now`.
    #[must_use]
    pub fn any_expired(&self, ts: &[Timer], now: Instant) -> bool {
        ts.iter().any(|&t| self.is_expired(t, now))
    }

    /// Stop `t` if it is due at `now`; whether it was.
    #[must_use]
    pub fn expire(&mut self, t: Timer, now: Instant) -> bool {
        let due = self.is_expired(t, now);
        if due {
            self.stop(t);
        }
        due
    }

    /// The earliest deadline of all timers.
    #[must_use]
    #[inline]
    pub fn next_timeout(&self) -> Option<Instant> {
        self.next
    }

    /// The earliest deadline of `at` (what `next` keeps).
    fn earliest(&self) -> Option<Instant> {
        self.at.iter().flatten().min().copied()
    }
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
        for t in 0..=u8::MAX {
            assert_eq!(
                local_ack_timeout_ns(t),
                local_ack_timeout(t).map(|d| d.as_nanos() as u64)
            );
        }
    }

    #[test]
    fn a_timer_table_keeps_one_deadline_per_kind() {
        let t0 = Instant::from_nanos(1000);
        let mut tt = TimerTable::default();
        assert_eq!(tt.next_timeout(), None);
        tt.arm(Timer::Retransmit, t0, local_ack_timeout(1));
        tt.arm(Timer::RnrWait, t0, Some(Duration::from_nanos(10)));
        assert_eq!(tt.next_timeout(), Some(Instant::from_nanos(1010)));
        assert!(!tt.is_expired(Timer::RnrWait, Instant::from_nanos(1009)));
        assert!(tt.expire(Timer::RnrWait, Instant::from_nanos(1010)));
        assert!(!tt.is_armed(Timer::RnrWait), "expire stops it");
        assert!(!tt.expire(Timer::RnrWait, Instant::MAX), "once");
        assert_eq!(tt.next_timeout(), Some(Instant::from_nanos(1000 + 8192)));
        // Re-arming replaces the deadline; an infinite timeout (0) stops the timer.
        tt.arm(
            Timer::Retransmit,
            Instant::from_nanos(5000),
            local_ack_timeout(1),
        );
        assert_eq!(
            tt.get(Timer::Retransmit),
            Some(Instant::from_nanos(5000 + 8192))
        );
        tt.arm(Timer::Retransmit, t0, local_ack_timeout(0));
        assert_eq!(tt.next_timeout(), None);
        tt.arm(Timer::RnrWait, Instant::MAX, Some(Duration::MAX));
        assert_eq!(tt.get(Timer::RnrWait), Some(Instant::MAX), "saturates");
        tt.stop_transport();
        assert_eq!(tt, TimerTable::default());
    }

    #[test]
    fn congestion_timers_share_the_table_and_outlive_a_transport_stop() {
        let mut tt = TimerTable::default();
        tt.arm(
            Timer::Retransmit,
            Instant::ZERO,
            Some(Duration::from_nanos(500)),
        );
        tt.set(Timer::Rate, Some(Instant::from_nanos(300)));
        tt.set(Timer::Pacer, Some(Instant::from_nanos(400)));
        assert_eq!(tt.next_timeout(), Some(Instant::from_nanos(300)));
        let now = Instant::from_nanos(350);
        assert!(tt.any_expired(&Timer::CONGESTION, now));
        assert!(!tt.any_expired(&Timer::TRANSPORT, now));
        // A QP leaving RTS stops its transport timers only.
        tt.stop_transport();
        assert_eq!(tt.get(Timer::Retransmit), None);
        assert_eq!(tt.next_timeout(), Some(Instant::from_nanos(300)));
        tt.set(Timer::Rate, None);
        assert_eq!(tt.next_timeout(), Some(Instant::from_nanos(400)));
    }

    /// The kept earliest deadline is the earliest of the four after any sequence of
    /// writes (arm, set, stop, expire, stop_transport).
    #[test]
    fn the_kept_earliest_deadline_follows_every_write() {
        let kinds = [Timer::Retransmit, Timer::RnrWait, Timer::Rate, Timer::Pacer];
        let mut tt = TimerTable::default();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let t = kinds[(x % 4) as usize];
            let at = Instant::from_nanos((x >> 8) % 5000);
            match (x >> 4) % 6 {
                0 => tt.arm(t, at, Some(Duration::from_nanos((x >> 20) % 3000))),
                1 => tt.arm(t, at, None),
                2 => tt.set(t, Some(at)),
                3 => tt.stop(t),
                4 => {
                    let _ = tt.expire(t, at);
                }
                _ => tt.stop_transport(),
            }
            let want = kinds.iter().filter_map(|&k| tt.get(k)).min();
            assert_eq!(tt.next_timeout(), want);
        }
    }
}
