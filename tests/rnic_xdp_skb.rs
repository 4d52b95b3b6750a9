//! Generic (skb) XDP (docs/rnic.md, XDP attach modes): with `XRNIC_XDP_MODE=skb` both devices
//! attach xrnic's XDP program in generic mode and bind their AF_XDP sockets in copy mode,
//! as they do when a driver refuses native XDP (virtio_net at MTU 9000 on Linux 6.1); the
//! kernel shows the program as `xdpgeneric`, `xrnic devinfo` says the mode, and a WRITE and
//! a READ of 256 KiB carry every byte. Without the variable (auto), a driver with no native
//! XDP (a bridge) gets generic mode; `native` refuses it. Its own test binary: the
//! variable is process-wide.
//! Root (`#[ignore = "needs root"]`, docs/testing.md).

mod common;

use common::rc::Connected;

use xrnic::verbs::{Device, DeviceOptions, Mtu};
use xrnic_netns::{Side, VethPair};

const LEN: usize = 256 * 1024;

#[test]
#[ignore = "needs root"]
fn skb_mode_attaches_generic_xdp_and_carries_a_verified_transfer() {
    use xrnic::io::afxdp::{RoceFilter, XDP_MODE_ENV, XdpMode, sys};
    let pair = VethPair::new(1500).expect("veth pair");
    // A driver without native XDP (a bridge has no ndo_bpf): auto falls back to generic,
    // native refuses with the mode's name and the way out.
    let out = pair
        .exec(
            Side::A,
            &["ip", "link", "add", "xdpbr0", "up", "type", "bridge"],
        )
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (auto, native) = pair
        .run_in(Side::A, || {
            let idx = sys::ifindex("xdpbr0").unwrap();
            let mut f = RoceFilter::load().unwrap();
            let auto = f.attach(idx, "xdpbr0").unwrap();
            drop(f);
            // SAFETY: this binary's only test; no other thread reads the environment
            // while it is written (here and below).
            unsafe { std::env::set_var(XDP_MODE_ENV, "native") };
            let mut f = RoceFilter::load().unwrap();
            let native = f.attach(idx, "xdpbr0").map_err(|e| e.to_string());
            (auto, native)
        })
        .unwrap();
    assert_eq!(auto, XdpMode::Skb);
    let e = native.expect_err("native XDP on a bridge");
    assert!(
        e.contains("native XDP") && e.contains("XRNIC_XDP_MODE=skb"),
        "{e}"
    );

    // SAFETY: as above.
    unsafe { std::env::set_var(XDP_MODE_ENV, "skb") };
    let open = |side: Side| {
        pair.run_in(side, || {
            Device::open_with(&pair.end(side).ifname, &DeviceOptions::default())
        })
        .expect("enter netns")
        .unwrap_or_else(|e| panic!("open side {side:?}: {e}"))
    };
    let (da, db) = (open(Side::A), open(Side::B));
    for side in [Side::A, Side::B] {
        let ifname = &pair.end(side).ifname;
        let out = pair
            .exec(side, &["ip", "-d", "link", "show", "dev", ifname])
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("xdpgeneric"), "side {side:?}: {text}");
        let out = common::netns_cmd(&pair, side, &["devinfo", "--netdev", ifname])
            .env(xrnic::io::afxdp::XDP_MODE_ENV, "skb")
            .output()
            .unwrap();
        let text = common::text(&out);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("xdp_mode:\t\tskb"), "{text}");
    }

    let c = Connected::new(&da, &db, LEN, Mtu::Mtu1024);
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + (i >> 9)) as u8).collect();
    c.write_then_read_back(&data);
}
