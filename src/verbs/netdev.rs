//! What a device learns from its network interface: the GID table, the active MTU, the
//! port state, and destination MACs from the kernel's neighbour table.
//!
//! Contract:
//! - GID table, ordered like rxe's (which the kernel's `roce_gid_mgmt` fills): index 0 is
//!   the IPv6 link-local address derived from the MAC (EUI-64, the "default GID"), then
//!   the interface's IPv4 addresses as IPv4-mapped GIDs, then its other IPv6 addresses, in
//!   the order the kernel lists them (`ip addr`). rxe lists every address twice (RoCE v1 and v2);
//!   xrnic speaks RoCE v2 only and lists each once (see docs/rnic.md for the index
//!   mapping).
//! - Active MTU as rxe's `eth_mtu_int_to_enum`: the largest IB MTU (256..=4096) not above
//!   the interface MTU minus 80 bytes (`RXE_MAX_HDR_LENGTH`): 1500 → 1024, 9000 → 4096.
//! - Route and neighbour look-ups run in the device's network namespace (remembered when
//!   it was opened), over rtnetlink ([`link`]): the route to the destination gives the
//!   next hop (a router's address for a peer behind it) and its hop-limit metric; the
//!   next hop's MAC comes from the neighbour table, and a missing entry is resolved by
//!   the kernel (`NTF_USE`) while xrnic waits for the kernel's neighbour notification.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

use crate::io::link;
use crate::proto::{Mtu, gid_is_ipv4, ipv4_gid};

/// rxe's `RXE_MAX_HDR_LENGTH`: IPv6 + UDP + BTH + RETH + ICRC... headroom it reserves
/// below the interface MTU for the IB payload.
pub const MAX_HDR_LENGTH: u32 = 80;

/// The active MTU for an interface MTU, or `None` when not even 256 bytes fit.
pub fn active_mtu(if_mtu: u32) -> Option<Mtu> {
    let room = if_mtu.checked_sub(MAX_HDR_LENGTH)?;
    [
        Mtu::Mtu4096,
        Mtu::Mtu2048,
        Mtu::Mtu1024,
        Mtu::Mtu512,
        Mtu::Mtu256,
    ]
    .into_iter()
    .find(|m| m.bytes() <= room)
}

/// Bytes of an untagged Ethernet header: an IP packet of MTU bytes is a frame of MTU + 14.
pub const ETH_HLEN: u32 = 14;

/// The port's (max MTU, active MTU) for an interface MTU when frames can be at most
/// `max_frame` bytes (the AF_XDP port's limit): [`active_mtu`] of the interface MTU, both
/// capped to what a `max_frame`-byte frame carries, as rxe caps its MTU to the netdev's.
/// Multi-buffer (9216-byte frames): 4096 and the interface's; single-buffer (3840):
/// 2048 at most. `None` when not even 256 bytes fit.
pub fn port_mtus(if_mtu: u32, max_frame: usize) -> Option<(Mtu, Mtu)> {
    let frame_mtu = u32::try_from(max_frame)
        .unwrap_or(u32::MAX)
        .saturating_sub(ETH_HLEN);
    let max = active_mtu(frame_mtu)?;
    let active = active_mtu(if_mtu.min(frame_mtu))?;
    Some((max, active))
}

/// The modified EUI-64 interface identifier of a MAC (RFC 4291 appendix A): the U/L bit
/// flipped and ff:fe in the middle. rxe's node GUID and default GID use it.
pub fn eui64(mac: [u8; 6]) -> [u8; 8] {
    [
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ]
}

/// `fe80::` + the EUI-64 of `mac`.
pub fn link_local_gid(mac: [u8; 6]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8..].copy_from_slice(&eui64(mac));
    g
}

/// The interfaces a program is shown devices for (`xrnic_IF`, in this order: the C
/// library's device list and its `uverbsN` numbering, docs/verbs-abi.md):
/// `XRNIC_NETDEV` (comma-separated), else every interface that is up and Ethernet (sysfs
/// `type` 1), by name.
pub fn listed_netdevs() -> Vec<String> {
    if let Ok(v) = std::env::var("XRNIC_NETDEV") {
        return v
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
    }
    let read = |ifname: &str, f: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{ifname}/{f}")).unwrap_or_default()
    };
    let mut out: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| read(n, "type").trim() == "1")
                .filter(|n| {
                    let flags = read(n, "flags");
                    u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16)
                        .is_ok_and(|f| f & libc::IFF_UP as u32 != 0)
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The interface's speed in Mb/s (sysfs `speed`), 10000 when it reports none (a veth
/// reports 10000 itself; a device without carrier fails the read).
pub fn link_speed_mbps(ifname: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(10_000)
}

/// Width and speed codes (`active_width`, `active_speed` of `ibv_port_attr`) for an
/// Ethernet speed in Mb/s: one lane of the IB speed nearest below, as the kernel's
/// `ib_get_eth_speed` reports for a RoCE port.
pub fn ib_width_speed(mbps: u64) -> (u8, u8) {
    let speed = match mbps {
        0..=2_500 => 1,        // SDR
        2_501..=5_000 => 2,    // DDR
        5_001..=10_000 => 8,   // FDR10
        10_001..=14_000 => 16, // FDR
        14_001..=25_000 => 32, // EDR
        25_001..=50_000 => 64, // HDR
        _ => 128,              // NDR
    };
    (1, speed)
}

/// The GID table for an interface with `mac` and `addrs` (see the module doc).
pub fn gid_table(mac: [u8; 6], addrs: &[IpAddr]) -> Vec<[u8; 16]> {
    let mut t = vec![link_local_gid(mac)];
    for a in addrs {
        if let IpAddr::V4(v4) = a {
            push_unique(&mut t, ipv4_gid(v4.octets()));
        }
    }
    for a in addrs {
        if let IpAddr::V6(v6) = a {
            push_unique(&mut t, v6.octets());
        }
    }
    t
}

fn push_unique(t: &mut Vec<[u8; 16]>, g: [u8; 16]) {
    if !t.contains(&g) {
        t.push(g);
    }
}

/// The IP address a GID stands for.
pub fn gid_ip(gid: &[u8; 16]) -> IpAddr {
    if gid_is_ipv4(gid) {
        IpAddr::V4(Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
    } else {
        IpAddr::V6(Ipv6Addr::from(*gid))
    }
}

/// Whether a GID is an IPv6 link-local address (fe80::/10), which ib_core keeps the
/// caller's hop limit for.
pub use crate::wire::gid_is_link_local;

/// Text of a GID as `inet_ntop(AF_INET6)` prints it (what ibv_devinfo and
/// ibv_rc_pingpong show): `::ffff:192.0.2.1` for IPv4-mapped ones.
pub fn gid_text(gid: &[u8; 16]) -> String {
    let v6 = Ipv6Addr::from(*gid);
    if gid_is_ipv4(gid) {
        format!("::ffff:{}", gid_ip(gid))
    } else {
        v6.to_string()
    }
}

/// The state of an interface (rtnetlink's view: [`link::LinkInfo`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetdevInfo {
    pub ifname: String,
    pub ifindex: u32,
    pub mac: [u8; 6],
    pub mtu: u32,
    pub addrs: Vec<IpAddr>,
    /// The link is up (operstate UP, or UNKNOWN with the interface administratively up,
    /// as for devices that do not report carrier).
    pub up: bool,
    /// An XDP program is attached (another xrnic device, or another XDP user).
    pub xdp_attached: bool,
}

/// A MAC address as `ip link` prints it: `aa:bb:cc:dd:ee:ff`.
pub use crate::wire::mac_text;

/// Wait up to `patience` for `ifname` to have no XDP program attached; returns whether
/// it has none. The kernel detaches a process's XDP link when its last descriptor goes,
/// which for a process just killed (`kill -9`) happens while the process is torn down,
/// some tens of milliseconds after the signal: a device reopened at once would otherwise
/// find the dead one's program still there.
pub fn wait_xdp_detached(ifname: &str, patience: Duration) -> io::Result<bool> {
    let until = Instant::now() + patience;
    loop {
        if !link::link_info(None, ifname)?.xdp_attached {
            return Ok(true);
        }
        if Instant::now() >= until {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Read `ifname`'s facts in the calling thread's network namespace.
pub fn probe(ifname: &str) -> io::Result<NetdevInfo> {
    let l = link::link_info(None, ifname).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("interface {ifname}: {e} (does it exist in this network namespace?)"),
        )
    })?;
    Ok(NetdevInfo {
        ifname: l.ifname,
        ifindex: l.ifindex,
        mac: l.mac,
        mtu: l.mtu,
        addrs: l.addrs.into_iter().map(|(a, _)| a).collect(),
        up: l.up,
        xdp_attached: l.xdp_attached,
    })
}

/// A network namespace, held open so that later look-ups run where the device lives
/// (the application thread may have moved, or the device was opened from a helper
/// thread that entered the namespace).
#[derive(Debug)]
pub struct NetNs {
    file: File,
}

impl NetNs {
    /// The calling thread's network namespace.
    pub fn current() -> io::Result<NetNs> {
        Ok(NetNs {
            file: File::open("/proc/thread-self/ns/net")?,
        })
    }

    /// Run `f` inside this namespace: on the calling thread when it is there already,
    /// else on a fresh thread that moves into it (setns(2) affects one thread). setns(2)
    /// needs CAP_SYS_ADMIN even into the namespace a thread is in, which an unprivileged
    /// client of the device service (docs/rnic.md) lacks: its route and neighbour
    /// look-ups (rdma_resolve_route) run where it is.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        if self.is_current()? {
            return Ok(f());
        }
        std::thread::scope(|s| {
            let h = s.spawn(|| -> io::Result<T> {
                move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&self.file),
                    Some(LinkNameSpaceType::Network),
                )
                .map_err(io::Error::from)?;
                Ok(f())
            });
            match h.join() {
                Ok(r) => r,
                Err(p) => std::panic::resume_unwind(p),
            }
        })
    }

    /// Whether the calling thread is in this namespace (the same nsfs inode).
    fn is_current(&self) -> io::Result<bool> {
        let here = rustix::fs::stat("/proc/thread-self/ns/net")?;
        let this = rustix::fs::fstat(&self.file)?;
        Ok((here.st_dev, here.st_ino) == (this.st_dev, this.st_ino))
    }
}

/// Where frames to `dst` go from `ifname` (index `ifindex`), as the kernel routes them
/// from `src` (the source GID's address): the next hop's MAC (the destination's on the
/// link, the router's behind one) and the route's hop-limit metric, if it has one. Run in
/// the device's namespace. Like `rdma_resolve_addr` for rxe (drivers/infiniband/core/
/// addr.c: `addr_resolve` looks the route up, then the neighbour of its next hop).
pub fn resolve_path(
    ifname: &str,
    ifindex: u32,
    src: Option<IpAddr>,
    dst: IpAddr,
) -> io::Result<([u8; 6], Option<u8>)> {
    let (hop, hop_limit) = route_on(ifname, ifindex, src, dst)?;
    let mac = link::resolve_neighbour(ifname, ifindex, hop, link::RESOLVE_TIMEOUT)?;
    Ok((mac, hop_limit))
}

/// The route to `dst` (from `src`) through `ifname`: its next hop and hop-limit metric;
/// NotFound when it leaves through another interface.
fn route_on(
    ifname: &str,
    ifindex: u32,
    src: Option<IpAddr>,
    dst: IpAddr,
) -> io::Result<(IpAddr, Option<u8>)> {
    let route = link::route_to(dst, src, Some(ifindex))?;
    if route.oif != 0 && route.oif != ifindex {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "the route to {dst} leaves through interface {}, not {ifname}",
                route.oif
            ),
        ));
    }
    Ok((route.next_hop(dst), route.hop_limit))
}

/// The half of [`resolve_path`] that does not wait on the network: the route to `dst`
/// and its next hop, with the next hop's MAC when the neighbour table has a usable entry
/// already (`None`: it is to be resolved, [`link::NeighbourWatch`]). Run in the device's
/// namespace.
pub fn path_step(
    ifname: &str,
    ifindex: u32,
    src: Option<IpAddr>,
    dst: IpAddr,
) -> io::Result<(IpAddr, Option<[u8; 6]>, Option<u8>)> {
    let (hop, hop_limit) = route_on(ifname, ifindex, src, dst)?;
    Ok((hop, link::neighbour_on(ifindex, hop)?, hop_limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_in_the_callers_namespace_needs_no_cap_sys_admin() {
        use rustix::thread::{CapabilitySet, capabilities, set_capabilities};
        let ns = NetNs::current().unwrap();
        std::thread::spawn(move || {
            // This thread alone gives CAP_SYS_ADMIN up (capabilities are per thread), as
            // a client of the device service running as nobody has none.
            let mut caps = capabilities(None).unwrap();
            caps.effective.remove(CapabilitySet::SYS_ADMIN);
            caps.permitted.remove(CapabilitySet::SYS_ADMIN);
            set_capabilities(None, caps).unwrap();
            let seen = ns.run(|| std::thread::current().id()).unwrap();
            assert_eq!(seen, std::thread::current().id(), "on the calling thread");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn active_mtu_matches_rxe() {
        assert_eq!(active_mtu(1500), Some(Mtu::Mtu1024));
        assert_eq!(active_mtu(9000), Some(Mtu::Mtu4096));
        assert_eq!(active_mtu(4176), Some(Mtu::Mtu4096));
        assert_eq!(active_mtu(4175), Some(Mtu::Mtu2048));
        assert_eq!(active_mtu(1104), Some(Mtu::Mtu1024));
        assert_eq!(active_mtu(1103), Some(Mtu::Mtu512));
        assert_eq!(active_mtu(336), Some(Mtu::Mtu256));
        assert_eq!(active_mtu(335), None);
        assert_eq!(active_mtu(0), None);
    }

    #[test]
    fn single_buffer_frames_cap_the_mtu_at_2048() {
        use crate::io::afxdp::{CHUNK_DATA, MAX_FRAME};
        assert_eq!(
            port_mtus(9000, MAX_FRAME),
            Some((Mtu::Mtu4096, Mtu::Mtu4096))
        );
        assert_eq!(
            port_mtus(1500, MAX_FRAME),
            Some((Mtu::Mtu4096, Mtu::Mtu1024))
        );
        assert_eq!(
            port_mtus(9000, CHUNK_DATA),
            Some((Mtu::Mtu2048, Mtu::Mtu2048))
        );
        assert_eq!(
            port_mtus(1500, CHUNK_DATA),
            Some((Mtu::Mtu2048, Mtu::Mtu1024))
        );
        assert_eq!(port_mtus(300, CHUNK_DATA), None);
        // The largest RoCE frame at the capped MTU fits a chunk: Ethernet, IPv6, UDP,
        // BTH, RETH, the payload and the ICRC.
        let (_, active) = port_mtus(9000, CHUNK_DATA).unwrap();
        assert!(14 + 40 + 8 + 12 + 16 + active.bytes() as usize + 4 <= CHUNK_DATA);
    }

    #[test]
    fn gid_table_order_is_link_local_then_ipv4_then_ipv6() {
        let mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
        let ll: IpAddr = "fe80::11:22ff:fe33:4455".parse().unwrap();
        let addrs: Vec<IpAddr> = vec![
            "fd00::1".parse().unwrap(),
            ll,
            "192.0.2.1".parse().unwrap(),
            "198.51.100.7".parse().unwrap(),
        ];
        let t = gid_table(mac, &addrs);
        let text: Vec<String> = t.iter().map(gid_text).collect();
        assert_eq!(
            text,
            [
                "fe80::11:22ff:fe33:4455",
                "::ffff:192.0.2.1",
                "::ffff:198.51.100.7",
                "fd00::1"
            ]
        );
        assert_eq!(gid_ip(&t[1]), "192.0.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(gid_ip(&t[3]), "fd00::1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn eui64_flips_the_universal_local_bit() {
        assert_eq!(
            eui64([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]),
            [0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56]
        );
    }
}
