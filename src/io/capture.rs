//! Capture files: read pcap and pcapng (through the `pcap-file` crate) into frames.

use std::path::Path;
use std::time::Duration;

use pcap_file::DataLink;
use pcap_file::pcap::PcapParser;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgParser};

/// One captured frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedFrame {
    /// 1-based frame number in the file, as Wireshark counts.
    pub number: usize,
    /// Capture timestamp since the Unix epoch.
    pub timestamp: Duration,
    /// Link type of the interface it was captured on.
    pub ethernet: bool,
    pub data: Vec<u8>,
}

/// Why a capture could not be read.
#[derive(Debug)]
pub enum CaptureError {
    Io(std::io::Error),
    /// Neither the pcap nor the pcapng magic number.
    NotACapture {
        magic: [u8; 4],
    },
    /// The pcap-file crate rejected the contents.
    Format(pcap_file::PcapError),
}

impl std::fmt::Display for CaptureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptureError::Io(e) => write!(f, "{e}"),
            CaptureError::NotACapture { magic } => {
                write!(f, "not a pcap or pcapng file (starts with {magic:02x?})")
            }
            CaptureError::Format(e) => write!(f, "malformed capture: {e}"),
        }
    }
}

impl std::error::Error for CaptureError {}

impl From<pcap_file::PcapError> for CaptureError {
    fn from(e: pcap_file::PcapError) -> Self {
        match e {
            pcap_file::PcapError::IoError(io) => CaptureError::Io(io),
            // The in-memory parsers say "need more bytes" where a reader would hit EOF.
            pcap_file::PcapError::IncompleteBuffer => {
                CaptureError::Io(std::io::Error::from(std::io::ErrorKind::UnexpectedEof))
            }
            other => CaptureError::Format(other),
        }
    }
}

const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

/// Read every frame of a pcap or pcapng file.
pub fn read_file(path: &Path) -> Result<Vec<CapturedFrame>, CaptureError> {
    let bytes = std::fs::read(path).map_err(CaptureError::Io)?;
    read_bytes(&bytes)
}

/// Read every frame of a pcap or pcapng image held in memory.
pub fn read_bytes(bytes: &[u8]) -> Result<Vec<CapturedFrame>, CaptureError> {
    let mut magic = [0u8; 4];
    let n = bytes.len().min(4);
    magic[..n].copy_from_slice(&bytes[..n]);
    if magic == PCAPNG_MAGIC {
        read_pcapng(bytes)
    } else if matches!(
        u32::from_le_bytes(magic),
        0xa1b2_c3d4 | 0xd4c3_b2a1 | 0xa1b2_3c4d | 0x4d3c_b2a1
    ) {
        read_pcap(bytes)
    } else {
        Err(CaptureError::NotACapture { magic })
    }
}

// The parsers work on the bytes in memory: no reader buffer, no copy but the frame's own.

fn read_pcap(mut rest: &[u8]) -> Result<Vec<CapturedFrame>, CaptureError> {
    let (after_header, parser) = PcapParser::new(rest)?;
    rest = after_header;
    let ethernet = parser.header().datalink == DataLink::ETHERNET;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (after, p) = parser.next_packet(rest)?;
        rest = after;
        out.push(CapturedFrame {
            number: out.len() + 1,
            timestamp: p.timestamp,
            ethernet,
            data: p.data.into_owned(),
        });
    }
    Ok(out)
}

/// Convert a pcapng timestamp counted in the interface's units (`if_tsresol`, pcapng
/// §4.2: MSB clear = 10^-v s, MSB set = 2^-v s; default 10^-6) to a Duration.
/// pcap-file hands the raw 64-bit count over as if it were nanoseconds.
fn scale_timestamp(raw: Duration, tsresol: u8) -> Duration {
    let units = raw.as_nanos();
    let v = u32::from(tsresol & 0x7f);
    let nanos = if tsresol & 0x80 != 0 {
        units.saturating_mul(1_000_000_000) >> v.min(127)
    } else if v <= 9 {
        units.saturating_mul(10u128.pow(9 - v))
    } else {
        units / 10u128.checked_pow(v - 9).unwrap_or(u128::MAX)
    };
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

fn read_pcapng(mut rest: &[u8]) -> Result<Vec<CapturedFrame>, CaptureError> {
    let (after_header, mut parser) = PcapNgParser::new(rest)?;
    rest = after_header;
    // Per interface: link type and timestamp resolution.
    let mut links: Vec<(DataLink, u8)> = Vec::new();
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (after, block) = parser.next_block(rest)?;
        rest = after;
        let (iface, timestamp, data) = match block {
            Block::SectionHeader(_) => {
                links.clear();
                continue;
            }
            Block::InterfaceDescription(i) => {
                let tsresol = i
                    .options
                    .iter()
                    .find_map(|o| match o {
                        InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
                        _ => None,
                    })
                    .unwrap_or(6);
                links.push((i.linktype, tsresol));
                continue;
            }
            Block::EnhancedPacket(p) => (p.interface_id as usize, p.timestamp, p.data.into_owned()),
            Block::SimplePacket(p) => (0, Duration::ZERO, p.data.into_owned()),
            Block::Packet(p) => (
                usize::from(p.interface_id),
                Duration::from_nanos(p.timestamp),
                p.data.into_owned(),
            ),
            _ => continue,
        };
        // An unknown interface id leaves the frame "not Ethernet": it is counted, not decoded.
        let (ethernet, tsresol) = match links.get(iface) {
            Some((link, tsresol)) => (*link == DataLink::ETHERNET, *tsresol),
            None => (false, 6),
        };
        let timestamp = scale_timestamp(timestamp, tsresol);
        out.push(CapturedFrame {
            number: out.len() + 1,
            timestamp,
            ethernet,
            data,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcapng_timestamps_follow_if_tsresol() {
        let raw = Duration::from_nanos(1_700_000_000_123_456);
        // Default microseconds: the raw count is µs.
        assert_eq!(
            scale_timestamp(raw, 6),
            Duration::from_micros(1_700_000_000_123_456)
        );
        assert_eq!(scale_timestamp(raw, 9), raw);
        assert_eq!(
            scale_timestamp(Duration::from_nanos(3_000), 12),
            Duration::from_nanos(3)
        );
        // 2^-10 s units: 1024 units are one second.
        assert_eq!(
            scale_timestamp(Duration::from_nanos(2048), 0x80 | 10),
            Duration::from_secs(2)
        );
        let _ = scale_timestamp(Duration::from_nanos(u64::MAX), 0xff);
        let _ = scale_timestamp(Duration::from_nanos(u64::MAX), 0x7f);
    }

    #[test]
    fn garbage_is_a_clear_error() {
        assert!(matches!(
            read_bytes(b"hello"),
            Err(CaptureError::NotACapture { .. })
        ));
        assert!(matches!(
            read_bytes(b""),
            Err(CaptureError::NotACapture { .. })
        ));
        // A pcap header cut short.
        assert!(read_bytes(&[0xd4, 0xc3, 0xb2, 0xa1, 2, 0]).is_err());
    }
}
