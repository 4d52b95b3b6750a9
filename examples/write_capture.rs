//! Write a small, realistic RoCE v2 exchange into a pcapng file, built entirely with
//! `xrnic::wire::FrameRepr::emit` (lengths, IPv4 checksum, PadCnt and ICRC are computed by
//! the wire layer). `make demo` runs it and decodes the result with `xrnic decode --strict`.
//!
//! Usage: `cargo run --example write_capture -- [OUT.pcapng]` (default `demo.pcapng`).
//!
//! The exchange, on path MTU 1024 (what rxe reports on a 1500-byte link, docs/wire-format.md §1):
//! - IPv4, requester 192.0.2.1 QP 0x11 ↔ responder 192.0.2.2 QP 0x12, ECT(0) like RoCE
//!   hardware sends: SEND ONLY + ACK; RDMA WRITE FIRST/MIDDLE/LAST of 2500 bytes, whose
//!   MIDDLE a switch marked CE, so the responder's NIC sends a CNP back (ConnectX style:
//!   BECN, PSN 0, DSCP 48, UDP source port 0, docs/wire-format.md §5) + ACK; RDMA READ of 1500 bytes
//!   (REQUEST, RESPONSE FIRST/LAST); CmpSwap + ATOMIC ACK; a SEND that meets an empty
//!   receive queue (RNR NAK, timer 14 = 1.28 ms), retried after the timer and ACKed.
//! - IPv6 on VLAN 100, fd00::1 QP 0x21 → fd00::2 QP 0x22: SEND ONLY with immediate
//!   (37 bytes, so PadCnt 3) + an ACK with a real credit count, as Huawei hardware sends.
//!
//! The frame-building functions are also used by tests/cli_decode.rs and tests/tshark.rs.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::time::Duration;

use pcap_file::DataLink;
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use xrnic::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, EthRepr, ExtHeaders, FrameRepr, IpRepr,
    Msn, Opcode, PKey, Psn, Qpn, RethRepr, Rkey, RoceRepr, Syndrome, UdpRepr,
};

/// Path MTU of the exchange.
pub const PMTU: usize = 1024;

/// One end of a connection: link and IP addresses, its QP, the UDP source port it uses.
#[derive(Clone, Copy)]
pub struct Host {
    pub mac: [u8; 6],
    pub ip: IpAddrBytes,
    pub qpn: Qpn,
    /// rxe picks 0xC000 + a hash of the QPN (rxe_qp.c); any value is legal.
    pub udp_src_port: u16,
    pub vlan_tci: Option<u16>,
}

#[derive(Clone, Copy)]
pub enum IpAddrBytes {
    V4([u8; 4]),
    V6([u8; 16]),
}

/// IP ECN codepoints (RFC 3168).
pub const ECT0: u8 = 0b10;
pub const CE: u8 = 0b11;

/// A plain BTH for `op` to `dest_qp` at `psn`.
pub fn bth(op: Opcode, dest_qp: Qpn, psn: u32, ack_req: bool) -> BthRepr {
    BthRepr {
        opcode: op,
        solicited: false,
        mig_req: false,
        pad_count: 0, // computed by emit
        pkey: PKey::DEFAULT,
        fecn: false,
        becn: false,
        resv6: 0,
        dest_qp,
        ack_req,
        resv7: 0,
        psn: Psn::new(psn),
    }
}

/// Emit one frame from `from` to `to` with IP TOS / traffic class `tos`.
pub fn frame(
    from: &Host,
    to: &Host,
    tos: u8,
    bth: BthRepr,
    ext: ExtHeaders,
    payload: &[u8],
) -> Vec<u8> {
    let ip = match (from.ip, to.ip) {
        (IpAddrBytes::V4(src), IpAddrBytes::V4(dst)) => IpRepr::V4 {
            src,
            dst,
            tos,
            identification: 0,
            dont_fragment: true,
            ttl: 64,
        },
        (IpAddrBytes::V6(src), IpAddrBytes::V6(dst)) => IpRepr::V6 {
            src,
            dst,
            traffic_class: tos,
            flow_label: 0,
            hop_limit: 64,
        },
        _ => panic!("hosts of one flow share an IP version"),
    };
    let repr = FrameRepr {
        eth: EthRepr {
            dst: to.mac,
            src: from.mac,
            vlan_tci: from.vlan_tci,
        },
        ip,
        udp: UdpRepr {
            src_port: from.udp_src_port,
            // rxe leaves the UDP checksum 0; the ICRC covers the datagram (rxe_net.c).
            checksum: 0,
        },
        roce: RoceRepr { bth, ext, payload },
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr
        .emit(&mut buf)
        .expect("the exchange only builds valid frames");
    buf.truncate(n);
    buf
}

/// Deterministic payload bytes.
pub fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
}

fn aeth(syndrome: Syndrome, msn: u32) -> ExtHeaders {
    ExtHeaders {
        aeth: Some(AethRepr {
            syndrome,
            msn: Msn::new(msn),
        }),
        ..Default::default()
    }
}

fn reth(va: u64, rkey: u32, dma_len: u32) -> ExtHeaders {
    ExtHeaders {
        reth: Some(RethRepr {
            va,
            rkey: Rkey(rkey),
            dma_len,
        }),
        ..Default::default()
    }
}

/// The whole exchange: (time since the first frame, frame bytes).
pub fn exchange() -> Vec<(Duration, Vec<u8>)> {
    let a = Host {
        mac: [0x02, 0, 0, 0, 0, 0x01],
        ip: IpAddrBytes::V4([192, 0, 2, 1]),
        qpn: Qpn::new(0x11),
        udp_src_port: 0xc011,
        vlan_tci: None,
    };
    let b = Host {
        mac: [0x02, 0, 0, 0, 0, 0x02],
        ip: IpAddrBytes::V4([192, 0, 2, 2]),
        qpn: Qpn::new(0x12),
        udp_src_port: 0xc012,
        vlan_tci: None,
    };
    let none = ExtHeaders::default;
    // rxe ACKs always carry credit code 31, "unlimited" (rxe_resp.c, AETH_ACK_UNLIMITED).
    let ack = |psn, msn| {
        frame(
            &b,
            &a,
            ECT0,
            bth(Opcode::RC_ACK, a.qpn, psn, false),
            aeth(Syndrome::ACK_UNLIMITED, msn),
            &[],
        )
    };
    let mut out = Timeline::default();

    // SEND ONLY, solicited, and its ACK (MSN 1: one message completed).
    let mut send = bth(Opcode::RC_SEND_ONLY, b.qpn, 1000, true);
    send.solicited = true;
    out.push(frame(&a, &b, ECT0, send, none(), &data(64, 1)));
    out.push(ack(1000, 1));

    // RDMA WRITE of 2500 bytes: FIRST and MIDDLE carry exactly the PMTU, LAST the rest.
    let buf = data(2500, 7);
    let (va, rkey) = (0x7f3a_5c00_1000, 0x0000_1234);
    out.push(frame(
        &a,
        &b,
        ECT0,
        bth(Opcode::RC_WRITE_FIRST, b.qpn, 1001, false),
        reth(va, rkey, buf.len() as u32),
        &buf[..PMTU],
    ));
    // A congested switch marked this one CE (the ICRC does not cover the ECN bits).
    out.push(frame(
        &a,
        &b,
        CE,
        bth(Opcode::RC_WRITE_MIDDLE, b.qpn, 1002, false),
        none(),
        &buf[PMTU..2 * PMTU],
    ));
    out.push(frame(
        &a,
        &b,
        ECT0,
        bth(Opcode::RC_WRITE_LAST, b.qpn, 1003, true),
        none(),
        &buf[2 * PMTU..],
    ));
    // The responder's NIC (notification point) answers the CE mark with a CNP to the
    // sending QP, ConnectX style.
    let mut cnp = bth(Opcode::CNP, a.qpn, 0, false);
    cnp.becn = true;
    let b_cnp = Host {
        udp_src_port: 0,
        ..b
    };
    out.push(frame(&b_cnp, &a, (48 << 2) | ECT0, cnp, none(), &[]));
    out.push(ack(1003, 2));

    // RDMA READ of 1500 bytes: the request takes one PSN per response packet.
    let read = data(1500, 99);
    out.push(frame(
        &a,
        &b,
        ECT0,
        bth(Opcode::RC_READ_REQUEST, b.qpn, 1004, true),
        reth(va + 0x1000, rkey, read.len() as u32),
        &[],
    ));
    for (psn, op, part) in [
        (1004, Opcode::RC_READ_RESPONSE_FIRST, &read[..PMTU]),
        (1005, Opcode::RC_READ_RESPONSE_LAST, &read[PMTU..]),
    ] {
        out.push(frame(
            &b,
            &a,
            ECT0,
            bth(op, a.qpn, psn, false),
            aeth(Syndrome::ACK_UNLIMITED, 3),
            part,
        ));
    }

    // Compare-and-swap 0 → 1 on an 8-byte aligned address; the ATOMIC ACK returns the
    // original value.
    out.push(frame(
        &a,
        &b,
        ECT0,
        bth(Opcode::RC_CMP_SWAP, b.qpn, 1006, true),
        ExtHeaders {
            atomic: Some(AtomicEthRepr {
                va: va + 0x2000,
                rkey: Rkey(rkey),
                swap_add: 1,
                compare: 0,
            }),
            ..Default::default()
        },
        &[],
    ));
    out.push(frame(
        &b,
        &a,
        ECT0,
        bth(Opcode::RC_ATOMIC_ACK, a.qpn, 1006, false),
        ExtHeaders {
            atomic_ack: Some(AtomicAckEthRepr { orig: 0 }),
            ..aeth(Syndrome::ACK_UNLIMITED, 4)
        },
        &[],
    ));

    // A SEND with no receive WQE posted: RNR NAK (IBTA vol. 1 §9.7.5), timer code 14
    // (1.28 ms); the requester waits and sends the same PSN again.
    let msg = data(128, 3);
    out.push(frame(
        &a,
        &b,
        ECT0,
        bth(Opcode::RC_SEND_ONLY, b.qpn, 1007, true),
        none(),
        &msg,
    ));
    out.push(frame(
        &b,
        &a,
        ECT0,
        bth(Opcode::RC_ACK, a.qpn, 1007, false),
        aeth(Syndrome::RnrNak { timer: 14 }, 4),
        &[],
    ));
    out.wait(Duration::from_nanos(xrnic::wire::rnr_timer_ns(14)));
    out.push(frame(
        &a,
        &b,
        ECT0,
        bth(Opcode::RC_SEND_ONLY, b.qpn, 1007, true),
        none(),
        &msg,
    ));
    out.push(ack(1007, 5));

    // IPv6 on VLAN 100 (priority 3), a second connection.
    let tci = (3 << 13) | 100;
    let c = Host {
        mac: [0x02, 0, 0, 0, 0, 0x03],
        ip: IpAddrBytes::V6([0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        qpn: Qpn::new(0x21),
        udp_src_port: 0xc021,
        vlan_tci: Some(tci),
    };
    let d = Host {
        mac: [0x02, 0, 0, 0, 0, 0x04],
        ip: IpAddrBytes::V6([0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]),
        qpn: Qpn::new(0x22),
        udp_src_port: 0xc022,
        vlan_tci: Some(tci),
    };
    out.push(frame(
        &c,
        &d,
        ECT0,
        bth(Opcode::RC_SEND_ONLY_IMM, d.qpn, 500, true),
        ExtHeaders {
            immdt: Some(0xdead_beef),
            ..Default::default()
        },
        &data(37, 5),
    ));
    out.push(frame(
        &d,
        &c,
        ECT0,
        bth(Opcode::RC_ACK, c.qpn, 500, false),
        aeth(Syndrome::Ack { credit_code: 5 }, 1),
        &[],
    ));

    out.frames
}

/// Frames with capture times: 10 µs apart unless told to wait.
#[derive(Default)]
struct Timeline {
    now: Duration,
    frames: Vec<(Duration, Vec<u8>)>,
}

impl Timeline {
    fn push(&mut self, frame: Vec<u8>) {
        self.now += Duration::from_micros(10);
        self.frames.push((self.now, frame));
    }

    fn wait(&mut self, d: Duration) {
        self.now += d;
    }
}

/// Write `frames` (time offsets from `start`) as a pcapng file with one Ethernet interface.
pub fn write_pcapng(
    path: &Path,
    start: Duration,
    frames: &[(Duration, Vec<u8>)],
) -> Result<(), pcap_file::PcapError> {
    let file = File::create(path).map_err(pcap_file::PcapError::IoError)?;
    let mut w = PcapNgWriter::new(BufWriter::new(file))?;
    w.write_pcapng_block(InterfaceDescriptionBlock {
        linktype: DataLink::ETHERNET,
        snaplen: 0,
        // pcap-file writes EPB timestamps in nanoseconds; say so (if_tsresol 9), or
        // readers assume the pcapng default of microseconds.
        options: vec![InterfaceDescriptionOption::IfTsResol(9)],
    })?;
    for (t, f) in frames {
        w.write_pcapng_block(EnhancedPacketBlock {
            interface_id: 0,
            timestamp: start + *t,
            original_len: f.len() as u32,
            data: f.as_slice().into(),
            options: vec![],
        })?;
    }
    use std::io::Write;
    w.into_inner()
        .flush()
        .map_err(pcap_file::PcapError::IoError)?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    let path = std::env::args_os()
        .nth(1)
        .unwrap_or_else(|| "demo.pcapng".into());
    // A fixed start time keeps the file byte-for-byte reproducible.
    let start = Duration::from_secs(1_767_225_600); // 2026-01-01T00:00:00Z
    let frames = exchange();
    match write_pcapng(Path::new(&path), start, &frames) {
        Ok(()) => {
            eprintln!(
                "wrote {} RoCE v2 frames to {}",
                frames.len(),
                Path::new(&path).display()
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("write_capture: {}: {e}", Path::new(&path).display());
            std::process::ExitCode::from(1)
        }
    }
}
