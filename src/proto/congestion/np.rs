//! The DCQCN notification point (NP): the receiver side that turns CE-marked RoCE packets
//! into CNPs, and the CNP frame itself.
//!
//! Contract: sans-IO. [`NotificationPoint::on_packet`] is told about every RoCE packet a
//! local QP receives (its IP ECN field) and answers whether a CNP must go out now: at most
//! one per `np_min_time_between_cnps` per QP (the paper's 50 µs CNP interval; ConnectX
//! default 4 µs). The caller then builds the frame with [`build_cnp`] and sends it.
//! Counters as mlx5 names them: `np_ecn_marked_roce_packets`, `np_cnp_sent` (counted when
//! the NP decides to send).
//!
//! The CNP is built like the ConnectX-4 Lx capture in vectors/single/scapy_cx4lx_cnp.pcap
//! (RoCE v2 annex A17.9.2): BTH opcode 0x81, P_Key 0xFFFF, BECN set, DestQP = the QP of
//! the sender being throttled, PSN 0, no AckReq, 16 zero bytes, ICRC; IPv4 DSCP
//! `np_cnp_dscp` with ECT(0) (48 → TOS 0xC2), DF, UDP source port 0, UDP checksum 0.

use std::collections::HashMap;

use crate::proto::time::{Duration, Instant};

use crate::wire::{
    BthRepr, EthRepr, ExtHeaders, FrameRepr, IpRepr, Opcode, Psn, Qpn, RoceRepr, UdpRepr,
};

/// IP ECN codepoints (RFC 3168).
pub const ECN_ECT0: u8 = 2;
pub const ECN_CE: u8 = 3;

/// NP counters (mlx5 hw_counters names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NpCounters {
    pub np_ecn_marked_roce_packets: u64,
    pub np_cnp_sent: u64,
}

/// The CNP pacing state of every local QP.
#[derive(Clone, Debug, Default)]
pub struct NotificationPoint {
    interval: Duration,
    last_cnp: HashMap<Qpn, Instant>,
    counters: NpCounters,
}

impl NotificationPoint {
    /// At most one CNP per QP per `interval`.
    pub fn new(interval: Duration) -> Self {
        NotificationPoint {
            interval,
            last_cnp: HashMap::new(),
            counters: NpCounters::default(),
        }
    }

    /// Local QP `qpn` received a RoCE packet with IP ECN field `ecn` at `now`. True when a
    /// CNP must be sent for it now.
    pub fn on_packet(&mut self, now: Instant, qpn: Qpn, ecn: u8) -> bool {
        if ecn & 3 != ECN_CE {
            return false;
        }
        self.counters.np_ecn_marked_roce_packets += 1;
        let recent = self
            .last_cnp
            .get(&qpn)
            .is_some_and(|&t| now - t < self.interval);
        if recent {
            return false;
        }
        self.last_cnp.insert(qpn, now);
        self.counters.np_cnp_sent += 1;
        true
    }

    /// Forget a destroyed QP.
    pub fn remove_qp(&mut self, qpn: Qpn) {
        self.last_cnp.remove(&qpn);
    }

    pub fn counters(&self) -> NpCounters {
        self.counters
    }
}

/// A CNP to the peer QP `dest_qp`, from the addresses of the flow being notified. `eth` and
/// `ip` are the addresses of our frames to that peer (as our data frames would carry
/// them); the IP DSCP becomes `dscp` with ECN ECT(0), and a VLAN tag's priority becomes
/// `prio`.
pub fn build_cnp(eth: EthRepr, ip: IpRepr, dest_qp: Qpn, dscp: u8, prio: u8) -> FrameRepr<'static> {
    let tc = ((dscp & 0x3f) << 2) | ECN_ECT0;
    let ip = match ip {
        IpRepr::V4 { src, dst, ttl, .. } => IpRepr::V4 {
            src,
            dst,
            tos: tc,
            identification: 0,
            dont_fragment: true,
            ttl,
        },
        IpRepr::V6 {
            src,
            dst,
            flow_label,
            hop_limit,
            ..
        } => IpRepr::V6 {
            src,
            dst,
            traffic_class: tc,
            flow_label,
            hop_limit,
        },
    };
    let eth = EthRepr {
        vlan_tci: eth
            .vlan_tci
            .map(|tci| (tci & 0x1fff) | (u16::from(prio & 7) << 13)),
        ..eth
    };
    FrameRepr {
        eth,
        ip,
        // ConnectX sends its CNPs from UDP port 0 with checksum 0.
        udp: UdpRepr {
            src_port: 0,
            checksum: 0,
        },
        roce: RoceRepr {
            bth: BthRepr {
                becn: true,
                ..BthRepr::new(Opcode::CNP, dest_qp, Psn::new(0))
            },
            ext: ExtHeaders::default(),
            payload: &[],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ce_counts() {
        let t = Instant::from_nanos;
        let mut np = NotificationPoint::new(Duration::from_micros(50));
        for ecn in [0, 1, 2] {
            assert!(!np.on_packet(t(0), Qpn::new(17), ecn));
        }
        assert_eq!(np.counters(), NpCounters::default());
        assert!(np.on_packet(t(0), Qpn::new(17), ECN_CE));
        assert!(!np.on_packet(t(49_999), Qpn::new(17), ECN_CE));
        assert!(np.on_packet(t(50_000), Qpn::new(17), ECN_CE));
        assert_eq!(
            np.counters(),
            NpCounters {
                np_ecn_marked_roce_packets: 3,
                np_cnp_sent: 2
            }
        );
    }

    #[test]
    fn vlan_priority_is_set() {
        let eth = EthRepr {
            dst: [2; 6],
            src: [4; 6],
            vlan_tci: Some(0x0064),
        };
        let ip = IpRepr::V6 {
            src: [1; 16],
            dst: [2; 16],
            traffic_class: 0,
            flow_label: 7,
            hop_limit: 64,
        };
        let f = build_cnp(eth, ip, Qpn::new(0x42), 48, 6);
        assert_eq!(f.eth.vlan_tci, Some(0xc064));
        let IpRepr::V6 { traffic_class, .. } = f.ip else {
            unreachable!()
        };
        assert_eq!(traffic_class, 0xc2);
        let mut buf = [0u8; 128];
        let n = f.emit(&mut buf).unwrap();
        let back = FrameRepr::parse(&buf[..n]).unwrap();
        assert_eq!(back, f);
    }
}
