//! `xrnic decode` as a user runs it: the built binary on real captures, on captures this
//! test builds (bad ICRC, truncated and malformed RoCE frames, non-RoCE traffic) and on
//! files that are not captures at all; text lines, JSON keys and exit codes.

mod cli_support;

use cli_support::write_capture::{self as wc, ECT0, Host, IpAddrBytes, bth, data, frame};
use cli_support::*;
use serde_json::Value;
use xrnic::wire::{AethRepr, ExtHeaders, Msn, Opcode, Qpn, Syndrome};

/// Keys every decoded RoCE packet must carry (`xrnic decode --json`, docs/observability.md).
const REQUIRED: &[&str] = &[
    "frame",
    "opcode",
    "opcode_name",
    "dest_qp",
    "psn",
    "ack_req",
    "se",
    "pad",
    "pkey",
    "fecn",
    "becn",
    "ip_version",
    "icrc_ok",
];

fn host(last: u8, qpn: u32) -> Host {
    Host {
        mac: [2, 0, 0, 0, 0, last],
        ip: IpAddrBytes::V4([192, 0, 2, last]),
        qpn: Qpn::new(qpn),
        udp_src_port: 0xc000 | qpn as u16,
        vlan_tci: None,
    }
}

/// An RC SEND ONLY of 40 bytes and an ACK, IPv4.
fn send_and_ack() -> (Vec<u8>, Vec<u8>) {
    let (a, b) = (host(1, 0x11), host(2, 0x12));
    let send = frame(
        &a,
        &b,
        ECT0,
        bth(Opcode::RC_SEND_ONLY, b.qpn, 77, true),
        ExtHeaders::default(),
        &data(40, 9),
    );
    let ack = frame(
        &b,
        &a,
        ECT0,
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

#[test]
#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]
fn text_output_of_vector_files_has_the_expected_lines() {
    let dir = vectors_dir();
    let cases: &[(&str, &[&str])] = &[
        (
            "rxe/monty_roce_capture_read-write-ecn.pcap",
            &[
                "    1  192.168.65.5:55410 > 192.168.65.4  UD_SEND_ONLY qp 0x000001 psn 65 AckReq  DETH qkey 0x80010000 src_qp 0x000001  payload 256  ICRC ok",
                "    4  192.168.65.5:57236 > 192.168.65.4  RC_RDMA_WRITE_ONLY qp 0x000011 psn 9209053 AckReq pad 2  RETH va 0xaaab09dd5000 rkey 0x2d5 len 18  payload 18  ICRC ok",
                "    5  192.168.65.4:57236 > 192.168.65.5  RC_ACKNOWLEDGE qp 0x000011 psn 9209053  AETH ACK credits unlimited msn 1  ICRC ok",
                "    8  192.168.65.4:57236 > 192.168.65.5  RC_RDMA_READ_RESPONSE_MIDDLE qp 0x000011 psn 9209055  payload 1024  ICRC ok",
                "summary: 12 packets, 12 RoCE, 0 bad ICRC, 0 malformed",
            ],
        ),
        (
            "huawei_hiroce/oferby_proxy_roce.pcap",
            &[
                "   15  192.168.70.4:69 > 192.168.70.6 ecn ECT(0)  RC_SEND_ONLY_WITH_IMMEDIATE qp 0x000048 psn 0 MigReq AckReq resv6 0x10 pad 3  ImmDt 0x00000001  payload 141  ICRC ok",
                "   26  192.168.70.4:69 > 192.168.70.6 ecn ECT(0)  RC_ACKNOWLEDGE qp 0x000048 psn 5 MigReq  AETH ACK credits 6 msn 3  ICRC ok",
                "summary: 123 packets, 105 RoCE, 0 bad ICRC, 0 malformed",
            ],
        ),
        (
            "single/scapy_cx4lx_cnp.pcap",
            &[
                "    1  10.0.17.1:0 > 10.0.18.1 dscp 48 ecn ECT(0)  CNP qp 0x000118 psn 0 BECN  ICRC ok",
            ],
        ),
        (
            "single/scapy_uc_send_only_ipv6_synthetic.pcap",
            // Traffic class 0xe2 (vectors/README.md): DSCP 56, ECT(0).
            &[
                "    1  [2022::1023]:49152 > 2023::1024 dscp 56 ecn ECT(0)  UC_SEND_ONLY qp 0x0000d3 psn 13571856 MigReq pad 2  payload 18  ICRC ok",
            ],
        ),
    ];
    for (file, want) in cases {
        let path = dir.join(file);
        let o = xrnic(&["decode", path.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{file}: {}", stderr(&o));
        let out = stdout(&o);
        let lines: Vec<&str> = out.lines().collect();
        for w in *want {
            assert!(lines.contains(w), "{file}: no line\n{w}\nin\n{out}");
        }
        assert!(lines.last().unwrap().starts_with("summary: "), "{out}");
    }
}

#[test]
#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]
fn json_lines_of_every_vector_parse_with_every_required_key() {
    for f in vector_files() {
        let packets = decode_json(&f);
        assert!(!packets.is_empty(), "{}", f.display());
        for p in &packets {
            for k in REQUIRED {
                assert!(
                    p.get(k).is_some_and(|v| !v.is_null()),
                    "{}: no {k} in {p}",
                    f.display()
                );
            }
            assert_eq!(p["icrc_ok"], true, "{}: {p}", f.display());
            assert!(p.get("error").is_none(), "{}: {p}", f.display());
            // Each extended header the opcode carries is a nested object, and only those.
            let op = Opcode(p["opcode"].as_u64().unwrap() as u8);
            let info = op.info().expect("known opcode");
            assert_eq!(p["opcode_name"], info.name);
            for e in xrnic::wire::Ext::ORDER {
                if e == xrnic::wire::Ext::CnpPad {
                    continue;
                }
                assert_eq!(
                    p.get(e.name()).is_some_and(Value::is_object),
                    info.exts.has(e),
                    "{}: {} in {p}",
                    f.display(),
                    e.name()
                );
            }
        }
    }
}

#[test]
#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]
fn json_shows_rdma_details() {
    let huawei = vector("huawei_hiroce/oferby_proxy_roce.pcap");
    let p = decode_json(&huawei);
    let ack = p.iter().find(|p| p["frame"] == 26).unwrap();
    assert_eq!(ack["aeth"]["type"], "ACK");
    assert_eq!(ack["aeth"]["credit_code"], 5);
    assert_eq!(ack["aeth"]["credits"], 6);
    assert_eq!(ack["aeth"]["msn"], 3);
    assert_eq!(ack["mig_req"], true);
    assert_eq!(ack["ecn"], 2);
    assert_eq!(ack["udp_src_port"], 69);
    let send = p.iter().find(|p| p["frame"] == 15).unwrap();
    assert_eq!(send["immdt"]["data"], 1);
    assert_eq!(send["pad"], 3);
    // Huawei sets a reserved bit of BTH byte 4 in its requests (not in its ACKs).
    assert_eq!(send["resv6"], 0x10);
    assert_eq!(ack["resv6"], 0);
    assert_eq!(send["payload_len"], 141);

    let rxe = decode_json(&vector("rxe/monty_roce_capture_read-write-ecn.pcap"));
    let mad = &rxe[0];
    assert_eq!(mad["deth"]["qkey"], 0x8001_0000u32);
    assert_eq!(mad["deth"]["src_qp"], 1);
    let write = &rxe[3];
    assert_eq!(write["reth"]["va"], 0xaaab_09dd_5000u64);
    assert_eq!(write["reth"]["rkey"], 0x2d5);
    assert_eq!(write["reth"]["dma_len"], 18);
    assert_eq!(rxe[4]["aeth"]["meaning"], "ACK credits unlimited");
    assert!(rxe[4]["aeth"].get("credits").is_none());

    let v6 = decode_json(&vector("single/scapy_uc_send_only_ipv6_synthetic.pcap"));
    assert_eq!(v6[0]["ip_version"], 6);
    assert_eq!(v6[0]["src"], "2022::1023");
    assert_eq!(v6[0]["icrc"], "3e5b743b"); // vectors/README.md: ICRC bytes 3e 5b 74 3b
}

#[test]
fn flipped_payload_bit_is_shown_as_bad_icrc_with_both_values() {
    let (good, ack) = send_and_ack();
    let mut bad = good.clone();
    let payload_at = 14 + 20 + 8 + 12; // Ethernet, IPv4, UDP, BTH
    bad[payload_at + 5] ^= 0x10;
    let path = pcapng_of("flipped.pcapng", &[good.clone(), bad, ack]);
    let p = decode_json(&path);
    assert_eq!(p.len(), 3);
    assert_eq!(p[0]["icrc_ok"], true);
    assert_eq!(p[1]["icrc_ok"], false);
    assert_eq!(p[2]["icrc_ok"], true);
    // Fully decoded despite the bad ICRC; the wire value is the good frame's ICRC, the
    // computed one differs.
    assert_eq!(p[1]["psn"], 77);
    assert_eq!(p[1]["payload_len"], 40);
    assert!(p[1].get("error").is_none());
    assert_eq!(p[1]["icrc"], p[0]["icrc"]);
    let computed = p[1]["icrc_computed"].as_str().unwrap();
    assert_ne!(computed, p[0]["icrc"].as_str().unwrap());
    assert!(p[0].get("icrc_computed").is_none());
    let wire = &good[good.len() - 4..];
    assert_eq!(
        p[0]["icrc"],
        format!(
            "{:02x}{:02x}{:02x}{:02x}",
            wire[0], wire[1], wire[2], wire[3]
        )
    );

    let o = xrnic(&["decode", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    let line = out.lines().nth(1).unwrap();
    assert!(
        line.ends_with(&format!(
            "payload 40  ICRC BAD: {} on the wire, computed {computed}",
            p[0]["icrc"].as_str().unwrap()
        )),
        "{line}"
    );
    assert!(out.ends_with("summary: 3 packets, 3 RoCE, 1 bad ICRC, 0 malformed\n"));

    // --strict turns it into a failure, with a message.
    let o = xrnic(&["decode", "--strict", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("1 RoCE packet(s) with a bad ICRC, 0 malformed"));
}

#[test]
fn truncated_and_malformed_roce_frames_get_their_precise_error() {
    let (send, ack) = send_and_ack();
    // Cut by a snap length: the IPv4 total length promises more than is there.
    let cut = send[..70].to_vec();
    // Lengths consistent, but the opcode says READ REQUEST, whose RETH (16 bytes) does not
    // fit in the 8 bytes after the BTH (AETH + ICRC of the ACK).
    let mut short_reth = ack.clone();
    short_reth[14 + 20 + 8] = Opcode::RC_READ_REQUEST.0;
    // A frame that is not RoCE at all (UDP port 4792) is skipped.
    let mut other_port = ack.clone();
    other_port[14 + 20 + 2..14 + 20 + 4].copy_from_slice(&4792u16.to_be_bytes());
    // A reserved opcode (IBTA vol. 1 table 35). 0x40, RD's first, is no longer unknown:
    // it is named as a vendor (DC) opcode, tests/cli_decode_v1.rs.
    let mut rd = ack.clone();
    rd[14 + 20 + 8] = 0x1f;
    // TTL changed in flight without fixing the IPv4 header checksum.
    let mut ttl = send.clone();
    ttl[14 + 8] -= 1;
    // The same corruption on a TCP segment is not ours: skipped.
    let mut tcp = ttl.clone();
    tcp[14 + 9] = 6;
    let path = pcapng_of(
        "malformed.pcapng",
        &[cut, short_reth, other_port, rd, send.clone(), ttl, tcp],
    );

    let p = decode_json(&path);
    let frames: Vec<_> = p.iter().map(|p| p["frame"].as_u64().unwrap()).collect();
    assert_eq!(frames, [1, 2, 4, 5, 6]);
    let total = send_and_ack().0.len() - 14;
    assert_eq!(
        p[0]["error"],
        format!("IPv4 truncated at offset 14: needs {total} bytes, 56 present")
    );
    // What the bytes still show is decoded.
    assert_eq!(p[0]["opcode_name"], "RC_SEND_ONLY");
    assert_eq!(p[0]["psn"], 77);
    assert_eq!(p[0]["src"], "192.0.2.1");
    assert!(p[0]["icrc_ok"].is_null());
    assert_eq!(
        p[1]["error"],
        "RETH truncated at offset 54: needs 16 bytes, 8 present"
    );
    assert_eq!(p[1]["opcode"], 12);
    assert_eq!(p[1]["dest_qp"], 0x11);
    assert_eq!(p[2]["error"], "BTH at offset 42: unknown opcode 0x1f");
    assert_eq!(p[2]["opcode_name"], "unknown");
    assert_eq!(p[3]["icrc_ok"], true);
    let err = p[4]["error"].as_str().unwrap();
    assert!(
        err.starts_with("IPv4 at offset 14: header checksum 0x"),
        "{err}"
    );
    assert_eq!(p[4]["psn"], 77);

    let o = xrnic(&["decode", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(
        out.contains(
            "    2  192.0.2.2:49170 > 192.0.2.1 ecn ECT(0)  RC_RDMA_READ_REQUEST qp 0x000011 psn 77  MALFORMED: RETH truncated at offset 54: needs 16 bytes, 8 present\n"
        ),
        "{out}"
    );
    assert!(out.contains("unknown(0x1f) qp 0x000011"), "{out}");
    assert!(out.ends_with("summary: 7 packets, 5 RoCE, 0 bad ICRC, 4 malformed\n"));
    let o = xrnic(&["decode", "--strict", "--json", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("0 RoCE packet(s) with a bad ICRC, 4 malformed"));
}

#[test]
fn classic_pcap_is_read_and_non_ethernet_links_are_skipped() {
    use pcap_file::DataLink;
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
    use std::time::Duration;
    let (send, ack) = send_and_ack();
    let write = |name: &str, datalink| {
        let path = scratch(name);
        let header = PcapHeader {
            datalink,
            ..Default::default()
        };
        let file = std::fs::File::create(&path).unwrap();
        let mut w = PcapWriter::with_header(file, header).unwrap();
        for f in [&send, &ack] {
            w.write_packet(&PcapPacket::new(Duration::from_secs(1), f.len() as u32, f))
                .unwrap();
        }
        path
    };
    let eth = write("eth.pcap", DataLink::ETHERNET);
    let o = xrnic(&["decode", eth.to_str().unwrap()]);
    assert!(
        stdout(&o).ends_with("summary: 2 packets, 2 RoCE, 0 bad ICRC, 0 malformed\n"),
        "{}",
        stdout(&o)
    );
    // Linux cooked capture (tcpdump -i any) is not decoded yet: said, not guessed at.
    let sll = write("sll.pcap", DataLink::LINUX_SLL);
    let o = xrnic(&["decode", "--strict", sll.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        stdout(&o),
        "summary: 2 packets, 0 RoCE, 0 bad ICRC, 0 malformed, 2 not Ethernet (skipped)\n"
    );
}

#[test]
fn unreadable_input_exits_1_with_a_clear_message() {
    let garbage = scratch("garbage.pcap");
    std::fs::write(&garbage, b"this is not a capture at all").unwrap();
    // A valid capture cut in the middle of its second frame.
    let (send, ack) = send_and_ack();
    let whole = pcapng_of("whole.pcapng", &[send, ack]);
    let bytes = std::fs::read(&whole).unwrap();
    let cut = scratch("cut.pcapng");
    std::fs::write(&cut, &bytes[..bytes.len() - 30]).unwrap();
    let empty = scratch("empty.pcap");
    std::fs::write(&empty, b"").unwrap();
    let missing = scratch("does-not-exist.pcap");

    let cases = [
        (&garbage, "not a pcap or pcapng file"),
        (&cut, "ends in the middle of a capture record"),
        (&empty, "not a pcap or pcapng file"),
        (&missing, "No such file or directory"),
    ];
    for (path, why) in cases {
        for json in [false, true] {
            let mut args = vec!["decode", path.to_str().unwrap()];
            if json {
                args.push("--json");
            }
            let o = xrnic(&args);
            assert_eq!(o.status.code(), Some(1), "{}", path.display());
            let err = stderr(&o);
            assert!(
                err.starts_with(&format!("xrnic decode: cannot read {}: ", path.display())),
                "{err}"
            );
            assert!(err.contains(why), "{err}");
            assert!(o.stdout.is_empty(), "no partial listing");
        }
    }
}

#[test]
fn usage_mistakes_exit_2() {
    for args in [
        &["decode", "--bogus", "x.pcap"][..],
        &["decode"],
        &[],
        &["frobnicate"],
    ] {
        let o = xrnic(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            stderr(&o).contains("Usage: xrnic"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    let o = xrnic(&["decode", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("--strict"));
}

#[test]
fn the_demo_exchange_decodes_with_every_icrc_ok() {
    let frames = wc::exchange();
    let path = scratch("demo.pcapng");
    wc::write_pcapng(
        &path,
        std::time::Duration::from_secs(1_767_225_600),
        &frames,
    )
    .unwrap();
    let o = xrnic(&["decode", "--strict", "--json", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let p: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<_> = p
        .iter()
        .map(|p| p["opcode_name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "RC_SEND_ONLY",
            "RC_ACKNOWLEDGE",
            "RC_RDMA_WRITE_FIRST",
            "RC_RDMA_WRITE_MIDDLE",
            "RC_RDMA_WRITE_LAST",
            "CNP",
            "RC_ACKNOWLEDGE",
            "RC_RDMA_READ_REQUEST",
            "RC_RDMA_READ_RESPONSE_FIRST",
            "RC_RDMA_READ_RESPONSE_LAST",
            "RC_COMPARE_SWAP",
            "RC_ATOMIC_ACKNOWLEDGE",
            "RC_SEND_ONLY",
            "RC_ACKNOWLEDGE",
            "RC_SEND_ONLY",
            "RC_ACKNOWLEDGE",
            "RC_SEND_ONLY_WITH_IMMEDIATE",
            "RC_ACKNOWLEDGE",
        ]
    );
    assert!(p.iter().all(|p| p["icrc_ok"] == true));
    // WRITE at PMTU 1024: 1024 + 1024 + 452 = the RETH length.
    let lens: Vec<_> = p[2..5]
        .iter()
        .map(|p| p["payload_len"].as_u64().unwrap())
        .collect();
    assert_eq!(lens, [1024, 1024, 452]);
    assert_eq!(p[2]["reth"]["dma_len"], 2500);
    assert_eq!(p[3]["ecn"], 3, "the CE-marked MIDDLE");
    assert_eq!(
        (p[5]["becn"].clone(), p[5]["dscp"].clone()),
        (true.into(), 48.into())
    );
    assert_eq!(p[5]["dest_qp"], 0x11);
    assert_eq!(p[10]["atomic"]["swap_add"], 1);
    assert_eq!(p[13]["aeth"]["type"], "RNR_NAK");
    assert_eq!(p[13]["aeth"]["rnr_timer_ms"], 1.28);
    assert_eq!(p[14]["psn"], p[12]["psn"], "the retried SEND");
    assert_eq!(p[16]["ip_version"], 6);
    assert_eq!(p[16]["vlan"]["id"], 100);
    assert_eq!(p[16]["pad"], 3);
    assert_eq!(p[17]["aeth"]["credits"], 6);
}
