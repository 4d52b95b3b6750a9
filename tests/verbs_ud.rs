//! UD through the verbs API: address handles, UD QPs and QP1 on the in-process simulated
//! link, and two xrnic devices on a veth pair (AF_XDP, root) exchanging datagrams both
//! ways over IPv4 and IPv6 GIDs, each checked byte for byte with the GRH in front.
//! The root tests are `#[ignore = "needs root"]` (docs/testing.md).

use std::time::Duration;

use xrnic::verbs::{
    Access, AddressVector, Cq, Device, DeviceOptions, GRH_LEN, GSI_QKEY, GSI_QPN, Mr, Qp,
    QpInitAttr, QpState, RecvWr, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use xrnic_netns::{Side, VethPair};

/// A guard against hanging, not a performance threshold.
const PATIENCE: Duration = Duration::from_secs(10);
const QKEY: u32 = 0x0bad_cafe;
const SLOT: usize = 8192;

struct End {
    dev: Device,
    pd: xrnic::verbs::Pd,
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn end(dev: Device) -> End {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256).unwrap();
    let mr = pd.reg_mr(64 * SLOT, Access::LOCAL_WRITE).unwrap();
    let qp = pd.create_ud_qp(&QpInitAttr::new(&cq, &cq, 64)).unwrap();
    qp.ud_ready(QKEY, 0x42).unwrap();
    End {
        dev,
        pd,
        cq,
        mr,
        qp,
    }
}

fn wait_n(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut rounds = 0;
    while out.len() < n {
        if cq.wait_into(n - out.len(), Duration::from_millis(100), &mut out) == 0 {
            rounds += 1;
            assert!(
                Duration::from_millis(100) * rounds < PATIENCE,
                "only {} of {n} completions: {out:?}",
                out.len()
            );
        }
    }
    out
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed as usize * 131 + i * 7 + (i >> 8)) as u8)
        .collect()
}

/// `from` sends `count` datagrams of `len` bytes to `to` over GID `gid_index`; each
/// arrives whole with a GRH naming both addresses.
fn one_way(from: &End, to: &End, gid_index: u8, len: usize, count: u32) {
    let dgid = to.dev.query_gid(gid_index.into()).unwrap();
    let sgid = from.dev.query_gid(gid_index.into()).unwrap();
    let ah = from
        .pd
        .create_ah(&AddressVector {
            dgid,
            sgid_index: gid_index,
            ..AddressVector::default()
        })
        .unwrap();
    assert_ne!(ah.attr().dmac, [0; 6], "MAC resolved");
    for i in 0..count {
        to.qp
            .post_recv(RecvWr {
                wr_id: u64::from(i),
                sg_list: vec![to.mr.sge(i as usize * SLOT, SLOT as u32)],
            })
            .unwrap();
    }
    for i in 0..count {
        from.mr
            .write(i as usize * SLOT, &pattern(i + gid_index as u32, len))
            .unwrap();
        let mut wr = SendWr::new(u64::from(i), WrOpcode::SendWithImm);
        wr.imm_data = 0x1000 + i;
        wr.sg_list = vec![from.mr.sge(i as usize * SLOT, len as u32)];
        from.qp.post_send_ud(wr, &ah, to.qp.qp_num(), QKEY).unwrap();
    }
    let sent = wait_n(&from.cq, count as usize);
    assert!(
        sent.iter().all(|w| w.status == WcStatus::Success),
        "{sent:?}"
    );
    let got = wait_n(&to.cq, count as usize);
    let v4 = gid_index == 1;
    for w in got {
        assert_eq!(
            (w.status, w.opcode),
            (WcStatus::Success, WcOpcode::Recv),
            "{w:?}"
        );
        assert!(w.grh);
        assert_eq!(w.src_qp, from.qp.qp_num());
        assert_eq!(w.byte_len as usize, GRH_LEN + len);
        let i = w.wr_id as u32;
        assert_eq!(w.imm_data, Some(0x1000 + i));
        let mut buf = vec![0u8; GRH_LEN + len];
        to.mr.read(i as usize * SLOT, &mut buf).unwrap();
        let grh = &buf[..GRH_LEN];
        if v4 {
            // 20 zero bytes, then the IPv4 header: version 4, IHL 5, UDP, the addresses.
            assert_eq!(grh[..20], [0u8; 20]);
            assert_eq!(grh[20], 0x45);
            assert_eq!(grh[29], 17);
            assert_eq!(grh[32..36], sgid[12..]);
            assert_eq!(grh[36..40], dgid[12..]);
            assert_eq!(
                u16::from_be_bytes([grh[22], grh[23]]) as usize,
                20 + 8 + 12 + 8 + 4 + len + (4 - len % 4) % 4 + 4,
                "IPv4 total length: IP, UDP, BTH, DETH, ImmDt, payload, pad, ICRC"
            );
        } else {
            assert_eq!(grh[0] >> 4, 6);
            assert_eq!(grh[6], 17);
            assert_eq!(grh[8..24], sgid);
            assert_eq!(grh[24..40], dgid);
        }
        assert_eq!(buf[GRH_LEN..], pattern(i + gid_index as u32, len)[..]);
    }
}

fn both_ways(da: Device, db: Device) {
    let a = end(da);
    let b = end(db);
    for gid_index in [1u8, 2] {
        one_way(&a, &b, gid_index, 1000, 8);
        one_way(&b, &a, gid_index, 1000, 8);
    }
    assert_eq!(a.qp.ud_counters().unwrap().datagrams_received, 16);
    assert_eq!(b.qp.ud_counters().unwrap().datagrams_sent, 16);
    assert_eq!(a.qp.ud_counters().unwrap().bad_qkey_dropped, 0);
}

#[test]
fn ud_both_ways_ipv4_and_ipv6_on_the_sim_link() {
    let (da, db) = Device::open_sim_pair().unwrap();
    both_ways(da, db);
}

#[test]
fn gsi_qp_and_pkey_table_through_the_verbs_api() {
    let (da, _db) = Device::open_sim_pair().unwrap();
    let pd = da.alloc_pd().unwrap();
    let cq = da.create_cq(16).unwrap();
    let qp1 = pd.create_gsi_qp(&QpInitAttr::new(&cq, &cq, 4)).unwrap();
    assert_eq!(qp1.qp_num(), GSI_QPN);
    qp1.ud_ready(0, 0).unwrap();
    let a = qp1.query().unwrap();
    assert_eq!((a.qp_state, a.qkey), (QpState::Rts, GSI_QKEY));
    assert_eq!(da.query_pkey(0), Some(0xffff));
    assert_eq!(da.query_pkey(1), None);
    // An RC-style post_send is refused on a UD QP, with a reason.
    assert!(qp1.post_send(SendWr::new(1, WrOpcode::Send)).is_err());
}

fn veth_pair_both_ways(mtu: u32) {
    let pair = VethPair::new(mtu).expect("veth pair");
    let open = |side| {
        pair.run_in(side, || {
            Device::open_with(&pair.end(side).ifname, &DeviceOptions::default())
        })
        .expect("enter netns")
        .unwrap_or_else(|e| panic!("open device on side {side:?}: {e}"))
    };
    let da = open(Side::A);
    let db = open(Side::B);
    both_ways(da.clone(), db.clone());
    assert_eq!(da.counters().unwrap().malformed_frames_dropped, 0);
    assert_eq!(db.counters().unwrap().malformed_frames_dropped, 0);
}

#[test]
#[ignore = "needs root"]
fn ud_both_ways_ipv4_and_ipv6_on_a_veth_pair() {
    veth_pair_both_ways(1500);
}
