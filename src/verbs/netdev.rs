//! What a device learns from its network interface: the GID table, the active MTU, the
//! port state, and destination MACs from the kernel's neighbour table.
//!
//! Contract:
//! - GID table, ordered like rxe's (which the kernel's `roce_gid_mgmt` fills): index 0 is
//!   the IPv6 link-local address derived from the MAC (EUI-64, the "default GID"), then
//!   the interface's IPv4 addresses as IPv4-mapped GIDs, then its other IPv6 addresses, in
//!   the order `ip addr` lists them. rxe lists every address twice (RoCE v1 and v2);
//!   xrnic speaks RoCE v2 only and lists each once (see docs/rnic.md for the index
//!   mapping).
//! - Active MTU as rxe's `eth_mtu_int_to_enum`: the largest IB MTU (256..=4096) not above
//!   the interface MTU minus 80 bytes (`RXE_MAX_HDR_LENGTH`): 1500 → 1024, 9000 → 4096.
//! - Neighbour look-ups run in the device's network namespace (remembered when it was
//!   opened). A missing entry makes the kernel resolve it: one UDP datagram to the
//!   discard port of the peer, then the table is read again, for a bounded time.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::process::Command;
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

/// Whether `gid` is an IPv6 link-local address (fe80::/10), which ib_core keeps the
/// caller's hop limit for.
pub fn gid_is_link_local(gid: &[u8; 16]) -> bool {
    gid[0] == 0xfe && gid[1] & 0xc0 == 0x80
}

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

/// The state of an interface as `ip link` reports it.
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

#[derive(serde::Deserialize)]
struct JsonLinkState {
    operstate: Option<String>,
    /// Present when an XDP program is attached.
    xdp: Option<serde_json::Value>,
    #[serde(default)]
    flags: Vec<String>,
}

/// A MAC address as `ip link` prints it: `aa:bb:cc:dd:ee:ff`.
pub fn mac_text(mac: &[u8; 6]) -> String {
    let [a, b, c, d, e, f] = mac;
    format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
}

/// `ip -j link show dev IF`: the interface's flags, state and XDP attachment.
fn link_states(ifname: &str) -> io::Result<Vec<JsonLinkState>> {
    let out = Command::new("ip")
        .args(["-j", "link", "show", "dev", ifname])
        .output()?;
    Ok(serde_json::from_slice(&out.stdout).unwrap_or_default())
}

/// Wait up to `patience` for `ifname` to have no XDP program attached; returns whether
/// it has none. The kernel detaches a process's XDP link when its last descriptor goes,
/// which for a process just killed (`kill -9`) happens while the process is torn down,
/// some tens of milliseconds after the signal: a device reopened at once would otherwise
/// find the dead one's program still there.
pub fn wait_xdp_detached(ifname: &str, patience: Duration) -> io::Result<bool> {
    let until = Instant::now() + patience;
    loop {
        if link_states(ifname)?.first().is_none_or(|s| s.xdp.is_none()) {
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
    let states = link_states(ifname)?;
    let xdp_attached = states.first().is_some_and(|s| s.xdp.is_some());
    let up = states.first().is_some_and(|s| {
        let admin_up = s.flags.iter().any(|f| f == "UP");
        let lower_up = s.flags.iter().any(|f| f == "LOWER_UP");
        match s.operstate.as_deref() {
            Some("UP") => true,
            Some("UNKNOWN") => admin_up && lower_up,
            _ => false,
        }
    });
    Ok(NetdevInfo {
        ifname: l.ifname,
        ifindex: l.ifindex,
        mac: l.mac,
        mtu: l.mtu,
        addrs: l.addrs.into_iter().map(|(a, _)| a).collect(),
        up,
        xdp_attached,
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

    /// Run `f` on a fresh thread inside this namespace (setns(2) affects one thread).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
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
}

/// How long to wait for the kernel to resolve a neighbour: ARP and ND retransmit after
/// one second, so a couple of seconds covers one lost request.
pub const RESOLVE_TRIES: u32 = 300;
const RESOLVE_STEP: Duration = Duration::from_millis(10);

/// The MAC of `ip` on `ifname` (index `ifindex`), from the neighbour table of the
/// calling thread's namespace, asking the kernel to resolve it when missing.
pub fn resolve_neighbour(ifname: &str, ifindex: u32, ip: IpAddr) -> io::Result<[u8; 6]> {
    for attempt in 0..RESOLVE_TRIES {
        if let Some(mac) = link::neighbour(None, ifname, ip)? {
            return Ok(mac);
        }
        // Poke the kernel every second: a datagram to the discard port (9) makes it send
        // ARP / neighbour solicitation first. The datagram itself is harmless (at worst
        // an ICMP port unreachable comes back).
        if attempt % 100 == 0 {
            poke(ifindex, ip);
        }
        std::thread::sleep(RESOLVE_STEP);
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "no neighbour entry for {ip} on {ifname} after {:?}: is the peer up and on this link?",
            RESOLVE_STEP * RESOLVE_TRIES
        ),
    ))
}

fn poke(ifindex: u32, ip: IpAddr) {
    let (bind, dst): (SocketAddr, SocketAddr) = match ip {
        IpAddr::V4(v4) => ((Ipv4Addr::UNSPECIFIED, 0).into(), SocketAddr::from((v4, 9))),
        IpAddr::V6(v6) => {
            // A link-local destination needs the interface as its scope.
            let scope = if v6.segments()[0] & 0xffc0 == 0xfe80 {
                ifindex
            } else {
                0
            };
            (
                (Ipv6Addr::UNSPECIFIED, 0).into(),
                SocketAddr::V6(SocketAddrV6::new(v6, 9, 0, scope)),
            )
        }
    };
    if let Ok(s) = UdpSocket::bind(bind) {
        let _ = s.send_to(&[0], dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
