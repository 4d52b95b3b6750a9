//! Whole RoCE v2 frames: `Ethernet [802.1Q] | IPv4 or IPv6 | UDP(4791) | BTH | ext headers |
//! payload | pad | ICRC`.
//!
//! [`FrameView::parse`] checks a received frame once and records where everything is;
//! [`FrameRepr`] is the same frame as plain values, and [`FrameRepr::emit`] writes one
//! (lengths, IPv4 checksum, PadCnt and ICRC are computed, never taken from the Repr).
//! Ethernet, VLAN, IP and UDP headers are read and written with `etherparse`.

use etherparse::{
    EtherType, Ethernet2HeaderSlice, IpDscp, IpEcn, IpFragOffset, IpNumber, Ipv4Header,
    Ipv4HeaderSlice, Ipv6FlowLabel, Ipv6Header, Ipv6HeaderSlice, SingleVlanHeaderSlice,
    UdpHeaderSlice,
};

use super::ext::{AethRepr, AtomicAckEthRepr, AtomicEthRepr, DethRepr, FethRepr, RethRepr};
use super::{Bth, BthRepr, Error, Ext, Layer, NotRoce, OpInfo, Rkey, icrc};

/// The IANA UDP port of RoCE v2.
pub const ROCE_V2_PORT: u16 = 4791;

const ETH_LEN: usize = 14;
const VLAN_LEN: usize = 4;
const UDP_LEN: usize = 8;
const BTH_LEN: usize = 12;

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
            IpRepr::V4 { .. } => Ipv4Header::MIN_LEN,
            IpRepr::V6 { .. } => Ipv6Header::LEN,
        }
    }
}

/// UDP ports and checksum. RoCE v2 senders may leave the checksum 0 (rxe does); it is not
/// verified on receive, since the ICRC covers the datagram (REFERENCE §4). The value is
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

    fn parse_one(&mut self, e: Ext, b: &[u8]) {
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

    fn emit_one(&self, e: Ext, b: &mut [u8]) {
        match e {
            Ext::Deth => self.deth.unwrap_or_default().emit(b),
            Ext::Feth => self.feth.unwrap_or_default().emit(b),
            Ext::Reth => self.reth.unwrap_or_default().emit(b),
            Ext::AtomicEth => self.atomic.unwrap_or_default().emit(b),
            Ext::ImmDt => b.copy_from_slice(&self.immdt.unwrap_or(0).to_be_bytes()),
            Ext::Ieth => b.copy_from_slice(&self.ieth.unwrap_or_default().0.to_be_bytes()),
            Ext::Aeth => match self.aeth {
                Some(a) => a.emit(b),
                None => b.fill(0),
            },
            Ext::AtomicAckEth => self.atomic_ack.unwrap_or_default().emit(b),
            Ext::CnpPad => b.fill(0),
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
    pub fn check(&self) -> Result<&'static OpInfo, Error> {
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

fn ext_layer(e: Ext) -> Layer {
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
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, Error> {
        let info = self.roce.check()?;
        let total = self.buffer_len();
        if out.len() < total {
            return Err(Error::BufferTooSmall {
                needed: total,
                available: out.len(),
            });
        }
        let out = &mut out[..total];
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
        off += 2;

        let ip_off = off;
        let ip_payload = UDP_LEN + self.roce.wire_len();
        match self.ip {
            IpRepr::V4 {
                src,
                dst,
                tos,
                identification,
                dont_fragment,
                ttl,
            } => {
                let total_len = u16::try_from(Ipv4Header::MIN_LEN + ip_payload)
                    .map_err(|_| Error::TooLong { len: total })?;
                let h = Ipv4Header {
                    dscp: IpDscp::try_new(tos >> 2).unwrap_or(IpDscp::ZERO),
                    ecn: IpEcn::try_new(tos & 3).unwrap_or(IpEcn::ZERO),
                    total_len,
                    identification,
                    dont_fragment,
                    more_fragments: false,
                    fragment_offset: IpFragOffset::ZERO,
                    time_to_live: ttl,
                    protocol: IpNumber::UDP,
                    header_checksum: 0,
                    source: src,
                    destination: dst,
                    ..Default::default()
                };
                // Serialized with a zero checksum, then the RFC 1071 sum over the bytes.
                let mut hb = h.to_bytes();
                let sum = !ones_complement_sum(&hb);
                hb[10..12].copy_from_slice(&sum.to_be_bytes());
                out[off..off + Ipv4Header::MIN_LEN].copy_from_slice(&hb);
                off += Ipv4Header::MIN_LEN;
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
                let h = Ipv6Header {
                    traffic_class,
                    flow_label: Ipv6FlowLabel::try_new(flow_label & 0xf_ffff)
                        .unwrap_or(Ipv6FlowLabel::ZERO),
                    payload_length,
                    next_header: IpNumber::UDP,
                    hop_limit,
                    source: src,
                    destination: dst,
                };
                out[off..off + Ipv6Header::LEN].copy_from_slice(&h.to_bytes());
                off += Ipv6Header::LEN;
            }
        }
        let ip_hdr_len = off - ip_off;

        // UDP length fits: the IP length check above already bounded it.
        out[off..off + 2].copy_from_slice(&self.udp.src_port.to_be_bytes());
        out[off + 2..off + 4].copy_from_slice(&ROCE_V2_PORT.to_be_bytes());
        out[off + 4..off + 6].copy_from_slice(&(ip_payload as u16).to_be_bytes());
        out[off + 6..off + 8].copy_from_slice(&self.udp.checksum.to_be_bytes());
        off += UDP_LEN;

        let mut bth = self.roce.bth;
        bth.pad_count = self.roce.pad() as u8;
        let mut bth_bytes = [0u8; BTH_LEN];
        bth.emit(&mut bth_bytes);
        out[off..off + BTH_LEN].copy_from_slice(&bth_bytes);
        off += BTH_LEN;
        for e in info.exts.iter() {
            self.roce.ext.emit_one(e, &mut out[off..off + e.wire_len()]);
            off += e.wire_len();
        }
        let n = self.roce.payload.len();
        out[off..off + n].copy_from_slice(self.roce.payload);
        off += n;
        let pad = self.roce.pad();
        out[off..off + pad].fill(0);
        off += pad;
        let crc = icrc::compute(
            matches!(self.ip, IpRepr::V6 { .. }),
            ip_hdr_len,
            &out[ip_off..off],
        );
        out[off..off + icrc::LEN].copy_from_slice(&crc.to_le_bytes());
        Ok(off + icrc::LEN)
    }
}

/// A received frame checked once, with the offsets of every part.
///
/// After [`FrameView::parse`] succeeds every accessor is infallible. The ICRC is verified
/// separately by [`FrameView::verify_icrc`] so that tools can show a packet whose ICRC is
/// bad.
#[derive(Clone, Copy, Debug)]
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
}

fn truncated(layer: Layer, offset: usize, needed: usize, available: usize) -> Error {
    Error::Truncated {
        layer,
        offset,
        needed,
        available,
    }
}

/// The 16-bit ones' complement sum of `b` (RFC 1071), folded.
fn ones_complement_sum(b: &[u8]) -> u16 {
    let words = b.chunks_exact(2);
    let odd = words.remainder().first().map_or(0, |&x| u32::from(x) << 8);
    let mut sum: u32 = odd
        + words
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum::<u32>();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

impl<'a> FrameView<'a> {
    /// Check a frame's structure (everything except the ICRC).
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
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
                // RFC 1071: a correct header sums to 0xffff in ones' complement. Checked
                // on the bytes; the expected value is only rebuilt for the error.
                if ones_complement_sum(h.slice()) != 0xffff {
                    let expected = h.to_header().calc_header_checksum();
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
                        let etherparse::err::ipv6::HeaderError::UnexpectedVersion {
                            version_number,
                        } = c;
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
        for e in info.exts.iter() {
            let available = ip_end - off;
            if available < e.wire_len() {
                return Err(truncated(ext_layer(e), off, e.wire_len(), available));
            }
            off += e.wire_len();
        }
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
            icrc_off: off + data_len,
            info,
        })
    }

    /// The opcode table row.
    pub fn info(&self) -> &'static OpInfo {
        self.info
    }

    /// The frame bytes this view was parsed from (including any Ethernet padding).
    pub fn bytes(&self) -> &'a [u8] {
        self.buf
    }

    /// The BTH as a byte view.
    pub fn bth(&self) -> Bth<&'a [u8]> {
        Bth::new_unchecked(&self.buf[self.bth_off..self.bth_off + BTH_LEN])
    }

    /// Bytes of extended header `e`, when the opcode has it.
    pub fn ext_bytes(&self, e: Ext) -> Option<&'a [u8]> {
        let o = self.bth_off + BTH_LEN + self.info.exts.offset_of(e)?;
        Some(&self.buf[o..o + e.wire_len()])
    }

    /// The payload, without pad.
    pub fn payload(&self) -> &'a [u8] {
        &self.buf[self.payload_off..self.payload_off + self.payload_len]
    }

    /// Byte offset of the BTH in the frame.
    pub fn bth_offset(&self) -> usize {
        self.bth_off
    }

    /// True for IPv6.
    pub fn is_ipv6(&self) -> bool {
        self.ipv6
    }

    /// The IP ECN field (3 = CE).
    pub fn ip_ecn(&self) -> u8 {
        if self.ipv6 {
            (self.buf[self.ip_off + 1] >> 4) & 3
        } else {
            self.buf[self.ip_off + 1] & 3
        }
    }

    /// The ICRC as carried on the wire.
    pub fn icrc_wire(&self) -> u32 {
        let b = &self.buf[self.icrc_off..self.icrc_off + icrc::LEN];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// The ICRC computed over the frame.
    pub fn icrc_computed(&self) -> u32 {
        icrc::compute(
            self.ipv6,
            self.ip_hdr_len,
            &self.buf[self.ip_off..self.icrc_off],
        )
    }

    /// Check the ICRC.
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
        let mut ext = ExtHeaders::default();
        for e in self.info.exts.iter() {
            if let Some(bytes) = self.ext_bytes(e) {
                ext.parse_one(e, bytes);
            }
        }
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
