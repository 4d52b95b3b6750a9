//! `Res` and `ResPage`: who sees which resources (docs/security.md, "The device service").
//!
//! Contract, as the kernel's `rdma resource show` (the RDMA netlink dumps show the keys
//! and addresses of other processes' objects only to CAP_NET_ADMIN):
//! - The asker is the connection's peer (SO_PEERCRED at connect). Root (uid 0), or a
//!   process whose /proc/PID/status, read at the request, has CAP_NET_ADMIN in CapEff and
//!   the peer's uid as its effective uid, sees every client's objects and the GSI
//!   relay's counters. Anyone else sees only the clients of its own uid (its own
//!   processes: their objects, keys and addresses), and no counters of others.
//! - No hello is needed (`xrnic res` creates nothing), so what a connection that never
//!   says hello may learn is the same as above.
//! - Each client is listed with its pid and comm (from the kernel at connect: SO_PEERCRED
//!   and /proc/PID/comm), so every object names its owner.
//! - [`Req::ResPage`](crate::ipc::Req::ResPage) answers a page of the same listing
//!   ([`ResDoc::page`]), so the listing is any size.

use super::{Service, client_res};
use crate::ipc::{ResDoc, Resp};

/// CAP_NET_ADMIN (linux/capability.h).
const CAP_NET_ADMIN: u32 = 12;
/// CAP_NET_RAW (linux/capability.h).
pub(super) const CAP_NET_RAW: u32 = 13;

/// Whether the process `pid`, connected as `uid`, may see every client's resources.
fn sees_all(pid: i32, uid: u32) -> bool {
    has_cap(pid, uid, CAP_NET_ADMIN)
}

/// Whether the process `pid`, connected as `uid`, is root or holds capability `cap` in
/// its effective set with `uid` still its effective uid (/proc/PID/status, read now).
pub(super) fn has_cap(pid: i32, uid: u32, cap: u32) -> bool {
    if uid == 0 {
        return true;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(str::trim)
    };
    // Uid: real, effective, saved, filesystem.
    let euid = field("Uid:")
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u32>().ok());
    let eff = field("CapEff:").and_then(|v| u64::from_str_radix(v, 16).ok());
    euid == Some(uid) && eff.is_some_and(|c| c & (1 << cap) != 0)
}

impl Service {
    /// What client `i` may see (module comment).
    fn res_for(&self, i: usize) -> ResDoc {
        let me = &self.clients[i];
        self.listing(sees_all(me.pid, me.uid), me.uid)
    }

    /// Every client's resources (what root sees).
    #[cfg(test)]
    pub(super) fn res_doc(&self) -> ResDoc {
        self.listing(true, 0)
    }

    /// The clients of `uid`, or all of them.
    fn listing(&self, all: bool, uid: u32) -> ResDoc {
        ResDoc {
            service_pid: std::process::id(),
            netdev: self.ifname.clone(),
            clients: self
                .clients
                .iter()
                .filter(|c| c.sq.is_some() && (all || c.uid == uid))
                .map(|c| {
                    let mut r = client_res(c);
                    r.gsi_listens = self.relay.listens_of(c.key);
                    r
                })
                .collect(),
            gsi: if all {
                self.relay.counters
            } else {
                Default::default()
            },
        }
    }

    /// The answer to `Res` (`page: None`) or `ResPage { skip }` of client `i`.
    pub(super) fn res_answer(&self, i: usize, page: Option<u64>) -> Resp {
        let doc = self.res_for(i);
        match page {
            None => Resp::Res(doc),
            Some(skip) => {
                let (doc, next) = doc.page(skip, crate::ipc::RES_PAGE);
                Resp::ResPage { doc, next }
            }
        }
    }
}
