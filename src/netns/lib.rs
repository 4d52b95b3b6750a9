//! A pair of network namespaces joined by a veth pair, for tests, benchmarks and demos.
//!
//! Side A: `192.0.2.1/24`, `fd00::1/64`; side B: `192.0.2.2/24`, `fd00::2/64` (documentation
//! and unique-local ranges: nothing leaves the pair). Names carry the process id and a
//! counter, so parallel tests and processes do not collide. Everything is removed on drop
//! (deleting a namespace deletes its veth end), also when a test panics.
//!
//! [`VethPair::observed`] puts a third namespace between the two ends: each end's veth peer
//! is a port of a Linux bridge there, and [`VethPair::observer`] names a port on which a
//! packet capture sees both directions. A capture on an end itself sees no RoCE traffic:
//! AF_XDP receives frames in the XDP hook, before the kernel's packet taps, and transmits
//! them with `__dev_direct_xmit`, which skips the taps too.
//!
//! [`VethPair::routed`] puts a router there instead: A and B on two subnets
//! (192.0.2.0/26 and 192.0.2.64/26, fd00::a:0/112 and fd00::b:0/112), forwarding on in the
//! middle, default routes through it, so the peer is reached through a next hop.
//!
//! This harness (crate `xrnic-netns`, for tests, benchmarks and `xrnic demo`) builds
//! namespaces and links with iproute2's `ip`. It is a crate of its own so that the engine
//! library `xrnic` runs no program: nothing on a device's path uses it
//! ([`xrnic::io::link`] reads the kernel over rtnetlink, and tests/layering.rs fails when
//! a file of the library uses `std::process::Command`).
//!
//! Code runs inside a namespace on a fresh thread that first calls setns(2)
//! ([`VethPair::run_in`]): sockets and XDP attachments created there stay bound to that
//! namespace when the values move back to the caller's thread. Commands run through
//! `ip netns exec` ([`VethPair::exec`]).

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// One end of the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// Addresses and names of one end.
#[derive(Clone, Debug)]
pub struct End {
    pub netns: String,
    pub ifname: String,
    pub mac: [u8; 6],
    pub ipv4: Ipv4Addr,
    pub ipv6: Ipv6Addr,
}

/// Two namespaces and the veth pair between them (or, [`VethPair::observed`], a bridge in a
/// third namespace between them); removed on drop.
#[derive(Debug)]
pub struct VethPair {
    a: End,
    b: End,
    mtu: u32,
    /// The middle namespace of an observed pair.
    middle: Option<String>,
}

/// In the middle namespace of an observed pair: the bridge and its port towards side A
/// (names are per namespace, so fixed names do not collide).
const BRIDGE: &str = "br0";
const PORT_A: &str = "to-a";
const PORT_B: &str = "to-b";

/// The router's IPv4 and IPv6 addresses towards A and towards B ([`VethPair::routed`]).
pub const ROUTER_A: (&str, &str) = ("192.0.2.62", "fd00::a:ff");
pub const ROUTER_B: (&str, &str) = ("192.0.2.126", "fd00::b:ff");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Topology {
    /// One veth pair between A and B.
    Direct,
    /// A bridge in a third namespace ([`VethPair::observed`]).
    Bridged,
    /// A router in a third namespace ([`VethPair::routed`]).
    Routed,
}

fn run(cmd: &mut Command) -> io::Result<Output> {
    let out = cmd.output().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "running {:?}: {e} (is iproute2 installed?)",
                cmd.get_program()
            ),
        )
    })?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(io::Error::other(format!(
            "{:?} failed ({}): {}",
            cmd,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn ip(args: &[&str]) -> io::Result<Output> {
    run(Command::new("ip").args(args))
}

impl VethPair {
    /// Create the namespaces, the veth pair with `mtu` on both ends, and the addresses.
    /// Needs root.
    pub fn new(mtu: u32) -> io::Result<Self> {
        Self::build(mtu, Topology::Direct)
    }

    /// Like [`VethPair::new`], but A and B are each joined by a veth pair to a bridge in a
    /// third namespace, where [`VethPair::observer`] can be captured. Same addresses,
    /// same MTU everywhere; A and B are still neighbours on one Ethernet segment.
    pub fn observed(mtu: u32) -> io::Result<Self> {
        Self::build(mtu, Topology::Bridged)
    }

    /// A and B on two subnets, joined through a router in a third namespace:
    /// A `192.0.2.1/26`, `fd00::a:1/112`; B `192.0.2.65/26`, `fd00::b:1/112`; the router
    /// [`ROUTER_A`] towards A and [`ROUTER_B`] towards B, forwarding both families, and
    /// A's and B's default routes through it. The peer is not on the link: its MAC is
    /// the router's, and IP TTL / hop limit drop by one on the way.
    pub fn routed(mtu: u32) -> io::Result<Self> {
        Self::build(mtu, Topology::Routed)
    }

    /// The namespace and interface where a capture sees the traffic of both directions
    /// (observed pairs only).
    pub fn observer(&self) -> Option<(&str, &str)> {
        self.middle.as_deref().map(|ns| (ns, PORT_A))
    }

    /// The namespaces of this pair (two, or three when observed).
    pub fn netns_names(&self) -> Vec<String> {
        let mut v = vec![self.a.netns.clone(), self.b.netns.clone()];
        v.extend(self.middle.clone());
        v
    }

    fn build(mtu: u32, topo: Topology) -> io::Result<Self> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let mk = |side: char, ipv4: Ipv4Addr, ipv6: Ipv6Addr| End {
            netns: format!("xrnic-{pid}-{n}-{side}"),
            // IFNAMSIZ is 16 with the NUL: "xr" + pid (<= 7 digits) + "-" + n (< 1000) +
            // side is at most 14. Each end is created right inside its own namespace, so
            // the names only need to be readable, not globally unique.
            ifname: format!("xr{pid}-{}{side}", n % 1000),
            mac: [0; 6],
            ipv4,
            ipv6,
        };
        let routed = topo == Topology::Routed;
        let (ip_a, ip_b, prefix4, prefix6) = if routed {
            (
                (
                    Ipv4Addr::new(192, 0, 2, 1),
                    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0xa, 1),
                ),
                (
                    Ipv4Addr::new(192, 0, 2, 65),
                    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0xb, 1),
                ),
                26,
                112,
            )
        } else {
            (
                (
                    Ipv4Addr::new(192, 0, 2, 1),
                    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
                ),
                (
                    Ipv4Addr::new(192, 0, 2, 2),
                    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
                ),
                24,
                64,
            )
        };
        let mut pair = VethPair {
            a: mk('a', ip_a.0, ip_a.1),
            b: mk('b', ip_b.0, ip_b.1),
            mtu,
            middle: (topo != Topology::Direct).then(|| format!("xrnic-{pid}-{n}-m")),
        };
        // From here on, Drop removes whatever was created, also on an early return.
        ip(&["netns", "add", &pair.a.netns])?;
        ip(&["netns", "add", &pair.b.netns])?;
        match (topo, pair.middle.clone()) {
            (Topology::Bridged, Some(m)) => pair.link_through_bridge(&m)?,
            (Topology::Routed, Some(m)) => pair.link_through_router(&m)?,
            _ => pair.link_direct()?,
        }
        for end in [&pair.a, &pair.b] {
            let ns = end.netns.as_str();
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/{prefix4}", end.ipv4),
                "dev",
                &end.ifname,
            ])?;
            // nodad: usable at once, no duplicate-address probe to wait for.
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/{prefix6}", end.ipv6),
                "dev",
                &end.ifname,
                "nodad",
            ])?;
            ip(&["-n", ns, "link", "set", &end.ifname, "up"])?;
        }
        if routed {
            for (end, (gw4, gw6)) in [(&pair.a, ROUTER_A), (&pair.b, ROUTER_B)] {
                let ns = end.netns.as_str();
                ip(&["-n", ns, "route", "add", "default", "via", gw4])?;
                ip(&["-6", "-n", ns, "route", "add", "default", "via", gw6])?;
            }
        }
        pair.a.mac = xrnic::io::link::mac_of(&pair.a.netns, &pair.a.ifname)?;
        pair.b.mac = xrnic::io::link::mac_of(&pair.b.netns, &pair.b.ifname)?;
        Ok(pair)
    }

    fn link_direct(&self) -> io::Result<()> {
        let mtu = self.mtu.to_string();
        ip(&[
            "link",
            "add",
            &self.a.ifname,
            "netns",
            &self.a.netns,
            "mtu",
            &mtu,
            "type",
            "veth",
            "peer",
            "name",
            &self.b.ifname,
            "netns",
            &self.b.netns,
            "mtu",
            &mtu,
        ])?;
        Ok(())
    }

    fn link_through_bridge(&self, m: &str) -> io::Result<()> {
        let mtu = self.mtu.to_string();
        ip(&["netns", "add", m])?;
        ip(&["-n", m, "link", "set", "lo", "up"])?;
        // No STP, no forwarding delay: the ports forward as soon as they are up.
        ip(&[
            "-n",
            m,
            "link",
            "add",
            BRIDGE,
            "mtu",
            &mtu,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ])?;
        for (end, port) in [(&self.a, PORT_A), (&self.b, PORT_B)] {
            ip(&[
                "link",
                "add",
                &end.ifname,
                "netns",
                &end.netns,
                "mtu",
                &mtu,
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                m,
                "mtu",
                &mtu,
            ])?;
            ip(&["-n", m, "link", "set", port, "master", BRIDGE])?;
            ip(&["-n", m, "link", "set", port, "up"])?;
        }
        ip(&["-n", m, "link", "set", BRIDGE, "up"])?;
        Ok(())
    }

    /// The router of a routed pair: forwarding on, an interface towards each end with
    /// the router's addresses of that subnet.
    fn link_through_router(&self, m: &str) -> io::Result<()> {
        let mtu = self.mtu.to_string();
        ip(&["netns", "add", m])?;
        ip(&["-n", m, "link", "set", "lo", "up"])?;
        for (end, port, (gw4, gw6)) in [(&self.a, PORT_A, ROUTER_A), (&self.b, PORT_B, ROUTER_B)] {
            ip(&[
                "link",
                "add",
                &end.ifname,
                "netns",
                &end.netns,
                "mtu",
                &mtu,
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                m,
                "mtu",
                &mtu,
            ])?;
            ip(&["-n", m, "addr", "add", &format!("{gw4}/26"), "dev", port])?;
            ip(&[
                "-n",
                m,
                "addr",
                "add",
                &format!("{gw6}/112"),
                "dev",
                port,
                "nodad",
            ])?;
            ip(&["-n", m, "link", "set", port, "up"])?;
        }
        // /proc/sys/net is the reading (here: writing) thread's namespace.
        let path = format!("/run/netns/{m}");
        let ns = File::open(&path).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
        std::thread::scope(|s| {
            s.spawn(|| -> io::Result<()> {
                move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&ns),
                    Some(LinkNameSpaceType::Network),
                )
                .map_err(io::Error::from)?;
                std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")?;
                std::fs::write("/proc/sys/net/ipv6/conf/all/forwarding", "1")
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("forwarding thread panicked")))
        })
    }

    pub fn end(&self, side: Side) -> &End {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// Run `f` on a new thread inside `side`'s network namespace and return its result.
    /// A panic in `f` is resumed on the caller's thread.
    pub fn run_in<T, F>(&self, side: Side, f: F) -> io::Result<T>
    where
        T: Send,
        F: FnOnce() -> T + Send,
    {
        let path = format!("/run/netns/{}", self.end(side).netns);
        let ns = File::open(&path).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
        std::thread::scope(|s| {
            let h = s.spawn(move || -> io::Result<T> {
                // setns(2) changes the network namespace of this thread only.
                move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&ns),
                    Some(LinkNameSpaceType::Network),
                )
                .map_err(|e| {
                    io::Error::new(io::Error::from(e).kind(), format!("setns {path}: {e}"))
                })?;
                Ok(f())
            });
            match h.join() {
                Ok(r) => r,
                Err(p) => std::panic::resume_unwind(p),
            }
        })
    }

    /// Run a command inside `side`'s namespace (`ip netns exec`); returns its output
    /// whatever its exit status.
    pub fn exec(&self, side: Side, cmd: &[&str]) -> io::Result<Output> {
        Command::new("ip")
            .args(["netns", "exec", &self.end(side).netns])
            .args(cmd)
            .output()
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        for ns in self.netns_names() {
            // Best effort: a namespace that was never created fails harmlessly.
            let _ = Command::new("ip")
                .args(["netns", "del", &ns])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}
