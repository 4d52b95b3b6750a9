//! The `xrnic` tools on a veth pair: `rc-pingpong` client and server as two processes in
//! two namespaces (`ip netns exec`), sizes 1 / 4096 / 65536, IPv4 and IPv6 GIDs, path MTU
//! 1024 and 4096, with `--verify`; `devinfo` on a veth end; `stat` reading the snapshot
//! of a device in another process; clear errors (not root, no interface, TCP port in
//! use, device already open). The root tests are `#[ignore = "needs root"]`
//! (docs/testing.md).

mod common;
use common::xrnic_bin;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{StatFiles, netns_cmd, text, wait_listening};
use xrnic_netns::{Side, VethPair};

/// Server on B, client on A; returns (server output, client output).
fn pingpong(pair: &VethPair, extra: &[&str], port: u16) -> (Output, Output) {
    pingpong_named(pair, extra, port, false)
}

/// [`pingpong`], naming the devices the ibv_rc_pingpong way (`-d xrnic_IF`) if `ib_dev`.
fn pingpong_named(pair: &VethPair, extra: &[&str], port: u16, ib_dev: bool) -> (Output, Output) {
    let port_s = port.to_string();
    let dev_b = format!("xrnic_{}", pair.end(Side::B).ifname);
    let dev_a = format!("xrnic_{}", pair.end(Side::A).ifname);
    let (flag, name_b, name_a) = if ib_dev {
        ("-d", dev_b.as_str(), dev_a.as_str())
    } else {
        (
            "--netdev",
            pair.end(Side::B).ifname.as_str(),
            pair.end(Side::A).ifname.as_str(),
        )
    };
    let mut args_b = vec!["rc-pingpong", flag, name_b, "-p", &port_s, "--verify"];
    args_b.extend_from_slice(extra);
    let mut server = netns_cmd(pair, Side::B, &args_b)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start server");
    wait_listening(pair, Side::B, port, &mut server);
    let mut args_a = vec!["rc-pingpong", flag, name_a, "-p", &port_s, "--verify"];
    args_a.extend_from_slice(extra);
    args_a.push("192.0.2.2");
    let client = netns_cmd(pair, Side::A, &args_a)
        .output()
        .expect("run client");
    let server = server.wait_with_output().expect("server output");
    (server, client)
}

fn check_run(o: &Output, size: u64, iters: u64, gid: &str, peer_gid: &str) {
    let t = text(o);
    assert!(o.status.success(), "{t}");
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("  local address:  LID 0x0000, QPN 0x")
            && lines[0].ends_with(&format!("GID {gid}")),
        "{t}"
    );
    assert!(
        lines[1].starts_with("  remote address: LID 0x0000, QPN 0x")
            && lines[1].ends_with(&format!("GID {peer_gid}")),
        "{t}"
    );
    assert!(
        lines[2].starts_with(&format!("{} bytes in ", size * iters * 2))
            && lines[2].ends_with(" Mbit/sec"),
        "{t}"
    );
    assert!(
        lines[3].starts_with(&format!("{iters} iters in ")) && lines[3].ends_with(" usec/iter"),
        "{t}"
    );
    assert_eq!(
        lines[4],
        format!("verify: {iters} messages received, every byte as sent"),
        "{t}"
    );
}

#[test]
#[ignore = "needs root"]
fn rc_pingpong_client_and_server_pair_ipv4_and_ipv6_sizes_1_4096_65536() {
    let pair = VethPair::new(1500).expect("veth pair");
    let _stats = StatFiles::of(&pair);
    let mut port = 18515;
    for (gid, a, b) in [
        ("1", "::ffff:192.0.2.1", "::ffff:192.0.2.2"),
        ("2", "fd00::1", "fd00::2"),
    ] {
        for size in [1u64, 4096, 65536] {
            let s = size.to_string();
            let (srv, cli) = pingpong(&pair, &["-g", gid, "-s", &s, "-n", "200"], port);
            check_run(&cli, size, 200, a, b);
            check_run(&srv, size, 200, b, a);
            // Each run opens and closes both devices: the next one must find the
            // interfaces free again (and the TCP port: use a fresh one anyway).
            port += 1;
        }
    }
}

#[test]
#[ignore = "needs root"]
fn rc_pingpong_at_path_mtu_4096_on_a_9000_veth() {
    let pair = VethPair::new(9000).expect("veth pair");
    let _stats = StatFiles::of(&pair);
    // Both ends write their last snapshot to one file (each renames its own temporary
    // file over it): either holds the same count of SEND packets.
    let last = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("rnic-cli-final-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&last);
    let (srv, cli) = pingpong(
        &pair,
        &[
            "-m",
            "4096",
            "-s",
            "65536",
            "-n",
            "100",
            "--final-stat",
            last.to_str().unwrap(),
        ],
        18600,
    );
    check_run(&cli, 65536, 100, "::ffff:192.0.2.1", "::ffff:192.0.2.2");
    check_run(&srv, 65536, 100, "::ffff:192.0.2.2", "::ffff:192.0.2.1");
    // The last snapshot (--final-stat) holds the traffic: 100 messages of 64 KiB at 4096
    // bytes per packet, 1600 SEND packets from each end.
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&last).expect("--final-stat file")).unwrap();
    let _ = std::fs::remove_file(&last);
    assert_eq!(v["running"], false, "{v}");
    let sent = v["device"]["qp"]["packets_sent"].as_u64().unwrap();
    let acks = v["device"]["qp"]["acks_sent"].as_u64().unwrap();
    assert_eq!(sent - acks, 1600, "{v}");
    // After a clean exit the snapshot is gone: stat finds no device there.
    let st = netns_cmd(
        &pair,
        Side::A,
        &["stat", "--netdev", &pair.end(Side::A).ifname],
    )
    .output()
    .unwrap();
    assert_eq!(st.status.code(), Some(1), "{}", text(&st));
    let file = pair
        .run_in(Side::A, || {
            xrnic::verbs::stat_file(
                std::path::Path::new("/run/xrnic"),
                &pair.end(Side::A).ifname,
            )
            .unwrap()
        })
        .unwrap();
    assert!(!file.exists(), "{} left after a clean exit", file.display());
}

#[test]
#[ignore = "needs root"]
fn rc_pingpong_takes_ibv_rc_pingpong_device_options() {
    let pair = VethPair::new(1500).expect("veth pair");
    let _stats = StatFiles::of(&pair);
    let (srv, cli) = pingpong_named(
        &pair,
        &["-i", "1", "-e", "-l", "0", "-n", "20"],
        18650,
        true,
    );
    check_run(&cli, 4096, 20, "::ffff:192.0.2.1", "::ffff:192.0.2.2");
    check_run(&srv, 4096, 20, "::ffff:192.0.2.2", "::ffff:192.0.2.1");
}

#[test]
#[ignore = "needs root"]
fn rc_pingpong_repairs_injected_loss() {
    let pair = VethPair::new(1500).expect("veth pair");
    let _stats = StatFiles::of(&pair);
    let (srv, cli) = pingpong(
        &pair,
        &["-s", "8192", "-n", "200", "--rx-drop", "0.02"],
        18700,
    );
    check_run(&cli, 8192, 200, "::ffff:192.0.2.1", "::ffff:192.0.2.2");
    check_run(&srv, 8192, 200, "::ffff:192.0.2.2", "::ffff:192.0.2.1");
    // Both ends' own report (their snapshots go when they close): frames were dropped,
    // and the losses were repaired by retransmission (every byte was verified above).
    let (mut dropped, mut retx) = (0u64, 0u64);
    for o in [&srv, &cli] {
        let out = String::from_utf8_lossy(&o.stdout);
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("rx-drop: "))
            .unwrap_or_else(|| panic!("no rx-drop line: {}", text(o)));
        let n: Vec<u64> = line.split(' ').filter_map(|w| w.parse().ok()).collect();
        dropped += n[0];
        retx += n[1];
    }
    assert!(
        dropped > 0 && retx > 0,
        "dropped {dropped}, retransmitted {retx}"
    );
}

#[test]
#[ignore = "needs root"]
fn stat_shows_a_live_device_of_another_process() {
    let pair = VethPair::new(1500).expect("veth pair");
    let _stats = StatFiles::of(&pair);
    // A server that waits for a client forever: its device and QP stay up meanwhile.
    let ifb = pair.end(Side::B).ifname.clone();
    let mut server = netns_cmd(
        &pair,
        Side::B,
        &["rc-pingpong", "--netdev", &ifb, "-p", "18800"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    wait_listening(&pair, Side::B, 18800, &mut server);
    let mut out = String::new();
    for _ in 0..300 {
        let st = netns_cmd(&pair, Side::B, &["stat", "--netdev", &ifb])
            .output()
            .unwrap();
        out = String::from_utf8_lossy(&st.stdout).into_owned();
        if out.contains("state INIT") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = server.kill();
    let _ = server.wait();
    assert!(out.contains("(running)"), "{out}");
    // The QPN is the device's random first QPN (docs/rnic.md, QP numbers).
    assert!(
        out.lines()
            .any(|l| l.starts_with("qp ") && l.ends_with(" state INIT dest_qpn 0")),
        "{out}"
    );
    // Killed without closing: the last snapshot still says running, so stat says stale.
    let st = netns_cmd(&pair, Side::B, &["stat", "--netdev", &ifb])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&st.stdout).contains("(stale"),
        "{}",
        text(&st)
    );
    let file = pair
        .run_in(Side::B, || {
            xrnic::verbs::stat_file(std::path::Path::new("/run/xrnic"), &ifb).unwrap()
        })
        .unwrap();
    assert!(file.exists(), "{}", file.display());
    std::fs::remove_file(&file).unwrap();
    let st = netns_cmd(&pair, Side::B, &["stat", "--netdev", &ifb])
        .output()
        .unwrap();
    assert_eq!(st.status.code(), Some(1), "{}", text(&st));
    assert!(
        String::from_utf8_lossy(&st.stderr).contains("is an xrnic program running on it?"),
        "{}",
        text(&st)
    );
}

/// SIGTERM (and SIGINT) must not leave the snapshot saying running: the CLI's handler
/// removes it and exits with status 130.
#[test]
#[ignore = "needs root"]
fn sigterm_removes_the_snapshot_of_a_running_device() {
    let pair = VethPair::new(1500).expect("veth pair");
    let _stats = StatFiles::of(&pair);
    let ifb = pair.end(Side::B).ifname.clone();
    let file = pair
        .run_in(Side::B, || {
            xrnic::verbs::stat_file(std::path::Path::new("/run/xrnic"), &ifb).unwrap()
        })
        .unwrap();
    for (sig, name) in [
        (rustix::process::Signal::TERM, "SIGTERM"),
        (rustix::process::Signal::INT, "SIGINT"),
    ] {
        let mut server = netns_cmd(
            &pair,
            Side::B,
            &["rc-pingpong", "--netdev", &ifb, "-p", "18810"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        wait_listening(&pair, Side::B, 18810, &mut server);
        // The device is open before the server listens; its first snapshot is written at
        // once by the driver thread.
        for _ in 0..1000 {
            if file.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(file.exists(), "{name}: no snapshot at {}", file.display());
        // `ip netns exec` execs the command: the child is xrnic itself.
        let pid = rustix::process::Pid::from_raw(server.id() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
        let out = server.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(130), "{name}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("interrupted"),
            "{name}: {}",
            text(&out)
        );
        assert!(!file.exists(), "{name}: {} left behind", file.display());
    }
}

/// A device opened right after the process holding the interface was killed (kill -9)
/// finds the dead process's XDP program still attached (the kernel detaches it while
/// tearing the process down, some tens of ms later). Open waits for it (`XDP_DETACH_PATIENCE`). The reopen starts right after the
/// signal, without waiting for the process to be reaped: the window is open every time.
#[test]
#[ignore = "needs root"]
fn a_device_reopens_right_after_its_previous_process_is_killed() {
    let pair = VethPair::new(1500).expect("veth pair");
    let ifb = pair.end(Side::B).ifname.clone();
    for round in 0..3 {
        let port = 18830 + round;
        let mut server = netns_cmd(
            &pair,
            Side::B,
            &[
                "rc-pingpong",
                "--netdev",
                &ifb,
                "-p",
                &port.to_string(),
                "--no-stat",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        // Listening: its device (and XDP program) is up.
        wait_listening(&pair, Side::B, port, &mut server);
        server.kill().unwrap();
        let dev = pair
            .run_in(Side::B, || xrnic::verbs::Device::open(&ifb))
            .unwrap();
        let _ = server.wait();
        let dev = dev.unwrap_or_else(|e| panic!("round {round}: reopen after kill -9: {e}"));
        drop(dev);
    }
}

#[test]
#[ignore = "needs root"]
fn devinfo_on_a_veth_end() {
    let pair = VethPair::new(9000).expect("veth pair");
    let _stats = StatFiles::of(&pair);
    let ifa = pair.end(Side::A).ifname.clone();
    let o = netns_cmd(&pair, Side::A, &["devinfo", "-v", "--netdev", &ifa])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with(&format!("hca_id:\txrnic_{ifa}\n")), "{t}");
    assert!(out.contains("\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"), "{t}");
    assert!(out.contains("\t\t\tactive_mtu:\t\t4096 (5)\n"), "{t}");
    assert!(
        out.contains("\t\t\tGID[  1]:\t\t::ffff:192.0.2.1, RoCE v2\n"),
        "{t}"
    );
    assert!(out.contains("\t\t\tGID[  2]:\t\tfd00::1, RoCE v2\n"), "{t}");
    let o = netns_cmd(&pair, Side::A, &["devinfo", "--netdev", "nosuch0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("interface nosuch0"),
        "{}",
        text(&o)
    );
}

/// `XRNIC_AF_XDP_SINGLE_BUFFER=1` (the path of a kernel before 6.6, forced): devinfo
/// says the MTU is capped at 2048 and why, and rc-pingpong with 64 KiB messages at path
/// MTU 2048 passes on a 9000 veth with every byte verified.
#[test]
#[ignore = "needs root"]
fn single_buffer_env_caps_the_mtu_and_rc_pingpong_passes_at_2048() {
    let pair = VethPair::new(9000).expect("veth pair");
    let _stats = StatFiles::of(&pair);
    let env = ("XRNIC_AF_XDP_SINGLE_BUFFER", "1");
    let ifa = pair.end(Side::A).ifname.clone();
    let o = netns_cmd(&pair, Side::A, &["devinfo", "--netdev", &ifa])
        .env(env.0, env.1)
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("\t\t\tmax_mtu:\t\t2048 (4)\n"), "{t}");
    assert!(out.contains("\t\t\tactive_mtu:\t\t2048 (4)\n"), "{t}");
    assert!(
        out.contains(
            "\t\t\taf_xdp:\t\t\tsingle-buffer, frames up to 3840 bytes, max_mtu capped at 2048 \
             (asked for (XRNIC_AF_XDP_SINGLE_BUFFER=1))\n"
        ),
        "{t}"
    );
    let port = "18790";
    let side = |s: Side| pair.end(s).ifname.clone();
    let (ifa, ifb) = (side(Side::A), side(Side::B));
    let common = [
        "-m", "2048", "-s", "65536", "-n", "50", "--verify", "-p", port,
    ];
    let mut args_b = vec!["rc-pingpong", "--netdev", &ifb];
    args_b.extend_from_slice(&common);
    let mut server = netns_cmd(&pair, Side::B, &args_b)
        .env(env.0, env.1)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start server");
    wait_listening(&pair, Side::B, 18790, &mut server);
    let mut args_a = vec!["rc-pingpong", "--netdev", &ifa];
    args_a.extend_from_slice(&common);
    args_a.push("192.0.2.2");
    let client = netns_cmd(&pair, Side::A, &args_a)
        .env(env.0, env.1)
        .output()
        .expect("run client");
    let server = server.wait_with_output().expect("server output");
    check_run(&client, 65536, 50, "::ffff:192.0.2.1", "::ffff:192.0.2.2");
    check_run(&server, 65536, 50, "::ffff:192.0.2.2", "::ffff:192.0.2.1");
    // The one log line says why the port is single-buffer.
    assert!(
        String::from_utf8_lossy(&client.stderr).contains("AF_XDP single-buffer"),
        "{}",
        text(&client)
    );
}

/// xrnic needs no bpffs: nothing is pinned, and libxdp's dispatcher (which would take its
/// lock on /sys/fs/bpf) is never loaded. `ip netns exec` gives the program a fresh sysfs
/// without the bpffs mount under it; the running server's own mount table shows none,
/// and a verified rc-pingpong passes.
#[test]
#[ignore = "needs root"]
fn rc_pingpong_runs_with_no_bpffs_mounted() {
    let pair = VethPair::new(1500).expect("veth pair");
    let _stats = StatFiles::of(&pair);
    let side = |s: Side| pair.end(s).ifname.clone();
    let (ifa, ifb) = (side(Side::A), side(Side::B));
    let common = ["-s", "4096", "-n", "50", "--verify", "-p", "18790"];
    let mut args_b = vec!["rc-pingpong", "--netdev", &ifb];
    args_b.extend_from_slice(&common);
    let mut server = netns_cmd(&pair, Side::B, &args_b)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start server");
    wait_listening(&pair, Side::B, 18790, &mut server);
    // `ip netns exec` execs the program in place: the child is the xrnic server, which
    // has its XDP program attached and its socket bound by now.
    let mounts = std::fs::read_to_string(format!("/proc/{}/mountinfo", server.id()))
        .expect("the server's mount table");
    // mountinfo: "... - FSTYPE SOURCE OPTIONS" after the optional fields.
    let bpffs: Vec<&str> = mounts
        .lines()
        .filter(|l| {
            l.split(" - ")
                .nth(1)
                .and_then(|t| t.split_whitespace().next())
                == Some("bpf")
        })
        .collect();
    assert!(bpffs.is_empty(), "bpffs mounted for the server: {bpffs:?}");
    assert!(
        mounts.lines().any(|l| l.contains(" - sysfs ")),
        "not a mount table: {mounts}"
    );
    let mut args_a = vec!["rc-pingpong", "--netdev", &ifa];
    args_a.extend_from_slice(&common);
    args_a.push("192.0.2.2");
    let client = netns_cmd(&pair, Side::A, &args_a)
        .output()
        .expect("run client");
    let server = server.wait_with_output().expect("server output");
    check_run(&client, 4096, 50, "::ffff:192.0.2.1", "::ffff:192.0.2.2");
    check_run(&server, 4096, 50, "::ffff:192.0.2.2", "::ffff:192.0.2.1");
}

#[test]
#[ignore = "needs root"]
fn rc_pingpong_errors_are_clear() {
    let pair = VethPair::new(1500).expect("veth pair");
    let _stats = StatFiles::of(&pair);
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
        run(&["rc-pingpong", "--netdev", "nosuch0"]),
        1,
        "interface nosuch0",
    );
    expect(
        run(&["rc-pingpong", "--netdev", &ifb, "-m", "1500"]),
        2,
        "not an IB MTU",
    );
    expect(
        run(&["rc-pingpong", "--netdev", &ifb, "-g", "9"]),
        1,
        "can't read sgid of index 9",
    );
    expect(
        run(&[
            "rc-pingpong",
            "--netdev",
            &ifb,
            "-m",
            "4096",
            "192.0.2.1",
            "-p",
            "1",
        ]),
        1,
        "Couldn't connect to 192.0.2.1:1",
    );
    // The TCP port is taken by another program.
    let holder = pair
        .run_in(Side::B, || {
            std::net::TcpListener::bind("[::]:18900").unwrap()
        })
        .unwrap();
    expect(
        run(&["rc-pingpong", "--netdev", &ifb, "-p", "18900"]),
        1,
        "TCP port in use",
    );
    drop(holder);
    // The device is already open in another process.
    let mut first = netns_cmd(
        &pair,
        Side::B,
        &["rc-pingpong", "--netdev", &ifb, "-p", "18901"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    wait_listening(&pair, Side::B, 18901, &mut first);
    let o = run(&["rc-pingpong", "--netdev", &ifb, "-p", "18902"]);
    let _ = first.kill();
    let _ = first.wait();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!(
            "{ifb} already has an XDP program attached, still after waiting 1s for it to be \
             detached: is an xrnic device open on it"
        )),
        "{t}"
    );
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1, "{t}");
    // Not root: re-run as nobody.
    let o = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            xrnic_bin(),
        ])
        .args(["rc-pingpong", "--netdev", "lo"])
        .output()
        .expect("setpriv");
    expect(o, 1, "needs root");
}
