//! `xrnic decode` and `xrnic explain` on RoCE v1 frames (EtherType 0x8915: GRH + BTH, IBTA
//! vol. 1 annex A16) and on vendor opcodes (Mellanox/NVIDIA DC, the opcode class IBTA gives
//! RD), as a user runs them: the built binary on captures this test writes.
//!
//! The vectors (../shared/vectors) hold no RoCE v1 frame, so the v1 frames here are made by
//! hand from RoCE v2 frames: the IPv6 header becomes the GRH (same layout, IBTA vol. 1
//! §8.3) with next header 0x1B and PayLen the bytes from the BTH to the ICRC, the UDP
//! header goes, the BTH and payload stay, and the ICRC is computed by this test's own
//! oracle: a masked copy of GRH + BTH + payload hashed after 8 bytes of ones (IBTA vol. 1
//! §7.8.1), independent of the fix tables `xrnic::wire::icrc` computes it with.

mod cli_support;

use cli_support::write_capture::{Host, IpAddrBytes, bth, data, frame};
use cli_support::*;
use xrnic::wire::{AethRepr, ExtHeaders, Msn, Opcode, Qpn, Syndrome, icrc};

const ETH: usize = 14;
const GRH: usize = 40;
const UDP: usize = 8;

fn host(last: u8, qpn: u32) -> Host {
    let mut ip = [0u8; 16];
    ip[..2].copy_from_slice(&[0xfe, 0x80]);
    ip[15] = last;
    Host {
        mac: [2, 0, 0, 0, 0, last],
        ip: IpAddrBytes::V6(ip),
        qpn: Qpn::new(qpn),
        udp_src_port: 0xc000 | qpn as u16,
        vlan_tci: None,
    }
}

/// RoCE v2 over IPv6: an RC SEND ONLY of 40 bytes and its ACK.
fn v2_send_and_ack() -> (Vec<u8>, Vec<u8>) {
    let (a, b) = (host(1, 0x11), host(2, 0x12));
    let send = frame(
        &a,
        &b,
        0,
        bth(Opcode::RC_SEND_ONLY, b.qpn, 77, true),
        ExtHeaders::default(),
        &data(40, 9),
    );
    let ack = frame(
        &b,
        &a,
        0,
        bth(Opcode::RC_ACK, a.qpn, 77, false),
        ExtHeaders {
            aeth: Some(AethRepr {
                syndrome: Syndrome::ACK_UNLIMITED,
                msn: Msn::new(1),
            }),
            ..Default::default()
        },
        &[],
    );
    (send, ack)
}

/// The ICRC of a v1 packet (`pkt`: GRH to just before the ICRC), by a masked copy: the
/// GRH's traffic class and flow label (byte 0's low nibble, bytes 1-3), hop limit (byte
/// 7) and BTH byte 4 as ones, after 8 bytes of ones.
fn v1_icrc_oracle(pkt: &[u8]) -> [u8; 4] {
    let mut m = vec![0xffu8; 8];
    m.extend_from_slice(pkt);
    m[8] |= 0x0f;
    for i in [1, 2, 3, 7, GRH + 4] {
        m[8 + i] = 0xff;
    }
    crc32fast::hash(&m).to_le_bytes()
}

/// The RoCE v1 frame that carries the same BTH, headers and payload as the RoCE v2 over
/// IPv6 frame `v2`, with traffic class 0xa4, flow label 0x12345 and hop limit 17.
fn to_v1(v2: &[u8]) -> Vec<u8> {
    let ip = &v2[ETH..ETH + GRH];
    assert_eq!(ip[0] >> 4, 6, "an IPv6 frame");
    let transport = &v2[ETH + GRH + UDP..v2.len() - 4];
    let mut f = v2[..12].to_vec();
    f.extend_from_slice(&[0x89, 0x15]);
    let paylen = (transport.len() + 4) as u16;
    f.extend_from_slice(&[0x6a, 0x41, 0x23, 0x45]);
    f.extend_from_slice(&paylen.to_be_bytes());
    f.extend_from_slice(&[0x1b, 17]);
    f.extend_from_slice(&ip[8..40]); // SGID, DGID: the IPv6 addresses
    f.extend_from_slice(transport);
    let c = v1_icrc_oracle(&f[ETH..]);
    f.extend_from_slice(&c);
    f
}

/// A frame's ICRC recomputed after an edit: RoCE v2 over IPv6, by the library.
fn fix_v2_icrc(f: &mut [u8]) {
    let n = f.len();
    let c = icrc::compute(true, GRH, &f[ETH..n - 4]);
    f[n - 4..].copy_from_slice(&c.to_le_bytes());
}

#[test]
fn v1_frames_decode_with_grh_bth_and_icrc() {
    let (send, ack) = v2_send_and_ack();
    let (s1, a1) = (to_v1(&send), to_v1(&ack));
    let path = pcapng_of("v1.pcapng", &[send.clone(), s1.clone(), a1]);
    let o = xrnic(&["decode", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[1],
        "    2  RoCEv1  fe80::1 > fe80::2 GRH tclass 0xa4 flow 0x12345 hop 17 paylen 56 nxthdr 0x1b  RC_SEND_ONLY qp 0x000012 psn 77 AckReq  payload 40  ICRC ok",
    );
    assert_eq!(
        lines[2],
        "    3  RoCEv1  fe80::2 > fe80::1 GRH tclass 0xa4 flow 0x12345 hop 17 paylen 20 nxthdr 0x1b  RC_ACKNOWLEDGE qp 0x000011 psn 77  AETH ACK credits unlimited msn 1  ICRC ok",
    );
    assert_eq!(
        lines[3],
        "summary: 3 packets, 3 RoCE, 0 bad ICRC, 0 malformed, 2 RoCE v1 (decoded only: xrnic carries RoCE v2)"
    );

    let j = decode_json(&path);
    assert!(j[0].get("roce_v1").is_none() && j[0].get("grh").is_none());
    assert_eq!(j[1]["roce_v1"], true);
    assert_eq!(j[1]["src"], "fe80::1");
    assert_eq!(j[1]["grh"]["traffic_class"], 0xa4);
    assert_eq!(j[1]["grh"]["flow_label"], 0x12345);
    assert_eq!(j[1]["grh"]["hop_limit"], 17);
    assert_eq!(j[1]["grh"]["next_header"], 0x1b);
    assert_eq!(j[1]["opcode_name"], "RC_SEND_ONLY");
    assert_eq!(j[1]["payload_len"], 40);
    assert_eq!(j[1]["icrc_ok"], true);
    let w = &s1[s1.len() - 4..];
    assert_eq!(
        j[1]["icrc"],
        format!("{:02x}{:02x}{:02x}{:02x}", w[0], w[1], w[2], w[3])
    );
}

#[test]
fn a_bad_icrc_on_v1_is_reported_bad_and_masked_fields_are_not_covered() {
    let (send, _) = v2_send_and_ack();
    let good = to_v1(&send);
    let mut bad = good.clone();
    bad[ETH + GRH + 12 + 5] ^= 0x10; // a payload bit
    let mut sgid = good.clone();
    sgid[ETH + 8] ^= 0x01; // the SGID is covered
    let mut hop = good.clone();
    hop[ETH + 7] = 3; // hop limit: a router's to change, masked
    hop[ETH + 1] ^= 0x0f; // flow label
    hop[ETH + GRH + 4] = 0x80; // BTH byte 4 (FECN): masked
    let path = pcapng_of("v1-bad.pcapng", &[bad, sgid, hop]);
    let j = decode_json(&path);
    assert_eq!(j[0]["icrc_ok"], false);
    assert!(j[0]["icrc_computed"].is_string());
    assert_eq!(j[1]["icrc_ok"], false);
    assert_eq!(j[2]["icrc_ok"], true);
    assert_eq!(j[2]["fecn"], true);
    let o = xrnic(&["decode", "--strict", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(out.lines().next().unwrap().contains("ICRC BAD: "), "{out}");
    assert!(out.contains("summary: 3 packets, 3 RoCE, 2 bad ICRC, 0 malformed, 3 RoCE v1"));
}

#[test]
fn vendor_dc_opcodes_are_named_with_their_icrc_checked() {
    let (send, _) = v2_send_and_ack();
    // DC SEND ONLY over RoCE v2: the opcode and the 8 bytes Wireshark's dissector reads
    // after a DC BTH, in front of the payload.
    let mut dc = send.clone();
    dc[ETH + GRH + UDP] = 0x44;
    fix_v2_icrc(&mut dc);
    let mut dc_bad = dc.clone();
    dc_bad[ETH + GRH + UDP + 20] ^= 1;
    // DC connect (0x55, SE clear) over RoCE v1.
    let mut connect_v2 = send.clone();
    connect_v2[ETH + GRH + UDP] = 0x55;
    let connect = to_v1(&connect_v2);
    // A reserved opcode stays unknown and malformed.
    let mut reserved = send;
    reserved[ETH + GRH + UDP] = 0x1f;
    fix_v2_icrc(&mut reserved);
    let path = pcapng_of("dc.pcapng", &[dc, dc_bad, connect, reserved]);
    let o = xrnic(&["decode", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    let vendor =
        "[vendor: Mellanox/NVIDIA Dynamically Connected (DC); headers after the BTH not decoded]";
    assert!(
        lines[0].contains(&format!("  DC_SEND_ONLY(0x44) {vendor} qp 0x000012 psn 77"))
            && lines[0].ends_with("  ICRC ok"),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains("DC_SEND_ONLY(0x44)") && lines[1].contains("ICRC BAD"));
    assert!(
        lines[2].contains("RoCEv1") && lines[2].contains(&format!("DC_CONNECT(0x55) {vendor}")),
        "{}",
        lines[2]
    );
    assert!(lines[2].ends_with("  ICRC ok"), "{}", lines[2]);
    assert!(
        lines[3].contains("unknown(0x1f)") && lines[3].contains("MALFORMED: "),
        "{}",
        lines[3]
    );
    assert_eq!(
        lines[4],
        "summary: 4 packets, 4 RoCE, 1 bad ICRC, 1 malformed, 1 RoCE v1 (decoded only: xrnic carries RoCE v2), 3 vendor opcode (not decoded further)"
    );
    let j = decode_json(&path);
    assert_eq!(j[0]["opcode_name"], "DC_SEND_ONLY");
    assert_eq!(j[0]["vendor"], "Mellanox/NVIDIA Dynamically Connected (DC)");
    assert!(j[0].get("error").is_none());
    assert!(j[3].get("vendor").is_none());
}

#[test]
fn malformed_v1_frames_are_reported_and_never_panic() {
    let (send, _) = v2_send_and_ack();
    let good = to_v1(&send);
    let short_grh = good[..ETH + 30].to_vec();
    let mut not_bth = good.clone();
    not_bth[ETH + 6] = 0x11; // next header: UDP, not a BTH
    let mut long_paylen = good.clone();
    long_paylen[ETH + 5] += 8; // PayLen past the frame's end
    let path = pcapng_of(
        "v1-malformed.pcapng",
        &[short_grh, not_bth, long_paylen.clone()],
    );
    let o = xrnic(&["decode", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].ends_with("MALFORMED: GRH truncated at offset 14: needs 40 bytes, 30 present"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("nxthdr 0x11")
            && lines[1]
                .ends_with("MALFORMED: GRH at offset 20: bad next header (a BTH is 0x1b) 0x11"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].contains("MALFORMED: GRH truncated"),
        "{}",
        lines[2]
    );
    assert!(
        out.ends_with("summary: 3 packets, 3 RoCE, 0 bad ICRC, 3 malformed, 3 RoCE v1 (decoded only: xrnic carries RoCE v2)\n"),
        "{out}"
    );

    // Every cut and every single-byte change of a v1 frame (a VLAN-tagged one too)
    // decodes without a panic: exit 0, one line per frame.
    let mut tagged = good[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
    tagged.extend_from_slice(&good[12..]);
    let mut frames = Vec::new();
    for f in [&good, &tagged] {
        frames.extend((0..f.len()).map(|n| f[..n].to_vec()));
        for i in 0..f.len() {
            for x in [0x01u8, 0x80, 0xff] {
                let mut g = f.clone();
                g[i] ^= x;
                frames.push(g);
            }
        }
    }
    let n = frames.len();
    let path = pcapng_of("v1-mutations.pcapng", &frames);
    let o = xrnic(&["decode", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains(&format!("summary: {n} packets, ")));
    let o = xrnic(&["explain", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn explain_draws_a_v1_conversation_and_says_it_is_v1() {
    let (send, ack) = v2_send_and_ack();
    let path = pcapng_of("v1-explain.pcapng", &[to_v1(&send), to_v1(&ack)]);
    let o = xrnic(&["explain", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("QP pair: fe80::1"), "{out}");
    assert!(out.contains("SEND_ONLY psn 77"), "{out}");
    assert!(out.contains("ACK"), "{out}");
    assert!(
        out.contains(
            "2 RoCE v1 packets (EtherType 0x8915, GRH + BTH; ends are GIDs): decoded only, xrnic carries RoCE v2"
        ),
        "{out}"
    );
    let o = xrnic(&["explain", "--json", path.to_str().unwrap()]);
    let last = stdout(&o).lines().last().unwrap().to_string();
    let s: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(s["roce_v1"], 2);
    assert_eq!(s["round_trips"], 1);
}

/// Wireshark reads the same GRH fields and the same DC names off the same bytes.
#[test]
#[cfg_attr(xrnic_no_tshark, ignore = "needs tshark")]
fn tshark_reads_the_same_grh_fields_and_dc_names() {
    require_tshark();
    let (send, ack) = v2_send_and_ack();
    let mut dc = send.clone();
    dc[ETH + GRH + UDP] = 0x44;
    fix_v2_icrc(&mut dc);
    let path = pcapng_of("v1-tshark.pcapng", &[to_v1(&send), to_v1(&ack), dc]);
    let o = std::process::Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .args(["-T", "fields", "-E", "separator=,"])
        .args([
            "-e",
            "infiniband.grh.tclass",
            "-e",
            "infiniband.grh.flowlabel",
        ])
        .args(["-e", "infiniband.grh.hoplmt", "-e", "infiniband.grh.sgid"])
        .args(["-e", "infiniband.bth.opcode", "-e", "infiniband.bth.psn"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let ws = String::from_utf8(o.stdout).unwrap();
    let ws: Vec<Vec<&str>> = ws.lines().map(|l| l.split(',').collect()).collect();
    let j = decode_json(&path);
    for i in 0..2 {
        let g = &j[i]["grh"];
        let ours = [
            g["traffic_class"].to_string(),
            g["flow_label"].to_string(),
            g["hop_limit"].to_string(),
            j[i]["src"].as_str().unwrap().to_string(),
            j[i]["opcode"].to_string(),
            j[i]["psn"].to_string(),
        ];
        assert_eq!(ws[i][..6], ours, "frame {}", i + 1);
    }
    // The one-line summaries: Wireshark's name for opcode 0x44 in the DC class.
    let o = std::process::Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .output()
        .unwrap();
    let summary = String::from_utf8(o.stdout).unwrap();
    let third = summary.lines().nth(2).unwrap_or_default();
    assert_eq!(j[2]["opcode_name"], "DC_SEND_ONLY");
    assert!(third.contains("DC Send Only"), "{summary}");
}
