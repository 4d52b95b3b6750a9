//! Addresses of the device service: the path of a client's address handle or QP address
//! vector, and of QP1's MADs, is always the one the service resolves, and resolving it
//! never holds up the service's one thread (docs/rnic.md "One device, many processes").
//!
//! Contract:
//! - `CreateAh`, and `ModifyQp` with `IBV_QP_AV`, take their path from the service: the
//!   next hop's MAC from the kernel's route and neighbour table (a multicast GID takes
//!   its group's MAC, ib_core `ib_resolve_eth_dmac`), the hop limit from the route. A
//!   `dmac` the client puts in the attributes is never used. A VLAN tag is refused
//!   (EPERM): the service sends untagged frames on its interface; to use a VLAN, run the
//!   service on the kernel's VLAN device, whose tag the kernel adds and checks.
//! - The route and the neighbour table are read at once ([`Device::path_step`]); a next
//!   hop with no usable entry yet is handed to the resolver thread, which asks the
//!   kernel for it (ARP / ND, `link::NeighbourWatch`) and waits for every pending
//!   address at once, each for at most `link::RESOLVE_TIMEOUT`. The client's answer waits
//!   meanwhile and none of its later messages is read (its calls are synchronous, and
//!   order is kept); every other client goes on being served. When the address resolves
//!   the verb is done with that MAC; when it does not, the client gets ETIMEDOUT (as the
//!   kernel's address resolution ends, drivers/infiniband/core/addr.c
//!   `process_one_req`). A client gone meanwhile: the answer is dropped.
//! - Bounds: one waiting verb per client (its socket is not read meanwhile);
//!   [`MAX_PENDING`] addresses in resolution at once for all (EAGAIN past it); the same
//!   address asked by several is resolved once. QP1 holds at most [`MAX_HELD`] MADs per
//!   destination and [`MAX_HELD_GIDS`] destinations while their paths resolve (a CM
//!   resends a MAD that got no answer, IBTA §12.6.5).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags};

use super::{Client, Limits, Service, bad, errno_resp, over};
use crate::io::link::{self, NeighbourNews, NeighbourWatch};
use crate::ipc::{Req, Resp};
use crate::proto::gid_is_ipv4;
use crate::verbs::{AttrMask, Device, Gid, PathStep};

/// Most addresses in resolution at once, all clients and QP1 together.
pub(super) const MAX_PENDING: usize = 1024;
/// Most MADs QP1 holds for one destination while its path resolves.
pub(super) const MAX_HELD: usize = 16;
/// Most destinations QP1 holds MADs for.
pub(super) const MAX_HELD_GIDS: usize = 256;

/// A next hop to resolve: interface index and address, in the device's namespace.
type Hop = (u32, IpAddr);

/// What the resolver says of a hop: its MAC, or the errno and why not.
type Found = Result<[u8; 6], (i32, String)>;

/// What waits for a hop.
enum Waiter {
    /// A client's `CreateAh` or `ModifyQp`, answered when the hop resolves.
    Verb { key: u64, req: Req, hop_limit: u8 },
    /// QP1's MADs to this GID (gsi_port.rs).
    Gsi { to: Gid, hop_limit: u8 },
}

/// The service's side: who waits for what, and the resolver thread (made when first
/// needed).
#[derive(Default)]
pub(super) struct Net {
    thread: Option<Resolver>,
    waiters: HashMap<Hop, Vec<Waiter>>,
    /// Clients with a verb waiting: none of their messages is read meanwhile.
    waiting: HashSet<u64>,
}

/// What the service does with a request ([`Service::net_verb`]).
pub(super) enum Step {
    /// Answered now.
    Answer(Resp),
    /// Answered when its address resolves.
    Deferred,
    /// Not a verb of addresses: the usual way.
    Other(Req),
}

impl Net {
    /// Client `key` waits for an answer: its socket is not read.
    pub(super) fn waits(&self, key: u64) -> bool {
        self.waiting.contains(&key)
    }

    /// Client `key` is gone: what it waits for is dropped when it comes.
    pub(super) fn forget(&mut self, key: u64) {
        self.waiting.remove(&key);
    }

    /// The resolver's notifier (readable when answers are there), if it runs.
    pub(super) fn fd(&self) -> Option<&OwnedFd> {
        self.thread.as_ref().map(|t| &*t.done)
    }

    /// Queue `w` for `hop`, asking the resolver for it unless someone asked already.
    fn wait(&mut self, dev: &Device, hop: Hop, w: Waiter) -> Result<(), Resp> {
        if self.thread.is_none() {
            let made = dev
                .in_namespace(Resolver::spawn)
                .map_err(|e| errno_resp(&e))?;
            self.thread = Some(made.map_err(|e| bad(libc::EAGAIN, &e.to_string()))?);
        }
        let Some(t) = &self.thread else {
            return Err(bad(libc::EAGAIN, "no resolver"));
        };
        if let Some(v) = self.waiters.get_mut(&hop) {
            v.push(w);
            return Ok(());
        }
        if self.waiters.len() >= MAX_PENDING {
            return Err(bad(
                libc::EAGAIN,
                &format!("{MAX_PENDING} addresses are being resolved: try again"),
            ));
        }
        self.waiters.insert(hop, vec![w]);
        t.ask(hop);
        Ok(())
    }
}

/// The resolver thread and what it shares with the loop.
struct Resolver {
    shared: Arc<Shared>,
    /// The loop writes it: new hops to resolve, or stop.
    wake: Arc<OwnedFd>,
    /// The resolver writes it: answers are there.
    done: Arc<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    queues: Mutex<Queues>,
    stop: AtomicBool,
}

#[derive(Default)]
struct Queues {
    asked: Vec<Hop>,
    found: Vec<(Hop, Found)>,
}

fn eventfd() -> std::io::Result<Arc<OwnedFd>> {
    let fd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
    Ok(Arc::new(fd))
}

fn kick(fd: &OwnedFd) {
    // Non-blocking, and only this process holds it: a full counter is already a kick.
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

fn drain(fd: &OwnedFd) {
    let mut b = [0u8; 8];
    let _ = rustix::io::read(fd, &mut b);
}

impl Resolver {
    /// Open the watch and start the thread, both in the calling thread's namespace
    /// (run through [`Device::in_namespace`]).
    fn spawn() -> std::io::Result<Resolver> {
        let watch = NeighbourWatch::open()?;
        let shared = Arc::new(Shared::default());
        let (wake, done) = (eventfd()?, eventfd()?);
        let (s, w, d) = (shared.clone(), wake.clone(), done.clone());
        let thread = std::thread::Builder::new()
            .name("xrnic-resolver".into())
            .spawn(move || resolve_loop(watch, &s, &w, &d))?;
        Ok(Resolver {
            shared,
            wake,
            done,
            thread: Some(thread),
        })
    }

    fn ask(&self, hop: Hop) {
        self.queues().asked.push(hop);
        kick(&self.wake);
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.shared.queues.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        // The thread waits only in poll(2) on `wake` and the watch: it ends at once.
        self.shared.stop.store(true, Ordering::SeqCst);
        kick(&self.wake);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The resolver thread: every pending hop at once, each until it resolves or its
/// deadline passes (`link::RESOLVE_TIMEOUT`, as the in-process resolution waits).
fn resolve_loop(mut watch: NeighbourWatch, shared: &Shared, wake: &OwnedFd, done: &OwnedFd) {
    let mut pending: HashMap<Hop, Instant> = HashMap::new();
    while !shared.stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        let wait = pending
            .values()
            .min()
            .map_or(Duration::from_secs(1), |d| d.saturating_duration_since(now));
        let ts = rustix::time::Timespec {
            tv_sec: wait.as_secs() as i64,
            tv_nsec: i64::from(wait.subsec_nanos()),
        };
        let news = {
            let nfd = watch.fd();
            let mut fds = [
                PollFd::new(&nfd, PollFlags::IN),
                PollFd::new(wake, PollFlags::IN),
            ];
            let _ = rustix::event::poll(&mut fds, Some(&ts));
            !fds[0].revents().is_empty()
        };
        drain(wake);
        let mut found: Vec<(Hop, Found)> = Vec::new();
        let asked = std::mem::take(
            &mut shared
                .queues
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .asked,
        );
        let now = Instant::now();
        for hop in asked {
            if pending.contains_key(&hop) {
                continue;
            }
            match watch.lookup(hop.0, hop.1) {
                Ok(Some(mac)) => found.push((hop, Ok(mac))),
                Ok(None) => {
                    watch.trigger(hop.0, hop.1);
                    pending.insert(hop, now + link::RESOLVE_TIMEOUT);
                }
                Err(e) => found.push((hop, Err(io_errno(&e)))),
            }
        }
        if news {
            match watch.news() {
                Ok(v) => {
                    for n in v {
                        match n {
                            NeighbourNews::Usable(i, ip, mac) => {
                                if pending.remove(&(i, ip)).is_some() {
                                    found.push(((i, ip), Ok(mac)));
                                }
                            }
                            // The kernel gave up: ask once more while time is left.
                            NeighbourNews::Failed(i, ip) if pending.contains_key(&(i, ip)) => {
                                watch.trigger(i, ip)
                            }
                            NeighbourNews::Failed(..) => {}
                            NeighbourNews::Lost => look_again(&mut watch, &mut pending, &mut found),
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!("neighbour notifications: {e}");
                    look_again(&mut watch, &mut pending, &mut found);
                }
            }
        }
        let now = Instant::now();
        pending.retain(|&(i, ip), deadline| {
            if *deadline > now {
                return true;
            }
            let why = format!(
                "no neighbour entry for {ip} (interface {i}) after {:?}: is the peer up and on this link?",
                link::RESOLVE_TIMEOUT
            );
            found.push(((i, ip), Err((libc::ETIMEDOUT, why))));
            false
        });
        if !found.is_empty() {
            shared
                .queues
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .found
                .extend(found);
            kick(done);
        }
    }
}

/// Notifications were lost: read the table for every pending hop.
fn look_again(
    watch: &mut NeighbourWatch,
    pending: &mut HashMap<Hop, Instant>,
    found: &mut Vec<(Hop, Found)>,
) {
    pending.retain(|&hop, _| match watch.lookup(hop.0, hop.1) {
        Ok(Some(mac)) => {
            found.push((hop, Ok(mac)));
            false
        }
        _ => true,
    });
}

fn io_errno(e: &std::io::Error) -> (i32, String) {
    (
        e.raw_os_error().unwrap_or(libc::EHOSTUNREACH),
        e.to_string(),
    )
}

/// The GID a verb addresses, its source GID index and its VLAN tag (`None`: not a verb
/// with an address).
fn addressed(req: &Req) -> Option<(Gid, u8, Option<u16>)> {
    match req {
        Req::CreateAh { av, .. } => Some((av.dgid, av.sgid_index, av.vlan_tci)),
        Req::ModifyQp { attr, mask, .. } if mask.contains(AttrMask::AV) => {
            let av = &attr.ah_attr;
            Some((av.dgid, av.sgid_index, av.vlan_tci))
        }
        _ => None,
    }
}

/// Client `c`'s verb `req` with its path `path` (MAC, hop limit): the answer.
fn run_verb(lim: &Limits, c: &mut Client, req: &Req, path: ([u8; 6], u8)) -> Resp {
    match req {
        Req::CreateAh { pd, av } => {
            let Some(p) = c.pds.get(pd) else {
                return bad(libc::ENOENT, "no such PD");
            };
            if c.ahs.len() >= lim.max_ahs {
                return over("AHs", lim.max_ahs);
            }
            match p.create_ah_resolved(av, path) {
                Ok(ah) => {
                    let id = c.next;
                    let av = *ah.attr();
                    c.next += 1;
                    c.ahs
                        .insert(id, crate::service::objects::AhEnt { ah, pd: *pd });
                    Resp::Ah { ah: id, av }
                }
                Err(e) => errno_resp(&e),
            }
        }
        Req::ModifyQp { qpn, attr, mask } => {
            let Some(q) = c.qps.get(qpn) else {
                return bad(libc::ENOENT, "no such QP");
            };
            match q.qp.modify_resolved(attr, *mask, path) {
                Ok(()) => Resp::Ok,
                Err(e) => errno_resp(&e),
            }
        }
        _ => bad(libc::EINVAL, "unexpected"),
    }
}

impl Service {
    /// A verb whose path the service resolves (see the module comment): answered now,
    /// deferred until its address resolves, or `Other` for any other request.
    pub(super) fn net_verb(&mut self, i: usize, req: Req) -> Step {
        let c = &self.clients[i];
        // Before hello, `handle` refuses it.
        let Some((dgid, sgid_index, vlan)) = addressed(&req).filter(|_| c.sq.is_some()) else {
            return Step::Other(req);
        };
        if vlan.is_some() {
            return Step::Answer(bad(
                libc::EPERM,
                "the service sends untagged frames: for a VLAN, run it on the VLAN's interface",
            ));
        }
        let missing = match &req {
            Req::CreateAh { pd, .. } => !c.pds.contains_key(pd),
            Req::ModifyQp { qpn, .. } => !c.qps.contains_key(qpn),
            _ => false,
        };
        if missing {
            return Step::Answer(bad(libc::ENOENT, "no such PD or QP"));
        }
        // What fails whatever the path, before any resolution.
        match &req {
            Req::CreateAh { .. } if c.ahs.len() >= self.limits.max_ahs => {
                return Step::Answer(over("AHs", self.limits.max_ahs));
            }
            _ => {}
        }
        let sgid = self.dev.query_gid(usize::from(sgid_index));
        match sgid {
            Some(s) if gid_is_ipv4(&s) != gid_is_ipv4(&dgid) => {
                return Step::Answer(errno_resp(&crate::verbs::Error::GidFamilyMismatch {
                    sgid_index,
                }));
            }
            None if matches!(req, Req::CreateAh { .. }) => {
                return Step::Answer(bad(libc::EINVAL, "sgid_index beyond the GID table"));
            }
            _ => {}
        }
        let step = match crate::wire::multicast_mac(&dgid) {
            Some(mac) => Ok(PathStep::Ready(mac, self.dev.route_hop_limit(&dgid))),
            None => self.dev.path_step(sgid.as_ref(), &dgid),
        };
        let lim = self.limits;
        match step {
            Ok(PathStep::Ready(mac, hl)) => {
                Step::Answer(run_verb(&lim, &mut self.clients[i], &req, (mac, hl)))
            }
            Ok(PathStep::Neighbour {
                ifindex,
                hop,
                hop_limit,
            }) => {
                let key = self.clients[i].key;
                let w = Waiter::Verb {
                    key,
                    req,
                    hop_limit,
                };
                match self.net.wait(&self.dev, (ifindex, hop), w) {
                    Ok(()) => {
                        self.net.waiting.insert(key);
                        Step::Deferred
                    }
                    Err(r) => Step::Answer(r),
                }
            }
            Err(e) => Step::Answer(errno_resp(&e)),
        }
    }

    /// QP1's MAD to `to` waits for `hop`.
    pub(super) fn gsi_wait(&mut self, hop: Hop, to: Gid, hop_limit: u8) -> Result<(), Resp> {
        self.net.wait(&self.dev, hop, Waiter::Gsi { to, hop_limit })
    }

    /// Finish what the resolver answered: each waiting client's verb is done and
    /// answered, QP1's held MADs go out. The keys of clients whose answer could not be
    /// sent (they are to be dropped, as in `serve_messages`).
    pub(super) fn finish_resolved(&mut self) -> Vec<u64> {
        let mut gone = Vec::new();
        let Some(t) = &self.net.thread else {
            return gone;
        };
        drain(&t.done);
        let found = std::mem::take(&mut t.queues().found);
        for (hop, res) in found {
            for w in self.net.waiters.remove(&hop).unwrap_or_default() {
                match w {
                    Waiter::Verb {
                        key,
                        req,
                        hop_limit,
                    } => {
                        if !self.net.waiting.remove(&key) {
                            continue; // gone meanwhile
                        }
                        let Some(c) = self.clients.iter_mut().find(|c| c.key == key) else {
                            continue;
                        };
                        let resp = match &res {
                            Ok(mac) => run_verb(&self.limits, c, &req, (*mac, hop_limit)),
                            Err((errno, msg)) => bad(*errno, msg),
                        };
                        let sent = serde_json::to_vec(&resp).ok().is_some_and(|text| {
                            crate::io::shm::send_with_fds(c.sock.as_fd(), &text, &[]).is_ok()
                        });
                        if !sent {
                            gone.push(key);
                        }
                    }
                    Waiter::Gsi { to, hop_limit } => {
                        let path = res.as_ref().map(|m| (*m, hop_limit));
                        self.gsi_resolved(&to, path);
                    }
                }
            }
        }
        gone
    }
}
