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
//! - Completions wake [`Shared::wait_cq`] through a `Condvar`, notified only while
//!   somebody waits, and call the completion hook if one is set
//!   ([`Shared::set_completion_hook`]: the libibverbs library signals its completion
//!   channels from it).
//! - Optional fault injection drops a seeded fraction of received frames before
//!   `handle_frame` (this host kernel has no netem).
//! - Optional stat snapshots: a JSON file rewritten every interval and on exit (read by
//!   `xrnic stat`, and by `xrnic res` for the QP/MR/CQ listing it carries).
//! - Optional capture tap ([`crate::pcap_tap`]): every frame received (before the fault
//!   injector, with the engine's verdict) and sent (with its [`TxReason`](crate::proto::TxReason)) goes to a
//!   pcapng written by a thread of its own; off, it costs a branch per frame.
//! - Dropping the [`Driver`] stops and joins the thread, then drops the port (which
//!   detaches the XDP filter). Nothing else is touched (namespaces stay).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec, eventfd, poll};
use serde::Serialize;

use crate::io::afxdp::XskPort;
use crate::pcap_tap::Tap;
use crate::proto::resources::{Owner, Resources};
use crate::proto::{Cq, DeviceCounters, MAX_FRAME_LEN, QpCounters, QpState, Rnic, WorkCompletion};
use crate::wire::Qpn;

pub mod poll;

pub use poll::POLL_LEASE;
use poll::{Port, Stepper};

/// Frames moved per batch (receive and transmit).
const BATCH: usize = 64;
/// Stride of the transmit buffers: `MAX_FRAME_LEN` rounded up to 64 bytes, so that every
/// buffer starts 64-byte aligned (glibc's slow misaligned `rep movsb`, REFERENCE §7).
const STRIDE: usize = MAX_FRAME_LEN.div_ceil(64) * 64;
/// How long to back off when the port's transmit ring is full.
const TX_BACKOFF: Duration = Duration::from_micros(50);
/// Most kicks per iteration to drain the port's transmit ring.
const MAX_KICKS: usize = 64;

/// Frame I/O below the driver: whole Ethernet frames in and out, and a descriptor that
/// `poll(2)` reports readable when frames wait.
pub trait FrameIo: Send {
    /// Hand every waiting frame (at most a bounded batch) to `f`; never blocks.
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8])) -> io::Result<usize>;
    /// Queue frames in order; returns how many of the leading ones were taken.
    fn send_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize>;
    /// Readable when frames can be received.
    fn poll_fd(&self) -> BorrowedFd<'_>;
    /// [`FrameIo::send_batch`], but the frames may wait in the port until the next
    /// `send_batch` or `flush` pushes them out together with others (the AF_XDP port
    /// leaves them on its tx ring without the `sendto`). Order is kept.
    fn queue_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize>;
    /// Frames queued by `queue_batch` that still wait for a push.
    fn unkicked(&self) -> u32;
    /// Push queued frames out and reclaim finished ones; returns how many frames the
    /// port still has on its way out.
    fn flush(&mut self) -> io::Result<u32>;
    /// Counters of the port.
    fn io_stats(&self) -> IoStats;
}

/// Port counters for the stat snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IoStats {
    pub rx_frames: u64,
    pub tx_frames: u64,
    pub tx_backpressure: u64,
    /// Pushes of queued frames to the wire (AF_XDP: `sendto` kicks; the simulated link:
    /// sends of held frames).
    pub tx_kicks: u64,
    /// Frames the kernel dropped because the rx or fill ring was full (AF_XDP only).
    pub kernel_rx_dropped: u64,
    /// RoCE v2 frames the XDP filter redirected to the socket (AF_XDP only).
    pub filter_redirected: u64,
}

impl FrameIo for XskPort {
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        XskPort::recv_batch(self, f).map_err(io::Error::other)
    }
    fn send_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        XskPort::send_batch(self, frames).map_err(io::Error::other)
    }
    fn queue_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        XskPort::queue_batch(self, frames).map_err(io::Error::other)
    }
    fn unkicked(&self) -> u32 {
        XskPort::unkicked(self)
    }
    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
    fn flush(&mut self) -> io::Result<u32> {
        // Reap first: in copy mode the kernel completes frames inside the kick itself, so
        // most of the time nothing is left and no extra system call is needed.
        self.reap_completions();
        if self.frame_counts().in_tx == 0 {
            return Ok(0);
        }
        XskPort::flush(self).map_err(io::Error::other)
    }
    fn io_stats(&self) -> IoStats {
        let s = self.stats();
        IoStats {
            rx_frames: s.rx_frames,
            tx_frames: s.tx_frames,
            tx_backpressure: s.tx_backpressure,
            tx_kicks: s.tx_kicks,
            kernel_rx_dropped: self.kernel_stats().map(|k| k.rx_dropped).unwrap_or(0),
            filter_redirected: self
                .filter_stats()
                .and_then(Result::ok)
                .map(|f| f.redirected)
                .unwrap_or(0),
        }
    }
}

/// One end of an in-process link: a Unix datagram socket pair carries one frame per
/// datagram. For the runnable examples and for tests of the API without root.
#[derive(Debug)]
pub struct SimIo {
    sock: UnixDatagram,
    buf: Vec<u8>,
    /// Frames queued by `queue_batch`, sent by the next `send_batch` or `flush` (like
    /// frames on an AF_XDP tx ring waiting for the kick).
    held: Vec<Vec<u8>>,
    stats: IoStats,
}

/// Two connected [`SimIo`] ends.
pub fn sim_link() -> io::Result<(SimIo, SimIo)> {
    let (a, b) = UnixDatagram::pair()?;
    let mk = |s: UnixDatagram| -> io::Result<SimIo> {
        s.set_nonblocking(true)?;
        Ok(SimIo {
            sock: s,
            buf: vec![0; MAX_FRAME_LEN + 64],
            held: Vec::new(),
            stats: IoStats::default(),
        })
    };
    Ok((mk(a)?, mk(b)?))
}

impl FrameIo for SimIo {
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut n = 0;
        while n < BATCH {
            match self.sock.recv(&mut self.buf) {
                Ok(len) => {
                    f(&self.buf[..len]);
                    n += 1;
                    self.stats.rx_frames += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }
    fn send_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        if self.push_held()? > 0 {
            // Held frames go first; what did not fit stays held, and nothing may
            // overtake it.
            return Ok(0);
        }
        self.stats.tx_kicks += 1;
        self.send_now(frames)
    }
    fn queue_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        self.held.extend(frames.iter().map(|f| f.to_vec()));
        Ok(frames.len())
    }
    fn unkicked(&self) -> u32 {
        self.held.len() as u32
    }
    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
    fn flush(&mut self) -> io::Result<u32> {
        self.push_held()
    }
    fn io_stats(&self) -> IoStats {
        self.stats
    }
}

impl SimIo {
    fn send_now(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        for (i, f) in frames.iter().enumerate() {
            match self.sock.send(f) {
                Ok(_) => self.stats.tx_frames += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.stats.tx_backpressure += 1;
                    return Ok(i);
                }
                // The other end is gone: the frame is lost, like on a cut cable.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(e),
            }
        }
        Ok(frames.len())
    }

    /// Send the held frames; returns how many are still held (the socket was full).
    fn push_held(&mut self) -> io::Result<u32> {
        if self.held.is_empty() {
            return Ok(0);
        }
        self.stats.tx_kicks += 1;
        let held = std::mem::take(&mut self.held);
        let refs: Vec<&[u8]> = held.iter().map(Vec::as_slice).collect();
        let n = self.send_now(&refs);
        let sent = *n.as_ref().unwrap_or(&0);
        self.held = held;
        self.held.drain(..sent);
        n.map(|_| self.held.len() as u32)
    }
}

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
    /// The device's network interface name, for the snapshot.
    pub netdev: String,
    /// The interface's identity in its namespace, for the snapshot; none for a simulated
    /// device, and the snapshot says `simulated`.
    pub link: Option<LinkId>,
    /// Capture every frame received and sent into this pcapng file ([`crate::pcap_tap`]).
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
    /// A thread waits for a completion asleep on the socket ([`Shared::wait_cq`]).
    rx_waiter: AtomicBool,
    /// The port holds deferred ACKs that no kick has pushed out yet (a hint, so that a
    /// poll with nothing deferred does not lock the port; set and cleared under it).
    tx_deferred: AtomicBool,
    /// Written by `notify` while `rx_waiter`: a completion may be there.
    cq_event: OwnedFd,
    /// The port's descriptor (a duplicate, polled without the port's lock).
    rx_fd: OwnedFd,
    wake: OwnedFd,
    stop: AtomicBool,
    /// The frame I/O, stepped by the driver thread or an application thread
    /// (`None` once the driver stopped). Locked before `engine`, never after.
    port: Mutex<Option<Port>>,
    /// Time zero of the engine's clock.
    epoch: Instant,
}

impl Shared {
    /// Lock the engine. A panic of another holder does not make the engine unusable for
    /// reading counters; the lock is taken over.
    pub fn lock(&self) -> MutexGuard<'_, Engine> {
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
        let g = self.lock();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut n = 0;
        let r = self.completions.wait_timeout_while(g, timeout, |e| {
            n = e.rnic.poll_cq(cq, max, out);
            n == 0
        });
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        drop(r);
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
    /// the socket), and run the completion hook.
    fn notify(&self, socket_waiter: bool) {
        self.run_completion_hook();
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.completions.notify_all();
        }
        if socket_waiter && self.rx_waiter.load(Ordering::SeqCst) {
            // Cannot overflow: the socket waiter reads it back before each sleep.
            let _ = rustix::io::write(&self.cq_event, &1u64.to_ne_bytes());
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
            rx_waiter: AtomicBool::new(false),
            tx_deferred: AtomicBool::new(false),
            cq_event: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?,
            rx_fd,
            wake,
            stop: AtomicBool::new(false),
            port: Mutex::new(Some(Port::new(io, &opts, tap))),
            epoch: Instant::now(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("xrnic-{}", opts.netdev))
            .spawn(move || run(&s, &opts))?;
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
}

fn run(shared: &Shared, opts: &DriverOptions) {
    let epoch = shared.epoch;
    let mut next_stat = epoch;
    let mut stop = false;
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            stop = true;
        }
        let now_i = Instant::now();
        let now = now_i.duration_since(epoch).as_nanos() as u64;
        // While an application busy-polls, it reads the receive ring: wake only when its
        // lease ends (or it ends it), not for every frame.
        let lease = shared.lease_until(now);
        // A thread asleep on the socket receives too; look again after a lease.
        let lease = lease.or_else(|| {
            shared
                .rx_waiter
                .load(Ordering::SeqCst)
                .then(|| now + POLL_LEASE.as_nanos() as u64)
        });
        let stat_at = next_stat.saturating_duration_since(epoch).as_nanos() as u64;
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
            let io = shared.lock_port().as_ref().map(|p| {
                let cap = p.tap.as_ref().map(|t| (t.recorded(), t.lost()));
                (p.io.io_stats(), cap)
            });
            if let Some((io, cap)) = io {
                let mut g = shared.lock();
                g.io = io;
                if let Some((frames, lost)) = cap {
                    g.stats.capture_frames = frames;
                    g.stats.capture_lost = lost;
                }
            }
            if let Some(path) = &opts.stat_path {
                write_snapshot(shared, opts, path, !stop);
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
        let mut wait = Duration::from_nanos(wake_at.saturating_sub(now));
        if step.in_flight > 0 {
            // Frames still leaving (zero-copy drivers complete asynchronously): look again
            // soon, while still waking for received frames and kicks.
            wait = wait.min(TX_BACKOFF);
        }
        let ts = Timespec {
            tv_sec: wait.as_secs() as i64,
            tv_nsec: i64::from(wait.subsec_nanos()),
        };
        shared.lock().stats.sleeps += 1;
        let mut fds = [
            PollFd::new(&shared.wake, PollFlags::IN),
            PollFd::new(&shared.rx_fd, PollFlags::IN),
        ];
        let n = if lease.is_some() { 1 } else { 2 };
        let _ = poll(&mut fds[..n], Some(&ts));
        let kicked = !fds[0].revents().is_empty();
        shared.sleeping.store(false, Ordering::SeqCst);
        if kicked {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&shared.wake, &mut b);
            shared.lock().stats.app_wakeups += 1;
        }
    }
}

/// Which interface a snapshot was written for: its index and MAC address in its network
/// namespace. A snapshot's file is named by the namespace's inode, and the kernel reuses
/// the inode of a deleted namespace; a reader compares these with the interface it sees
/// ([`crate::verbs::snapshot_is_here`]) so that a file left by a namespace that is gone is
/// not taken for a device of the new one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct LinkId {
    pub ifindex: u32,
    /// `aa:bb:cc:dd:ee:ff`, as `ip link` prints it.
    pub mac: String,
}

impl LinkId {
    pub fn new(ifindex: u32, mac: [u8; 6]) -> LinkId {
        LinkId {
            ifindex,
            mac: crate::verbs::netdev::mac_text(&mac),
        }
    }
}

/// The stat snapshot `xrnic stat` reads (see docs/rnic.md).
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub netdev: String,
    /// The interface written for; absent for simulated devices (and in snapshots of older
    /// xrnic versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkId>,
    /// Written by a simulated device (no interface; [`crate::verbs::Device::open_sim_pair`]).
    #[serde(default)]
    pub simulated: bool,
    pub pid: u32,
    /// False in the last snapshot, written when the device closed.
    pub running: bool,
    /// Seconds since the Unix epoch when written.
    pub written_at: f64,
    pub device: serde_json::Value,
    pub driver: serde_json::Value,
    pub port: serde_json::Value,
    pub qps: Vec<QpSnapshot>,
    /// Every QP, MR and CQ (`Rnic::resources`), for `xrnic res`; absent in snapshots of
    /// older xrnic versions.
    #[serde(default)]
    pub resources: Option<Resources>,
}

/// One QP in the snapshot.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct QpSnapshot {
    pub qpn: u32,
    pub state: String,
    pub dest_qpn: u32,
    pub counters: serde_json::Value,
    /// DCQCN's current rate, target rate and α of the QP; absent while congestion control
    /// is off (and in snapshots of older xrnic versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<crate::proto::congestion::QpRateStatus>,
}

/// This process's name as `rdma resource show` prints it (`comm`).
fn process_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|c| c.trim_end().to_string())
        .unwrap_or_else(|_| "?".to_string())
}

fn snapshot(e: &Engine, opts: &DriverOptions, running: bool, comm: String) -> Snapshot {
    let dev: DeviceCounters = e.rnic.counters();
    let mut resources = e.rnic.resources();
    // Named as the verbs API names the device (`ibv_get_device_name`), not as the
    // engine's trace events do.
    resources.dev = format!("xrnic_{}", opts.netdev);
    resources.owner = Some(Owner {
        pid: std::process::id(),
        comm,
    });
    let qps = e
        .qps
        .keys()
        .filter_map(|&q| {
            let a = e.rnic.query_qp(q).ok()?;
            let c: QpCounters = e.rnic.qp_counters(q)?;
            Some(QpSnapshot {
                qpn: q.value(),
                state: state_name(a.qp_state).to_string(),
                dest_qpn: a.dest_qp_num.value(),
                counters: serde_json::to_value(c).unwrap_or_default(),
                rate: e.rnic.congestion().and_then(|cc| cc.qp_status(q)),
            })
        })
        .collect();
    Snapshot {
        netdev: opts.netdev.clone(),
        link: opts.link.clone(),
        simulated: opts.link.is_none(),
        pid: std::process::id(),
        running,
        written_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0),
        device: serde_json::to_value(dev).unwrap_or_default(),
        driver: serde_json::to_value(e.stats).unwrap_or_default(),
        port: serde_json::to_value(e.io).unwrap_or_default(),
        qps,
        resources: Some(resources),
    }
}

/// The libibverbs spelling of a QP state (`ibv_qp_state`, as `rdma resource show` prints).
pub fn state_name(s: QpState) -> &'static str {
    match s {
        QpState::Reset => "RESET",
        QpState::Init => "INIT",
        QpState::Rtr => "RTR",
        QpState::Rts => "RTS",
        QpState::Sqd => "SQD",
        QpState::Sqe => "SQE",
        QpState::Err => "ERR",
    }
}

/// Write the snapshot atomically (a temporary file renamed over the old one), so that a
/// reader never sees half a file. Failures are ignored: stats are best effort.
fn write_snapshot(shared: &Shared, opts: &DriverOptions, path: &std::path::Path, running: bool) {
    // Read before taking the lock: the engine lock is held for bounded in-memory work only.
    let comm = process_name();
    let snap = snapshot(&shared.lock(), opts, running, comm);
    let Ok(text) = serde_json::to_vec_pretty(&snap) else {
        return;
    };
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tx_buffers_are_aligned_and_large_enough() {
        let mut b = poll::TxBufs::new();
        for i in 0..BATCH {
            let s = b.slot(i);
            assert_eq!(s.as_ptr() as usize % 64, 0, "slot {i}");
            assert!(s.len() >= MAX_FRAME_LEN);
        }
    }

    #[test]
    fn sim_link_carries_whole_frames_both_ways() {
        let (mut a, mut b) = sim_link().unwrap();
        let f1 = vec![1u8; 60];
        let f2 = vec![2u8; MAX_FRAME_LEN];
        assert_eq!(a.send_batch(&[&f1, &f2]).unwrap(), 2);
        let mut got = vec![];
        b.recv_batch(&mut |f| got.push(f.to_vec())).unwrap();
        assert_eq!(got, vec![f1.clone(), f2]);
        assert_eq!(b.send_batch(&[&f1]).unwrap(), 1);
        let mut n = 0;
        a.recv_batch(&mut |_| n += 1).unwrap();
        assert_eq!(n, 1);
        assert_eq!(a.io_stats().tx_frames, 2);
        assert_eq!(a.io_stats().rx_frames, 1);
    }
}
