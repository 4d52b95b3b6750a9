//! `xrnic decode FILE`: print the RoCE packets (v2, and v1 read only) of a pcap or pcapng
//! capture, one line (or one JSON object) per packet.
//!
//! Contract:
//! - Every frame of the file is looked at. Frames that are not Ethernet, or not UDP to port
//!   4791, are skipped (and counted). A frame that *is* UDP/4791 always gets a line: fully
//!   decoded when [`FrameView::parse`] accepts it (even with a bad ICRC, which is then shown
//!   with both values), otherwise with the precise [`wire::Error`](crate::wire::Error) and
//!   whatever BTH fields the bytes present still show.
//! - Decoding never panics, whatever the file holds; an unreadable file is a
//!   [`DecodeError`], never a partial listing.
//! - Exit codes (see [`run`]): 0 when the file was read, even if packets were bad; 1 when
//!   the file cannot be read, or with `--strict` when any RoCE packet had a bad ICRC or was
//!   malformed; 2 for command-line mistakes (clap's convention).
//!
//! - RoCE v1 frames (EtherType 0x8915: GRH + BTH, IBTA vol. 1 annex A16) are decoded
//!   too, with their GRH and their ICRC checked ([`crate::wire::V1View`]); they are
//!   decoded only: xrnic's engine carries RoCE v2 and drops them. The summary line says so.
//! - Opcodes of Mellanox/NVIDIA's Dynamically Connected transport (the opcode class IBTA
//!   gives RD, [`crate::wire::VendorOp`]) are named, their ICRC checked; the vendor headers
//!   after the BTH are not decoded. They count as vendor packets, not as malformed ones.
//!
//! The ICRC is shown as its four bytes in wire order (as Wireshark's "Invariant CRC"
//! shows it), not as the CRC register value, which is their little-endian reading (IBTA
//! RoCE v2 annex A17.4.1; docs/wire-format.md §3).

use std::fmt::{self, Write as _};
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use etherparse::{LaxNetSlice, LaxSlicedPacket, TransportSlice};
use serde::Serialize;

use crate::io::capture::{self, CaptureError, CapturedFrame};
use crate::wire::{
    AethRepr, Bth, Error as WireError, ExtHeaders, FrameView, GRH_LEN, GrhRepr, IpRepr, NakCode,
    NotRoce, Opcode, Operation, ROCE_V1_ETHERTYPE, ROCE_V2_PORT, Syndrome, V1View, VendorOp,
    aeth_credits, datagram_icrc, ip_offset, rnr_timer_ns,
};

/// Arguments of `xrnic decode`.
#[derive(Clone, Debug, clap::Args)]
pub struct DecodeArgs {
    /// A pcap or pcapng capture (Ethernet link type), e.g. from tcpdump or Wireshark.
    pub file: PathBuf,
    /// Print one JSON object per RoCE packet instead of text (no summary line).
    #[arg(long)]
    pub json: bool,
    /// Exit with status 1 when any RoCE packet has a bad ICRC or is malformed.
    #[arg(long)]
    pub strict: bool,
}

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// The file could not be read as a capture.
#[derive(Debug)]
pub struct DecodeError {
    pub path: PathBuf,
    pub source: CaptureError,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot read {}: ", self.path.display())?;
        match &self.source {
            // pcap-file reports a record cut short as a bare EOF; say what it means.
            CaptureError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                f.write_str("the file ends in the middle of a capture record (truncated capture?)")
            }
            other => write!(f, "{other}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Counts over one file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Every frame in the file.
    pub packets: usize,
    /// Frames that are UDP to port 4791 or RoCE v1 (EtherType 0x8915), malformed ones
    /// included.
    pub roce: usize,
    /// RoCE packets that parsed but whose ICRC is wrong.
    pub bad_icrc: usize,
    /// RoCE packets that did not parse.
    pub malformed: usize,
    /// Frames on a link type other than Ethernet (not looked into).
    pub not_ethernet: usize,
    /// RoCE packets that are RoCE v1 (EtherType 0x8915), malformed ones included.
    pub roce_v1: usize,
    /// RoCE packets with a vendor opcode (named, not decoded further).
    pub vendor: usize,
}

impl Summary {
    /// True when every RoCE packet parsed and carried a correct ICRC.
    pub fn all_good(&self) -> bool {
        self.bad_icrc == 0 && self.malformed == 0
    }

    fn count(&mut self, o: &Outcome) {
        self.packets += 1;
        match o {
            Outcome::NotEthernet => self.not_ethernet += 1,
            Outcome::NotRoce => {}
            Outcome::Roce(p) => {
                self.roce += 1;
                self.roce_v1 += usize::from(p.roce_v1);
                self.vendor += usize::from(p.vendor.is_some());
                if p.error.is_some() {
                    self.malformed += 1;
                } else if p.icrc_ok == Some(false) {
                    self.bad_icrc += 1;
                }
            }
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "summary: {} packets, {} RoCE, {} bad ICRC, {} malformed",
            self.packets, self.roce, self.bad_icrc, self.malformed
        )?;
        if self.not_ethernet > 0 {
            write!(f, ", {} not Ethernet (skipped)", self.not_ethernet)?;
        }
        if self.roce_v1 > 0 {
            write!(
                f,
                ", {} RoCE v1 (decoded only: xrnic carries RoCE v2)",
                self.roce_v1
            )?;
        }
        if self.vendor > 0 {
            write!(f, ", {} vendor opcode (not decoded further)", self.vendor)?;
        }
        Ok(())
    }
}

/// What one captured frame turned out to be.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Captured on a non-Ethernet link (e.g. Linux cooked capture): not looked into.
    NotEthernet,
    /// Ethernet, but not UDP to port 4791.
    NotRoce,
    /// UDP/4791: decoded, or malformed with its error.
    Roce(Box<Packet>),
}

/// 802.1Q tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Vlan {
    pub id: u16,
    pub pcp: u8,
    pub dei: bool,
}

impl Vlan {
    fn from_tci(tci: u16) -> Self {
        Vlan {
            id: tci & 0x0fff,
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
        }
    }
}

/// RETH (IBTA 9.3.3): target of an RDMA WRITE / READ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RethJson {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

/// AETH (IBTA vol. 1 §9.3.5; syndrome encoding §9.7.5.2, docs/wire-format.md §4): the syndrome split into its
/// meaning, and the MSN.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AethJson {
    /// The raw syndrome byte.
    pub syndrome: u8,
    /// "ACK", "RNR_NAK", "NAK" or "reserved".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// ACK: credit code (31 = unlimited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credit_code: Option<u8>,
    /// ACK: credits the code stands for; absent when unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credits: Option<u32>,
    /// RNR NAK: the timer code and what it means.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rnr_timer: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rnr_timer_ms: Option<f64>,
    /// NAK: the code and its name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nak_code: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nak_name: Option<&'static str>,
    /// The syndrome in words, as the text output shows it.
    pub meaning: String,
    pub msn: u32,
}

impl AethJson {
    fn new(a: &AethRepr) -> Self {
        let mut j = AethJson {
            syndrome: a.syndrome.to_byte(),
            kind: "reserved",
            credit_code: None,
            credits: None,
            rnr_timer: None,
            rnr_timer_ms: None,
            nak_code: None,
            nak_name: None,
            meaning: String::new(),
            msn: a.msn.value(),
        };
        match a.syndrome {
            Syndrome::Ack { credit_code } => {
                j.kind = "ACK";
                j.credit_code = Some(credit_code);
                j.credits = aeth_credits(credit_code);
                j.meaning = match j.credits {
                    Some(n) => format!("ACK credits {n}"),
                    None => "ACK credits unlimited".into(),
                };
            }
            Syndrome::RnrNak { timer } => {
                let ms = rnr_timer_ns(timer) as f64 / 1e6;
                j.kind = "RNR_NAK";
                j.rnr_timer = Some(timer);
                j.rnr_timer_ms = Some(ms);
                j.meaning = format!("RNR NAK timer {timer} ({ms} ms)");
            }
            Syndrome::Nak(code) => {
                j.kind = "NAK";
                j.nak_code = Some(code.code());
                j.nak_name = Some(code.name());
                j.meaning = match code {
                    NakCode::Reserved(c) => format!("NAK reserved code {c}"),
                    _ => format!("NAK {}", code.name()),
                };
            }
            Syndrome::Reserved(b) => j.meaning = format!("reserved syndrome {b:#04x}"),
        }
        j
    }
}

/// AtomicETH (IBTA 9.3.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AtomicJson {
    pub va: u64,
    pub rkey: u32,
    /// Swap value (CmpSwap) or addend (FetchAdd).
    pub swap_add: u64,
    /// Compare value (CmpSwap only; FetchAdd carries it but ignores it).
    pub compare: u64,
}

/// AtomicAckETH (IBTA 9.3.6): the original remote value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AtomicAckJson {
    pub orig: u64,
}

/// ImmDt (IBTA 9.3.7): 4 bytes of immediate data, shown as a big-endian number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ImmDtJson {
    pub data: u32,
}

/// IETH (IBTA 9.3.8): the R_Key to invalidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct IethJson {
    pub rkey: u32,
}

/// DETH (IBTA 9.3.2): datagram Q_Key and source QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DethJson {
    pub qkey: u32,
    pub src_qp: u32,
}

/// FETH (IBTA 1.5 FLUSH).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FethJson {
    pub selectivity: u8,
    pub placement_type: u8,
}

/// The GRH of a RoCE v1 packet (IBTA vol. 1 §8.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GrhJson {
    pub ip_version: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub payload_len: u16,
    pub next_header: u8,
    pub hop_limit: u8,
}

/// One RoCE packet as `--json` prints it (and the text line is made from).
///
/// The BTH fields are `null` only for a malformed packet too short to hold a BTH;
/// `icrc_ok` is `null` for a malformed packet (the ICRC cannot be located reliably).
/// Extended headers appear exactly when the opcode carries them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Packet {
    /// 1-based frame number in the file (as Wireshark numbers frames).
    pub frame: usize,
    /// RoCE v1 (EtherType 0x8915, GRH): `src` and `dst` are then the GIDs, and `grh` holds
    /// the rest of the GRH. Decoded only: xrnic carries RoCE v2.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub roce_v1: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grh: Option<GrhJson>,
    /// Who defines the opcode, when it is a vendor's ([`VendorOp`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendor: Option<&'static str>,
    /// Capture time, seconds since the Unix epoch.
    pub time: f64,
    /// Captured bytes of the frame.
    pub len: usize,
    pub ip_version: Option<u8>,
    pub src: Option<String>,
    pub dst: Option<String>,
    pub udp_src_port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan: Option<Vlan>,
    /// IP DSCP (6 bits).
    pub dscp: Option<u8>,
    /// IP ECN (0 Not-ECT, 1 ECT(1), 2 ECT(0), 3 CE).
    pub ecn: Option<u8>,
    pub opcode: Option<u8>,
    pub opcode_name: Option<&'static str>,
    pub se: Option<bool>,
    pub mig_req: Option<bool>,
    pub pad: Option<u8>,
    pub pkey: Option<u16>,
    pub fecn: Option<bool>,
    pub becn: Option<bool>,
    /// The six reserved bits of BTH byte 4. Huawei hiroce sets 0x10 in them (docs/wire-format.md §5);
    /// they are masked in the ICRC and ignored on receive.
    pub resv6: Option<u8>,
    pub dest_qp: Option<u32>,
    pub ack_req: Option<bool>,
    /// The seven reserved bits of BTH byte 8.
    pub resv7: Option<u8>,
    pub psn: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deth: Option<DethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feth: Option<FethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reth: Option<RethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic: Option<AtomicJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub immdt: Option<ImmDtJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ieth: Option<IethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aeth: Option<AethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic_ack: Option<AtomicAckJson>,
    /// Payload bytes, without pad.
    pub payload_len: Option<usize>,
    pub icrc_ok: Option<bool>,
    /// The ICRC on the wire, its four bytes in wire order as hex.
    pub icrc: Option<String>,
    /// The ICRC computed over the packet (same byte order), when it differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icrc_computed: Option<String>,
    /// Why the packet is malformed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The ICRC register value as its four wire bytes, in hex.
fn icrc_hex(v: u32) -> String {
    let b = v.to_le_bytes();
    format!("{:02x}{:02x}{:02x}{:02x}", b[0], b[1], b[2], b[3])
}

impl Packet {
    fn empty(f: &CapturedFrame) -> Packet {
        Packet {
            frame: f.number,
            roce_v1: false,
            grh: None,
            vendor: None,
            time: f.timestamp.as_secs_f64(),
            len: f.data.len(),
            ip_version: None,
            src: None,
            dst: None,
            udp_src_port: None,
            vlan: None,
            dscp: None,
            ecn: None,
            opcode: None,
            opcode_name: None,
            se: None,
            mig_req: None,
            pad: None,
            pkey: None,
            fecn: None,
            becn: None,
            resv6: None,
            dest_qp: None,
            ack_req: None,
            resv7: None,
            psn: None,
            deth: None,
            feth: None,
            reth: None,
            atomic: None,
            immdt: None,
            ieth: None,
            aeth: None,
            atomic_ack: None,
            payload_len: None,
            icrc_ok: None,
            icrc: None,
            icrc_computed: None,
            error: None,
        }
    }

    fn set_bth(&mut self, bth: &Bth<&[u8]>) {
        let op = bth.opcode();
        self.opcode = Some(op.0);
        self.opcode_name = Some(match (op.info(), vendor_op(bth)) {
            (Some(i), _) => i.name,
            (None, Some(v)) => v.name,
            (None, None) => "unknown",
        });
        self.se = Some(bth.solicited());
        self.mig_req = Some(bth.mig_req());
        self.pad = Some(bth.pad_count());
        self.pkey = Some(bth.pkey().0);
        self.fecn = Some(bth.fecn());
        self.becn = Some(bth.becn());
        self.resv6 = Some(bth.resv6());
        self.dest_qp = Some(bth.dest_qp().value());
        self.ack_req = Some(bth.ack_req());
        self.resv7 = Some(bth.resv7());
        self.psn = Some(bth.psn().value());
    }

    /// A frame that parsed: decode everything and check the ICRC.
    fn from_view(f: &CapturedFrame, v: &FrameView<'_>) -> Packet {
        let mut p = Packet::empty(f);
        let r = v.repr();
        let (src, dst, tos) = match r.ip {
            IpRepr::V4 { src, dst, tos, .. } => (
                IpAddr::V4(Ipv4Addr::from(src)),
                IpAddr::V4(Ipv4Addr::from(dst)),
                tos,
            ),
            IpRepr::V6 {
                src,
                dst,
                traffic_class,
                ..
            } => (
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
                traffic_class,
            ),
        };
        p.ip_version = Some(r.ip.version());
        p.src = Some(src.to_string());
        p.dst = Some(dst.to_string());
        p.udp_src_port = Some(r.udp.src_port);
        p.vlan = r.eth.vlan_tci.map(Vlan::from_tci);
        p.dscp = Some(tos >> 2);
        p.ecn = Some(r.ip.ecn());
        p.set_bth(&v.bth());
        p.set_ext(&r.roce.ext);
        p.payload_len = Some(v.payload().len());
        p.set_icrc(v.icrc_wire(), v.icrc_computed());
        p
    }

    fn set_ext(&mut self, x: &ExtHeaders) {
        let p = self;
        p.deth = x.deth.map(|d| DethJson {
            qkey: d.qkey,
            src_qp: d.src_qp.value(),
        });
        p.feth = x.feth.map(|d| FethJson {
            selectivity: d.selectivity,
            placement_type: d.placement_type,
        });
        p.reth = x.reth.map(|d| RethJson {
            va: d.va,
            rkey: d.rkey.0,
            dma_len: d.dma_len,
        });
        p.atomic = x.atomic.map(|d| AtomicJson {
            va: d.va,
            rkey: d.rkey.0,
            swap_add: d.swap_add,
            compare: d.compare,
        });
        p.immdt = x.immdt.map(|data| ImmDtJson { data });
        p.ieth = x.ieth.map(|k| IethJson { rkey: k.0 });
        p.aeth = x.aeth.as_ref().map(AethJson::new);
        p.atomic_ack = x.atomic_ack.map(|d| AtomicAckJson { orig: d.orig });
    }

    fn set_icrc(&mut self, wire: u32, computed: u32) {
        self.icrc_ok = Some(wire == computed);
        self.icrc = Some(icrc_hex(wire));
        if wire != computed {
            self.icrc_computed = Some(icrc_hex(computed));
        }
    }

    fn set_grh(&mut self, g: &GrhRepr) {
        self.src = Some(Ipv6Addr::from(g.sgid).to_string());
        self.dst = Some(Ipv6Addr::from(g.dgid).to_string());
        self.grh = Some(GrhJson {
            ip_version: g.ip_version,
            traffic_class: g.traffic_class,
            flow_label: g.flow_label,
            payload_len: g.payload_len,
            next_header: g.next_header,
            hop_limit: g.hop_limit,
        });
    }

    /// A RoCE v1 frame (EtherType 0x8915): the GRH and BTH as far as the bytes go, the
    /// transport headers when [`V1View`] accepts them, the ICRC whenever the packet's
    /// extent is known (vendor opcodes included).
    fn from_v1(f: &CapturedFrame) -> Packet {
        let mut p = Packet::empty(f);
        p.roce_v1 = true;
        p.vlan = crate::wire::vlan_tci(&f.data).map(Vlan::from_tci);
        let grh_off = ip_offset(&f.data);
        if let Some(g) = f.data.get(grh_off..grh_off + GRH_LEN) {
            if let Ok(g) = <&[u8; GRH_LEN]>::try_from(g) {
                p.set_grh(&GrhRepr::parse(g));
            }
        }
        let v = match V1View::parse(&f.data) {
            Ok(v) => v,
            Err(e) => {
                let bth_off = grh_off + GRH_LEN;
                if let Ok(bth) = Bth::new_checked(f.data.get(bth_off..).unwrap_or(&[]), 0) {
                    p.set_bth(&bth);
                }
                p.error = Some(e.to_string());
                return p;
            }
        };
        let bth = v.bth();
        p.set_bth(&bth);
        match v.transport() {
            Ok(t) => {
                p.set_ext(&t.ext);
                p.payload_len = Some(t.payload.len());
            }
            Err(e) => match vendor_op(&bth) {
                Some(op) => p.vendor = Some(op.vendor),
                None => {
                    p.error = Some(e.to_string());
                    return p;
                }
            },
        }
        p.set_icrc(v.icrc_wire(), v.icrc_computed());
        p
    }

    /// A frame [`FrameView::parse`] rejected. It gets a line only when it is UDP to port
    /// 4791 as far as its bytes show (an IPv4 checksum error on a TCP segment is not ours);
    /// then addresses and BTH come from a lenient parse, as far as the bytes go.
    fn malformed(f: &CapturedFrame, err: &WireError) -> Option<Packet> {
        let lax = LaxSlicedPacket::from_ethernet(&f.data).ok()?;
        let Some(TransportSlice::Udp(udp)) = &lax.transport else {
            return None;
        };
        if udp.destination_port() != ROCE_V2_PORT {
            return None;
        }
        let mut p = Packet::empty(f);
        match &lax.net {
            Some(LaxNetSlice::Ipv4(ip)) => {
                let h = ip.header();
                p.ip_version = Some(4);
                p.src = Some(h.source_addr().to_string());
                p.dst = Some(h.destination_addr().to_string());
                p.dscp = Some(h.dcp().value());
                p.ecn = Some(h.ecn().value());
            }
            Some(LaxNetSlice::Ipv6(ip)) => {
                let h = ip.header();
                p.ip_version = Some(6);
                p.src = Some(h.source_addr().to_string());
                p.dst = Some(h.destination_addr().to_string());
                p.dscp = Some(h.traffic_class() >> 2);
                p.ecn = Some(h.traffic_class() & 3);
            }
            _ => {}
        }
        p.udp_src_port = Some(udp.source_port());
        // The 802.1Q tag, when the frame has one right after the Ethernet header.
        p.vlan = crate::wire::vlan_tci(&f.data).map(Vlan::from_tci);
        if let Ok(bth) = Bth::new_checked(udp.payload(), 0) {
            p.set_bth(&bth);
            // A vendor opcode the engine does not take: named, its ICRC checked.
            if let (WireError::UnknownOpcode { .. }, Some(op), Some((wire, computed))) =
                (err, vendor_op(&bth), datagram_icrc(&f.data))
            {
                p.vendor = Some(op.vendor);
                p.set_icrc(wire, computed);
                return Some(p);
            }
        }
        p.error = Some(err.to_string());
        Some(p)
    }
}

/// The vendor opcode a BTH carries, if any.
fn vendor_op(bth: &Bth<&[u8]>) -> Option<VendorOp> {
    bth.opcode().vendor(u8::from(bth.solicited()) << 7)
}

/// Classify and decode one captured frame.
pub fn decode_frame(f: &CapturedFrame) -> Outcome {
    if !f.ethernet {
        return Outcome::NotEthernet;
    }
    match FrameView::parse(&f.data) {
        Ok(v) => Outcome::Roce(Box::new(Packet::from_view(f, &v))),
        Err(WireError::NotRoce(NotRoce::EtherType(ROCE_V1_ETHERTYPE))) => {
            Outcome::Roce(Box::new(Packet::from_v1(f)))
        }
        Err(WireError::NotRoce(_)) => Outcome::NotRoce,
        Err(e) => match Packet::malformed(f, &e) {
            Some(p) => Outcome::Roce(Box::new(p)),
            None => Outcome::NotRoce,
        },
    }
}

fn ecn_name(ecn: u8) -> &'static str {
    match ecn & 3 {
        0 => "Not-ECT",
        1 => "ECT(1)",
        2 => "ECT(0)",
        _ => "CE",
    }
}

fn endpoint(addr: &str, port: Option<u16>) -> String {
    let bracket = addr.contains(':');
    match (port, bracket) {
        (Some(p), true) => format!("[{addr}]:{p}"),
        (Some(p), false) => format!("{addr}:{p}"),
        (None, _) => addr.to_string(),
    }
}

impl fmt::Display for Packet {
    /// One line: frame, addresses, opcode, BTH, extended headers, payload, ICRC.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::with_capacity(160);
        let _ = write!(s, "{:>5}", self.frame);
        if self.roce_v1 {
            let _ = write!(s, "  RoCEv1");
        }
        if let (Some(src), Some(dst)) = (&self.src, &self.dst) {
            let _ = write!(s, "  {} > {}", endpoint(src, self.udp_src_port), dst);
        }
        if let Some(v) = self.vlan {
            let _ = write!(s, " vlan {}", v.id);
            if v.pcp != 0 {
                let _ = write!(s, " pcp {}", v.pcp);
            }
        }
        // DSCP 0 / Not-ECT are the common case. A DSCP says which priority the packet
        // travels on (ConnectX CNPs: 48); CE marks drive congestion control (DCQCN,
        // docs/congestion.md).
        if let Some(d) = self.dscp.filter(|d| *d != 0) {
            let _ = write!(s, " dscp {d}");
        }
        if let Some(e) = self.ecn.filter(|e| *e != 0) {
            let _ = write!(s, " ecn {}", ecn_name(e));
        }
        if let Some(g) = self.grh {
            let _ = write!(
                s,
                " GRH tclass {:#04x} flow {:#07x} hop {} paylen {} nxthdr {:#04x}",
                g.traffic_class, g.flow_label, g.hop_limit, g.payload_len, g.next_header
            );
        }
        if let Some(op) = self.opcode {
            let name = self.opcode_name.unwrap_or("unknown");
            let _ = write!(s, "  {name}");
            if Opcode(op).info().is_none() {
                let _ = write!(s, "({op:#04x})");
            }
        }
        if let Some(v) = self.vendor {
            let _ = write!(s, " [vendor: {v}; headers after the BTH not decoded]");
        }
        if let Some(qp) = self.dest_qp {
            let _ = write!(s, " qp {qp:#08x}");
        }
        if let Some(psn) = self.psn {
            let _ = write!(s, " psn {psn}");
        }
        for (on, name) in [
            (self.se, "SE"),
            (self.mig_req, "MigReq"),
            (self.ack_req, "AckReq"),
            (self.fecn, "FECN"),
            (self.becn, "BECN"),
        ] {
            if on == Some(true) {
                let _ = write!(s, " {name}");
            }
        }
        // Reserved bits are shown only when a sender set them (Huawei hiroce does).
        for (v, name) in [(self.resv6, "resv6"), (self.resv7, "resv7")] {
            if let Some(v) = v.filter(|v| *v != 0) {
                let _ = write!(s, " {name} {v:#04x}");
            }
        }
        if let Some(pad) = self.pad.filter(|p| *p != 0) {
            let _ = write!(s, " pad {pad}");
        }
        if let Some(k) = self.pkey.filter(|k| *k != 0xffff) {
            let _ = write!(s, " pkey {k:#06x}");
        }
        if let Some(d) = self.deth {
            let _ = write!(s, "  DETH qkey {:#010x} src_qp {:#08x}", d.qkey, d.src_qp);
        }
        if let Some(d) = self.feth {
            let _ = write!(
                s,
                "  FETH selectivity {} placement {}",
                d.selectivity, d.placement_type
            );
        }
        if let Some(d) = self.reth {
            let _ = write!(
                s,
                "  RETH va {:#x} rkey {:#x} len {}",
                d.va, d.rkey, d.dma_len
            );
        }
        if let Some(d) = self.atomic {
            let _ = write!(s, "  AtomicETH va {:#x} rkey {:#x}", d.va, d.rkey);
            match self
                .opcode
                .and_then(|o| Opcode(o).info())
                .map(|i| i.operation)
            {
                Some(Operation::FetchAdd) => {
                    let _ = write!(s, " add {:#x}", d.swap_add);
                }
                _ => {
                    let _ = write!(s, " compare {:#x} swap {:#x}", d.compare, d.swap_add);
                }
            }
        }
        if let Some(d) = self.immdt {
            let _ = write!(s, "  ImmDt {:#010x}", d.data);
        }
        if let Some(d) = self.ieth {
            let _ = write!(s, "  IETH rkey {:#x}", d.rkey);
        }
        if let Some(d) = &self.aeth {
            let _ = write!(s, "  AETH {} msn {}", d.meaning, d.msn);
        }
        if let Some(d) = self.atomic_ack {
            let _ = write!(s, "  AtomicAckETH orig {:#x}", d.orig);
        }
        // Only for opcodes that carry one: "payload 0" on every ACK is noise.
        let has_payload = self
            .opcode
            .and_then(|o| Opcode(o).info())
            .is_some_and(|i| i.has_payload);
        if let Some(n) = self.payload_len.filter(|_| has_payload) {
            let _ = write!(s, "  payload {n}");
        }
        match (&self.error, self.icrc_ok) {
            (Some(e), _) => {
                let _ = write!(s, "  MALFORMED: {e}");
            }
            (None, Some(true)) => {
                let _ = write!(s, "  ICRC ok");
            }
            (None, _) => {
                let _ = write!(
                    s,
                    "  ICRC BAD: {} on the wire, computed {}",
                    self.icrc.as_deref().unwrap_or("?"),
                    self.icrc_computed.as_deref().unwrap_or("?")
                );
            }
        }
        f.write_str(&s)
    }
}

/// Decode `frames` into `out` and return the counts.
pub fn decode_frames(
    frames: &[CapturedFrame],
    format: Format,
    out: &mut dyn Write,
) -> io::Result<Summary> {
    let mut sum = Summary::default();
    for f in frames {
        let o = decode_frame(f);
        sum.count(&o);
        if let Outcome::Roce(p) = o {
            match format {
                Format::Text => writeln!(out, "{p}")?,
                Format::Json => {
                    serde_json::to_writer(&mut *out, &p).map_err(io::Error::other)?;
                    out.write_all(b"\n")?;
                }
            }
        }
    }
    if format == Format::Text {
        writeln!(out, "{sum}")?;
    }
    out.flush()?;
    Ok(sum)
}

/// Read `path` and decode it into `out`.
///
/// Errors: `Err(DecodeError)` when the file cannot be read; `Ok(Err(io))` when writing
/// failed (e.g. a closed pipe).
pub fn decode_file(
    path: &Path,
    format: Format,
    out: &mut dyn Write,
) -> Result<io::Result<Summary>, DecodeError> {
    let frames = capture::read_file(path).map_err(|source| DecodeError {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(decode_frames(&frames, format, out))
}

/// `xrnic decode`: the whole command, with its exit code.
pub fn run(args: &DecodeArgs) -> ExitCode {
    let format = if args.json {
        Format::Json
    } else {
        Format::Text
    };
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let sum = match decode_file(&args.file, format, &mut out) {
        Err(e) => {
            eprintln!("xrnic decode: {e}");
            return ExitCode::from(1);
        }
        // `xrnic decode big.pcap | head` closes the pipe early: not an error.
        Ok(Err(e)) if e.kind() == io::ErrorKind::BrokenPipe => return ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("xrnic decode: writing output: {e}");
            return ExitCode::from(1);
        }
        Ok(Ok(sum)) => sum,
    };
    if args.strict && !sum.all_good() {
        eprintln!(
            "xrnic decode: --strict: {} RoCE packet(s) with a bad ICRC, {} malformed",
            sum.bad_icrc, sum.malformed
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn frame(data: Vec<u8>) -> CapturedFrame {
        CapturedFrame {
            number: 7,
            timestamp: Duration::from_millis(1500),
            ethernet: true,
            data,
        }
    }

    #[test]
    fn icrc_is_shown_in_wire_byte_order() {
        // The scapy CNP vector's ICRC bytes are 82 fd 00 2a on the wire.
        assert_eq!(
            icrc_hex(u32::from_le_bytes([0x82, 0xfd, 0x00, 0x2a])),
            "82fd002a"
        );
    }

    #[test]
    fn aeth_meanings() {
        use crate::wire::Msn;
        let a = |syndrome| {
            AethJson::new(&AethRepr {
                syndrome,
                msn: Msn::new(9),
            })
        };
        assert_eq!(a(Syndrome::ACK_UNLIMITED).meaning, "ACK credits unlimited");
        assert_eq!(a(Syndrome::ACK_UNLIMITED).credits, None);
        assert_eq!(a(Syndrome::Ack { credit_code: 6 }).credits, Some(8));
        let r = a(Syndrome::RnrNak { timer: 14 });
        assert_eq!(r.meaning, "RNR NAK timer 14 (1.28 ms)");
        assert_eq!(r.rnr_timer_ms, Some(1.28));
        let n = a(Syndrome::Nak(NakCode::RemoteAccessError));
        assert_eq!(n.meaning, "NAK remote access error");
        assert_eq!((n.kind, n.nak_code, n.msn), ("NAK", Some(2), 9));
        assert_eq!(a(Syndrome::Reserved(0x40)).kind, "reserved");
    }

    #[test]
    fn non_udp_garbage_and_non_ethernet_are_skipped() {
        assert_eq!(decode_frame(&frame(vec![])), Outcome::NotRoce);
        assert_eq!(decode_frame(&frame(vec![0xff; 13])), Outcome::NotRoce);
        // ARP.
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(decode_frame(&frame(arp)), Outcome::NotRoce);
        let mut f = frame(vec![0; 60]);
        f.ethernet = false;
        assert_eq!(decode_frame(&f), Outcome::NotEthernet);
    }

    #[test]
    fn summary_counts_and_strictness() {
        let mut s = Summary::default();
        s.count(&Outcome::NotRoce);
        s.count(&Outcome::NotEthernet);
        let mut p = Packet::empty(&frame(vec![]));
        p.icrc_ok = Some(false);
        s.count(&Outcome::Roce(Box::new(p.clone())));
        assert!(!s.all_good());
        p.icrc_ok = None;
        p.error = Some("x".into());
        s.count(&Outcome::Roce(Box::new(p)));
        assert_eq!(
            s,
            Summary {
                packets: 4,
                roce: 2,
                bad_icrc: 1,
                malformed: 1,
                not_ethernet: 1,
                roce_v1: 0,
                vendor: 0,
            }
        );
        assert_eq!(
            s.to_string(),
            "summary: 4 packets, 2 RoCE, 1 bad ICRC, 1 malformed, 1 not Ethernet (skipped)"
        );
    }
}
