//! Framing the engine's packets: the per-QP header template, the extension headers of
//! the packets the engine sends, and the addressing of a QP's frames.
//!
//! Contract: [`emit`] writes one frame of a QP from the QP's [`FrameTemplate`], built on
//! first use after a `modify_qp` (which drops it) from the device [`Config`] (source MAC,
//! GID table) and the QP's address vector, destination QPN and UDP source port. IPv4 is
//! used when the destination GID is IPv4-mapped (`::ffff:a.b.c.d`), IPv6 otherwise; IPv4
//! frames carry DF and TTL 64 (or the hop limit asked for), UDP checksum 0 and source
//! port 0xC000 + hash(QPN) (rxe). [`TxExt`] holds the extension headers an RC requester
//! or responder packet can carry, in a few bytes; it writes them exactly as `ExtHeaders`
//! would (test `tx_ext_writes_what_ext_headers_writes`).

use crate::wire::{
    AethRepr, AtomicEthRepr, BthRepr, EthRepr, Ext, ExtHeaders, ExtWriter, FrameTemplate, IpRepr,
    Opcode, Psn, RethRepr, Rkey, UdpRepr,
};

use super::device::Config;
use super::qp::{Qp, gid_is_ipv4};

/// The extension headers of one packet the engine sends (RC requests and responses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum TxExt {
    #[default]
    None,
    /// READ request, WRITE FIRST/ONLY.
    Reth(RethRepr),
    /// WRITE ONLY with immediate.
    RethImm(RethRepr, u32),
    /// SEND ONLY/LAST or WRITE LAST with immediate.
    Imm(u32),
    /// SEND ONLY/LAST with invalidate.
    Ieth(Rkey),
    /// CmpSwap, FetchAdd.
    Atomic(AtomicEthRepr),
    /// ACK, NAK, READ response FIRST/LAST/ONLY.
    Aeth(AethRepr),
    /// Atomic ACK: AETH and the original value.
    AethAtomicAck(AethRepr, u64),
}

impl ExtWriter for TxExt {
    fn present(&self) -> u16 {
        match self {
            TxExt::None => 0,
            TxExt::Reth(_) => Ext::Reth.bit(),
            TxExt::RethImm(..) => Ext::Reth.bit() | Ext::ImmDt.bit(),
            TxExt::Imm(_) => Ext::ImmDt.bit(),
            TxExt::Ieth(_) => Ext::Ieth.bit(),
            TxExt::Atomic(_) => Ext::AtomicEth.bit(),
            TxExt::Aeth(_) => Ext::Aeth.bit(),
            TxExt::AethAtomicAck(..) => Ext::Aeth.bit() | Ext::AtomicAckEth.bit(),
        }
    }

    fn write(&self, e: Ext, b: &mut [u8]) {
        match (e, self) {
            (Ext::Reth, TxExt::Reth(r) | TxExt::RethImm(r, _)) => r.emit(b),
            (Ext::ImmDt, TxExt::Imm(i) | TxExt::RethImm(_, i)) => {
                b.copy_from_slice(&i.to_be_bytes())
            }
            (Ext::Ieth, TxExt::Ieth(k)) => b.copy_from_slice(&k.0.to_be_bytes()),
            (Ext::AtomicEth, TxExt::Atomic(a)) => a.emit(b),
            (Ext::Aeth, TxExt::Aeth(a) | TxExt::AethAtomicAck(a, _)) => a.emit(b),
            (Ext::AtomicAckEth, TxExt::AethAtomicAck(_, o)) => b.copy_from_slice(&o.to_be_bytes()),
            // Absent: zeros, as `ExtHeaders` writes an absent header's defaults.
            _ => b.fill(0),
        }
    }

    fn to_headers(&self) -> ExtHeaders {
        let mut x = ExtHeaders::default();
        match *self {
            TxExt::None => {}
            TxExt::Reth(r) => x.reth = Some(r),
            TxExt::RethImm(r, i) => {
                x.reth = Some(r);
                x.immdt = Some(i);
            }
            TxExt::Imm(i) => x.immdt = Some(i),
            TxExt::Ieth(k) => x.ieth = Some(k),
            TxExt::Atomic(a) => x.atomic = Some(a),
            TxExt::Aeth(a) => x.aeth = Some(a),
            TxExt::AethAtomicAck(a, o) => {
                x.aeth = Some(a);
                x.atomic_ack = Some(crate::wire::AtomicAckEthRepr { orig: o });
            }
        }
        x
    }
}

/// Frame one packet of `qp` into `buf`, from the QP's header template (built here when
/// the QP has none, or one made for the other ECT setting).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn emit(
    cfg: &Config,
    qp: &mut Qp,
    ect: bool,
    opcode: Opcode,
    psn: Psn,
    ack_req: bool,
    solicited: bool,
    ext: &TxExt,
    payload: &[u8],
    buf: &mut [u8],
) -> Option<usize> {
    let t = match &qp.tx_template {
        Some((e, t)) if *e == ect => t,
        _ => &qp.tx_template.insert((ect, frame_template(cfg, qp, ect))).1,
    };
    t.emit(opcode, solicited, ack_req, psn, ext, payload, buf)
        .ok()
}

/// The fixed headers of `qp`'s frames to its peer.
pub(crate) fn frame_template(cfg: &Config, qp: &Qp, ect: bool) -> FrameTemplate {
    let (eth, mut ip) = frame_addrs(cfg, qp);
    // The ECN field of the QP's traffic class wins when set (ECT(1) or ECT(0) asked for
    // by `ah_attr.traffic_class`); otherwise congestion control makes the frame ECT(0).
    if ect {
        match &mut ip {
            IpRepr::V4 { tos: tc, .. }
            | IpRepr::V6 {
                traffic_class: tc, ..
            } if *tc & 3 == 0 => *tc |= super::congestion::np::ECN_ECT0,
            _ => {}
        }
    }
    let udp = UdpRepr {
        src_port: qp.src_port,
        checksum: 0,
    };
    let bth = BthRepr::new(Opcode::RC_ACK, qp.attr.dest_qp_num, Psn::new(0));
    FrameTemplate::new(eth, ip, udp, &bth)
}

/// The Ethernet and IP addressing of `qp`'s frames to its peer.
pub(crate) fn frame_addrs(cfg: &Config, qp: &Qp) -> (EthRepr, IpRepr) {
    av_addrs(cfg, &qp.attr.ah_attr)
}

/// The Ethernet and IP addressing of frames to address vector `av` (a connected QP's, or
/// a UD work request's address handle).
pub(crate) fn av_addrs(cfg: &Config, av: &super::qp::AddressVector) -> (EthRepr, IpRepr) {
    let sgid = cfg
        .gids
        .get(usize::from(av.sgid_index))
        .copied()
        .unwrap_or_default();
    let hop = if av.hop_limit == 0 { 64 } else { av.hop_limit };
    let ip = if gid_is_ipv4(&av.dgid) {
        let mut src = [0u8; 4];
        let mut dst = [0u8; 4];
        src.copy_from_slice(&sgid[12..]);
        dst.copy_from_slice(&av.dgid[12..]);
        IpRepr::V4 {
            src,
            dst,
            tos: av.traffic_class,
            identification: 0,
            dont_fragment: true,
            ttl: hop,
        }
    } else {
        IpRepr::V6 {
            src: sgid,
            dst: av.dgid,
            traffic_class: av.traffic_class,
            flow_label: av.flow_label,
            hop_limit: hop,
        }
    };
    let eth = EthRepr {
        dst: av.dmac,
        src: cfg.mac,
        vlan_tci: av.vlan_tci,
    };
    (eth, ip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Msn, OPCODE_ROWS, Qpn, Syndrome};

    #[test]
    fn tx_ext_writes_what_ext_headers_writes() {
        let reth = RethRepr {
            va: 0x0102_0304_0506_0708,
            rkey: Rkey(0x1122_3344),
            dma_len: 0x5566_7788,
        };
        let aeth = AethRepr {
            syndrome: Syndrome::RnrNak { timer: 13 },
            msn: Msn::new(0xabcdef),
        };
        let atomic = AtomicEthRepr {
            va: 9,
            rkey: Rkey(10),
            swap_add: 11,
            compare: 12,
        };
        let all = [
            TxExt::None,
            TxExt::Reth(reth),
            TxExt::RethImm(reth, 0xdead_beef),
            TxExt::Imm(0x0bad_cafe),
            TxExt::Ieth(Rkey(0x7777)),
            TxExt::Atomic(atomic),
            TxExt::Aeth(aeth),
            TxExt::AethAtomicAck(aeth, 0xfeed_f00d_1234_5678),
        ];
        let t = FrameTemplate::new(
            EthRepr {
                dst: [2, 0, 0, 0, 0, 2],
                src: [2, 0, 0, 0, 0, 1],
                vlan_tci: None,
            },
            IpRepr::V4 {
                src: [192, 0, 2, 1],
                dst: [192, 0, 2, 2],
                tos: 0,
                identification: 0,
                dont_fragment: true,
                ttl: 64,
            },
            UdpRepr {
                src_port: 0xc001,
                checksum: 0,
            },
            &BthRepr::new(Opcode::RC_ACK, Qpn::new(0x12), Psn::new(0)),
        );
        let mut matched = 0;
        // Every opcode with every variant: the same bytes, or the same error.
        for row in OPCODE_ROWS {
            for x in all {
                let op = Opcode(row.code);
                let pl: &[u8] = if row.has_payload {
                    &[1, 2, 3, 4, 5]
                } else {
                    &[]
                };
                let mut a = [0xa5u8; 256];
                let mut b = [0x5au8; 256];
                let ra = t.emit(op, true, true, Psn::new(77), &x, pl, &mut a);
                let rb = t.emit(op, true, true, Psn::new(77), &x.to_headers(), pl, &mut b);
                assert_eq!(ra, rb, "{} {x:?}", row.name);
                if let Ok(n) = ra {
                    assert_eq!(a[..n], b[..n], "{} {x:?}", row.name);
                    matched += 1;
                }
            }
        }
        // Each variant fits some RC opcode (None several).
        assert!(matched >= all.len(), "{matched}");
    }
}
