//! Engine time: one [`Instant`] type for every point in time the engine
//! takes or gives back, and `std::time::Duration` for every span.
//!
//! Contract:
//! - The engine never reads a clock. An [`Instant`] is a point on the caller's clock (a
//!   monotonic clock in the driver, virtual time in the simulator and the tests), made with
//!   [`Instant::from_nanos`]; the engine only compares instants and adds durations to them.
//! - Arithmetic saturates: `instant + duration` stops at [`Instant::MAX`] (a deadline
//!   "never" in practice), `later - earlier` is zero when `earlier` is in fact later. So no
//!   input from a caller (a clock that steps back, a huge timer value) panics or wraps.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};
pub use std::time::Duration;

/// A point in time on the caller's clock, in nanoseconds since the clock's origin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The clock's origin (where the simulator and most tests start).
    pub const ZERO: Instant = Instant(0);
    /// The last representable instant (≈ 584 years after the origin).
    pub const MAX: Instant = Instant(u64::MAX);

    /// The instant `ns` nanoseconds after the clock's origin.
    #[must_use]
    pub const fn from_nanos(ns: u64) -> Self {
        Instant(ns)
    }

    /// Nanoseconds since the clock's origin (for logs, traces and captures).
    #[must_use]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self + d`, or [`Instant::MAX`] when that is past the end of the clock.
    #[must_use]
    pub const fn saturating_add(self, d: Duration) -> Self {
        Instant(self.0.saturating_add(duration_nanos(d)))
    }

    /// `self - d`, or [`Instant::ZERO`] when that is before the origin.
    #[must_use]
    pub const fn saturating_sub(self, d: Duration) -> Self {
        Instant(self.0.saturating_sub(duration_nanos(d)))
    }

    /// The time from `earlier` to `self`; zero when `earlier` is not earlier.
    #[must_use]
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// A duration in whole nanoseconds, saturating at `u64::MAX` (≈ 584 years).
#[must_use]
pub const fn duration_nanos(d: Duration) -> u64 {
    let n = d.as_nanos();
    if n > u64::MAX as u128 {
        u64::MAX
    } else {
        n as u64
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    /// Saturating (see the module contract).
    fn add(self, d: Duration) -> Instant {
        self.saturating_add(d)
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = self.saturating_add(d);
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    /// Saturating (see the module contract).
    fn sub(self, d: Duration) -> Instant {
        self.saturating_sub(d)
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturating: zero when `rhs` is later than `self`.
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        let t = Instant::from_nanos(10);
        assert_eq!(t + Duration::from_nanos(5), Instant::from_nanos(15));
        assert_eq!(Instant::MAX + Duration::from_nanos(1), Instant::MAX);
        assert_eq!(
            Instant::from_nanos(u64::MAX - 1) + Duration::MAX,
            Instant::MAX
        );
        assert_eq!(t - Duration::from_nanos(11), Instant::ZERO);
        assert_eq!(Instant::from_nanos(3) - t, Duration::ZERO);
        assert_eq!(t - Instant::from_nanos(4), Duration::from_nanos(6));
        let mut u = t;
        u += Duration::from_micros(1);
        assert_eq!(u.as_nanos(), 1010);
        assert_eq!(duration_nanos(Duration::MAX), u64::MAX);
        assert_eq!(format!("{u}"), "1010ns");
    }

    #[test]
    fn instants_order_like_their_nanoseconds() {
        let mut v = [5u64, 1, 9, 0].map(Instant::from_nanos);
        v.sort();
        assert_eq!(v.map(Instant::as_nanos), [0, 1, 5, 9]);
        assert!(Instant::ZERO < Instant::MAX);
    }
}
