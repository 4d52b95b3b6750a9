//! Addresses. GIDs (IBTA vol. 1 §4.1.1): 16 bytes, for RoCE v2 the IPv6 address of the
//! port, or the IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, RFC 4291 §2.5.5.2) of an IPv4
//! one (annex A17.4); and MAC addresses as text. The helpers every layer uses to build and
//! compare them live here, once.

/// A GID as it lies in a GID table or an address vector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

/// The first twelve bytes of an IPv4-mapped IPv6 address.
const V4_MAPPED: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

impl Gid {
    /// The GID of an IPv4 address.
    pub const fn from_ipv4(ip: [u8; 4]) -> Gid {
        Gid(ipv4_gid(ip))
    }

    /// True for an IPv4-mapped GID.
    pub fn is_ipv4(&self) -> bool {
        gid_is_ipv4(&self.0)
    }

    /// The IPv4 address of an IPv4-mapped GID.
    pub fn ipv4(&self) -> Option<[u8; 4]> {
        self.is_ipv4()
            .then(|| [self.0[12], self.0[13], self.0[14], self.0[15]])
    }

    /// True for an IPv6 link-local address (`fe80::/10`).
    pub fn is_link_local(&self) -> bool {
        gid_is_link_local(&self.0)
    }

    /// True when the GID names the IP address `ip` as it lies in a frame (see [`gid_is`]).
    pub fn names(&self, ip: &[u8]) -> bool {
        gid_is(&self.0, ip)
    }
}

impl From<[u8; 16]> for Gid {
    fn from(g: [u8; 16]) -> Gid {
        Gid(g)
    }
}

impl From<Gid> for [u8; 16] {
    fn from(g: Gid) -> [u8; 16] {
        g.0
    }
}

/// True for an IPv4-mapped IPv6 address (`::ffff:0:0/96`).
pub fn gid_is_ipv4(gid: &[u8; 16]) -> bool {
    gid[..12] == V4_MAPPED
}

/// The GID for an IPv4 address.
pub const fn ipv4_gid(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12] = ip[0];
    g[13] = ip[1];
    g[14] = ip[2];
    g[15] = ip[3];
    g
}

/// True for an IPv6 link-local address (`fe80::/10`).
pub fn gid_is_link_local(gid: &[u8; 16]) -> bool {
    gid[0] == 0xfe && gid[1] & 0xc0 == 0x80
}

/// True when `gid` names the address `ip` (4 bytes: IPv4, as its IPv4-mapped GID; 16
/// bytes: IPv6): the compare done on a frame's bytes, without building a GID.
#[inline(always)]
pub fn gid_is(gid: &[u8; 16], ip: &[u8]) -> bool {
    match ip.len() {
        4 => gid[..12] == V4_MAPPED && gid[12..] == *ip,
        _ => gid[..] == *ip,
    }
}

/// The destination QPN of every multicast packet (IBTA vol. 1 §10.5.2.2: a packet to a
/// multicast group carries DQPN 0xFFFFFF; rxe's `IB_MULTICAST_QPN`).
pub const MULTICAST_QPN: u32 = 0xff_ffff;

/// True for a multicast GID, as ib_core's `rdma_is_multicast_addr` says: an IPv6
/// multicast address (`ff00::/8`) or the IPv4-mapped GID of an IPv4 multicast address
/// (`::ffff:224.0.0.0/100`, RFC 5771).
pub fn gid_is_multicast(gid: &[u8; 16]) -> bool {
    gid[0] == 0xff || (gid_is_ipv4(gid) && gid[12] & 0xf0 == 0xe0)
}

/// The Ethernet address frames to multicast group `gid` go to, as ib_core's
/// `ib_resolve_eth_dmac` derives it for a multicast GID (no neighbour look-up): IPv4
/// `01:00:5e` and the low 23 bits of the address (RFC 1112 §6.4, the kernel's
/// `ip_eth_mc_map`), IPv6 `33:33` and its low 32 bits (RFC 2464 §7, `ipv6_eth_mc_map`).
/// `None` when `gid` is not multicast.
pub fn multicast_mac(gid: &[u8; 16]) -> Option<[u8; 6]> {
    if !gid_is_multicast(gid) {
        return None;
    }
    Some(if gid_is_ipv4(gid) {
        [0x01, 0x00, 0x5e, gid[13] & 0x7f, gid[14], gid[15]]
    } else {
        [0x33, 0x33, gid[12], gid[13], gid[14], gid[15]]
    })
}

/// True for a group (multicast) Ethernet address: the I/G bit, the low bit of the first
/// byte (IEEE 802 §8.2).
#[inline(always)]
pub fn mac_is_multicast(mac: &[u8]) -> bool {
    mac.first().is_some_and(|b| b & 1 == 1)
}

/// A MAC address as `ip link` prints it: `aa:bb:cc:dd:ee:ff`.
pub fn mac_text(mac: &[u8; 6]) -> String {
    let [a, b, c, d, e, f] = mac;
    format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_gids_round_trip_and_compare_on_frame_bytes() {
        let g = Gid::from_ipv4([192, 0, 2, 7]);
        assert!(g.is_ipv4());
        assert_eq!(g.ipv4(), Some([192, 0, 2, 7]));
        assert!(g.names(&[192, 0, 2, 7]));
        assert!(!g.names(&[192, 0, 2, 8]));
        assert!(g.names(&g.0), "the mapped address as 16 bytes");
        let v6 = Gid([0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert!(!v6.is_ipv4() && v6.ipv4().is_none());
        assert!(!v6.names(&[0, 0, 0, 1]));
        let mut ll = [0u8; 16];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        assert!(Gid(ll).is_link_local() && !v6.is_link_local());
        assert_eq!(mac_text(&[2, 0xab, 0, 0, 0, 0x1f]), "02:ab:00:00:00:1f");
    }

    #[test]
    fn multicast_gids_and_their_macs() {
        let g4 = ipv4_gid([239, 129, 2, 3]);
        assert!(gid_is_multicast(&g4));
        // The high bit of the second octet is not in the MAC (23 bits).
        assert_eq!(
            multicast_mac(&g4),
            Some([0x01, 0x00, 0x5e, 0x01, 0x02, 0x03])
        );
        assert!(!gid_is_multicast(&ipv4_gid([192, 0, 2, 1])));
        assert!(gid_is_multicast(&ipv4_gid([224, 0, 0, 1])));
        assert!(!gid_is_multicast(&ipv4_gid([240, 0, 0, 1])));
        let mut g6 = [0u8; 16];
        g6[0] = 0xff;
        g6[1] = 0x0e;
        g6[12..].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(
            multicast_mac(&g6),
            Some([0x33, 0x33, 0xde, 0xad, 0xbe, 0xef])
        );
        g6[0] = 0xfd;
        assert_eq!(multicast_mac(&g6), None);
        assert!(mac_is_multicast(&[0x01, 0, 0x5e, 0, 0, 1]));
        assert!(!mac_is_multicast(&[0x02, 0, 0, 0, 0, 1]));
        assert!(!mac_is_multicast(&[]));
    }
}
