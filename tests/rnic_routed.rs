//! A peer behind a router ([`VethPair::routed`]: 192.0.2.0/26 and 192.0.2.64/26,
//! fd00::a:0/112 and fd00::b:0/112, a router namespace forwarding between them): the next
//! hop resolves to the router's MAC, and `rc-pingpong` and `perf write` with `--verify`
//! pass across it over IPv4 and IPv6 GIDs. Root tests (`#[ignore = "needs root"]`,
//! docs/testing.md).

mod common;

use std::net::IpAddr;
use std::process::{Command, Output, Stdio};

use common::{netns_cmd, text, wait_listening};
use xrnic::io::link;
use xrnic::verbs::netdev;
use xrnic_netns::{Side, VethPair};

/// `xrnic ARGS` server on B and client on A (towards B's IPv4 address, over the router);
/// (server, client).
fn run_pair(pair: &VethPair, args: &[&str], port: u16) -> (Output, Output) {
    let port_s = port.to_string();
    let side_args = |side: Side| {
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.extend(["--netdev".into(), pair.end(side).ifname.clone()]);
        v.extend(["-p".into(), port_s.clone(), "--no-stat".into()]);
        v
    };
    let b = side_args(Side::B);
    let b: Vec<&str> = b.iter().map(String::as_str).collect();
    let mut server = netns_cmd(pair, Side::B, &b)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start server");
    wait_listening(pair, Side::B, port, &mut server);
    let mut a = side_args(Side::A);
    a.push(pair.end(Side::B).ipv4.to_string());
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let client = netns_cmd(pair, Side::A, &a).output().expect("run client");
    let server = server.wait_with_output().expect("server output");
    (server, client)
}

/// A routed pair whose path works: both ends reach each other across the router, IPv4 and
/// IPv6 (pings, retried for up to ~10 s each). Under load a fresh router namespace was seen
/// to leave the first neighbour probes for its IPv6 address unanswered for over 3 s; the
/// kernel repeats a probe only every second (`retrans_time_ms`), longer than rc-pingpong's
/// whole retry budget (timeout 14, retry_cnt 7: ~0.5 s). These tests check xrnic's side of
/// routing (next hop, hop limit, traffic across), not a router's cold start.
fn routed_pair() -> VethPair {
    let pair = VethPair::routed(1500).expect("routed pair");
    let (a, b) = (pair.end(Side::A), pair.end(Side::B));
    for (from, to) in [(a, b), (b, a)] {
        for dst in [to.ipv4.to_string(), to.ipv6.to_string()] {
            let ok = (0..5).any(|_| {
                Command::new("ip")
                    .args([
                        "netns",
                        "exec",
                        &from.netns,
                        "ping",
                        "-c",
                        "1",
                        "-W",
                        "2",
                        &dst,
                    ])
                    .output()
                    .is_ok_and(|o| o.status.success())
            });
            assert!(ok, "{} cannot ping {dst} across the router", from.netns);
        }
    }
    pair
}

#[test]
#[ignore = "needs root"]
fn the_next_hop_of_a_routed_peer_is_the_router() {
    let pair = routed_pair();
    let (router_ns, router_if) = pair.observer().expect("router namespace");
    let router_mac = link::mac_of(router_ns, router_if).unwrap();
    let a = pair.end(Side::A).clone();
    let b = pair.end(Side::B).clone();
    for (src, dst) in [
        (IpAddr::V4(a.ipv4), IpAddr::V4(b.ipv4)),
        (IpAddr::V6(a.ipv6), IpAddr::V6(b.ipv6)),
    ] {
        let (mac, hop_limit) = pair
            .run_in(Side::A, || {
                let l = link::link_info(None, &a.ifname).unwrap();
                let route = link::route_to(dst, Some(src), Some(l.ifindex)).unwrap();
                assert_eq!(route.oif, l.ifindex, "{route:?}");
                assert!(route.gateway.is_some(), "{dst}: {route:?}");
                netdev::resolve_path(&a.ifname, l.ifindex, Some(src), dst).unwrap()
            })
            .unwrap();
        assert_eq!(mac, router_mac, "{dst}");
        assert_ne!(mac, b.mac, "{dst}");
        // No hop-limit metric on the default route: the namespace's default applies.
        assert_eq!(hop_limit, None, "{dst}");
    }
}

#[test]
#[ignore = "needs root"]
fn rc_pingpong_across_a_router_ipv4_and_ipv6() {
    let pair = routed_pair();
    for (port, (gid, local, remote)) in (18915..).zip([
        ("1", "::ffff:192.0.2.1", "::ffff:192.0.2.65"),
        ("2", "fd00::a:1", "fd00::b:1"),
    ]) {
        let args = [
            "rc-pingpong",
            "-g",
            gid,
            "-s",
            "4096",
            "-n",
            "100",
            "--verify",
        ];
        let (srv, cli) = run_pair(&pair, &args, port);
        for (o, me, peer) in [(&cli, local, remote), (&srv, remote, local)] {
            let t = text(o);
            assert!(o.status.success(), "{t}");
            let out = String::from_utf8_lossy(&o.stdout);
            let lines: Vec<&str> = out.lines().collect();
            assert!(lines[0].ends_with(&format!("GID {me}")), "{t}");
            assert!(lines[1].ends_with(&format!("GID {peer}")), "{t}");
            assert!(
                out.contains("verify: 100 messages received, every byte as sent"),
                "{t}"
            );
        }
    }
}

#[test]
#[ignore = "needs root"]
fn perf_write_across_a_router_ipv4_and_ipv6() {
    let pair = routed_pair();
    for (port, gid) in (19915..).zip(["1", "2"]) {
        let args = ["perf", "write", "-x", gid, "-n", "50", "--verify"];
        let (srv, cli) = run_pair(&pair, &args, port);
        for o in [&srv, &cli] {
            let t = format!(
                "{}\n--- server:\n{}\n--- client:\n{}",
                text(o),
                text(&srv),
                text(&cli)
            );
            assert!(o.status.success(), "{t}");
            assert!(
                String::from_utf8_lossy(&o.stdout).contains("\nverify: every byte as expected\n"),
                "{t}"
            );
        }
    }
}
