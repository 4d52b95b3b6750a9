//! The RoCE v2 invariant CRC (IBTA RoCE v2 annex A17.4.1, REFERENCE §2).
//!
//! CRC-32 (IEEE 802.3, as `crc32fast` computes it) over 8 bytes of 0xFF, then the IP
//! header, the UDP header, the BTH, the extended headers, the payload and the pad, with the
//! fields a router or switch may change replaced by ones: IPv4 TOS, TTL and header
//! checksum; IPv6 traffic class, flow label and hop limit; the UDP checksum; BTH byte 4
//! (FECN, BECN, reserved). It goes on the wire least-significant byte first.
//!
//! Only the headers are copied (to mask them); the payload is hashed in place.

/// Length of the ICRC trailer.
pub const LEN: usize = 4;

/// The CRC-32 residue of a correct masked packet including its ICRC.
pub const RESIDUE: u32 = 0x2144_df1c;

/// Compute the ICRC of `pkt`, which starts at the IP header (IPv4 when `ipv6` is false)
/// whose length is `ip_hdr_len`, and ends just before the ICRC.
///
/// Bytes past the end of a short `pkt` are simply absent from the hash: this never panics,
/// but only a packet that holds its IP, UDP and BTH headers gives a meaningful value.
pub fn compute(ipv6: bool, ip_hdr_len: usize, pkt: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);

    // IP header: at most 60 bytes for IPv4 with options, 40 for IPv6.
    let ip_len = ip_hdr_len.min(pkt.len()).min(60);
    let mut ip = [0u8; 60];
    ip[..ip_len].copy_from_slice(&pkt[..ip_len]);
    let masks: &[(usize, u8)] = if ipv6 {
        // Version (high nibble of byte 0) stays; traffic class and flow label go.
        &[(0, 0x0f), (1, 0xff), (2, 0xff), (3, 0xff), (7, 0xff)]
    } else {
        &[(1, 0xff), (8, 0xff), (10, 0xff), (11, 0xff)]
    };
    for &(i, m) in masks {
        if i < ip_len {
            ip[i] |= m;
        }
    }
    h.update(&ip[..ip_len]);

    // UDP (8) + BTH (12).
    let rest = &pkt[ip_len..];
    let hl = rest.len().min(20);
    let mut hdr = [0u8; 20];
    hdr[..hl].copy_from_slice(&rest[..hl]);
    for i in [6usize, 7, 8 + 4] {
        if i < hl {
            hdr[i] = 0xff;
        }
    }
    h.update(&hdr[..hl]);
    h.update(&rest[hl..]);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The masked packet with its ICRC appended has the CRC-32 residue (REFERENCE §2):
    /// an independent check that compute() hashes what it should.
    #[test]
    fn residue_property_holds() {
        let mut pkt = vec![0x45u8, 0x02, 0, 52, 0, 0, 0x40, 0, 64, 17, 0, 0];
        pkt.extend_from_slice(&[192, 0, 2, 1, 192, 0, 2, 2]);
        pkt.extend_from_slice(&[0xc0, 0x11, 0x12, 0xb7, 0, 32, 0x12, 0x34]);
        pkt.extend_from_slice(&[0x04, 0, 0xff, 0xff, 0xc0, 0, 0, 0x11, 0x80, 0, 0, 1]);
        pkt.extend_from_slice(b"payload!");
        let icrc = compute(false, 20, &pkt);
        let mut masked = vec![0xffu8; 8];
        masked.extend_from_slice(&pkt);
        for i in [1usize, 8, 10, 11, 20 + 6, 20 + 7, 28 + 4] {
            masked[8 + i] = 0xff;
        }
        masked.extend_from_slice(&icrc.to_le_bytes());
        let mut h = crc32fast::Hasher::new();
        h.update(&masked);
        assert_eq!(h.finalize(), RESIDUE);
    }

    #[test]
    fn masked_fields_do_not_change_the_icrc_and_others_do() {
        let mut pkt = vec![0u8; 20 + 8 + 12 + 4];
        pkt[0] = 0x45;
        let base = compute(false, 20, &pkt);
        for i in 0..pkt.len() {
            let mut p = pkt.clone();
            p[i] ^= 0x01;
            let masked = [1usize, 8, 10, 11, 26, 27, 32].contains(&i);
            assert_eq!(compute(false, 20, &p) == base, masked, "byte {i}");
        }
    }

    #[test]
    fn short_input_does_not_panic() {
        for n in 0..30 {
            let _ = compute(n % 2 == 0, 40, &vec![0x60; n]);
        }
    }
}
