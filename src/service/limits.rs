//! Bounds per client, per uid and for the whole service (docs/security.md, "The device
//! service"): what a client may make the service hold (descriptors, connections, shared
//! memory, objects) and what happens at the bound; the accept loop at the process's
//! descriptor limit.
//!
//! Contract:
//! - Every connection costs the service one descriptor, a client after hello four more
//!   (its submission ring's memfd and three pipe ends: src/io/shm.rs), each CQ two (its
//!   ring's memfd and its event pipe's write end), the GSI relay two. Shared memory is
//!   the rings the service creates: the submission ring and every CQ ring.
//! - A verb that would take one client past `max_fds`, or its uid past
//!   `max_fds_per_uid`, or the service past its descriptor budget (RLIMIT_NOFILE, raised
//!   to its hard limit at start, less what the service held then and [`FD_RESERVE`]),
//!   fails with EMFILE; past `max_shm_bytes` / `max_shm_bytes_per_uid` or
//!   `max_objects_per_uid` with ENOMEM (a NIC out of resources). A connection past
//!   `max_clients` or `max_clients_per_uid` gets an EMFILE answer and is closed.
//! - Root (uid 0) is exempt from the per-uid bounds, from `max_clients` and from the
//!   budget (root may stop the service, and `xrnic down` and `xrnic res` must get in when
//!   unprivileged users hold everything they may), not from the per-client bounds.
//! - accept(2) never spins: at EMFILE or ENFILE the service closes a reserve descriptor
//!   it keeps for this, accepts the waiting connection, answers it EMFILE and closes it
//!   (the listener is then no longer readable for it); any other accept error, or no
//!   reserve, takes the listener out of the poll set for [`ACCEPT_PAUSE`].

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::net::SocketFlags;

use super::{Client, Req, Resp, Service};
use crate::io::shm::Ring;
use crate::ipc;

/// Descriptors the service keeps for itself beyond what it held at start (the GSI QP,
/// /proc reads, a connection being refused).
pub(super) const FD_RESERVE: usize = 64;

/// How long the listener stays out of the poll set after an accept error.
pub(super) const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// What a client makes the service hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Usage {
    pub conns: usize,
    pub fds: usize,
    pub shm: u64,
    pub objects: usize,
}

impl Usage {
    pub fn of(c: &Client) -> Usage {
        let mut u = Usage {
            conns: 1,
            fds: 1,
            ..Usage::default()
        };
        if c.sq.is_some() {
            u.fds += 4;
            u.shm += sq_bytes();
        }
        u.fds += 2 * c.cqs.len();
        u.shm += c.cqs.len() as u64 * cq_bytes(0) + c.cq_slots * ipc::CQ_SLOT_BYTES as u64;
        if c.gsi.is_some() {
            u.fds += 2;
        }
        u.objects =
            c.pds.len() + c.mrs.len() + c.cqs.len() + c.qps.len() + c.ahs.len() + c.srqs.len();
        u
    }

    fn add(self, o: Usage) -> Usage {
        Usage {
            conns: self.conns + o.conns,
            fds: self.fds + o.fds,
            shm: self.shm + o.shm,
            objects: self.objects + o.objects,
        }
    }
}

fn sq_bytes() -> u64 {
    Ring::bytes(ipc::SQ_SLOTS, ipc::SQ_SLOT_BYTES) as u64
}

fn cq_bytes(slots: u32) -> u64 {
    Ring::bytes(slots, ipc::CQ_SLOT_BYTES) as u64
}

/// What `req` of client `c` would add (`None`: nothing bounded here).
fn cost(c: &Client, req: &Req) -> Option<Usage> {
    let one = Usage {
        objects: 1,
        ..Usage::default()
    };
    Some(match req {
        Req::Hello { .. } if c.sq.is_none() => Usage {
            fds: 4,
            shm: sq_bytes(),
            ..Usage::default()
        },
        // The slots as client_verb rounds them (an invalid cqe is refused there).
        Req::CreateCq { cqe } if *cqe > 0 && *cqe <= crate::verbs::MAX_CQE => Usage {
            fds: 2,
            shm: cq_bytes(cqe.next_power_of_two().max(16)),
            objects: 1,
            ..Usage::default()
        },
        Req::GsiOpen if c.gsi.is_none() => Usage {
            fds: 2,
            ..Usage::default()
        },
        Req::AllocPd
        | Req::RegMr { .. }
        | Req::CreateQp { .. }
        | Req::CreateAh { .. }
        | Req::CreateSrq { .. } => one,
        _ => return None,
    })
}

fn emfile(msg: String) -> Resp {
    Resp::Err {
        errno: libc::EMFILE,
        msg,
    }
}

fn enomem(msg: String) -> Resp {
    Resp::Err {
        errno: libc::ENOMEM,
        msg,
    }
}

impl Service {
    /// What every client together makes the service hold, and what those of `uid` do.
    fn totals(&self, uid: u32) -> (Usage, Usage) {
        let (mut all, mut mine) = (Usage::default(), Usage::default());
        for c in &self.clients {
            let u = Usage::of(c);
            all = all.add(u);
            if c.uid == uid {
                mine = mine.add(u);
            }
        }
        (all, mine)
    }

    /// The refusal of `req` of client `i` when it would pass a bound (module comment).
    pub(super) fn admit(&self, i: usize, req: &Req) -> Option<Resp> {
        let c = &self.clients[i];
        let add = cost(c, req)?;
        let lim = &self.limits;
        let me = Usage::of(c);
        if add.fds > 0 && me.fds + add.fds > lim.max_fds {
            return Some(emfile(format!(
                "this client holds the most descriptors of the service it may ({})",
                lim.max_fds
            )));
        }
        if add.shm > 0 && me.shm + add.shm > lim.max_shm_bytes {
            return Some(enomem(format!(
                "this client holds the most shared-memory bytes it may ({})",
                lim.max_shm_bytes
            )));
        }
        if c.uid == 0 {
            return None;
        }
        let (all, uid) = self.totals(c.uid);
        if add.fds > 0 && uid.fds + add.fds > lim.max_fds_per_uid {
            return Some(emfile(format!(
                "uid {} holds the most descriptors of the service it may ({})",
                c.uid, lim.max_fds_per_uid
            )));
        }
        if add.fds > 0 && all.fds + add.fds > self.fd_budget {
            return Some(emfile(format!(
                "the service is out of descriptors for unprivileged clients ({})",
                self.fd_budget
            )));
        }
        if add.shm > 0 && uid.shm + add.shm > lim.max_shm_bytes_per_uid {
            return Some(enomem(format!(
                "uid {} holds the most shared-memory bytes it may ({})",
                c.uid, lim.max_shm_bytes_per_uid
            )));
        }
        if add.objects > 0 && uid.objects + add.objects > lim.max_objects_per_uid {
            return Some(enomem(format!(
                "uid {} holds the most objects it may ({})",
                c.uid, lim.max_objects_per_uid
            )));
        }
        None
    }

    /// The refusal of a new connection of `uid`, if any (module comment).
    fn admit_conn(&self, uid: u32) -> Option<Resp> {
        if uid == 0 {
            return None;
        }
        let lim = &self.limits;
        if self.clients.len() >= lim.max_clients {
            return Some(emfile(format!(
                "the service holds the most connections it takes ({})",
                lim.max_clients
            )));
        }
        let (all, mine) = self.totals(uid);
        if mine.conns >= lim.max_clients_per_uid {
            return Some(emfile(format!(
                "uid {uid} holds the most connections it may ({})",
                lim.max_clients_per_uid
            )));
        }
        if mine.fds + 1 > lim.max_fds_per_uid {
            return Some(emfile(format!(
                "uid {uid} holds the most descriptors of the service it may ({})",
                lim.max_fds_per_uid
            )));
        }
        if all.fds + 1 > self.fd_budget {
            return Some(emfile(format!(
                "the service is out of descriptors for unprivileged clients ({})",
                self.fd_budget
            )));
        }
        None
    }

    /// Take every waiting connection (module comment for the bounds and the errors).
    pub(super) fn accept(&mut self) {
        loop {
            let sock = match rustix::net::accept_with(
                &self.listener,
                SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            ) {
                Ok(s) => s,
                Err(rustix::io::Errno::AGAIN) => return,
                Err(rustix::io::Errno::INTR | rustix::io::Errno::CONNABORTED) => continue,
                Err(e @ (rustix::io::Errno::MFILE | rustix::io::Errno::NFILE)) => {
                    tracing::warn!("accept: {e}: the waiting connection is refused");
                    self.shed_one();
                    return;
                }
                Err(e) => {
                    tracing::warn!("accept: {e}: the listener rests {ACCEPT_PAUSE:?}");
                    self.accept_pause = Some(Instant::now() + ACCEPT_PAUSE);
                    return;
                }
            };
            let Ok(cred) = rustix::net::sockopt::socket_peercred(&sock) else {
                continue;
            };
            let uid = cred.uid.as_raw();
            if let Some(r) = self.admit_conn(uid) {
                tracing::debug!(uid, "connection refused: {r:?}");
                refuse(&sock, &r);
                continue;
            }
            self.add_client(
                sock,
                cred.pid.as_raw_nonzero().get(),
                uid,
                cred.gid.as_raw(),
            );
        }
    }

    /// At EMFILE/ENFILE: with the reserve descriptor closed, accept one waiting
    /// connection, answer it EMFILE and close it; then take the reserve again. Without a
    /// reserve (or when this fails too) the listener rests.
    fn shed_one(&mut self) {
        let shed = self.reserve.take().and_then(|r| {
            drop(r);
            let s = rustix::net::accept_with(&self.listener, SocketFlags::CLOEXEC).ok()?;
            refuse(
                &s,
                &emfile("the device service is out of descriptors".into()),
            );
            drop(s);
            Some(())
        });
        self.reserve = reserve_fd();
        if shed.is_none() || self.reserve.is_none() {
            self.accept_pause = Some(Instant::now() + ACCEPT_PAUSE);
        }
    }
}

/// Tell a connection why it is refused (what its first request reads) and close it.
fn refuse(sock: &OwnedFd, r: &Resp) {
    if let Ok(text) = serde_json::to_vec(r) {
        let _ = rustix::net::send(
            sock.as_fd(),
            &text,
            rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL,
        );
    }
}

/// The descriptor kept for [`Service::shed_one`].
pub(super) fn reserve_fd() -> Option<OwnedFd> {
    rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .ok()
}

/// Raise RLIMIT_NOFILE's soft limit to its hard limit (getrlimit(2)); the descriptors
/// the service may give its unprivileged clients: that limit less what it holds now
/// and [`FD_RESERVE`].
pub(super) fn fd_budget() -> usize {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let r = getrlimit(Resource::Nofile);
    if let Some(max) = r.maximum
        && r.current != Some(max)
    {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(max),
                maximum: Some(max),
            },
        );
    }
    let soft = getrlimit(Resource::Nofile)
        .current
        .map_or(usize::MAX, |v| usize::try_from(v).unwrap_or(usize::MAX));
    let held = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    soft.saturating_sub(held + FD_RESERVE)
}
