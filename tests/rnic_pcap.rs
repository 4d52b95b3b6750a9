//! `--pcap FILE` on the commands that move traffic over AF_XDP (`rc-pingpong`, `perf`), the
//! capture tap in the driver: on a veth pair with the driver's fault injector, each
//! device's capture holds every frame it sent (outbound, with a comment naming every
//! retransmission) and every frame it received (inbound, with a comment on each frame the
//! fault injector dropped); `xrnic decode --strict` finds every ICRC valid, tshark reads it,
//! and the retransmissions the comments name equal the device's counter and what `xrnic
//! explain` finds in the capture. SIGINT leaves a complete file. The same tap on the
//! in-process simulated link runs without root. The others are `#[ignore = "needs root"]`
//! (docs/testing.md).

mod common;
use common::xrnic_bin;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{StatFiles, netns_cmd, require_tshark, text, wait_listening};
use serde_json::Value;
use xrnic_netns::{Side, VethPair};

fn scratch(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("rnic-pcap-{}-{name}.pcapng", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// `args_b` as the server in B, then `args_a` + the server's address as the client in A.
fn client_server(pair: &VethPair, port: u16, args_b: &[&str], args_a: &[&str]) -> [Output; 2] {
    let mut server = netns_cmd(pair, Side::B, args_b)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start server");
    wait_listening(pair, Side::B, port, &mut server);
    let client = netns_cmd(pair, Side::A, args_a)
        .arg("192.0.2.2")
        .output()
        .expect("run client");
    let server = server.wait_with_output().expect("server output");
    assert!(client.status.success(), "client: {}", text(&client));
    assert!(server.status.success(), "server: {}", text(&server));
    [client, server]
}

/// `side`'s last stat snapshot, which its program wrote on close (`--final-stat`; the
/// snapshot in /run/xrnic is removed on close).
fn stat(final_stat: &Path) -> Value {
    let t = std::fs::read(final_stat).unwrap_or_else(|e| panic!("{}: {e}", final_stat.display()));
    let v: Value = serde_json::from_slice(&t).expect("final snapshot");
    assert_eq!(v["running"], false, "{v}");
    v
}

/// Where `name`'s `--final-stat` goes.
fn final_stat(name: &str) -> PathBuf {
    let p = scratch(name).with_extension("json");
    let _ = std::fs::remove_file(&p);
    p
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// What a capture holds, read three ways.
#[derive(Debug, Default)]
struct Seen {
    frames: u64,
    outbound: u64,
    inbound: u64,
    /// Comments starting with "retransmission".
    retransmissions: u64,
    /// Comments naming the fault injector.
    fault_dropped: u64,
    /// `xrnic explain --json`'s summary.
    explain: Value,
}

/// The `epb_flags` direction bits of every packet (1 inbound, 2 outbound, 0 none).
fn directions(bytes: &[u8]) -> Vec<u32> {
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption;
    use pcap_file::pcapng::{Block, PcapNgReader};
    let mut r = PcapNgReader::new(bytes).expect("pcapng");
    let mut v = Vec::new();
    while let Some(b) = r.next_block() {
        if let Block::EnhancedPacket(p) = b.expect("block") {
            v.push(
                p.options
                    .iter()
                    .find_map(|o| match o {
                        EnhancedPacketOption::Flags(f) => Some(f & 3),
                        _ => None,
                    })
                    .unwrap_or(0),
            );
        }
    }
    v
}

/// Read `path` with xrnic's reader, `xrnic decode --strict` (every ICRC valid) and
/// `xrnic explain --json`; check the timestamps lie in [`from`, `to`] (wall clock).
fn examine(path: &Path, from: SystemTime, to: SystemTime) -> Seen {
    let p = path.to_str().unwrap();
    let o = Command::new(xrnic_bin())
        .args(["decode", "--strict", p])
        .output()
        .unwrap();
    assert!(o.status.success(), "decode --strict {p}: {}", text(&o));

    let frames = xrnic::io::capture::read_file(path).unwrap();
    assert!(!frames.is_empty(), "{p}: empty");
    let since = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap();
    let mut last = Duration::ZERO;
    for f in &frames {
        assert!(
            f.timestamp >= since(from) && f.timestamp <= since(to),
            "{p}: frame {} at {:?} is outside the run",
            f.number,
            f.timestamp
        );
        assert!(
            f.timestamp >= last,
            "{p}: frame {} goes back in time",
            f.number
        );
        last = f.timestamp;
    }
    let bytes = std::fs::read(path).unwrap();
    let comments = xrnic::io::pcap_out::packet_comments(&bytes);
    assert_eq!(comments.len(), frames.len());
    let dirs = directions(&bytes);
    assert!(dirs.iter().all(|&d| d == 1 || d == 2), "{p}: {dirs:?}");
    let count = |pat: &str, starts: bool| {
        comments
            .iter()
            .flatten()
            .filter(|c| {
                if starts {
                    c.starts_with(pat)
                } else {
                    c.contains(pat)
                }
            })
            .count() as u64
    };
    // Outbound retransmissions carry the reason; inbound frames never claim one (the
    // receiver cannot know why its peer sent a frame).
    for (c, d) in comments.iter().zip(&dirs) {
        if c.as_deref()
            .is_some_and(|c| c.starts_with("retransmission"))
        {
            assert_eq!(*d, 2, "{p}: {c:?}");
        }
    }

    let o = Command::new(xrnic_bin())
        .args(["explain", "--json", p])
        .output()
        .unwrap();
    assert!(o.status.success(), "explain {p}: {}", text(&o));
    let explain: Value = String::from_utf8_lossy(&o.stdout)
        .lines()
        .last()
        .map(|l| serde_json::from_str(l).unwrap())
        .expect("explain summary");
    assert_eq!(u(&explain["packets"]), frames.len() as u64, "{explain}");
    Seen {
        frames: frames.len() as u64,
        outbound: dirs.iter().filter(|&&d| d == 2).count() as u64,
        inbound: dirs.iter().filter(|&&d| d == 1).count() as u64,
        retransmissions: count("retransmission", true),
        fault_dropped: count("fault injector", false),
        explain,
    }
}

/// Lines tshark prints for `filter` on `path`.
fn tshark_count(path: &Path, filter: &str) -> u64 {
    let o = Command::new("tshark")
        .arg("-r")
        .arg(path)
        .args(["-Y", filter])
        .output()
        .unwrap();
    assert!(o.status.success(), "tshark {filter}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).lines().count() as u64
}

/// Both devices of the run against their captures: every frame sent and received is
/// there, the comments name each retransmission and each frame the fault injector
/// dropped, and explain counts the retransmissions of both devices (each capture holds
/// both: its own as sent, the peer's as received before the fault injector).
fn check_captures(stats: [&Path; 2], caps: [&Path; 2], from: SystemTime, to: SystemTime) -> u64 {
    let mut total_retx = 0;
    let mut seen = Vec::new();
    for ((side, cap), st) in [Side::A, Side::B].into_iter().zip(caps).zip(stats) {
        let s = stat(st);
        let (dev, drv, port) = (&s["device"], &s["driver"], &s["port"]);
        assert_eq!(u(&drv["capture_lost"]), 0, "{s}");
        assert_eq!(
            u(&port["kernel_rx_dropped"]),
            0,
            "the kernel dropped frames before the socket: they cannot be in the capture"
        );
        let seen_side = examine(cap, from, to);
        let retx = u(&dev["qp"]["retransmitted_packets"]);
        assert_eq!(seen_side.frames, u(&drv["capture_frames"]), "{s}");
        assert_eq!(seen_side.outbound, u(&dev["qp"]["packets_sent"]), "{s}");
        assert_eq!(
            seen_side.inbound,
            u(&drv["frames_in"]) + u(&drv["fault_dropped"]),
            "{s}"
        );
        assert_eq!(seen_side.fault_dropped, u(&drv["fault_dropped"]), "{s}");
        assert_eq!(seen_side.retransmissions, retx, "{side:?}: {s}");
        eprintln!(
            "{side:?}: {} frames ({} out, {} in), {retx} retransmissions, {} dropped by the fault injector",
            seen_side.frames, seen_side.outbound, seen_side.inbound, seen_side.fault_dropped
        );
        total_retx += retx;
        {
            require_tshark();
            assert_eq!(tshark_count(cap, "infiniband"), seen_side.frames);
            assert_eq!(
                tshark_count(cap, "frame.comment contains \"retransmission\""),
                retx
            );
            assert_eq!(
                tshark_count(cap, "frame.packet_flags_direction == 2"),
                seen_side.outbound
            );
        }
        seen.push(seen_side);
    }
    for s in &seen {
        assert_eq!(
            u(&s.explain["retransmitted_packets"]),
            total_retx,
            "{:?}",
            s.explain
        );
    }
    total_retx
}

#[test]
#[ignore = "needs root"]
fn rc_pingpong_pcap_with_rx_drop_names_every_retransmission() {
    let pair = VethPair::new(1500).expect("veth pair");
    let _stats = StatFiles::of(&pair);
    let (ca, cb) = (scratch("pp-a"), scratch("pp-b"));
    let (fa, fb) = (final_stat("pp-a"), final_stat("pp-b"));
    let (ia, ib) = (
        pair.end(Side::A).ifname.clone(),
        pair.end(Side::B).ifname.clone(),
    );
    let common = [
        "-p",
        "18950",
        "-s",
        "8192",
        "-n",
        "200",
        "--verify",
        "--rx-drop",
        "0.03",
    ];
    let from = SystemTime::now();
    let mut b = vec![
        "rc-pingpong",
        "--netdev",
        &ib,
        "--pcap",
        cb.to_str().unwrap(),
        "--final-stat",
        fb.to_str().unwrap(),
    ];
    b.extend_from_slice(&common);
    let mut a = vec![
        "rc-pingpong",
        "--netdev",
        &ia,
        "--pcap",
        ca.to_str().unwrap(),
        "--final-stat",
        fa.to_str().unwrap(),
    ];
    a.extend_from_slice(&common);
    client_server(&pair, 18950, &b, &a);
    let to = SystemTime::now();
    let retx = check_captures([&fa, &fb], [&ca, &cb], from, to);
    // 1600 SEND packets each way with 3 % of the frames dropped on receipt: losses that
    // only a retransmission repairs (every byte was verified).
    assert!(retx > 0, "no retransmission at all");
    let (sa, sb) = (stat(&fa), stat(&fb));
    assert!(u(&sa["driver"]["fault_dropped"]) + u(&sb["driver"]["fault_dropped"]) > 0);
    for f in [&ca, &cb, &fa, &fb] {
        let _ = std::fs::remove_file(f);
    }
}

#[test]
#[ignore = "needs root"]
fn perf_pcap_on_both_roles_with_a_lossy_responder() {
    let pair = VethPair::new(1500).expect("veth pair");
    let _stats = StatFiles::of(&pair);
    let (ca, cb) = (scratch("perf-a"), scratch("perf-b"));
    let (fa, fb) = (final_stat("perf-a"), final_stat("perf-b"));
    let (ia, ib) = (
        pair.end(Side::A).ifname.clone(),
        pair.end(Side::B).ifname.clone(),
    );
    let common = ["-p", "18960", "-s", "16384", "-n", "300", "--verify"];
    let from = SystemTime::now();
    let mut b = vec![
        "perf",
        "write",
        "--netdev",
        &ib,
        "--pcap",
        cb.to_str().unwrap(),
        "--final-stat",
        fb.to_str().unwrap(),
        "--rx-drop",
        "0.03",
    ];
    b.extend_from_slice(&common);
    // Only the responder loses frames (WRITE packets; it answers the next one with a NAK
    // sequence error): the server, a WRITE responder, never retransmits, so every
    // retransmission in either capture is the client's, the one device that retransmits.
    let mut a = vec![
        "perf",
        "write",
        "--netdev",
        &ia,
        "--pcap",
        ca.to_str().unwrap(),
        "--final-stat",
        fa.to_str().unwrap(),
        "--json",
    ];
    a.extend_from_slice(&common);
    let [client, _server] = client_server(&pair, 18960, &b, &a);
    let to = SystemTime::now();
    let retx = check_captures([&fa, &fb], [&ca, &cb], from, to);
    // 4800 WRITE packets, 3 % dropped on receipt: each loss costs a Go-Back-N.
    assert!(retx > 0, "no retransmission at all");
    // perf --json reports the same counters.
    let out = String::from_utf8_lossy(&client.stdout);
    let j: Value = serde_json::from_str(out.lines().last().unwrap()).expect("perf --json");
    let c = &j["counters"];
    assert_eq!(u(&c["device"]["qp"]["retransmitted_packets"]), retx, "{j}");
    assert_eq!(u(&stat(&fb)["device"]["qp"]["retransmitted_packets"]), 0);
    // The client's capture is the requester's side of 300 WRITEs of 16 packets.
    let sa = examine(&ca, from, to);
    assert_eq!(u(&sa.explain["qps"]), 1, "{:?}", sa.explain);
    assert!(u(&sa.explain["messages"]) >= 300, "{:?}", sa.explain);
    let _ = std::fs::remove_file(&ca);
    let _ = std::fs::remove_file(&cb);
}

#[test]
#[ignore = "needs root"]
fn sigint_leaves_a_complete_capture_and_exit_status_130() {
    let pair = VethPair::new(1500).expect("veth pair");
    let _stats = StatFiles::of(&pair);
    let (ca, cb) = (scratch("int-a"), scratch("int-b"));
    let (ia, ib) = (
        pair.end(Side::A).ifname.clone(),
        pair.end(Side::B).ifname.clone(),
    );
    let common = ["-p", "18970", "-s", "1024", "-n", "100000000"];
    let mut b = vec![
        "rc-pingpong",
        "--netdev",
        &ib,
        "--pcap",
        cb.to_str().unwrap(),
    ];
    b.extend_from_slice(&common);
    let mut server = netns_cmd(&pair, Side::B, &b)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_listening(&pair, Side::B, 18970, &mut server);
    let mut a = vec![
        "rc-pingpong",
        "--netdev",
        &ia,
        "--pcap",
        ca.to_str().unwrap(),
    ];
    a.extend_from_slice(&common);
    let client = netns_cmd(&pair, Side::A, &a)
        .arg("192.0.2.2")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until traffic flows (the server's capture grows), bounded.
    let mut flowing = false;
    for _ in 0..1000 {
        if std::fs::metadata(&cb).is_ok_and(|m| m.len() > 100_000) {
            flowing = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // `ip netns exec` runs the tool in its own process (exec): the signal reaches it.
    for c in [&client, &server] {
        let pid = rustix::process::Pid::from_raw(c.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    }
    let (oc, os) = (
        client.wait_with_output().unwrap(),
        server.wait_with_output().unwrap(),
    );
    assert!(flowing, "no traffic: {}\n{}", text(&oc), text(&os));
    for (o, cap) in [(&oc, &ca), (&os, &cb)] {
        assert_eq!(o.status.code(), Some(130), "{}", text(o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("interrupted; the capture is flushed"),
            "{}",
            text(o)
        );
        // The file ends with a whole packet block, and every packet decodes.
        let d = Command::new(xrnic_bin())
            .args(["decode", "--strict", cap.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(d.status.success(), "{}", text(&d));
        assert!(xrnic::io::capture::read_file(cap).unwrap().len() > 10);
    }
    let _ = std::fs::remove_file(&ca);
    let _ = std::fs::remove_file(&cb);
}

#[test]
fn sim_pair_devices_capture_without_root() {
    use xrnic::verbs::{
        Access, ConnectOpts, Device, DeviceOptions, Mtu, QpInitAttr, Remote, SendWr, WcStatus,
        WrOpcode,
    };
    let (ca, cb) = (scratch("sim-a"), scratch("sim-b"));
    let opts = |p: &Path| DeviceOptions {
        pcap: Some(p.to_path_buf()),
        rx_drop: 0.05,
        seed: 7,
        ..DeviceOptions::default()
    };
    let from = SystemTime::now();
    let (da, db) = Device::open_sim_pair_with(&opts(&ca), &opts(&cb)).unwrap();
    let mk = |d: &Device| {
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(256).unwrap();
        let mr = pd.reg_mr(1 << 16, Access::ALL).unwrap();
        let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 128)).unwrap();
        (pd, cq, mr, qp)
    };
    let (a, b) = (mk(&da), mk(&db));
    let o = ConnectOpts {
        access: Access::ALL,
        path_mtu: Mtu::Mtu1024,
        timeout: 8,
        ..ConnectOpts::default()
    };
    let gid = |d: &Device| d.query_gid(1).unwrap();
    let remote = |qp: &xrnic::verbs::Qp, psn, d: &Device| Remote {
        qpn: qp.qp_num(),
        psn,
        gid: gid(d),
    };
    a.3.connect(&remote(&b.3, 100, &db), 200, 1, &o).unwrap();
    b.3.connect(&remote(&a.3, 200, &da), 100, 1, &o).unwrap();
    // 40 WRITEs of 8 KiB (8 packets each) A -> B; 5 % of the frames dropped each way.
    for i in 0..40u64 {
        let mut wr = SendWr::new(i, WrOpcode::RdmaWrite);
        wr.sg_list = vec![a.2.sge(0, 8192)];
        wr.rdma.remote_addr = b.2.addr();
        wr.rdma.rkey = b.2.rkey();
        a.3.post_send(wr).unwrap();
    }
    let mut done = 0;
    while done < 40 {
        let wcs = a.1.wait(16, Duration::from_secs(30));
        assert!(!wcs.is_empty(), "no completion within 30 s ({done} of 40)");
        for wc in &wcs {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        }
        done += wcs.len();
    }
    let retx = [&da, &db].map(|d| d.counters().unwrap().qp.retransmitted_packets);
    // B, a WRITE responder, never retransmits.
    assert_eq!(retx[1], 0);
    drop((a, b));
    drop((da, db));
    let to = SystemTime::now();
    for cap in [&ca, &cb] {
        let s = examine(cap, from, to);
        let own = if cap == &ca { retx[0] } else { 0 };
        assert_eq!(s.retransmissions, own, "{cap:?}");
        assert_eq!(
            u(&s.explain["retransmitted_packets"]),
            retx[0],
            "{:?}",
            s.explain
        );
        let _ = std::fs::remove_file(cap);
    }
}

#[test]
#[ignore = "needs root"]
fn an_unwritable_pcap_path_is_a_clear_error() {
    let pair = VethPair::new(1500).expect("veth pair");
    let _stats = StatFiles::of(&pair);
    let ifa = pair.end(Side::A).ifname.clone();
    let bad = "/nonexistent-xrnic-dir/cap.pcapng";
    // The second command opens the same interface: it gets the same error, not "XDP
    // program already attached", so the first released the device.
    for args in [
        vec![
            "rc-pingpong",
            "--netdev",
            &ifa,
            "--pcap",
            bad,
            "-p",
            "18980",
        ],
        vec![
            "perf", "write", "--netdev", &ifa, "--pcap", bad, "-p", "18980",
        ],
    ] {
        let o = netns_cmd(&pair, Side::A, &args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(
            err.contains(bad) && err.contains("cannot create"),
            "{}",
            text(&o)
        );
    }
}

#[test]
#[ignore = "needs root"]
fn frames_the_engine_refuses_are_in_the_capture_with_the_reason() {
    use xrnic::verbs::{Device, DeviceOptions};
    let pair = VethPair::new(1500).expect("veth pair");
    let cap = scratch("refused");
    let opts = DeviceOptions {
        pcap: Some(cap.clone()),
        ..DeviceOptions::default()
    };
    let dev = pair
        .run_in(Side::A, || {
            Device::open_with(&pair.end(Side::A).ifname, &opts)
        })
        .expect("enter netns")
        .expect("open device");
    // B's kernel builds Ethernet/IP/UDP to port 4791 (the XDP filter redirects them to
    // the device); the RoCE part is bad.
    let bad: Vec<Vec<u8>> = vec![
        vec![0x04],                                           // truncated BTH
        vec![0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 0], // BTH without ICRC
        {
            // SEND ONLY to QP 0x11 with a wrong ICRC.
            let mut v = vec![0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 1];
            v.extend_from_slice(&[0xab; 20]);
            v.extend_from_slice(&[1, 2, 3, 4]);
            v
        },
    ];
    pair.run_in(Side::B, || {
        let s = std::net::UdpSocket::bind("192.0.2.2:0").unwrap();
        for p in &bad {
            s.send_to(p, "192.0.2.1:4791").unwrap();
        }
    })
    .unwrap();
    // Wait (bounded) until the driver has seen them, then close the device (the capture
    // is complete once it is closed).
    for _ in 0..500 {
        if dev.counters().unwrap().malformed_frames_dropped >= 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(dev.counters().unwrap().malformed_frames_dropped, 3);
    drop(dev);
    let bytes = std::fs::read(&cap).unwrap();
    let _ = std::fs::remove_file(&cap);
    assert_eq!(directions(&bytes), [1, 1, 1], "three inbound frames");
    let c = xrnic::io::pcap_out::packet_comments(&bytes);
    let c: Vec<&str> = c.iter().map(|c| c.as_deref().unwrap_or("")).collect();
    assert!(
        c[0].contains("malformed") && c[1].contains("malformed"),
        "{c:?}"
    );
    assert!(c[2].contains("bad ICRC"), "{c:?}");
    // The frames are there byte for byte: the UDP payloads as sent, after Ethernet (14),
    // IPv4 (20) and UDP (8).
    let frames = xrnic::io::capture::read_bytes(&bytes).unwrap();
    for (f, p) in frames.iter().zip(&bad) {
        assert_eq!(f.data.get(42..42 + p.len()), Some(&p[..]), "{:?}", f.data);
    }
}
