//! A kernel before 5.18 cannot load a frags-aware XDP program: with
//! `XRNIC_XDP_FRAGS=0` the filter loads without `BPF_F_XDP_HAS_FRAGS` as it does there, the
//! port binds single-buffer, the MTU is capped at 2048 on a 9000-byte link, and a WRITE and
//! a READ of 256 KiB at path MTU 2048 carry every byte. Its own test binary: the variable is
//! process-wide. Root (`#[ignore = "needs root"]`, docs/testing.md).

mod common;

use common::rc::{Connected, remote};

use xrnic::io::afxdp::{RoceFilter, XDP_FRAGS_ENV};
use xrnic::verbs::{ConnectOpts, Device, DeviceOptions, Mtu, QpInitAttr};
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
    let c = Connected::new(&da, &db, LEN, Mtu::Mtu2048);
    // A 4096 path MTU does not fit the capped port.
    let too_big = ConnectOpts {
        path_mtu: Mtu::Mtu4096,
        ..c.opts
    };
    let qp_c = da
        .alloc_pd()
        .unwrap()
        .create_qp(&QpInitAttr::new(&c.cq_a, &c.cq_a, 4))
        .unwrap();
    assert!(
        qp_c.connect(&remote(c.qp_b.qp_num(), c.gid_b), 0x10, 1, &too_big)
            .is_err(),
        "path MTU 4096 on a port capped at 2048"
    );

    let data: Vec<u8> = (0..LEN).map(|i| (i * 13 + (i >> 10)) as u8).collect();
    c.write_then_read_back(&data);
}
