//! Layer-2 offsets and ECN marking on raw frame bytes, for code that edits a frame in
//! place (the simulated link's and the driver's CE-marking fault injectors).

use super::frame::ipv4_checksum;

/// The 802.1Q TPID.
const VLAN_TPID: [u8; 2] = [0x81, 0x00];

/// The TCI of the 802.1Q tag right after the Ethernet addresses, if the frame has one.
pub fn vlan_tci(frame: &[u8]) -> Option<u16> {
    let tci = frame.get(14..16)?;
    (frame.get(12..14)? == VLAN_TPID).then(|| u16::from_be_bytes([tci[0], tci[1]]))
}

/// Where the IP header starts: after the Ethernet header and the 802.1Q tag, if any.
pub fn ip_offset(frame: &[u8]) -> usize {
    if frame.get(12..14) == Some(&VLAN_TPID[..]) {
        18
    } else {
        14
    }
}

/// Set CE on an ECN-capable (ECT(0) or ECT(1)) frame (RFC 3168 §5), and fix the IPv4
/// header checksum. Returns whether the frame was marked. The ICRC masks the ECN bits
/// (IBTA annex A17.3.3), so a marked frame stays valid.
pub fn mark_ce(f: &mut [u8]) -> bool {
    let ip = ip_offset(f);
    let Some(et) = f.get(ip - 2..ip) else {
        return false;
    };
    match [et[0], et[1]] {
        [0x08, 0x00] if f.len() >= ip + 20 => {
            if f[ip + 1] & 3 == 0 {
                return false;
            }
            let ihl = usize::from(f[ip] & 0x0f) * 4;
            if ihl < 20 || f.len() < ip + ihl {
                return false;
            }
            f[ip + 1] |= 3;
            let sum = ipv4_checksum(&f[ip..ip + ihl]);
            f[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
            true
        }
        [0x86, 0xdd] if f.len() >= ip + 40 => {
            // Traffic class straddles bytes 0 and 1; ECN is its low two bits (byte 1, bits 5..4).
            if (f[ip + 1] >> 4) & 3 == 0 {
                return false;
            }
            f[ip + 1] |= 0x30;
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{
        BthRepr, EthRepr, ExtHeaders, FrameRepr, FrameView, IpRepr, Opcode, Psn, Qpn, RoceRepr,
        UdpRepr,
    };

    fn frame(ip: IpRepr, vlan_tci: Option<u16>) -> Vec<u8> {
        let r = FrameRepr {
            eth: EthRepr {
                dst: [2, 0, 0, 0, 0, 2],
                src: [2, 0, 0, 0, 0, 1],
                vlan_tci,
            },
            ip,
            udp: UdpRepr {
                src_port: 0xc000,
                checksum: 0,
            },
            roce: RoceRepr {
                bth: BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::new(0x11), Psn::new(5)),
                ext: ExtHeaders::default(),
                payload: b"abcd",
            },
        };
        let mut out = vec![0u8; r.buffer_len()];
        let n = r.emit(&mut out).unwrap();
        out.truncate(n);
        out
    }

    fn v4(tos: u8) -> IpRepr {
        IpRepr::V4 {
            src: [192, 0, 2, 1],
            dst: [192, 0, 2, 2],
            tos,
            identification: 7,
            dont_fragment: true,
            ttl: 64,
        }
    }

    #[test]
    fn ce_marks_ect_frames_and_keeps_them_valid() {
        for vlan in [None, Some(0x6005)] {
            let v6 = IpRepr::V6 {
                src: [0xfd; 16],
                dst: [0xfe; 16],
                traffic_class: 0x02,
                flow_label: 0,
                hop_limit: 64,
            };
            for ip in [v4(0x02), v4(0x01 | 0xb8), v6] {
                let mut f = frame(ip, vlan);
                assert_eq!(vlan_tci(&f), vlan);
                assert_eq!(ip_offset(&f), if vlan.is_some() { 18 } else { 14 });
                assert!(mark_ce(&mut f));
                // The IPv4 checksum was fixed, and the ICRC masks the ECN bits.
                let v = FrameView::parse(&f).unwrap();
                v.verify_icrc().unwrap();
                assert_eq!(v.ip_ecn(), 3);
            }
        }
    }

    #[test]
    fn not_ect_and_non_ip_frames_are_left_alone() {
        let f0 = frame(v4(0xb8), None);
        let mut f = f0.clone();
        assert!(!mark_ce(&mut f));
        assert_eq!(f, f0);
        let mut arp = f0.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(!mark_ce(&mut arp.clone()));
        let mut tagged = frame(v4(0x02), Some(1));
        assert_eq!(vlan_tci(&tagged[..15]), None, "a tag cut short is no tag");
        assert!(!mark_ce(&mut tagged[..30]));
        for cut in [0, 13, 20] {
            assert!(!mark_ce(&mut arp[..cut].to_vec()));
            assert!(!mark_ce(&mut f0[..cut].to_vec()));
        }
    }
}
