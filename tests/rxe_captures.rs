//! Real Linux rxe traffic, recorded by `interop/run-rxe-pair.sh` between two rxe guests
//! (Debian 6.1 kernel, rdma-core 44, perftest 4.5) and cut small into `interop/captures/`
//! (provenance: interop/captures/README.md).
//!
//! For every committed capture: every UDP/4791 frame parses, carries a valid ICRC and
//! re-emits byte for byte from its `FrameRepr`. Then, per file, the facts the capture was
//! recorded to show: opcodes, PSN continuity, PMTU-sized middle packets, IPv6, and the
//! retransmissions in the lossy one. These are facts about rxe's behaviour that xrnic's
//! transport must match or tolerate (docs/interop.md).

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;

use xrnic::io::capture;
use xrnic::wire::{
    AethRepr, Error, FrameRepr, FrameView, IpRepr, NakCode, Opcode, Operation, Psn, Qpn, Segment,
    Syndrome,
};

/// One RoCE packet of a capture, reduced to what the assertions look at.
#[derive(Clone, Debug)]
struct Pkt {
    /// Frame number in the file (1-based, as Wireshark counts).
    number: usize,
    eth_src: [u8; 6],
    src: IpAddr,
    ip: IpRepr,
    udp_src_port: u16,
    udp_checksum: u16,
    opcode: Opcode,
    operation: Operation,
    segment: Segment,
    is_request: bool,
    mig_req: bool,
    ack_req: bool,
    dest_qp: Qpn,
    psn: Psn,
    payload_len: usize,
    aeth: Option<AethRepr>,
    reth_len: Option<u32>,
    has_atomic_ack: bool,
    pad: u8,
    deth_qkey: Option<u32>,
}

fn captures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("interop/captures")
}

/// Reads `interop/captures/NAME` and checks every RoCE frame: parse, ICRC, exact re-emission.
fn load(name: &str) -> Vec<Pkt> {
    let path = captures_dir().join(name);
    let frames = capture::read_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    for fr in &frames {
        let view = match FrameView::parse(&fr.data) {
            Ok(v) => v,
            // ARP and neighbour discovery are captured too.
            Err(Error::NotRoce(_)) => continue,
            Err(e) => panic!("{name} frame {}: {e}", fr.number),
        };
        view.verify_icrc()
            .unwrap_or_else(|e| panic!("{name} frame {}: {e}", fr.number));
        let repr = view.repr();
        let mut buf = vec![0xa5u8; repr.buffer_len()];
        let n = repr
            .emit(&mut buf)
            .unwrap_or_else(|e| panic!("{name} frame {}: emit: {e}", fr.number));
        assert_eq!(
            &buf[..n],
            &fr.data[..],
            "{name} frame {}: re-emitted bytes differ",
            fr.number
        );
        // FrameRepr::parse is the checked path (structure and ICRC in one call).
        assert_eq!(FrameRepr::parse(&fr.data).unwrap(), repr);

        let info = view.info();
        let bth = repr.roce.bth;
        let src = match repr.ip {
            IpRepr::V4 { src, .. } => IpAddr::from(src),
            IpRepr::V6 { src, .. } => IpAddr::from(src),
        };
        out.push(Pkt {
            number: fr.number,
            eth_src: repr.eth.src,
            src,
            ip: repr.ip,
            udp_src_port: repr.udp.src_port,
            udp_checksum: repr.udp.checksum,
            opcode: bth.opcode,
            operation: info.operation,
            segment: info.segment,
            is_request: info.is_request(),
            mig_req: bth.mig_req,
            ack_req: bth.ack_req,
            dest_qp: bth.dest_qp,
            psn: bth.psn,
            payload_len: repr.roce.payload.len(),
            aeth: repr.roce.ext.aeth,
            reth_len: repr.roce.ext.reth.map(|r| r.dma_len),
            has_atomic_ack: repr.roce.ext.atomic_ack.is_some(),
            pad: bth.pad_count,
            deth_qkey: repr.roce.ext.deth.map(|d| d.qkey),
        });
    }
    assert!(!out.is_empty(), "{name}: no RoCE packet");
    out
}

fn opcodes(pkts: &[Pkt]) -> BTreeSet<u8> {
    pkts.iter().map(|p| p.opcode.0).collect()
}

/// Requests grouped by (sender, destination QP), in capture order.
fn request_streams(pkts: &[Pkt]) -> HashMap<(IpAddr, Qpn), Vec<&Pkt>> {
    let mut m: HashMap<(IpAddr, Qpn), Vec<&Pkt>> = HashMap::new();
    for p in pkts.iter().filter(|p| p.is_request) {
        m.entry((p.src, p.dest_qp)).or_default().push(p);
    }
    m
}

/// PSN order of each request stream (IBTA vol. 1 §9.7, reliable service): a new PSN is always the highest so far
/// plus one, never a gap, and new packets form whole messages (FIRST, MIDDLE..., LAST, or
/// ONLY). A PSN at or below the highest is a retransmission (go-back-N resend). Returns the
/// number of retransmitted packets.
fn check_psn_order(name: &str, pkts: &[Pkt]) -> usize {
    let streams = request_streams(pkts);
    assert!(!streams.is_empty(), "{name}: no requests");
    let mut resent = 0;
    for ((src, qp), reqs) in streams {
        let mut highest = reqs[0].psn;
        // A cut capture may start inside a message.
        let mut in_message = matches!(reqs[0].segment, Segment::First | Segment::Middle);
        for p in &reqs[1..] {
            if !p.psn.after(highest) {
                resent += 1;
                continue;
            }
            assert_eq!(
                p.psn,
                highest.add(1),
                "{name}: {src} QP {qp:?} frame {}: PSN gap after {highest:?}",
                p.number
            );
            highest = p.psn;
            let starts = matches!(p.segment, Segment::First | Segment::Only);
            assert_eq!(
                starts, !in_message,
                "{name} frame {}: {:?}",
                p.number, p.opcode
            );
            in_message = matches!(p.segment, Segment::First | Segment::Middle);
        }
    }
    resent
}

/// FIRST and MIDDLE packets carry exactly the path MTU (IBTA vol.1 §9.7.2, rxe_req.c).
fn assert_mtu_sized(name: &str, pkts: &[Pkt], pmtu: usize) -> usize {
    let mut middles = 0;
    for p in pkts.iter().filter(|p| p.operation != Operation::Ack) {
        let pmtu_sized = matches!(p.segment, Segment::First | Segment::Middle)
            && p.operation != Operation::ReadRequest;
        if pmtu_sized {
            assert_eq!(
                p.payload_len, pmtu,
                "{name} frame {} ({:?})",
                p.number, p.opcode
            );
            middles += usize::from(p.segment == Segment::Middle);
        } else if p.payload_len > 0 {
            assert!(p.payload_len <= pmtu, "{name} frame {}", p.number);
        }
    }
    middles
}

fn is_ipv6(p: &Pkt) -> bool {
    matches!(p.ip, IpRepr::V6 { .. })
}

// --- facts common to everything rxe sends --------------------------------------------

/// What rxe puts in the headers xrnic does not control on receive (rxe_net.c, rxe_qp.c; docs/wire-format.md §5): UDP
/// checksum 0, TTL / hop limit 64, DSCP/ECN 0 and flow label 0 by default, MigReq 0, every
/// ACK "unlimited credits" (syndrome 0x1F), one UDP source port per QP for both directions.
#[test]
fn rxe_header_conventions_hold_in_every_capture() {
    let mut files: Vec<String> = std::fs::read_dir(captures_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".pcapng"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 6,
        "expected the committed captures, found {files:?}"
    );
    for f in &files {
        // Fixtures stay small (cut with editcap, interop/captures/README.md).
        let size = std::fs::metadata(captures_dir().join(f)).unwrap().len();
        assert!(size < 100 * 1024, "{f} is {size} bytes");
        // xrnic ⟷ rxe captures hold two stacks' conventions: checked below.
        if f.starts_with(XRNIC_PREFIX) {
            continue;
        }
        let pkts = load(f);
        for p in &pkts {
            assert_eq!(p.udp_checksum, 0, "{f} frame {}", p.number);
            assert!(!p.mig_req, "{f} frame {}", p.number);
            match p.ip {
                IpRepr::V4 {
                    tos,
                    ttl,
                    dont_fragment,
                    ..
                } => {
                    assert_eq!(
                        (tos, ttl, dont_fragment),
                        (0, 64, true),
                        "{f} #{}",
                        p.number
                    );
                }
                IpRepr::V6 {
                    traffic_class,
                    flow_label,
                    hop_limit,
                    ..
                } => {
                    assert_eq!((traffic_class, flow_label, hop_limit), (0, 0, 64), "{f}");
                }
            }
            if let Some(AethRepr {
                syndrome: Syndrome::Ack { credit_code },
                ..
            }) = p.aeth
            {
                assert_eq!(credit_code, 31, "{f} frame {}", p.number);
            }
            // rxe's source port is 0xC000 | a 14-bit value derived from the QP pair.
            assert_eq!(p.udp_src_port & 0xC000, 0xC000, "{f} frame {}", p.number);
        }
        // Each capture holds one RC QP pair, and both directions use the same port
        // (stock_ud_*: UD datagrams only, no RC QP).
        let rc_ports: BTreeSet<u16> = pkts
            .iter()
            .filter(|p| p.opcode.0 < 0x20)
            .map(|p| p.udp_src_port)
            .collect();
        let rc = if f.starts_with("stock_ud_") { 0 } else { 1 };
        assert_eq!(rc_ports.len(), rc, "{f}: RC source ports {rc_ports:?}");
    }
}

// --- per capture ----------------------------------------------------------------------

fn acks(pkts: &[Pkt]) -> Vec<&Pkt> {
    pkts.iter()
        .filter(|p| p.operation == Operation::Ack)
        .collect()
}

/// rxe asks for an ACK only on the last packet of a message (AckReq on LAST/ONLY; messages
/// here are shorter than its 64-packet limit), and its responder answers each AckReq with
/// one ACK carrying that packet's PSN: one ACK per message, never one per packet
/// (the IBTA reliable service allows one ACK to cover many PSNs). Returns how many ACKs matched a request in the cut.
fn assert_one_ack_per_message(name: &str, pkts: &[Pkt]) -> usize {
    for p in pkts.iter().filter(|p| p.is_request) {
        let ends = matches!(p.segment, Segment::Last | Segment::Only);
        assert_eq!(p.ack_req, ends, "{name} frame {} AckReq", p.number);
    }
    let mut matched = 0;
    for a in acks(pkts) {
        assert!(
            matches!(a.aeth.map(|x| x.syndrome), Some(Syndrome::Ack { .. })),
            "{name} frame {}",
            a.number
        );
        // The acknowledged request may lie before the start of a cut capture.
        if let Some(acked) = pkts
            .iter()
            .find(|r| r.is_request && r.psn == a.psn && r.number < a.number)
        {
            assert!(
                acked.ack_req,
                "{name} frame {}: ACK of frame {}",
                a.number, acked.number
            );
            matched += 1;
        }
    }
    assert!(matched > 0, "{name}: no ACK of a captured request");
    matched
}

#[test]
fn rc_pingpong_one_byte_send_only_with_pad() {
    let name = "rc_pingpong_v4_s1.pcapng";
    let pkts = load(name);
    assert_eq!(
        opcodes(&pkts),
        BTreeSet::from([Opcode::RC_SEND_ONLY.0, Opcode::RC_ACK.0])
    );
    for p in pkts.iter().filter(|p| p.is_request) {
        // 1 byte of payload, padded to a 4-byte multiple: PadCnt 3 (BTH, IBTA vol.1 §9.2).
        assert_eq!((p.payload_len, p.pad), (1, 3), "{name} frame {}", p.number);
    }
    assert!(pkts.iter().all(|p| !is_ipv6(p)));
    check_psn_order(name, &pkts);
    assert_one_ack_per_message(name, &pkts);
    // Both sides send (ping and pong) to each other's QP.
    let senders: BTreeSet<IpAddr> = pkts
        .iter()
        .filter(|p| p.is_request)
        .map(|p| p.src)
        .collect();
    assert_eq!(senders.len(), 2);
}

/// rxe resends requests that were not lost: its requester arms the retransmit timer
/// (ibv_rc_pingpong: timeout 14 = 67 ms) only when the timer is not already pending, and an
/// ACK re-arms it only while packets are outstanding; so a timer armed by an earlier ping
/// can expire while the next ping waits for its ACK, and that message is sent again
/// (rxe_req.c update_state, rxe_comp.c; its comments call such timeouts spurious). The
/// responder treats the copy as a duplicate (IBTA vol. 1 §9.7, duplicate requests): it
/// acknowledges it again with the same PSN and the same MSN, and does not deliver it twice
/// (the MSN of the next new request's ACK goes up by exactly one).
#[test]
fn rc_pingpong_duplicate_request_is_acked_again_with_the_same_msn() {
    let name = "rc_pingpong_v4_s1.pcapng";
    let pkts = load(name);
    assert!(check_psn_order(name, &pkts) >= 1, "{name}: a resend");
    let mut by_psn: HashMap<(IpAddr, Psn), Vec<&Pkt>> = HashMap::new();
    for p in pkts.iter().filter(|p| p.is_request) {
        by_psn.entry((p.src, p.psn)).or_default().push(p);
    }
    let msn = |a: &Pkt| a.aeth.unwrap().msn.value();
    let mut checked = 0;
    for (&(src, psn), copies) in by_psn.iter().filter(|(_, v)| v.len() > 1) {
        let acks_of: Vec<&Pkt> = acks(&pkts)
            .into_iter()
            .filter(|a| a.src != src && a.psn == psn)
            .collect();
        assert_eq!(
            acks_of.len(),
            copies.len(),
            "{name}: each copy of {psn:?} acked"
        );
        assert!(acks_of.iter().all(|a| msn(a) == msn(acks_of[0])));
        if let Some(next) = acks(&pkts)
            .into_iter()
            .find(|a| a.src != src && a.psn == psn.add(1))
        {
            assert_eq!(
                msn(next),
                msn(acks_of[0]) + 1,
                "{name} frame {}",
                next.number
            );
            checked += 1;
        }
    }
    assert!(checked >= 1);
}

#[test]
fn rc_pingpong_pmtu_1024_sends_full_middle_packets() {
    let name = "rc_pingpong_v4_mtu1024.pcapng";
    let pkts = load(name);
    let ops = opcodes(&pkts);
    for op in [
        Opcode::RC_SEND_FIRST,
        Opcode::RC_SEND_MIDDLE,
        Opcode::RC_SEND_LAST,
        Opcode::RC_ACK,
    ] {
        assert!(ops.contains(&op.0), "{name}: no {op:?} in {ops:?}");
    }
    assert!(assert_mtu_sized(name, &pkts, 1024) >= 10);
    check_psn_order(name, &pkts);
    assert_one_ack_per_message(name, &pkts);
    assert!(pkts.iter().all(|p| !is_ipv6(p)));
}

#[test]
fn rc_pingpong_pmtu_4096_on_a_9000_byte_link() {
    let name = "rc_pingpong_v4_mtu4096.pcapng";
    let pkts = load(name);
    assert!(assert_mtu_sized(name, &pkts, 4096) >= 14);
    assert_eq!(check_psn_order(name, &pkts), 0);
    // A 65536-byte message is exactly 16 packets: FIRST, 14 MIDDLE, LAST with AckReq.
    let first = pkts
        .iter()
        .position(|p| p.opcode == Opcode::RC_SEND_FIRST)
        .unwrap();
    let msg = &pkts[first..first + 16];
    assert_eq!(msg[15].opcode, Opcode::RC_SEND_LAST);
    assert!(msg[15].ack_req && !msg[14].ack_req);
    assert_eq!(msg[15].psn, msg[0].psn.add(15));
}

#[test]
fn write_bw_over_ipv6() {
    let name = "write_bw_v6.pcapng";
    let pkts = load(name);
    assert!(
        pkts.iter().all(is_ipv6),
        "{name}: every RoCE packet is IPv6"
    );
    assert_eq!(
        opcodes(&pkts),
        BTreeSet::from([
            Opcode::RC_WRITE_FIRST.0,
            Opcode::RC_WRITE_MIDDLE.0,
            Opcode::RC_WRITE_LAST.0,
            Opcode::RC_ACK.0
        ])
    );
    // ib_write_bw -s 8192: the RETH of each FIRST covers the whole message.
    for p in pkts.iter().filter(|p| p.opcode == Opcode::RC_WRITE_FIRST) {
        assert_eq!(p.reth_len, Some(8192), "{name} frame {}", p.number);
    }
    assert!(assert_mtu_sized(name, &pkts, 1024) >= 6);
    assert_eq!(check_psn_order(name, &pkts), 0);
    // The responder's ACKs come in bursts, but still one per message.
    assert!(assert_one_ack_per_message(name, &pkts) >= 5);
}

/// READ: each request consumes one PSN per response packet (4096 B at PMTU
/// 1024 = 4 PSNs); the responses carry exactly those PSNs, FIRST and LAST with an AETH,
/// MIDDLE without; the responses are the only acknowledgement (no ACK packets).
#[test]
fn read_bw_over_ipv6_responses_use_the_requests_psns() {
    let name = "read_bw_v6.pcapng";
    let pkts = load(name);
    assert!(pkts.iter().all(is_ipv6));
    assert!(acks(&pkts).is_empty(), "{name}: READ needs no ACK packets");
    let reqs: Vec<&Pkt> = pkts
        .iter()
        .filter(|p| p.opcode == Opcode::RC_READ_REQUEST)
        .collect();
    assert!(reqs.len() >= 8);
    for w in reqs.windows(2) {
        assert_eq!(w[1].psn, w[0].psn.add(4), "{name} frame {}", w[1].number);
    }
    let mut complete = 0;
    for r in &reqs {
        assert_eq!(r.reth_len, Some(4096));
        assert!(
            r.ack_req,
            "{name} frame {}: READ request without AckReq",
            r.number
        );
        let resp: Vec<&Pkt> = pkts
            .iter()
            .filter(|p| p.operation == Operation::ReadResponse && p.psn.diff(r.psn) >= 0)
            .filter(|p| p.psn.diff(r.psn) < 4)
            .collect();
        if resp.len() < 4 {
            continue; // the cut ends before this request's responses
        }
        complete += 1;
        let segs: Vec<Segment> = resp.iter().map(|p| p.segment).collect();
        assert_eq!(
            segs,
            [
                Segment::First,
                Segment::Middle,
                Segment::Middle,
                Segment::Last
            ]
        );
        for (i, p) in resp.iter().enumerate() {
            assert_eq!(p.psn, r.psn.add(i as u32));
            assert_eq!(p.payload_len, 1024);
            assert_eq!(
                p.aeth.is_some(),
                i == 0 || i == 3,
                "{name} frame {}",
                p.number
            );
            assert!(p.number > r.number);
        }
    }
    assert!(complete >= 5, "{name}: only {complete} complete READs");
}

/// Atomics: one request packet, no payload; the responder answers each with an ATOMIC
/// ACKNOWLEDGE of the same PSN carrying the original value (AtomicAckETH).
fn assert_atomics(name: &str, op: Opcode, ipv6: bool) {
    let pkts = load(name);
    assert_eq!(
        opcodes(&pkts),
        BTreeSet::from([op.0, Opcode::RC_ATOMIC_ACK.0])
    );
    assert!(pkts.iter().all(|p| is_ipv6(p) == ipv6));
    assert_eq!(check_psn_order(name, &pkts), 0);
    let mut answered = 0;
    for r in pkts.iter().filter(|p| p.opcode == op) {
        assert_eq!(r.payload_len, 0);
        assert!(r.ack_req);
        if let Some(a) = pkts
            .iter()
            .find(|a| a.opcode == Opcode::RC_ATOMIC_ACK && a.psn == r.psn)
        {
            assert!(a.has_atomic_ack && a.number > r.number);
            assert!(matches!(
                a.aeth.map(|x| x.syndrome),
                Some(Syndrome::Ack { .. })
            ));
            answered += 1;
        }
    }
    // perftest posts many atomics at once (up to max_rd_atomic outstanding); every one of
    // the 200 is answered.
    assert_eq!(answered, 200, "{name}: atomics answered");
}

#[test]
fn atomic_fetch_add_over_ipv4() {
    assert_atomics("atomic_fetch_add_v4.pcapng", Opcode::RC_FETCH_ADD, false);
}

#[test]
fn atomic_cmp_swap_over_ipv6() {
    assert_atomics("atomic_cmp_swap_v6.pcapng", Opcode::RC_CMP_SWAP, true);
}

/// netem dropped 2 % of the writer's packets before the bridge: the responder answers the
/// first out-of-order packet with a NAK "PSN sequence error" naming the PSN it expects
/// (IBTA vol.1 §9.7.5.2, NAK code 0), and the requester goes back to exactly that PSN and resends from
/// there, so PSNs after the gap appear twice (go-back-N, rxe_comp.c / rxe_req.c).
#[test]
fn write_bw_loss_shows_nak_and_go_back_n_retransmission() {
    let name = "write_bw_loss_v4.pcapng";
    let pkts = load(name);
    let nak = pkts
        .iter()
        .find(|p| {
            matches!(
                p.aeth.map(|a| a.syndrome),
                Some(Syndrome::Nak(NakCode::PsnSequenceError))
            )
        })
        .expect("a PSN sequence error NAK");
    let lost = nak.psn;
    let before: Vec<&Pkt> = pkts
        .iter()
        .filter(|p| p.is_request && p.number < nak.number)
        .collect();
    assert!(
        before.iter().all(|p| p.psn != lost),
        "{name}: the NAK'd PSN never reached the wire"
    );
    assert!(before.iter().any(|p| p.psn == lost.add(1)), "{name}: gap");
    // The first packet that goes back after the NAK starts at the NAK'd PSN.
    let highest = before
        .iter()
        .map(|p| p.psn)
        .max_by(|a, b| a.diff(*b).cmp(&0))
        .unwrap();
    let resend = pkts
        .iter()
        .filter(|p| p.is_request && p.number > nak.number)
        .find(|p| !p.psn.after(highest))
        .expect("a retransmission after the NAK");
    assert_eq!(resend.psn, lost, "{name} frame {}", resend.number);
    // PSNs seen twice: the retransmitted ones, all at or after the lost PSN.
    let mut seen: HashMap<Psn, usize> = HashMap::new();
    for p in pkts.iter().filter(|p| p.is_request) {
        *seen.entry(p.psn).or_default() += 1;
    }
    let twice: Vec<Psn> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(p, _)| *p)
        .collect();
    assert!(
        twice.len() >= 10,
        "{name}: {} retransmitted PSNs",
        twice.len()
    );
    assert!(twice.iter().all(|p| !p.before(lost)));
    // PMTU-sized packets throughout, resent ones included.
    assert!(assert_mtu_sized(name, &pkts, 1024) >= 60);
}

/// rping goes through the RDMA CM: CM MADs on UD QP1 (SEND ONLY + DETH, Q_Key
/// 0x80010000, 256-byte MAD) set up an RC QP, then rping's SEND / WRITE / READ rounds.
#[test]
fn rping_uses_cm_mads_on_qp1_then_rc() {
    let name = "rping_v4.pcapng";
    let pkts = load(name);
    let mads: Vec<&Pkt> = pkts
        .iter()
        .filter(|p| p.opcode == Opcode::UD_SEND_ONLY)
        .collect();
    assert!(mads.len() >= 3, "{name}: REQ, REP, RTU");
    for m in &mads {
        assert_eq!(m.dest_qp, Qpn::GSI);
        assert_eq!(m.deth_qkey, Some(0x8001_0000));
        assert_eq!(m.payload_len, 256);
    }
    let first_rc = pkts.iter().position(|p| p.opcode.0 < 0x20).unwrap();
    assert!(
        pkts[first_rc].number > mads[2].number,
        "{name}: RC only after REQ/REP/RTU"
    );
    let ops = opcodes(&pkts);
    for op in [
        Opcode::RC_SEND_ONLY,
        Opcode::RC_WRITE_FIRST,
        Opcode::RC_READ_REQUEST,
        Opcode::RC_READ_RESPONSE_FIRST,
    ] {
        assert!(ops.contains(&op.0), "{name}: no {op:?}");
    }
}

// --- xrnic ⟷ rxe ---------------------------------------------------------------------

/// Captures of xrnic talking to rxe (`interop/run-xrnic-rxe.sh`) are named `xrnic_*`.
const XRNIC_PREFIX: &str = "xrnic_";
/// Those of `xrnic perf` against the perftest tools are named `xrnic_perf_*`.
const XRNIC_PERF_PREFIX: &str = "xrnic_perf_";
/// Where run-xrnic-rxe.sh puts xrnic (192.0.2.100 / fd00::100) and the rxe guest (.11).
const XRNIC_IPS: [&str; 2] = ["192.0.2.100", "fd00::100"];
const RXE_IPS: [&str; 2] = ["192.0.2.11", "fd00::11"];

fn xrnic_captures() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(captures_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(XRNIC_PREFIX) && n.ends_with(".pcapng"))
        .collect();
    files.sort();
    files
}

/// Both stacks' packets are in each xrnic ⟷ rxe capture (each from its own MAC and
/// address, requests and ACKs from both), every one parses, has a valid ICRC and re-emits
/// byte for byte (`load`); both follow the same conventions on the wire: UDP checksum 0,
/// TTL / hop limit 64 (ib_core gives rxe the route's, xrnic does the same), DSCP 0,
/// flow label 0, DF, MigReq 0, unlimited credits, AckReq on the last packet of a message and
/// one ACK per message, no PSN gap. The one header difference: each stack picks its own
/// UDP source port in the 0xC000 range (rxe from the QP pair, xrnic from its own QPN),
/// one per QP for all its packets (docs/interop.md).
#[test]
fn xrnic_and_rxe_both_on_the_wire_with_the_same_conventions() {
    let files = xrnic_captures();
    assert!(
        files.len() >= 2,
        "expected the committed xrnic ⟷ rxe captures, found {files:?}"
    );
    for f in &files {
        let pkts = load(f);
        let side = |p: &Pkt| side_of(f, p);
        // ibv_rc_pingpong captures: both stacks send and acknowledge. perftest captures
        // (xrnic_perf_*): one requester, one responder.
        let pingpong = !f.starts_with(XRNIC_PERF_PREFIX);
        assert!(pkts.iter().any(|p| p.is_request), "{f}: no request");
        assert!(pkts.iter().any(|p| !p.is_request), "{f}: no response");
        for who in ["xrnic", "rxe"] {
            let mine: Vec<&Pkt> = pkts.iter().filter(|p| side(p) == who).collect();
            assert!(!mine.is_empty(), "{f}: nothing from {who}");
            assert!(
                !pingpong || mine.iter().any(|p| p.is_request),
                "{f}: no request from {who}"
            );
            assert!(
                !pingpong || mine.iter().any(|p| p.operation == Operation::Ack),
                "{f}: no ACK from {who}"
            );
            let macs: BTreeSet<[u8; 6]> = mine.iter().map(|p| p.eth_src).collect();
            let ports: BTreeSet<u16> = mine.iter().map(|p| p.udp_src_port).collect();
            assert_eq!(macs.len(), 1, "{f}: {who} MACs {macs:?}");
            assert_eq!(ports.len(), 1, "{f}: {who} source ports {ports:?}");
            let port = *ports.first().unwrap();
            assert_eq!(port & 0xC000, 0xC000, "{f}: {who} port {port:#x}");
        }
        let mac_of = |who: &str| pkts.iter().find(|p| side(p) == who).unwrap().eth_src;
        assert_ne!(mac_of("xrnic"), mac_of("rxe"), "{f}");
        // rxe's qemu NIC (52:54:00 is qemu's prefix).
        assert_eq!(mac_of("rxe")[..3], [0x52, 0x54, 0x00], "{f}");
        for p in &pkts {
            let at = format!("{f} frame {} ({})", p.number, side(p));
            assert_eq!(p.udp_checksum, 0, "{at}");
            assert!(!p.mig_req, "{at}");
            match p.ip {
                IpRepr::V4 {
                    tos,
                    ttl,
                    dont_fragment,
                    ..
                } => assert_eq!((tos, ttl, dont_fragment), (0, 64, true), "{at}"),
                IpRepr::V6 {
                    traffic_class,
                    flow_label,
                    hop_limit,
                    ..
                } => assert_eq!((traffic_class, flow_label, hop_limit), (0, 0, 64), "{at}"),
            }
            if let Some(AethRepr {
                syndrome: Syndrome::Ack { credit_code },
                ..
            }) = p.aeth
            {
                assert_eq!(credit_code, 31, "{at}");
            }
        }
        // READ requests use several PSNs and RNR NAKs are not ACKs: the perftest captures
        // check their own sequences below.
        if pingpong {
            check_psn_order(f, &pkts);
            assert_one_ack_per_message(f, &pkts);
        }
    }
}

/// Which stack sent `p`: by address, and for link-local (fe80::) addresses by MAC (rxe's
/// is qemu's, 52:54:00:...).
fn side_of(f: &str, p: &Pkt) -> &'static str {
    let ip = p.src.to_string();
    if XRNIC_IPS.contains(&ip.as_str()) {
        "xrnic"
    } else if RXE_IPS.contains(&ip.as_str()) {
        "rxe"
    } else if ip.starts_with("fe80:") {
        if p.eth_src[..3] == [0x52, 0x54, 0x00] {
            "rxe"
        } else {
            "xrnic"
        }
    } else {
        panic!("{f} frame {}: unexpected source {ip}", p.number)
    }
}

/// xrnic as the ibv_rc_pingpong client over IPv4 with 1-byte messages: SEND ONLY with
/// PadCnt 3 from both stacks, xrnic first (the client sends first).
#[test]
fn xrnic_client_one_byte_pingpong_with_rxe() {
    let name = "xrnic_client_v4_s1.pcapng";
    let pkts = load(name);
    assert_eq!(
        opcodes(&pkts),
        BTreeSet::from([Opcode::RC_SEND_ONLY.0, Opcode::RC_ACK.0])
    );
    let first = pkts.iter().find(|p| p.is_request).unwrap();
    assert_eq!(
        first.src.to_string(),
        XRNIC_IPS[0],
        "{name}: the client sends first"
    );
    for p in pkts.iter().filter(|p| p.is_request) {
        assert_eq!((p.payload_len, p.pad), (1, 3), "{name} frame {}", p.number);
    }
    let senders: BTreeSet<IpAddr> = pkts
        .iter()
        .filter(|p| p.is_request)
        .map(|p| p.src)
        .collect();
    assert_eq!(senders.len(), 2, "{name}");
}

/// xrnic as the ibv_rc_pingpong server over IPv6 GIDs at PMTU 1024: multi-packet SENDs
/// with PMTU-sized FIRST / MIDDLE packets from both stacks, rxe first.
#[test]
fn xrnic_server_ipv6_pmtu_1024_pingpong_with_rxe() {
    let name = "xrnic_server_v6_s4096.pcapng";
    let pkts = load(name);
    assert!(pkts.iter().all(is_ipv6), "{name}: IPv6 only");
    let first = pkts.iter().find(|p| p.is_request).unwrap();
    assert_eq!(
        first.src.to_string(),
        RXE_IPS[1],
        "{name}: the client sends first"
    );
    assert!(
        assert_mtu_sized(name, &pkts, 1024) > 0,
        "{name}: MIDDLE packets"
    );
    for ip in [XRNIC_IPS[1], RXE_IPS[1]] {
        let segs: BTreeSet<u8> = pkts
            .iter()
            .filter(|p| p.is_request && p.src.to_string() == ip)
            .map(|p| p.opcode.0)
            .collect();
        assert_eq!(
            segs,
            BTreeSet::from([
                Opcode::RC_SEND_FIRST.0,
                Opcode::RC_SEND_MIDDLE.0,
                Opcode::RC_SEND_LAST.0
            ]),
            "{name}: {ip}"
        );
    }
}

// --- xrnic perf ⟷ perftest ------------------------------------------------------------

/// `xrnic perf read` as the client of the stock `ib_read_bw` over the link-local (fe80::)
/// GIDs, index 0 on both sides: every packet goes between the two fe80:: addresses derived
/// from the MACs; xrnic sends only READ requests, 4096 bytes each and 4 PSNs apart at PMTU
/// 1024, at most 16 outstanding (its max_rd_atomic, below the 128 rxe offers); rxe answers
/// each with READ RESPONSE FIRST / MIDDLE / MIDDLE / LAST on the request's PSNs, AETH on
/// FIRST and LAST only.
#[test]
fn xrnic_perf_read_client_over_link_local_gids() {
    let name = "xrnic_perf_read_client_ll.pcapng";
    let pkts = load(name);
    let mut requests: Vec<&Pkt> = Vec::new();
    let mut answered = 0;
    for p in &pkts {
        let at = format!("{name} frame {}", p.number);
        let IpRepr::V6 { src, dst, .. } = p.ip else {
            panic!("{at}: not IPv6")
        };
        for a in [src, dst].map(std::net::Ipv6Addr::from) {
            assert_eq!(a.segments()[0], 0xfe80, "{at}: {a}");
            // The interface ID is the MAC's EUI-64 (ff:fe in the middle).
            assert_eq!(a.octets()[11..13], [0xff, 0xfe], "{at}: {a}");
        }
        match side_of(name, p) {
            "xrnic" => {
                assert_eq!(p.operation, Operation::ReadRequest, "{at}");
                assert_eq!(p.reth_len, Some(4096), "{at}");
                if let Some(prev) = requests.last() {
                    assert_eq!(p.psn, prev.psn.add(4), "{at}: 4 PSNs per READ");
                }
                requests.push(p);
            }
            _ => {
                assert_eq!(p.operation, Operation::ReadResponse, "{at}");
                let req = requests
                    .iter()
                    .find(|r| p.psn.diff(r.psn) >= 0 && p.psn.diff(r.psn) < 4)
                    .unwrap_or_else(|| panic!("{at}: response to no captured request"));
                let k = p.psn.diff(req.psn);
                let want = match k {
                    0 => Segment::First,
                    3 => Segment::Last,
                    _ => Segment::Middle,
                };
                assert_eq!(p.segment, want, "{at}");
                assert_eq!(p.aeth.is_some(), k == 0 || k == 3, "{at}: AETH");
                assert_eq!(p.payload_len, 1024, "{at}");
                answered += 1;
            }
        }
    }
    let first_response = pkts.iter().position(|p| side_of(name, p) == "rxe").unwrap();
    let ahead = pkts[..first_response]
        .iter()
        .filter(|p| side_of(name, p) == "xrnic")
        .count();
    assert_eq!(
        ahead, 16,
        "{name}: READs in flight before the first response"
    );
    assert!(answered >= 16, "{name}: {answered} responses");
}

/// The RNR NAKs of a capture sent by `who`: (the NAK, its RNR timer code).
fn rnr_naks<'a>(name: &str, pkts: &'a [Pkt], who: &str) -> Vec<(&'a Pkt, u8)> {
    pkts.iter()
        .filter(|p| side_of(name, p) == who)
        .filter_map(|p| match p.aeth.map(|a| a.syndrome) {
            Some(Syndrome::RnrNak { timer }) => Some((p, timer)),
            _ => None,
        })
        .collect()
}

/// After `nak` (an RNR NAK naming PSN P), the requester (`who`) sends P again, and the
/// responder later acknowledges P or a PSN after it: the transfer went on.
fn assert_rnr_retried(name: &str, pkts: &[Pkt], nak: &Pkt, requester: &str) {
    let retry = pkts
        .iter()
        .find(|p| {
            p.number > nak.number
                && side_of(name, p) == requester
                && p.is_request
                && p.psn == nak.psn
        })
        .unwrap_or_else(|| {
            panic!(
                "{name}: no retry of PSN {:?} after frame {}",
                nak.psn, nak.number
            )
        });
    let acked = pkts.iter().find(|p| {
        p.number > retry.number
            && p.operation == Operation::Ack
            && matches!(p.aeth.map(|a| a.syndrome), Some(Syndrome::Ack { .. }))
            && p.psn.diff(nak.psn) >= 0
    });
    assert!(
        acked.is_some(),
        "{name}: PSN {:?} (retried at frame {}) never acknowledged",
        nak.psn,
        retry.number
    );
}

/// `xrnic perf send -r 1` (one receive posted at a time) as the server of the stock
/// `ib_send_bw`: rxe's SENDs arrive faster than xrnic reposts, so xrnic answers with RNR
/// NAKs (AETH 0b001 + timer code 12 = 0.64 ms, the min_rnr_timer perftest and xrnic both
/// use, IBTA vol. 1 §9.7.5) carrying the MSN of the last completed message; rxe waits,
/// sends the NAKed PSN again and xrnic acknowledges it.
#[test]
fn xrnic_perf_send_server_rnr_naks_and_rxe_retries() {
    let name = "xrnic_perf_rnr_server.pcapng";
    let pkts = load(name);
    for p in pkts.iter().filter(|p| side_of(name, p) == "rxe") {
        assert_eq!(p.opcode, Opcode::RC_SEND_ONLY, "{name} frame {}", p.number);
        assert_eq!(p.payload_len, 64, "{name} frame {}", p.number);
    }
    let naks = rnr_naks(name, &pkts, "xrnic");
    assert!(
        naks.len() >= 2,
        "{name}: {} RNR NAKs from xrnic",
        naks.len()
    );
    for &(nak, timer) in &naks {
        assert_eq!(timer, 12, "{name} frame {}", nak.number);
        // The MSN of an RNR NAK is that of the last ACK before it: nothing completed.
        let prev = pkts
            .iter()
            .rev()
            .find(|p| p.number < nak.number && side_of(name, p) == "xrnic")
            .and_then(|p| p.aeth)
            .unwrap_or_else(|| panic!("{name}: no ACK before frame {}", nak.number));
        assert_eq!(
            nak.aeth.unwrap().msn,
            prev.msn,
            "{name} frame {}",
            nak.number
        );
    }
    assert_rnr_retried(name, &pkts, naks[0].0, "rxe");
    // xrnic itself never NAKs a sequence error here: it drops what follows the RNR-NAKed
    // packet silently until the retry comes.
    assert!(
        pkts.iter()
            .all(|p| !matches!(p.aeth.map(|a| a.syndrome), Some(Syndrome::Nak(_)))),
        "{name}: a NAK"
    );
}

/// `xrnic perf send` as the client of the stock `ib_send_bw -r 1`: rxe answers the SEND
/// it has no receive for with an RNR NAK (timer code 12) and, for the next packet already in
/// flight, a NAK "PSN sequence error" naming the same PSN (rxe_resp.c: the packets after
/// the RNR-NAKed one are out of sequence); xrnic goes back to that PSN, resends, and rxe
/// acknowledges it once a receive is posted.
#[test]
fn xrnic_perf_send_client_retries_after_rxe_rnr_naks() {
    let name = "xrnic_perf_rnr_client.pcapng";
    let pkts = load(name);
    let naks = rnr_naks(name, &pkts, "rxe");
    assert!(!naks.is_empty(), "{name}: no RNR NAK from rxe");
    for &(nak, timer) in &naks {
        assert_eq!(timer, 12, "{name} frame {}", nak.number);
        let next = pkts
            .iter()
            .find(|p| p.number > nak.number && side_of(name, p) == "rxe")
            .unwrap_or_else(|| panic!("{name}: nothing from rxe after frame {}", nak.number));
        assert_eq!(
            (next.psn, next.aeth.map(|a| a.syndrome)),
            (nak.psn, Some(Syndrome::Nak(NakCode::PsnSequenceError))),
            "{name} frame {}",
            next.number
        );
    }
    assert_rnr_retried(name, &pkts, naks[0].0, "xrnic");
    for p in pkts.iter().filter(|p| side_of(name, p) == "xrnic") {
        assert_eq!(p.opcode, Opcode::RC_SEND_ONLY, "{name} frame {}", p.number);
    }
}
