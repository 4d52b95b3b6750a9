//! Our decoding agrees with Wireshark's, frame by frame.
//!
//! Every vector capture and the demo capture are decoded by both tools and compared field
//! by field: frame numbers, BTH (opcode, DestQP, PSN, SE, MigReq, PadCnt, P_Key, AckReq),
//! AETH, RETH, DETH, AtomicETH, AtomicAckETH, the ICRC bytes, IP source, ECN and UDP source
//! port. Our rows and tshark's are also compared with [`FIXTURE`], the (frame, opcode,
//! DestQP, PSN) rows tshark printed once, so a change in either reading shows. The tests
//! need `tshark` (`make test` installs it) and the vectors: where build.rs found either
//! missing they are ignored (docs/testing.md); under CI=true they run and fail.
//!
//! Wireshark tries the lower UDP port's dissector first, so RoCE from a well-known source
//! port (Huawei hiroce uses the QPN, e.g. 69 = TFTP) is shown as that protocol. For every
//! source port below 4791 seen towards 4791 we add `-d udp.port==PORT,infiniband`, which
//! is what the vectors README recommends for the Huawei capture.

mod cli_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use cli_support::*;
use serde_json::Value;

/// `tshark -r FILE -d udp.port==69,infiniband -Y infiniband -T fields -e frame.number
/// -e infiniband.bth.opcode -e infiniband.bth.destqp -e infiniband.bth.psn`
/// (TShark 4.0.17, Debian 12), five packets a line.
const FIXTURE: &[(&str, &str)] = &[
    ("huawei_hiroce/oferby_proxy_roce.pcap", "
        15 5 0x000048 0; 16 17 0x000045 0; 17 0 0x000045 0; 18 3 0x000045 1; 19 17 0x000048 0
        20 17 0x000048 1; 21 0 0x000045 2; 22 3 0x000045 3; 23 0 0x000045 4; 24 3 0x000045 5
        25 17 0x000048 3; 26 17 0x000048 5; 27 0 0x000045 6; 28 3 0x000045 7; 29 0 0x000045 8
        30 17 0x000048 7; 31 3 0x000045 9; 32 0 0x000045 10; 33 17 0x000048 9; 34 3 0x000045 11
        35 17 0x000048 11; 36 0 0x000045 12; 37 3 0x000045 13; 38 17 0x000048 13; 39 0 0x000045 14
        40 3 0x000045 15; 41 17 0x000048 15; 42 0 0x000045 16; 43 3 0x000045 17; 44 0 0x000045 18
        45 17 0x000048 17; 46 3 0x000045 19; 47 0 0x000045 20; 48 17 0x000048 19; 49 3 0x000045 21
        50 17 0x000048 21; 51 0 0x000045 22; 52 3 0x000045 23; 53 0 0x000045 24; 54 3 0x000045 25
        55 17 0x000048 23; 56 17 0x000048 25; 57 0 0x000045 26; 58 3 0x000045 27; 59 17 0x000048 27
        60 0 0x000045 28; 61 3 0x000045 29; 62 0 0x000045 30; 63 3 0x000045 31; 64 17 0x000048 29
        65 0 0x000045 32; 66 3 0x000045 33; 67 17 0x000048 31; 68 0 0x000045 34; 69 3 0x000045 35
        70 17 0x000048 33; 71 0 0x000045 36; 72 17 0x000048 35; 73 3 0x000045 37; 74 0 0x000045 38
        75 17 0x000048 37; 76 3 0x000045 39; 77 0 0x000045 40; 78 17 0x000048 39; 79 3 0x000045 41
        80 17 0x000048 41; 81 0 0x000045 42; 82 3 0x000045 43; 83 17 0x000048 43; 84 0 0x000045 44
        85 3 0x000045 45; 86 0 0x000045 46; 87 3 0x000045 47; 88 17 0x000048 45; 89 17 0x000048 47
        90 0 0x000045 48; 91 3 0x000045 49; 92 17 0x000048 49; 93 0 0x000045 50; 94 3 0x000045 51
        95 17 0x000048 51; 96 0 0x000045 52; 97 3 0x000045 53; 98 0 0x000045 54; 99 3 0x000045 55
        100 17 0x000048 53; 101 17 0x000048 55; 102 0 0x000045 56; 103 3 0x000045 57; 104 0 0x000045 58
        105 17 0x000048 57; 106 3 0x000045 59; 107 0 0x000045 60; 108 3 0x000045 61; 109 17 0x000048 59
        110 0 0x000045 62; 111 3 0x000045 63; 112 17 0x000048 61; 113 17 0x000048 63; 114 0 0x000045 64
        115 3 0x000045 65; 116 17 0x000048 64; 117 17 0x000048 65; 122 5 0x000045 66; 123 17 0x000048 66
    "),
    ("rxe/monty_roce_capture_read-write-ecn.pcap", "
        1 100 0x000001 65; 2 100 0x000001 55; 3 100 0x000001 66; 4 10 0x000011 9209053; 5 17 0x000011 9209053
        6 12 0x000011 9209054; 7 13 0x000011 9209054; 8 14 0x000011 9209055; 9 14 0x000011 9209056; 10 15 0x000011 9209057
        11 100 0x000001 67; 12 100 0x000001 56
    "),
    ("rxe/monty_test.pcap", "
        1 100 0x000001 82; 2 100 0x000001 45; 3 100 0x000001 83; 4 10 0x000011 12726936; 5 17 0x000017 12726936
        6 12 0x000011 12726937; 7 13 0x000017 12726937; 8 14 0x000017 12726938; 9 14 0x000017 12726939; 10 15 0x000017 12726940
        11 100 0x000001 84; 16 100 0x000001 46
    "),
    ("single/pcapplusplus_rc_read_request.pcap", "
        1 12 0x000011 5557091
    "),
    ("single/scapy_cx4lx_cnp.pcap", "
        1 129 0x000118 0
    "),
    ("single/scapy_uc_send_only_ipv6_synthetic.pcap", "
        1 36 0x0000d3 13571856
    "),
    ("single/scapy_uc_send_only_synthetic.pcap", "
        1 36 0x0000d3 13571856
    "),
];

/// (frame, opcode, DestQP, PSN)
type Row = (u64, u64, u64, u64);

fn fixture_rows(file: &str) -> Vec<Row> {
    let (_, text) = FIXTURE
        .iter()
        .find(|(f, _)| *f == file)
        .unwrap_or_else(|| panic!("no fixture for {file}: a new vector? add its tshark rows"));
    text.split(['\n', ';'])
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(|r| {
            let n: Vec<u64> = r.split(' ').map(num).collect();
            (n[0], n[1], n[2], n[3])
        })
        .collect()
}

/// A tshark field value: decimal, 0x-hex, or a boolean.
fn num(s: &str) -> u64 {
    match s {
        "True" | "true" => 1,
        "False" | "false" => 0,
        _ => match s.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16),
            None => s.parse(),
        }
        .unwrap_or_else(|e| panic!("tshark value {s:?}: {e}")),
    }
}

/// Our JSON value as a number (booleans as 0/1, hex strings such as the ICRC as hex).
fn ours(v: &Value) -> Option<u64> {
    match v {
        Value::Bool(b) => Some(u64::from(*b)),
        Value::Number(n) => n.as_u64(),
        Value::String(s) => u64::from_str_radix(s, 16).ok(),
        _ => None,
    }
}

fn tshark(file: &Path, extra: &[String], fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(file).args(extra);
    cmd.args(["-T", "fields", "-E", "occurrence=f", "-E", "separator=\t"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let o = cmd.output().expect("run tshark");
    assert!(
        o.status.success(),
        "tshark on {}: {}",
        file.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

/// `-d udp.port==P,infiniband` for each source port below 4791 sending to 4791.
fn decode_as(file: &Path) -> Vec<String> {
    let mut ports: Vec<u64> = tshark(file, &[], &["udp.srcport", "udp.dstport"])
        .into_iter()
        .filter(|r| r.len() == 2 && r[1] == "4791" && !r[0].is_empty())
        .map(|r| num(&r[0]))
        .filter(|p| (1..4791).contains(p))
        .collect();
    ports.sort();
    ports.dedup();
    ports
        .into_iter()
        .flat_map(|p| ["-d".to_string(), format!("udp.port=={p},infiniband")])
        .collect()
}

/// (tshark field, JSON pointers into our object: the first present one is compared). A
/// field tshark leaves empty must be absent from ours too, except where noted in
/// `compare`. Wireshark shows the AtomicETH VA and R_Key in its RETH fields.
const FIELDS: &[(&str, &[&str])] = &[
    ("infiniband.bth.opcode", &["/opcode"]),
    ("infiniband.bth.destqp", &["/dest_qp"]),
    ("infiniband.bth.psn", &["/psn"]),
    ("infiniband.bth.se", &["/se"]),
    ("infiniband.bth.m", &["/mig_req"]),
    ("infiniband.bth.padcnt", &["/pad"]),
    ("infiniband.bth.p_key", &["/pkey"]),
    ("infiniband.bth.a", &["/ack_req"]),
    ("infiniband.aeth.syndrome", &["/aeth/syndrome"]),
    ("infiniband.aeth.msn", &["/aeth/msn"]),
    ("infiniband.reth.va", &["/reth/va", "/atomic/va"]),
    ("infiniband.reth.r_key", &["/reth/rkey", "/atomic/rkey"]),
    ("infiniband.reth.dmalen", &["/reth/dma_len"]),
    ("infiniband.deth.q_key", &["/deth/qkey"]),
    ("infiniband.deth.srcqp", &["/deth/src_qp"]),
    ("infiniband.atomiceth.swapdt", &["/atomic/swap_add"]),
    ("infiniband.atomiceth.cmpdt", &["/atomic/compare"]),
    ("infiniband.atomicacketh.origremdt", &["/atomic_ack/orig"]),
    ("infiniband.invariant.crc", &["/icrc"]),
    ("udp.srcport", &["/udp_src_port"]),
    ("ip.dsfield.ecn", &["/ecn"]),
    ("ipv6.tclass.ecn", &["/ecn"]),
];

/// Compare our JSON for `file` with tshark's decoding; returns tshark's rows.
fn compare(file: &Path, packets: &[Value]) -> Vec<Row> {
    let extra = decode_as(file);
    let mut fields = vec!["frame.number", "ip.src", "ipv6.src"];
    fields.extend(FIELDS.iter().map(|f| f.0));
    let mut extra_y = extra.clone();
    extra_y.extend(["-Y".to_string(), "infiniband".to_string()]);
    let rows = tshark(file, &extra_y, &fields);
    let ours_by_frame: BTreeMap<u64, &Value> = packets
        .iter()
        .map(|p| (p["frame"].as_u64().unwrap(), p))
        .collect();
    let theirs: Vec<u64> = rows.iter().map(|r| num(&r[0])).collect();
    assert_eq!(
        ours_by_frame.keys().copied().collect::<Vec<_>>(),
        theirs,
        "{}: frames decoded as RoCE differ",
        file.display()
    );
    for r in &rows {
        let frame = num(&r[0]);
        let p = ours_by_frame[&frame];
        let ctx = || format!("{} frame {frame}: ours {p}", file.display());
        let src = if r[1].is_empty() { &r[2] } else { &r[1] };
        assert_eq!(p["src"], src.as_str(), "{}", ctx());
        for ((field, ptrs), value) in FIELDS.iter().zip(&r[3..]) {
            let mine = ptrs
                .iter()
                .find_map(|ptr| p.pointer(ptr).filter(|v| !v.is_null()));
            if value.is_empty() {
                // tshark shows no ICRC for a CNP, and has one ECN field per IP version.
                let ours_may_have = ptrs[0] == "/icrc" || ptrs[0] == "/ecn";
                assert!(
                    ours_may_have || mine.is_none(),
                    "{}: tshark has no {field}, we have {mine:?}",
                    ctx()
                );
                continue;
            }
            let mine = mine.unwrap_or_else(|| panic!("{}: we lack {field} = {value}", ctx()));
            assert_eq!(ours(mine), Some(num(value)), "{}: {field}", ctx());
        }
    }
    rows.iter()
        .map(|r| (num(&r[0]), num(&r[3]), num(&r[4]), num(&r[5])))
        .collect()
}

#[test]
#[cfg_attr(
    any(xrnic_no_vectors, xrnic_no_tshark),
    ignore = "needs ../shared/vectors and tshark"
)]
fn every_vector_packet_agrees_with_tshark() {
    require_tshark();
    let dir = vectors_dir();
    let mut total = 0;
    for f in vector_files() {
        let rel = f.strip_prefix(&dir).unwrap().to_str().unwrap().to_string();
        let packets = decode_json(&f);
        assert!(
            packets.iter().all(|p| p["icrc_ok"] == true),
            "{rel}: a bad ICRC"
        );
        let mine: Vec<Row> = packets
            .iter()
            .map(|p| {
                let n = |k: &str| p[k].as_u64().unwrap();
                (n("frame"), n("opcode"), n("dest_qp"), n("psn"))
            })
            .collect();
        let recorded = fixture_rows(&rel);
        assert_eq!(mine, recorded, "{rel}: ours vs recorded tshark rows");
        let live = compare(&f, &packets);
        assert_eq!(live, recorded, "{rel}: tshark now vs recorded");
        total += mine.len();
    }
    // vectors/README.md: 105 + 12 + 12 + 4 single packets.
    assert_eq!(total, 133);
}

#[test]
#[cfg_attr(xrnic_no_tshark, ignore = "needs tshark")]
fn demo_capture_agrees_with_tshark() {
    require_tshark();
    let path = scratch("demo-tshark.pcapng");
    write_capture::write_pcapng(
        &path,
        std::time::Duration::from_secs(1_767_225_600),
        &write_capture::exchange(),
    )
    .unwrap();
    let packets = decode_json(&path);
    assert_eq!(compare(&path, &packets).len(), 18);
}
