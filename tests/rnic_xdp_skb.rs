//! Generic (skb) XDP (issue 15, XDP attach modes): with `XRNIC_XDP_MODE=skb` both devices
//! attach xrnic's XDP program in generic mode and bind their AF_XDP sockets in copy mode,
//! as they do when a driver refuses native XDP (virtio_net at MTU 9000 on Linux 6.1); the
//! kernel shows the program as `xdpgeneric`, `xrnic devinfo` says the mode, and a WRITE and
//! a READ of 256 KiB carry every byte. Without the variable (auto), a driver with no native
//! XDP (a bridge) gets generic mode; `native` refuses it. Its own test binary: the
//! variable is process-wide.
//! Root (`#[ignore = "needs root"]`, docs/testing.md).

mod common;

use std::time::Duration;

use xrnic::verbs::{
    Access, ConnectOpts, Device, DeviceOptions, Mtu, QpInitAttr, Remote, SendWr, WcStatus, WrOpcode,
};
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

    let mk = |d: &Device| {
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(256).unwrap();
        let mr = pd.reg_mr(LEN, Access::ALL).unwrap();
        let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 64)).unwrap();
        (cq, mr, qp)
    };
    let (cq_a, mr_a, qp_a) = mk(&da);
    let (_cq_b, mr_b, qp_b) = mk(&db);
    let o = ConnectOpts {
        access: Access::ALL,
        path_mtu: Mtu::Mtu1024,
        ..ConnectOpts::default()
    };
    let (ga, gb) = (da.query_gid(1).unwrap(), db.query_gid(1).unwrap());
    let remote = |qpn, gid| Remote {
        qpn,
        psn: 0x10,
        gid,
    };
    qp_a.connect(&remote(qp_b.qp_num(), gb), 0x10, 1, &o)
        .unwrap();
    qp_b.connect(&remote(qp_a.qp_num(), ga), 0x10, 1, &o)
        .unwrap();

    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + (i >> 9)) as u8).collect();
    mr_a.write(0, &data).unwrap();
    let mut wr = SendWr::new(1, WrOpcode::RdmaWrite);
    wr.sg_list = vec![mr_a.sge(0, LEN as u32)];
    wr.rdma.remote_addr = mr_b.addr();
    wr.rdma.rkey = mr_b.rkey();
    qp_a.post_send(wr).unwrap();
    let mut rd = SendWr::new(2, WrOpcode::RdmaRead);
    rd.sg_list = vec![mr_a.sge(0, LEN as u32)];
    rd.rdma.remote_addr = mr_b.addr();
    rd.rdma.rkey = mr_b.rkey();
    // The READ overwrites A's source with what B holds: clear it first, after the WRITE.
    let wcs = cq_a.wait(1, Duration::from_secs(20));
    assert_eq!(wcs.len(), 1, "WRITE completion");
    assert_eq!(wcs[0].status, WcStatus::Success, "{wcs:?}");
    mr_a.with_mut(|m| m.fill(0)).unwrap();
    qp_a.post_send(rd).unwrap();
    let wcs = cq_a.wait(1, Duration::from_secs(20));
    assert_eq!(wcs.len(), 1, "READ completion");
    assert_eq!(wcs[0].status, WcStatus::Success, "{wcs:?}");
    let mut back = vec![0u8; LEN];
    mr_a.read(0, &mut back).unwrap();
    assert!(
        back == data,
        "the READ brought back other bytes than the WRITE put"
    );
    let mut at_b = vec![0u8; LEN];
    mr_b.read(0, &mut at_b).unwrap();
    assert!(at_b == data, "B's region differs from what A wrote");
}
