//! A prebuilt frame header for one connection, patched per packet: the send hot path.
//!
//! Contract: [`FrameTemplate::new`] takes the fields of a frame that do not change from
//! packet to packet of one QP (Ethernet and 802.1Q, IP addressing, TOS/traffic class, TTL,
//! flow label, UDP source port and checksum, and the fixed BTH fields: P_Key, MigReq,
//! DestQP, the FECN/BECN/reserved bits) and writes them once, through
//! [`FrameRepr::emit`]. [`FrameTemplate::emit`] then writes one frame from the per-packet
//! fields (opcode, SE, AckReq, PSN, extension headers, payload): it copies the header,
//! patches the lengths, the IPv4 header checksum (from a sum kept in the template),
//! PadCnt, the per-packet BTH fields, writes the extension headers, the payload, the pad
//! and the ICRC. The bytes and the errors are exactly those of [`FrameRepr::emit`] for
//! the same frame (test `template_emits_what_frame_repr_emits`); only the per-packet work
//! differs: no addressing is assembled, no IP header is written field by field.

use super::frame::{FrameRepr, RoceRepr};
use super::{BthRepr, Error, EthRepr, Ext, ExtHeaders, IpRepr, Opcode, Psn, UdpRepr, icrc};

const ETH_LEN: usize = 14;
const VLAN_LEN: usize = 4;
const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;
const BTH_LEN: usize = 12;
/// Ethernet + 802.1Q + IPv6 + UDP + BTH.
const MAX_HDR: usize = ETH_LEN + VLAN_LEN + IPV6_LEN + UDP_LEN + BTH_LEN;

/// The per-packet BTH fields [`FrameTemplate::emit`] writes into the template's header
/// (IBTA vol. 1 §9.2: OpCode, SE, AckReq, PSN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BthFields {
    pub opcode: Opcode,
    pub psn: Psn,
    pub ack_req: bool,
    pub solicited: bool,
}

/// The fixed part of one connection's frames (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameTemplate {
    /// Ethernet [+ 802.1Q] + IP + UDP + BTH, as `FrameRepr::emit` writes them.
    hdr: [u8; MAX_HDR],
    /// Bytes of `hdr` in use.
    hdr_len: u8,
    ip_off: u8,
    ipv6: bool,
    /// IPv4: the 16-bit words of the header except the total length and the checksum,
    /// summed (not folded): the checksum is this plus the total length, folded.
    ip4_sum: u32,
    /// BTH byte 1 without SE and PadCnt (MigReq, TVer 0), and byte 8 without AckReq.
    bth1: u8,
    bth8: u8,
    /// The ICRC state of the IP + UDP + BTH header with the bytes the template patches
    /// zeroed ([`icrc::patch_header_state`] adds them per packet).
    hdr_crc: u32,
}

impl FrameTemplate {
    /// The template of frames with these headers. Per-packet BTH fields of `bth` (opcode,
    /// SE, PadCnt, AckReq, PSN) are ignored.
    pub fn new(eth: EthRepr, ip: IpRepr, udp: UdpRepr, bth: &BthRepr) -> Self {
        let frame = FrameRepr {
            eth,
            ip,
            udp,
            roce: RoceRepr {
                bth: BthRepr {
                    // No extension header, payload allowed (and empty here).
                    opcode: Opcode::RC_WRITE_MIDDLE,
                    solicited: false,
                    pad_count: 0,
                    ack_req: false,
                    psn: Psn::new(0),
                    ..*bth
                },
                ext: ExtHeaders::default(),
                payload: &[],
            },
        };
        let mut buf = [0u8; MAX_HDR + icrc::LEN];
        let n = frame
            .emit(&mut buf)
            .expect("a header-only frame always fits MAX_HDR + ICRC");
        let hdr_len = n - icrc::LEN;
        let ip_off = ETH_LEN + if eth.vlan_tci.is_some() { VLAN_LEN } else { 0 };
        let ipv6 = matches!(ip, IpRepr::V6 { .. });
        let mut hdr = [0u8; MAX_HDR];
        hdr[..hdr_len].copy_from_slice(&buf[..hdr_len]);
        let ip4_sum = if ipv6 {
            0
        } else {
            hdr[ip_off..ip_off + IPV4_LEN]
                .chunks_exact(2)
                .enumerate()
                // Word 1 is the total length, word 5 the checksum.
                .filter(|&(i, _)| i != 1 && i != 5)
                .map(|(_, w)| u32::from(u16::from_be_bytes([w[0], w[1]])))
                .sum()
        };
        let bth_off = hdr_len - BTH_LEN;
        let ip_hdr_len = if ipv6 { IPV6_LEN } else { IPV4_LEN };
        let mut zeroed = hdr;
        let z = &mut zeroed[ip_off..hdr_len];
        let ip_len_at = if ipv6 { 4 } else { 2 };
        for at in [ip_len_at, ip_len_at + 1, ip_hdr_len + 4, ip_hdr_len + 5] {
            z[at] = 0;
        }
        let bth_z = ip_hdr_len + UDP_LEN;
        for at in [0, 1, 8, 9, 10, 11] {
            z[bth_z + at] = 0;
        }
        let hdr_crc = icrc::header_state(ipv6, ip_hdr_len, z);
        FrameTemplate {
            hdr,
            hdr_len: hdr_len as u8,
            ip_off: ip_off as u8,
            ipv6,
            ip4_sum,
            bth1: hdr[bth_off + 1] & !0xb0,
            bth8: hdr[bth_off + 8] & 0x7f,
            hdr_crc,
        }
    }

    /// True for IPv6 frames.
    pub fn is_ipv6(&self) -> bool {
        self.ipv6
    }

    /// The header bytes (Ethernet to BTH) with the per-packet fields of the template's
    /// own frame; for inspection.
    pub fn header(&self) -> &[u8] {
        &self.hdr[..usize::from(self.hdr_len)]
    }

    /// Write one frame into the front of `out`, as `FrameRepr::emit` would for the
    /// template's headers with these per-packet fields. Returns the number of bytes.
    /// `ext` is an [`ExtHeaders`] or any other [`ExtWriter`].
    #[inline(always)]
    pub fn emit<X: ExtWriter + ?Sized>(
        &self,
        bth: BthFields,
        ext: &X,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<usize, Error> {
        let BthFields {
            opcode,
            psn,
            ack_req,
            solicited,
        } = bth;
        // The check of `RoceRepr::check`, as one comparison; on a mismatch the general
        // path names the culprit with the same error.
        let info = match opcode.info() {
            Some(i)
                if ext.present() == i.exts.bits() & !Ext::CnpPad.bit()
                    && (i.has_payload || payload.is_empty()) =>
            {
                i
            }
            _ => return Err(self.check_error(opcode, ext, payload)),
        };
        let hdr_len = usize::from(self.hdr_len);
        let ip_off = usize::from(self.ip_off);
        let pad = (4 - payload.len() % 4) % 4;
        let roce_len = BTH_LEN + info.ext_len() + payload.len() + pad + icrc::LEN;
        let total = hdr_len - BTH_LEN + roce_len;
        if out.len() < total {
            return Err(Error::BufferTooSmall {
                needed: total,
                available: out.len(),
            });
        }
        let ip_hdr_len = if self.ipv6 { IPV6_LEN } else { IPV4_LEN };
        let ip_payload = UDP_LEN + roce_len;
        let ip_len = if self.ipv6 {
            ip_payload
        } else {
            ip_hdr_len + ip_payload
        };
        let ip_len = u16::try_from(ip_len).map_err(|_| Error::TooLong { len: total })?;
        let out = &mut out[..total];
        if total >= MAX_HDR {
            // A fixed-size copy (a few vector moves, no call): what lies past `hdr_len`
            // is overwritten below by the extension headers, payload, pad and ICRC,
            // which fill `hdr_len..total`.
            out[..MAX_HDR].copy_from_slice(&self.hdr);
        } else {
            out[..hdr_len].copy_from_slice(&self.hdr[..hdr_len]);
        }
        if self.ipv6 {
            out[ip_off + 4..ip_off + 6].copy_from_slice(&ip_len.to_be_bytes());
        } else {
            // At most nine 16-bit words: two folds bring the sum to 16 bits.
            let sum = self.ip4_sum + u32::from(ip_len);
            let sum = (sum & 0xffff) + (sum >> 16);
            let sum = (sum & 0xffff) + (sum >> 16);
            out[ip_off + 2..ip_off + 4].copy_from_slice(&ip_len.to_be_bytes());
            out[ip_off + 10..ip_off + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        }
        // The UDP length fits: the IP length check above bounded it.
        let udp_off = ip_off + ip_hdr_len;
        out[udp_off + 4..udp_off + 6].copy_from_slice(&(ip_payload as u16).to_be_bytes());
        let bth = hdr_len - BTH_LEN;
        let patch = icrc::HeaderPatch {
            ip_len,
            udp_len: ip_payload as u16,
            bth0: opcode.0,
            bth1: self.bth1 | (u8::from(solicited) << 7) | ((pad as u8) << 4),
            bth8: self.bth8 | (u8::from(ack_req) << 7),
            psn: psn.value(),
        };
        out[bth] = patch.bth0;
        out[bth + 1] = patch.bth1;
        out[bth + 8] = patch.bth8;
        out[bth + 9..bth + 12].copy_from_slice(&psn.value().to_be_bytes()[1..]);
        let mut off = hdr_len;
        for e in info.exts.iter() {
            let n = e.wire_len();
            // Present: the check above compared the set with the opcode's.
            ext.write(e, &mut out[off..off + n]);
            off += n;
        }
        let hdr_end = off;
        let n = payload.len();
        out[off..off + n].copy_from_slice(payload);
        off += n;
        if pad != 0 {
            out[off..off + pad].fill(0);
            off += pad;
        }
        // The payload hashed from its source beside its copy, as `FrameRepr::emit` does
        // (icrc::compute_split). The header's part comes from the template's state and
        // the patched fields (icrc::patch_header_state), not from hashing the header
        // just written; the extension headers (an ACK's AETH, a RETH), written just
        // above, are hashed in front of the payload.
        let h = icrc::patch_header_state(self.ipv6, self.hdr_crc, &patch);
        let fast = icrc::compute_from_header_state_ext(h, &out[hdr_len..hdr_end], payload, pad);
        let crc = fast.unwrap_or_else(|| {
            icrc::compute_split(self.ipv6, ip_hdr_len, &out[ip_off..hdr_end], payload, pad)
        });
        out[off..off + icrc::LEN].copy_from_slice(&crc.to_le_bytes());
        Ok(off + icrc::LEN)
    }

    /// The error `RoceRepr::check` gives for these fields (slow path only).
    fn check_error<X: ExtWriter + ?Sized>(&self, opcode: Opcode, ext: &X, payload: &[u8]) -> Error {
        let bth = hdr_bth(self);
        let roce = RoceRepr {
            bth: BthRepr { opcode, ..bth },
            ext: ext.to_headers(),
            payload,
        };
        match roce.check() {
            Err(e) => e,
            // Unreachable: the fast check and `check` agree; say so rather than panic.
            Ok(_) => Error::UnknownOpcode {
                offset: 0,
                opcode: opcode.0,
            },
        }
    }
}

/// The template's own BTH, read back (slow path only).
fn hdr_bth(t: &FrameTemplate) -> BthRepr {
    let o = usize::from(t.hdr_len) - BTH_LEN;
    BthRepr::from_view(&super::Bth::new_unchecked(&t.hdr[o..o + BTH_LEN]))
}

/// Extension headers as [`FrameTemplate::emit`] writes them: [`ExtHeaders`], or a
/// smaller type of the caller's that holds only what its packets carry.
pub trait ExtWriter {
    /// The headers present, as `ExtSet` bits (`Ext::bit`).
    fn present(&self) -> u16;
    /// Write header `e`, which is present, into `out` (exactly `e.wire_len()` bytes),
    /// as `FrameRepr::emit` writes it.
    fn write(&self, e: Ext, out: &mut [u8]);
    /// The same headers as an [`ExtHeaders`] (for the error path).
    fn to_headers(&self) -> ExtHeaders;
}

impl ExtWriter for ExtHeaders {
    fn present(&self) -> u16 {
        self.present_bits()
    }

    fn write(&self, e: Ext, b: &mut [u8]) {
        match e {
            Ext::Reth => self.reth.unwrap_or_default().emit(b),
            Ext::AtomicEth => self.atomic.unwrap_or_default().emit(b),
            Ext::ImmDt => b.copy_from_slice(&self.immdt.unwrap_or(0).to_be_bytes()),
            Ext::Ieth => b.copy_from_slice(&self.ieth.unwrap_or_default().0.to_be_bytes()),
            Ext::Aeth => match self.aeth {
                Some(a) => a.emit(b),
                None => b.fill(0),
            },
            Ext::AtomicAckEth => self.atomic_ack.unwrap_or_default().emit(b),
            Ext::Deth => self.deth.unwrap_or_default().emit(b),
            Ext::Feth => self.feth.unwrap_or_default().emit(b),
            Ext::CnpPad => b.fill(0),
        }
    }

    fn to_headers(&self) -> ExtHeaders {
        *self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{
        AethRepr, AtomicAckEthRepr, AtomicEthRepr, DethRepr, FethRepr, Msn, OPCODE_ROWS, PKey, Qpn,
        RethRepr, Rkey, Syndrome,
    };
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn random_headers(r: &mut ChaCha8Rng) -> (EthRepr, IpRepr, UdpRepr, BthRepr) {
        let mut mac = || {
            let mut m = [0u8; 6];
            r.fill(&mut m);
            m
        };
        let eth = EthRepr {
            dst: mac(),
            src: mac(),
            vlan_tci: None,
        };
        let eth = EthRepr {
            vlan_tci: r.random_bool(0.3).then(|| r.random()),
            ..eth
        };
        let ip = if r.random_bool(0.5) {
            IpRepr::V4 {
                src: r.random(),
                dst: r.random(),
                tos: r.random(),
                identification: r.random(),
                dont_fragment: r.random(),
                ttl: r.random(),
            }
        } else {
            IpRepr::V6 {
                src: r.random(),
                dst: r.random(),
                traffic_class: r.random(),
                flow_label: r.random::<u32>() & 0xf_ffff,
                hop_limit: r.random(),
            }
        };
        let udp = UdpRepr {
            src_port: r.random(),
            checksum: if r.random_bool(0.5) { 0 } else { r.random() },
        };
        let bth = BthRepr {
            opcode: Opcode(r.random()),
            solicited: r.random(),
            mig_req: r.random(),
            pad_count: r.random_range(0..4),
            pkey: if r.random_bool(0.5) {
                PKey::DEFAULT
            } else {
                PKey(r.random())
            },
            fecn: r.random(),
            becn: r.random(),
            resv6: r.random_range(0..64),
            dest_qp: Qpn::new(r.random::<u32>() & 0xff_ffff),
            ack_req: r.random(),
            resv7: r.random_range(0..128),
            psn: Psn::new(r.random::<u32>() & 0xff_ffff),
        };
        (eth, ip, udp, bth)
    }

    /// The extension headers `op` needs, with random contents; sometimes one too many or
    /// one missing, to compare the errors too.
    fn random_ext(r: &mut ChaCha8Rng, op: Opcode) -> ExtHeaders {
        let want = op.info().map_or(crate::wire::ExtSet::EMPTY, |i| i.exts);
        let mut ext = ExtHeaders::default();
        for e in Ext::ORDER {
            let mut on = want.has(e);
            if r.random_bool(0.03) {
                on = !on;
            }
            if !on {
                continue;
            }
            match e {
                Ext::Deth => {
                    ext.deth = Some(DethRepr {
                        qkey: r.random(),
                        src_qp: Qpn::new(r.random::<u32>() & 0xff_ffff),
                    })
                }
                Ext::Feth => ext.feth = Some(FethRepr::parse(&r.random::<[u8; 4]>())),
                Ext::Reth => {
                    ext.reth = Some(RethRepr {
                        va: r.random(),
                        rkey: Rkey(r.random()),
                        dma_len: r.random(),
                    })
                }
                Ext::AtomicEth => {
                    ext.atomic = Some(AtomicEthRepr {
                        va: r.random(),
                        rkey: Rkey(r.random()),
                        swap_add: r.random(),
                        compare: r.random(),
                    })
                }
                Ext::ImmDt => ext.immdt = Some(r.random()),
                Ext::Ieth => ext.ieth = Some(Rkey(r.random())),
                Ext::Aeth => {
                    ext.aeth = Some(AethRepr {
                        syndrome: Syndrome::from_byte(r.random()),
                        msn: Msn::new(r.random::<u32>() & 0xff_ffff),
                    })
                }
                Ext::AtomicAckEth => ext.atomic_ack = Some(AtomicAckEthRepr { orig: r.random() }),
                Ext::CnpPad => {}
            }
        }
        ext
    }

    #[test]
    fn template_emits_what_frame_repr_emits() {
        let mut r = ChaCha8Rng::seed_from_u64(0x7e3f);
        let payload_src: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let (mut ok, mut errs) = (0, 0);
        for round in 0..4000 {
            let (eth, ip, udp, fixed) = random_headers(&mut r);
            let t = FrameTemplate::new(eth, ip, udp, &fixed);
            for _ in 0..4 {
                // Mostly real opcodes, sometimes an unknown one.
                let opcode = if r.random_bool(0.95) {
                    Opcode(OPCODE_ROWS[r.random_range(0..OPCODE_ROWS.len())].code)
                } else {
                    Opcode(r.random())
                };
                let ext = random_ext(&mut r, opcode);
                let len = match r.random_range(0..4) {
                    // Past what an IP length field holds: TooLong from both.
                    _ if round % 97 == 0 => 65_530,
                    0 => r.random_range(0..8),
                    1 => r.random_range(0..5000),
                    2 => [256, 1024, 4096][r.random_range(0..3)],
                    _ => 0,
                };
                let payload = &payload_src[..len];
                let (solicited, ack_req) = (r.random(), r.random());
                let psn = Psn::new(r.random::<u32>() & 0xff_ffff);
                let repr = FrameRepr {
                    eth,
                    ip,
                    udp,
                    roce: RoceRepr {
                        bth: BthRepr {
                            opcode,
                            solicited,
                            ack_req,
                            psn,
                            ..fixed
                        },
                        ext,
                        payload,
                    },
                };
                // Sometimes too small a buffer; junk-filled so unset bytes show.
                let cap = if round % 50 == 0 {
                    r.random_range(0..6000)
                } else {
                    len + 200
                };
                let mut a = vec![0xa5u8; cap];
                let mut b = vec![0x5au8; cap];
                let ra = repr.emit(&mut a);
                let f = BthFields {
                    opcode,
                    psn,
                    ack_req,
                    solicited,
                };
                let rb = t.emit(f, &ext, payload, &mut b);
                assert_eq!(ra, rb, "{repr:?}");
                match ra {
                    Ok(n) => {
                        assert_eq!(a[..n], b[..n], "{repr:?}");
                        ok += 1;
                    }
                    Err(_) => errs += 1,
                }
            }
        }
        // Both outcomes were exercised.
        assert!(ok > 10_000 && errs > 100, "ok {ok} errors {errs}");
    }

    #[test]
    fn template_frames_parse_and_verify() {
        let mut r = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..200 {
            let (eth, ip, udp, fixed) = random_headers(&mut r);
            let t = FrameTemplate::new(eth, ip, udp, &fixed);
            let mut out = [0u8; 1200];
            let ext = ExtHeaders {
                reth: Some(RethRepr {
                    va: 0x1000,
                    rkey: Rkey(7),
                    dma_len: 1001,
                }),
                ..ExtHeaders::default()
            };
            let n = t
                .emit(
                    BthFields {
                        opcode: Opcode::RC_WRITE_FIRST,
                        psn: Psn::new(5),
                        ack_req: true,
                        solicited: false,
                    },
                    &ext,
                    &[9; 1001],
                    &mut out,
                )
                .unwrap();
            let f = FrameRepr::parse(&out[..n]).unwrap();
            assert_eq!(f.roce.bth.psn, Psn::new(5));
            assert_eq!(f.roce.bth.dest_qp, fixed.dest_qp);
            assert_eq!(f.roce.ext.reth, ext.reth);
            assert_eq!(f.roce.payload, &[9; 1001][..]);
            assert_eq!(f.ip, ip);
        }
    }
}
