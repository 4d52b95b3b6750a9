//! A kernel before 5.18 cannot load a frags-aware XDP program (issue 15): with
//! `XRNIC_XDP_FRAGS=0` the filter loads without `BPF_F_XDP_HAS_FRAGS` as it does there, the
//! port binds single-buffer, the MTU is capped at 2048 on a 9000-byte link, and a WRITE and
//! a READ of 256 KiB at path MTU 2048 carry every byte. Its own test binary: the variable is
//! process-wide. Root (`#[ignore = "needs root"]`, docs/testing.md).

mod common;

use std::time::Duration;

use xrnic::io::afxdp::{RoceFilter, XDP_FRAGS_ENV};
use xrnic::verbs::{
    Access, ConnectOpts, Device, DeviceOptions, Mtu, QpInitAttr, Remote, SendWr, WcStatus, WrOpcode,
};
use xrnic_netns::{Side, VethPair};

const LEN: usize = 256 * 1024;

#[test]
#[ignore = "needs root"]
fn xdp_program_without_frags_means_single_buffer_and_an_mtu_cap() {
    // SAFETY: set before this binary's only test starts any thread of its own; nothing
    // else in the process reads or writes the environment concurrently.
    unsafe { std::env::set_var(XDP_FRAGS_ENV, "0") };
    assert!(!RoceFilter::load().unwrap().frags());
    let pair = VethPair::new(9000).expect("veth pair");
    let open = |side: Side| {
        pair.run_in(side, || {
            Device::open_with(&pair.end(side).ifname, &DeviceOptions::default())
        })
        .expect("enter netns")
        .unwrap_or_else(|e| panic!("open side {side:?}: {e}"))
    };
    let (da, db) = (open(Side::A), open(Side::B));
    for d in [&da, &db] {
        let p = d.query_port();
        assert_eq!(
            (p.max_mtu, p.active_mtu),
            (Mtu::Mtu2048, Mtu::Mtu2048),
            "{p:?}"
        );
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
        path_mtu: Mtu::Mtu2048,
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
    // A 4096 path MTU does not fit the capped port.
    let too_big = ConnectOpts {
        path_mtu: Mtu::Mtu4096,
        ..o
    };
    let qp_c = da
        .alloc_pd()
        .unwrap()
        .create_qp(&QpInitAttr::new(&cq_a, &cq_a, 4))
        .unwrap();
    assert!(
        qp_c.connect(&remote(qp_b.qp_num(), gb), 0x10, 1, &too_big)
            .is_err(),
        "path MTU 4096 on a port capped at 2048"
    );

    let data: Vec<u8> = (0..LEN).map(|i| (i * 13 + (i >> 10)) as u8).collect();
    mr_a.write(0, &data).unwrap();
    let mut wr = SendWr::new(1, WrOpcode::RdmaWrite);
    wr.sg_list = vec![mr_a.sge(0, LEN as u32)];
    wr.rdma.remote_addr = mr_b.addr();
    wr.rdma.rkey = mr_b.rkey();
    qp_a.post_send(wr).unwrap();
    let wcs = cq_a.wait(1, Duration::from_secs(20));
    assert_eq!(wcs.len(), 1, "WRITE completion");
    assert_eq!(wcs[0].status, WcStatus::Success, "{wcs:?}");
    mr_a.with_mut(|m| m.fill(0)).unwrap();
    let mut rd = SendWr::new(2, WrOpcode::RdmaRead);
    rd.sg_list = vec![mr_a.sge(0, LEN as u32)];
    rd.rdma.remote_addr = mr_b.addr();
    rd.rdma.rkey = mr_b.rkey();
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
}
