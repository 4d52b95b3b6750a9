//! The client backend: a device served by the device service (`xrnic up IF`,
//! src/service) in another process.
//!
//! Contract:
//! - [`Conn::connect`] looks for the service of an interface (the abstract socket
//!   `@xrnic/<IF>` of the caller's network namespace); `Ok(None)` when none listens, so the
//!   caller opens the in-process device instead (and says so: [`super::Device::service_pid`]).
//!   Before it sends anything it checks who listens there (SO_PEERCRED): root or this
//!   process's own effective uid, else EACCES naming the listener's pid and uid
//!   ([`ipc::connect_service`]): an abstract name can be bound by any user first.
//! - Control verbs (PD, MR, CQ, QP of type RC, UC or UD, AH, SRQ: create / modify /
//!   query / destroy) are one request and one answer each on the socket, serialised by a
//!   lock. An AH is the service's (it resolves the MAC there); the client keeps its
//!   handle and the resolved vector.
//! - A UD send names the AH by its handle, the remote QPN and Q_Key in its slot; a
//!   receive for an SRQ names the SRQ's handle. A receive of a UD or UC QP or an SRQ
//!   returns once the service has put it in the engine ([`Conn::wait_done`]); one the
//!   SRQ refused (full) fails then, as in-process.
//! - The data path is shared memory: `post_send` / `post_recv` (and `post_send_ud`,
//!   `post_srq_recv`) write a slot into the
//!   submission ring and write the doorbell (a pipe: src/io/shm.rs, "Wakeups"); `poll`
//!   reads the CQ's ring and makes no system call; `wait` sleeps on the CQ's event pipe.
//!   This process also holds a read end of its doorbell pipe of its own, never read, so
//!   a post after the service is gone fills the pipe (EAGAIN, taken as rung) instead of
//!   raising SIGPIPE in the program (pipe(7)).
//! - Asynchronous events: the service forwards its device's unaffiliated events
//!   (PORT_ACTIVE, PORT_ERR, DEVICE_FATAL) to every client and writes the client's event
//!   notifier; [`Conn::poll_event`] then fetches them (one control request) and keeps
//!   them in order. The port state follows them; after DEVICE_FATAL posts fail here
//!   with [`VerbsError::DeviceFatal`] and control verbs get EIO from the service.
//! - Memory: a region is the caller's own memory, which the service reads and writes
//!   through the `/proc/PID/mem` it opened at hello (src/service/client_mem.rs);
//!   [`Pd::reg_mr`](super::Pd::reg_mr) allocates zeroed memory
//!   here and registers it so.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::net::RecvFlags;

use super::{Error, Result, VerbsError};
use crate::io::shm::{self, Pop, Ring};
use crate::ipc::{self, Req, Resp};
use crate::proto::{QpType, RecvWr, SendWr, SrqAttr, UserMem, WorkCompletion, WrOpcode};
use crate::wire::Qpn;

/// A connection to the service.
#[derive(Debug)]
pub(crate) struct Conn {
    sock: Mutex<OwnedFd>,
    sq: Mutex<Ring>,
    /// The write end of the doorbell pipe.
    doorbell: OwnedFd,
    /// A read end of the doorbell pipe (its own description), never read: the pipe
    /// always has a reader here (see the module documentation).
    _doorbell_reader: Option<OwnedFd>,
    /// Readable when completions arrived in any CQ ring of this connection.
    notify: Arc<OwnedFd>,
    /// Readable when the service holds events for this connection.
    events_fd: Arc<OwnedFd>,
    /// The hook thread saw (and read) `events_fd`: events to fetch.
    events_due: Arc<AtomicBool>,
    /// Events fetched and not yet polled.
    events: Mutex<VecDeque<crate::proto::AsyncEvent>>,
    /// The port as the last port event left it: 0 none seen, 1 active, 2 down.
    port: AtomicU8,
    /// DEVICE_FATAL was fetched.
    fatal: AtomicBool,
    hook: Arc<HookState>,
    /// Per QP without an SRQ (by number): its receives posted and not yet polled
    /// ([`RemoteQp::recv_out`]), counted down by [`RemoteCq::poll_into`].
    recv_out: Mutex<HashMap<u32, Arc<AtomicU32>>>,
    pub service_pid: u32,
    pub active_mtu: u32,
    pub max_mtu: u32,
}

fn proto_err(msg: &str) -> Error {
    Error::Io(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("device service: {msg}"),
    ))
}

impl Conn {
    /// Count down the receives of `wcs` from their QPs' outstanding receives.
    fn received(&self, wcs: &[WorkCompletion]) {
        use crate::proto::WcOpcode;
        let mut recvs = wcs
            .iter()
            .filter(|w| matches!(w.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm))
            .peekable();
        if recvs.peek().is_none() {
            return;
        }
        let m = self.recv_out.lock().unwrap_or_else(|p| p.into_inner());
        for w in recvs {
            if let Some(c) = m.get(&w.qp_num.value()) {
                let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
            }
        }
    }

    /// Connect to the service of `ifname`, or `Ok(None)` when none listens.
    pub fn connect(ifname: &str) -> Result<Option<Conn>> {
        // Checked before anything is sent: a listener of another user is refused
        // (EACCES, naming its pid and uid: ipc::connect_service).
        let Some(sock) = ipc::connect_service(ifname)? else {
            return Ok(None);
        };
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
        let (resp, mut fds) = call_on(
            &sock,
            &Req::Hello {
                comm: comm.trim_end().to_string(),
            },
        )?;
        let Resp::Hello {
            service_pid,
            active_mtu,
            max_mtu,
            sq_slots,
        } = resp
        else {
            return Err(proto_err("unexpected answer to hello"));
        };
        if fds.len() != 4 {
            return Err(proto_err(
                "hello without its ring, doorbell and notifiers (a service of another version?)",
            ));
        }
        let events_fd = Arc::new(fds.pop().ok_or_else(|| proto_err("no event notifier"))?);
        let notify = Arc::new(fds.pop().ok_or_else(|| proto_err("no notifier"))?);
        let doorbell = fds.pop().ok_or_else(|| proto_err("no doorbell"))?;
        let ring_fd = fds.pop().ok_or_else(|| proto_err("no ring"))?;
        let sq = Ring::map(ring_fd, sq_slots, ipc::SQ_SLOT_BYTES)?;
        let doorbell_reader = reader_of(&doorbell);
        Ok(Some(Conn {
            sock: Mutex::new(sock),
            sq: Mutex::new(sq),
            doorbell,
            _doorbell_reader: doorbell_reader,
            notify,
            events_fd,
            events_due: Arc::default(),
            events: Mutex::default(),
            port: AtomicU8::new(0),
            fatal: AtomicBool::new(false),
            hook: Arc::default(),
            recv_out: Mutex::default(),
            service_pid,
            active_mtu,
            max_mtu,
        }))
    }

    /// One control verb.
    pub fn call(&self, req: &Req) -> Result<(Resp, Vec<OwnedFd>)> {
        let sock = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        call_on(&sock, req)
    }

    /// A verb whose answer is `Ok`.
    pub fn call_ok(&self, req: &Req) -> Result<()> {
        match self.call(req)?.0 {
            Resp::Ok => Ok(()),
            _ => Err(proto_err("unexpected answer")),
        }
    }

    /// The next asynchronous event the service forwarded, oldest first (fetched from
    /// the service when its event notifier was written).
    pub fn poll_event(&self) -> Option<crate::proto::AsyncEvent> {
        use crate::proto::AsyncEvent as E;
        let mut q = self.events.lock().unwrap_or_else(|p| p.into_inner());
        // Non-blocking (the service made the pipe so): nothing to read, nothing due.
        let read = shm::take_wakeups(self.events_fd.as_fd()) == shm::Wakeups::Some;
        if self.events_due.swap(false, Ordering::SeqCst) || read {
            match self.call(&Req::AsyncEvents) {
                Ok((Resp::AsyncEvents { events, elements }, _)) => {
                    let decoded = events.into_iter().enumerate().filter_map(|(i, v)| {
                        ipc::decode_event(v, elements.get(i).copied().unwrap_or(0))
                    });
                    for e in decoded {
                        match e {
                            E::PortActive(_) => self.port.store(1, Ordering::SeqCst),
                            E::PortErr(_) => self.port.store(2, Ordering::SeqCst),
                            E::DeviceFatal => {
                                self.port.store(2, Ordering::SeqCst);
                                self.fatal.store(true, Ordering::SeqCst);
                            }
                            _ => {}
                        }
                        q.push_back(e);
                    }
                }
                Ok(_) => tracing::warn!("device service: unexpected answer to async events"),
                Err(e) => tracing::debug!("device service: async events: {e}"),
            }
        }
        q.pop_front()
    }

    /// The port state the last port event gave (`None`: no event yet), and whether the
    /// device is gone, as far as the events polled so far tell.
    pub fn port_active(&self) -> Option<bool> {
        match self.port.load(Ordering::SeqCst) {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        }
    }

    /// DEVICE_FATAL was polled ([`Conn::poll_event`]).
    pub fn is_fatal(&self) -> bool {
        self.fatal.load(Ordering::SeqCst)
    }

    /// Append one submission slot and ring the doorbell; the ring's producer index after
    /// it.
    fn submit(&self, w: Option<[u64; ipc::SQ_WORDS]>) -> Result<u32> {
        if self.is_fatal() {
            return Err(Error::Verbs(VerbsError::DeviceFatal));
        }
        let w = w.ok_or(Error::Verbs(VerbsError::InvalidValue(
            "more scatter/gather entries than the service's ring carries",
        )))?;
        let sq = self.sq.lock().unwrap_or_else(|p| p.into_inner());
        if !sq.push(&w) {
            drop(sq);
            // Still ring: the service drains what is there (and resets a ring whose
            // indices someone broke), so a later post finds room.
            shm::wake(self.doorbell.as_fd())?;
            return Err(Error::Verbs(VerbsError::QueueFull));
        }
        let at = sq.producer();
        drop(sq);
        shm::wake(self.doorbell.as_fd())?;
        Ok(at)
    }

    /// Wait until the service has acted on every slot before index `upto` (its "done"
    /// index, `Ring::set_done`): a receive is then in the engine. A UD or UC receive
    /// must be there before the program tells its peer to send (out of band, as
    /// ibv_ud_pingpong does over TCP): these services drop a message that finds no
    /// receive (IBTA §9.8.3.1 UD, §9.8.2 UC), where RC answers RNR and the peer
    /// retries. The kernel's post_recv returns once the WQE is in the device's queue;
    /// this makes the service's do the same. Bounded (a service that died or stopped
    /// answering does not hang the program: 5 s, then the post stands as queued).
    /// True when the service said so, false when the wait ended otherwise.
    fn wait_done(&self, upto: u32) -> bool {
        let end = Instant::now() + Duration::from_secs(5);
        for spin in 0u32.. {
            let done = self.sq.lock().unwrap_or_else(|p| p.into_inner()).done();
            if done.wrapping_sub(upto) as i32 >= 0 {
                return true;
            }
            if self.is_fatal() || Instant::now() > end {
                return false;
            }
            if spin < 256 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        false
    }

    /// Set or clear the completion hook: a thread of this process runs it whenever the
    /// service signals completions (the library's completion channels).
    pub fn set_completion_hook(&self, hook: Option<crate::driver::CompletionHook>) {
        let mut g = self.hook.slot.lock().unwrap_or_else(|p| p.into_inner());
        let start = hook.is_some() && !g.1;
        if start {
            g.1 = true;
        }
        g.0 = hook;
        drop(g);
        if start {
            let (h, n) = (self.hook.clone(), self.notify.clone());
            let (e, due) = (self.events_fd.clone(), self.events_due.clone());
            std::thread::spawn(move || hook_thread(&h, &n, &e, &due));
        }
    }

    pub fn post_send(&self, qpn: Qpn, wr: &SendWr) -> Result<()> {
        self.submit(ipc::encode_send(qpn, wr)).map(drop)
    }

    /// `ready`: return only once the service has put it in the engine ([`Conn::wait_done`]);
    /// `full`: the receive queue may be full, so wait and fail as in process (ENOMEM)
    /// when the engine refused it (the ring's refused index names this slot).
    pub fn post_recv(&self, qpn: Qpn, wr: &RecvWr, ready: bool, full: bool) -> Result<()> {
        let at = self.submit(ipc::encode_recv(qpn, wr))?;
        if full {
            if self.wait_done(at) {
                let refused = self.sq.lock().unwrap_or_else(|p| p.into_inner()).refused();
                if refused == at {
                    return Err(VerbsError::QueueFull.into());
                }
            }
        } else if ready {
            self.wait_done(at);
        }
        Ok(())
    }

    pub fn post_send_ud(&self, qpn: Qpn, wr: &SendWr, to: &ipc::UdTarget) -> Result<()> {
        self.submit(ipc::encode_send_ud(qpn, wr, to)).map(drop)
    }

    /// Returns once the service has put it in the SRQ ([`Conn::wait_done`]: an SRQ may
    /// serve UC QPs), or fails as in-process when the engine refused it (the SRQ full:
    /// the ring's refused index names this slot). Two threads posting to SRQs of one
    /// connection at once may miss a refusal: the index keeps the last one.
    pub fn post_srq_recv(&self, srq: u32, wr: &RecvWr) -> Result<()> {
        let at = self.submit(ipc::encode_srq_recv(srq, wr))?;
        if self.wait_done(at) {
            let refused = self.sq.lock().unwrap_or_else(|p| p.into_inner()).refused();
            if refused == at {
                return Err(VerbsError::QueueFull.into());
            }
        }
        Ok(())
    }
}

/// The completion hook and whether its thread runs.
#[derive(Default)]
struct HookState {
    slot: Mutex<(Option<crate::driver::CompletionHook>, bool)>,
}

impl core::fmt::Debug for HookState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("HookState")
    }
}

/// Wait for the service's completion or event signal and run the hook (which moves the
/// events: [`Conn::poll_event`], told by `due`); ends when the hook is cleared.
fn hook_thread(h: &HookState, notify: &OwnedFd, events: &OwnedFd, due: &AtomicBool) {
    loop {
        let mut fds = [
            PollFd::new(notify, PollFlags::IN),
            PollFd::new(events, PollFlags::IN),
        ];
        let ts = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let mut signalled = rustix::event::poll(&mut fds, Some(&ts)).unwrap_or(0) > 0;
        let evented = !fds[1].revents().is_empty();
        let taken = shm::take_wakeups(notify.as_fd());
        if evented && shm::take_wakeups(events.as_fd()) == shm::Wakeups::Some {
            due.store(true, Ordering::SeqCst);
        }
        if taken == shm::Wakeups::Closed {
            // The service is gone: its end of the pipe stays at EOF (readable); wait
            // instead of spinning on it until the hook is cleared.
            signalled = false;
            std::thread::sleep(Duration::from_millis(100));
        }
        let g = h.slot.lock().unwrap_or_else(|p| p.into_inner());
        match &g.0 {
            Some(_) if !signalled => drop(g),
            Some(hook) => {
                let hook = hook.clone();
                drop(g);
                hook();
            }
            None => {
                drop(g);
                let mut g = h.slot.lock().unwrap_or_else(|p| p.into_inner());
                if g.0.is_none() {
                    g.1 = false;
                    return;
                }
            }
        }
    }
}

/// A read end of the pipe whose write end is `w`, as its own open file description:
/// opening /proc/self/fd/N of a pipe opens the pipe again (proc(5), pipe(7)). `None`
/// (logged) without /proc.
fn reader_of(w: &OwnedFd) -> Option<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(w));
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC;
    match rustix::fs::open(path.as_str(), flags, Mode::empty()) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::debug!("device service: no reader of the doorbell pipe of our own: {e}");
            None
        }
    }
}

fn call_on(sock: &OwnedFd, req: &Req) -> Result<(Resp, Vec<OwnedFd>)> {
    let text = serde_json::to_vec(req).map_err(|e| proto_err(&e.to_string()))?;
    // Answers to verbs are small (`xrnic res` reads its own, larger, answers).
    let mut buf = vec![0u8; 64 * 1024];
    let sent = shm::send_with_fds(sock.as_fd(), &text, &[]);
    // A connection the service refused (its bounds: src/service/limits.rs) was told why
    // (EMFILE) and closed, maybe before this request went: that answer is the error.
    let flags = if sent.is_ok() {
        RecvFlags::empty()
    } else {
        RecvFlags::DONTWAIT
    };
    let (n, fds) = match (shm::recv_with_fds(sock.as_fd(), &mut buf, flags), sent) {
        (Ok(Some(got)), _) => got,
        (_, Err(e)) => return Err(e.into()),
        (Ok(None), Ok(())) => return Err(proto_err("the service closed the connection")),
        (Err(e), Ok(())) => return Err(e.into()),
    };
    let resp: Resp = serde_json::from_slice(&buf[..n]).map_err(|e| proto_err(&e.to_string()))?;
    if let Resp::Err { errno, msg } = resp {
        // The errno is what a C caller gets (`Error::errno`, src/verbs/error.rs); the reason is logged.
        tracing::debug!("device service refused {req:?}: {msg}");
        return Err(Error::Io(io::Error::from_raw_os_error(errno)));
    }
    Ok((resp, fds))
}

/// A CQ of the service: its completion ring and event fd.
#[derive(Debug)]
pub(crate) struct RemoteCq {
    pub conn: Arc<Conn>,
    pub id: u32,
    ring: Mutex<Ring>,
    event: OwnedFd,
}

impl RemoteCq {
    pub fn create(conn: &Arc<Conn>, cqe: usize) -> Result<RemoteCq> {
        let cqe = u32::try_from(cqe).map_err(|_| Error::Verbs(VerbsError::InvalidValue("cqe")))?;
        let (resp, mut fds) = conn.call(&Req::CreateCq { cqe })?;
        let Resp::Cq { cq, slots } = resp else {
            return Err(proto_err("unexpected answer to create_cq"));
        };
        let (Some(event), Some(ring)) = (fds.pop(), fds.pop()) else {
            return Err(proto_err("create_cq without its ring"));
        };
        Ok(RemoteCq {
            conn: conn.clone(),
            id: cq,
            ring: Mutex::new(Ring::map(ring, slots, ipc::CQ_SLOT_BYTES)?),
            event,
        })
    }

    /// `ibv_resize_cq` through the service.
    pub fn resize(&self, cqe: usize) -> Result<()> {
        let cqe = u32::try_from(cqe).map_err(|_| Error::Verbs(VerbsError::InvalidValue("cqe")))?;
        self.conn.call_ok(&Req::ResizeCq { cq: self.id, cqe })
    }

    pub fn poll_into(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let mut w = [0u64; ipc::CQ_WORDS];
        let mut n = 0;
        while n < max {
            match ring.pop(&mut w) {
                Pop::Item => {
                    out.push(ipc::decode_wc(&w));
                    n += 1;
                }
                Pop::Empty | Pop::Corrupt => break,
            }
        }
        drop(ring);
        self.conn.received(&out[out.len() - n..]);
        if n == 0 {
            // A program spinning on an empty CQ (ibv_poll_cq in a loop, as perftest and
            // ibv_rc_pingpong do) would otherwise hold the CPU the service needs to
            // produce its completion whenever cores are fewer than busy threads.
            std::thread::yield_now();
        }
        n
    }

    pub fn pending(&self) -> usize {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        ring.fill().min(ring.capacity()) as usize
    }

    pub fn wait_into(&self, max: usize, timeout: Duration, out: &mut Vec<WorkCompletion>) -> usize {
        let end = Instant::now() + timeout;
        loop {
            let n = self.poll_into(max, out);
            let left = end.saturating_duration_since(Instant::now());
            if n > 0 || left.is_zero() {
                return n;
            }
            let ts = rustix::time::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let mut fds = [PollFd::new(&self.event, PollFlags::IN)];
            let _ = rustix::event::poll(&mut fds, Some(&ts));
            if shm::take_wakeups(self.event.as_fd()) == shm::Wakeups::Closed {
                // The service is gone (EOF stays readable): nothing more will come.
                std::thread::sleep(left);
            }
        }
    }
}

impl Drop for RemoteCq {
    fn drop(&mut self) {
        if let Err(e) = self.conn.call_ok(&Req::DestroyCq { cq: self.id }) {
            tracing::error!("destroy_cq through the service: {e}");
        }
    }
}

/// A PD of the service.
#[derive(Debug)]
pub(crate) struct RemotePd {
    pub conn: Arc<Conn>,
    pub id: u32,
}

impl RemotePd {
    pub fn alloc(conn: &Arc<Conn>) -> Result<RemotePd> {
        match conn.call(&Req::AllocPd)?.0 {
            Resp::Pd { pd } => Ok(RemotePd {
                conn: conn.clone(),
                id: pd,
            }),
            _ => Err(proto_err("unexpected answer to alloc_pd")),
        }
    }

    /// Register `len` bytes at `addr` of this process; `(lkey, rkey)`.
    pub fn reg(&self, addr: u64, len: usize, iova: u64, access: u32) -> Result<(u32, u32)> {
        let req = Req::RegMr {
            pd: self.id,
            addr,
            len: len as u64,
            iova,
            access,
        };
        match self.conn.call(&req)?.0 {
            Resp::Mr { lkey, rkey } => Ok((lkey, rkey)),
            _ => Err(proto_err("unexpected answer to reg_mr")),
        }
    }
}

impl Drop for RemotePd {
    fn drop(&mut self) {
        if let Err(e) = self.conn.call_ok(&Req::DeallocPd { pd: self.id }) {
            tracing::error!("dealloc_pd through the service: {e}");
        }
    }
}

/// An MR of the service; `buf`: memory allocated here for [`Pd::reg_mr`](super::Pd::reg_mr)
/// (zeroed, atomically accessed words, so the service writing it meanwhile is no data
/// race), read and written through `mem`.
#[derive(Debug)]
pub(crate) struct RemoteMr {
    pub pd: Arc<RemotePd>,
    pub lkey: u32,
    buf: Option<(Box<[AtomicU64]>, UserMem)>,
}

impl RemoteMr {
    pub fn new_user(pd: &Arc<RemotePd>, lkey: u32) -> RemoteMr {
        RemoteMr {
            pd: pd.clone(),
            lkey,
            buf: None,
        }
    }

    /// Zeroed memory of `len` bytes here: its address and the buffer to keep.
    pub fn alloc(len: usize) -> Result<(u64, Box<[AtomicU64]>, UserMem)> {
        let words: Box<[AtomicU64]> = (0..len.div_ceil(8).max(1))
            .map(|_| AtomicU64::new(0))
            .collect();
        let addr = words.as_ptr() as u64;
        let mem = UserMem::remote(std::process::id() as i32, addr, len)
            .ok_or(Error::Verbs(VerbsError::Resource("address range")))?;
        Ok((addr, words, mem))
    }

    pub fn new_owned(
        pd: &Arc<RemotePd>,
        lkey: u32,
        words: Box<[AtomicU64]>,
        mem: UserMem,
    ) -> RemoteMr {
        RemoteMr {
            pd: pd.clone(),
            lkey,
            buf: Some((words, mem)),
        }
    }

    /// The bytes of an owned region (`None` for the caller's memory).
    pub fn mem(&self) -> Option<&UserMem> {
        self.buf.as_ref().map(|(_, m)| m)
    }
}

impl Drop for RemoteMr {
    fn drop(&mut self) {
        // Deregistered before `buf` is freed (fields drop after this body).
        if let Err(e) = self.pd.conn.call_ok(&Req::DeregMr { lkey: self.lkey }) {
            tracing::error!("dereg_mr through the service: {e}");
        }
    }
}

/// A QP of the service.
#[derive(Debug)]
pub(crate) struct RemoteQp {
    pub pd: Arc<RemotePd>,
    pub _cqs: [Arc<RemoteCq>; 2],
    pub qpn: Qpn,
    /// The state this client last moved the QP to (RESET when created). A post is
    /// queued on the submission ring and cannot fail when the service takes it, so the
    /// checks a post must fail synchronously (a send before RTS, a receive in RESET:
    /// EINVAL, as the engine and rxe answer) are made here. The engine moves a QP on its
    /// own only from RTS or SQD to SQE or ERR, where posts are legal, so this mirror is
    /// exact for those checks.
    pub state: Mutex<crate::proto::QpState>,
    pub qp_type: QpType,
    /// The SRQ its receive WQEs come from, kept as long as the QP.
    pub srq: Option<Arc<RemoteSrq>>,
    /// The receive queue's size, and the receives posted and not yet polled: more of
    /// those than the queue holds, and the queue may be full (the engine may have
    /// completed some the program has not polled, never more), so a post then waits to
    /// learn whether the engine took it (ENOMEM when not, as in process; otherwise no
    /// post waits for it).
    pub recv_depth: u32,
    pub recv_out: Arc<AtomicU32>,
}

impl RemoteQp {
    /// The checks of an RC or UC send the in-process engine makes at once
    /// (src/proto/device.rs `post_send_rc`): a UD QP sends only with an AH, a UC QP
    /// neither READ, atomics nor SEND with invalidate (rxe's opcode table); then the
    /// state ([`RemoteQp::check_post`]).
    pub fn check_send(&self, wr: &SendWr) -> Result<()> {
        match self.qp_type {
            QpType::Ud => {
                return Err(VerbsError::InvalidValue(
                    "a UD QP sends with post_send_ud (an address handle per WR)",
                )
                .into());
            }
            QpType::Uc if !crate::proto::uc::wr_allowed(wr.opcode) => {
                self.check_post(true)?;
                // In ERR the engine flushes any WR (IBTA §10.3) before it looks at it.
                let s = *self.state.lock().unwrap_or_else(|p| p.into_inner());
                if s != crate::proto::QpState::Err {
                    return Err(VerbsError::InvalidValue("opcode not supported on a UC QP").into());
                }
            }
            _ => {}
        }
        self.check_post(true)
    }

    /// What the in-process engine answers a post in this state (src/proto/device.rs
    /// `post_send_rc` / `post_recv`, src/proto/qp.rs `refuse_post_recv`): a send needs
    /// RTS or later, a receive INIT or later and a QP without an SRQ.
    pub fn check_post(&self, send: bool) -> Result<()> {
        use crate::proto::QpState as S;
        if !send && self.srq.is_some() {
            return Err(VerbsError::InvalidValue(
                "post_recv on a QP created with an SRQ (post to the SRQ)",
            )
            .into());
        }
        let s = *self.state.lock().unwrap_or_else(|p| p.into_inner());
        let refused = if send {
            matches!(s, S::Reset | S::Init | S::Rtr)
        } else {
            s == S::Reset
        };
        if refused {
            return Err(VerbsError::WrongState(s).into());
        }
        Ok(())
    }
}

impl Drop for RemoteQp {
    fn drop(&mut self) {
        self.pd
            .conn
            .recv_out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.qpn.value());
        if let Err(e) = self.pd.conn.call_ok(&Req::DestroyQp {
            qpn: self.qpn.value(),
        }) {
            tracing::error!("destroy_qp through the service: {e}");
        }
    }
}

fn unexpected(verb: &str) -> Error {
    proto_err(&format!("unexpected answer to {verb}"))
}

/// `ibv_create_qp` through the service: RC, UC or UD, on an SRQ of the same connection
/// or none. Every object must be of the PD's connection (the service looks handles up
/// in the caller's own tables only).
pub(super) fn create_qp(
    dev: &super::Device,
    pd: &Arc<RemotePd>,
    cqs: [&Arc<RemoteCq>; 2],
    init: &super::QpInitAttr<'_>,
    qp_type: QpType,
    srq: Option<&Arc<RemoteSrq>>,
) -> Result<super::Qp> {
    let same = |c: &Arc<Conn>| Arc::ptr_eq(c, &pd.conn);
    if !cqs.iter().all(|c| same(&c.conn)) || srq.is_some_and(|s| !same(&s.pd.conn)) {
        return Err(Error::DeviceMismatch);
    }
    let req = Req::CreateQp {
        pd: pd.id,
        send_cq: cqs[0].id,
        recv_cq: cqs[1].id,
        max_send_wr: init.max_send_wr,
        max_recv_wr: init.max_recv_wr,
        sq_sig_all: init.sq_sig_all,
        qp_type,
        srq: srq.map(|s| s.id),
    };
    let Resp::Qp { qpn } = pd.conn.call(&req)?.0 else {
        return Err(unexpected("create_qp"));
    };
    let recv_out = Arc::new(AtomicU32::new(0));
    if srq.is_none() {
        pd.conn
            .recv_out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(qpn, recv_out.clone());
    }
    Ok(super::Qp {
        qpn: Qpn::new(qpn),
        dev: dev.clone(),
        kind: super::qp::QpKind::Svc(RemoteQp {
            pd: pd.clone(),
            _cqs: [cqs[0].clone(), cqs[1].clone()],
            qpn: Qpn::new(qpn),
            state: Mutex::new(crate::proto::QpState::Reset),
            qp_type,
            srq: srq.cloned(),
            recv_depth: init.max_recv_wr,
            recv_out,
        }),
    })
}

/// An address handle the service made for this connection (its MAC resolved there).
#[derive(Debug)]
pub(crate) struct RemoteAh {
    pub conn: Arc<Conn>,
    pub id: u32,
}

impl RemoteAh {
    /// `ibv_create_ah` through the service: the handle and the resolved vector.
    pub fn create(
        pd: &RemotePd,
        av: &crate::proto::AddressVector,
    ) -> Result<(RemoteAh, crate::proto::AddressVector)> {
        let req = Req::CreateAh { pd: pd.id, av: *av };
        let Resp::Ah { ah, av } = pd.conn.call(&req)?.0 else {
            return Err(unexpected("create_ah"));
        };
        let h = RemoteAh {
            conn: pd.conn.clone(),
            id: ah,
        };
        Ok((h, av))
    }
}

impl Drop for RemoteAh {
    fn drop(&mut self) {
        if let Err(e) = self.conn.call_ok(&Req::DestroyAh { ah: self.id }) {
            tracing::error!("destroy_ah through the service: {e}");
        }
    }
}

/// A UD send through the service: SEND or SEND_WITH_IMM to `ah`, an AH of the QP's own
/// connection (what the engine's `post_send_ud` refuses, refused here at once).
pub(super) fn post_send_ud(
    qp: &RemoteQp,
    wr: &SendWr,
    ah: &RemoteAh,
    remote_qpn: Qpn,
    remote_qkey: u32,
) -> Result<()> {
    if qp.qp_type != QpType::Ud {
        return Err(VerbsError::InvalidValue("post_send_ud on a QP that is not UD").into());
    }
    if !matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm) {
        return Err(VerbsError::InvalidValue("UD QPs send only SEND (with immediate)").into());
    }
    if !Arc::ptr_eq(&ah.conn, &qp.pd.conn) {
        return Err(Error::DeviceMismatch);
    }
    qp.check_post(true)?;
    let to = ipc::UdTarget {
        ah: ah.id,
        remote_qpn,
        remote_qkey,
    };
    qp.pd.conn.post_send_ud(qp.qpn, wr, &to)
}

/// An SRQ of the service.
#[derive(Debug)]
pub(crate) struct RemoteSrq {
    pub pd: Arc<RemotePd>,
    /// The service's handle (what this connection's SRQ_LIMIT_REACHED names).
    pub id: u32,
    destroyed: AtomicBool,
}

impl RemoteSrq {
    pub fn create(pd: &Arc<RemotePd>, attr: &SrqAttr) -> Result<RemoteSrq> {
        let req = Req::CreateSrq {
            pd: pd.id,
            attr: *attr,
        };
        let Resp::Srq { srq, .. } = pd.conn.call(&req)?.0 else {
            return Err(unexpected("create_srq"));
        };
        Ok(RemoteSrq {
            pd: pd.clone(),
            id: srq,
            destroyed: AtomicBool::new(false),
        })
    }

    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        self.pd.conn.post_srq_recv(self.id, wr)
    }

    pub fn modify(&self, attr: &SrqAttr, mask: u32) -> Result<()> {
        self.pd.conn.call_ok(&Req::ModifySrq {
            srq: self.id,
            attr: *attr,
            mask: crate::proto::SrqAttrMask(mask),
        })
    }

    /// The attributes and the WQEs the SRQ holds now.
    pub fn query(&self) -> Result<(SrqAttr, usize)> {
        match self.pd.conn.call(&Req::QuerySrq { srq: self.id })?.0 {
            Resp::SrqAttr { attr, len } => Ok((attr, len as usize)),
            _ => Err(unexpected("query_srq")),
        }
    }

    /// `ibv_destroy_srq`: EBUSY from the service while a QP uses it (the SRQ stays).
    pub fn destroy(&self) -> Result<()> {
        self.pd.conn.call_ok(&Req::DestroySrq { srq: self.id })?;
        self.destroyed.store(true, Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for RemoteSrq {
    fn drop(&mut self) {
        if self.destroyed.load(Ordering::SeqCst) {
            return;
        }
        if let Err(e) = self.pd.conn.call_ok(&Req::DestroySrq { srq: self.id }) {
            tracing::error!("destroy_srq through the service: {e}");
        }
    }
}
