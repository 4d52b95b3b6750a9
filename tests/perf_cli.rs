//! `xrnic perf` on a veth pair: server and client as two processes in two namespaces, for
//! write, read, send and atomic, with two QPs, IPv4 and IPv6 GIDs, path MTU 1024 (1500
//! veth) and 4096 (9000 veth), `--json` and `--verify`; duration mode; usage errors (exit
//! 2), an unreachable server and a verification that must fail (exit 1). The root tests
//! are `#[ignore = "needs root"]` (docs/testing.md).

mod common;
use common::xrnic_bin;

use std::process::{Command, Output, Stdio};

use common::{text, wait_listening};
use xrnic_netns::{Side, VethPair};

const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";
const HEADER_MB: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
const HEADER_GB: &str =
    " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]";

/// `xrnic ARGS --no-stat` in `side`'s namespace.
fn netns_cmd(pair: &VethPair, side: Side, args: &[&str]) -> Command {
    let mut c = common::netns_cmd(pair, side, args);
    c.arg("--no-stat");
    c
}

/// Server on B with `srv` extra arguments, client on A with `cli`; (server, client).
fn perf_pair(
    pair: &VethPair,
    test: &str,
    srv: &[&str],
    cli: &[&str],
    port: u16,
) -> (Output, Output) {
    let port_s = port.to_string();
    let ifb = pair.end(Side::B).ifname.clone();
    let ifa = pair.end(Side::A).ifname.clone();
    let mut args_b = vec!["perf", test, "--netdev", &ifb, "-p", &port_s];
    args_b.extend_from_slice(srv);
    let mut server = netns_cmd(pair, Side::B, &args_b)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start server");
    wait_listening(pair, Side::B, port, &mut server);
    let mut args_a = vec!["perf", test, "--netdev", &ifa, "-p", &port_s];
    args_a.extend_from_slice(cli);
    args_a.push("192.0.2.2");
    let client = netns_cmd(pair, Side::A, &args_a)
        .output()
        .expect("run client");
    let server = server.wait_with_output().expect("server output");
    (server, client)
}

/// What one side printed: the result line's fields and the JSON object.
struct Printed {
    size: u64,
    iters: u64,
    peak: f64,
    avg: f64,
    rate: f64,
    json: Option<serde_json::Value>,
}

fn parse(o: &Output, gbits: bool) -> Printed {
    let t = text(o);
    assert!(o.status.success(), "{t}");
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    let h = lines
        .iter()
        .position(|l| *l == if gbits { HEADER_GB } else { HEADER_MB })
        .unwrap_or_else(|| panic!("no result header: {t}"));
    assert_eq!(lines[h - 1], RESULT_LINE, "{t}");
    assert_eq!(lines[h + 2], RESULT_LINE, "{t}");
    let f: Vec<&str> = lines[h + 1].split_whitespace().collect();
    assert_eq!(f.len(), 5, "{t}");
    let json = lines
        .last()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {t}")));
    Printed {
        size: f[0].parse().unwrap(),
        iters: f[1].parse().unwrap(),
        peak: f[2].parse().unwrap(),
        avg: f[3].parse().unwrap(),
        rate: f[4].parse().unwrap(),
        json,
    }
}

fn check_json(p: &Printed, test: &str, size: u64, mtu: u64, qps: usize, role: &str) {
    let v = p.json.as_ref().expect("--json line");
    assert_eq!(v["test"], test, "{v}");
    assert_eq!(v["role"], role, "{v}");
    assert_eq!(v["size"].as_u64(), Some(size), "{v}");
    assert_eq!(v["iters"].as_u64(), Some(p.iters), "{v}");
    assert_eq!(v["mtu"].as_u64(), Some(mtu), "{v}");
    // The table is in MB/sec (2^20 B/s); the JSON in Gb/s.
    let gbps = v["bw_avg_gbps"].as_f64().unwrap();
    assert!(
        (gbps - p.avg * 1_048_576.0 * 8.0 / 1e9).abs() <= 0.01 * gbps + 1e-4,
        "{v} vs table {}",
        p.avg
    );
    assert!(v["bw_peak_gbps"].as_f64().is_some(), "{v}");
    assert!(
        (v["msg_rate_mpps"].as_f64().unwrap() - p.rate).abs() < 1e-6 + 0.01 * p.rate,
        "{v}"
    );
    let list = v["qps"].as_array().expect("qps");
    assert_eq!(list.len(), qps, "{v}");
    let mut sum = 0;
    for q in list {
        assert!(q["qpn"].as_u64().is_some_and(|n| n > 1), "{v}");
        assert!(q["bw_avg_gbps"].as_f64().is_some_and(|b| b > 0.0), "{v}");
        sum += q["bytes"].as_u64().unwrap();
    }
    assert_eq!(sum, p.iters * size, "{v}");
    assert!(
        v["counters"]["device"]["qp"]["packets_sent"]
            .as_u64()
            .unwrap()
            > 0,
        "{v}"
    );
    assert!(v["counters"]["driver"].is_object(), "{v}");
    assert!(v["counters"].get("congestion").is_some(), "{v}");
}

/// Both sides succeeded with the expected size and message count, verified the data,
/// and (with `--json`) printed a consistent JSON last line.
fn check_pair(srv: &Output, cli: &Output, test: &str, size: u64, iters: u64, qps: usize, mtu: u64) {
    let (s, c) = (parse(srv, false), parse(cli, false));
    for (p, o, role) in [(&s, srv, "server"), (&c, cli, "client")] {
        let t = text(o);
        assert_eq!((p.size, p.iters), (size, iters * qps as u64), "{t}");
        assert!(p.avg > 0.0 && p.rate > 0.0, "{t}");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("\nverify: every byte as expected\n"),
            "{t}"
        );
        check_json(p, test, size, mtu, qps, role);
    }
    // Only the requester measures peaks; the send server prints 0 like perftest's.
    assert!(c.peak > 0.0, "{}", text(cli));
    if test == "send" {
        assert_eq!(s.peak, 0.0, "{}", text(srv));
    } else {
        // A passive server prints the client's report.
        assert_eq!((s.peak, s.avg, s.rate), (c.peak, c.avg, c.rate));
    }
}

#[test]
#[ignore = "needs root"]
fn perf_all_tests_pair_with_two_qps_ipv4_mtu_1024() {
    let pair = VethPair::new(1500).expect("veth pair");
    let mut port = 19515;
    for (test, size) in [
        ("write", 65536),
        ("read", 65536),
        ("send", 65536),
        ("atomic", 8),
    ] {
        for q in ["1", "2"] {
            let a = ["-n", "50", "-q", q, "--verify", "--json"];
            let (srv, cli) = perf_pair(&pair, test, &a, &a, port);
            check_pair(&srv, &cli, test, size, 50, q.parse().unwrap(), 1024);
            port += 1;
        }
    }
}

#[test]
#[ignore = "needs root"]
fn perf_ipv6_gid_and_mtu_4096_on_a_9000_veth() {
    let pair = VethPair::new(9000).expect("veth pair");
    let mut port = 19600;
    for test in ["write", "read", "send"] {
        let a = ["-n", "40", "-x", "2", "-m", "4096", "--verify", "--json"];
        let (srv, cli) = perf_pair(&pair, test, &a, &a, port);
        check_pair(&srv, &cli, test, 65536, 40, 1, 4096);
        // The GID lines name the IPv6 addresses (perftest prints the bytes in decimal).
        let out = String::from_utf8_lossy(&cli.stdout);
        assert!(
            out.contains(" GID: 253:00:00:00:00:00:00:00:00:00:00:00:00:00:00:01\n"),
            "{out}"
        );
        port += 1;
    }
    // Small atomics and 8-byte writes with several moderation groups, IPv6.
    let a = ["-n", "300", "-x", "2", "-s", "8", "--verify", "--json"];
    let (srv, cli) = perf_pair(&pair, "write", &a, &a, port);
    check_pair(&srv, &cli, "write", 8, 300, 1, 4096);
}

#[test]
#[ignore = "needs root"]
fn perf_duration_mode_and_gbits() {
    let pair = VethPair::new(1500).expect("veth pair");
    for (test, port) in [("write", 19700), ("send", 19701)] {
        let a = ["-D", "1", "-s", "4096", "--report_gbits", "--json"];
        let (srv, cli) = perf_pair(&pair, test, &a, &a, port);
        for o in [&srv, &cli] {
            let p = parse(o, true);
            let t = text(o);
            assert!(p.iters > 0 && p.avg > 0.0, "{t}");
            assert_eq!(p.peak, 0.0, "-D reports no peak: {t}");
            let v = p.json.unwrap();
            assert_eq!(v["duration"].as_u64(), Some(1), "{v}");
            // The table prints two decimals (perftest's %.2f): at a slow link's 0.09 Gb/s
            // that rounding alone is several per cent of the value.
            let j = v["bw_avg_gbps"].as_f64().unwrap();
            assert!(
                (j - p.avg).abs() <= 0.005 + 0.01 * p.avg,
                "json {j} text {}: {t}",
                p.avg
            );
        }
    }
}

#[test]
#[ignore = "needs root"]
fn perf_errors_are_clear() {
    let pair = VethPair::new(1500).expect("veth pair");
    let ifb = pair.end(Side::B).ifname.clone();
    let run = |args: &[&str]| netns_cmd(&pair, Side::B, args).output().unwrap();
    let expect = |o: Output, code: i32, msg: &str| {
        let t = text(&o);
        assert_eq!(o.status.code(), Some(code), "{t}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(msg),
            "want {msg:?}: {t}"
        );
    };
    expect(
        run(&["perf", "copy", "--netdev", &ifb]),
        2,
        "invalid value 'copy'",
    );
    expect(
        run(&["perf", "atomic", "--netdev", &ifb, "-s", "16"]),
        2,
        "atomic operations are 8 bytes",
    );
    expect(
        run(&["perf", "write", "--netdev", &ifb, "-A", "FETCH_AND_ADD"]),
        2,
        "applies to the atomic test only",
    );
    expect(
        run(&["perf", "write", "--netdev", &ifb, "-m", "1500"]),
        2,
        "not an IB MTU",
    );
    expect(
        run(&["perf", "write", "--netdev", &ifb, "-n", "2"]),
        2,
        "2 is not in 5..=100000000",
    );
    expect(
        run(&["perf", "write", "--netdev", &ifb, "-n", "10", "-D", "2"]),
        2,
        "cannot be used with",
    );
    expect(
        run(&["perf", "send", "--netdev", &ifb, "-D", "2", "--verify"]),
        2,
        "--verify needs a known number of messages",
    );
    expect(
        run(&["perf", "atomic", "--netdev", &ifb, "-A", "ADD"]),
        2,
        "invalid value 'ADD'",
    );
    // Nothing listens on the server's port: one clear line, status 1.
    let o = run(&["perf", "write", "--netdev", &ifb, "-p", "1", "192.0.2.1"]);
    expect(o, 1, "Couldn't connect to 192.0.2.1:1");
    expect(
        run(&["perf", "write", "--netdev", &ifb, "-x", "9"]),
        1,
        "can't read sgid of index 9",
    );
    expect(
        run(&["perf", "write", "--netdev", &ifb, "-m", "4096"]),
        1,
        "path MTU 4096 is above the active MTU 1024",
    );
}

#[test]
#[ignore = "needs root"]
fn perf_verify_catches_what_did_not_happen() {
    let pair = VethPair::new(1500).expect("veth pair");
    // The server expects 200 FETCH_AND_ADDs, the client does 100: the counters are short.
    let (srv, cli) = perf_pair(
        &pair,
        "atomic",
        &["-n", "200", "--verify"],
        &["-n", "100"],
        19800,
    );
    assert!(cli.status.success(), "{}", text(&cli));
    assert_eq!(srv.status.code(), Some(1), "{}", text(&srv));
    assert!(
        String::from_utf8_lossy(&srv.stderr)
            .contains("verify (atomic): qp 0 counter at offset 0 is 2, expected 4"),
        "{}",
        text(&srv)
    );
    // 100-byte writes cycle over 32 offsets of 128 bytes; a client that writes 20 leaves
    // the 21st offset empty.
    let (srv, cli) = perf_pair(
        &pair,
        "write",
        &["-n", "40", "-s", "100", "--verify"],
        &["-n", "20", "-s", "100"],
        19801,
    );
    assert!(cli.status.success(), "{}", text(&cli));
    assert_eq!(srv.status.code(), Some(1), "{}", text(&srv));
    assert!(
        String::from_utf8_lossy(&srv.stderr).contains("verify (write): qp 0 offset 2560 is 0x00"),
        "{}",
        text(&srv)
    );
}

#[test]
#[ignore = "needs root"]
fn perf_dcqcn_json_rates_cc_log_and_plot() {
    let pair = VethPair::new(1500).expect("veth pair");
    let dir = std::env::temp_dir().join(format!("xrnic-perf-cc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("cc.csv");
    let csv_s = csv.to_str().unwrap();
    let (srv, cli) = perf_pair(
        &pair,
        "write",
        &["-q", "2", "-n", "200", "-s", "4096", "--dcqcn", "--json"],
        &[
            "-q",
            "2",
            "-n",
            "200",
            "-s",
            "4096",
            "--json",
            "--cc-param",
            "rp_ai_rate=10",
            "--tclass",
            "106",
            "--cc-log",
            csv_s,
            "--cc-log-interval",
            "5",
        ],
        18611,
    );
    let (s, c) = (parse(&srv, false), parse(&cli, false));
    let v = c.json.as_ref().expect("--json line");
    let cong = &v["counters"]["congestion"];
    assert_eq!(cong["params"]["rp_ai_rate"].as_u64(), Some(10), "{v}");
    assert_eq!(cong["params"]["rp_time_reset"].as_u64(), Some(300), "{v}");
    // Nothing marks CE on a veth: DCQCN is on but never throttles.
    for k in [
        "np_cnp_sent",
        "np_ecn_marked_roce_packets",
        "rp_cnp_handled",
        "rp_cnp_ignored",
    ] {
        assert_eq!(v["counters"]["device"][k].as_u64(), Some(0), "{k}: {v}");
    }
    let line = cong["line_rate_bps"].as_u64().unwrap();
    for q in v["qps"].as_array().unwrap() {
        assert_eq!(q["rate_bps"].as_u64(), Some(line), "{v}");
        assert_eq!(q["target_bps"].as_u64(), Some(line), "{v}");
        assert!(
            (q["alpha"].as_f64().unwrap() - 1023.0 / 1024.0).abs() < 1e-9,
            "{v}"
        );
        assert_eq!(q["rp_cnp_handled"].as_u64(), Some(0), "{v}");
        assert!(q["retransmitted_packets"].as_u64().is_some(), "{v}");
    }
    let sv = s.json.as_ref().unwrap();
    assert!(sv["counters"]["congestion"]["params"].is_object(), "{sv}");

    // The CSV: both QPs sampled, rates filled, delivered bytes end at 200 × 4096 each.
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = csv_text.lines();
    assert_eq!(lines.next(), Some(xrnic_cli::cli::cclog::HEADER));
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    assert!(rows.len() >= 2, "{csv_text}");
    for qp in ["0", "1"] {
        let last = rows
            .iter()
            .rev()
            .find(|r| r[1] == qp)
            .expect("a row per QP");
        assert_eq!(last[6], (200 * 4096).to_string(), "{csv_text}");
        assert_eq!(
            last[3].parse::<f64>().unwrap(),
            line as f64 / 1e6,
            "{csv_text}"
        );
    }
    let svg = dir.join("cc.svg");
    let out = Command::new(xrnic_bin())
        .args(["plot", csv_s, "-o", svg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(std::fs::read_to_string(&svg).unwrap().contains("qp 1 rate"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn perf_cc_usage_errors() {
    for (args, want) in [
        (
            &["--cc-param", "rp_ai_rat=1"][..],
            "unknown DCQCN parameter 'rp_ai_rat'",
        ),
        (
            &["--cc-param", "rp_gd=99"],
            "rp_gd=99 is out of range 0…15 (shift)",
        ),
        (&["--no-dcqcn", "--dcqcn"], "cannot be used with"),
        (
            &["--cc-log", "/tmp/x.csv"],
            "--cc-log is sampled by the client",
        ),
    ] {
        let out = Command::new(xrnic_bin())
            .args(["perf", "write", "--netdev", "lo", "--no-stat"])
            .args(args)
            .output()
            .unwrap();
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {t}");
        assert!(t.contains(want), "{args:?}: {t}");
    }
    let out = Command::new(xrnic_bin())
        .args(["plot", "/nonexistent.csv", "-o", "/tmp/x.svg"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("cannot read /nonexistent.csv"));
}
