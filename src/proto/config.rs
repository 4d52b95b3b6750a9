//! The device configuration ([`Config`]) and the path MTU ([`Mtu`]): the bottom of proto/,
//! imported by everything above and importing nothing of proto/ itself.

/// Path MTU, one of the five IB sizes (`enum ibv_mtu`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum Mtu {
    Mtu256,
    Mtu512,
    #[default]
    Mtu1024,
    Mtu2048,
    Mtu4096,
}

impl Mtu {
    pub const fn bytes(self) -> u32 {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }

    /// The MTU of exactly `n` bytes.
    pub const fn from_bytes(n: u32) -> Option<Mtu> {
        Some(match n {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

/// The lowest QPN handed out: 0 and 1 are QP0/QP1 (IBTA vol.1 §3.5.5); rxe keeps its QP
/// pool above 16 too (rxe_param.h `RXE_MIN_QP_INDEX`).
pub const FIRST_QPN: u32 = 0x11;

/// How many QPNs there are from [`FIRST_QPN`] to the largest 24-bit one.
pub(crate) const QPN_SPACE: u32 = (1 << 24) - FIRST_QPN;

/// Bytes a RoCE frame carries beyond its path-MTU payload at most (Ethernet, VLAN, IPv6,
/// UDP, BTH, the largest extension headers, ICRC), for sizing receive capacity in frames.
pub const RX_FRAME_OVERHEAD: usize = 128;

/// [`Config::read_qp_pkts`] unless set: 2 MiB of responses at MTU 4096, a quarter of
/// the default AF_XDP port's receive capacity (2 048 frames of MTU 4096,
/// [`Config::with_rx_capacity`]; docs/transport.md, "READ credit").
pub const DEFAULT_READ_QP_PKTS: u32 = 512;

/// [`Config::read_device_pkts`] unless set: half the default AF_XDP port's receive
/// capacity at MTU 4096, the other half left for requests and ACKs from peers.
pub const DEFAULT_READ_DEVICE_PKTS: u32 = 1024;

/// Device configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Our MAC address: the source of every frame, and the only destination accepted.
    pub mac: [u8; 6],
    /// The GID table; an address vector's `sgid_index` picks the source. Frames to other
    /// IP addresses are dropped.
    pub gids: Vec<[u8; 16]>,
    /// At most this many PSNs unacknowledged (rxe: 128).
    pub max_unacked_psns: u32,
    /// The requester asks for an ACK at least every this many packets, and the responder
    /// sends one at least this often (rxe: 64).
    pub ack_every: u32,
    /// Honour the credit count of ACKs (end-to-end flow control, §9.7.7). Off by default,
    /// like rxe, which ignores them.
    pub honour_credits: bool,
    /// Advertise the receive queue depth as credits instead of "unlimited" (0x1F).
    pub advertise_credits: bool,
    /// Largest number of WRs per work queue.
    pub max_qp_wr: u32,
    /// The port's active MTU: the largest UD message (IBTA C10-93.1.1; rxe `get_mtu`).
    pub port_mtu: Mtu,
    /// The QPN of the first QP slot; later slots follow it, wrapping from 0xFFFFFF back to
    /// [`FIRST_QPN`] (a value below [`FIRST_QPN`] counts as [`FIRST_QPN`]). The default,
    /// [`FIRST_QPN`], keeps sans-IO runs reproducible; a device on an interface starts at a
    /// random one ([`random_first_qpn`]), as a real RNIC's QPNs do not restart per process.
    pub first_qpn: u32,
    /// READ response packets one QP may have requested and not yet received: a larger
    /// READ goes out as several READ requests (`super::read_credit`). Clamped to
    /// `read_device_pkts`.
    pub read_qp_pkts: u32,
    /// READ response packets all the device's QPs together may have requested and not yet
    /// received: what its receive path holds without dropping a frame when every
    /// response arrives before the driver drains one (the AF_XDP device sets it from its
    /// fill and RX ring sizes, [`crate::io::afxdp::PortOptions::rx_frames`]).
    pub read_device_pkts: u32,
}

/// A QPN start drawn at random for each device opened (std's `RandomState` keys come from
/// the operating system's random source): a process restarted against the same peer does
/// not reuse the QPNs of its previous run, which the peer's CM would still hold in
/// timewait and answer with REJ "stale connection" (cm.c `cm_insert_remote_qpn`). rxe's
/// QPNs come from a device-wide pool handed out cyclically (rxe_pool.c `xa_alloc_cyclic`)
/// that does not restart per process either.
pub fn random_first_qpn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    FIRST_QPN + (h.finish() % u64::from(QPN_SPACE)) as u32
}

impl Config {
    /// The READ credit for a receive path that holds `rx_frames` response frames before
    /// its driver drains one (`crate::io::afxdp::PortOptions::rx_frames`): half of it for
    /// the device's READ responses (the other half for requests and ACKs from peers), half
    /// of that per QP, so that two QPs reading at once share it without waiting
    /// (docs/transport.md, "READ credit").
    pub fn with_rx_capacity(mut self, rx_frames: u32) -> Config {
        self.read_device_pkts = (rx_frames / 2).max(1);
        self.read_qp_pkts = (rx_frames / 4).max(1);
        self
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mac: [0x02, 0, 0, 0, 0, 1],
            gids: vec![crate::wire::ipv4_gid([192, 0, 2, 1])],
            max_unacked_psns: 128,
            ack_every: 64,
            honour_credits: false,
            advertise_credits: false,
            max_qp_wr: 16384,
            port_mtu: Mtu::Mtu4096,
            first_qpn: FIRST_QPN,
            read_qp_pkts: DEFAULT_READ_QP_PKTS,
            read_device_pkts: DEFAULT_READ_DEVICE_PKTS,
        }
    }
}
