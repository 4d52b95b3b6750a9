//! Debian's stock rdma-core tools, unmodified, on xrnic devices through the built
//! library, in network namespaces joined by a veth pair (root: AF_XDP and XDP).

mod common;

use common::{have, library_dir, require};
use xrnic_netns::{Side, VethPair};

fn text(o: &std::process::Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn ibv_devinfo_v_shows_an_active_roce_port_and_the_gid_table() {
    require(have("ibv_devinfo"), "ibv_devinfo (ibverbs-utils)");
    let pair = VethPair::new(1500).expect("veth pair");
    let dir = library_dir("devinfo");
    let a = pair.end(Side::A);
    let ld = format!("LD_LIBRARY_PATH={}", dir.display());
    let netdev = format!("XRNIC_NETDEV={}", a.ifname);
    let out = pair
        .exec(Side::A, &["env", &ld, &netdev, "ibv_devinfo", "-v"])
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let s = String::from_utf8_lossy(&out.stdout);
    let has = |k: &str, v: &str| {
        s.lines().any(|l| {
            let mut f = l.split_whitespace();
            f.next() == Some(k) && f.collect::<Vec<_>>().join(" ") == v
        })
    };
    assert!(has("hca_id:", &format!("xrnic_{}", a.ifname)), "{t}");
    assert!(has("state:", "PORT_ACTIVE (4)"), "{t}");
    assert!(has("link_layer:", "Ethernet"), "{t}");
    assert!(
        has("active_mtu:", "1024 (3)"),
        "MTU 1500 -> IB MTU 1024: {t}"
    );
    assert!(has("board_id:", "xrnic"), "{t}");
    assert!(has("atomic_cap:", "ATOMIC_HCA (1)"), "{t}");
    assert!(has("num_comp_vectors:", "1"), "{t}");
    // The node GUID is the MAC's EUI-64, as rxe makes it.
    let m = a.mac;
    let guid = format!(
        "{:02x}{:02x}:{:02x}ff:fe{:02x}:{:02x}{:02x}",
        m[0] ^ 2,
        m[1],
        m[2],
        m[3],
        m[4],
        m[5]
    );
    assert!(has("node_guid:", &guid), "node GUID {guid}: {t}");
    // GID 0: the link-local address from the MAC; GID 1: the IPv4 address, mapped.
    let gid0 = s.lines().find(|l| l.contains("GID[  0]:")).unwrap_or("");
    assert!(gid0.contains("fe80::") && gid0.ends_with("RoCE v2"), "{t}");
    assert!(
        s.lines()
            .any(|l| l.contains(&format!("::ffff:{}, RoCE v2", a.ipv4))),
        "{t}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
