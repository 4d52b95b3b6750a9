//! The driver: one thread per device that joins the sans-IO engine ([`Rnic`]) to a frame
//! I/O port (AF_XDP, or an in-process simulated link), and the only place in xrnic that
//! reads the clock for the transport.
//!
//! Contract:
//! - The engine lives behind one `Mutex` (in [`Shared`]); the application (the
//!   [`crate::verbs`] API) and the driver thread both lock it for short, bounded work. A
//!   mutex rather than a command channel because the verbs are synchronous in libibverbs
//!   (`ibv_post_send` returns the outcome of its checks, `ibv_poll_cq` returns what is there
//!   now) and because MR bytes are owned by the engine: a channel would need a round trip
//!   per call and a copy per MR access.
//! - Each iteration: read the clock once, receive a batch of frames into `handle_frame`,
//!   run due timers (`handle_timeout`), drain `poll_transmit` into a batch of 64-byte
//!   aligned buffers, unlock, send the batch. The responder and the ACK side therefore run
//!   while the application never calls in (one-sided WRITE/READ into a passive server).
//!   The same step also runs on application threads ([`poll`](mod@poll)): `post_send` transmits on
//!   the caller's thread (the doorbell) and an empty `poll_cq` receives on it (busy
//!   polling), so a busy application needs no thread wake-up per message; the port is
//!   behind its own lock, taken before the engine's. ACKs produced on a polling thread
//!   leave with the application's next frames, bounded as [`poll`](mod@poll) says.
//! - When there is nothing to do the thread sleeps in `poll(2)` on the port's descriptor
//!   and an eventfd, until the engine's next deadline (`poll_timeout`) or the next stat
//!   snapshot. The API writes the eventfd only when the driver announced it is going to
//!   sleep (a flag set under the engine lock), so a busy application pays no system call.
//! - Completions wake [`Shared::wait_cq`] through a `Condvar` (and the thread asleep on
//!   the socket in [`Shared::wait_cq_receiving`] through an eventfd), signalled only
//!   while somebody waits. Every completion wakes them, however it was made: the engine
//!   counts the completions it adds ([`Rnic::completions_added`]) and the engine guard
//!   ([`EngineGuard`]) signals when a holder of the lock added any, be it the driver's
//!   step (frames, timers) or a verb on an application thread (a flush on modify to ERR,
//!   a post on a QP in ERR, a WR failed at the head of its send queue). Once the lock
//!   is released the guard also runs the completion hook, if one is set
//!   ([`Shared::set_completion_hook`]: the libibverbs library signals its completion
//!   channels from it).
//! - Optional fault injection drops a seeded fraction of received frames before
//!   `handle_frame` (this host kernel has no netem).
//! - Optional stat snapshots: a JSON file rewritten every interval and removed when the
//!   device closes (read by `xrnic stat`, and by `xrnic res` for the QP/MR/CQ listing it
//!   carries); it names its writer by pid and start time. [`remove_live_snapshots`] is
//!   for a program's signal handler.
//! - Optional capture tap ([`crate::driver::tap`]): every frame received (before the fault
//!   injector, with the engine's verdict) and sent (with its [`TxReason`](crate::proto::TxReason)) goes to a
//!   pcapng written by a thread of its own; off, it costs a branch per frame.
//! - Dropping the [`Driver`] stops and joins the thread, then drops the port (which
//!   detaches the XDP filter). Nothing else is touched (namespaces stay).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec, eventfd, poll};
use serde::Serialize;

use crate::io::frame::{FrameIo, IoStats};
use crate::proto::{Cq, MAX_FRAME_LEN, Rnic, WorkCompletion};
use crate::wire::Qpn;

mod grace;
pub mod loopback;
pub mod poll;
pub mod snapshot;
pub mod tap;

use snapshot::{FinalStat, close_snapshot, live_snapshots, write_final_snapshot, write_snapshot};
pub use snapshot::{
    LinkId, QpSnapshot, Snapshot, process_start_time, remove_live_snapshots, state_name,
};

use tap::Tap;

pub use poll::POLL_LEASE;
use poll::{Port, Stepper};

/// Stride of the transmit buffers: `MAX_FRAME_LEN` rounded up to 64 bytes, so that every
/// buffer starts 64-byte aligned (glibc's x86 memcpy can take a slow `rep movsb` path for
/// copies between mutually misaligned buffers; src/io/afxdp/port.rs).
const STRIDE: usize = MAX_FRAME_LEN.div_ceil(64) * 64;
/// How long to back off when the port's transmit ring is full.
const TX_BACKOFF: Duration = Duration::from_micros(50);
/// Most kicks per iteration to drain the port's transmit ring.
const MAX_KICKS: usize = 64;

/// Options of the driver thread.
#[derive(Clone, Debug)]
pub struct DriverOptions {
    /// Fault injection: drop this fraction (0.0..=1.0) of received frames before the engine
    /// sees them.
    pub rx_drop: f64,
    /// Seed of the fault injector's PRNG (ChaCha8): the same seed drops the same frames of
    /// the same sequence.
    pub seed: u64,
    /// Testing congestion control: mark this fraction (0.0..=1.0) of received ECN-capable
    /// frames CE before the engine sees them, as a RED/ECN switch would (this host kernel
    /// has no sch_red, and XDP runs before tc ingress).
    pub rx_ce_mark: f64,
    /// Where to write the JSON stat snapshot, if anywhere.
    pub stat_path: Option<PathBuf>,
    /// How often to rewrite the snapshot.
    pub stat_interval: Duration,
    /// Write the last snapshot (`running: false`, the counters as the device closes) to
    /// this file when the device closes: a post-mortem the caller asked for, since the
    /// snapshot in `stat_path` is removed on close.
    pub final_stat_path: Option<PathBuf>,
    /// The device's network interface name, for the snapshot.
    pub netdev: String,
    /// The interface's identity in its namespace, for the snapshot; none for a simulated
    /// device, and the snapshot says `simulated`.
    pub link: Option<LinkId>,
    /// Capture every frame received and sent into this pcapng file ([`crate::driver::tap`]).
    pub pcap: Option<PathBuf>,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            rx_drop: 0.0,
            seed: 0,
            rx_ce_mark: 0.0,
            stat_path: None,
            stat_interval: Duration::from_millis(500),
            final_stat_path: None,
            netdev: String::new(),
            link: None,
            pcap: None,
        }
    }
}

/// What the driver thread counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DriverStats {
    /// Loop iterations of the driver thread.
    pub iterations: u64,
    /// Steps run on application threads (the `post_send` doorbell, busy `poll_cq`).
    pub app_steps: u64,
    /// Times the thread went to sleep in `poll(2)`.
    pub sleeps: u64,
    /// Wake-ups requested by the application through the eventfd.
    pub app_wakeups: u64,
    /// Received frames dropped by the fault injector.
    pub fault_dropped: u64,
    /// Received ECN-capable frames the fault injector marked CE (`rx_ce_mark`).
    pub fault_ce_marked: u64,
    /// Frames given to the engine.
    pub frames_in: u64,
    /// Frames the engine produced.
    pub frames_out: u64,
    /// Times the port refused frames for lack of room (they were sent later).
    pub tx_stalls: u64,
    /// ACKs produced by a polling application's step and queued without a kick, to leave
    /// with the next frames pushed out ([`poll`](mod@poll): deferred ACKs).
    pub acks_deferred: u64,
    /// Pushes made only for deferred ACKs: by a poll that found no completion, or a
    /// thread about to sleep on the socket (the other pushes carry new frames too).
    pub deferred_pushes: u64,
    /// I/O errors of the port (the thread carries on).
    pub io_errors: u64,
    /// Frames handed to the capture tap's writer (`pcap`).
    pub capture_frames: u64,
    /// Frames the capture tap discarded because its writer fell behind.
    pub capture_lost: u64,
    /// Times a thread waiting for a completion ([`Shared::wait_cq`],
    /// [`Shared::wait_cq_receiving`]) looked at its CQ, found nothing and went to sleep.
    pub cq_waits: u64,
    /// Times completions were added while threads waited for them and those threads were
    /// signalled (by whichever call added them: a frame, a timer, a verb).
    pub cq_wakeups: u64,
    /// Times such a sleep ran to the end of the wait's timeout. The thread looks once more
    /// then, so a completion added without a signal is still returned, late: a count here
    /// next to completions returned is a missed wake-up.
    pub cq_wait_timeouts: u64,
    /// Application steps after which the driver was asked to step too: they left work
    /// (a full batch, refused frames, frames still on the transmit ring).
    pub kicks_leftover: u64,
    /// Application steps after which the driver was asked to step because the engine's
    /// next deadline came before the sleeping driver's wake-up time.
    pub kicks_deadline: u64,
    /// Doorbells that found another thread stepping (the driver was kicked instead).
    pub doorbells_busy: u64,
    /// Frames received by the driver thread's own steps (the rest were received on
    /// application threads).
    pub driver_frames_in: u64,
    /// Frames sent by the driver thread's own steps.
    pub driver_frames_out: u64,
    /// Sleeps of the driver thread with the socket watched (no poll lease held).
    pub sleeps_watching: u64,
    /// Of those, the sleeps a received (or looped) frame ended.
    pub socket_wakeups: u64,
}

/// The engine and the bookkeeping the API and the stat snapshot need, behind one lock.
#[derive(Debug)]
pub struct Engine {
    pub rnic: Rnic,
    /// Live QPs, for listing them (the engine has no iterator over its QPs).
    pub qps: BTreeMap<Qpn, ()>,
    pub stats: DriverStats,
    pub io: IoStats,
}

/// A function called after completions may have been added to some CQ, on the thread
/// that added them (the driver's or an application's), with the engine unlocked.
pub type CompletionHook = Arc<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct HookSlot(Mutex<Option<CompletionHook>>);

impl core::fmt::Debug for HookSlot {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let set = self.0.lock().map(|h| h.is_some()).unwrap_or(false);
        write!(f, "HookSlot({})", if set { "set" } else { "empty" })
    }
}

/// State shared by the driver thread and the API.
#[derive(Debug)]
pub struct Shared {
    engine: Mutex<Engine>,
    completions: Condvar,
    hook: HookSlot,
    /// A hook is set (checked without the hook's lock).
    hooked: AtomicBool,
    waiters: AtomicUsize,
    /// The driver is (about to be) asleep: the API must write `wake`.
    sleeping: AtomicBool,
    /// When the sleeping driver wakes on its own (nanoseconds since `epoch`).
    wake_at: AtomicU64,
    /// An application busy-polls the port until then (nanoseconds since `epoch`).
    poll_lease: AtomicU64,
    /// The timer the driver sleeps on under a lease: armed (while the application is
    /// seen to need it, driver/grace.rs) when a poll that found completions shortens the
    /// lease to [`poll::POLL_GRACE`] ([`Shared::poll_found`]), so that the driver
    /// watches the socket again once the application stops polling.
    grace: grace::Grace,
    /// A thread waits for a completion asleep on the socket ([`Shared::wait_cq`]).
    rx_waiter: AtomicBool,
    /// The port holds deferred ACKs that no kick has pushed out yet (a hint, so that a
    /// poll with nothing deferred does not lock the port; set and cleared under it).
    tx_deferred: AtomicBool,
    /// The engine may have work a step would find that no step has looked at yet: set
    /// by every engine lock outside a step (a post, a modify, a doorbell's verb) when it
    /// is released, cleared by a step under the port lock before it locks the engine.
    /// An empty poll with this clear, nothing received and no timer due skips its step
    /// (`Port::quiet` (driver/poll.rs)).
    work: AtomicBool,
    /// The engine's next deadline as the last step left it (nanoseconds since `epoch`,
    /// `u64::MAX` for none); stored under the engine lock. Verbs that arm a timer set
    /// `work`, so a stale value here is never trusted alone.
    next_deadline: AtomicU64,
    /// Empty polls that skipped their step (nothing to receive, send or time out).
    quiet_polls: AtomicU64,
    /// Written by `notify` while `rx_waiter`: a completion may be there.
    cq_event: OwnedFd,
    /// The port's descriptor (a duplicate, polled without the port's lock).
    rx_fd: OwnedFd,
    /// The port's second descriptor (`FrameIo::bell_fd`: looped frames), a duplicate,
    /// polled with `rx_fd`.
    bell_fd: Option<OwnedFd>,
    wake: OwnedFd,
    stop: AtomicBool,
    /// The frame I/O, stepped by the driver thread or an application thread
    /// (`None` once the driver stopped). Locked before `engine`, never after.
    port: Mutex<Option<Port>>,
    /// Time zero of the engine's clock.
    epoch: Instant,
    /// The last snapshot to write, when [`DriverOptions::final_stat_path`] asks for one:
    /// by the driver thread as the device closes, or by
    /// [`Shared::write_final_snapshot_now`] for a program exiting with it open.
    final_stat: Option<FinalStat>,
}

/// The engine, locked ([`Shared::lock`]). Dropping it wakes the threads waiting for
/// completions ([`Shared::wait_cq`], [`Shared::wait_cq_receiving`]) when the engine added
/// any while it was held ([`Rnic::completions_added`]), whichever call added them: a
/// frame or a timer in a step, or a verb (a flush on modify to ERR, a post on a QP in
/// ERR, a WR failed at the head of its send queue by the doorbell's step). So no path
/// that completes needs to remember to signal. The waiters are signalled just before
/// the lock is released; they run once it is.
pub struct EngineGuard<'a> {
    shared: &'a Shared,
    /// [`Rnic::completions_added`] when locked.
    added: u64,
    /// [`Rnic::async_events_len`] when locked.
    events: usize,
    /// False for the thread asleep on the socket, which looks at its CQ right after its
    /// own step: it need not signal itself.
    wake_socket_waiter: bool,
    /// Set [`Shared::work`] on release: false only for a step's own lock and for locks
    /// that only count (statistics).
    marks_work: bool,
    /// Held until `drop`, which signals, releases it, then runs the completion hook
    /// (the hook locks the engine itself).
    guard: Option<MutexGuard<'a, Engine>>,
}

impl std::ops::Deref for EngineGuard<'_> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        self.guard
            .as_ref()
            .expect("the engine guard holds its lock until dropped")
    }
}

impl std::ops::DerefMut for EngineGuard<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        self.guard
            .as_mut()
            .expect("the engine guard holds its lock until dropped")
    }
}

impl Drop for EngineGuard<'_> {
    fn drop(&mut self) {
        let Some(mut g) = self.guard.take() else {
            return;
        };
        if self.marks_work {
            // Before the release: a step that clears the flag after this waits for the
            // lock and sees what this holder did.
            self.shared.work.store(true, Ordering::SeqCst);
        }
        // The hook also moves the engine's asynchronous events out: some come with no
        // completion (COMM_EST on an RDMA WRITE, CQ_ERR). Only events raised while this
        // guard was held count: the hook's own looks at the engine raise none, so it is
        // never run again from inside itself (its slot's lock is not reentrant).
        let completed = g.rnic.completions_added() != self.added;
        if !completed && g.rnic.async_events_len() <= self.events {
            return;
        }
        if completed {
            self.shared.notify(&mut g, self.wake_socket_waiter);
        }
        drop(g);
        self.shared.run_completion_hook();
    }
}

impl std::fmt::Debug for EngineGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineGuard").finish_non_exhaustive()
    }
}

impl Shared {
    /// Lock the engine. A panic of another holder does not make the engine unusable for
    /// reading counters; the lock is taken over. Whatever the holder does, the threads
    /// waiting for completions are woken when it adds any ([`EngineGuard`]).
    pub fn lock(&self) -> EngineGuard<'_> {
        self.lock_as(true, true)
    }

    /// The lock for a counter update only: it does not make the next empty poll step.
    fn lock_stats(&self) -> EngineGuard<'_> {
        self.lock_as(true, false)
    }

    fn lock_as(&self, wake_socket_waiter: bool, marks_work: bool) -> EngineGuard<'_> {
        let guard = self.raw_lock();
        EngineGuard {
            added: guard.rnic.completions_added(),
            events: guard.rnic.async_events_len(),
            wake_socket_waiter,
            marks_work,
            shared: self,
            guard: Some(guard),
        }
    }

    fn raw_lock(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tell the driver thread there may be something to send. Call after posting work,
    /// with the engine lock released or held (either is fine).
    pub fn kick(&self) {
        if self.sleeping.swap(false, Ordering::SeqCst) {
            // An eventfd write of 1 only fails when the counter would overflow, which
            // cannot happen: the driver reads it back on every wake-up.
            let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
        }
    }

    /// [`Shared::wait_cq`], but the first thread to wait this way sleeps on the socket
    /// itself and receives on its own thread (one wake-up per message, like a blocking
    /// UDP socket) while the driver keeps the timers; further waiters sleep on the
    /// condition variable. For request/response exchanges: a stream does better with
    /// the driver thread receiving and batching beside the application.
    pub fn wait_cq_receiving(
        &self,
        cq: Cq,
        max: usize,
        out: &mut Vec<WorkCompletion>,
        timeout: Duration,
    ) -> usize {
        match self.wait_on_socket(cq, max, out, timeout) {
            Some(n) => n,
            None => self.wait_cq(cq, max, out, timeout),
        }
    }

    /// Poll up to `max` completions of `cq` into `out`, waiting up to `timeout` for the
    /// first one (asleep on a condition variable the driver signals). Returns how many
    /// were added.
    pub fn wait_cq(
        &self,
        cq: Cq,
        max: usize,
        out: &mut Vec<WorkCompletion>,
        timeout: Duration,
    ) -> usize {
        // About to sleep: the driver must watch the socket again.
        self.end_lease();
        // The plain guard: the condition variable needs it, and polling adds nothing.
        let g = self.raw_lock();
        // Counted under the lock, before the first look: whoever adds a completion after
        // taking the lock next sees the count and signals (`EngineGuard`).
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut g = g;
        let until = Instant::now() + timeout;
        let n = loop {
            let n = g.rnic.poll_cq(cq, max, out);
            let left = until.saturating_duration_since(Instant::now());
            if n > 0 || left.is_zero() {
                break n;
            }
            g.stats.cq_waits += 1;
            let (g2, r) = self
                .completions
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner());
            g = g2;
            if r.timed_out() {
                g.stats.cq_wait_timeouts += 1;
            }
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        n
    }

    /// Set (or, `None`, clear) the function called after completions may have arrived.
    /// Waits for a running call of the old hook to return; the old hook is dropped on
    /// the caller's thread.
    pub fn set_completion_hook(&self, hook: Option<CompletionHook>) {
        let mut h = self.hook.0.lock().unwrap_or_else(|p| p.into_inner());
        self.hooked.store(hook.is_some(), Ordering::SeqCst);
        let old = core::mem::replace(&mut *h, hook);
        drop(h);
        drop(old);
    }

    /// Run the completion hook, if any (the engine must not be locked by the caller).
    /// The hook runs under its slot's lock, so that [`Shared::set_completion_hook`]
    /// returns only once no thread runs the old hook (whatever it holds, such as the
    /// device's last handle, is then never dropped on the driver thread).
    pub fn run_completion_hook(&self) {
        if self.hooked.load(Ordering::SeqCst) {
            let h = self.hook.0.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(h) = h.as_ref() {
                h();
            }
        }
    }

    /// Wake the threads waiting for completions (`socket_waiter`: also the one asleep on
    /// the socket). Called with the engine locked (`e`), by [`EngineGuard`]'s drop.
    fn notify(&self, e: &mut Engine, socket_waiter: bool) {
        let mut woke = false;
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.completions.notify_all();
            woke = true;
        }
        if socket_waiter && self.rx_waiter.load(Ordering::SeqCst) {
            // Cannot overflow: the socket waiter reads it back before each sleep.
            let _ = rustix::io::write(&self.cq_event, &1u64.to_ne_bytes());
            woke = true;
        }
        if woke {
            e.stats.cq_wakeups += 1;
        }
    }
}

/// The driver thread of one device.
#[derive(Debug)]
pub struct Driver {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Driver {
    /// Start the thread. `io` moves into it and is dropped (XDP detached) when the
    /// driver is dropped.
    pub fn start(rnic: Rnic, io: Box<dyn FrameIo>, opts: DriverOptions) -> io::Result<Driver> {
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let tap = match &opts.pcap {
            Some(p) => Some(Tap::create(
                p,
                &opts.netdev,
                &format!(
                    "xrnic device xrnic_{}: every frame its driver sent and received \
                     (received frames before the fault injector); wall-clock timestamps",
                    opts.netdev
                ),
            )?),
            None => None,
        };
        // The driver sleeps on the socket without holding the port's lock: on its own
        // descriptor (same open file, same readiness).
        let rx_fd = io.poll_fd().try_clone_to_owned()?;
        let bell_fd = io.bell_fd().map(|f| f.try_clone_to_owned()).transpose()?;
        let shared = Arc::new(Shared {
            engine: Mutex::new(Engine {
                rnic,
                qps: BTreeMap::new(),
                stats: DriverStats::default(),
                io: IoStats::default(),
            }),
            completions: Condvar::new(),
            hook: HookSlot::default(),
            hooked: AtomicBool::new(false),
            waiters: AtomicUsize::new(0),
            sleeping: AtomicBool::new(false),
            wake_at: AtomicU64::new(0),
            poll_lease: AtomicU64::new(0),
            grace: grace::Grace::new()?,
            rx_waiter: AtomicBool::new(false),
            tx_deferred: AtomicBool::new(false),
            work: AtomicBool::new(true),
            next_deadline: AtomicU64::new(0),
            quiet_polls: AtomicU64::new(0),
            cq_event: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?,
            rx_fd,
            bell_fd,
            wake,
            stop: AtomicBool::new(false),
            port: Mutex::new(Some(Port::new(io, &opts, tap))),
            epoch: Instant::now(),
            final_stat: FinalStat::new(&opts),
        });
        if let Some(p) = &opts.stat_path {
            live_snapshots().push(p.clone());
        }
        let s = shared.clone();
        let stat_path = opts.stat_path.clone();
        let thread = std::thread::Builder::new()
            .name(format!("xrnic-{}", opts.netdev))
            .spawn(move || run(&s, &opts))
            .inspect_err(|_| {
                if let Some(p) = &stat_path {
                    close_snapshot(p);
                }
            })?;
        Ok(Driver {
            shared,
            thread: Some(thread),
        })
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.sleeping.store(true, Ordering::SeqCst);
        self.shared.kick();
        if self
            .thread
            .as_ref()
            .is_some_and(|t| t.thread().id() == std::thread::current().id())
        {
            // Dropped on the driver thread itself: a completion hook held the last handle
            // of the device. That thread cannot join itself and may hold the port's lock;
            // its loop sees `stop` and ends, and the port (XDP attachment included) goes
            // with the thread's `Arc<Shared>`.
            return;
        }
        if let Some(t) = self.thread.take() {
            // A panic in the thread has already been printed; nothing more to do here.
            let _ = t.join();
        }
        // Frames an application thread left on the tx ring unkicked (deferred ACKs,
        // poll.rs) leave before the socket closes: a program that exits right after its
        // last completion must not leave its peer retrying for the ACK.
        let mut port = self.shared.lock_port();
        if let Some(p) = port.as_mut() {
            p.push();
        }
        // Detach now, not when the last `Arc<Shared>` goes.
        drop(port.take());
    }
}

impl Shared {
    /// Lock the port (a panic of another holder does not make it unusable).
    fn lock_port(&self) -> MutexGuard<'_, Option<Port>> {
        self.port.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `ibv_close_device` with objects the program never destroyed: as
    /// [`Shared::release_port`], after pushing out what an application thread left on
    /// the tx ring (deferred ACKs), as the driver's drop does.
    pub fn close_port(&self) {
        if let Some(p) = self.lock_port().as_mut() {
            p.push();
        }
        self.release_port();
    }

    /// Whether the driver was told to stop (its device dropped, or the port released).
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// The port's interface is gone (the device is fatal): stop the driver thread and
    /// close the port now (the AF_XDP socket, the XDP attachment), without waiting for
    /// the device's last handle. The engine stays: its CQs can still be polled and its
    /// objects destroyed. Steps on application threads find no port and do nothing.
    /// Not to be called with the engine locked (the port is locked before it).
    pub fn release_port(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.sleeping.store(true, Ordering::SeqCst);
        self.kick();
        drop(self.lock_port().take());
        // The socket's duplicate the driver and waiters poll: the socket goes now.
        if let Err(e) = crate::io::afxdp::sys::retire_fd(self.rx_fd.as_fd()) {
            tracing::warn!("closing the port's socket: {e}");
        }
    }
}

/// Tests: the port held by the test, so that no thread steps (no frame is received or
/// sent, no timer runs) until it is dropped; [`PortHold::step`] runs one step on the
/// test's thread. What a test sees meanwhile was done by the verbs it called.
#[cfg(test)]
pub(crate) struct PortHold<'a> {
    shared: &'a Shared,
    port: MutexGuard<'a, Option<Port>>,
}

#[cfg(test)]
impl Shared {
    pub(crate) fn hold_port(&self) -> PortHold<'_> {
        PortHold {
            shared: self,
            port: self.lock_port(),
        }
    }
}

#[cfg(test)]
impl PortHold<'_> {
    /// One step as an application thread's doorbell would run it.
    pub(crate) fn step(&mut self) {
        let now = self.shared.now();
        if let Some(p) = self.port.as_mut() {
            p.step(self.shared, now, Stepper::App);
        }
    }

    /// Whether an empty poll at `now` would skip its step (`Port::quiet`, driver/poll.rs).
    pub(crate) fn quiet_at(&mut self, now: crate::proto::Instant) -> bool {
        self.port
            .as_mut()
            .is_some_and(|p| p.quiet(self.shared, now))
    }

    /// The engine's next deadline as the last step cached it.
    pub(crate) fn cached_deadline(&self) -> Option<crate::proto::Instant> {
        let d = self.shared.next_deadline.load(Ordering::SeqCst);
        (d != u64::MAX).then(|| crate::proto::Instant::from_nanos(d))
    }
}

/// How often a bounded wait for a lock looks again.
const RETRY: Duration = Duration::from_micros(200);

/// `m` locked, trying for at most `patience` (a poisoned lock is taken over, as
/// [`Shared::lock`] does); `None` when another thread keeps it that long.
pub fn try_lock_for<T>(m: &Mutex<T>, patience: Duration) -> Option<MutexGuard<'_, T>> {
    let until = Instant::now() + patience;
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < until => {
                std::thread::sleep(RETRY)
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

/// The port's counters the snapshots carry: read with the port locked (they cost system
/// calls: XDP_STATISTICS, a map look-up), stored into the engine after.
struct PortCounters {
    io: IoStats,
    /// Frames the capture recorded and lost, when capturing.
    capture: Option<(u64, u64)>,
}

impl PortCounters {
    fn of(p: &Port) -> PortCounters {
        PortCounters {
            io: p.io.io_stats(),
            capture: p.tap.as_ref().map(|t| (t.recorded(), t.lost())),
        }
    }

    fn store(self, e: &mut Engine) {
        e.io = self.io;
        if let Some((frames, lost)) = self.capture {
            e.stats.capture_frames = frames;
            e.stats.capture_lost = lost;
        }
    }
}

fn run(shared: &Shared, opts: &DriverOptions) {
    // Read once: what a reader compares with /proc/<pid>/stat to tell this process from a
    // later one given the same pid.
    let start_time = process_start_time(std::process::id());
    let epoch = shared.epoch;
    let mut next_stat = epoch;
    let mut stop = false;
    // The last sleep was under a lease and ended on its timeout: the driver slept on
    // the lease, not watching the socket, until it ran out.
    let mut slept_out_a_lease = false;
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            stop = true;
        }
        let now_i = Instant::now();
        let now = poll::engine_time(epoch, now_i);
        // While an application busy-polls, it reads the receive ring: wake only when its
        // lease ends (or it ends it), not for every frame.
        let lease = shared.lease_until(now);
        // (Taken on every turn: a turn that steps again without sleeping must not let an
        // older sleep's verdict speak for a later lapse.)
        let slept_out = std::mem::take(&mut slept_out_a_lease);
        if lease.is_none() && slept_out {
            // This thread slept on a lease that ran out: if the application's last poll
            // found a completion, it stopped polling after it and left the socket
            // unwatched meanwhile: the grace timer must be armed again.
            shared.grace.lease_lapsed();
        }
        // A thread asleep on the socket receives too; look again after a lease.
        let lease = lease.or_else(|| {
            shared
                .rx_waiter
                .load(Ordering::SeqCst)
                .then(|| now + POLL_LEASE)
        });
        let stat_at = poll::engine_time(epoch, next_stat);
        let wake_limit = lease.map_or(stat_at, |l| l.min(stat_at));
        let step = {
            let mut port = shared.lock_port();
            match port.as_mut() {
                // The clock is read again under the port lock: an application thread
                // may have stepped at a later time while this one waited for the lock,
                // and the engine (and the capture) must see time move forward only.
                Some(p) => p.step(
                    shared,
                    shared.now().max(now),
                    Stepper::Driver { wake_limit },
                ),
                None => break,
            }
        };

        // Port counters cost system calls (XDP_STATISTICS, a map look-up): refresh them
        // with the snapshot only.
        if now_i >= next_stat || stop {
            let io = shared.lock_port().as_ref().map(PortCounters::of);
            if let Some(io) = io {
                io.store(&mut shared.lock());
            }
            if let (true, Some(last)) = (stop, &shared.final_stat) {
                write_final_snapshot(shared, last, start_time);
            }
            if let Some(path) = &opts.stat_path {
                if stop {
                    // Closed: the snapshot goes (a reader then says no device runs there).
                    close_snapshot(path);
                } else {
                    write_snapshot(shared, opts, path, start_time);
                }
            }
            next_stat = now_i + opts.stat_interval;
        }
        if stop {
            break;
        }
        if step.stalled {
            std::thread::sleep(TX_BACKOFF);
            continue;
        }
        if !step.idle {
            continue;
        }
        // Sleep until a frame arrives (unless an application polls), the API kicks, the
        // engine's next deadline, the lease's end, or the next snapshot is due.
        let wake_at = shared.wake_at.load(Ordering::SeqCst);
        let mut wait = crate::proto::Instant::from_nanos(wake_at) - now;
        if step.in_flight > 0 {
            // Frames still leaving (zero-copy drivers complete asynchronously): look again
            // soon, while still waking for received frames and kicks.
            wait = wait.min(TX_BACKOFF);
        }
        let ts = Timespec {
            tv_sec: wait.as_secs() as i64,
            tv_nsec: i64::from(wait.subsec_nanos()),
        };
        shared.lock_stats().stats.sleeps += 1;
        // Under a lease the grace timer ends the sleep early when the application stops
        // polling (a shortened lease); the socket is watched otherwise.
        let mut fds = [
            PollFd::new(&shared.wake, PollFlags::IN),
            PollFd::new(&shared.grace.timer, PollFlags::IN),
            PollFd::new(&shared.rx_fd, PollFlags::IN),
            PollFd::new(
                shared.bell_fd.as_ref().unwrap_or(&shared.wake),
                PollFlags::IN,
            ),
        ];
        let n = match (lease.is_some(), shared.bell_fd.is_some()) {
            (true, _) => 2,
            (false, false) => 3,
            (false, true) => 4,
        };
        if n >= 3 {
            shared.lock_stats().stats.sleeps_watching += 1;
        }
        let woken = poll(&mut fds[..n], Some(&ts)).is_ok_and(|k| k > 0);
        if n >= 3 && !(fds[2].revents().is_empty() && fds[3].revents().is_empty()) {
            shared.lock_stats().stats.socket_wakeups += 1;
        }
        slept_out_a_lease = lease.is_some() && !woken;
        let kicked = !fds[0].revents().is_empty();
        if !fds[1].revents().is_empty() {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&shared.grace.timer, &mut b);
            shared.grace.fired();
        }
        shared.sleeping.store(false, Ordering::SeqCst);
        if kicked {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&shared.wake, &mut b);
            shared.lock_stats().stats.app_wakeups += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::frame::{BATCH, sim_link};

    fn snap(pid: u32, start_time: Option<u64>) -> Snapshot {
        Snapshot {
            netdev: "eth0".into(),
            link: None,
            simulated: true,
            pid,
            start_time,
            running: true,
            written_at: 0.0,
            device: serde_json::Value::Null,
            driver: serde_json::Value::Null,
            port: serde_json::Value::Null,
            qps: vec![],
            resources: None,
        }
    }

    #[test]
    fn a_writer_is_alive_only_with_its_pid_and_its_start_time() {
        let me = std::process::id();
        let t = process_start_time(me).unwrap();
        assert!(snap(me, Some(t)).writer_alive());
        // The same pid, another start time: a later process the pid was given to.
        assert!(!snap(me, Some(t + 1)).writer_alive());
        // Older snapshots (no start time) go by the pid.
        assert!(snap(me, None).writer_alive());
        // A pid no process has (above pid_max's largest value, 2^22).
        assert!(!snap(u32::MAX, None).writer_alive());
    }

    #[test]
    fn tx_buffers_are_aligned_and_large_enough() {
        let mut b = poll::TxBufs::new();
        for i in 0..BATCH {
            let s = b.slot(i);
            assert_eq!(s.as_ptr() as usize % 64, 0, "slot {i}");
            assert!(s.len() >= MAX_FRAME_LEN);
        }
    }

    /// A started driver on one end of a simulated link, and the other end (kept open).
    fn sim_driver() -> (Driver, crate::io::frame::SimIo) {
        let (a, b) = sim_link(MAX_FRAME_LEN + 64).unwrap();
        let d = Driver::start(
            Rnic::new(crate::proto::Config::default()),
            Box::new(a),
            DriverOptions::default(),
        )
        .unwrap();
        (d, b)
    }

    /// perftest's ib_write_lat polls its send CQ, then spins on its buffer for the
    /// peer's RDMA WRITE without calling a verb: a lease left at its full length would
    /// keep the driver off the socket (the WRITE unread) for up to POLL_LEASE.
    #[test]
    fn a_poll_that_finds_completions_shortens_the_lease_to_the_grace() {
        let (d, _peer) = sim_driver();
        let s = d.shared();
        let now = s.now();
        let _ = s.poll_progress();
        let long = s.lease_until(now).expect("an empty poll takes the lease");
        assert!(long >= now + POLL_LEASE);
        s.poll_found();
        let short = s.lease_until(now).expect("still leased within the grace");
        assert!(short <= s.now() + poll::POLL_GRACE, "{short}");
        // Without a lease there is nothing to shorten (and no timer to arm).
        s.poll_lease.store(0, Ordering::SeqCst);
        s.poll_found();
        assert_eq!(s.lease_until(crate::proto::Instant::ZERO), None);
        // The next empty poll lengthens the lease again.
        let _ = s.poll_progress();
        assert!(s.lease_until(s.now()).unwrap() > s.now() + poll::POLL_GRACE);
    }

    /// A ping-pong polls on after each completion: the grace timer the completion armed
    /// must not then wake the driver (on an idle VM a wake-up costs tens of µs), so the
    /// first empty poll after it disarms the timer (the lease it lengthened keeps the
    /// driver off meanwhile).
    #[test]
    fn an_empty_poll_after_a_completion_disarms_the_grace_timer() {
        let (d, _peer) = sim_driver();
        let s = d.shared();
        // Retried: the driver thread handles a timer that fires (50 µs) while this thread
        // is preempted, and that disarms it too; the checks that do not depend on the
        // timing hold on every attempt. Each attempt counts two unneeded timers, far
        // below the run that stops arming.
        for attempt in 0.. {
            let _ = s.poll_progress();
            s.poll_found();
            let armed = s.grace.armed();
            let t0 = s.now();
            let _ = s.poll_progress();
            assert!(!s.grace.armed());
            assert!(!timer_running(s), "the next empty poll disarms it");
            let long = s.lease_until(t0).is_some_and(|l| l > t0 + poll::POLL_GRACE);
            // A completion again arms it: an application that stops polling now still
            // hands the socket back to the driver within the grace.
            s.poll_found();
            let again = s.grace.armed();
            let _ = s.poll_progress();
            if armed && long && again {
                break;
            }
            assert!(
                attempt < 20,
                "a completion arms the grace timer ({armed}, {again}); the empty poll \
                 leaves the full lease ({long})"
            );
        }
    }

    /// Once arming is off (the application polls on after its completions), a poll that
    /// finds completions leaves the lease as the last empty poll set it: shortened, it
    /// would lapse whenever the poller is preempted for longer than the grace, and the
    /// driver would then take the socket and the next frames off the ring. The lapse
    /// that matters is still seen: the completion is remembered for `lease_lapsed`.
    #[test]
    fn with_arming_off_a_completion_leaves_the_lease_alone() {
        let (d, _peer) = sim_driver();
        let s = d.shared();
        while s.grace.arming() {
            let _ = s.poll_progress();
            s.poll_found();
        }
        let _ = s.poll_progress();
        let before = s.poll_lease.load(Ordering::SeqCst);
        s.poll_found();
        assert_eq!(s.poll_lease.load(Ordering::SeqCst), before, "not shortened");
        assert!(!s.grace.armed(), "no timer armed");
        assert!(
            s.grace.lease_lapsed(),
            "a lapse after that completion turns arming back on"
        );
        assert!(s.grace.arming());
        // Arming again: the next completion shortens the lease to the grace.
        let _ = s.poll_progress();
        s.poll_found();
        let short = s.lease_until(crate::proto::Instant::ZERO).unwrap();
        assert!(short <= s.now() + poll::POLL_GRACE, "{short}");
    }

    /// Whether the grace timer is counting down. (It reads zero once it fired too:
    /// 50 µs, so a loaded machine may take longer between two lines; `armed` says
    /// whether it was armed.)
    fn timer_running(s: &Shared) -> bool {
        let t = rustix::time::timerfd_gettime(&s.grace.timer).unwrap();
        t.it_value.tv_sec != 0 || t.it_value.tv_nsec != 0
    }

    /// The driver thread itself sees the lapse: with arming off, a completion that is
    /// not followed by an empty poll turns it back on once the driver has slept out the
    /// lease. (Retried: the driver thread must be asleep under the lease when the
    /// completion comes, which a loaded machine may delay; a driver that watches the
    /// socket instead incurs no delay, and rightly does not count a lapse.)
    #[test]
    fn the_driver_turns_arming_back_on_when_the_lease_lapses_at_a_completion() {
        let (d, _peer) = sim_driver();
        let s = d.shared();
        for _attempt in 0..20 {
            let _ = s.poll_progress();
            // Wake the driver so that it sees the lease and sleeps under it.
            s.kick();
            std::thread::sleep(poll::POLL_LEASE / 4);
            let _ = s.poll_progress();
            while s.grace.arming() {
                s.poll_found();
                let _ = s.poll_progress();
            }
            s.poll_found();
            let deadline = std::time::Instant::now() + 4 * poll::POLL_LEASE;
            while !s.grace.arming() && std::time::Instant::now() < deadline {
                std::thread::sleep(poll::POLL_LEASE / 4);
            }
            if s.grace.arming() {
                return;
            }
        }
        panic!("the driver never resumed arming");
    }
}
