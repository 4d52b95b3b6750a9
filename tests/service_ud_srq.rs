//! UD, address handles, UC and SRQs through the device service (`xrnic up IF`): stock
//! ibverbs-utils and perftest tools as nobody through `xrnic exec`, server and client on
//! one device; the Rust API for the UD completion fields, the isolation of two clients'
//! AHs and SRQs, and a dead client's AHs and SRQs freed (docs/rnic.md "One device, many
//! processes"). Root tests (`#[ignore = "needs root"]`, docs/testing.md); the library
//! must be built (`cargo build --workspace`).

mod common;
mod service_support;

use std::time::Duration;

use common::text;
use service_support::{Svc, out};

#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn stock_ud_uc_and_srq_pingpongs_as_nobody_through_the_service() {
    let s = Svc::start();
    let (_, c) = s.pair_run(
        "ibv_ud_pingpong",
        &["-g", "1", "-n", "200", "-s", "1024"],
        18560,
    );
    assert!(out(&c).contains("200 iters in"), "{}", text(&c));
    let (_, c) = s.pair_run(
        "ibv_uc_pingpong",
        &["-g", "1", "-n", "200", "-s", "4096"],
        18561,
    );
    assert!(out(&c).contains("200 iters in"), "{}", text(&c));
    let (sv, c) = s.pair_run(
        "ibv_srq_pingpong",
        &["-g", "1", "-n", "200", "-q", "4"],
        18562,
    );
    assert!(out(&c).contains("200 iters in"), "{}", text(&c));
    assert!(out(&sv).contains("200 iters in"), "{}", text(&sv));
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
#[cfg_attr(not(xrnic_no_perftest), ignore = "needs root")]
#[cfg_attr(xrnic_no_perftest, ignore = "needs root and perftest")]
fn stock_send_bw_over_ud_as_nobody_through_the_service() {
    let s = Svc::start();
    let (_, c) = s.pair_run(
        "ib_send_bw",
        &["-c", "UD", "-x", "1", "-n", "300", "-s", "1024"],
        18565,
    );
    assert!(out(&c).contains("1024       300"), "{}", text(&c));
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Two clients of the service (two devices opened by this process in A, both going
/// through the service), a UD QP each: A sends datagrams to B over the IPv4 and the
/// IPv6 GID of the device (loopback in the service's driver). B's completions carry
/// what an in-process device gives (tests/verbs_ud.rs): the GRH flag and the 40-byte
/// GRH in front of the payload naming both addresses, src_qp, the immediate, and sl
/// 0xa (IPv4) / 0x9 (IPv6) as ConnectX reports RoCE v2 (src/proto/cq.rs `roce_v2_sl`).
/// A datagram with the wrong Q_Key is dropped (IBTA §10.2.5; the first receive takes
/// the next one); a Q_Key with the high bit set sends the QP's own (§10.2.5.1).
#[test]
#[ignore = "needs root"]
fn ud_completions_through_the_service_carry_src_qp_grh_and_sl() {
    use xrnic::verbs::{
        Access, AddressVector, Device, GRH_LEN, QpInitAttr, RecvWr, SendWr, WcOpcode, WcStatus,
        WrOpcode,
    };
    use xrnic_netns::Side;
    const QKEY: u32 = 0x1122_3344;
    let s = Svc::start();
    let ifname = s.ifname().to_string();
    s.pair
        .run_in(Side::A, || {
            let (da, db) = (
                Device::open(&ifname).unwrap(),
                Device::open(&ifname).unwrap(),
            );
            assert!(da.service_pid().is_some() && db.service_pid().is_some());
            let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
            let (ca, cb) = (da.create_cq(64).unwrap(), db.create_cq(64).unwrap());
            let ma = pa.reg_mr(1 << 16, Access::LOCAL_WRITE).unwrap();
            let mb = pb.reg_mr(1 << 16, Access::LOCAL_WRITE).unwrap();
            let qa = pa.create_ud_qp(&QpInitAttr::new(&ca, &ca, 16)).unwrap();
            let qb = pb.create_ud_qp(&QpInitAttr::new(&cb, &cb, 16)).unwrap();
            assert_eq!(qa.qp_type(), xrnic::verbs::QpType::Ud);
            qa.ud_ready(QKEY, 1).unwrap();
            qb.ud_ready(QKEY, 2).unwrap();
            let q = qb.query().unwrap();
            assert_eq!((q.qkey, q.port_num, q.pkey_index), (QKEY, 1, 0));
            // A UD QP sends only with an AH: refused at once, as in-process.
            assert!(qa.post_send(SendWr::new(0, WrOpcode::Send)).is_err());
            // The GSI QP stays the service's own.
            assert!(pa.create_gsi_qp(&QpInitAttr::new(&ca, &ca, 4)).is_err());
            let gids: Vec<(u8, bool)> = (0..da.gid_table().len() as u8)
                .filter_map(|i| {
                    let g = da.query_gid(i.into())?;
                    let v4 = g[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
                    (v4 || g[0] == 0xfd).then_some((i, !v4))
                })
                .collect();
            assert!(
                gids.iter().any(|g| !g.1) && gids.iter().any(|g| g.1),
                "{gids:?}"
            );
            let wait = |cq: &xrnic::verbs::Cq| {
                let w = cq.wait(1, Duration::from_secs(10));
                assert_eq!(w.len(), 1, "a completion");
                w[0]
            };
            for (round, &(gi, v6)) in gids.iter().enumerate() {
                let g = da.query_gid(gi.into()).unwrap();
                let ah = pa
                    .create_ah(&AddressVector {
                        dgid: g,
                        sgid_index: gi,
                        ..AddressVector::default()
                    })
                    .unwrap();
                assert_ne!(ah.attr().dmac, [0; 6], "the service resolved the MAC");
                let len = 100 + round;
                qb.post_recv(RecvWr {
                    wr_id: 7,
                    sg_list: vec![mb.sge(0, 4096)],
                })
                .unwrap();
                // The wrong Q_Key first: dropped at B.
                let send = |id: u64, qkey: u32| {
                    ma.write(0, &vec![id as u8; len]).unwrap();
                    let mut wr = SendWr::new(id, WrOpcode::SendWithImm);
                    wr.imm_data = 0xab00 + id as u32;
                    wr.send_flags = xrnic::verbs::SendFlags::SIGNALED;
                    wr.sg_list = vec![ma.sge(0, len as u32)];
                    qa.post_send_ud(wr, &ah, qb.qp_num(), qkey).unwrap();
                    let w = wait(&ca);
                    assert_eq!((w.wr_id, w.status), (id, WcStatus::Success), "{w:?}");
                };
                send(1, QKEY ^ 1);
                // High bit: the QP's own Q_Key (QKEY), which B takes.
                send(2, 0x8000_0000);
                let w = wait(&cb);
                assert_eq!((w.status, w.opcode), (WcStatus::Success, WcOpcode::Recv));
                assert_eq!(w.wr_id, 7);
                assert_eq!(w.imm_data, Some(0xab02), "the second datagram: {w:?}");
                assert!(w.grh);
                assert_eq!(w.src_qp, qa.qp_num());
                assert_eq!(w.qp_num, qb.qp_num());
                assert_eq!(w.byte_len as usize, GRH_LEN + len);
                assert_eq!(w.sl, xrnic::proto::cq::roce_v2_sl(v6));
                assert_eq!(w.sl, if v6 { 0x9 } else { 0xa });
                let mut buf = vec![0u8; GRH_LEN + len];
                mb.read(0, &mut buf).unwrap();
                let grh = &buf[..GRH_LEN];
                if v6 {
                    assert_eq!(grh[0] >> 4, 6);
                    assert_eq!(grh[6], 17, "UDP");
                    assert_eq!(grh[8..24], g);
                    assert_eq!(grh[24..40], g);
                } else {
                    assert_eq!(grh[..20], [0u8; 20]);
                    assert_eq!(grh[20], 0x45);
                    assert_eq!(grh[29], 17, "UDP");
                    assert_eq!(grh[32..36], g[12..]);
                    assert_eq!(grh[36..40], g[12..]);
                }
                assert_eq!(buf[GRH_LEN..], vec![2u8; len][..]);
            }
        })
        .unwrap();
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `kill -9` of clients that hold AHs and SRQs: stock ibv_srq_pingpong's server (its
/// SRQ made, waiting for its client on TCP) and ibv_ud_pingpong's client mid-run (its
/// AH made once it knows the server). The service frees both clients' objects when the
/// kernel closes their sockets, and goes on serving UD.
#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn kill_9_of_clients_frees_their_ahs_and_srqs() {
    use std::process::Command;
    use std::time::Instant;
    let s = Svc::start();
    let srq_server = s
        .tool(&[
            "ibv_srq_pingpong",
            "-g",
            "1",
            "-n",
            "100000000",
            "-p",
            "18570",
        ])
        .spawn()
        .unwrap();
    let mut srq_server = service_support::Kid(Some(srq_server));
    let (ud_server, mut ud_client) = s.pair_spawn(
        "ibv_ud_pingpong",
        &["-g", "1", "-n", "100000000", "-s", "512"],
        18571,
    );
    // The pids (the tools, not timeout(1)) holding an SRQ and an AH.
    let holders = |kind: &str, comm: &str| -> Vec<i64> {
        s.res()
            .iter()
            .filter(|o| o["kind"] == kind && o["comm"] == comm)
            .map(|o| o["pid"].as_i64().unwrap())
            .collect()
    };
    let end = Instant::now() + Duration::from_secs(60);
    let (srq_pid, ud_pids) = loop {
        let (a, b) = (
            holders("srq", "ibv_srq_pingpon"),
            holders("ah", "ibv_ud_pingpong"),
        );
        if a.len() == 1 && b.len() == 2 {
            break (a[0], b);
        }
        assert!(Instant::now() < end, "no SRQ and AHs: {:?}", s.res());
        std::thread::sleep(Duration::from_millis(50));
    };
    // The client of the UD pair: the later pid of the two.
    let ud_pid = *ud_pids.iter().max().unwrap();
    for pid in [srq_pid, ud_pid] {
        let st = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }
    let of = |pid: i64| -> Vec<serde_json::Value> {
        s.res().into_iter().filter(|o| o["pid"] == pid).collect()
    };
    let end = Instant::now() + Duration::from_secs(5);
    while !(of(srq_pid).is_empty() && of(ud_pid).is_empty()) {
        assert!(
            Instant::now() < end,
            "the killed clients' objects are still there: {:?}",
            s.res()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = srq_server.child().wait();
    let _ = ud_client.child().wait();
    drop(ud_server);
    let left = s.wait_empty(Duration::from_secs(2));
    assert!(left.is_empty(), "left behind: {left:?}");
    // The service goes on serving UD.
    let (_, c) = s.pair_run(
        "ibv_ud_pingpong",
        &["-g", "1", "-n", "50", "-s", "512"],
        18572,
    );
    assert!(out(&c).contains("50 iters in"), "{}", text(&c));
}

/// Across the veth pair: stock ibv_ud_pingpong, ibv_uc_pingpong and ibv_srq_pingpong,
/// each server as nobody through A's service, each client as root on B with its own
/// in-process device (the datagrams and UC messages, their GRH and Q_Key, go over the
/// wire both ways).
#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn stock_ud_uc_srq_pingpongs_across_the_veth_pair_service_to_in_process_device() {
    use std::process::{Command, Stdio};
    use xrnic_netns::Side;
    let s = Svc::start();
    let a_ip = s.pair.end(Side::A).ipv4.to_string();
    let b = s.pair.end(Side::B);
    for (i, (tool, size)) in [
        ("ibv_ud_pingpong", "1024"),
        ("ibv_uc_pingpong", "4096"),
        ("ibv_srq_pingpong", "4096"),
    ]
    .into_iter()
    .enumerate()
    {
        let port = (18575 + i).to_string();
        let args = ["-g", "1", "-n", "300", "-s", size, "-p", &port];
        let mut v = vec![tool];
        v.extend_from_slice(&args);
        let server = service_support::Kid(Some(s.tool(&v).spawn().unwrap()));
        s.wait_listening(port.parse().unwrap());
        let c = Command::new("ip")
            .args(["netns", "exec", &b.netns, "timeout", "120"])
            .arg(common::xrnic_bin())
            .args(["exec", "--in-process", "--netdev", &b.ifname, "--"])
            .arg(format!("/usr/bin/{tool}"))
            .args(args)
            .arg(&a_ip)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let sv = server.wait_with_output().unwrap();
        assert!(c.status.success(), "{tool} client on B: {}", text(&c));
        assert!(
            sv.status.success(),
            "{tool} server through the service: {}",
            text(&sv)
        );
        assert!(out(&c).contains("300 iters in"), "{}", text(&c));
        assert!(out(&sv).contains("300 iters in"), "{}", text(&sv));
    }
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// UCX (Debian's ucx_perftest, a large libibverbs program written by others) with only
/// its UD transport (`UCX_TLS=ud_verbs,self`), server and client as nobody through the
/// service on one device: UCX's wire-up and data are UD datagrams whose completions
/// must carry the RoCE v2 `sl` (tests/ucx_stock.rs says why). UCX lists the device
/// only when /dev/infiniband/uverbs0 exists: plain `xrnic exec` as nobody shows it one
/// (docs/verbs-abi.md "Where programs look for a device"); without it UCX says
/// `ud_verbs` is not available.
#[test]
#[cfg_attr(not(xrnic_no_ucx_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ucx_utils, ignore = "needs root and ucx-utils")]
fn ucx_perftest_over_ud_verbs_as_nobody_through_the_service() {
    use std::process::Stdio;
    let perftest = common::stock_tool("ucx_perftest", "ucx-utils");
    let port = "13411";
    let s = Svc::start_renamed(&format!("u{port}s"));
    let ucx = |extra: &[&str]| {
        let mut c = s.as_nobody(&[common::xrnic_bin(), "exec", "--netdev", s.ifname(), "--"]);
        c.arg(&perftest)
            .args(extra)
            .args(["-p", port, "-t", "tag_bw", "-s", "65536", "-n", "300"])
            .env("UCX_TLS", "ud_verbs,self")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let server = service_support::Kid(Some(ucx(&[]).spawn().unwrap()));
    let mut client = None;
    for _ in 0..60 {
        std::thread::sleep(Duration::from_millis(250));
        let o = ucx(&["127.0.0.1"]).output().unwrap();
        if !String::from_utf8_lossy(&o.stderr).contains("Connection refused") {
            client = Some(o);
            break;
        }
    }
    let client = client.expect("the server never listened");
    let server = server.wait_with_output().unwrap();
    assert!(client.status.success(), "client: {}", text(&client));
    assert!(server.status.success(), "server: {}", text(&server));
    assert!(out(&client).contains("Final:"), "client: {}", text(&client));
    let left = s.wait_empty(Duration::from_secs(2));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Whether the kernel of the calling thread's namespace holds IPv4 group `g` joined on
/// `ifname` (/proc/net/igmp, groups in hex in host order; tests/verbs_mcast.rs).
fn igmp_joined(ifname: &str, g: [u8; 4]) -> bool {
    let igmp = std::fs::read_to_string("/proc/thread-self/net/igmp").unwrap_or_default();
    let hex = format!("{:02X}{:02X}{:02X}{:02X}", g[3], g[2], g[1], g[0]);
    let mut in_if = false;
    let mut joined = false;
    for l in igmp.lines() {
        if !l.starts_with(char::is_whitespace) && !l.starts_with("Idx") {
            in_if = l.split_whitespace().nth(1).map(|n| n.trim_end_matches(':')) == Some(ifname);
        } else if in_if && l.split_whitespace().next() == Some(&hex) {
            joined = true;
        }
    }
    joined
}

/// Multicast through the service: client B's UD QP attached to 239.1.2.3 (the service's
/// device joins the group in the kernel on its interface), client A sends to the
/// group's AH and QPN 0xFFFFFF, B receives it (the driver loops a group's frame back to
/// the device's own members). B's end (its process's device closed, as at its death)
/// detaches it and the service leaves the group.
#[test]
#[ignore = "needs root"]
fn multicast_attach_through_the_service_joins_delivers_and_leaves() {
    use xrnic::verbs::{
        Access, AddressVector, Device, GRH_LEN, QpInitAttr, RecvWr, SendWr, WcStatus, WrOpcode,
    };
    use xrnic_netns::Side;
    const QKEY: u32 = 0x0123_4567;
    const GROUP: [u8; 4] = [239, 1, 2, 3];
    let s = Svc::start();
    let ifname = s.ifname().to_string();
    s.pair
        .run_in(Side::A, || {
            let gid = xrnic::wire::ipv4_gid(GROUP);
            assert!(!igmp_joined(&ifname, GROUP));
            {
                let db = Device::open(&ifname).unwrap();
                assert!(db.service_pid().is_some());
                let pb = db.alloc_pd().unwrap();
                let cb = db.create_cq(16).unwrap();
                let mb = pb.reg_mr(8192, Access::LOCAL_WRITE).unwrap();
                let qb = pb.create_ud_qp(&QpInitAttr::new(&cb, &cb, 8)).unwrap();
                qb.ud_ready(QKEY, 1).unwrap();
                qb.attach_mcast(&gid, 0).unwrap();
                assert_eq!(qb.mcast_groups(), vec![gid]);
                assert!(igmp_joined(&ifname, GROUP), "the service joined the group");
                qb.post_recv(RecvWr {
                    wr_id: 5,
                    sg_list: vec![mb.sge(0, 4096)],
                })
                .unwrap();
                let da = Device::open(&ifname).unwrap();
                let pa = da.alloc_pd().unwrap();
                let ca = da.create_cq(16).unwrap();
                let ma = pa.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
                let qa = pa.create_ud_qp(&QpInitAttr::new(&ca, &ca, 8)).unwrap();
                qa.ud_ready(QKEY, 2).unwrap();
                let ah = pa
                    .create_ah(&AddressVector {
                        dgid: gid,
                        sgid_index: 1,
                        ..AddressVector::default()
                    })
                    .unwrap();
                assert_eq!(ah.attr().dmac, [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]);
                ma.write(0, b"to the group").unwrap();
                let mut wr = SendWr::new(1, WrOpcode::Send);
                wr.send_flags = xrnic::verbs::SendFlags::SIGNALED;
                wr.sg_list = vec![ma.sge(0, 12)];
                qa.post_send_ud(
                    wr,
                    &ah,
                    xrnic::wire::Qpn::new(xrnic::wire::MULTICAST_QPN),
                    QKEY,
                )
                .unwrap();
                let w = cb.wait(1, Duration::from_secs(10));
                assert_eq!(w.len(), 1, "B got the group's datagram");
                assert_eq!((w[0].status, w[0].wr_id), (WcStatus::Success, 5));
                assert_eq!(w[0].src_qp, qa.qp_num());
                let mut got = [0u8; 12];
                mb.read(GRH_LEN, &mut got).unwrap();
                assert_eq!(&got, b"to the group");
                // A's QP is not attached: its detach is EINVAL (rxe `rxe_detach_mcg`)
                // and leaves B's membership alone.
                assert!(qa.detach_mcast(&gid, 0).is_err());
                assert!(igmp_joined(&ifname, GROUP));
            }
            // B's device and QP are gone: the service destroyed the QP and left.
            assert!(!igmp_joined(&ifname, GROUP), "the group is left");
        })
        .unwrap();
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// UC through the service with the Rust API: two clients' UC QPs connected to each other
/// (`Qp::connect` takes the UC masks), a SEND and an RDMA WRITE with immediate land in
/// the receiver's memory; a READ is refused at once (EINVAL, rxe's opcode table), as
/// in-process, not as an error completion later.
#[test]
#[ignore = "needs root"]
fn uc_through_the_service_sends_writes_and_refuses_read_at_once() {
    use xrnic::verbs::{
        Access, ConnectOpts, Device, QpInitAttr, QpType, RecvWr, Remote, SendWr, WcOpcode,
        WcStatus, WrOpcode,
    };
    use xrnic_netns::Side;
    let s = Svc::start();
    let ifname = s.ifname().to_string();
    s.pair
        .run_in(Side::A, || {
            let (da, db) = (
                Device::open(&ifname).unwrap(),
                Device::open(&ifname).unwrap(),
            );
            let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
            let (ca, cb) = (da.create_cq(16).unwrap(), db.create_cq(16).unwrap());
            let ma = pa.reg_mr(4096, Access::ALL).unwrap();
            let mb = pb.reg_mr(4096, Access::ALL).unwrap();
            let init = |c| QpInitAttr::new(c, c, 16);
            let qa = pa.create_qp_ext(&init(&ca), QpType::Uc, None).unwrap();
            let qb = pb.create_qp_ext(&init(&cb), QpType::Uc, None).unwrap();
            assert_eq!((qa.qp_type(), qb.qp_type()), (QpType::Uc, QpType::Uc));
            let gid = da.query_gid(1).unwrap();
            let o = ConnectOpts {
                access: Access::ALL,
                ..Default::default()
            };
            let to = |q: &xrnic::verbs::Qp, psn| Remote {
                qpn: q.qp_num(),
                psn,
                gid,
            };
            qa.connect(&to(&qb, 7), 9, 1, &o).unwrap();
            qb.connect(&to(&qa, 9), 7, 1, &o).unwrap();
            let wait = |cq: &xrnic::verbs::Cq| {
                let w = cq.wait(1, Duration::from_secs(10));
                assert_eq!(w.len(), 1, "a completion");
                assert_eq!(w[0].status, WcStatus::Success, "{w:?}");
                w[0]
            };
            for id in [1, 2] {
                qb.post_recv(RecvWr {
                    wr_id: id,
                    sg_list: vec![mb.sge(0, 64)],
                })
                .unwrap();
            }
            ma.write(0, b"uc send").unwrap();
            let mut wr = SendWr::new(10, WrOpcode::Send);
            wr.send_flags = xrnic::verbs::SendFlags::SIGNALED;
            wr.sg_list = vec![ma.sge(0, 7)];
            qa.post_send(wr).unwrap();
            assert_eq!(wait(&ca).wr_id, 10);
            let w = wait(&cb);
            assert_eq!((w.wr_id, w.byte_len, w.src_qp), (1, 7, qa.qp_num()));
            let mut got = [0u8; 7];
            mb.read(0, &mut got).unwrap();
            assert_eq!(&got, b"uc send");
            ma.write(100, b"uc write").unwrap();
            let mut wr = SendWr::new(11, WrOpcode::RdmaWriteWithImm);
            wr.send_flags = xrnic::verbs::SendFlags::SIGNALED;
            wr.imm_data = 0x55;
            wr.sg_list = vec![ma.sge(100, 8)];
            wr.rdma.remote_addr = mb.addr() + 1000;
            wr.rdma.rkey = mb.rkey();
            qa.post_send(wr).unwrap();
            assert_eq!(wait(&ca).wr_id, 11);
            let w = wait(&cb);
            assert_eq!(
                (w.opcode, w.imm_data),
                (WcOpcode::RecvRdmaWithImm, Some(0x55))
            );
            let mut got = [0u8; 8];
            mb.read(1000, &mut got).unwrap();
            assert_eq!(&got, b"uc write");
            let mut wr = SendWr::new(12, WrOpcode::RdmaRead);
            wr.sg_list = vec![ma.sge(200, 8)];
            wr.rdma.remote_addr = mb.addr();
            wr.rdma.rkey = mb.rkey();
            assert!(qa.post_send(wr).is_err(), "READ on UC: refused at once");
            assert!(ca.poll(4).is_empty(), "and no completion for it");
        })
        .unwrap();
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `xrnic up --max-ahs 2 --max-srqs 1`: a client's third AH and second SRQ fail with
/// ENOMEM (the daemon got the caps), its first ones work, and another client has its
/// own allowance.
#[test]
#[ignore = "needs root"]
fn the_ah_and_srq_caps_of_xrnic_up_hold_per_client() {
    use xrnic::verbs::{AddressVector, Device, Error, SrqAttr};
    use xrnic_netns::Side;
    let s = Svc::start_with(&["--max-ahs", "2", "--max-srqs", "1"]);
    let ifname = s.ifname().to_string();
    s.pair
        .run_in(Side::A, || {
            let enomem = |e: Error| match e {
                Error::Io(io) => assert_eq!(io.raw_os_error(), Some(libc::ENOMEM), "{io}"),
                e => panic!("{e}"),
            };
            let (da, db) = (
                Device::open(&ifname).unwrap(),
                Device::open(&ifname).unwrap(),
            );
            let av = AddressVector {
                dgid: da.query_gid(1).unwrap(),
                sgid_index: 1,
                ..AddressVector::default()
            };
            let attr = SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            };
            let pa = da.alloc_pd().unwrap();
            let ahs = [pa.create_ah(&av).unwrap(), pa.create_ah(&av).unwrap()];
            enomem(pa.create_ah(&av).unwrap_err());
            let srq = pa.create_srq(&attr).unwrap();
            enomem(pa.create_srq(&attr).unwrap_err());
            let pb = db.alloc_pd().unwrap();
            let _b = (pb.create_ah(&av).unwrap(), pb.create_srq(&attr).unwrap());
            // A full SRQ refuses a post at once, as in-process (ENOMEM in the library).
            let wr = || xrnic::verbs::RecvWr {
                wr_id: 0,
                sg_list: vec![],
            };
            for _ in 0..4 {
                srq.post_recv(wr()).unwrap();
            }
            assert_eq!(srq.len(), 4);
            assert!(matches!(
                srq.post_recv(wr()),
                Err(Error::Verbs(xrnic::verbs::VerbsError::QueueFull))
            ));
            // Freed, the allowance comes back.
            drop(ahs);
            srq.destroy().unwrap();
            let _again = (pa.create_ah(&av).unwrap(), pa.create_srq(&attr).unwrap());
        })
        .unwrap();
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}
