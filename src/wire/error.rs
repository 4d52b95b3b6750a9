//! Precise wire errors.

use core::fmt;

/// The protocol layer an error was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Layer {
    Ethernet,
    Vlan,
    Ipv4,
    Ipv6,
    Udp,
    /// The Global Route Header of a RoCE v1 frame (IBTA vol. 1 §8.3).
    Grh,
    Bth,
    Deth,
    Feth,
    Reth,
    AtomicEth,
    ImmDt,
    Ieth,
    Aeth,
    AtomicAckEth,
    CnpPad,
    Payload,
    Icrc,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Layer::Ethernet => "Ethernet",
            Layer::Vlan => "802.1Q",
            Layer::Ipv4 => "IPv4",
            Layer::Ipv6 => "IPv6",
            Layer::Udp => "UDP",
            Layer::Grh => "GRH",
            Layer::Bth => "BTH",
            Layer::Deth => "DETH",
            Layer::Feth => "FETH",
            Layer::Reth => "RETH",
            Layer::AtomicEth => "AtomicETH",
            Layer::ImmDt => "ImmDt",
            Layer::Ieth => "IETH",
            Layer::Aeth => "AETH",
            Layer::AtomicAckEth => "AtomicAckETH",
            Layer::CnpPad => "CNP",
            Layer::Payload => "payload",
            Layer::Icrc => "ICRC",
        };
        f.write_str(s)
    }
}

/// Why a frame is not RoCE v2 at all (not an error in the RoCE sense: such frames are
/// simply not ours and go elsewhere, e.g. to the kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum NotRoce {
    /// EtherType other than IPv4 / IPv6 (after at most one 802.1Q tag).
    EtherType(u16),
    /// IP protocol / next header other than UDP (IPv6 extension headers included).
    IpProtocol(u8),
    /// An IP fragment.
    Fragment,
    /// UDP destination port other than 4791.
    UdpPort(u16),
}

/// A malformed frame, or a Repr that cannot be emitted.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Error {
    /// Fewer bytes than the layer needs.
    Truncated {
        layer: Layer,
        offset: usize,
        needed: usize,
        available: usize,
    },
    /// A field has a value the layer does not allow.
    Malformed {
        layer: Layer,
        offset: usize,
        what: &'static str,
        value: u64,
    },
    /// Not a RoCE v2 frame.
    NotRoce(NotRoce),
    /// The UDP length field disagrees with the IP payload length.
    UdpLength {
        offset: usize,
        udp_len: u16,
        ip_payload_len: usize,
    },
    /// The IPv4 header checksum is wrong.
    Ipv4Checksum {
        offset: usize,
        expected: u16,
        found: u16,
    },
    /// A BTH opcode this stack does not implement.
    UnknownOpcode { offset: usize, opcode: u8 },
    /// BTH PadCnt impossible for the bytes present (more pad than data, or payload plus
    /// pad not a multiple of 4).
    BadPadCount {
        offset: usize,
        pad: u8,
        data_len: usize,
    },
    /// Payload bytes after an opcode that carries none.
    UnexpectedPayload {
        offset: usize,
        opcode: u8,
        len: usize,
    },
    /// The ICRC on the wire is not the one computed.
    Icrc {
        offset: usize,
        computed: u32,
        found: u32,
    },
    /// Emit: the Repr's extension headers do not match its opcode.
    HeaderMismatch {
        opcode: u8,
        layer: Layer,
        present: bool,
    },
    /// Emit: the output buffer is too small.
    BufferTooSmall { needed: usize, available: usize },
    /// Emit: the frame would exceed what IP can carry.
    TooLong { len: usize },
}

impl Error {
    /// The layer the error concerns, when there is one.
    pub fn layer(&self) -> Option<Layer> {
        match self {
            Error::Truncated { layer, .. } | Error::Malformed { layer, .. } => Some(*layer),
            Error::HeaderMismatch { layer, .. } => Some(*layer),
            Error::UdpLength { .. } => Some(Layer::Udp),
            Error::Ipv4Checksum { .. } => Some(Layer::Ipv4),
            Error::UnknownOpcode { .. } | Error::BadPadCount { .. } => Some(Layer::Bth),
            Error::UnexpectedPayload { .. } => Some(Layer::Payload),
            Error::Icrc { .. } => Some(Layer::Icrc),
            Error::NotRoce(_) | Error::BufferTooSmall { .. } | Error::TooLong { .. } => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated {
                layer,
                offset,
                needed,
                available,
            } => write!(
                f,
                "{layer} truncated at offset {offset}: needs {needed} bytes, {available} present"
            ),
            Error::Malformed {
                layer,
                offset,
                what,
                value,
            } => {
                write!(f, "{layer} at offset {offset}: bad {what} {value:#x}")
            }
            Error::NotRoce(NotRoce::EtherType(t)) => write!(f, "not RoCE v2: EtherType {t:#06x}"),
            Error::NotRoce(NotRoce::IpProtocol(p)) => write!(f, "not RoCE v2: IP protocol {p}"),
            Error::NotRoce(NotRoce::Fragment) => write!(f, "not RoCE v2: IP fragment"),
            Error::NotRoce(NotRoce::UdpPort(p)) => write!(f, "not RoCE v2: UDP port {p}"),
            Error::UdpLength {
                offset,
                udp_len,
                ip_payload_len,
            } => write!(
                f,
                "UDP at offset {offset}: length field {udp_len} but IP carries {ip_payload_len} bytes"
            ),
            Error::Ipv4Checksum {
                offset,
                expected,
                found,
            } => write!(
                f,
                "IPv4 at offset {offset}: header checksum {found:#06x}, computed {expected:#06x}"
            ),
            Error::UnknownOpcode { offset, opcode } => {
                write!(f, "BTH at offset {offset}: unknown opcode {opcode:#04x}")
            }
            Error::BadPadCount {
                offset,
                pad,
                data_len,
            } => write!(
                f,
                "BTH at offset {offset}: PadCnt {pad} impossible with {data_len} data bytes"
            ),
            Error::UnexpectedPayload {
                offset,
                opcode,
                len,
            } => write!(
                f,
                "payload at offset {offset}: opcode {opcode:#04x} carries no payload, {len} bytes present"
            ),
            Error::Icrc {
                offset,
                computed,
                found,
            } => write!(
                f,
                "ICRC at offset {offset}: {found:#010x} on the wire, computed {computed:#010x}"
            ),
            Error::HeaderMismatch {
                opcode,
                layer,
                present,
            } => write!(
                f,
                "opcode {opcode:#04x} {} {layer}",
                if *present {
                    "does not carry"
                } else {
                    "requires"
                }
            ),
            Error::BufferTooSmall { needed, available } => {
                write!(
                    f,
                    "buffer too small: needs {needed} bytes, {available} present"
                )
            }
            Error::TooLong { len } => write!(f, "frame too long for IP: {len} bytes"),
        }
    }
}

impl std::error::Error for Error {}
