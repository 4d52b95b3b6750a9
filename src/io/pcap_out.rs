//! Writing captures: a pcapng file with one interface per device and a comment on every
//! packet that needs one (why it was sent, what the link did to it).
//!
//! Contract: [`PcapNgOut`] writes a pcapng section (through the `pcap-file` crate) that
//! Wireshark, tshark and [`crate::io::capture::read_file`] open. Interfaces are Ethernet with
//! `if_tsresol` 9: timestamps are nanoseconds (pcap-file writes the raw nanosecond count,
//! so the resolution must be declared or readers would take it for microseconds). Each
//! Enhanced Packet Block may carry `epb_flags` with the direction (inbound/outbound, pcapng
//! §4.3) and an `opt_comment`. Write errors are returned, never panicked on. Any command
//! that moves traffic can use it: give each device an interface, call
//! [`PcapNgOut::write`] for every frame.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Duration;

use pcap_file::DataLink;
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};

/// Which way a frame went, seen from the interface it is recorded on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Inbound,
    Outbound,
}

/// A pcapng writer with named interfaces.
pub struct PcapNgOut<W: Write> {
    w: PcapNgWriter<W>,
    interfaces: u32,
    packets: u64,
}

impl<W: Write> std::fmt::Debug for PcapNgOut<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapNgOut")
            .field("interfaces", &self.interfaces)
            .field("packets", &self.packets)
            .finish()
    }
}

/// One interface: its name and a description (shown by Wireshark's capture file
/// properties).
#[derive(Clone, Debug)]
pub struct Interface {
    pub name: String,
    pub description: String,
}

impl PcapNgOut<BufWriter<File>> {
    /// Create (truncate) `path` and write the section and interface headers.
    pub fn create(path: &Path, interfaces: &[Interface]) -> Result<Self, String> {
        let f = File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        PcapNgOut::new(BufWriter::new(f), interfaces)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}

impl<W: Write> PcapNgOut<W> {
    /// Write the section header and one Interface Description Block per interface.
    pub fn new(w: W, interfaces: &[Interface]) -> Result<Self, pcap_file::PcapError> {
        let mut w = PcapNgWriter::new(w)?;
        for i in interfaces {
            let idb = InterfaceDescriptionBlock {
                linktype: DataLink::ETHERNET,
                snaplen: 0,
                options: vec![
                    InterfaceDescriptionOption::IfName(Cow::Owned(i.name.clone())),
                    InterfaceDescriptionOption::IfDescription(Cow::Owned(i.description.clone())),
                    // 10^-9 s: the timestamps below are nanoseconds.
                    InterfaceDescriptionOption::IfTsResol(9),
                ],
            };
            w.write_pcapng_block(idb)?;
        }
        Ok(PcapNgOut {
            w,
            interfaces: interfaces.len() as u32,
            packets: 0,
        })
    }

    /// Record `frame` on interface `iface` at `ts_ns` nanoseconds since the epoch of the
    /// file (for simulations: virtual time since the start of the run).
    pub fn write(
        &mut self,
        iface: u32,
        ts_ns: u64,
        frame: &[u8],
        dir: Option<Direction>,
        comment: Option<&str>,
    ) -> Result<(), pcap_file::PcapError> {
        if iface >= self.interfaces {
            return Err(pcap_file::PcapError::InvalidField(
                "packet for an interface that was not declared",
            ));
        }
        let mut options = Vec::new();
        if let Some(c) = comment {
            options.push(EnhancedPacketOption::Comment(Cow::Borrowed(c)));
        }
        if let Some(d) = dir {
            // epb_flags bits 0-1: 01 inbound, 10 outbound.
            options.push(EnhancedPacketOption::Flags(match d {
                Direction::Inbound => 1,
                Direction::Outbound => 2,
            }));
        }
        let epb = EnhancedPacketBlock {
            interface_id: iface,
            timestamp: Duration::from_nanos(ts_ns),
            original_len: frame.len() as u32,
            data: Cow::Borrowed(frame),
            options,
        };
        self.w.write_pcapng_block(epb)?;
        self.packets += 1;
        Ok(())
    }

    /// Packets written so far.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Push what is buffered to the underlying writer (and flush it), keeping the file
    /// open: readers then see every packet written so far.
    pub fn flush(&mut self) -> Result<(), std::io::Error> {
        self.w.get_mut().flush()
    }

    /// Flush and hand back the underlying writer.
    pub fn finish(self) -> Result<W, std::io::Error> {
        let mut w = self.w.into_inner();
        w.flush()?;
        Ok(w)
    }
}

/// Concatenate pcapng files into one, each input becoming one interface of the output
/// named `label` (its packets keep their timestamps, directions and comments). Inputs are
/// written in the order given, so chronological inputs give a chronological file.
/// Returns the number of packets written.
pub fn merge(out: &Path, parts: &[(String, std::path::PathBuf)]) -> Result<u64, String> {
    use pcap_file::pcapng::{Block, PcapNgReader};
    let mut inputs = Vec::new();
    for (label, path) in parts {
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        inputs.push((label, path, bytes));
    }
    let ifs: Vec<Interface> = inputs
        .iter()
        .map(|(label, path, _)| Interface {
            name: label.to_string(),
            description: format!("{label} (from {})", path.display()),
        })
        .collect();
    let mut w = PcapNgOut::create(out, &ifs)?;
    let bad = |p: &Path, e: &dyn std::fmt::Display| format!("{}: {e}", p.display());
    for (i, (_, path, bytes)) in inputs.iter().enumerate() {
        let mut r = PcapNgReader::new(&bytes[..]).map_err(|e| bad(path, &e))?;
        while let Some(b) = r.next_block() {
            let Block::EnhancedPacket(p) = b.map_err(|e| bad(path, &e))? else {
                continue;
            };
            let mut comment = None;
            let mut dir = None;
            for o in &p.options {
                match o {
                    EnhancedPacketOption::Comment(c) => comment = Some(c.to_string()),
                    EnhancedPacketOption::Flags(f) => {
                        dir = match f & 3 {
                            1 => Some(Direction::Inbound),
                            2 => Some(Direction::Outbound),
                            _ => None,
                        }
                    }
                    _ => {}
                }
            }
            w.write(
                i as u32,
                p.timestamp.as_nanos() as u64,
                &p.data,
                dir,
                comment.as_deref(),
            )
            .map_err(|e| bad(out, &e))?;
        }
    }
    let n = w.packets();
    w.finish().map_err(|e| bad(out, &e))?;
    Ok(n)
}

/// The comment of every packet of a pcapng image, in order (`None` for packets without
/// one); empty for anything that is not pcapng or stops parsing.
pub fn packet_comments(bytes: &[u8]) -> Vec<Option<String>> {
    use pcap_file::pcapng::{Block, PcapNgReader};
    let mut v = Vec::new();
    let Ok(mut r) = PcapNgReader::new(bytes) else {
        return v;
    };
    while let Some(b) = r.next_block() {
        match b {
            Ok(Block::EnhancedPacket(p)) => v.push(p.options.iter().find_map(|o| match o {
                EnhancedPacketOption::Comment(c) => Some(c.to_string()),
                _ => None,
            })),
            Ok(Block::SimplePacket(_)) | Ok(Block::Packet(_)) => v.push(None),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_the_reader_with_nanosecond_times() {
        let ifs = [
            Interface {
                name: "a".into(),
                description: "side A".into(),
            },
            Interface {
                name: "b".into(),
                description: "side B".into(),
            },
        ];
        let mut out = PcapNgOut::new(Vec::new(), &ifs).unwrap();
        out.write(0, 1_234, &[1, 2, 3], Some(Direction::Outbound), Some("why"))
            .unwrap();
        out.write(1, 5_000_000_007, &[4; 60], None, None).unwrap();
        assert!(out.write(2, 0, &[0], None, None).is_err());
        assert_eq!(out.packets(), 2);
        let bytes = out.finish().unwrap();
        let frames = crate::io::capture::read_bytes(&bytes).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].timestamp, Duration::from_nanos(1_234));
        assert_eq!(frames[1].timestamp, Duration::from_nanos(5_000_000_007));
        assert_eq!(frames[0].data, [1, 2, 3]);
        assert!(frames[1].ethernet);
        assert_eq!(packet_comments(&bytes), vec![Some("why".to_string()), None]);
    }

    #[test]
    fn merge_makes_one_interface_per_input_and_keeps_comments_and_times() {
        let dir = std::env::temp_dir();
        let tag = std::process::id();
        let one = |n: &str, ts: u64, c: Option<&str>| {
            let p = dir.join(format!("xrnic-merge-{tag}-{n}.pcapng"));
            let ifs = [Interface {
                name: n.into(),
                description: n.into(),
            }];
            let mut o = PcapNgOut::create(&p, &ifs).unwrap();
            o.write(0, ts, &[ts as u8; 60], Some(Direction::Inbound), c)
                .unwrap();
            o.write(0, ts + 1, &[1; 61], Some(Direction::Outbound), None)
                .unwrap();
            o.finish().unwrap();
            p
        };
        let parts = vec![
            ("step 1".to_string(), one("x", 1_000, Some("first"))),
            ("step 2".to_string(), one("y", 2_000, None)),
        ];
        let out = dir.join(format!("xrnic-merge-{tag}-out.pcapng"));
        assert_eq!(merge(&out, &parts), Ok(4));
        let bytes = std::fs::read(&out).unwrap();
        let frames = crate::io::capture::read_bytes(&bytes).unwrap();
        let ts: Vec<u64> = frames
            .iter()
            .map(|f| f.timestamp.as_nanos() as u64)
            .collect();
        assert_eq!(ts, [1_000, 1_001, 2_000, 2_001]);
        assert_eq!(
            packet_comments(&bytes),
            [Some("first".to_string()), None, None, None]
        );
        let missing = vec![("z".to_string(), dir.join("xrnic-merge-none.pcapng"))];
        assert!(merge(&out, &missing).unwrap_err().contains("cannot read"));
        for p in parts.iter().map(|p| &p.1).chain([&out]) {
            let _ = std::fs::remove_file(p);
        }
    }
}
