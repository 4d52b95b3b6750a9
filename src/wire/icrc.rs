//! The RoCE v2 invariant CRC (IBTA RoCE v2 annex A17.4.1, REFERENCE §2).
//!
//! CRC-32 (IEEE 802.3, as `crc32fast` computes it) over 8 bytes of 0xFF, then the IP
//! header, the UDP header, the BTH, the extended headers, the payload and the pad, with the
//! fields a router or switch may change replaced by ones: IPv4 TOS, TTL and header
//! checksum; IPv6 traffic class, flow label and hop limit; the UDP checksum; BTH byte 4
//! (FECN, BECN, reserved). It goes on the wire least-significant byte first.
//!
//! Nothing is copied: the raw bytes are hashed in place in one `crc32fast` call, and the
//! masking is folded into the CRC's starting value (see [`compute`]). A separate call over
//! a masked copy of the headers would end in its own CRC reduction, which with crc32fast's
//! carry-less-multiply kernels costs about half as much as hashing the 1 KiB that follow
//! (benches/wire.rs).

/// Length of the ICRC trailer.
pub const LEN: usize = 4;

/// The CRC-32 residue of a correct masked packet including its ICRC.
pub const RESIDUE: u32 = 0x2144_df1c;

/// The reflected CRC-32 polynomial (IEEE 802.3).
const POLY: u32 = 0xedb8_8320;

/// One bit of CRC register update with a zero input bit.
const fn step(r: u32) -> u32 {
    if r & 1 != 0 { (r >> 1) ^ POLY } else { r >> 1 }
}

/// The inverse of [`step`]: POLY has bit 31 set and `r >> 1` has it clear, so bit 31 of
/// the result tells whether the bit shifted out was a one.
const fn unstep(r: u32) -> u32 {
    if r & 0x8000_0000 != 0 {
        ((r ^ POLY) << 1) | 1
    } else {
        r << 1
    }
}

/// The CRC register after hashing the single byte `b` from a zero register.
const fn byte_from_zero(b: u8) -> u32 {
    let mut r = b as u32;
    let mut i = 0;
    while i < 8 {
        r = step(r);
        i += 1;
    }
    r
}

/// crc32fast's value for the 8 0xFF bytes that start the ICRC input (the value a `Hasher`
/// holds after them: the complement of the register rxe seeds with, 0xDEBB20E3).
const SEED: u32 = {
    let mut r = 0xffff_ffffu32;
    let mut i = 0;
    while i < 8 {
        r ^= 0xff;
        let mut j = 0;
        while j < 8 {
            r = step(r);
            j += 1;
        }
        i += 1;
    }
    !r
};

/// Masked bytes lie in the IP header (at most 60 bytes), UDP header and BTH byte 4.
const MAX_MASKED: usize = 60 + 8 + 4 + 1;

/// `FIX[p][h][n]`: how much flipping the bits `n << 4h` of byte `p` of the hashed input
/// changes the register the hash must start from to give the same result (see [`compute`]):
/// the register of that byte hashed alone, run back `p + 1` zero bytes.
static FIX: [[[u32; 16]; 2]; MAX_MASKED] = {
    let mut t = [[[0u32; 16]; 2]; MAX_MASKED];
    let mut h = 0;
    while h < 2 {
        let mut n = 0;
        while n < 16 {
            let mut r = byte_from_zero((n << (4 * h)) as u8);
            let mut p = 0;
            while p < MAX_MASKED {
                let mut i = 0;
                while i < 8 {
                    r = unstep(r);
                    i += 1;
                }
                t[p][h][n] = r;
                p += 1;
            }
            n += 1;
        }
        h += 1;
    }
    t
};

/// Compute the ICRC of `pkt`, which starts at the IP header (IPv4 when `ipv6` is false)
/// whose length is `ip_hdr_len`, and ends just before the ICRC.
///
/// Bytes past the end of a short `pkt` are simply absent from the hash: this never panics,
/// but only a packet that holds its IP, UDP and BTH headers gives a meaningful value.
///
/// How: a CRC is linear. Hashing input `x ^ d` from register `r` gives the same register as
/// hashing `x` from `r ^ F(d)`, where `F(d)` is the register that hashing `d` from zero
/// gives, run back over `len(d)` zero bytes. The masks change only a dozen header bytes,
/// so `F` is a sum of per-byte table entries ([`FIX`]), and the packet is hashed as it lies.
pub fn compute(ipv6: bool, ip_hdr_len: usize, pkt: &[u8]) -> u32 {
    let ip_len = ip_hdr_len.min(pkt.len()).min(60);
    let fix = match (ipv6, ip_len) {
        // The usual headers, all present: fixed positions, no bounds to check per byte.
        (false, 20) if pkt.len() > 20 + 12 => {
            let b = |i: usize| !pkt[i];
            // TOS, TTL, header checksum; UDP checksum; BTH byte 4.
            fix(1, b(1))
                ^ fix(8, b(8))
                ^ fix(10, b(10))
                ^ fix(11, b(11))
                ^ fix(26, b(26))
                ^ fix(27, b(27))
                ^ fix(32, b(32))
        }
        (true, 40) if pkt.len() > 40 + 12 => {
            let b = |i: usize| !pkt[i];
            // Traffic class and flow label (the version nibble stays), hop limit; UDP
            // checksum; BTH byte 4.
            fix(0, b(0) & 0x0f)
                ^ fix(1, b(1))
                ^ fix(2, b(2))
                ^ fix(3, b(3))
                ^ fix(7, b(7))
                ^ fix(46, b(46))
                ^ fix(47, b(47))
                ^ fix(52, b(52))
        }
        _ => fix_any(ipv6, ip_len, pkt),
    };
    let mut h = crc32fast::Hasher::new_with_initial(SEED ^ fix);
    h.update(pkt);
    h.finalize()
}

/// The register change for flipping bits `d` of input byte `at` (`at < MAX_MASKED`).
#[inline(always)]
fn fix(at: usize, d: u8) -> u32 {
    let t = &FIX[at];
    t[0][usize::from(d & 0x0f)] ^ t[1][usize::from(d >> 4)]
}

/// [`compute`]'s fix for any IP header length and any (short) input.
fn fix_any(ipv6: bool, ip_len: usize, pkt: &[u8]) -> u32 {
    // Masked bytes: (offset, bits that become ones). Offsets are < MAX_MASKED.
    let ip: &[(usize, u8)] = if ipv6 {
        &[(0, 0x0f), (1, 0xff), (2, 0xff), (3, 0xff), (7, 0xff)]
    } else {
        &[(1, 0xff), (8, 0xff), (10, 0xff), (11, 0xff)]
    };
    let ip = ip.iter().copied().filter(|&(i, _)| i < ip_len);
    // UDP checksum (bytes 6-7) and BTH byte 4, after the IP header.
    let udp_bth = [6, 7, 8 + 4].map(|i| (ip_len + i, 0xff));
    ip.chain(udp_bth)
        .filter_map(|(i, m)| pkt.get(i).map(|b| fix(i, !b & m)))
        .fold(0, |a, f| a ^ f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The ICRC as REFERENCE §2 states it: a masked copy of the whole input, hashed after
    /// 8 0xFF bytes. The oracle for [`compute`]'s in-place shortcut.
    fn reference(ipv6: bool, ip_hdr_len: usize, pkt: &[u8]) -> u32 {
        let mut m = vec![0xffu8; 8];
        m.extend_from_slice(pkt);
        let ip_len = ip_hdr_len.min(pkt.len()).min(60);
        let ip_masks: &[(usize, u8)] = if ipv6 {
            &[(0, 0x0f), (1, 0xff), (2, 0xff), (3, 0xff), (7, 0xff)]
        } else {
            &[(1, 0xff), (8, 0xff), (10, 0xff), (11, 0xff)]
        };
        for &(i, mask) in ip_masks {
            if i < ip_len {
                m[8 + i] |= mask;
            }
        }
        for i in [ip_len + 6, ip_len + 7, ip_len + 12] {
            if i < pkt.len() {
                m[8 + i] = 0xff;
            }
        }
        crc32fast::hash(&m)
    }

    #[test]
    fn seed_is_the_crc_of_eight_ff_bytes() {
        assert_eq!(SEED, crc32fast::hash(&[0xff; 8]));
        // rxe's seed is the same state as a raw register (REFERENCE §2).
        assert_eq!(!SEED, 0xdebb_20e3);
    }

    proptest! {
        /// The in-place computation equals hashing a masked copy, for any bytes, any IP
        /// header length (IPv4 options up to the 60-byte limit and beyond) and any input
        /// length, short ones included.
        #[test]
        fn in_place_equals_masked_copy(
            ipv6 in any::<bool>(),
            ip_hdr_len in 0usize..80,
            pkt in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            prop_assert_eq!(compute(ipv6, ip_hdr_len, &pkt), reference(ipv6, ip_hdr_len, &pkt));
        }
    }

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
