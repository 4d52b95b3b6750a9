//! The veth test harness and the link/neighbour helpers: names are unique, the MTU and
//! addresses are as asked, the kernel's neighbour table is read back, and everything is
//! removed on drop, also when the owner panics. The root tests are `#[ignore = "needs root"]`
//! (docs/testing.md).

mod common;

use std::net::IpAddr;
use std::process::Command;

use xrnic::io::afxdp::{Error, PortOptions, XskPort};
use xrnic::io::link;
use xrnic_netns::{Side, VethPair};

fn netns_exists(name: &str) -> bool {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name))
}

#[test]
#[ignore = "needs root"]
fn pair_has_the_mtu_and_addresses_asked_for() {
    for mtu in [1500, 9000] {
        let pair = VethPair::new(mtu).unwrap();
        for (side, v4, v6) in [
            (Side::A, "192.0.2.1", "fd00::1"),
            (Side::B, "192.0.2.2", "fd00::2"),
        ] {
            let end = pair.end(side);
            let info = link::link_info(Some(&end.netns), &end.ifname).unwrap();
            assert_eq!(info.mtu, mtu);
            assert_eq!(info.mac, end.mac);
            assert_ne!(info.mac, [0; 6]);
            let addrs: Vec<String> = info.addrs.iter().map(|(a, p)| format!("{a}/{p}")).collect();
            assert!(addrs.contains(&format!("{v4}/24")), "{addrs:?}");
            assert!(addrs.contains(&format!("{v6}/64")), "{addrs:?}");
        }
    }
}

#[test]
#[ignore = "needs root"]
fn two_pairs_do_not_collide() {
    let p1 = VethPair::new(1500).unwrap();
    let p2 = VethPair::new(1500).unwrap();
    assert_ne!(p1.end(Side::A).netns, p2.end(Side::A).netns);
    assert_ne!(p1.end(Side::A).ifname, p2.end(Side::A).ifname);
}

#[test]
#[ignore = "needs root"]
fn everything_is_removed_on_drop_and_on_panic() {
    let pair = VethPair::new(1500).unwrap();
    let names = [
        pair.end(Side::A).netns.clone(),
        pair.end(Side::B).netns.clone(),
    ];
    assert!(names.iter().all(|n| netns_exists(n)));
    drop(pair);
    assert!(!names.iter().any(|n| netns_exists(n)));

    let caught = std::panic::catch_unwind(|| {
        let pair = VethPair::new(1500).unwrap();
        let names = [
            pair.end(Side::A).netns.clone(),
            pair.end(Side::B).netns.clone(),
        ];
        // Panic inside the namespace thread; it must reach us and still clean up.
        pair.run_in(Side::A, || panic!("deliberate panic in {}", names[0]))
            .unwrap();
    });
    let msg = caught.expect_err("the panic propagates");
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    let ns = msg.trim_start_matches("deliberate panic in ").to_string();
    assert!(ns.starts_with("xrnic-"), "{msg}");
    assert!(!netns_exists(&ns), "{ns} left behind");
    assert!(!netns_exists(&ns.replace("-a", "-b")), "peer left behind");
}

#[test]
#[ignore = "needs root"]
fn neighbour_table_is_read_after_ping() {
    let pair = VethPair::new(1500).unwrap();
    let a = pair.end(Side::A).clone();
    let b_mac = pair.end(Side::B).mac;
    let v4: IpAddr = "192.0.2.2".parse().unwrap();
    let v6: IpAddr = "fd00::2".parse().unwrap();
    assert_eq!(
        link::neighbour(Some(&a.netns), &a.ifname, v4).unwrap(),
        None
    );
    for t in ["192.0.2.2", "fd00::2"] {
        let out = pair
            .exec(Side::A, &["ping", "-c", "1", "-W", "2", t])
            .unwrap();
        assert!(out.status.success(), "ping {t}");
    }
    assert_eq!(
        link::neighbour(Some(&a.netns), &a.ifname, v4).unwrap(),
        Some(b_mac)
    );
    assert_eq!(
        link::neighbour(Some(&a.netns), &a.ifname, v6).unwrap(),
        Some(b_mac)
    );
    assert!(link::link_info(Some(&a.netns), "nonexistent0").is_err());
}

/// A missing neighbour is resolved the way the kernel does it for rxe: the kernel
/// accepts `RTM_NEWNEIGH` + `NTF_USE` (no fallback taken) and the entry it resolves
/// arrives as a netlink notification, for IPv4 (ARP) and IPv6 (ND).
#[test]
#[ignore = "needs root"]
fn the_kernel_resolves_a_neighbour_asked_for_over_netlink() {
    let pair = VethPair::new(1500).unwrap();
    let a = pair.end(Side::A).clone();
    let b_mac = pair.end(Side::B).mac;
    for dst in ["192.0.2.2", "fd00::2"] {
        let dst: IpAddr = dst.parse().unwrap();
        let mac = pair
            .run_in(Side::A, || {
                let idx = link::link_info(None, &a.ifname).unwrap().ifindex;
                assert_eq!(link::neighbour(None, &a.ifname, dst).unwrap(), None);
                link::request_resolution(idx, dst).expect("RTM_NEWNEIGH NTF_USE accepted");
                link::resolve_neighbour(&a.ifname, idx, dst, link::RESOLVE_TIMEOUT)
            })
            .unwrap()
            .unwrap_or_else(|e| panic!("{dst}: {e}"));
        assert_eq!(mac, b_mac, "{dst}");
    }
    // Nobody has this address: a bounded, clear error.
    let nobody: IpAddr = "192.0.2.77".parse().unwrap();
    let e = pair
        .run_in(Side::A, || {
            let idx = link::link_info(None, &a.ifname).unwrap().ifindex;
            link::resolve_neighbour(&a.ifname, idx, nobody, link::RESOLVE_TIMEOUT)
        })
        .unwrap()
        .unwrap_err();
    assert!(
        e.to_string().contains("no neighbour entry for 192.0.2.77"),
        "{e}"
    );
}

#[test]
#[ignore = "needs root"]
fn a_second_port_on_the_same_interface_is_refused_clearly() {
    let pair = VethPair::new(1500).unwrap();
    let ifname = pair.end(Side::A).ifname.clone();
    let (first, second) = pair
        .run_in(Side::A, || {
            let first = XskPort::open(&ifname, 0, PortOptions::default());
            let second = XskPort::open(&ifname, 0, PortOptions::default());
            (first, second)
        })
        .unwrap();
    assert!(first.is_ok(), "{:?}", first.err());
    match second {
        Err(e @ Error::AttachRefused { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&ifname), "{msg}");
        }
        other => panic!("expected AttachRefused, got {other:?}"),
    }
    // With the first gone, the interface is free again.
    drop(first);
    let third = pair
        .run_in(Side::A, || {
            XskPort::open(&ifname, 0, PortOptions::default())
        })
        .unwrap();
    assert!(third.is_ok(), "{:?}", third.err());
}

/// An observed pair: the ends reach each other through the bridge, a capture on the
/// observer port sees the traffic of both directions, and all three namespaces go on drop.
#[test]
#[ignore = "needs root"]
fn observed_pair_is_seen_in_the_middle_and_removed_on_drop() {
    let pair = VethPair::observed(9000).unwrap();
    let names = pair.netns_names();
    assert_eq!(names.len(), 3);
    assert!(names.iter().all(|n| netns_exists(n)), "{names:?}");
    let (mid_ns, port) = pair.observer().unwrap();
    assert_eq!(mid_ns, names[2]);
    // The middle namespace holds no address: the ends are neighbours on one segment.
    let b = pair.end(Side::B);
    let ping = pair
        .exec(
            Side::A,
            &[
                "ping",
                "-c",
                "1",
                "-W",
                "5",
                "-s",
                "8000",
                &b.ipv4.to_string(),
            ],
        )
        .unwrap();
    assert!(ping.status.success(), "{ping:?}");
    // Both directions cross the observer port: its rx and tx byte counters both grew by
    // at least the 8000-byte echo request and reply.
    let stats = |dir: &str| -> u64 {
        let p = format!("/sys/class/net/{port}/statistics/{dir}_bytes");
        let out = Command::new("ip")
            .args(["netns", "exec", mid_ns, "cat", &p])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    assert!(stats("rx") >= 8000 && stats("tx") >= 8000);
    drop(pair);
    assert!(!names.iter().any(|n| netns_exists(n)), "{names:?}");
}
