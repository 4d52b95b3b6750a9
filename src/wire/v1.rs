//! RoCE v1 frames, read for decoding only: `Ethernet [802.1Q] | EtherType 0x8915 | GRH |
//! BTH | ext headers | payload | pad | ICRC` (IBTA vol. 1 annex A16; the GRH is IBTA vol. 1
//! §8.3, laid out like an IPv6 header, with next header 0x1B for a BTH).
//!
//! xrnic speaks RoCE v2 only: [`super::FrameView::parse`], which the engine uses, rejects
//! a v1 frame as `NotRoce(EtherType(0x8915))`, and nothing here is on the engine's path.
//! `xrnic decode` and `xrnic explain` use [`V1View`] to name what a capture holds (older
//! ConnectX captures are full of RoCE v1) and to check its ICRC.
//!
//! The ICRC of a v1 packet covers the GRH, BTH, extension headers, payload and pad, with
//! the GRH's traffic class, flow label and hop limit and BTH byte 4 counted as ones, after
//! 8 bytes of ones that stand for the LRH a RoCE frame does not carry: the rule for an IB
//! packet with a GRH (IBTA vol. 1 §7.8.1), which RoCE v2 keeps with IP and UDP in the
//! GRH's place (annex A17.4.1; [`super::icrc`]).

use super::frame::ExtHeaders;
use super::{Bth, BthRepr, Error, Layer, NotRoce, OpInfo, icrc};

/// The EtherType of RoCE v1 (IBTA vol. 1 annex A16).
pub const ROCE_V1_ETHERTYPE: u16 = 0x8915;

/// Length of the GRH (IBTA vol. 1 §8.3).
pub const GRH_LEN: usize = 40;

/// GRH next header value of a BTH (IBTA vol. 1 §8.3.1: "IBA transport").
pub const GRH_NEXT_HEADER_BTH: u8 = 0x1b;

const ETH_LEN: usize = 14;
const VLAN_LEN: usize = 4;
const BTH_LEN: usize = 12;
const VLAN_TPID: u16 = 0x8100;

/// The GRH as plain values (IBTA vol. 1 §8.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrhRepr {
    /// IPVer: 6 on the wire.
    pub ip_version: u8,
    pub traffic_class: u8,
    /// 20 bits.
    pub flow_label: u32,
    /// Bytes after the GRH, up to and including the ICRC.
    pub payload_len: u16,
    pub next_header: u8,
    pub hop_limit: u8,
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
}

impl GrhRepr {
    /// Read the 40 bytes of a GRH.
    pub fn parse(b: &[u8; GRH_LEN]) -> GrhRepr {
        let w0 = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let mut sgid = [0u8; 16];
        let mut dgid = [0u8; 16];
        sgid.copy_from_slice(&b[8..24]);
        dgid.copy_from_slice(&b[24..40]);
        GrhRepr {
            ip_version: (w0 >> 28) as u8,
            traffic_class: (w0 >> 20) as u8,
            flow_label: w0 & 0x000f_ffff,
            payload_len: u16::from_be_bytes([b[4], b[5]]),
            next_header: b[6],
            hop_limit: b[7],
            sgid,
            dgid,
        }
    }
}

/// The ICRC of a RoCE v1 packet: `pkt` starts at the GRH and ends just before the ICRC.
/// Bytes missing from a short `pkt` are simply not hashed; this never panics.
pub fn icrc_v1(pkt: &[u8]) -> u32 {
    icrc::compute_grh(pkt)
}

/// Where the GRH lies, and the frame's 802.1Q tag: the link layer of a v1 frame.
fn link(buf: &[u8]) -> Result<(Option<u16>, usize), Error> {
    let be16 = |o: usize| u16::from_be_bytes([buf[o], buf[o + 1]]);
    if buf.len() < ETH_LEN {
        return Err(Error::Truncated {
            layer: Layer::Ethernet,
            offset: 0,
            needed: ETH_LEN,
            available: buf.len(),
        });
    }
    let (mut ether_type, mut off, mut tci) = (be16(12), ETH_LEN, None);
    if ether_type == VLAN_TPID {
        if buf.len() < ETH_LEN + VLAN_LEN {
            return Err(Error::Truncated {
                layer: Layer::Vlan,
                offset: ETH_LEN,
                needed: VLAN_LEN,
                available: buf.len() - ETH_LEN,
            });
        }
        tci = Some(be16(ETH_LEN));
        ether_type = be16(ETH_LEN + 2);
        off += VLAN_LEN;
    }
    if ether_type != ROCE_V1_ETHERTYPE {
        return Err(Error::NotRoce(NotRoce::EtherType(ether_type)));
    }
    Ok((tci, off))
}

/// A RoCE v1 frame checked once, with the offsets of every part.
///
/// [`V1View::parse`] checks the layers that do not depend on the opcode (link, GRH, BTH,
/// the packet's length, where the ICRC lies) and computes the ICRC; it accepts any opcode,
/// so that a vendor opcode still gets its ICRC checked. [`V1View::transport`] then checks
/// what the opcode table says follows the BTH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V1View<'a> {
    buf: &'a [u8],
    vlan_tci: Option<u16>,
    grh_off: usize,
    icrc_off: usize,
    icrc: u32,
}

/// The opcode-dependent part of a v1 frame (see [`V1View::transport`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V1Transport<'a> {
    pub info: &'static OpInfo,
    pub ext: ExtHeaders,
    /// The payload, without pad.
    pub payload: &'a [u8],
}

impl<'a> V1View<'a> {
    /// Check the link layer (EtherType 0x8915, one optional 802.1Q tag), the GRH (40
    /// bytes, next header 0x1B, its PayLen within the frame and long enough for a BTH and
    /// an ICRC) and the BTH's TVer. Ethernet padding past `GRH + PayLen` is ignored.
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        let (vlan_tci, grh_off) = link(buf)?;
        let available = buf.len() - grh_off;
        let Some(g) = buf.get(grh_off..grh_off + GRH_LEN) else {
            return Err(Error::Truncated {
                layer: Layer::Grh,
                offset: grh_off,
                needed: GRH_LEN,
                available,
            });
        };
        let mut grh = [0u8; GRH_LEN];
        grh.copy_from_slice(g);
        let grh = GrhRepr::parse(&grh);
        if grh.next_header != GRH_NEXT_HEADER_BTH {
            return Err(Error::Malformed {
                layer: Layer::Grh,
                offset: grh_off + 6,
                what: "next header (a BTH is 0x1b)",
                value: grh.next_header.into(),
            });
        }
        let bth_off = grh_off + GRH_LEN;
        let pay = usize::from(grh.payload_len);
        let present = buf.len() - bth_off;
        if pay > present {
            return Err(Error::Truncated {
                layer: Layer::Grh,
                offset: bth_off,
                needed: pay,
                available: present,
            });
        }
        if pay < BTH_LEN + icrc::LEN {
            return Err(Error::Malformed {
                layer: Layer::Grh,
                offset: grh_off + 4,
                what: "PayLen (shorter than a BTH and an ICRC)",
                value: pay as u64,
            });
        }
        let bth = Bth::new_checked(&buf[bth_off..bth_off + pay], bth_off)?;
        BthRepr::check_tver(&bth, bth_off)?;
        let icrc_off = bth_off + pay - icrc::LEN;
        Ok(V1View {
            buf,
            vlan_tci,
            grh_off,
            icrc_off,
            icrc: icrc_v1(&buf[grh_off..icrc_off]),
        })
    }

    /// The GRH.
    pub fn grh(&self) -> GrhRepr {
        let mut g = [0u8; GRH_LEN];
        g.copy_from_slice(&self.buf[self.grh_off..self.grh_off + GRH_LEN]);
        GrhRepr::parse(&g)
    }

    /// The 802.1Q TCI, when the frame has a tag.
    pub fn vlan_tci(&self) -> Option<u16> {
        self.vlan_tci
    }

    /// Byte offset of the BTH in the frame.
    pub fn bth_offset(&self) -> usize {
        self.grh_off + GRH_LEN
    }

    /// The BTH.
    pub fn bth(&self) -> Bth<&'a [u8]> {
        let o = self.bth_offset();
        Bth::new_unchecked(&self.buf[o..o + BTH_LEN])
    }

    /// The bytes between the BTH and the ICRC (extension headers, payload, pad).
    pub fn after_bth(&self) -> &'a [u8] {
        &self.buf[self.bth_offset() + BTH_LEN..self.icrc_off]
    }

    /// The ICRC as carried on the wire (its register value, as [`icrc::compute`] gives).
    pub fn icrc_wire(&self) -> u32 {
        let b = &self.buf[self.icrc_off..self.icrc_off + icrc::LEN];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// The ICRC computed over the packet.
    pub fn icrc_computed(&self) -> u32 {
        self.icrc
    }

    /// The extension headers and payload the opcode table says follow the BTH, with the
    /// same checks as a v2 frame's: a known opcode, every header whole, PadCnt within the
    /// data and the data a whole number of words, no payload where the opcode has none.
    pub fn transport(&self) -> Result<V1Transport<'a>, Error> {
        let bth = self.bth();
        let bth_off = self.bth_offset();
        let opcode = bth.opcode();
        let info = opcode.info().ok_or(Error::UnknownOpcode {
            offset: bth_off,
            opcode: opcode.0,
        })?;
        let rest = self.after_bth();
        let mut off = 0;
        let mut ext = ExtHeaders::default();
        for e in info.exts.iter() {
            let Some(b) = rest.get(off..off + e.wire_len()) else {
                return Err(Error::Truncated {
                    layer: super::frame::ext_layer(e),
                    offset: bth_off + BTH_LEN + off,
                    needed: e.wire_len(),
                    available: rest.len() - off,
                });
            };
            ext.parse_one(e, b);
            off += e.wire_len();
        }
        let data_len = rest.len() - off;
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
                offset: bth_off + BTH_LEN + off,
                opcode: opcode.0,
                len: data_len,
            });
        }
        Ok(V1Transport {
            info,
            ext,
            payload: &rest[off..off + data_len - pad],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v1 RC SEND ONLY of 4 payload bytes, with a correct ICRC.
    fn frame(tag: bool) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        if tag {
            f.extend_from_slice(&[0x81, 0x00, 0x20, 0x05]);
        }
        f.extend_from_slice(&ROCE_V1_ETHERTYPE.to_be_bytes());
        let grh_off = f.len();
        // IPVer 6, TClass 0xa4, flow label 0x12345; PayLen 12 + 4 + 4; next header 0x1B;
        // hop limit 64; SGID fe80::1, DGID fe80::2.
        f.extend_from_slice(&[0x6a, 0x41, 0x23, 0x45, 0, 20, 0x1b, 64]);
        let mut gid = [0u8; 16];
        gid[..2].copy_from_slice(&[0xfe, 0x80]);
        gid[15] = 1;
        f.extend_from_slice(&gid);
        gid[15] = 2;
        f.extend_from_slice(&gid);
        // BTH: RC SEND ONLY, P_Key 0xffff, QP 0x11, AckReq, PSN 7.
        f.extend_from_slice(&[0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 7]);
        f.extend_from_slice(b"ping");
        let c = icrc_v1(&f[grh_off..]);
        f.extend_from_slice(&c.to_le_bytes());
        f
    }

    #[test]
    fn parses_grh_bth_payload_and_checks_the_icrc() {
        for tag in [false, true] {
            let f = frame(tag);
            let v = V1View::parse(&f).unwrap();
            assert_eq!(v.vlan_tci(), tag.then_some(0x2005));
            let g = v.grh();
            assert_eq!(
                (g.ip_version, g.traffic_class, g.flow_label),
                (6, 0xa4, 0x12345)
            );
            assert_eq!((g.payload_len, g.next_header, g.hop_limit), (20, 0x1b, 64));
            assert_eq!((g.sgid[15], g.dgid[15]), (1, 2));
            assert_eq!(v.bth().dest_qp().value(), 0x11);
            assert_eq!(v.icrc_wire(), v.icrc_computed());
            let t = v.transport().unwrap();
            assert_eq!((t.info.name, t.payload), ("RC_SEND_ONLY", &b"ping"[..]));
        }
    }

    #[test]
    fn masked_fields_do_not_change_the_icrc_and_others_do() {
        let f = frame(false);
        let at = |i: usize| 14 + i;
        for (i, m) in [
            (0, 0x0f),
            (1, 0xff),
            (2, 0xff),
            (3, 0xff),
            (7, 0xff),
            (44, 0xff),
        ] {
            let mut g = f.clone();
            g[at(i)] ^= m;
            let v = V1View::parse(&g).unwrap();
            assert_eq!(v.icrc_computed(), v.icrc_wire(), "byte {i}");
        }
        for i in [4usize, 8, 39, 40, 43, 45, 52] {
            let mut g = f.clone();
            g[at(i)] ^= 0x01;
            let Ok(v) = V1View::parse(&g) else { continue };
            assert_ne!(v.icrc_computed(), v.icrc_wire(), "byte {i}");
        }
    }

    #[test]
    fn malformed_frames_are_errors_that_name_the_layer() {
        let f = frame(false);
        // Every truncation is an error, never a panic.
        for n in 0..f.len() {
            assert!(V1View::parse(&f[..n]).is_err(), "cut at {n}");
        }
        assert!(matches!(
            V1View::parse(&f[..14 + 39]),
            Err(Error::Truncated {
                layer: Layer::Grh,
                needed: 40,
                available: 39,
                ..
            })
        ));
        let mut g = f.clone();
        g[14 + 6] = 0x3b; // IPv6's "no next header"
        assert!(matches!(
            V1View::parse(&g),
            Err(Error::Malformed {
                layer: Layer::Grh,
                value: 0x3b,
                ..
            })
        ));
        let mut g = f.clone();
        g[12..14].copy_from_slice(&[0x86, 0xdd]);
        assert_eq!(
            V1View::parse(&g),
            Err(Error::NotRoce(NotRoce::EtherType(0x86dd)))
        );
        // PayLen too small to hold a BTH and an ICRC.
        let mut g = f.clone();
        g[14 + 5] = 8;
        assert!(matches!(
            V1View::parse(&g),
            Err(Error::Malformed {
                layer: Layer::Grh,
                ..
            })
        ));
        // An unknown opcode parses (its ICRC can be checked) but has no transport.
        let mut g = f;
        g[14 + 40] = 0x1f;
        let v = V1View::parse(&g).unwrap();
        assert!(matches!(
            v.transport(),
            Err(Error::UnknownOpcode { opcode: 0x1f, .. })
        ));
    }

    #[test]
    fn the_engine_parser_still_rejects_v1() {
        assert_eq!(
            super::super::FrameView::parse(&frame(false)),
            Err(Error::NotRoce(NotRoce::EtherType(ROCE_V1_ETHERTYPE)))
        );
    }
}
