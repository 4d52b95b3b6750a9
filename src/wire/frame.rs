//! Whole RoCE v2 frames: `Ethernet [802.1Q] | IPv4 or IPv6 | UDP(4791) | BTH | ext headers |
//! payload | pad | ICRC`.
//!
//! [`FrameView::parse`] checks a received frame once and records where everything is;
//! [`FrameRepr`] is the same frame as plain values, and [`FrameRepr::emit`] writes one
//! (lengths, IPv4 checksum, PadCnt and ICRC are computed, never taken from the Repr).
//! Ethernet, VLAN, IP and UDP headers are read with `etherparse`'s slices, except that the
//! usual frame's link and IP layers are first tried by a fixed-offset fast path that
//! accepts only what the etherparse path accepts, with the same result (`fast_ip`; any
//! error comes from the etherparse path). The IP headers are written (and the IPv4
//! checksum computed) field by field, since building `etherparse`'s header structs costs
//! more than the ICRC's fixed overhead on the hot path (benches/wire.rs).

use etherparse::{
    EtherType, Ethernet2HeaderSlice, IpNumber, Ipv4Header, Ipv4HeaderSlice, Ipv6Header,
    Ipv6HeaderSlice, SingleVlanHeaderSlice, UdpHeaderSlice,
};

use super::ext::{AethRepr, AtomicAckEthRepr, AtomicEthRepr, DethRepr, FethRepr, RethRepr};
use super::{Bth, BthRepr, Error, Ext, Layer, NotRoce, OpInfo, Rkey, icrc};

/// The IANA UDP port of RoCE v2.
pub const ROCE_V2_PORT: u16 = 4791;

const ETH_LEN: usize = 14;
const VLAN_LEN: usize = 4;
const UDP_LEN: usize = 8;
const BTH_LEN: usize = 12;
const IPV4_LEN: usize = Ipv4Header::MIN_LEN;
const IPV6_LEN: usize = Ipv6Header::LEN;

/// Ethernet addressing and the optional single 802.1Q tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EthRepr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    /// The 802.1Q TCI (PCP 3 bits, DEI 1 bit, VID 12 bits), when tagged.
    pub vlan_tci: Option<u16>,
}

/// The IP header fields that are not derived from the rest of the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpRepr {
    V4 {
        src: [u8; 4],
        dst: [u8; 4],
        /// DSCP (6 bits) and ECN (2 bits).
        tos: u8,
        identification: u16,
        dont_fragment: bool,
        ttl: u8,
    },
    V6 {
        src: [u8; 16],
        dst: [u8; 16],
        /// DSCP (6 bits) and ECN (2 bits).
        traffic_class: u8,
        flow_label: u32,
        hop_limit: u8,
    },
}

impl IpRepr {
    /// The 2-bit ECN field (0 Not-ECT, 1 ECT(1), 2 ECT(0), 3 CE).
    pub fn ecn(&self) -> u8 {
        match self {
            IpRepr::V4 { tos, .. } => tos & 3,
            IpRepr::V6 { traffic_class, .. } => traffic_class & 3,
        }
    }

    /// 4 or 6.
    pub fn version(&self) -> u8 {
        match self {
            IpRepr::V4 { .. } => 4,
            IpRepr::V6 { .. } => 6,
        }
    }

    fn header_len(&self) -> usize {
        match self {
            IpRepr::V4 { .. } => IPV4_LEN,
            IpRepr::V6 { .. } => IPV6_LEN,
        }
    }
}

/// UDP ports and checksum. RoCE v2 senders may leave the checksum 0 (rxe does); it is not
/// verified on receive, since the ICRC covers the datagram (docs/wire-format.md §5). The value is
/// kept so that a parsed frame re-emits byte for byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpRepr {
    pub src_port: u16,
    pub checksum: u16,
}

/// The extended headers of a packet; exactly those the opcode table lists are `Some`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ExtHeaders {
    pub deth: Option<DethRepr>,
    pub feth: Option<FethRepr>,
    pub reth: Option<RethRepr>,
    pub atomic: Option<AtomicEthRepr>,
    pub immdt: Option<u32>,
    pub ieth: Option<Rkey>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack: Option<AtomicAckEthRepr>,
}

impl ExtHeaders {
    /// No extended header (`Default`, usable in a `const` or `static`).
    pub const NONE: ExtHeaders = ExtHeaders {
        deth: None,
        feth: None,
        reth: None,
        atomic: None,
        immdt: None,
        ieth: None,
        aeth: None,
        atomic_ack: None,
    };

    /// The headers present, as `ExtSet` bits (CnpPad, which carries nothing, is left out).
    pub(super) fn present_bits(&self) -> u16 {
        let b = |present: bool, e: Ext| if present { e.bit() } else { 0 };
        b(self.deth.is_some(), Ext::Deth)
            | b(self.feth.is_some(), Ext::Feth)
            | b(self.reth.is_some(), Ext::Reth)
            | b(self.atomic.is_some(), Ext::AtomicEth)
            | b(self.immdt.is_some(), Ext::ImmDt)
            | b(self.ieth.is_some(), Ext::Ieth)
            | b(self.aeth.is_some(), Ext::Aeth)
            | b(self.atomic_ack.is_some(), Ext::AtomicAckEth)
    }

    /// Is header `e` present?
    pub fn has(&self, e: Ext) -> bool {
        match e {
            Ext::Deth => self.deth.is_some(),
            Ext::Feth => self.feth.is_some(),
            Ext::Reth => self.reth.is_some(),
            Ext::AtomicEth => self.atomic.is_some(),
            Ext::ImmDt => self.immdt.is_some(),
            Ext::Ieth => self.ieth.is_some(),
            Ext::Aeth => self.aeth.is_some(),
            Ext::AtomicAckEth => self.atomic_ack.is_some(),
            // The CNP's reserved bytes carry nothing: always "present" when asked for.
            Ext::CnpPad => true,
        }
    }

    pub(super) fn parse_one(&mut self, e: Ext, b: &[u8]) {
        match e {
            Ext::Deth => self.deth = Some(DethRepr::parse(b)),
            Ext::Feth => self.feth = Some(FethRepr::parse(b)),
            Ext::Reth => self.reth = Some(RethRepr::parse(b)),
            Ext::AtomicEth => self.atomic = Some(AtomicEthRepr::parse(b)),
            Ext::ImmDt => self.immdt = Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            Ext::Ieth => self.ieth = Some(Rkey(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))),
            Ext::Aeth => self.aeth = Some(AethRepr::parse(b)),
            Ext::AtomicAckEth => self.atomic_ack = Some(AtomicAckEthRepr::parse(b)),
            Ext::CnpPad => {}
        }
    }
}

/// The InfiniBand transport part of a packet: BTH, extended headers, payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoceRepr<'a> {
    /// The BTH. On emit, `pad_count` is computed from the payload length.
    pub bth: BthRepr,
    pub ext: ExtHeaders,
    pub payload: &'a [u8],
}

impl RoceRepr<'_> {
    /// Pad bytes that make the payload a multiple of 4.
    pub fn pad(&self) -> usize {
        (4 - self.payload.len() % 4) % 4
    }

    /// BTH + extended headers + payload + pad + ICRC.
    pub fn wire_len(&self) -> usize {
        let ext = self.bth.opcode.info().map_or(0, |i| i.ext_len());
        BTH_LEN + ext + self.payload.len() + self.pad() + icrc::LEN
    }

    /// Check that the headers present are exactly those the opcode needs.
    #[inline]
    pub fn check(&self) -> Result<&'static OpInfo, Error> {
        // One comparison on the send path; `check_slow` only names the culprit.
        if let Some(info) = self.bth.opcode.info() {
            let want = info.exts.bits() & !Ext::CnpPad.bit();
            if self.ext.present_bits() == want && (info.has_payload || self.payload.is_empty()) {
                return Ok(info);
            }
        }
        self.check_slow()
    }

    #[cold]
    fn check_slow(&self) -> Result<&'static OpInfo, Error> {
        let op = self.bth.opcode;
        let info = op.info().ok_or(Error::UnknownOpcode {
            offset: 0,
            opcode: op.0,
        })?;
        for e in Ext::ORDER {
            if e == Ext::CnpPad {
                continue;
            }
            let want = info.exts.has(e);
            if self.ext.has(e) != want {
                return Err(Error::HeaderMismatch {
                    opcode: op.0,
                    layer: ext_layer(e),
                    present: !want,
                });
            }
        }
        if !info.has_payload && !self.payload.is_empty() {
            return Err(Error::UnexpectedPayload {
                offset: 0,
                opcode: op.0,
                len: self.payload.len(),
            });
        }
        Ok(info)
    }
}

pub(super) fn ext_layer(e: Ext) -> Layer {
    match e {
        Ext::Deth => Layer::Deth,
        Ext::Feth => Layer::Feth,
        Ext::Reth => Layer::Reth,
        Ext::AtomicEth => Layer::AtomicEth,
        Ext::ImmDt => Layer::ImmDt,
        Ext::Ieth => Layer::Ieth,
        Ext::Aeth => Layer::Aeth,
        Ext::AtomicAckEth => Layer::AtomicAckEth,
        Ext::CnpPad => Layer::CnpPad,
    }
}

/// A whole RoCE v2 frame as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRepr<'a> {
    pub eth: EthRepr,
    pub ip: IpRepr,
    pub udp: UdpRepr,
    pub roce: RoceRepr<'a>,
}

impl<'a> FrameRepr<'a> {
    /// Parse a received frame and verify its ICRC.
    pub fn parse(frame: &'a [u8]) -> Result<Self, Error> {
        let v = FrameView::parse(frame)?;
        v.verify_icrc()?;
        Ok(v.repr())
    }

    /// Bytes [`FrameRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        ETH_LEN
            + if self.eth.vlan_tci.is_some() {
                VLAN_LEN
            } else {
                0
            }
            + self.ip.header_len()
            + UDP_LEN
            + self.roce.wire_len()
    }

    /// Write the frame into the front of `out`, computing lengths, the IPv4 header
    /// checksum, PadCnt and the ICRC. Returns the number of bytes written.
    ///
    /// Its pieces are `#[inline(always)]`: each has this one caller on the send hot path,
    /// and inlined they compile to the straight-line code the bench measures
    /// (benches/wire.rs `build_generate`).
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, Error> {
        let info = self.roce.check()?;
        // Lengths from the row `check` found, once (buffer_len would look it up again).
        let pad = self.roce.pad();
        let roce_len = BTH_LEN + info.ext_len() + self.roce.payload.len() + pad + icrc::LEN;
        let vlan_len = if self.eth.vlan_tci.is_some() {
            VLAN_LEN
        } else {
            0
        };
        let total = ETH_LEN + vlan_len + self.ip.header_len() + UDP_LEN + roce_len;
        if out.len() < total {
            return Err(Error::BufferTooSmall {
                needed: total,
                available: out.len(),
            });
        }
        let out = &mut out[..total];
        let ip_off = self.emit_eth(out);
        let ip_payload = UDP_LEN + roce_len;
        let ip_hdr_len = self.emit_ip(&mut out[ip_off..], ip_payload, total)?;
        let udp_off = ip_off + ip_hdr_len;
        self.emit_udp(&mut out[udp_off..udp_off + UDP_LEN], ip_payload);
        let bth_off = udp_off + UDP_LEN;
        let hdr_end = bth_off + self.emit_transport_headers(&mut out[bth_off..], info, pad);
        let off = self.emit_payload_and_pad(out, hdr_end, pad);
        // The payload hashed from its source, not from the frame just written: the CRC
        // does not wait for the copy, and the two run side by side (icrc::compute_split).
        let crc = icrc::compute_split(
            matches!(self.ip, IpRepr::V6 { .. }),
            ip_hdr_len,
            &out[ip_off..hdr_end],
            self.roce.payload,
            pad,
        );
        out[off..off + icrc::LEN].copy_from_slice(&crc.to_le_bytes());
        Ok(off + icrc::LEN)
    }

    /// The Ethernet header, with the 802.1Q tag when there is one; returns its length
    /// (where the IP header starts).
    #[inline(always)]
    fn emit_eth(&self, out: &mut [u8]) -> usize {
        let mut off = 0;
        let ether_type = match self.ip {
            IpRepr::V4 { .. } => EtherType::IPV4,
            IpRepr::V6 { .. } => EtherType::IPV6,
        };
        out[0..6].copy_from_slice(&self.eth.dst);
        out[6..12].copy_from_slice(&self.eth.src);
        off += 12;
        if let Some(tci) = self.eth.vlan_tci {
            out[off..off + 2].copy_from_slice(&EtherType::VLAN_TAGGED_FRAME.0.to_be_bytes());
            out[off + 2..off + 4].copy_from_slice(&tci.to_be_bytes());
            off += 4;
        }
        out[off..off + 2].copy_from_slice(&ether_type.0.to_be_bytes());
        off + 2
    }

    /// The IPv4 or IPv6 header at the front of `out`, for `ip_payload` bytes after it
    /// (`total`, the frame's length, only for the error); returns its length.
    #[inline(always)]
    fn emit_ip(&self, out: &mut [u8], ip_payload: usize, total: usize) -> Result<usize, Error> {
        match self.ip {
            IpRepr::V4 {
                src,
                dst,
                tos,
                identification,
                dont_fragment,
                ttl,
            } => {
                let total_len = u16::try_from(IPV4_LEN + ip_payload)
                    .map_err(|_| Error::TooLong { len: total })?;
                // Written field by field rather than through etherparse's `Ipv4Header`: on
                // the send hot path the struct (with its options array) costs more than the
                // ICRC's fixed overhead (benches/wire.rs).
                let flags = u16::from(dont_fragment) << 14; // DF; MF never, offset 0
                let h = &mut out[..IPV4_LEN];
                h[0] = 0x45; // version 4, IHL 5: we send no options
                h[1] = tos;
                h[2..4].copy_from_slice(&total_len.to_be_bytes());
                h[4..6].copy_from_slice(&identification.to_be_bytes());
                h[6..8].copy_from_slice(&flags.to_be_bytes());
                h[8] = ttl;
                h[9] = IpNumber::UDP.0;
                h[12..16].copy_from_slice(&src);
                h[16..20].copy_from_slice(&dst);
                // From the values, not by reading back the bytes just stored (a stall).
                let be = |b: [u8; 2]| u16::from_be_bytes(b);
                let checksum = ones_complement(&[
                    be([0x45, tos]),
                    total_len,
                    identification,
                    flags,
                    be([ttl, IpNumber::UDP.0]),
                    be([src[0], src[1]]),
                    be([src[2], src[3]]),
                    be([dst[0], dst[1]]),
                    be([dst[2], dst[3]]),
                ]);
                h[10..12].copy_from_slice(&checksum.to_be_bytes());
                Ok(IPV4_LEN)
            }
            IpRepr::V6 {
                src,
                dst,
                traffic_class,
                flow_label,
                hop_limit,
            } => {
                let payload_length =
                    u16::try_from(ip_payload).map_err(|_| Error::TooLong { len: total })?;
                let h = &mut out[..IPV6_LEN];
                // Version 6, traffic class, 20-bit flow label.
                let vtf = (6u32 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0xf_ffff);
                h[0..4].copy_from_slice(&vtf.to_be_bytes());
                h[4..6].copy_from_slice(&payload_length.to_be_bytes());
                h[6] = IpNumber::UDP.0;
                h[7] = hop_limit;
                h[8..24].copy_from_slice(&src);
                h[24..40].copy_from_slice(&dst);
                Ok(IPV6_LEN)
            }
        }
    }

    /// The UDP header, for `ip_payload` bytes of UDP (header included).
    #[inline(always)]
    fn emit_udp(&self, out: &mut [u8], ip_payload: usize) {
        // UDP length fits: the IP length check in `emit_ip` already bounded it.
        out[0..2].copy_from_slice(&self.udp.src_port.to_be_bytes());
        out[2..4].copy_from_slice(&ROCE_V2_PORT.to_be_bytes());
        out[4..6].copy_from_slice(&(ip_payload as u16).to_be_bytes());
        out[6..8].copy_from_slice(&self.udp.checksum.to_be_bytes());
    }

    /// The BTH (with PadCnt `pad`) and the extension headers `info` names, at the front
    /// of `out`; returns their length.
    #[inline(always)]
    fn emit_transport_headers(&self, out: &mut [u8], info: &OpInfo, pad: usize) -> usize {
        let mut off = 0;
        let mut bth = self.roce.bth;
        bth.pad_count = pad as u8;
        // Straight into the frame: a copy from a temporary would read back bytes just
        // stored one by one, which stalls the store-to-load forwarding.
        let bth_out: &mut [u8; BTH_LEN] = (&mut out[off..off + BTH_LEN])
            .try_into()
            .expect("a BTH_LEN range is BTH_LEN long");
        bth.emit(bth_out);
        off += BTH_LEN;
        // `check` proved that the headers present are exactly the opcode's (the CNP's
        // reserved bytes aside), so each present one is written in wire order (IBTA
        // §9.3, `Ext::ORDER`), straight-line: a loop over the set with a `match` per
        // header made the compiler prepare every kind of header up front.
        let ext = &self.roce.ext;
        let mut put = |len: usize| {
            let at = off;
            off += len;
            at..off
        };
        if let Some(h) = ext.deth {
            h.emit(&mut out[put(Ext::Deth.wire_len())]);
        }
        if let Some(h) = ext.feth {
            h.emit(&mut out[put(Ext::Feth.wire_len())]);
        }
        if let Some(h) = ext.reth {
            h.emit(&mut out[put(Ext::Reth.wire_len())]);
        }
        if let Some(h) = ext.atomic {
            h.emit(&mut out[put(Ext::AtomicEth.wire_len())]);
        }
        if let Some(v) = ext.immdt {
            out[put(Ext::ImmDt.wire_len())].copy_from_slice(&v.to_be_bytes());
        }
        if let Some(k) = ext.ieth {
            out[put(Ext::Ieth.wire_len())].copy_from_slice(&k.0.to_be_bytes());
        }
        if let Some(h) = ext.aeth {
            h.emit(&mut out[put(Ext::Aeth.wire_len())]);
        }
        if let Some(h) = ext.atomic_ack {
            h.emit(&mut out[put(Ext::AtomicAckEth.wire_len())]);
        }
        if info.exts.has(Ext::CnpPad) {
            out[put(Ext::CnpPad.wire_len())].fill(0);
        }
        off
    }

    /// The payload at `off` and `pad` zero bytes after it; returns where the ICRC goes.
    #[inline(always)]
    fn emit_payload_and_pad(&self, out: &mut [u8], mut off: usize, pad: usize) -> usize {
        let n = self.roce.payload.len();
        out[off..off + n].copy_from_slice(self.roce.payload);
        off += n;
        if pad != 0 {
            // Skips a call to memset for the usual empty pad.
            out[off..off + pad].fill(0);
            off += pad;
        }
        off
    }
}

/// A received frame checked once, with the offsets of every part.
///
/// After [`FrameView::parse`] succeeds every accessor is infallible. The ICRC is verified
/// separately by [`FrameView::verify_icrc`] so that tools can show a packet whose ICRC is
/// bad.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameView<'a> {
    buf: &'a [u8],
    vlan_tci: Option<u16>,
    ip_off: usize,
    ipv6: bool,
    ip_hdr_len: usize,
    udp_off: usize,
    bth_off: usize,
    payload_off: usize,
    payload_len: usize,
    icrc_off: usize,
    info: &'static OpInfo,
    /// The ICRC over `buf[ip_off..icrc_off]`, computed by `parse` (see [`icrc_span`]).
    icrc: u32,
}

fn truncated(layer: Layer, offset: usize, needed: usize, available: usize) -> Error {
    Error::Truncated {
        layer,
        offset,
        needed,
        available,
    }
}

/// The ones' complement of the ones' complement sum of `words` (RFC 1071), for a header
/// of at most a few hundred words.
fn ones_complement(words: &[u16]) -> u16 {
    let mut sum: u32 = words.iter().map(|&w| u32::from(w)).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The IPv4 header checksum (RFC 791): the ones' complement of the ones' complement sum of
/// the header's 16-bit words, the checksum field (bytes 10-11) counted as zero. `hdr` is the
/// whole header, options included (at most 60 bytes, so the sum cannot overflow).
pub(super) fn ipv4_checksum(hdr: &[u8]) -> u16 {
    // Sum every word, then take the checksum field back out: exact, since the sum holds it.
    // Summed as 32-bit words (an IPv4 header is a whole number of them): 2^16 ≡ 1 modulo
    // 0xFFFF, so folding this sum gives the 16-bit ones' complement sum, in a quarter of
    // the additions (it runs per received packet).
    let mut sum: u64 = hdr
        .chunks_exact(4)
        .map(|w| u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]])))
        .sum();
    if let [a, b, ..] = hdr.chunks_exact(4).remainder() {
        sum += u64::from(u16::from_be_bytes([*a, *b])) << 16;
    }
    if let Some(c) = hdr.get(10..12) {
        sum -= u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// [`ipv4_checksum`] of a header without options, for [`fast_ip`]: the same sum with
/// its fold unrolled. Five 32-bit words minus the checksum field sum to less than 2^35,
/// and three folds bring any such value to 16 bits (the second leaves at most 0x10007).
#[inline(always)]
fn ipv4_checksum_20(h: &[u8; IPV4_LEN]) -> u16 {
    let w = |i: usize| u64::from(u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]));
    let mut sum = w(0) + w(4) + w(8) + w(12) + w(16) - u64::from(be16(h, 10));
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The ICRC's input in the datagram `ip` found in `buf`: everything from the IP header to
/// the last 4 bytes of the datagram, which is where the ICRC lies whenever the rest of the
/// parse succeeds (the UDP length equals the IP payload length and the transport headers,
/// payload and pad fill it up to the ICRC).
///
/// How `parse` uses it: the CRC is a long dependency chain (each fold waits for the
/// previous one) that can start only once its start state, with the masked bytes folded
/// in ([`icrc::start`]), has been loaded; the UDP and transport checks are many short
/// independent operations. `parse` issues the start state's loads as soon as the IP layer
/// gives the span, the checks while those loads complete, and the CRC last, so that the
/// checks neither wait for the CRC nor delay it much (benches/wire.rs,
/// docs/performance.md).
#[inline(always)]
fn icrc_span<'a>(buf: &'a [u8], ip: &IpLayer) -> &'a [u8] {
    let end = ip.ip_end.saturating_sub(icrc::LEN).max(ip.ip_off);
    &buf[ip.ip_off..end]
}

/// The ICRC on the wire and the one computed, of a frame whose link, IP and UDP layers
/// check out as RoCE v2 and that holds at least a BTH and an ICRC, whatever its opcode:
/// for `xrnic decode` to check a packet [`FrameView::parse`] does not take (a vendor
/// opcode). The ICRC covers the datagram whatever the transport headers are.
pub fn datagram_icrc(buf: &[u8]) -> Option<(u32, u32)> {
    let ip = general_ip(buf).ok()?;
    let udp_off = ip.ip_off + ip.ip_hdr_len;
    let port = buf.get(udp_off + 2..udp_off + 4)?;
    if u16::from_be_bytes([port[0], port[1]]) != ROCE_V2_PORT
        || ip.ip_end < udp_off + UDP_LEN + BTH_LEN + icrc::LEN
    {
        return None;
    }
    let w = &buf[ip.ip_end - icrc::LEN..ip.ip_end];
    let wire = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
    let computed = icrc::compute(ip.ipv6, ip.ip_hdr_len, icrc_span(buf, &ip));
    Some((wire, computed))
}

/// Where the IP datagram lies in a frame: what the link and IP checks establish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IpLayer {
    vlan_tci: Option<u16>,
    ip_off: usize,
    ipv6: bool,
    ip_hdr_len: usize,
    /// End of the IP datagram (any Ethernet padding lies after it).
    ip_end: usize,
}

/// The link and IP checks of the usual frame, with a few fixed-offset loads: no tag or one
/// 802.1Q tag, IPv4 without options (IHL 5) or IPv6, and the datagram whole in the buffer.
/// `Some` only where [`general_ip`] gives `Ok` with the same value (its checks, in a
/// different order: IPv4 version and IHL in one byte, total length, header checksum,
/// fragment, protocol; IPv6 version, payload length, next header); any other frame, and
/// every frame one of those checks would reject, gets `None` and is left to
/// [`general_ip`], which stays the authority on the error value (the equality is a
/// property test). etherparse's slice constructors are sound but cost, per packet, more
/// than these loads (benches/wire.rs).
#[inline(always)]
fn fast_ip(buf: &[u8]) -> Option<IpLayer> {
    let head: &[u8; ETH_LEN + VLAN_LEN] = buf.get(..ETH_LEN + VLAN_LEN)?.try_into().ok()?;
    let outer = be16(head, 12);
    let (vlan_tci, ip_off, ether_type) = if outer == EtherType::VLAN_TAGGED_FRAME.0 {
        (Some(be16(head, 14)), ETH_LEN + VLAN_LEN, be16(head, 16))
    } else {
        (None, ETH_LEN, outer)
    };
    let ip = &buf[ip_off..];
    if ether_type == EtherType::IPV4.0 {
        let h: &[u8; IPV4_LEN] = ip.get(..IPV4_LEN)?.try_into().ok()?;
        let total = usize::from(be16(h, 2));
        let ok = h[0] == 0x45 // version 4, IHL 5
            && total >= IPV4_LEN
            && ip.len() >= total
            && ipv4_checksum_20(h) == be16(h, 10)
            && be16(h, 6) & 0x3fff == 0 // neither MF nor a fragment offset
            && h[9] == IpNumber::UDP.0;
        ok.then_some(IpLayer {
            vlan_tci,
            ip_off,
            ipv6: false,
            ip_hdr_len: IPV4_LEN,
            ip_end: ip_off + total,
        })
    } else if ether_type == EtherType::IPV6.0 {
        let h: &[u8; IPV6_LEN] = ip.get(..IPV6_LEN)?.try_into().ok()?;
        let total = IPV6_LEN + usize::from(be16(h, 4));
        let ok = h[0] >> 4 == 6 && ip.len() >= total && h[6] == IpNumber::UDP.0;
        ok.then_some(IpLayer {
            vlan_tci,
            ip_off,
            ipv6: true,
            ip_hdr_len: IPV6_LEN,
            ip_end: ip_off + total,
        })
    } else {
        None
    }
}

/// The link and IP checks of any frame, through etherparse, each failure with its precise
/// error: the reference for [`fast_ip`].
fn general_ip(buf: &[u8]) -> Result<IpLayer, Error> {
    let eth = Ethernet2HeaderSlice::from_slice(buf)
        .map_err(|e| truncated(Layer::Ethernet, 0, e.required_len, e.len))?;
    let mut off = ETH_LEN;
    let mut ether_type = eth.ether_type();
    let mut vlan_tci = None;
    if ether_type == EtherType::VLAN_TAGGED_FRAME {
        let v = SingleVlanHeaderSlice::from_slice(&buf[off..])
            .map_err(|e| truncated(Layer::Vlan, off, e.required_len, e.len))?;
        vlan_tci = Some(be16(v.slice(), 0));
        ether_type = v.ether_type();
        off += VLAN_LEN;
    }
    let ip_off = off;
    let (ipv6, ip_hdr_len, ip_end) = match ether_type {
        EtherType::IPV4 => {
            let h = Ipv4HeaderSlice::from_slice(&buf[off..]).map_err(|e| match e {
                etherparse::err::ipv4::HeaderSliceError::Len(l) => {
                    truncated(Layer::Ipv4, off, l.required_len, l.len)
                }
                etherparse::err::ipv4::HeaderSliceError::Content(c) => {
                    use etherparse::err::ipv4::HeaderError as H;
                    let (what, value) = match c {
                        H::UnexpectedVersion { version_number } => ("version", version_number),
                        H::HeaderLengthSmallerThanHeader { ihl } => ("IHL", ihl),
                    };
                    Error::Malformed {
                        layer: Layer::Ipv4,
                        offset: off,
                        what,
                        value: value.into(),
                    }
                }
            })?;
            let hl = h.slice().len();
            let total = usize::from(h.total_len());
            if total < hl {
                return Err(Error::Malformed {
                    layer: Layer::Ipv4,
                    offset: off,
                    what: "total length",
                    value: total as u64,
                });
            }
            if buf.len() - off < total {
                return Err(truncated(Layer::Ipv4, off, total, buf.len() - off));
            }
            let found = h.header_checksum();
            let expected = ipv4_checksum(h.slice());
            if found != expected {
                return Err(Error::Ipv4Checksum {
                    offset: off,
                    expected,
                    found,
                });
            }
            if h.is_fragmenting_payload() {
                return Err(Error::NotRoce(NotRoce::Fragment));
            }
            if h.protocol() != IpNumber::UDP {
                return Err(Error::NotRoce(NotRoce::IpProtocol(h.protocol().0)));
            }
            (false, hl, off + total)
        }
        EtherType::IPV6 => {
            let h = Ipv6HeaderSlice::from_slice(&buf[off..]).map_err(|e| match e {
                etherparse::err::ipv6::HeaderSliceError::Len(l) => {
                    truncated(Layer::Ipv6, off, l.required_len, l.len)
                }
                etherparse::err::ipv6::HeaderSliceError::Content(c) => {
                    let etherparse::err::ipv6::HeaderError::UnexpectedVersion { version_number } =
                        c;
                    Error::Malformed {
                        layer: Layer::Ipv6,
                        offset: off,
                        what: "version",
                        value: version_number.into(),
                    }
                }
            })?;
            let total = Ipv6Header::LEN + usize::from(h.payload_length());
            if buf.len() - off < total {
                return Err(truncated(Layer::Ipv6, off, total, buf.len() - off));
            }
            if h.next_header() != IpNumber::UDP {
                return Err(Error::NotRoce(NotRoce::IpProtocol(h.next_header().0)));
            }
            (true, Ipv6Header::LEN, off + total)
        }
        other => return Err(Error::NotRoce(NotRoce::EtherType(other.0))),
    };
    Ok(IpLayer {
        vlan_tci,
        ip_off,
        ipv6,
        ip_hdr_len,
        ip_end,
    })
}

impl<'a> FrameView<'a> {
    /// Check a frame's structure. The link and IP layers of the usual frame are checked by
    /// `fast_ip`, of any other by `general_ip`; UDP and the transport headers by the
    /// same code for both. The ICRC of a frame that passes is computed here too (see
    /// `icrc_span` for the order); it is compared only by [`FrameView::verify_icrc`].
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        Self::parse_inline(buf)
    }

    /// [`FrameView::parse`], inlined into its caller: the engine's receive path, which
    /// then builds the view in place instead of receiving it through memory.
    #[inline(always)]
    pub fn parse_inline(buf: &'a [u8]) -> Result<Self, Error> {
        let ip = match fast_ip(buf) {
            Some(ip) => ip,
            None => general_ip(buf)?,
        };
        let span = icrc_span(buf, &ip);
        let state = icrc::start(ip.ipv6, ip.ip_hdr_len, span);
        let mut v = Self::parse_transport(buf, ip, 0)?;
        v.icrc = icrc::finish(state, span);
        Ok(v)
    }

    /// [`FrameView::parse`] with the link and IP layers always checked by [`general_ip`]:
    /// the reference the fast path is tested against.
    #[cfg(test)]
    fn parse_general(buf: &'a [u8]) -> Result<Self, Error> {
        let ip = general_ip(buf)?;
        let span = icrc_span(buf, &ip);
        let mut v = Self::parse_transport(buf, ip, 0)?;
        v.icrc = icrc::compute(v.ipv6, v.ip_hdr_len, span);
        Ok(v)
    }

    /// UDP, BTH, extended headers, pad and ICRC position, after the IP checks.
    #[inline(always)]
    fn parse_transport(buf: &'a [u8], ip: IpLayer, icrc: u32) -> Result<Self, Error> {
        let IpLayer {
            vlan_tci,
            ip_off,
            ipv6,
            ip_hdr_len,
            ip_end,
        } = ip;
        let udp_off = ip_off + ip_hdr_len;
        let ip_payload_len = ip_end - udp_off;
        let udp = UdpHeaderSlice::from_slice(&buf[udp_off..ip_end])
            .map_err(|e| truncated(Layer::Udp, udp_off, e.required_len, e.len))?;
        if udp.destination_port() != ROCE_V2_PORT {
            return Err(Error::NotRoce(NotRoce::UdpPort(udp.destination_port())));
        }
        if usize::from(udp.length()) != ip_payload_len {
            return Err(Error::UdpLength {
                offset: udp_off,
                udp_len: udp.length(),
                ip_payload_len,
            });
        }
        let bth_off = udp_off + UDP_LEN;
        let bth = Bth::new_checked(&buf[bth_off..ip_end], bth_off)?;
        let opcode = bth.opcode();
        let info = opcode.info().ok_or(Error::UnknownOpcode {
            offset: bth_off,
            opcode: opcode.0,
        })?;
        BthRepr::check_tver(&bth, bth_off)?;
        let mut off = bth_off + BTH_LEN;
        let ext_len = info.ext_len();
        if ip_end - off < ext_len {
            // Slow path only: name the first extended header that does not fit.
            for e in info.exts.iter() {
                let available = ip_end - off;
                if available < e.wire_len() {
                    return Err(truncated(ext_layer(e), off, e.wire_len(), available));
                }
                off += e.wire_len();
            }
        }
        off = bth_off + BTH_LEN + ext_len;
        let available = ip_end - off;
        if available < icrc::LEN {
            return Err(truncated(Layer::Icrc, off, icrc::LEN, available));
        }
        let data_len = available - icrc::LEN;
        let pad = usize::from(bth.pad_count());
        if pad > data_len || data_len % 4 != 0 {
            return Err(Error::BadPadCount {
                offset: bth_off,
                pad: bth.pad_count(),
                data_len,
            });
        }
        if !info.has_payload && data_len != 0 {
            return Err(Error::UnexpectedPayload {
                offset: off,
                opcode: opcode.0,
                len: data_len,
            });
        }
        let icrc_off = off + data_len;
        debug_assert_eq!(icrc_off, ip_end - icrc::LEN, "the span icrc_span gave");
        Ok(FrameView {
            buf,
            vlan_tci,
            ip_off,
            ipv6,
            ip_hdr_len,
            udp_off,
            bth_off,
            payload_off: off,
            payload_len: data_len - pad,
            icrc_off,
            info,
            icrc,
        })
    }

    /// The opcode table row.
    #[inline]
    pub fn info(&self) -> &'static OpInfo {
        self.info
    }

    /// The frame bytes this view was parsed from (including any Ethernet padding).
    #[inline]
    pub fn bytes(&self) -> &'a [u8] {
        self.buf
    }

    /// The BTH as a byte view.
    #[inline]
    pub fn bth(&self) -> Bth<&'a [u8]> {
        Bth::new_unchecked(&self.buf[self.bth_off..self.bth_off + BTH_LEN])
    }

    /// Bytes of extended header `e`, when the opcode has it.
    #[inline]
    pub fn ext_bytes(&self, e: Ext) -> Option<&'a [u8]> {
        let o = self.bth_off + BTH_LEN + self.info.exts.offset_of(e)?;
        Some(&self.buf[o..o + e.wire_len()])
    }

    /// The payload, without pad.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buf[self.payload_off..self.payload_off + self.payload_len]
    }

    /// Byte offset of the BTH in the frame.
    #[inline]
    pub fn bth_offset(&self) -> usize {
        self.bth_off
    }

    /// The IP header as it lies in the frame (IPv4: with any options; IPv6: the fixed
    /// 40 bytes), for the GRH a UD receive buffer starts with.
    #[inline]
    pub fn ip_header(&self) -> &'a [u8] {
        &self.buf[self.ip_off..self.ip_off + self.ip_hdr_len]
    }

    /// True for IPv6.
    #[inline]
    pub fn is_ipv6(&self) -> bool {
        self.ipv6
    }

    /// The source and destination IP addresses, as they lie in the frame (4 bytes for
    /// IPv4, 16 for IPv6).
    #[inline]
    pub fn ip_addrs(&self) -> (&'a [u8], &'a [u8]) {
        let (o, n) = if self.ipv6 {
            (self.ip_off + 8, 16)
        } else {
            (self.ip_off + 12, 4)
        };
        (&self.buf[o..o + n], &self.buf[o + n..o + 2 * n])
    }

    /// Every extension header the opcode carries, parsed.
    #[inline]
    pub fn ext_headers(&self) -> ExtHeaders {
        let mut ext = ExtHeaders::default();
        for e in self.info.exts.iter() {
            if let Some(bytes) = self.ext_bytes(e) {
                ext.parse_one(e, bytes);
            }
        }
        ext
    }

    /// The IP ECN field (3 = CE).
    #[inline]
    pub fn ip_ecn(&self) -> u8 {
        if self.ipv6 {
            (self.buf[self.ip_off + 1] >> 4) & 3
        } else {
            self.buf[self.ip_off + 1] & 3
        }
    }

    /// The ICRC as carried on the wire.
    #[inline]
    pub fn icrc_wire(&self) -> u32 {
        let b = &self.buf[self.icrc_off..self.icrc_off + icrc::LEN];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// The ICRC computed over the frame.
    #[inline]
    pub fn icrc_computed(&self) -> u32 {
        self.icrc
    }

    /// Check the ICRC.
    #[inline]
    pub fn verify_icrc(&self) -> Result<(), Error> {
        let (computed, found) = (self.icrc_computed(), self.icrc_wire());
        if computed == found {
            Ok(())
        } else {
            Err(Error::Icrc {
                offset: self.icrc_off,
                computed,
                found,
            })
        }
    }

    /// The frame as plain values (the payload still borrows the frame).
    pub fn repr(&self) -> FrameRepr<'a> {
        let b = self.buf;
        let mut dst = [0u8; 6];
        let mut src = [0u8; 6];
        dst.copy_from_slice(&b[0..6]);
        src.copy_from_slice(&b[6..12]);
        let ip = &b[self.ip_off..];
        let ip = if self.ipv6 {
            let h = Ipv6HeaderSlice::from_slice(ip)
                .map(|h| h.to_header())
                .unwrap_or_default();
            IpRepr::V6 {
                src: h.source,
                dst: h.destination,
                traffic_class: h.traffic_class,
                flow_label: h.flow_label.value(),
                hop_limit: h.hop_limit,
            }
        } else {
            let h = Ipv4HeaderSlice::from_slice(ip)
                .map(|h| h.to_header())
                .unwrap_or_default();
            IpRepr::V4 {
                src: h.source,
                dst: h.destination,
                tos: (h.dscp.value() << 2) | h.ecn.value(),
                identification: h.identification,
                dont_fragment: h.dont_fragment,
                ttl: h.time_to_live,
            }
        };
        let udp = UdpRepr {
            src_port: be16(b, self.udp_off),
            checksum: be16(b, self.udp_off + 6),
        };
        let bth = BthRepr::from_view(&self.bth());
        let ext = self.ext_headers();
        FrameRepr {
            eth: EthRepr {
                dst,
                src,
                vlan_tci: self.vlan_tci,
            },
            ip,
            udp,
            roce: RoceRepr {
                bth,
                ext,
                payload: self.payload(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A header with its checksum field filled in.
    fn with_checksum(mut hdr: Vec<u8>) -> Vec<u8> {
        let c = ipv4_checksum(&hdr);
        hdr[10..12].copy_from_slice(&c.to_be_bytes());
        hdr
    }

    #[test]
    fn ipv4_checksum_of_a_known_header() {
        // 192.168.0.1 -> 192.168.0.199, UDP, DF, TTL 64, total length 115.
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4_checksum(&hdr), 0xb861);
    }

    #[test]
    fn reserved_ipv4_flag_bit_with_a_correct_checksum_is_accepted() {
        // Regression: the checksum used to be checked against etherparse's `Ipv4Header`,
        // which drops the reserved flag bit (RFC 791 bit 0 of the flags), so such a header
        // with a correct checksum was rejected. The ICRC covers the flags, so redo it too.
        use super::super::{AethRepr, Msn, Opcode, Psn, Qpn, Syndrome};
        let repr = FrameRepr {
            eth: EthRepr::default(),
            ip: IpRepr::V4 {
                src: [192, 0, 2, 1],
                dst: [192, 0, 2, 2],
                tos: 0,
                identification: 7,
                dont_fragment: true,
                ttl: 64,
            },
            udp: UdpRepr {
                src_port: 0xc000,
                checksum: 0,
            },
            roce: RoceRepr {
                bth: BthRepr::new(Opcode::RC_ACK, Qpn::new(0x11), Psn::new(5)),
                ext: ExtHeaders {
                    aeth: Some(AethRepr {
                        syndrome: Syndrome::from_byte(0x1f),
                        msn: Msn::new(1),
                    }),
                    ..ExtHeaders::default()
                },
                payload: &[],
            },
        };
        let mut f = vec![0u8; repr.buffer_len()];
        let n = repr.emit(&mut f).unwrap();
        let ip = &mut f[ETH_LEN..ETH_LEN + IPV4_LEN];
        ip[6] |= 0x80;
        let c = ipv4_checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let crc = icrc::compute(false, IPV4_LEN, &f[ETH_LEN..n - icrc::LEN]);
        f[n - icrc::LEN..n].copy_from_slice(&crc.to_le_bytes());
        let v = FrameView::parse(&f).unwrap();
        v.verify_icrc().unwrap();
        // The bit is not part of the repr: the frame otherwise reads as what was sent.
        assert_eq!(v.repr(), repr);
    }

    /// A WRITE ONLY frame with a 64-byte payload.
    fn write_only_frame(ipv6: bool, vlan: bool) -> Vec<u8> {
        use super::super::{Opcode, Psn, Qpn};
        let payload: Vec<u8> = (0..64u8).collect();
        let ip = if ipv6 {
            IpRepr::V6 {
                src: [0xfd; 16],
                dst: [0xfe; 16],
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 64,
            }
        } else {
            IpRepr::V4 {
                src: [192, 0, 2, 1],
                dst: [192, 0, 2, 2],
                tos: 0,
                identification: 0,
                dont_fragment: true,
                ttl: 64,
            }
        };
        let repr = FrameRepr {
            eth: EthRepr {
                vlan_tci: vlan.then_some(0x2005),
                ..EthRepr::default()
            },
            ip,
            udp: UdpRepr {
                src_port: 0xc000,
                checksum: 0,
            },
            roce: RoceRepr {
                bth: BthRepr {
                    ack_req: true,
                    ..BthRepr::new(Opcode::RC_WRITE_ONLY, Qpn::new(0x11), Psn::new(5))
                },
                ext: ExtHeaders {
                    reth: Some(RethRepr {
                        va: 0x1000,
                        rkey: Rkey(7),
                        dma_len: 64,
                    }),
                    ..ExtHeaders::default()
                },
                payload: &payload,
            },
        };
        let mut f = vec![0u8; repr.buffer_len()];
        repr.emit(&mut f).unwrap();
        f
    }

    /// `parse` computes the ICRC from the IP layer's bounds, before the transport checks.
    /// Whatever the layout (VLAN or not, Ethernet padding, IPv4 options), `verify_icrc`
    /// must accept the intact frame and reject one with a flipped payload bit.
    #[test]
    fn icrc_is_verified_over_the_right_bytes_whatever_the_layout() {
        let check = |f: &[u8], what: &str| {
            let v = FrameView::parse(f).unwrap();
            v.verify_icrc().unwrap_or_else(|e| panic!("{what}: {e:?}"));
            let mut bad = f.to_vec();
            bad[v.payload_off + 3] ^= 0x10;
            let v = FrameView::parse(&bad).unwrap();
            assert!(
                matches!(v.verify_icrc(), Err(Error::Icrc { .. })),
                "{what}: corrupted payload accepted"
            );
        };
        for ipv6 in [false, true] {
            for vlan in [false, true] {
                let f = write_only_frame(ipv6, vlan);
                let what = format!("ipv6 {ipv6} vlan {vlan}");
                check(&f, &what);
                // Ethernet padding after the ICRC (a short frame, or a driver's rounding).
                let mut padded = f.clone();
                padded.extend_from_slice(&[0u8; 6]);
                check(&padded, &format!("{what}, padded"));
            }
        }
        // IPv4 with 4 bytes of options (four NOPs): IHL 6, everything after moves.
        let f = write_only_frame(false, false);
        let mut o = f[..ETH_LEN + IPV4_LEN].to_vec();
        o.extend_from_slice(&[1, 1, 1, 1]);
        o.extend_from_slice(&f[ETH_LEN + IPV4_LEN..]);
        let ip = &mut o[ETH_LEN..ETH_LEN + IPV4_LEN + 4];
        ip[0] = 0x46;
        let total = u16::from_be_bytes([ip[2], ip[3]]) + 4;
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip[10..12].fill(0);
        let c = ipv4_checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let n = o.len();
        let crc = icrc::compute(false, IPV4_LEN + 4, &o[ETH_LEN..n - icrc::LEN]);
        o[n - icrc::LEN..].copy_from_slice(&crc.to_le_bytes());
        check(&o, "IPv4 options");
    }

    /// The frames the fast-path property starts from: every layout [`fast_ip`] takes,
    /// and a WRITE and an ACK (no payload) in each.
    fn fast_path_seeds() -> Vec<Vec<u8>> {
        let mut seeds = Vec::new();
        for ipv6 in [false, true] {
            for vlan in [false, true] {
                let f = write_only_frame(ipv6, vlan);
                let ack = {
                    let mut r = FrameRepr::parse(&f).unwrap();
                    r.roce.bth.opcode = super::super::Opcode::RC_ACK;
                    r.roce.ext = ExtHeaders {
                        aeth: Some(AethRepr::parse(&[0x1f, 0, 0, 9])),
                        ..ExtHeaders::default()
                    };
                    r.roce.payload = &[];
                    let mut a = vec![0u8; r.buffer_len()];
                    r.emit(&mut a).unwrap();
                    a
                };
                seeds.push(f);
                seeds.push(ack);
            }
        }
        seeds
    }

    /// Recompute the IPv4 header checksum of a frame whose IPv4 header (IHL 5) starts at
    /// `ip_off`, so that mutations behind it reach the later checks.
    fn fix_ipv4_checksum(f: &mut [u8], ip_off: usize) {
        if let Some(h) = f.get_mut(ip_off..ip_off + IPV4_LEN) {
            let c = ipv4_checksum(h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
        }
    }

    #[test]
    fn usual_frames_take_the_fast_path() {
        for f in fast_path_seeds() {
            let fast = fast_ip(&f).expect("a usual frame is checked by the fast path");
            assert_eq!(Ok(fast), general_ip(&f));
            let v = FrameView::parse(&f).unwrap();
            v.verify_icrc().unwrap();
            assert_eq!(Ok(v), FrameView::parse_general(&f));
        }
    }

    proptest! {
        // Enough cases that single-bit changes reach every header bit with the IPv4
        // checksum made right again (so they get past it), on each of the seed frames.
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// The fast path of the link and IP checks accepts only what the general path
        /// accepts, with the same result, and the whole parse gives the same `Ok` view or
        /// the same `Err` through either, for valid frames and for frames with header
        /// bits flipped or bytes replaced at random, truncated or padded.
        #[test]
        fn fast_path_equals_general_path(
            seed in 0usize..8,
            edits in proptest::collection::vec((0usize..100, 0u8..8, any::<bool>(), any::<u8>()), 0..4),
            fix_checksum in any::<bool>(),
            cut in proptest::option::of(0usize..200),
            pad in 0usize..8,
        ) {
            let mut f = fast_path_seeds().swap_remove(seed);
            for (at, bit, flip, v) in edits {
                if let Some(b) = f.get_mut(at) {
                    *b = if flip { *b ^ (1 << bit) } else { v };
                }
            }
            if fix_checksum {
                let tagged = f[12..14] == [0x81, 0x00];
                fix_ipv4_checksum(&mut f, if tagged { 18 } else { 14 });
            }
            if let Some(cut) = cut {
                f.truncate(cut);
            }
            f.resize(f.len() + pad, 0);
            if let Some(fast) = fast_ip(&f) {
                prop_assert_eq!(Ok(fast), general_ip(&f));
            }
            prop_assert_eq!(FrameView::parse(&f), FrameView::parse_general(&f));
        }
    }

    proptest! {
        /// Any bytes at all: same result through both paths, and no panic.
        #[test]
        fn fast_path_equals_general_path_on_noise(
            f in proptest::collection::vec(any::<u8>(), 0..120),
            ether_type in prop_oneof![Just([0x08u8, 0x00]), Just([0x86, 0xdd]), Just([0x81, 0x00])],
        ) {
            let mut f = f;
            if let Some(t) = f.get_mut(12..14) {
                t.copy_from_slice(&ether_type);
            }
            if let Some(fast) = fast_ip(&f) {
                prop_assert_eq!(Ok(fast), general_ip(&f));
            }
            prop_assert_eq!(FrameView::parse(&f), FrameView::parse_general(&f));
        }
    }

    proptest! {
        /// The unrolled checksum of the fast path equals the general one.
        #[test]
        fn ipv4_checksum_20_equals_ipv4_checksum(h in any::<[u8; IPV4_LEN]>()) {
            prop_assert_eq!(ipv4_checksum_20(&h), ipv4_checksum(&h));
        }
    }

    proptest! {
        /// RFC 1071: the ones' complement sum over a header carrying its checksum is all
        /// ones, whatever the header holds (options and the reserved flag bit included;
        /// etherparse's `Ipv4Header` drops that bit, so it cannot be the oracle here).
        #[test]
        fn ipv4_checksum_makes_the_header_sum_all_ones(
            words in 5usize..=15,
            bytes in proptest::collection::vec(any::<u8>(), 60),
        ) {
            let hdr = with_checksum(bytes[..4 * words].to_vec());
            let mut sum: u32 = hdr
                .chunks_exact(2)
                .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
                .sum();
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            prop_assert_eq!(sum, 0xffff);
        }
    }
}
