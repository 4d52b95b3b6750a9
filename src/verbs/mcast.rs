//! UD multicast in the Rust API: [`Qp::attach_mcast`] / [`Qp::detach_mcast`]
//! (`ibv_attach_mcast` / `ibv_detach_mcast`, IBTA vol. 1 §11.2.5) and the kernel
//! memberships that go with them.
//!
//! Contract:
//! - The engine keeps which QP is in which group and delivers a datagram sent to a group
//!   to each of them (src/proto/mcast_verbs.rs). The MLID is ignored, as ib_core ignores
//!   it on RoCE (`is_valid_mcast_lid`).
//! - The interface must accept the group's frames and the network must know of the
//!   membership: while at least one QP of the device is attached to a group, the device
//!   holds the group joined in the kernel on its interface (`crate::io::mcast`:
//!   `IP_ADD_MEMBERSHIP` / `IPV6_JOIN_GROUP`, which programs the NIC's multicast filter
//!   and sends IGMP / MLD reports). rxe programs the filter (`rxe_mcast_add` →
//!   `dev_mc_add`) and the kernel's cma sends the IGMP report of an rdma_cm join
//!   (`cma_igmp_send`); a socket membership does both. The membership is joined inside
//!   the device's network namespace; the last detach, or the destruction of the last QP
//!   attached, leaves it. A join the kernel refuses fails the attach (its errno) and
//!   undoes it.
//! - Software backend: the simulated link joins nothing (it has no kernel side); through
//!   the device service the service's device attaches the client's QP and holds the
//!   membership (src/service/objects.rs); the offload backend returns
//!   `Error::Unsupported`.
//! - Loopback (a member on the sending device receiving the datagram) is the driver's,
//!   crate::driver::Loopback; docs/verbs-abi.md says what rxe does.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::driver::loopback::LoopGroups;
use crate::io::mcast::{GroupMembership, join_group};
use crate::wire::multicast_mac;

use super::qp::QpKind;
use super::{Addressing, DevBackend, Device, Error, Gid, Qp, Result, netdev};
use crate::ipc::{Req, Resp};

/// The groups joined in the kernel for a device, by GID, and the MACs of the groups with
/// a local member, whose frames the driver loops back (crate::driver::loopback).
#[derive(Debug, Default)]
pub(super) struct Memberships {
    joined: Mutex<BTreeMap<Gid, GroupMembership>>,
    loop_groups: LoopGroups,
}

impl Qp {
    /// `ibv_attach_mcast`: attach this UD QP to multicast group `gid` (a multicast GID:
    /// `::ffff:a.b.c.d` for an IPv4 group, the address for an IPv6 one). Attaching twice
    /// succeeds (rxe). Errors: not a multicast GID or not a UD QP (EINVAL, ib_core), a
    /// limit of rxe's reached (ENOMEM), the kernel's refusal of the membership.
    pub fn attach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        let pd = match &self.kind {
            QpKind::Soft { pd, .. } => pd,
            QpKind::Svc(q) => {
                return q.pd.conn.call_ok(&Req::AttachMcast {
                    qpn: self.qpn.value(),
                    gid: *gid,
                    lid,
                });
            }
            QpKind::Verbs(_) => return Err(self.mcast_unsupported()),
        };
        let new = pd.shared.lock().rnic.attach_mcast(self.qpn, gid)?;
        if let Err(e) = self.dev.sync_mcast_memberships() {
            if new {
                // Undo: the QP was not attached before this call.
                let _ = pd.shared.lock().rnic.detach_mcast(self.qpn, gid);
                let _ = self.dev.sync_mcast_memberships();
            }
            return Err(e);
        }
        Ok(())
    }

    /// `ibv_detach_mcast`: detach this QP from `gid` (EINVAL when it is not attached, as
    /// rxe's `rxe_detach_mcg`). The last QP of the device to leave the group leaves it
    /// in the kernel too.
    pub fn detach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        let pd = match &self.kind {
            QpKind::Soft { pd, .. } => pd,
            QpKind::Svc(q) => {
                return q.pd.conn.call_ok(&Req::DetachMcast {
                    qpn: self.qpn.value(),
                    gid: *gid,
                    lid,
                });
            }
            QpKind::Verbs(_) => return Err(self.mcast_unsupported()),
        };
        pd.shared.lock().rnic.detach_mcast(self.qpn, gid)?;
        // A leave cannot fail; a join of another group that failed earlier is retried
        // here and its error is that attach's business, not this detach's.
        let _ = self.dev.sync_mcast_memberships();
        Ok(())
    }

    /// The multicast groups this QP is attached to.
    pub fn mcast_groups(&self) -> Vec<Gid> {
        let pd = match &self.kind {
            QpKind::Soft { pd, .. } => pd,
            QpKind::Svc(q) => {
                let req = Req::McastGroups {
                    qpn: self.qpn.value(),
                };
                return match q.pd.conn.call(&req) {
                    Ok((Resp::Groups { gids }, _)) => gids,
                    _ => Vec::new(),
                };
            }
            QpKind::Verbs(_) => return Vec::new(),
        };
        let g = pd.shared.lock();
        g.rnic
            .mcast_groups()
            .into_iter()
            .filter(|gid| g.rnic.mcast_members(gid).contains(&self.qpn))
            .collect()
    }

    fn mcast_unsupported(&self) -> Error {
        Error::Unsupported {
            what: "multicast groups",
            backend: self.dev.backend(),
        }
    }
}

impl Device {
    /// The groups this device holds joined in the kernel (see the module's contract).
    pub fn mcast_memberships(&self) -> Vec<Gid> {
        self.inner.mcast.lock().keys().copied().collect()
    }

    /// Make the kernel memberships those of the groups the engine has QPs in: join the
    /// missing ones, leave the others. Called after every attach, detach and QP
    /// destruction; the first join that fails is the error (the others are still done).
    pub(super) fn sync_mcast_memberships(&self) -> Result<()> {
        let DevBackend::Soft { addressing, driver } = &self.inner.backend else {
            return Ok(());
        };
        // Held across the engine read and the joins: two threads syncing at once agree.
        let mut joined = self.inner.mcast.lock();
        let want = driver.shared().lock().rnic.mcast_groups();
        self.inner.mcast.set_loop_groups(&want);
        let Addressing::Netdev { ns, ifindex, .. } = addressing else {
            return Ok(());
        };
        joined.retain(|g, _| want.contains(g));
        let missing: Vec<Gid> = want
            .into_iter()
            .filter(|g| !joined.contains_key(g))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let ifindex = *ifindex;
        // One thread in the device's namespace for all of them (its sockets stay
        // there after the thread ends).
        let results = ns.run(move || {
            missing
                .into_iter()
                .map(|g| (g, join_group(ifindex, netdev::gid_ip(&g))))
                .collect::<Vec<_>>()
        })?;
        let mut first_err = None;
        for (g, r) in results {
            match r {
                Ok(m) => {
                    joined.insert(g, m);
                }
                Err(e) => {
                    tracing::warn!(
                        "{}: joining multicast group {} in the kernel: {e}",
                        self.inner.name,
                        netdev::gid_ip(&g)
                    );
                    first_err.get_or_insert(Error::Io(e));
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Memberships {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Gid, GroupMembership>> {
        self.joined.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The group MACs the driver's loopback shares with this device.
    pub(super) fn loop_groups(&self) -> LoopGroups {
        self.loop_groups.clone()
    }

    fn set_loop_groups(&self, groups: &[Gid]) {
        let macs = groups.iter().filter_map(multicast_mac).collect();
        *self.loop_groups.lock().unwrap_or_else(|e| e.into_inner()) = macs;
    }
}
