//! The device's paths without waiting: [`Device::path_step`] splits
//! [`Device::resolve_path`] where it would wait on the network (a neighbour nobody has
//! resolved yet), so that the device service's one thread never waits for an ARP or ND
//! answer (src/service/resolver.rs, docs/rnic.md "One device, many processes").

use super::{Addressing, Backend, Device, Error, Gid, Result, netdev, sysctl_hop_limit};
use std::net::IpAddr;

/// The first half of [`Device::resolve_path`], which waits on nothing ([`Device::path_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathStep {
    /// The next hop's MAC and the hop limit: nothing to wait for.
    Ready([u8; 6], u8),
    /// The next hop `hop` on interface `ifindex` (in the device's namespace) has no
    /// usable neighbour entry: it is to be resolved (`crate::io::link::NeighbourWatch`),
    /// then the path is that MAC and `hop_limit`.
    Neighbour {
        ifindex: u32,
        hop: IpAddr,
        hop_limit: u8,
    },
}

impl Device {
    /// What [`Device::resolve_path`] finds without waiting on the network: the route,
    /// the hop limit and the neighbour table as they are now. A caller that must not
    /// block (the device service's loop, src/service/resolver.rs) resolves a
    /// [`PathStep::Neighbour`] elsewhere.
    pub fn path_step(&self, sgid: Option<&Gid>, dgid: &Gid) -> Result<PathStep> {
        let ip = netdev::gid_ip(dgid);
        match self.inner.addressing() {
            Some(Addressing::Netdev {
                ns,
                ifname,
                ifindex,
            }) if !self.inner.gids.contains(dgid) => {
                let src = sgid.map(netdev::gid_ip);
                let (hop, mac, hl) = ns.run(|| netdev::path_step(ifname, *ifindex, src, ip))??;
                let hop_limit = hl.unwrap_or_else(|| sysctl_hop_limit(dgid, ifname));
                Ok(match mac {
                    Some(mac) => PathStep::Ready(mac, hop_limit),
                    None => PathStep::Neighbour {
                        ifindex: *ifindex,
                        hop,
                        hop_limit,
                    },
                })
            }
            // The device's own GID, the simulated link: nothing waits.
            _ => self
                .resolve_path(sgid, dgid)
                .map(|(mac, hl)| PathStep::Ready(mac, hl)),
        }
    }

    /// Run `f` on a thread in the device's network namespace (see
    /// `netdev::NetNs::run`): sockets it opens, and threads it spawns, are there. On the
    /// simulated link, on the calling thread.
    pub fn in_namespace<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        match self.inner.addressing() {
            Some(Addressing::Netdev { ns, .. }) => Ok(ns.run(f)?),
            Some(Addressing::Sim { .. }) => Ok(f()),
            None => Err(Error::Unsupported {
                what: "network namespaces",
                backend: Backend::Offload,
            }),
        }
    }
}
