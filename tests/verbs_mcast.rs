//! UD multicast through the verbs API (src/verbs/mcast.rs): two xrnic devices on a veth
//! pair (AF_XDP, root); on side B two UD QPs attached to one IPv4 group and one IPv6
//! group, a third not attached; side A sends to each group through an address handle
//! whose MAC is the group's (no neighbour), each attached QP receives every datagram
//! with its bytes, the other none; the kernel holds the membership (/proc/net/igmp,
//! igmp6) exactly while a QP is attached; a detach stops delivery; a QP of the sending
//! device attached to the group gets the datagram too (loopback). Plus the verbs'
//! answers on the simulated link. Root tests are `#[ignore = "needs root"]`
//! (docs/testing.md).

use std::time::Duration;

use xrnic::verbs::{
    Access, AddressVector, Cq, Device, DeviceOptions, GRH_LEN, Gid, Mr, Qp, QpInitAttr, RecvWr,
    SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use xrnic::wire::{MULTICAST_QPN, Qpn, ipv4_gid};
use xrnic_netns::{Side, VethPair};

/// A guard against hanging, not a performance threshold.
const PATIENCE: Duration = Duration::from_secs(10);
const QKEY: u32 = 0x0123_4567;
const SLOT: usize = 4096;
const COUNT: u32 = 16;
const GROUP4: [u8; 4] = [239, 1, 2, 3];
/// ff0e::1:2 (global scope).
const GROUP6: Gid = [0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 2];

struct End {
    pd: xrnic::verbs::Pd,
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn end(dev: &Device) -> End {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(512).unwrap();
    let mr = pd
        .reg_mr(2 * COUNT as usize * SLOT, Access::LOCAL_WRITE)
        .unwrap();
    let qp = pd.create_ud_qp(&QpInitAttr::new(&cq, &cq, 128)).unwrap();
    qp.ud_ready(QKEY, 0).unwrap();
    End { pd, cq, mr, qp }
}

fn post_recvs(e: &End, n: u32) {
    for i in 0..n {
        e.qp.post_recv(RecvWr {
            wr_id: u64::from(i),
            sg_list: vec![e.mr.sge(i as usize * SLOT, SLOT as u32)],
        })
        .unwrap();
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
        .map(|i| (seed as usize * 37 + i * 11 + (i >> 7)) as u8)
        .collect()
}

/// `from` sends `n` datagrams (seeds `seed..`) to group `gid` from its GID `sgid_index`.
fn send_to_group(from: &End, gid: &Gid, sgid_index: u8, seed: u32, n: u32, len: usize) {
    let ah = from
        .pd
        .create_ah(&AddressVector {
            dgid: *gid,
            sgid_index,
            hop_limit: 64,
            ..AddressVector::default()
        })
        .unwrap();
    let mac = ah.attr().dmac;
    if gid[0] == 0xff {
        assert_eq!(mac, [0x33, 0x33, gid[12], gid[13], gid[14], gid[15]]);
    } else {
        assert_eq!(mac, [0x01, 0x00, 0x5e, gid[13] & 0x7f, gid[14], gid[15]]);
    }
    for i in 0..n {
        let at = (COUNT + i) as usize * SLOT;
        from.mr.write(at, &pattern(seed + i, len)).unwrap();
        let mut wr = SendWr::new(u64::from(seed + i), WrOpcode::SendWithImm);
        wr.imm_data = seed + i;
        wr.sg_list = vec![from.mr.sge(at, len as u32)];
        from.qp
            .post_send_ud(wr, &ah, Qpn::new(MULTICAST_QPN), QKEY)
            .unwrap();
    }
    let sent = wait_n(&from.cq, n as usize);
    assert!(
        sent.iter().all(|w| w.status == WcStatus::Success),
        "{sent:?}"
    );
}

/// `to` received `n` datagrams with seeds `seed..` from `src_qp`, each whole; reposts.
fn check_received(to: &End, src_qp: Qpn, seed: u32, n: u32, len: usize, v6: bool) {
    let mut got = wait_n(&to.cq, n as usize);
    got.sort_by_key(|w| w.imm_data);
    for (k, w) in got.iter().enumerate() {
        assert_eq!(
            (w.status, w.opcode),
            (WcStatus::Success, WcOpcode::Recv),
            "{w:?}"
        );
        assert!(w.grh);
        assert_eq!(w.src_qp, src_qp);
        assert_eq!(w.qp_num, to.qp.qp_num());
        assert_eq!(w.imm_data, Some(seed + k as u32), "every datagram, once");
        assert_eq!(w.byte_len as usize, GRH_LEN + len);
        let mut buf = vec![0u8; GRH_LEN + len];
        to.mr.read(w.wr_id as usize * SLOT, &mut buf).unwrap();
        // The GRH's destination address is the group.
        if v6 {
            assert_eq!(buf[24..40], GROUP6);
        } else {
            assert_eq!(buf[36..40], GROUP4);
        }
        assert_eq!(buf[GRH_LEN..], pattern(seed + k as u32, len)[..]);
    }
    post_recvs(to, n);
}

/// The groups the kernel holds on `ifname` of the calling thread's namespace, as
/// /proc/net/igmp and igmp6 list them (read through thread-self: a thread inside the
/// namespace sees its own).
fn kernel_groups(ifname: &str) -> (bool, bool) {
    let igmp = std::fs::read_to_string("/proc/thread-self/net/igmp").unwrap_or_default();
    // IPv4 groups are in hex, in host (little-endian) order: 239.1.2.3 is 030201EF.
    let g4 = format!(
        "{:02X}{:02X}{:02X}{:02X}",
        GROUP4[3], GROUP4[2], GROUP4[1], GROUP4[0]
    );
    let mut in_if = false;
    let mut v4 = false;
    for l in igmp.lines() {
        if !l.starts_with(char::is_whitespace) && !l.starts_with("Idx") {
            // The name is padded to 10 columns before its colon: a longer one (the
            // pair's names carry the pid) runs into it, "xr23633-0b:".
            in_if = l.split_whitespace().nth(1).map(|n| n.trim_end_matches(':')) == Some(ifname);
        } else if in_if && l.split_whitespace().next() == Some(&g4) {
            v4 = true;
        }
    }
    let igmp6 = std::fs::read_to_string("/proc/thread-self/net/igmp6").unwrap_or_default();
    let g6: String = GROUP6.iter().map(|b| format!("{b:02x}")).collect();
    let v6 = igmp6.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(1) == Some(&ifname) && f.get(2) == Some(&g6.as_str())
    });
    (v4, v6)
}

#[test]
#[ignore = "needs root"]
fn two_qps_in_a_group_each_get_every_datagram_on_a_veth_pair() {
    let pair = VethPair::new(1500).expect("veth pair");
    let open = |side| {
        pair.run_in(side, || {
            Device::open_with(&pair.end(side).ifname, &DeviceOptions::default())
        })
        .expect("enter netns")
        .unwrap_or_else(|e| panic!("open device on side {side:?}: {e}"))
    };
    let (da, db) = (open(Side::A), open(Side::B));
    let ifb = pair.end(Side::B).ifname.clone();
    let groups_b = || pair.run_in(Side::B, || kernel_groups(&ifb)).unwrap();
    let a = end(&da);
    let (b1, b2, outsider) = (end(&db), end(&db), end(&db));
    let g4 = ipv4_gid(GROUP4);
    assert_eq!(groups_b(), (false, false));
    for b in [&b1, &b2] {
        b.qp.attach_mcast(&g4, 0).unwrap();
        b.qp.attach_mcast(&GROUP6, 0).unwrap();
        post_recvs(b, COUNT);
    }
    b1.qp
        .attach_mcast(&g4, 0)
        .expect("a second attach is fine (rxe)");
    post_recvs(&outsider, COUNT);
    assert_eq!(
        groups_b(),
        (true, true),
        "B joined both groups in the kernel"
    );
    assert_eq!(db.mcast_memberships().len(), 2);

    // IPv4 (GID index 1 is the IPv4 address) and IPv6 (2).
    send_to_group(&a, &g4, 1, 100, COUNT, 1000);
    for b in [&b1, &b2] {
        check_received(b, a.qp.qp_num(), 100, COUNT, 1000, false);
    }
    send_to_group(&a, &GROUP6, 2, 200, COUNT, 777);
    for b in [&b1, &b2] {
        check_received(b, a.qp.qp_num(), 200, COUNT, 777, true);
    }
    // The third QP of B saw none of them (each frame reached B's QPs in one step).
    assert!(outsider.cq.poll(64).is_empty());
    assert_eq!(outsider.qp.ud_counters().unwrap().datagrams_received, 0);
    for b in [&b1, &b2] {
        let c = b.qp.ud_counters().unwrap();
        assert_eq!(
            (c.datagrams_received, c.bad_qkey_dropped),
            (2 * COUNT as u64, 0)
        );
    }

    // A detach stops delivery to that QP only; the last one leaves the kernel group.
    b2.qp.detach_mcast(&g4, 0).unwrap();
    assert!(b2.qp.detach_mcast(&g4, 0).is_err(), "not attached any more");
    assert_eq!(groups_b(), (true, true));
    send_to_group(&a, &g4, 1, 300, 4, 64);
    check_received(&b1, a.qp.qp_num(), 300, 4, 64, false);
    assert!(b2.cq.poll(64).is_empty());
    b1.qp.detach_mcast(&g4, 0).unwrap();
    assert_eq!(groups_b(), (false, true), "IPv4 group left, IPv6 kept");
    // Destroying the QPs leaves the IPv6 group.
    drop(b1);
    drop(b2);
    assert_eq!(groups_b(), (false, false));
    assert!(db.mcast_memberships().is_empty());

    // Loopback: a QP of the sending device attached to the group gets the datagram, as
    // on rxe where the host is a member of the group (docs/verbs-abi.md).
    let a2 = end(&da);
    a2.qp.attach_mcast(&g4, 0).unwrap();
    post_recvs(&a2, COUNT);
    send_to_group(&a, &g4, 1, 400, 4, 200);
    check_received(&a2, a.qp.qp_num(), 400, 4, 200, false);
    assert_eq!(db.counters().unwrap().malformed_frames_dropped, 0);
}

/// The answers of the verbs without a wire: UD only, multicast GIDs only, detach of a
/// pair not attached.
#[test]
fn attach_rules_on_the_sim_link() {
    let (a, _b) = Device::open_sim_pair().unwrap();
    let e = end(&a);
    let g4 = ipv4_gid(GROUP4);
    assert!(e.qp.attach_mcast(&ipv4_gid([192, 0, 2, 1]), 0).is_err());
    assert!(e.qp.detach_mcast(&g4, 0).is_err());
    e.qp.attach_mcast(&g4, 0).unwrap();
    e.qp.attach_mcast(&GROUP6, 0).unwrap();
    assert_eq!(e.qp.mcast_groups().len(), 2);
    e.qp.detach_mcast(&g4, 0).unwrap();
    assert_eq!(e.qp.mcast_groups(), vec![GROUP6]);
    let rc = e.pd.create_qp(&QpInitAttr::new(&e.cq, &e.cq, 4)).unwrap();
    assert!(
        rc.attach_mcast(&g4, 0).is_err(),
        "RC QPs do not join groups"
    );
}
