//! Progress on whichever thread calls in: the driver thread, or an application thread
//! that posts work (the doorbell) or polls a completion queue (busy polling), like a
//! user-space RDMA provider whose `ibv_post_send` rings the doorbell and whose
//! `ibv_poll_cq` reaps the hardware queues on the caller's thread.
//!
//! Contract:
//! - The port (frame I/O, transmit buffers, refused frames, the fault injector) lives
//!   behind its own `Mutex` in [`Shared`]; one `Port::step` at a time runs, on any
//!   thread. Lock order: port, then engine; nothing locks the port while holding the
//!   engine.
//! - A step is one iteration of the old driver loop: receive a batch into `handle_frame`
//!   (the fault injector drops before the engine sees them), run due timers, drain
//!   `poll_transmit`, unlock the engine (which signals completion waiters if the step
//!   added completions, see [`super::EngineGuard`]), send, kick the port until its
//!   transmit ring drains.
//! - Application threads only `try_lock` the port: when another thread is stepping, that
//!   thread (or the driver, woken through the eventfd) makes the progress instead, so a
//!   caller never waits behind another's system calls.
//! - After an application step the driver is woken only when it has something to do
//!   that it would otherwise miss: work left over (a full batch, refused frames, frames
//!   still on the transmit ring) or an engine deadline earlier than the time the sleeping
//!   driver set itself to wake. A ping-pong therefore costs no thread wake-up at all.
//! - Busy polling takes a lease ([`POLL_LEASE`]): while it runs, the sleeping driver does
//!   not watch the socket (the polling thread reads the receive ring), so a received
//!   frame does not wake a second thread on a machine with few cores. The driver wakes
//!   when the lease ends, and takes over at once when a thread starts waiting for a
//!   completion ([`Shared::wait_cq`] ends the lease). Timers still wake the driver.
//! - A lease lasts only while the polling does. A poll that finds completions (the
//!   application got what it waited for and may stop calling in: perftest's
//!   `ib_write_lat` next spins on its buffer, where only a remote RDMA WRITE it never
//!   polls for lands) shortens the lease to [`POLL_GRACE`] and arms the driver's grace
//!   timer ([`Shared::poll_found`]); the next empty poll lengthens it again and disarms
//!   the timer (left armed, the timer woke the driver once per completion whenever the
//!   round trip exceeded the grace: on an idle VM that doubled rc-pingpong's round
//!   trip). An application that stops polling leaves the socket to the driver within
//!   the grace. Arming and disarming a timer that near costs a hypervisor exit each on a
//!   VM, so the timer is armed only while the application is seen to need it
//!   (driver/grace.rs): after a run of completions each followed by an empty poll (a
//!   ping-pong, a bandwidth test) a completion costs no system call at all; an
//!   application that then stops polling after one is seen when the lease runs out
//!   (at most [`POLL_LEASE`] later), and arming resumes.
//! - An empty poll that would find nothing skips its step and the engine lock
//!   (`Port::quiet`): nothing on the port's receive ring (`FrameIo::rx_pending`),
//!   nothing on its way out (`FrameIo::tx_pending`, no backlog, the last step did not
//!   fill a batch), no timer due (the deadline each step caches in `Shared`), and no
//!   engine lock outside a step since the last step began (`Shared::work`, set by every
//!   verb when it releases the engine). A poll reads the clock once, for the lease and
//!   the step.
//! - The doorbell is rung only on an idle send queue of an idle device, no QP with a
//!   timer armed ([`Shared::post_send_ringing`], `verbs::Qp::post_send`); behind
//!   outstanding work, on this QP or on others, the driver is kicked and sends whole
//!   batches, as a stream of small messages, or one message on each of many QPs, would
//!   otherwise cost one `sendto` each. When the port is free the work request is posted
//!   under the engine lock of the step that sends it (`Port::step_with`), and a busy
//!   poll's step takes its CQ's completions under its own lock too: one engine lock per
//!   message on each side instead of two.
//! - [`Shared::wait_cq_receiving`] lets one thread sleep on the socket and receive on its
//!   own thread (request/response exchanges); it takes the poll lease when it returns.
//! - Deferred ACKs. A step on a polling thread ([`Shared::poll_progress`], or the socket
//!   waiter) that produced only plain ACKs (and ran no timer) puts them on the port's
//!   transmit ring without the kick: a request/response application answers right after
//!   the completion it polls, and its doorbell then pushes the ACK and the answer out in
//!   one `sendto` (copy-mode AF_XDP runs the whole veth path inside it) instead of two.
//!   An ACK may be delayed and coalesced, never dropped (IBTA vol. 1 §9.7.5, coalesced
//!   ACKs: a response acknowledges every earlier PSN; the requester waits up to its local
//!   ACK timeout, §9.7.6, before it resends).
//!   The bound: the deferred ACKs leave with the next push of any thread, that is the
//!   next doorbell, the next poll that finds its CQ empty ([`Shared::flush_deferred`]),
//!   the socket waiter before it sleeps, or the driver thread's next step, which comes
//!   at the latest when the poll lease ends: at most [`POLL_LEASE`] (2 ms, 3 % of the
//!   67 ms local ACK timeout ibv_rc_pingpong and perftest use), the same delay a leased
//!   port already adds to a frame that arrives after the application stopped polling.
//!   NAKs, RNR NAKs, READ and atomic responses, CNPs, requests and whatever a timer
//!   produced are never deferred (they leave at once, pushing deferred ACKs with them).

use std::sync::TryLockError;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rustix::event::{PollFd, PollFlags, Timespec, poll};

use super::{DriverOptions, MAX_KICKS, STRIDE, Shared};
use crate::driver::tap::{RxFate, Tap, handle_frame_tapped};
use crate::io::frame::{BATCH, FrameIo};
use crate::proto::{Cq, Instant as EngineTime, SendWr, TxReason, VerbsError, WorkCompletion};
use crate::wire::Qpn;

/// How long one busy poll keeps the driver from watching the socket. Long compared with
/// a round trip (tens of µs), short compared with the local ACK timeout (67 ms for
/// ibv_rc_pingpong's `timeout 14`), so an application that stops polling delays a
/// passive side's answer by at most this much.
pub const POLL_LEASE: Duration = Duration::from_millis(2);

/// How long after a poll that found completions the lease lasts when no empty poll
/// follows ([`Shared::poll_found`]): longer than an application takes to post its
/// answer and poll again, short beside a round trip through a sleeping driver.
pub const POLL_GRACE: Duration = Duration::from_micros(50);

/// Transmit buffers: `BATCH` slots of `STRIDE` bytes, each 64-byte aligned.
pub(super) struct TxBufs {
    mem: Vec<u8>,
    off: usize,
    pub(super) lens: Vec<usize>,
}

impl TxBufs {
    pub(super) fn new() -> Self {
        let mem = vec![0u8; BATCH * STRIDE + 64];
        let off = mem.as_ptr().align_offset(64).min(64);
        TxBufs {
            mem,
            off,
            lens: Vec::with_capacity(BATCH),
        }
    }
    pub(super) fn slot(&mut self, i: usize) -> &mut [u8] {
        let at = self.off + i * STRIDE;
        &mut self.mem[at..at + STRIDE]
    }
    /// The filled slots as frames, in `refs` (on the caller's stack: no allocation per
    /// step); returns them.
    fn frames<'a>(&'a self, refs: &'a mut [&'a [u8]; BATCH]) -> &'a [&'a [u8]] {
        for (i, &l) in self.lens.iter().enumerate() {
            let at = self.off + i * STRIDE;
            refs[i] = &self.mem[at..at + l];
        }
        &refs[..self.lens.len()]
    }
}

/// The frame I/O side of a device, owned by whichever thread steps.
pub(super) struct Port {
    pub(super) io: Box<dyn FrameIo>,
    bufs: TxBufs,
    /// Frames the port refused, sent before anything new.
    backlog: Vec<Vec<u8>>,
    rng: ChaCha8Rng,
    rx_drop: f64,
    /// Fault injection: the fraction of received ECN-capable frames marked CE before the
    /// engine sees them (`DriverOptions::rx_ce_mark`), in this copy.
    rx_ce_mark: f64,
    ce_buf: Vec<u8>,
    /// The capture tap (`--pcap`): every frame sent and received, on whichever thread
    /// steps; frames are handed to its writer thread once per step.
    pub(super) tap: Option<Tap>,
    /// Why each frame of `bufs` was sent (kept only with a capture tap).
    reasons: Vec<TxReason>,
    /// The last step filled a whole batch: the engine may have more to send.
    more: bool,
    /// The time of the last step: a later step never runs the engine at an earlier
    /// time, whichever thread read the clock when.
    last_now: EngineTime,
}

/// Who runs a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stepper {
    /// The driver thread; when the step finds nothing to do it announces its sleep
    /// (under the engine lock), to wake at the engine's deadline or `wake_limit`
    /// (nanoseconds since the epoch), whichever is first.
    Driver { wake_limit: EngineTime },
    /// An application thread posting work (the doorbell).
    App,
    /// An application thread polling a CQ that was empty: ACKs it produces are deferred.
    Poll,
    /// The thread asleep on the socket in [`Shared::wait_cq_receiving`]: it looks at its
    /// CQ right after the step, so the step need not signal it; ACKs are deferred.
    Waiter,
}

/// What a step did and left.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Step {
    /// Nothing received, nothing refused, less than a full batch produced: the engine
    /// has nothing more to send right now.
    pub(super) idle: bool,
    /// The port refused frames (they wait in the backlog).
    pub(super) stalled: bool,
    /// The engine filled a whole batch: it may have more to send.
    pub(super) full: bool,
    /// Frames still on the port's transmit ring.
    pub(super) in_flight: u32,
    /// The engine's next deadline after the step.
    pub(super) deadline: Option<EngineTime>,
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("backlog", &self.backlog.len())
            .field("rx_drop", &self.rx_drop)
            .finish_non_exhaustive()
    }
}

impl Port {
    pub(super) fn new(io: Box<dyn FrameIo>, opts: &DriverOptions, tap: Option<Tap>) -> Port {
        Port {
            io,
            bufs: TxBufs::new(),
            backlog: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(opts.seed),
            rx_drop: opts.rx_drop,
            rx_ce_mark: opts.rx_ce_mark,
            ce_buf: Vec::new(),
            tap,
            reasons: Vec::with_capacity(BATCH),
            more: false,
            last_now: EngineTime::ZERO,
        }
    }

    /// Whether a step at `now` would find nothing to do: no verb touched the engine
    /// since the last step began ([`Shared::work`]), the last step left nothing to send
    /// (no full batch, no backlog, nothing on the port's transmit side), no timer is due
    /// and the port has no frame to receive. Decided without the engine lock, so an
    /// empty busy poll costs a few atomic loads and ring reads.
    ///
    /// No wake-up is lost: a verb marks `work` when it releases the engine, before its
    /// doorbell tries the port; if this look came first, the doorbell finds the port
    /// taken and kicks the driver (as when any other thread steps), and the next poll
    /// sees the flag. A frame that lands after the look is seen by the next poll, or by
    /// the driver when the lease ends.
    pub(super) fn quiet(&mut self, shared: &Shared, now: EngineTime) -> bool {
        !shared.work.load(Ordering::SeqCst)
            && !self.more
            && self.backlog.is_empty()
            && now.max(self.last_now).as_nanos() < shared.next_deadline.load(Ordering::SeqCst)
            && !self.io.tx_pending()
            && !self.io.rx_pending()
    }

    /// One round of progress at `now` (on the engine's clock: since the driver's epoch).
    pub(super) fn step(&mut self, shared: &Shared, now: EngineTime, who: Stepper) -> Step {
        self.step_with(shared, Some(now), who, |_| true, |_| {})
            .expect("a step whose prelude goes on always runs")
    }

    /// [`Port::step`] with the caller's own work under the step's engine lock, so that a
    /// verb and the step it leads to cost one lock, not two: `pre` runs first (before
    /// anything is received; `false` ends the step there, with nothing else done, and
    /// the engine marked as worked on like any verb's lock does), `post` last (after the
    /// transmit batch was built, before the lock is released). `None` when `pre` ended it.
    /// Without `now`, the clock is read once `pre` let the step go on (a post that ends
    /// the step, behind outstanding work, reads no clock).
    pub(super) fn step_with(
        &mut self,
        shared: &Shared,
        now: Option<EngineTime>,
        who: Stepper,
        pre: impl FnOnce(&mut super::Engine) -> bool,
        post: impl FnOnce(&mut super::Engine),
    ) -> Option<Step> {
        // Before the engine lock: whatever a verb does after this marks the flag again.
        shared.work.store(false, Ordering::SeqCst);
        // Completions the step adds wake their waiters when the lock is released
        // (`EngineGuard`), the socket waiter's own step excepted: it looks next.
        let mut g = shared.lock_as(who != Stepper::Waiter, false);
        if !pre(&mut g) {
            // What `pre` did is left to a later step, which must not be skipped as
            // quiet: the flag a verb's own lock would have set.
            shared.work.store(true, Ordering::SeqCst);
            return None;
        }
        let now = now.unwrap_or_else(|| shared.now()).max(self.last_now);
        self.last_now = now;
        let e = &mut *g;
        match who {
            Stepper::Driver { .. } => e.stats.iterations += 1,
            Stepper::App | Stepper::Poll | Stepper::Waiter => e.stats.app_steps += 1,
        }
        let ts = self.tap.as_ref().map_or(0, |t| {
            t.timestamp(shared.epoch + Duration::from_nanos(now.as_nanos()))
        });
        let rx = self.receive_batch(e, now, ts);
        let mut timers = false;
        if e.rnic.poll_timeout().is_some_and(|t| t <= now) {
            e.rnic.handle_timeout(now);
            timers = true;
        }
        let only_acks = self.build_transmit_batch(e, now);
        let out = self.bufs.lens.len();
        e.stats.frames_out += out as u64;
        if let Stepper::Driver { .. } = who {
            e.stats.driver_frames_in += rx.got;
            e.stats.driver_frames_out += out as u64;
        }
        // Deferred ACKs (see the module documentation): only plain ACKs that receiving
        // produced on a polling thread; anything else (requests, NAKs, READ responses,
        // CNPs, whatever a timer produced) is pushed out at once, with them.
        let defer = matches!(who, Stepper::Poll | Stepper::Waiter)
            && !timers
            && only_acks
            && self.backlog.is_empty()
            && out < BATCH;
        if defer {
            e.stats.acks_deferred += out as u64;
        }
        let deadline = e.rnic.poll_timeout();
        let idle = rx.got == 0 && rx.dropped == 0 && out < BATCH && self.backlog.is_empty();
        announce_deadline(shared, who, deadline, idle);
        post(e);
        drop(g);
        self.tap_transmitted(ts);
        let stalled = self.send_backlog_or_batch(shared, defer);
        // A deferring step leaves the tx ring as it is (deferred ACKs wait for the next
        // push); any other step pushes everything, the deferred ACKs included.
        let full = out == BATCH;
        self.more = full;
        let in_flight = if defer && !stalled { 0 } else { self.push() };
        shared
            .tx_deferred
            .store(self.io.unkicked() > 0, Ordering::SeqCst);
        Some(Step {
            idle,
            stalled,
            full,
            in_flight,
            deadline,
        })
    }

    /// One batch from the port into the engine (under its lock), through the fault
    /// injection the options ask for (drops, CE marks) and the tap; counted in `e.stats`.
    #[inline(always)]
    fn receive_batch(&mut self, e: &mut super::Engine, now: EngineTime, ts: u64) -> Received {
        let (mut got, mut dropped, mut marked) = (0u64, 0u64, 0u64);
        let (rng, rx_drop, tap) = (&mut self.rng, self.rx_drop, &mut self.tap);
        let (rx_ce_mark, ce_buf) = (self.rx_ce_mark, &mut self.ce_buf);
        let rx = self.io.recv_batch(&mut |frame| {
            if rx_drop > 0.0 && rng.random_bool(rx_drop.min(1.0)) {
                if let Some(t) = tap.as_mut() {
                    t.received(ts, frame, RxFate::FaultDropped);
                }
                dropped += 1;
                return;
            }
            let mut frame = frame;
            if rx_ce_mark > 0.0 && rng.random_bool(rx_ce_mark.min(1.0)) {
                ce_buf.clear();
                ce_buf.extend_from_slice(frame);
                // Only ECN-capable IP packets can be marked; the capture shows the frame
                // as the engine saw it (CE set).
                if crate::wire::mark_ce(ce_buf) {
                    marked += 1;
                    frame = ce_buf;
                }
            }
            // The verdict is counted by the engine; only the tap records it.
            let _verdict = match tap.as_mut() {
                None => e.rnic.handle_frame(now, frame),
                Some(t) => handle_frame_tapped(&mut e.rnic, now, frame, t, ts),
            };
            got += 1;
        });
        if rx.is_err() {
            e.stats.io_errors += 1;
        }
        e.stats.frames_in += got;
        e.stats.fault_dropped += dropped;
        e.stats.fault_ce_marked += marked;
        Received { got, dropped }
    }

    /// Up to a batch of the engine's frames into the buffers (none while a backlog waits,
    /// so that frames leave in order): whether all of them are plain ACKs.
    #[inline(always)]
    fn build_transmit_batch(&mut self, e: &mut super::Engine, now: EngineTime) -> bool {
        let bufs = &mut self.bufs;
        bufs.lens.clear();
        self.reasons.clear();
        let mut only_acks = true;
        if self.backlog.is_empty() {
            while bufs.lens.len() < BATCH {
                let i = bufs.lens.len();
                match e.rnic.poll_transmit_with_reason(now, bufs.slot(i)) {
                    Some((len, why)) => {
                        bufs.lens.push(len);
                        only_acks &= why == TxReason::Ack;
                        if self.tap.is_some() {
                            self.reasons.push(why);
                        }
                    }
                    None => break,
                }
            }
        }
        only_acks
    }

    /// The batch just built recorded as sent (the engine produced it), outside the
    /// engine lock.
    #[inline(always)]
    fn tap_transmitted(&mut self, ts: u64) {
        if let Some(t) = self.tap.as_mut() {
            let mut refs = [&[][..]; BATCH];
            for (f, &why) in self.bufs.frames(&mut refs).iter().zip(&self.reasons) {
                t.transmitted(ts, f, why);
            }
            t.commit();
        }
    }

    /// Send: the backlog first, else this batch (queued without a kick when `defer`);
    /// what the port does not take goes to the backlog. Whether the port stalled.
    #[inline(always)]
    fn send_backlog_or_batch(&mut self, shared: &Shared, defer: bool) -> bool {
        let mut stalled = false;
        if !self.backlog.is_empty() {
            let refs: Vec<&[u8]> = self.backlog.iter().map(Vec::as_slice).collect();
            let n = self.io.send_batch(&refs).unwrap_or_else(|_| {
                shared.lock_stats().stats.io_errors += 1;
                refs.len()
            });
            self.backlog.drain(..n);
            stalled = !self.backlog.is_empty();
        } else if !self.bufs.lens.is_empty() {
            let mut refs = [&[][..]; BATCH];
            let frames = self.bufs.frames(&mut refs);
            let sent = if defer {
                self.io.queue_batch(frames)
            } else {
                self.io.send_batch(frames)
            };
            let n = sent.unwrap_or_else(|_| {
                shared.lock_stats().stats.io_errors += 1;
                frames.len()
            });
            if n < frames.len() {
                self.backlog.extend(frames[n..].iter().map(|f| f.to_vec()));
                stalled = true;
            }
        }
        if stalled {
            shared.lock_stats().stats.tx_stalls += 1;
        }
        stalled
    }
}

/// What [`Port::receive_batch`] took from the port.
struct Received {
    /// Frames handed to the engine.
    got: u64,
    /// Frames the fault injection dropped.
    dropped: u64,
}

/// The engine's next deadline for the other threads, and, when the driver thread's step
/// found nothing to do, that it goes to sleep until then (or its wake limit). Announced
/// under the engine lock: a post made after this sees the flag and kicks.
#[inline]
fn announce_deadline(shared: &Shared, who: Stepper, deadline: Option<EngineTime>, idle: bool) {
    shared.next_deadline.store(
        deadline.map_or(u64::MAX, EngineTime::as_nanos),
        Ordering::SeqCst,
    );
    if let (true, Stepper::Driver { wake_limit }) = (idle, who) {
        let wake_at = deadline.map_or(wake_limit, |d| d.min(wake_limit));
        shared.wake_at.store(wake_at.as_nanos(), Ordering::SeqCst);
        shared.sleeping.store(true, Ordering::SeqCst);
    }
}

impl Port {
    /// Push what waits on the port's tx ring out; returns the frames still on their way.
    pub(super) fn push(&mut self) -> u32 {
        // Copy-mode AF_XDP transmits at most 32 frames per kick (TX_BATCH_SIZE in
        // net/xdp/xsk.c) and leaves the rest on the tx ring until the next kick: kick
        // until the ring is empty or stops draining, so that nothing waits there while
        // nobody steps (a stuck READ response costs a retransmission timeout).
        let mut in_flight = self.io.flush().unwrap_or(0);
        for _ in 0..MAX_KICKS {
            if in_flight == 0 {
                break;
            }
            let left = self.io.flush().unwrap_or(in_flight);
            if left >= in_flight {
                break;
            }
            in_flight = left;
        }
        in_flight
    }
}

/// `at` on the engine's clock, whose origin is the driver's `epoch`.
pub(super) fn engine_time(epoch: Instant, at: Instant) -> EngineTime {
    EngineTime::from_nanos(u64::try_from(at.duration_since(epoch).as_nanos()).unwrap_or(u64::MAX))
}

impl Shared {
    /// The engine's clock: the time since the driver's epoch.
    pub fn now(&self) -> EngineTime {
        engine_time(self.epoch, Instant::now())
    }

    /// One application step if no other thread is stepping; `None` if one is (that
    /// thread makes the progress).
    pub(super) fn app_step(&self) -> Option<Step> {
        self.app_step_as(Stepper::App, self.now())
    }

    /// One step at `now` (the caller's one clock read) as `who`; `None` when another
    /// thread is stepping, or (a busy poll) when there is nothing to do
    /// (`Port::quiet`).
    fn app_step_as(&self, who: Stepper, now: EngineTime) -> Option<Step> {
        self.app_step_with(who, now, |_| true, |_| {})
    }

    /// [`Shared::app_step_as`] with the caller's work under the step's engine lock
    /// (`Port::step_with`); `None` also when `pre` ended the step.
    fn app_step_with(
        &self,
        who: Stepper,
        now: EngineTime,
        pre: impl FnOnce(&mut super::Engine) -> bool,
        post: impl FnOnce(&mut super::Engine),
    ) -> Option<Step> {
        let mut port = match self.port.try_lock() {
            Ok(p) => p,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        let p = port.as_mut()?;
        if who == Stepper::Poll && p.quiet(self, now) {
            drop(port);
            self.quiet_polls.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let step = p.step_with(self, Some(now), who, pre, post)?;
        drop(port);
        self.after_app_step(&step);
        Some(step)
    }

    /// Wake the driver when the application's step left it something it would miss
    /// asleep (see the module documentation).
    fn after_app_step(&self, s: &Step) {
        // Received frames are not left-over work here: they went to the engine, whose
        // answers this step already sent.
        let leftover = s.full || s.stalled || s.in_flight > 0;
        let earlier = s
            .deadline
            .is_some_and(|d| d.as_nanos() < self.wake_at.load(Ordering::SeqCst));
        if leftover || earlier {
            {
                let mut g = self.lock_stats();
                if leftover {
                    g.stats.kicks_leftover += 1;
                } else {
                    g.stats.kicks_deadline += 1;
                }
            }
            self.kick();
        }
    }

    /// The doorbell, after posting send work: build and transmit the frames on the
    /// calling thread when the port is free, otherwise leave them to the thread that
    /// holds it (kicking the driver if it sleeps).
    pub fn doorbell(&self) {
        if self.app_step().is_none() {
            self.lock_stats().stats.doorbells_busy += 1;
            self.kick();
        }
    }

    /// `ibv_post_send` of an RC or UC QP and its doorbell under one engine lock: when no
    /// other thread holds the port, the work request is posted by the step that sends it
    /// (`Port::step_with`), which saves the engine lock, guard and work flag of a
    /// separate post (docs/performance.md, "The round trip: one lock per message, fewer
    /// instructions").
    /// What it does is what [`crate::proto::Rnic::post_send`] and then
    /// [`Shared::doorbell`] did: the doorbell is rung only on an idle send queue of an
    /// idle device (no QP with a timer armed; otherwise the driver is kicked and sends
    /// whole batches, docs/performance.md "Many QPs"), and a refused work request
    /// leaves nothing to send and kicks nobody.
    pub fn post_send_ringing(&self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        let mut port = match self.port.try_lock() {
            Ok(p) => Some(p),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        let Some(p) = port.as_mut().and_then(|g| g.as_mut()) else {
            // Another thread steps (or the driver stopped): post, and leave the frames
            // to that thread, kicking the driver in case it sleeps.
            drop(port);
            let idle = {
                let mut g = self.lock();
                let idle = Self::post_idle(&g.rnic, qpn);
                g.rnic.post_send(qpn, wr)?;
                idle
            };
            if idle {
                self.lock_stats().stats.doorbells_busy += 1;
            }
            self.kick();
            return Ok(());
        };
        let mut posted = Ok(());
        let mut idle = false;
        let step = p.step_with(
            self,
            None,
            Stepper::App,
            |e| {
                idle = Self::post_idle(&e.rnic, qpn);
                posted = e.rnic.post_send(qpn, wr);
                idle && posted.is_ok()
            },
            |_| {},
        );
        drop(port);
        match step {
            Some(s) => self.after_app_step(&s),
            // Behind outstanding work: the driver sends it with the rest.
            None if posted.is_ok() => self.kick(),
            None => {}
        }
        posted
    }

    /// Whether a send posted now would find an idle send queue on an idle device: this
    /// QP's send queue empty and no QP with a timer armed (an RC QP's retransmission
    /// timer runs while it has packets unacknowledged). With work in flight on other
    /// QPs the driver steps for it anyway, and a doorbell per post on each of many QPs
    /// would cost a `sendto` per message (docs/performance.md "Many QPs").
    fn post_idle(rnic: &crate::proto::Rnic, qpn: Qpn) -> bool {
        rnic.send_queue_len(qpn) == 0 && rnic.poll_timeout().is_none()
    }

    /// Busy-polling progress (an empty `poll_cq`): receive, run timers and transmit on
    /// the calling thread, and take the poll lease. Returns whether a step ran: not when
    /// another thread is stepping, nor when there was nothing to do (nothing received,
    /// no timer due, no verb since the last step: decided without the engine lock, see
    /// `Port::quiet`). ACKs the step produced may be deferred: the caller polls its CQ
    /// again and calls [`Shared::flush_deferred`] when that finds nothing.
    pub fn poll_progress(&self) -> bool {
        self.poll_step(|_| {}).is_some()
    }

    /// [`Shared::poll_progress`] for a poll of `cq`: the step also takes up to `max` of
    /// its completions into `out`, under the step's own engine lock (one lock per poll
    /// that finds a frame, not two). `None` when no step ran; otherwise how many
    /// completions were taken. The caller then reports them ([`Shared::poll_found`]) or,
    /// with none, pushes the deferred ACKs ([`Shared::flush_deferred`]).
    pub fn poll_progress_into(
        &self,
        cq: Cq,
        max: usize,
        out: &mut Vec<WorkCompletion>,
    ) -> Option<usize> {
        let mut n = 0;
        self.poll_step(|e| n = e.rnic.poll_cq(cq, max, out))?;
        Some(n)
    }

    /// A busy poll's step, `post` run under its engine lock at its end.
    fn poll_step(&self, post: impl FnOnce(&mut super::Engine)) -> Option<Step> {
        // The one clock read of an empty poll: the lease and the step use it.
        let now = self.now();
        self.poll_lease
            .fetch_max((now + POLL_LEASE).as_nanos(), Ordering::SeqCst);
        // The application polls on after a completion: the lease it just lengthened
        // holds the driver off, so a grace timer armed by `poll_found` is disarmed
        // rather than left to wake the driver for nothing (one wake-up per completion
        // whenever the round trip exceeds the grace), and counts as not needed.
        self.grace.polled();
        self.app_step_with(Stepper::Poll, now, |_| true, post)
    }

    /// Empty polls so far that skipped their step ([`Shared::poll_progress`]).
    pub fn quiet_polls(&self) -> u64 {
        self.quiet_polls.load(Ordering::Relaxed)
    }

    /// A poll found completions: the caller may stop polling now (and spin on its
    /// memory instead, waiting for a remote write), so the lease it holds shrinks to
    /// [`POLL_GRACE`] from now, and the grace timer wakes the sleeping driver then to
    /// watch the socket again unless an empty poll lengthened the lease meanwhile.
    pub fn poll_found(&self) {
        if !self.grace.arming_now() {
            // The application has been seen to poll on after its completions
            // (driver/grace.rs): the lease stays as its last empty poll set it. Shortened,
            // it would lapse whenever the poller is preempted for longer than the grace
            // after a completion (100-250 µs is common on a 2-vCPU VM), and the driver,
            // finding no lease at its next turn, would watch the socket and take the
            // next frames off the ring on its own thread: two more wake-ups per round
            // trip, and an eventfd kick for every retransmission timer the poller arms,
            // until a frame arrives with the lease held again
            // (docs/performance.md, "The round trip against its floor"). An application
            // that stops polling after a completion is still seen when the lease runs
            // out, at most `POLL_LEASE` after its last empty poll, and arming resumes.
            self.grace.found_unarmed();
            return;
        }
        let until = (self.now() + POLL_GRACE).as_nanos();
        let shortened = self
            .poll_lease
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| {
                (l > until).then_some(until)
            })
            .is_ok();
        if shortened {
            self.grace.found();
        }
    }

    /// Push deferred ACKs out now (a poll found no completion, or a thread is about to
    /// sleep): unless another thread is stepping, whose step pushes them or, if it defers
    /// too, is bound by the same rules.
    pub fn flush_deferred(&self) {
        if !self.tx_deferred.load(Ordering::SeqCst) {
            return;
        }
        let mut port = match self.port.try_lock() {
            Ok(p) => p,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let Some(p) = port.as_mut() else {
            return;
        };
        if p.io.unkicked() == 0 {
            self.tx_deferred.store(false, Ordering::SeqCst);
            return;
        }
        let in_flight = p.push();
        self.tx_deferred
            .store(p.io.unkicked() > 0, Ordering::SeqCst);
        drop(port);
        self.lock_stats().stats.deferred_pushes += 1;
        if in_flight > 0 {
            self.kick();
        }
    }

    /// End the poll lease (a thread is about to sleep on a completion): the driver
    /// watches the socket again from now on.
    pub(super) fn end_lease(&self) {
        if self.poll_lease.swap(0, Ordering::SeqCst) > self.now().as_nanos() {
            self.kick();
        }
    }

    /// Whether an application holds the poll lease at `now`.
    pub(super) fn lease_until(&self, now: EngineTime) -> Option<EngineTime> {
        let l = EngineTime::from_nanos(self.poll_lease.load(Ordering::SeqCst));
        (l > now).then_some(l)
    }

    /// Wait for completions of `cq` asleep on the socket, receiving on this thread, if no
    /// other thread does; `None` when one does (the caller sleeps on the condition
    /// variable instead). The driver thread keeps the timers and leaves the socket to
    /// this thread meanwhile; afterwards this thread keeps a poll lease, as it is likely
    /// to post or wait again at once.
    pub(super) fn wait_on_socket(
        &self,
        cq: Cq,
        max: usize,
        out: &mut Vec<WorkCompletion>,
        timeout: Duration,
    ) -> Option<usize> {
        self.rx_waiter
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()?;
        let until = Instant::now() + timeout;
        let mut b = [0u8; 8];
        let mut notified = false;
        let n = loop {
            let _ = self.app_step_as(Stepper::Waiter, self.now());
            if notified {
                // Read back the notifications before looking: one after the look wakes
                // us. (A count left from before only costs one extra turn.)
                let _ = rustix::io::read(&self.cq_event, &mut b);
            }
            let n = {
                let mut g = self.lock_as(false, true);
                let n = g.rnic.poll_cq(cq, max, out);
                if n == 0 {
                    g.stats.cq_waits += 1;
                }
                n
            };
            if n == 0 {
                // About to sleep (or give up): deferred ACKs must not wait for us.
                self.flush_deferred();
            }
            let left = until.saturating_duration_since(Instant::now());
            if n > 0 || left.is_zero() {
                break n;
            }
            let ts = Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let mut fds = [
                PollFd::new(&self.rx_fd, PollFlags::IN),
                PollFd::new(&self.cq_event, PollFlags::IN),
                PollFd::new(
                    self.bell_fd.as_ref().unwrap_or(&self.cq_event),
                    PollFlags::IN,
                ),
            ];
            let n = if self.bell_fd.is_some() { 3 } else { 2 };
            if poll(&mut fds[..n], Some(&ts)) == Ok(0) {
                self.lock_stats().stats.cq_wait_timeouts += 1;
            }
            notified = !fds[1].revents().is_empty();
        };
        let lease = self.now() + POLL_LEASE;
        self.poll_lease
            .fetch_max(lease.as_nanos(), Ordering::SeqCst);
        self.rx_waiter.store(false, Ordering::SeqCst);
        Some(n)
    }
}
