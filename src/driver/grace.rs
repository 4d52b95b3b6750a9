//! The poll lease's grace timer, armed only for applications that need it.
//!
//! A poll that finds completions shortens the poll lease to [`POLL_GRACE`]
//! (driver/poll.rs): the application may stop calling in now, as perftest's
//! `ib_write_lat` does (it spins on its buffer for the peer's RDMA WRITE), and the
//! sleeping driver must then watch the socket again within the grace. The grace timer
//! wakes it for that. But a timer that near costs a reprogramming of the CPU's timer
//! each time it is armed or disarmed, and on a virtual machine that is an exit to the
//! hypervisor: `timerfd_settime` of 50 µs measured 6-7 µs per call on this project's
//! 2-vCPU test VM, against 0.6 µs for a timer beyond the next tick
//! (docs/performance.md, "The round trip against its floor"). A ping-pong paid it twice
//! per completion (armed when found, disarmed by the next empty poll), on the path
//! from a received frame to its answer.
//!
//! So the timer is armed only while the application has been seen to stop polling
//! after a completion, like adaptive interrupt moderation on a NIC (ethtool's
//! adaptive-rx): the device starts arming (the safe choice); after [`QUIET_RUN`]
//! completions in a row whose timer the next empty poll disarmed unused, it stops.
//! When the driver later sleeps out a lease (it slept under one, not watching the
//! socket, and woke on the lease's end, at most `POLL_LEASE` after the application's
//! last empty poll) and the last thing the application polled was a completion, the
//! application stopped polling after it and a frame for it may have waited that long:
//! arming resumes, and the run needed to stop again doubles (up to [`MAX_RUN`]), so an
//! application that alternates pays that delay at most once per `MAX_RUN` completions.
//! A timer that fires (no empty poll within the grace: the thread may just have been
//! preempted) neither counts in the run nor resets it. While arming is off, a poll that
//! finds completions still shortens the lease; only the early wake-up is given up.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use rustix::event::Timespec;

use super::poll::POLL_GRACE;

/// Completions in a row, each followed by an empty poll, after which arming stops.
pub const QUIET_RUN: u32 = 64;
/// The longest run needed to stop arming again (it doubles each time arming resumes).
pub const MAX_RUN: u32 = 1 << 10;

/// The grace timer and its arming policy (shared by the driver and polling threads).
#[derive(Debug)]
pub(super) struct Grace {
    /// A timerfd the driver sleeps on under a lease.
    pub(super) timer: OwnedFd,
    /// The timer is armed and neither fired nor was disarmed since.
    armed: AtomicBool,
    /// Completions arm the timer.
    arming: AtomicBool,
    /// Completions in a row whose timer an empty poll disarmed unused.
    unneeded: AtomicU32,
    /// How long that run must be for arming to stop.
    run: AtomicU32,
    /// A completion shortened the lease and no empty poll has followed yet.
    found_pending: AtomicBool,
}

impl Grace {
    pub(super) fn new() -> std::io::Result<Self> {
        Ok(Grace {
            timer: rustix::time::timerfd_create(
                rustix::time::TimerfdClockId::Monotonic,
                rustix::time::TimerfdFlags::CLOEXEC | rustix::time::TimerfdFlags::NONBLOCK,
            )?,
            armed: AtomicBool::new(false),
            arming: AtomicBool::new(true),
            unneeded: AtomicU32::new(0),
            run: AtomicU32::new(QUIET_RUN),
            found_pending: AtomicBool::new(false),
        })
    }

    /// Whether completions arm the timer now (and shorten the lease: with arming off,
    /// [`super::Shared::poll_found`] leaves the lease as it is).
    pub(super) fn arming_now(&self) -> bool {
        self.arming.load(Ordering::SeqCst)
    }

    /// A poll found completions while arming is off: the lease stays, but a lapse
    /// after it ([`Grace::lease_lapsed`]) must still see that a completion was the last
    /// thing polled.
    pub(super) fn found_unarmed(&self) {
        self.found_pending.store(true, Ordering::SeqCst);
    }

    /// A poll found completions and shortened the lease.
    pub(super) fn found(&self) {
        self.found_pending.store(true, Ordering::SeqCst);
        if self.arming.load(Ordering::SeqCst) {
            self.armed.store(true, Ordering::SeqCst);
            self.set(POLL_GRACE);
        }
    }

    /// An empty poll: the application polls on. A timer the last completion armed is
    /// disarmed (the lengthened lease holds the driver off); it was not needed.
    pub(super) fn polled(&self) {
        if self.found_pending.load(Ordering::Relaxed) {
            self.found_pending.store(false, Ordering::SeqCst);
        }
        if self.armed.swap(false, Ordering::SeqCst) {
            self.set(Duration::ZERO);
            let n = self.unneeded.fetch_add(1, Ordering::SeqCst) + 1;
            if n >= self.run.load(Ordering::SeqCst) {
                self.arming.store(false, Ordering::SeqCst);
                self.unneeded.store(0, Ordering::SeqCst);
            }
        }
    }

    /// The timer fired and woke the driver: no empty poll came within the grace. That
    /// alone does not say the application stopped polling (a preempted thread polls
    /// late), so the run of unneeded timers goes on (not counting this one); only a
    /// lapsed lease ([`Grace::lease_lapsed`]) says so.
    pub(super) fn fired(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    /// The driver woke with no lease left: if a completion was the last thing the
    /// application polled (no empty poll since), it stopped polling after it while the
    /// timer was off. Arm again, and need a longer run to stop. Returns whether arming
    /// resumed.
    pub(super) fn lease_lapsed(&self) -> bool {
        if !self.found_pending.swap(false, Ordering::SeqCst) {
            return false;
        }
        if self.arming.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.unneeded.store(0, Ordering::SeqCst);
        let r = self.run.load(Ordering::SeqCst);
        self.run
            .store(r.saturating_mul(2).min(MAX_RUN), Ordering::SeqCst);
        true
    }

    /// Whether completions arm the timer now.
    #[cfg(test)]
    pub(super) fn arming(&self) -> bool {
        self.arming.load(Ordering::SeqCst)
    }

    /// Whether the timer is armed (and has not fired or been disarmed).
    #[cfg(test)]
    pub(super) fn armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst)
    }

    /// The run of unneeded timers that stops arming.
    #[cfg(test)]
    pub(super) fn run(&self) -> u32 {
        self.run.load(Ordering::SeqCst)
    }

    /// Arm the timer to fire `after` from now; zero disarms it.
    fn set(&self, after: Duration) {
        let t = rustix::time::Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: Timespec {
                tv_sec: 0,
                tv_nsec: after.as_nanos() as i64,
            },
        };
        // Only fails on a bad descriptor or value, neither possible here (`after` is
        // below a second).
        let _ = rustix::time::timerfd_settime(
            &self.timer,
            rustix::time::TimerfdTimerFlags::empty(),
            &t,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the timer is counting down (it reads zero once it fired too, 50 µs
    /// after arming: `armed` says whether it was armed).
    fn running(g: &Grace) -> bool {
        let t = rustix::time::timerfd_gettime(&g.timer).unwrap();
        t.it_value.tv_sec != 0 || t.it_value.tv_nsec != 0
    }

    /// An application that always polls on after a completion (a ping-pong, a
    /// bandwidth test) stops paying for the timer after a run of them; one that then
    /// stops polling after a completion makes the driver arm it again, and the run
    /// needed to stop doubles. (The policy alone, without a driver thread that could
    /// see the timer fire on a slow machine.)
    #[test]
    fn the_timer_is_armed_only_while_the_application_needs_it() {
        let g = Grace::new().unwrap();
        for i in 0..QUIET_RUN {
            assert!(g.arming(), "still arming after {i} unneeded timers");
            g.found();
            assert!(g.armed());
            g.polled();
            assert!(!g.armed() && !running(&g), "an empty poll disarms");
        }
        assert!(!g.arming(), "a run of unneeded timers stops the arming");
        // A completion now arms nothing.
        g.found();
        assert!(!g.armed());
        assert!(!running(&g));
        // The lease runs out with that completion the last thing polled: the
        // application stopped polling after it (ib_write_lat spins on its memory).
        assert!(g.lease_lapsed(), "arming resumes");
        assert!(g.arming());
        assert_eq!(g.run(), 2 * QUIET_RUN);
        assert!(!g.lease_lapsed(), "once");
        g.found();
        assert!(g.armed());
        // A lapse after an empty poll says nothing: the application polled on.
        g.polled();
        assert!(!g.lease_lapsed());
        // A timer that fired (a late poll) neither counts nor resets the run.
        g.found();
        g.fired();
        assert!(!g.armed());
        g.polled();
        for _ in 0..2 * QUIET_RUN - 2 {
            g.found();
            g.polled();
        }
        assert!(g.arming(), "one short of the doubled run");
        g.found();
        g.polled();
        assert!(!g.arming());
        // The run doubles at each resumption, up to its bound.
        g.run.store(MAX_RUN / 2 + 1, Ordering::SeqCst);
        g.arming.store(false, Ordering::SeqCst);
        g.found();
        assert!(g.lease_lapsed());
        assert_eq!(g.run(), MAX_RUN);
    }
}
