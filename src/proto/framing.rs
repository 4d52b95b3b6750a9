//! Framing the engine's packets: the per-QP header template, the extension headers of
//! the packets the engine sends, and the addressing of a QP's frames.
//!
//! Contract: [`emit`] writes one frame of a QP from the QP's [`FrameTemplate`], built on
//! first use after a `modify_qp` (which drops it) from the device [`Config`] (source MAC,
//! GID table) and the QP's address vector, destination QPN and UDP source port. IPv4 is
//! used when the destination GID is IPv4-mapped (`::ffff:a.b.c.d`), IPv6 otherwise; IPv4
//! frames carry DF and TTL 64 (or the hop limit asked for), UDP checksum 0 and source
//! port 0xC000 + hash(QPN) (rxe). The packet itself, [`TxPacket`], is the requester's or
//! the responder's description (`super::packet`).

use crate::wire::{BthRepr, EthRepr, FrameTemplate, IpRepr, Opcode, Psn, UdpRepr};

use super::config::Config;
use super::packet::TxPacket;
use super::qp::{Qp, gid_is_ipv4};

/// Frame packet `p` of `qp` into `buf`, from the QP's header template (built here when
/// the QP has none, or one made for the other ECT setting).
#[inline(always)]
pub(crate) fn emit(
    cfg: &Config,
    qp: &mut Qp,
    ect: bool,
    p: &TxPacket<'_>,
    buf: &mut [u8],
) -> Option<usize> {
    let t = match &qp.tx_template {
        Some((e, t)) if *e == ect => t,
        _ => &qp.tx_template.insert((ect, frame_template(cfg, qp, ect))).1,
    };
    t.emit(p.bth, &p.ext, p.payload, buf).ok()
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
