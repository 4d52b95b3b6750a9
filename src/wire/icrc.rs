//! The RoCE v2 invariant CRC (IBTA RoCE v2 annex A17.4.1; docs/wire-format.md §3).
//!
//! CRC-32 (IEEE 802.3, as `crc32fast` computes it) over 8 bytes of 0xFF, then the IP
//! header, the UDP header, the BTH, the extended headers, the payload and the pad, with the
//! fields a router or switch may change replaced by ones: IPv4 TOS, TTL and header
//! checksum; IPv6 traffic class, flow label and hop limit; the UDP checksum; BTH byte 4
//! (FECN, BECN, reserved). It goes on the wire least-significant byte first.
//!
//! Nothing is copied: the raw bytes are hashed in place in one `crc32fast` call, and the
//! masking is folded into the CRC's starting value (see [`compute`]). The send path may
//! hash header and payload apart and combine them ([`compute_split`]); a template header
//! without extension headers is not hashed at all, its state is the template's plus one
//! table load per patched byte ([`patch_header_state`]). A separate call over
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
static FIX: [[[u32; 16]; 2]; MAX_MASKED] = fix_table();

const fn fix_table() -> [[[u32; 16]; 2]; MAX_MASKED] {
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
}

/// The masked bytes of the usual IPv4 packet (IHL 5): (offset, bits that become ones).
/// TOS, TTL, header checksum; UDP checksum; BTH byte 4.
const V4_MASKED: [(usize, u8); 7] = [
    (1, 0xff),
    (8, 0xff),
    (10, 0xff),
    (11, 0xff),
    (20 + 6, 0xff),
    (20 + 7, 0xff),
    (28 + 4, 0xff),
];

/// The masked bytes of the IPv6 packet: traffic class and flow label (the version nibble
/// stays), hop limit; UDP checksum; BTH byte 4.
const V6_MASKED: [(usize, u8); 8] = [
    (0, 0x0f),
    (1, 0xff),
    (2, 0xff),
    (3, 0xff),
    (7, 0xff),
    (40 + 6, 0xff),
    (40 + 7, 0xff),
    (48 + 4, 0xff),
];

/// For each masked byte of a fixed layout, the register fix indexed by the byte as it
/// lies (mask and complement included): one load per masked byte, where the nibble
/// tables of [`FIX`] need two and the arithmetic to split the byte. The fix is in front of
/// the CRC chain (see [`compute`]), so its length counts.
const fn byte_fix_tables<const N: usize>(masked: [(usize, u8); N]) -> [[u32; 256]; N] {
    let f = fix_table();
    let mut t = [[0u32; 256]; N];
    let mut k = 0;
    while k < N {
        let (at, mask) = masked[k];
        let mut b = 0;
        while b < 256 {
            let d = !(b as u8) & mask;
            t[k][b] = f[at][0][(d & 0x0f) as usize] ^ f[at][1][(d >> 4) as usize];
            b += 1;
        }
        k += 1;
    }
    t
}

static FIX_V4: [[u32; 256]; 7] = byte_fix_tables(V4_MASKED);
static FIX_V6: [[u32; 256]; 8] = byte_fix_tables(V6_MASKED);

/// Compute the ICRC of `pkt`, which starts at the IP header (IPv4 when `ipv6` is false)
/// whose length is `ip_hdr_len`, and ends just before the ICRC.
///
/// Bytes past the end of a short `pkt` are simply absent from the hash: this never panics,
/// but only a packet that holds its IP, UDP and BTH headers gives a meaningful value.
///
/// How: a CRC is linear. Hashing input `x ^ d` from register `r` gives the same register as
/// hashing `x` from `r ^ F(d)`, where `F(d)` is the register that hashing `d` from zero
/// gives, run back over `len(d)` zero bytes. The masks change only a dozen header bytes,
/// so `F` is a sum of per-byte table entries (`FIX`), and the packet is hashed as it lies.
///
/// The fix sits in front of the whole CRC chain, so it is kept short: for the usual
/// layouts one table load per masked byte (`FIX_V4`, `FIX_V6`) summed as a tree.
/// Adding the fix at the end instead (run forward over the packet by a multiply, as
/// [`compute_split`] does) was measured slower: the multiply's instructions cost more
/// than the loads' latency they would hide (benches/wire.rs; docs/performance.md).
pub fn compute(ipv6: bool, ip_hdr_len: usize, pkt: &[u8]) -> u32 {
    finish(start(ipv6, ip_hdr_len, pkt), pkt)
}

/// The hash state [`compute`] starts `pkt` from (the masks folded in).
#[inline(always)]
pub fn start(ipv6: bool, ip_hdr_len: usize, pkt: &[u8]) -> u32 {
    let ip_len = ip_hdr_len.min(pkt.len()).min(60);
    let fix = match (ipv6, ip_len) {
        // The usual headers, all present: fixed positions, one table load per masked byte,
        // summed as a tree (the sum is in front of the CRC chain).
        (false, 20) if pkt.len() > 28 + 4 => {
            let f = |k: usize| FIX_V4[k][usize::from(pkt[V4_MASKED[k].0])];
            ((f(0) ^ f(1)) ^ (f(2) ^ f(3))) ^ ((f(4) ^ f(5)) ^ f(6))
        }
        (true, 40) if pkt.len() > 48 + 4 => {
            let f = |k: usize| FIX_V6[k][usize::from(pkt[V6_MASKED[k].0])];
            ((f(0) ^ f(1)) ^ (f(2) ^ f(3))) ^ ((f(4) ^ f(5)) ^ (f(6) ^ f(7)))
        }
        _ => fix_any(ipv6, ip_len, pkt),
    };
    SEED ^ fix
}

/// [`compute`] from the state [`start`] gave.
#[inline]
pub fn finish(state: u32, pkt: &[u8]) -> u32 {
    hash_from(state, pkt)
}

/// The ICRC of `header || payload || pad zero bytes` (what [`compute`] gives over those
/// bytes laid end to end), from the two parts separately: `header` starts at the IP header
/// (of length `ip_hdr_len`) and holds every masked byte.
///
/// Why: on the send path the payload is hashed from where it comes from, beside the copy
/// of it into the frame instead of after, and the header (written a moment ago) is hashed
/// on its own. A CRC is linear: hashing `P` from state `s` gives the hash of `P` from
/// state 0 plus `s` run forward over `len(P)` zero bytes, so the header's ICRC state is
/// carried over the payload by a multiply (`mul` by `SHIFT`). Lengths the table does
/// not cover (over 8 KiB) are hashed in one piece from a copy.
pub fn compute_split(
    ipv6: bool,
    ip_hdr_len: usize,
    header: &[u8],
    payload: &[u8],
    pad: usize,
) -> u32 {
    let pad = &[0u8; 3][..pad.min(3)];
    let Some(x) = shift_factor(payload.len() + pad.len()) else {
        let all = [header, payload, pad].concat();
        return compute(ipv6, ip_hdr_len, &all);
    };
    let mut h = crc32fast::Hasher::new_with_initial(start(ipv6, ip_hdr_len, header));
    // A clone reset to state 0, rather than a second `Hasher::new`, which would detect the
    // CPU's features again (some 40 instructions).
    let mut p = h.clone();
    p.reset();
    p.update(payload);
    if !pad.is_empty() {
        p.update(pad);
    }
    h.update(header);
    p.finalize() ^ mul(h.finalize(), x)
}

/// What [`compute_split`] gets from its `header` alone: the hash state after the masked
/// header, before the payload is folded in (`header` as there).
pub fn header_state(ipv6: bool, ip_hdr_len: usize, header: &[u8]) -> u32 {
    hash_from(start(ipv6, ip_hdr_len, header), header)
}

/// The bytes a frame template writes per packet into a header of IP (20-byte IPv4 or
/// IPv6), UDP and BTH with no extension header (src/wire/template.rs): the IP length
/// field, the UDP length, BTH bytes 0, 1 and 8 and the PSN (bytes 9–11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderPatch {
    pub ip_len: u16,
    pub udp_len: u16,
    pub bth0: u8,
    pub bth1: u8,
    pub bth8: u8,
    pub psn: u32,
}

/// Distances from the last header byte of the patched bytes, in [`PATCH`]'s order: PSN
/// (3 bytes), BTH byte 8, BTH byte 1, BTH byte 0, UDP length (2), then the IP length
/// field (2) of IPv4 (total length, header bytes 2–3) and of IPv6 (payload length, 4–5).
const PATCH_DIST: [usize; 12] = [0, 1, 2, 3, 10, 11, 14, 15, 36, 37, 54, 55];

/// `PATCH[k][b]`: how much byte value `b` at distance `PATCH_DIST[k]` from the end of the
/// header moves [`header_state`] against the same header with a zero there. A CRC is
/// linear: the register of `b` hashed alone from zero, run forward over the bytes after it.
static PATCH: [[u32; 256]; 12] = {
    let mut t = [[0u32; 256]; 12];
    let mut b = 0;
    while b < 256 {
        let mut r = byte_from_zero(b as u8);
        let mut d = 0;
        let mut k = 0;
        while k < PATCH_DIST.len() {
            while d < PATCH_DIST[k] {
                let mut i = 0;
                while i < 8 {
                    r = step(r);
                    i += 1;
                }
                d += 1;
            }
            t[k][b] = r;
            k += 1;
        }
        b += 1;
    }
    t
};

/// [`header_state`] of a template header from `base`, the state of the same header with
/// every byte of [`HeaderPatch`] zero: one table load per patched byte, independent of
/// one another and of the bytes just written into the frame, where hashing the header
/// waits for those stores and runs crc32fast's short-input fold and reductions.
#[inline]
pub fn patch_header_state(ipv6: bool, base: u32, p: &HeaderPatch) -> u32 {
    let f = |k: usize, b: u8| PATCH[k][usize::from(b)];
    let [_, p2, p1, p0] = p.psn.to_be_bytes();
    let [u1, u0] = p.udp_len.to_be_bytes();
    let [l1, l0] = p.ip_len.to_be_bytes();
    let ip = if ipv6 { 10 } else { 8 };
    let bth = (f(0, p0) ^ f(1, p1)) ^ (f(2, p2) ^ f(3, p.bth8));
    let rest = (f(4, p.bth1) ^ f(5, p.bth0)) ^ (f(6, u0) ^ f(7, u1));
    base ^ (bth ^ rest) ^ (f(ip, l0) ^ f(ip + 1, l1))
}

/// [`compute_split`] from the header's state ([`header_state`] or [`patch_header_state`]),
/// when the payload and pad are a whole number of words of at most 8 KiB (else `None`).
pub fn compute_from_header_state(state: u32, payload: &[u8], pad: usize) -> Option<u32> {
    compute_from_header_state_ext(state, &[], payload, pad)
}

/// [`compute_from_header_state`] of a packet with extension headers: `ext` (the bytes
/// between the BTH and the payload, whole words) is hashed in front of the payload, so
/// the header's state still comes from the template's (an ACK's AETH, a WRITE's RETH:
/// [`crate::wire::FrameTemplate::emit`]). The CRC is linear: the bytes after the header
/// are one piece whatever they are.
pub fn compute_from_header_state_ext(
    state: u32,
    ext: &[u8],
    payload: &[u8],
    pad: usize,
) -> Option<u32> {
    let pad = &[0u8; 3][..pad.min(3)];
    let x = shift_factor(ext.len() + payload.len() + pad.len())?;
    let mut p = zero_hasher();
    if !ext.is_empty() {
        p.update(ext);
    }
    p.update(payload);
    if !pad.is_empty() {
        p.update(pad);
    }
    Some(p.finalize() ^ mul(state, x))
}

/// A hasher at state 0. A clone of one made once: `Hasher::new` detects the CPU's
/// features at every call (some 40 instructions, twice per message sent).
#[inline]
fn zero_hasher() -> crc32fast::Hasher {
    static ZERO: std::sync::LazyLock<crc32fast::Hasher> =
        std::sync::LazyLock::new(crc32fast::Hasher::new);
    ZERO.clone()
}

fn hash_from(state: u32, pkt: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(state);
    h.update(pkt);
    h.finalize()
}

/// Lengths (in 4-byte words) that [`SHIFT`] covers: every packet up to 8 KiB, so all of
/// RoCE's path MTUs (at most 4096 bytes of payload) and their headers.
const SHIFT_WORDS: usize = 2048;

/// `SHIFT[k]` = x^(32·k) mod P, reflected like the CRC register (x^0 is bit 31): the
/// factor that runs a register forward over `4·k` zero bytes. Every valid RoCE packet is
/// a whole number of words from the IP header to the ICRC (headers are, payload + pad
/// is), so words suffice; other lengths take the start-fix path.
static SHIFT: [u32; SHIFT_WORDS] = {
    let mut t = [0u32; SHIFT_WORDS];
    let mut r = 0x8000_0000u32; // x^0
    let mut k = 0;
    while k < SHIFT_WORDS {
        t[k] = r;
        let mut i = 0;
        while i < 32 {
            r = step(r);
            i += 1;
        }
        k += 1;
    }
    t
};

/// The factor that runs a register forward over `n` zero bytes, when [`SHIFT`] has it.
#[inline(always)]
fn shift_factor(n: usize) -> Option<u32> {
    if n % 4 == 0 {
        SHIFT.get(n / 4).copied()
    } else {
        None
    }
}

/// `X32[k][v]`: the register `v << 8k` run forward over 4 zero bytes (times x^32 mod P).
/// Reduces the low half of a product in [`mul`] with four independent loads.
static X32: [[u32; 256]; 4] = {
    let mut t = [[0u32; 256]; 4];
    let mut k = 0;
    while k < 4 {
        let mut v = 0;
        while v < 256 {
            let mut r = (v as u32) << (8 * k);
            let mut i = 0;
            while i < 32 {
                r = step(r);
                i += 1;
            }
            t[k][v] = r;
            v += 1;
        }
        k += 1;
    }
    t
};

/// Carry-less product of two 32-bit values, with ordinary integer multiplies: each
/// operand is split into four sets of bits four apart, so that in each partial product
/// the count summed at a bit position (at most 8) never carries into the next position of
/// the same set, whose low bits then hold the carry-less sums. No `std::arch` (unsafe is
/// kept to src/io/afxdp), and no data-dependent branch or load.
#[inline(always)]
fn clmul32(x: u32, y: u32) -> u64 {
    const M: [u64; 4] = [0x1111_1111, 0x2222_2222, 0x4444_4444, 0x8888_8888];
    let (x, y) = (u64::from(x), u64::from(y));
    let [x0, x1, x2, x3] = M.map(|m| x & m);
    let [y0, y1, y2, y3] = M.map(|m| y & m);
    let z0 = (x0 * y0) ^ (x1 * y3) ^ (x2 * y2) ^ (x3 * y1);
    let z1 = (x0 * y1) ^ (x1 * y0) ^ (x2 * y3) ^ (x3 * y2);
    let z2 = (x0 * y2) ^ (x1 * y1) ^ (x2 * y0) ^ (x3 * y3);
    let z3 = (x0 * y3) ^ (x1 * y2) ^ (x2 * y1) ^ (x3 * y0);
    (z0 & 0x1111_1111_1111_1111)
        | (z1 & 0x2222_2222_2222_2222)
        | (z2 & 0x4444_4444_4444_4444)
        | (z3 & 0x8888_8888_8888_8888)
}

/// `a · b mod P` for registers in the CRC's reflected order (bit 31 is x^0, bit 0 is
/// x^31). Bit `m` of the integer carry-less product is x^(62-m); shifted up by one, the
/// high word is the product's x^0..x^31 part in register order and the low word the
/// x^32..x^63 part, i.e. a register times x^32, which [`X32`] reduces.
#[inline(always)]
fn mul(a: u32, b: u32) -> u32 {
    let p = clmul32(a, b) << 1;
    let (hi, lo) = ((p >> 32) as u32, p as u32);
    let lo = lo.to_le_bytes().map(usize::from);
    hi ^ X32[0][lo[0]] ^ X32[1][lo[1]] ^ X32[2][lo[2]] ^ X32[3][lo[3]]
}

/// The register change for flipping bits `d` of input byte `at` (`at < MAX_MASKED`).
#[inline(always)]
fn fix(at: usize, d: u8) -> u32 {
    let t = &FIX[at];
    t[0][usize::from(d & 0x0f)] ^ t[1][usize::from(d >> 4)]
}

/// [`compute`]'s fix for any IP header length and any (short) input.
fn fix_any(ipv6: bool, ip_len: usize, pkt: &[u8]) -> u32 {
    // The IP header's masked bytes: those of the usual layouts that lie in the IP header
    // (the first five of IPv6's, four of IPv4's; IPv4 options hold none).
    let ip: &[(usize, u8)] = if ipv6 {
        &V6_MASKED[..5]
    } else {
        &V4_MASKED[..4]
    };
    let ip = ip.iter().copied().filter(|&(i, _)| i < ip_len);
    // UDP checksum (bytes 6-7) and BTH byte 4, after the IP header.
    let udp_bth = [6, 7, 8 + 4].map(|i| (ip_len + i, 0xff));
    ip.chain(udp_bth)
        .filter_map(|(i, m)| pkt.get(i).map(|b| fix(i, !b & m)))
        .fold(0, |a, f| a ^ f)
}

/// The masked bytes of a packet that starts with a GRH (RoCE v1): traffic class and flow
/// label (the version nibble stays), hop limit, and BTH byte 4 right after the 40-byte GRH
/// (IBTA vol. 1 §7.8.1).
const GRH_MASKED: [(usize, u8); 6] = [
    (0, 0x0f),
    (1, 0xff),
    (2, 0xff),
    (3, 0xff),
    (7, 0xff),
    (40 + 4, 0xff),
];

/// The ICRC of a packet that starts at a GRH and ends just before the ICRC (a RoCE v1
/// packet, `crate::wire::V1View`): the same 8 bytes of ones in front (the LRH, which an IB
/// packet with a GRH counts as all ones, IBTA vol. 1 §7.8.1), the GRH's variant fields and
/// BTH byte 4 masked, no UDP header. Decode only, so plainly: one fix per masked byte, then
/// one hash. Bytes missing from a short `pkt` are not hashed; this never panics.
pub fn compute_grh(pkt: &[u8]) -> u32 {
    let fix = GRH_MASKED
        .iter()
        .filter_map(|&(i, m)| pkt.get(i).map(|b| fix(i, !b & m)))
        .fold(0, |a, f| a ^ f);
    hash_from(SEED ^ fix, pkt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The ICRC as annex A17.4.1 states it: a masked copy of the whole input, hashed after
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
    fn grh_icrc_is_a_masked_copy_hashed_after_eight_ff_bytes() {
        let mut pkt: Vec<u8> = (0..96u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        for len in [0usize, 3, 8, 44, 45, 52, 96] {
            let p = &pkt[..len];
            let mut m = vec![0xffu8; 8];
            m.extend_from_slice(p);
            for &(i, mask) in &GRH_MASKED {
                if i < len {
                    m[8 + i] |= mask;
                }
            }
            assert_eq!(compute_grh(p), crc32fast::hash(&m), "len {len}");
        }
        // A GRH is laid out like an IPv6 header: with no UDP header, the masks are IPv6's.
        pkt[6] = 0x1b;
        assert_eq!(GRH_MASKED[..5], V6_MASKED[..5]);
    }

    /// `a · b mod P`, one bit at a time (the register-order definition [`mul`] must meet).
    fn mul_by_bits(a: u32, mut b: u32) -> u32 {
        let mut p = 0;
        for i in 0..32 {
            if (a >> (31 - i)) & 1 != 0 {
                p ^= b;
            }
            b = step(b);
        }
        p
    }

    /// A register run forward over `n` zero bytes, bit by bit.
    fn forward(mut r: u32, n: usize) -> u32 {
        for _ in 0..8 * n {
            r = step(r);
        }
        r
    }

    #[test]
    fn shift_table_runs_registers_forward() {
        for k in [0usize, 1, 2, 3, 17, 271, SHIFT_WORDS - 1] {
            for r in [1u32, 0x8000_0000, 0xdead_beef, 0xffff_ffff] {
                assert_eq!(mul(r, SHIFT[k]), forward(r, 4 * k), "k {k} r {r:#x}");
            }
        }
        assert_eq!(shift_factor(4 * SHIFT_WORDS), None);
        assert_eq!(shift_factor(6), None);
    }

    #[test]
    fn seed_is_the_crc_of_eight_ff_bytes() {
        assert_eq!(SEED, crc32fast::hash(&[0xff; 8]));
        // rxe's seed (rxe_icrc.c) is the same state as a raw register.
        assert_eq!(!SEED, 0xdebb_20e3);
    }

    proptest! {
        /// The in-place computation equals hashing a masked copy, for any bytes, any IP
        /// header length (IPv4 options up to the 60-byte limit and beyond) and any input
        /// length, short ones included.
        /// The integer-multiply carry-less product equals the bit-by-bit one.
        #[test]
        fn mul_equals_bitwise_multiply(a in any::<u32>(), b in any::<u32>()) {
            prop_assert_eq!(mul(a, b), mul_by_bits(a, b));
        }

        /// The end-applied fix equals hashing a masked copy for the usual layouts and
        /// every length the shift table covers (and past it, where the start fix is used).
        #[test]
        fn end_fix_equals_masked_copy(
            ipv6 in any::<bool>(),
            words in 11usize..2100,
            extra in 0usize..4,
            seed in any::<u64>(),
        ) {
            let n = 4 * words + extra;
            let mut pkt: Vec<u8> = (0..n)
                .map(|i| (seed.rotate_left(i as u32 % 64) as u8) ^ (i as u8).wrapping_mul(31))
                .collect();
            pkt[0] = if ipv6 { 0x60 } else { 0x45 };
            let hl = if ipv6 { 40 } else { 20 };
            prop_assert_eq!(compute(ipv6, hl, &pkt), reference(ipv6, hl, &pkt));
        }

        /// Header and payload hashed apart and combined equal the ICRC of the whole.
        #[test]
        fn split_equals_whole(
            ipv6 in any::<bool>(),
            hdr_words in 0usize..30,
            payload in proptest::collection::vec(any::<u8>(), 0..600),
            pad in 0usize..4,
            big in any::<bool>(),
        ) {
            let hl = if ipv6 { 40 } else { 20 };
            // IP, UDP and BTH (every masked byte) and extended headers.
            let mut header: Vec<u8> = (0..hl + 20 + 4 * hdr_words).map(|i| i as u8 ^ 0x5a).collect();
            header[0] = if ipv6 { 0x60 } else { 0x45 };
            // Past the shift table: the one-piece fallback.
            let payload = if big { payload.repeat(20) } else { payload };
            let whole = [&header[..], &payload, &vec![0u8; pad]].concat();
            prop_assert_eq!(
                compute_split(ipv6, hl, &header, &payload, pad),
                reference(ipv6, hl, &whole)
            );
        }

        /// A template header's state from its zeroed form and the patched bytes equals
        /// the state of the header hashed whole, and the ICRC from it that of the frame.
        #[test]
        fn patched_header_equals_hashed(
            ipv6 in any::<bool>(),
            fixed in proptest::collection::vec(any::<u8>(), 60),
            ip_len in any::<u16>(),
            udp_len in any::<u16>(),
            bth in any::<[u8; 3]>(),
            psn in 0u32..1 << 24,
            payload in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let hl = if ipv6 { 40 } else { 20 };
            let pad = (4 - payload.len() % 4) % 4;
            let mut header = fixed[..hl + 20].to_vec();
            header[0] = if ipv6 { 0x60 } else { 0x45 };
            let mut zeroed = header.clone();
            let ip_at = if ipv6 { 4 } else { 2 };
            let b = hl + 8;
            let patched = [
                (ip_at, (ip_len >> 8) as u8),
                (ip_at + 1, ip_len as u8),
                (hl + 4, (udp_len >> 8) as u8),
                (hl + 5, udp_len as u8),
                (b, bth[0]),
                (b + 1, bth[1]),
                (b + 8, bth[2]),
                (b + 9, (psn >> 16) as u8),
                (b + 10, (psn >> 8) as u8),
                (b + 11, psn as u8),
            ];
            for (at, v) in patched {
                header[at] = v;
                zeroed[at] = 0;
            }
            let p = HeaderPatch { ip_len, udp_len, bth0: bth[0], bth1: bth[1], bth8: bth[2], psn };
            let state = patch_header_state(ipv6, header_state(ipv6, hl, &zeroed), &p);
            prop_assert_eq!(state, header_state(ipv6, hl, &header));
            let whole = [&header[..], &payload, &vec![0u8; pad]].concat();
            prop_assert_eq!(
                compute_from_header_state(state, &payload, pad),
                Some(reference(ipv6, hl, &whole))
            );
        }

        #[test]
        fn in_place_equals_masked_copy(
            ipv6 in any::<bool>(),
            ip_hdr_len in 0usize..80,
            pkt in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            prop_assert_eq!(compute(ipv6, ip_hdr_len, &pkt), reference(ipv6, ip_hdr_len, &pkt));
        }
    }

    /// The masked packet with its ICRC appended has the CRC-32 residue 0x2144DF1C:
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

    /// A packet shorter than its headers: no panic, and the ICRC of the bytes that are
    /// there, masked where they are masked (the annex's definition, [`reference`]).
    #[test]
    fn short_input_hashes_the_bytes_present() {
        for n in 0..70 {
            let pkt: Vec<u8> = (0..n).map(|i| 0x60 ^ (i as u8).wrapping_mul(37)).collect();
            for (ipv6, ip_hdr_len) in [(false, 20), (true, 40), (false, 60), (true, 0)] {
                assert_eq!(
                    compute(ipv6, ip_hdr_len, &pkt),
                    reference(ipv6, ip_hdr_len, &pkt),
                    "{n} bytes, ipv6 {ipv6}, IP header {ip_hdr_len}"
                );
            }
        }
    }
}
