//! The service loop: one thread that accepts clients, answers their control messages,
//! drains their submission rings on the doorbell and moves completions from the engine's
//! CQs into the clients' completion rings (docs/rnic.md, "One device, many processes").
//!
//! Contract:
//! - A client is a connection: its pid, uid and comm come from SO_PEERCRED and /proc when
//!   it connects; everything it creates lives in its `Client` and only there, so it
//!   names (and can touch) only its own objects; its MRs are registered over its own
//!   memory: the address space of the process that connected, opened at hello and
//!   checked with the client's credentials (`super::client_mem`).
//! - EOF or any error on a client's socket ends the client: its QPs are destroyed first
//!   (their peers then see what they see when a host's QP is destroyed: no answer, so a
//!   retry-exceeded error), then its SRQs, AHs, MRs, CQs and PDs. The kernel closes the socket of a
//!   process that exits or is killed, so `kill -9` ends it too.
//! - A malformed ring slot is dropped and counted (`bad_slots` in `xrnic res --json`); a
//!   work request the engine refuses becomes an error completion (`IBV_WC_LOC_QP_OP_ERR`)
//!   on the QP's send or receive CQ, since the client's post already returned. Nothing a
//!   client writes stops the loop or reaches another client.
//! - Port events: the device's unaffiliated asynchronous events (PORT_ACTIVE,
//!   PORT_ERR, DEVICE_FATAL: src/verbs/link_watch.rs) go to every client, up to
//!   [`MAX_CLIENT_EVENTS`] unread each (the oldest go first); the client's event
//!   notifier is written and it fetches them with [`Req::AsyncEvents`]. An event of one
//!   QP or CQ (COMM_EST, SQ_DRAINED, QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR,
//!   QP_LAST_WQE_REACHED, CQ_ERR, SRQ_LIMIT_REACHED) goes to the client that owns the
//!   object only, named as that client knows it (the QPN; its handle of the CQ or SRQ). A client that says hello
//!   after DEVICE_FATAL is refused (ENODEV). After DEVICE_FATAL the engine
//!   refuses every verb that needs the device: a control verb answers EIO, a posted WR
//!   an error completion as above.
//! - Addresses (resolver.rs): the MAC of an AH, a QP's address vector or a MAD of QP1
//!   is the one the service resolves, never a client's; a VLAN tag is EPERM. Resolving
//!   never waits in this loop: a verb whose next hop is unresolved is answered when it
//!   resolves (or ETIMEDOUT), and its client's later messages are not read meanwhile.
//! - QPs are RC, UC or UD; AHs and SRQs, and the posts that name them, are
//!   `super::objects`. The GSI QP (QP1) is the service's own: clients' CMs send and
//!   receive CM MADs through its relay (`super::gsi`, gsi_port.rs).
//! - Flooding ([`Limits`]): each client may hold at most so many PDs, QPs, CQs (and CQ
//!   ring slots in all), MRs (and registered bytes in all), AHs and SRQs; a verb past a cap fails
//!   with ENOMEM, as a NIC out of resources answers. Each round of the loop takes at most
//!   `slots_per_round` submission slots and `msgs_per_round` control messages of one
//!   client before it turns to the others (what is left stays for the next round, which
//!   then does not wait), so a client that rings without end is served at the same pace
//!   as the rest.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::net::{AddressFamily, RecvFlags, SocketAddrUnix, SocketFlags, SocketType};

use super::objects::{AhEnt, SrqEnt};
use crate::io::shm::{self, Pop, Ring};
use crate::ipc::{self, ClientRes, CqRes, MrRes, QpRes, Req, Resp, Work};
use crate::verbs::{self, Cq, Device, Mr, Pd, Qp, WcStatus, WorkCompletion};
use crate::wire::Qpn;

struct CqEnt {
    cq: Cq,
    ring: Ring,
    /// The write end of the CQ's event pipe (the client waits on the read end).
    event: OwnedFd,
    cqe: u32,
}

struct MrEnt {
    mr: Mr,
    pd: u32,
    addr: u64,
    len: u64,
}

pub(super) struct QpEnt {
    pub qp: Qp,
    pd: u32,
    send_cq: u32,
    recv_cq: u32,
    /// The client's SRQ the QP takes its receive WQEs from.
    pub srq: Option<u32>,
    qp_type: crate::proto::QpType,
}

/// One connected process and everything it made.
pub(super) struct Client {
    sock: OwnedFd,
    pub pid: i32,
    uid: u32,
    gid: u32,
    comm: String,
    /// Set by Hello: the memory its MRs are in (`super::client_mem`).
    mem: Option<Arc<crate::proto::AddressSpace>>,
    /// Set by Hello: the submission ring and the read end of its doorbell pipe.
    sq: Option<(Ring, OwnedFd)>,
    /// Set by Hello: the write end of a pipe, written whenever completions land in any
    /// of the client's CQ rings (its library's completion channels wait on it).
    notify: Option<OwnedFd>,
    /// Set by Hello: the write end of a pipe, written whenever `events` gets one.
    events_fd: Option<OwnedFd>,
    /// Events not yet fetched ([`Req::AsyncEvents`]): wire values and their elements.
    events: std::collections::VecDeque<(u32, u32)>,
    pub next: u32,
    pub pds: HashMap<u32, Pd>,
    mrs: HashMap<u32, MrEnt>,
    cqs: HashMap<u32, CqEnt>,
    pub qps: HashMap<u32, QpEnt>,
    pub ahs: HashMap<u32, AhEnt>,
    pub srqs: HashMap<u32, SrqEnt>,
    bad_slots: u64,
    /// The last round left slots in the submission ring.
    more: bool,
    /// Completion ring slots of its CQs, bytes of its MRs ([`Limits`]).
    cq_slots: u64,
    mr_bytes: u64,
    /// The service's name of this client (the GSI relay's, src/service/gsi.rs).
    pub key: u64,
    /// Set by `GsiOpen`: the CM MADs for it, and their notifier.
    gsi: Option<gsi_port::GsiInbox>,
}

impl Client {
    /// Free everything in dependency order (QPs before the SRQs, CQs and PD they use).
    fn release(&mut self) {
        self.qps.clear();
        self.srqs.clear();
        self.ahs.clear();
        self.mrs.clear();
        self.cqs.clear();
        self.pds.clear();
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.release();
    }
}

/// Most unread events the service keeps for one client.
pub const MAX_CLIENT_EVENTS: usize = 64;

/// Queue event `v` (element `el`) for client `c`, the oldest going past
/// [`MAX_CLIENT_EVENTS`].
fn push_event(c: &mut Client, v: u32, el: u32) {
    if c.events.len() >= MAX_CLIENT_EVENTS {
        c.events.pop_front();
    }
    c.events.push_back((v, el));
}

pub(super) fn errno_resp(e: &verbs::Error) -> Resp {
    Resp::Err {
        errno: e.errno(),
        msg: e.to_string(),
    }
}

/// The errno for a client whose object could not get its descriptors or memory: EMFILE
/// when the service is out of descriptors (EMFILE, ENFILE), else ENOMEM.
pub(super) fn fd_errno(e: &io::Error) -> i32 {
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE) => libc::EMFILE,
        _ => libc::ENOMEM,
    }
}

pub(super) fn bad(errno: i32, msg: &str) -> Resp {
    Resp::Err {
        errno,
        msg: msg.to_string(),
    }
}

/// Per-client caps (`xrnic up --max-qps ...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_pds: usize,
    pub max_qps: usize,
    pub max_cqs: usize,
    /// Completion ring slots of all the client's CQs (each slot is shared memory the
    /// service allocates: [`ipc::CQ_SLOT_BYTES`]).
    pub max_cq_slots: u64,
    pub max_mrs: usize,
    /// Bytes of all the client's MRs. Nothing is pinned (the service reads and writes
    /// the client's memory with pread/pwrite on its /proc/PID/mem, client_mem.rs), so this bounds what one client
    /// may name, not the service's memory.
    pub max_mr_bytes: u64,
    /// Address handles one client may hold.
    pub max_ahs: usize,
    /// Shared receive queues one client may hold.
    pub max_srqs: usize,
    /// Submission slots taken from one client per round of the loop.
    pub slots_per_round: usize,
    /// Control messages answered for one client per round.
    pub msgs_per_round: usize,
    /// Connections the service holds, all users but root together (limits.rs).
    pub max_clients: usize,
    /// Connections of one uid (root: no bound).
    pub max_clients_per_uid: usize,
    /// Descriptors the service holds for one client (its socket, hello's four, two per
    /// CQ, two for the GSI relay); past it EMFILE.
    pub max_fds: usize,
    /// Descriptors the service holds for all the clients of one uid.
    pub max_fds_per_uid: usize,
    /// Bytes of the shared-memory rings the service made for one client.
    pub max_shm_bytes: u64,
    /// Bytes of the shared-memory rings of all the clients of one uid.
    pub max_shm_bytes_per_uid: u64,
    /// PDs, MRs, CQs, QPs, AHs and SRQs of all the clients of one uid.
    pub max_objects_per_uid: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_pds: 1024,
            max_qps: 4096,
            max_cqs: 4096,
            max_cq_slots: 1 << 22,
            max_mrs: 16384,
            max_mr_bytes: 1 << 40,
            max_ahs: 16384,
            max_srqs: 1024,
            slots_per_round: 256,
            msgs_per_round: 64,
            max_clients: 1024,
            max_clients_per_uid: 64,
            max_fds: 1024,
            max_fds_per_uid: 4096,
            max_shm_bytes: 256 << 20,
            max_shm_bytes_per_uid: 1 << 30,
            max_objects_per_uid: 65536,
        }
    }
}

pub(super) fn over(what: &str, cap: impl std::fmt::Display) -> Resp {
    Resp::Err {
        errno: libc::ENOMEM,
        msg: format!("this client holds the most {what} the service allows ({cap})"),
    }
}

/// The service of one device.
pub struct Service {
    dev: Device,
    ifname: String,
    listener: OwnedFd,
    /// Written by the device's completion hook.
    cq_kick: Arc<OwnedFd>,
    clients: Vec<Client>,
    my_uid: u32,
    stop: Arc<AtomicBool>,
    limits: Limits,
    /// QP1, made on the first `GsiOpen` (gsi_port.rs).
    gsi: Option<gsi_port::GsiPort>,
    relay: super::gsi::Relay,
    next_key: u64,
    /// Verbs waiting for an address to resolve, and the resolver (resolver.rs).
    net: resolver::Net,
    /// Descriptors unprivileged clients may make the service hold (limits.rs).
    fd_budget: usize,
    /// Closed to accept (and refuse) a connection at EMFILE (limits.rs).
    reserve: Option<OwnedFd>,
    /// The listener is out of the poll set until then (limits.rs).
    accept_pause: Option<std::time::Instant>,
}

impl Service {
    /// Bind the socket of `ifname` and take `dev` (opened in this process). Fails with
    /// `AddrInUse` when a service already serves the interface in this namespace.
    pub fn new(dev: Device, ifname: &str) -> io::Result<Service> {
        Service::with_limits(dev, ifname, Limits::default())
    }

    /// [`Service::new`] with per-client caps.
    pub fn with_limits(dev: Device, ifname: &str, limits: Limits) -> io::Result<Service> {
        let listener = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        let addr = SocketAddrUnix::new_abstract_name(&ipc::socket_name(ifname))?;
        rustix::net::bind(&listener, &addr)?;
        rustix::net::listen(&listener, 64)?;
        let cq_kick = Arc::new(rustix::event::eventfd(
            0,
            EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK,
        )?);
        let k = cq_kick.clone();
        dev.set_completion_hook(Some(Arc::new(move || {
            let _ = rustix::io::write(&*k, &1u64.to_ne_bytes());
        })))
        .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Service {
            dev,
            ifname: ifname.to_string(),
            listener,
            cq_kick,
            clients: Vec::new(),
            my_uid: rustix::process::getuid().as_raw(),
            stop: Arc::new(AtomicBool::new(false)),
            limits,
            gsi: None,
            relay: Default::default(),
            next_key: 1,
            net: Default::default(),
            fd_budget: limits::fd_budget(),
            reserve: limits::reserve_fd(),
            accept_pause: None,
        })
    }

    /// A flag that ends [`Service::run`] (a signal handler sets it).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Serve until `xrnic down` (or the stop flag).
    pub fn run(self) -> io::Result<()> {
        self.run_while(|_| true)
    }

    /// [`Service::run`], also ending when `keep`, asked after each round with the number
    /// of clients connected, answers false (`xrnic exec`'s service ends when its program
    /// has exited and the last client is gone: src/cli/exec.rs).
    pub fn run_while(mut self, mut keep: impl FnMut(usize) -> bool) -> io::Result<()> {
        let mut busy = false;
        while !self.stop.load(Ordering::SeqCst) && keep(self.clients.len()) {
            let wait = if busy {
                Duration::ZERO
            } else {
                Duration::from_millis(100)
            };
            busy = self.once(wait)?;
        }
        let _ = self.dev.set_completion_hook(None);
        // Clients first (their QPs are destroyed while the driver still runs), then QP1,
        // then the device with the last handle.
        self.clients.clear();
        self.gsi = None;
        Ok(())
    }

    /// One round: wait up to `timeout` for a socket or doorbell, handle what is ready;
    /// true when a client's ring still holds slots this round left (the next round
    /// then does not wait).
    fn once(&mut self, timeout: Duration) -> io::Result<bool> {
        let mut timeout = timeout;
        let listen = match self.accept_pause {
            Some(t) if t > std::time::Instant::now() => {
                timeout = timeout.min(t - std::time::Instant::now());
                PollFlags::empty()
            }
            _ => {
                self.accept_pause = None;
                PollFlags::IN
            }
        };
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(2 + 2 * self.clients.len());
        fds.push(PollFd::new(&self.listener, listen));
        fds.push(PollFd::new(&*self.cq_kick, PollFlags::IN));
        for c in &self.clients {
            // A client whose answer waits for an address (resolver.rs) is not read
            // meanwhile; its hang-up still shows.
            let read = if self.net.waits(c.key) {
                PollFlags::empty()
            } else {
                PollFlags::IN
            };
            fds.push(PollFd::new(&c.sock, read));
            match &c.sq {
                Some((_, bell)) => fds.push(PollFd::new(bell, PollFlags::IN)),
                None => fds.push(PollFd::new(&c.sock, PollFlags::empty())),
            }
        }
        if let Some(fd) = self.net.fd() {
            fds.push(PollFd::new(fd, PollFlags::IN));
        }
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        if ready[1] {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&*self.cq_kick, &mut b);
        }
        self.fan_out_events();
        self.pump_gsi();
        let gone = self.finish_resolved();
        let mut dead = Vec::new();
        let mut busy = false;
        for i in 0..self.clients.len() {
            let c = &mut self.clients[i];
            if ready[3 + 2 * i] || c.more {
                c.more = drain_doorbell(c, self.limits.slots_per_round);
                busy |= c.more;
            }
            let key = self.clients[i].key;
            // Ready while waiting: hung up.
            if gone.contains(&key)
                || (ready[2 + 2 * i] && (self.net.waits(key) || !self.serve_messages(i)))
            {
                dead.push(i);
            }
        }
        for &i in dead.iter().rev() {
            let c = self.clients.remove(i);
            // Its listens and comm IDs are free (src/service/gsi.rs).
            self.relay.close(c.key);
            self.net.forget(c.key);
            tracing::info!(pid = c.pid, comm = %c.comm, "client gone: its resources are freed");
            drop(c);
        }
        for c in &mut self.clients {
            pump_completions(c);
        }
        if ready[0] {
            self.accept();
        }
        Ok(busy)
    }

    /// Give the device's unaffiliated events to every client, and an event of one
    /// object to the client that owns it, naming it as that client does (see the
    /// module comment).
    fn fan_out_events(&mut self) {
        let mut any = false;
        while let Some(e) = self.dev.poll_async_event() {
            if let Some(v) = ipc::encode_event(&e) {
                tracing::info!("device event {e:?}: to every client");
                // The element: the port of a port event, 0 for DEVICE_FATAL (uverbs).
                let el = u32::from(v != ipc::EV_DEVICE_FATAL);
                for c in self.clients.iter_mut().filter(|c| c.events_fd.is_some()) {
                    push_event(c, v, el);
                }
                any = true;
                continue;
            }
            let owner = if let Some((v, q)) = ipc::encode_qp_event(&e) {
                self.clients.iter_mut().find_map(|c| {
                    let mine = c.qps.values().any(|x| x.qp.qp_num() == q);
                    mine.then_some((c, v, q.value()))
                })
            } else if let crate::proto::AsyncEvent::CqErr(cq) = e {
                self.clients.iter_mut().find_map(|c| {
                    let h = c.cqs.iter().find(|(_, x)| x.cq.engine_cq() == Some(cq))?.0;
                    let h = *h;
                    Some((c, ipc::EV_CQ_ERR, h))
                })
            } else if let crate::proto::AsyncEvent::SrqLimitReached(s) = e {
                super::objects::srq_owner(&mut self.clients, s.0)
                    .map(|(c, h)| (c, ipc::EV_SRQ_LIMIT_REACHED, h))
            } else {
                None
            };
            // An object no client holds any more (destroyed since): no one to tell.
            if let Some((c, v, el)) = owner {
                tracing::debug!("device event {e:?}: to client {}", c.pid);
                push_event(c, v, el);
                any = true;
            }
        }
        if !any {
            return;
        }
        for c in &self.clients {
            if let Some(fd) = &c.events_fd
                && !c.events.is_empty()
            {
                let _ = shm::wake(fd.as_fd());
            }
        }
    }

    /// A new client on `sock` (limits.rs `accept` took it).
    fn add_client(&mut self, sock: OwnedFd, pid: i32, uid: u32, gid: u32) {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| s.trim_end().to_string())
            .unwrap_or_default();
        self.clients.push(Client {
            sock,
            pid,
            uid,
            gid,
            comm,
            mem: None,
            sq: None,
            notify: None,
            events_fd: None,
            events: Default::default(),
            next: 1,
            pds: HashMap::new(),
            mrs: HashMap::new(),
            cqs: HashMap::new(),
            qps: HashMap::new(),
            ahs: HashMap::new(),
            srqs: HashMap::new(),
            bad_slots: 0,
            more: false,
            cq_slots: 0,
            mr_bytes: 0,
            key: self.next_key,
            gsi: None,
        });
        self.next_key += 1;
    }

    /// Answer every waiting message of client `i`; false when it is gone.
    fn serve_messages(&mut self, i: usize) -> bool {
        let mut buf = vec![0u8; 64 * 1024];
        // The socket stays readable when messages are left: the next round comes back.
        for _ in 0..self.limits.msgs_per_round.max(1) {
            let got =
                shm::recv_with_fds(self.clients[i].sock.as_fd(), &mut buf, RecvFlags::DONTWAIT);
            let n = match got {
                Ok(Some((n, _fds))) => n,
                Ok(None) => return false,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(_) => return false,
            };
            let (resp, fds) = match serde_json::from_slice::<Req>(&buf[..n]) {
                // A verb of addresses: answered here, or later (resolver.rs).
                Ok(req) => match self.net_verb(i, req) {
                    resolver::Step::Answer(r) => (r, Vec::new()),
                    resolver::Step::Deferred => return true,
                    resolver::Step::Other(req) => self.handle(i, req),
                },
                Err(e) => (
                    bad(libc::EINVAL, &format!("not a request: {e}")),
                    Vec::new(),
                ),
            };
            let Ok(text) = serde_json::to_vec(&resp) else {
                return false;
            };
            let c = &self.clients[i];
            let fds: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
            if shm::send_with_fds(c.sock.as_fd(), &text, &fds).is_err() {
                return false;
            }
        }
        true
    }

    /// One request of client `i`: the answer and the descriptors it carries.
    fn handle(&mut self, i: usize, req: Req) -> (Resp, Vec<OwnedFd>) {
        // Who sees what: res.rs.
        if let Req::Res = req {
            return (self.res_answer(i, None), Vec::new());
        }
        if let Req::ResPage { skip } = req {
            return (self.res_answer(i, Some(skip)), Vec::new());
        }
        if let Req::Shutdown = req {
            let uid = self.clients[i].uid;
            if uid != 0 && uid != self.my_uid {
                return (
                    bad(libc::EPERM, "only root or the service's user may stop it"),
                    Vec::new(),
                );
            }
            self.stop.store(true, Ordering::SeqCst);
            return (Resp::Ok, Vec::new());
        }
        // Descriptors, shared memory and objects per client and per uid (limits.rs).
        if let Some(r) = self.admit(i, &req) {
            return (r, Vec::new());
        }
        let port = self.dev.query_port();
        let fatal = self.dev.is_fatal();
        let c = &mut self.clients[i];
        if let Req::Hello { .. } = req {
            if c.sq.is_some() {
                return (bad(libc::EINVAL, "hello twice"), Vec::new());
            }
            // A device already gone: refuse the open, as the kernel does once it has
            // unregistered a device (ib_uverbs_remove_one deletes its uverbs character
            // device, so opening it fails and ibv_open_device returns NULL). The
            // client's error is ENODEV.
            if fatal {
                return (
                    bad(libc::ENODEV, "the device is gone (DEVICE_FATAL)"),
                    Vec::new(),
                );
            }
            let peer = super::client_mem::Peer {
                pid: c.pid,
                uid: c.uid,
                gid: c.gid,
            };
            let space = match super::client_mem::open(peer) {
                Ok(s) => s,
                Err(e) => {
                    let why = format!("the memory of the process that connected: {e}");
                    return (
                        bad(e.raw_os_error().unwrap_or(libc::EPERM), &why),
                        Vec::new(),
                    );
                }
            };
            // The doorbell, the notifier and the event notifier are pipes: the client
            // gets one end of each, the service keeps the other (shm.rs, "Wakeups").
            let made = Ring::create("xrnic-sq", ipc::SQ_SLOTS, ipc::SQ_SLOT_BYTES).and_then(|r| {
                let (bell, bell_w) = shm::wakeup_pipe()?;
                let (notify_r, notify) = shm::wakeup_pipe()?;
                let (events_r, events) = shm::wakeup_pipe()?;
                let ring_fd = r.fd().try_clone_to_owned()?;
                let theirs = vec![ring_fd, bell_w, notify_r, events_r];
                Ok((r, bell, notify, events, theirs))
            });
            return match made {
                Ok((ring, bell, notify, events, fds)) => {
                    c.sq = Some((ring, bell));
                    c.mem = Some(space);
                    c.notify = Some(notify);
                    c.events_fd = Some(events);
                    (
                        Resp::Hello {
                            service_pid: std::process::id(),
                            active_mtu: port.active_mtu.bytes(),
                            max_mtu: port.max_mtu.bytes(),
                            sq_slots: ipc::SQ_SLOTS,
                        },
                        fds,
                    )
                }
                Err(e) => (bad(fd_errno(&e), &e.to_string()), Vec::new()),
            };
        }
        if c.sq.is_none() {
            return (bad(libc::EPROTO, "say hello first"), Vec::new());
        }
        if let Some(r) = self.gsi_verb(i, &req) {
            return r;
        }
        let c = &mut self.clients[i];
        match client_verb(&self.dev, &self.limits, c, req) {
            Answer::Plain(r) => (r, Vec::new()),
            Answer::Fds(r, f) => (r, f),
        }
    }
}

fn client_res(c: &Client) -> ClientRes {
    let mut r = ClientRes {
        id: c.key,
        pid: c.pid,
        uid: c.uid,
        comm: c.comm.clone(),
        bad_slots: c.bad_slots,
        ..Default::default()
    };
    r.pds = c.pds.keys().copied().collect();
    r.pds.sort();
    r.mrs = c
        .mrs
        .iter()
        .map(|(&lkey, m)| MrRes {
            lkey,
            rkey: m.mr.rkey().0,
            pd: m.pd,
            addr: m.addr,
            length: m.len,
        })
        .collect();
    r.mrs.sort_by_key(|m| m.lkey);
    r.cqs = c
        .cqs
        .iter()
        .map(|(&cq, e)| CqRes { cq, cqe: e.cqe })
        .collect();
    r.cqs.sort_by_key(|q| q.cq);
    r.qps = c
        .qps
        .iter()
        .map(|(&lqpn, q)| {
            let a = q.qp.query().ok();
            QpRes {
                lqpn,
                rqpn: a.map_or(0, |a| a.dest_qp_num.value()),
                pd: q.pd,
                state: a.map_or_else(
                    || "?".into(),
                    |a| format!("{:?}", a.qp_state).to_uppercase(),
                ),
                qp_type: format!("{:?}", q.qp_type).to_uppercase(),
            }
        })
        .collect();
    r.qps.sort_by_key(|q| q.lqpn);
    (r.ahs, r.srqs) = super::objects::res(c);
    r
}

/// Post what is in client `c`'s submission ring, at most `max` slots; true when slots
/// are left.
fn drain_doorbell(c: &mut Client, max: usize) -> bool {
    let Some((ring, bell)) = &c.sq else {
        return false;
    };
    // Non-blocking whatever the client does to its end (shm.rs, "Wakeups").
    let _ = shm::take_wakeups(bell.as_fd());
    let mut w = [0u64; ipc::SQ_WORDS];
    let mut failed: Vec<(u32, WorkCompletion)> = Vec::new();
    let mut more = false;
    for n in 0.. {
        if n == max.max(1) {
            more = true;
            break;
        }
        match ring.pop(&mut w) {
            Pop::Empty => break,
            Pop::Corrupt => {
                c.bad_slots += 1;
                continue;
            }
            Pop::Item => {}
        }
        let Some(work) = ipc::decode_work(&w) else {
            c.bad_slots += 1;
            continue;
        };
        let (qpn, wr_id, is_send) = match &work {
            Work::Send(q, wr) | Work::SendUd(q, wr, _) => (*q, wr.wr_id, true),
            Work::Recv(q, wr) => (*q, wr.wr_id, false),
            Work::SrqRecv(srq, wr) => {
                match super::objects::post_srq_recv(c, *srq, wr.clone()) {
                    None => c.bad_slots += 1,
                    Some(false) => ring.set_refused(ring.consumer()),
                    Some(true) => {}
                }
                continue;
            }
        };
        let Some(q) = c.qps.get(&qpn.value()) else {
            c.bad_slots += 1;
            continue;
        };
        let r = match work {
            Work::Send(_, wr) => q.qp.post_send(wr),
            Work::Recv(_, wr) => q.qp.post_recv(wr),
            Work::SendUd(_, wr, to) => {
                // Only this client's AHs: another's handle is a malformed slot.
                let Some(ah) = super::objects::ah_of(c, to.ah) else {
                    c.bad_slots += 1;
                    continue;
                };
                q.qp.post_send_ud(wr, ah, to.remote_qpn, to.remote_qkey)
            }
            Work::SrqRecv(..) => continue,
        };
        if let Err(e) = r {
            tracing::debug!(pid = c.pid, qpn = qpn.value(), "post refused: {e}");
            // A receive the full receive queue refused fails the client's post, as in
            // process (ENOMEM), instead of completing: the client waits for the slot when
            // its queue may be full (src/verbs/remote.rs `RemoteQp::recv_out`).
            if !is_send
                && matches!(
                    e,
                    crate::verbs::Error::Verbs(crate::proto::VerbsError::QueueFull)
                )
            {
                ring.set_refused(ring.consumer());
                continue;
            }
            let cq = if is_send { q.send_cq } else { q.recv_cq };
            failed.push((cq, refused(wr_id, qpn, is_send)));
        }
    }
    // Every slot taken is now in the engine (or refused): a client waiting to know its
    // receive is there before it tells a peer to send (src/verbs/remote.rs `wait_done`)
    // goes on.
    ring.set_done(ring.consumer());
    for (cq, wc) in failed {
        if let Some(e) = c.cqs.get(&cq) {
            if e.ring.push(&ipc::encode_wc(&wc)) {
                let _ = shm::wake(e.event.as_fd());
                if let Some(n) = &c.notify {
                    let _ = shm::wake(n.as_fd());
                }
            }
        }
    }
    more
}

fn refused(wr_id: u64, qpn: Qpn, send: bool) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::LocQpOpErr,
        opcode: if send {
            verbs::WcOpcode::Send
        } else {
            verbs::WcOpcode::Recv
        },
        byte_len: 0,
        imm_data: None,
        invalidated_rkey: None,
        qp_num: qpn,
        src_qp: Qpn::new(0),
        grh: false,
        sl: 0,
    }
}

/// Move completions from the engine's CQs into the client's rings, as many as fit.
fn pump_completions(c: &mut Client) {
    let mut v = Vec::new();
    let mut any = false;
    for e in c.cqs.values() {
        // The ring holds at most the `cqe` the client asked for (its slots are rounded
        // up): completions past that wait in the engine's CQ, whose overrun is the
        // client's IBV_EVENT_CQ_ERR (IBTA vol. 1 §11.6.3.2), whatever the timing of
        // this loop against the completions.
        let room = e.ring.capacity().min(e.cqe);
        let free = room.saturating_sub(e.ring.fill()) as usize;
        if free == 0 {
            continue;
        }
        v.clear();
        if e.cq.take_into(free, &mut v) == 0 {
            continue;
        }
        for wc in &v {
            // Cannot fail: `free` slots were free and only the client consumes.
            let _ = e.ring.push(&ipc::encode_wc(wc));
        }
        let _ = shm::wake(e.event.as_fd());
        any = true;
    }
    if let (true, Some(n)) = (any, &c.notify) {
        let _ = shm::wake(n.as_fd());
    }
}

#[path = "gsi_port.rs"]
mod gsi_port;

#[path = "resolver.rs"]
mod resolver;

#[path = "limits.rs"]
mod limits;

#[path = "res.rs"]
mod res;

#[path = "client_verbs.rs"]
mod client_verbs;
use client_verbs::{Answer, client_verb};

#[cfg(test)]
#[path = "objects_tests.rs"]
mod objects_tests;

#[cfg(test)]
#[path = "gsi_port_tests.rs"]
mod gsi_port_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// One client whose submission ring holds 1 000 slots when it rings once: each round
    /// of the loop takes `slots_per_round` of them and says the next round must not wait;
    /// another client connecting meanwhile is answered in the next round, not after the
    /// whole ring (issue 18: a client that floods never stops the others).
    #[test]
    fn a_full_ring_is_taken_a_share_per_round_and_others_are_answered_between() {
        let (dev, _peer) = Device::open_sim_pair().unwrap();
        let name = format!("svc-unit-{}", std::process::id());
        let limits = Limits {
            slots_per_round: 16,
            ..Limits::default()
        };
        let mut svc = Service::with_limits(dev, &name, limits).unwrap();
        let connect = || {
            let sock = rustix::net::socket_with(
                AddressFamily::UNIX,
                SocketType::SEQPACKET,
                SocketFlags::CLOEXEC,
                None,
            )
            .unwrap();
            let addr = SocketAddrUnix::new_abstract_name(&ipc::socket_name(&name)).unwrap();
            rustix::net::connect(&sock, &addr).unwrap();
            sock
        };
        let send = |sock: &OwnedFd, req: &Req| {
            shm::send_with_fds(sock.as_fd(), &serde_json::to_vec(req).unwrap(), &[]).unwrap();
        };
        let recv = |sock: &OwnedFd| {
            let mut buf = vec![0u8; 64 * 1024];
            let (n, fds) = shm::recv_with_fds(sock.as_fd(), &mut buf, RecvFlags::DONTWAIT)
                .unwrap()
                .unwrap();
            (serde_json::from_slice::<Resp>(&buf[..n]).unwrap(), fds)
        };
        let a = connect();
        send(
            &a,
            &Req::Hello {
                comm: "flooder".into(),
            },
        );
        // Round 1 accepts, round 2 answers the hello.
        svc.once(Duration::ZERO).unwrap();
        svc.once(Duration::ZERO).unwrap();
        let (resp, mut fds) = recv(&a);
        assert!(matches!(resp, Resp::Hello { .. }), "{resp:?}");
        let _events = fds.pop().unwrap();
        let _notify = fds.pop().unwrap();
        let bell = fds.pop().unwrap();
        let ring = Ring::map(fds.pop().unwrap(), ipc::SQ_SLOTS, ipc::SQ_SLOT_BYTES).unwrap();
        // 1 000 slots no decoder takes (kind 0xff): each one a bad slot when taken.
        for _ in 0..1000 {
            assert!(ring.push(&[0xffu64; ipc::SQ_WORDS]));
        }
        rustix::io::write(&bell, &1u64.to_ne_bytes()).unwrap();
        let taken = |svc: &Service| svc.clients[0].bad_slots;
        assert!(svc.once(Duration::ZERO).unwrap(), "slots are left");
        assert_eq!(taken(&svc), 16);
        // A second client connects and says hello while the flood lasts.
        let b = connect();
        send(&b, &Req::Hello { comm: "b".into() });
        assert!(svc.once(Duration::ZERO).unwrap());
        assert_eq!(taken(&svc), 32);
        assert!(svc.once(Duration::ZERO).unwrap());
        assert_eq!(
            taken(&svc),
            48,
            "no new doorbell: the round still takes its share"
        );
        let (resp, _) = recv(&b);
        assert!(
            matches!(resp, Resp::Hello { .. }),
            "b is answered: {resp:?}"
        );
        let mut rounds = 3;
        while svc.once(Duration::ZERO).unwrap() {
            rounds += 1;
        }
        assert_eq!(taken(&svc), 1000);
        assert_eq!(rounds, 1000usize.div_ceil(16) - 1, "rounds that left slots");
    }
}
