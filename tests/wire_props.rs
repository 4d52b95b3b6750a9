//! Property tests of the wire layer: Repr → emit → parse round trips for every opcode and
//! every header, precise errors for every truncation, and detection of every single-bit
//! flip outside the fields the ICRC deliberately leaves out.

use proptest::prelude::*;
use xrnic::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Error, EthRepr, Ext, ExtHeaders,
    FethRepr, FrameRepr, FrameView, IpRepr, Msn, OPCODE_ROWS, Opcode, PKey, Psn, Qpn, RethRepr,
    Rkey, RoceRepr, Syndrome, UdpRepr,
};

/// Everything needed to build a frame; the payload is owned here and borrowed by the Repr.
#[derive(Clone, Debug)]
struct Spec {
    eth: EthRepr,
    ip: IpRepr,
    udp: UdpRepr,
    bth: BthRepr,
    ext: ExtHeaders,
    payload: Vec<u8>,
}

impl Spec {
    fn repr(&self) -> FrameRepr<'_> {
        FrameRepr {
            eth: self.eth,
            ip: self.ip,
            udp: self.udp,
            roce: RoceRepr {
                bth: self.bth,
                ext: self.ext,
                payload: &self.payload,
            },
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let r = self.repr();
        let mut out = vec![0x5au8; r.buffer_len()];
        let n = r.emit(&mut out).expect("emit");
        assert_eq!(n, out.len());
        out
    }
}

fn eth() -> impl Strategy<Value = EthRepr> {
    (
        any::<[u8; 6]>(),
        any::<[u8; 6]>(),
        proptest::option::of(any::<u16>()),
    )
        .prop_map(|(dst, src, vlan_tci)| EthRepr { dst, src, vlan_tci })
}

fn ip() -> impl Strategy<Value = IpRepr> {
    prop_oneof![
        (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            any::<u8>(),
            any::<u16>(),
            any::<bool>(),
            any::<u8>()
        )
            .prop_map(
                |(src, dst, tos, identification, dont_fragment, ttl)| IpRepr::V4 {
                    src,
                    dst,
                    tos,
                    identification,
                    dont_fragment,
                    ttl
                }
            ),
        (
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            any::<u8>(),
            0u32..(1 << 20),
            any::<u8>()
        )
            .prop_map(
                |(src, dst, traffic_class, flow_label, hop_limit)| IpRepr::V6 {
                    src,
                    dst,
                    traffic_class,
                    flow_label,
                    hop_limit
                }
            ),
    ]
}

fn ext_values() -> impl Strategy<Value = ExtHeaders> {
    (
        (any::<u32>(), any::<u32>(), any::<u8>(), any::<u8>()),
        (any::<u64>(), any::<u32>(), any::<u32>()),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()),
        (
            any::<u32>(),
            any::<u32>(),
            any::<u8>(),
            any::<u32>(),
            any::<u64>(),
        ),
    )
        .prop_map(
            |(
                (qkey, sqp, sel, pt),
                (va, rkey, len),
                (ava, ark, sa, cmp),
                (imm, ieth, syn, msn, orig),
            )| {
                ExtHeaders {
                    deth: Some(DethRepr {
                        qkey,
                        src_qp: Qpn::new(sqp),
                    }),
                    feth: Some(FethRepr {
                        selectivity: sel & 3,
                        placement_type: pt & 0xf,
                    }),
                    reth: Some(RethRepr {
                        va,
                        rkey: Rkey(rkey),
                        dma_len: len,
                    }),
                    atomic: Some(AtomicEthRepr {
                        va: ava,
                        rkey: Rkey(ark),
                        swap_add: sa,
                        compare: cmp,
                    }),
                    immdt: Some(imm),
                    ieth: Some(Rkey(ieth)),
                    aeth: Some(AethRepr {
                        syndrome: Syndrome::from_byte(syn),
                        msn: Msn::new(msn),
                    }),
                    atomic_ack: Some(AtomicAckEthRepr { orig }),
                }
            },
        )
}

/// Keep only the headers the opcode carries.
fn restrict(all: ExtHeaders, op: Opcode) -> ExtHeaders {
    let exts = op.info().expect("known opcode").exts;
    ExtHeaders {
        deth: all.deth.filter(|_| exts.has(Ext::Deth)),
        feth: all.feth.filter(|_| exts.has(Ext::Feth)),
        reth: all.reth.filter(|_| exts.has(Ext::Reth)),
        atomic: all.atomic.filter(|_| exts.has(Ext::AtomicEth)),
        immdt: all.immdt.filter(|_| exts.has(Ext::ImmDt)),
        ieth: all.ieth.filter(|_| exts.has(Ext::Ieth)),
        aeth: all.aeth.filter(|_| exts.has(Ext::Aeth)),
        atomic_ack: all.atomic_ack.filter(|_| exts.has(Ext::AtomicAckEth)),
    }
}

prop_compose! {
    fn spec()(
        row in 0..OPCODE_ROWS.len(),
        eth in eth(),
        ip in ip(),
        src_port in any::<u16>(),
        checksum in any::<u16>(),
        flags in any::<[bool; 5]>(),
        pkey in any::<u16>(),
        resv6 in 0u8..64,
        resv7 in 0u8..128,
        dest_qp in any::<u32>(),
        psn in any::<u32>(),
        ext in ext_values(),
        payload in proptest::collection::vec(any::<u8>(), 0..300),
    ) -> Spec {
        let info = &OPCODE_ROWS[row];
        let op = Opcode(info.code);
        let payload = if info.has_payload { payload } else { Vec::new() };
        let bth = BthRepr {
            opcode: op,
            solicited: flags[0],
            mig_req: flags[1],
            pad_count: ((4 - payload.len() % 4) % 4) as u8,
            pkey: PKey(pkey),
            fecn: flags[2],
            becn: flags[3],
            resv6,
            dest_qp: Qpn::new(dest_qp),
            ack_req: flags[4],
            resv7,
            psn: Psn::new(psn),
        };
        Spec { eth, ip, udp: UdpRepr { src_port, checksum }, bth, ext: restrict(ext, op), payload }
    }
}

/// Is the bit at `byte` one that the ICRC leaves out on purpose, or that lies outside what
/// the ICRC covers (the Ethernet addresses and the VLAN tag, protected by the FCS on a real
/// link)? Flips there may go unnoticed; every other flip must be caught.
fn uncovered(spec: &Spec, byte: usize) -> bool {
    let vlan = if spec.eth.vlan_tci.is_some() { 4 } else { 0 };
    if byte < 12 || (vlan == 4 && (14..16).contains(&byte)) {
        return true;
    }
    let ip = 14 + vlan;
    let (ip_len, masked_ip): (usize, &[usize]) = match spec.ip {
        // TOS, TTL and checksum are masked, but the IPv4 header checksum still covers them.
        IpRepr::V4 { .. } => (20, &[]),
        IpRepr::V6 { .. } => (40, &[0, 1, 2, 3, 7]),
    };
    if byte >= ip && byte < ip + ip_len {
        let i = byte - ip;
        // IPv6 byte 0: the low nibble is traffic class (masked), the high nibble the version.
        return masked_ip.contains(&i);
    }
    let udp = ip + ip_len;
    byte == udp + 6 || byte == udp + 7 || byte == udp + 8 + 4
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn emit_then_parse_round_trips(spec in spec()) {
        let bytes = spec.bytes();
        let parsed = FrameRepr::parse(&bytes).expect("parse");
        prop_assert_eq!(parsed, spec.repr());
    }

    #[test]
    fn every_truncation_is_a_precise_error(spec in spec()) {
        let bytes = spec.bytes();
        for n in 0..bytes.len() {
            match FrameView::parse(&bytes[..n]) {
                Err(Error::Truncated { offset, needed, available, .. }) => {
                    prop_assert!(available < needed, "n={} needed={} available={}", n, needed, available);
                    prop_assert_eq!(offset + available, n);
                }
                other => prop_assert!(false, "n={}: {:?}", n, other),
            }
        }
    }

    #[test]
    fn every_single_bit_flip_is_detected_unless_uncovered(spec in spec()) {
        let bytes = spec.bytes();
        for byte in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[byte] ^= 1 << bit;
                // IPv6 byte 0: only the low nibble (traffic class) is masked.
                let masked = uncovered(&spec, byte)
                    && !(matches!(spec.ip, IpRepr::V6 { .. })
                        && byte == 14 + if spec.eth.vlan_tci.is_some() { 4 } else { 0 }
                        && bit >= 4);
                let accepted = FrameRepr::parse(&b).is_ok();
                prop_assert!(!accepted || masked, "flip of byte {} bit {} went unnoticed", byte, bit);
            }
        }
    }
}

#[test]
fn ipv6_version_nibble_flip_is_detected_and_traffic_class_flip_is_not() {
    let spec = Spec {
        eth: EthRepr::default(),
        ip: IpRepr::V6 {
            src: [0xfd; 16],
            dst: [0xfe; 16],
            traffic_class: 2,
            flow_label: 7,
            hop_limit: 64,
        },
        udp: UdpRepr {
            src_port: 0xc001,
            checksum: 0,
        },
        bth: BthRepr {
            ack_req: true,
            ..BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::new(0x11), Psn::new(1))
        },
        ext: ExtHeaders::default(),
        payload: b"abcd".to_vec(),
    };
    let bytes = spec.bytes();
    let mut b = bytes.clone();
    b[14] ^= 0x10; // version 6 -> 7
    assert!(FrameRepr::parse(&b).is_err());
    let mut b = bytes.clone();
    b[14] ^= 0x01; // traffic class, masked
    let r = FrameRepr::parse(&b).expect("TC flips are invisible to the ICRC");
    assert_ne!(r.ip, spec.ip);
}

#[test]
fn emit_rejects_headers_that_do_not_match_the_opcode() {
    let mut spec = Spec {
        eth: EthRepr::default(),
        ip: IpRepr::V4 {
            src: [192, 0, 2, 1],
            dst: [192, 0, 2, 2],
            tos: 2,
            identification: 0,
            dont_fragment: true,
            ttl: 64,
        },
        udp: UdpRepr {
            src_port: 0xc001,
            checksum: 0,
        },
        bth: BthRepr {
            ack_req: true,
            ..BthRepr::new(Opcode::RC_WRITE_ONLY, Qpn::new(0x11), Psn::new(1))
        },
        ext: ExtHeaders::default(),
        payload: vec![1, 2, 3],
    };
    let mut buf = [0u8; 200];
    assert!(matches!(
        spec.repr().emit(&mut buf),
        Err(Error::HeaderMismatch {
            opcode: 0x0a,
            present: false,
            ..
        })
    ));
    spec.ext.reth = Some(RethRepr::default());
    spec.ext.aeth = Some(AethRepr {
        syndrome: Syndrome::ACK_UNLIMITED,
        msn: Msn::new(0),
    });
    assert!(matches!(
        spec.repr().emit(&mut buf),
        Err(Error::HeaderMismatch { present: true, .. })
    ));
    spec.ext.aeth = None;
    assert!(matches!(
        spec.repr().emit(&mut buf[..40]),
        Err(Error::BufferTooSmall { .. })
    ));
    let n = spec.repr().emit(&mut buf).unwrap();
    // 3 bytes of payload get one pad byte, and PadCnt says so.
    assert_eq!(FrameView::parse(&buf[..n]).unwrap().bth().pad_count(), 1);
    spec.bth.opcode = Opcode::RC_ACK;
    spec.ext = ExtHeaders {
        aeth: Some(AethRepr {
            syndrome: Syndrome::ACK_UNLIMITED,
            msn: Msn::new(0),
        }),
        ..Default::default()
    };
    assert!(matches!(
        spec.repr().emit(&mut buf),
        Err(Error::UnexpectedPayload { .. })
    ));
    spec.bth.opcode = Opcode(0x15);
    assert!(matches!(
        spec.repr().emit(&mut buf),
        Err(Error::UnknownOpcode { opcode: 0x15, .. })
    ));
}
