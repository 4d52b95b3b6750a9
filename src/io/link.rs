//! Interface and neighbour facts the driver needs to address frames: MAC, MTU, IPv4/IPv6
//! addresses of an interface, and the kernel's neighbour table.
//!
//! Read by running `ip -j` (iproute2's JSON output) and parsing it with serde_json, which
//! the crate already uses: that avoids a netlink crate and its message builders for four
//! read-only look-ups done once at start-up; iproute2 is on every Linux host that can run
//! AF_XDP. Pass `netns` to look inside a named namespace (`ip -n`), or `None` for the
//! caller's own.

use std::io;
use std::net::IpAddr;
use std::process::Command;

use serde::Deserialize;

/// What `ip -j addr show dev X` says about an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    pub ifname: String,
    pub ifindex: u32,
    pub mac: [u8; 6],
    pub mtu: u32,
    pub addrs: Vec<(IpAddr, u8)>,
}

#[derive(Deserialize)]
struct JsonAddr {
    local: Option<String>,
    prefixlen: Option<u8>,
}

#[derive(Deserialize)]
struct JsonLink {
    ifname: String,
    ifindex: u32,
    address: Option<String>,
    mtu: u32,
    #[serde(default)]
    addr_info: Vec<JsonAddr>,
}

#[derive(Deserialize)]
struct JsonNeigh {
    dst: String,
    lladdr: Option<String>,
    #[serde(default)]
    state: Vec<String>,
}

fn ip_json(netns: Option<&str>, args: &[&str]) -> io::Result<Vec<u8>> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    cmd.arg("-j").args(args);
    let out = cmd.output().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("running ip: {e} (is iproute2 installed?)"),
        )
    })?;
    if !out.status.success() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(out.stdout)
}

/// Parse `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in mac.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// MAC, MTU, index and addresses of `ifname`.
pub fn link_info(netns: Option<&str>, ifname: &str) -> io::Result<LinkInfo> {
    let out = ip_json(netns, &["addr", "show", "dev", ifname])?;
    let links: Vec<JsonLink> =
        serde_json::from_slice(&out).map_err(|e| bad(format!("ip -j addr output: {e}")))?;
    let l = links
        .into_iter()
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no interface {ifname}")))?;
    let mac = l
        .address
        .as_deref()
        .and_then(parse_mac)
        .ok_or_else(|| bad(format!("{ifname} has no Ethernet address")))?;
    let addrs = l
        .addr_info
        .iter()
        .filter_map(|a| Some((a.local.as_deref()?.parse().ok()?, a.prefixlen?)))
        .collect();
    Ok(LinkInfo {
        ifname: l.ifname,
        ifindex: l.ifindex,
        mac,
        mtu: l.mtu,
        addrs,
    })
}

/// The Ethernet address of `ifname`.
pub fn mac_of(netns: &str, ifname: &str) -> io::Result<[u8; 6]> {
    link_info(Some(netns), ifname).map(|l| l.mac)
}

/// The kernel's neighbour-table entry (ARP for IPv4, ND for IPv6) for `dst` on `ifname`:
/// `Ok(None)` when there is none or it is not usable (INCOMPLETE / FAILED).
pub fn neighbour(netns: Option<&str>, ifname: &str, dst: IpAddr) -> io::Result<Option<[u8; 6]>> {
    let d = dst.to_string();
    let out = ip_json(netns, &["neigh", "show", "to", &d, "dev", ifname])?;
    let entries: Vec<JsonNeigh> =
        serde_json::from_slice(&out).map_err(|e| bad(format!("ip -j neigh output: {e}")))?;
    Ok(entries
        .into_iter()
        .filter(|n| n.dst.parse::<IpAddr>().ok() == Some(dst))
        .filter(|n| !n.state.iter().any(|s| s == "INCOMPLETE" || s == "FAILED"))
        .find_map(|n| n.lladdr.as_deref().and_then(parse_mac)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_mac_accepts_only_six_hex_pairs() {
        assert_eq!(
            parse_mac("02:fc:00:0a:ff:01"),
            Some([0x02, 0xfc, 0x00, 0x0a, 0xff, 0x01])
        );
        for bad in [
            "",
            "02:fc:00:0a:ff",
            "02:fc:00:0a:ff:01:02",
            "2:fc:00:0a:ff:01",
            "zz:fc:00:0a:ff:01",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad:?}");
        }
    }
}
