//! DCQCN on real devices: two xrnic devices (driver + AF_XDP) on a veth pair, the
//! receiver's driver marking a fraction of the received ECN-capable frames CE the way a
//! RED/ECN switch would (`DeviceOptions::rx_ce_mark`; this host kernel has no sch_red, and
//! XDP runs before tc). Checks that the notification point answers the marks with CNPs,
//! that the sender's reaction point handles them, and that the counters and per-QP rate
//! state are visible through the verbs API and the stat snapshot. The root tests are
//! `#[ignore = "needs root"]` (docs/testing.md).

mod common;

use std::time::{Duration, Instant};

use xrnic::verbs::{
    Access, ConnectOpts, Cq, DcqcnParams, Device, DeviceOptions, Mr, Mtu, Qp, QpInitAttr, Remote,
    SendWr, WcStatus, WorkCompletion, WrOpcode,
};
use xrnic_netns::{Side, VethPair};

/// A guard against hanging, not a performance threshold.
const PATIENCE: Duration = Duration::from_secs(20);
const REGION: usize = 1 << 20;
const MSGS: usize = 64;
const LEN: usize = 16 * 1024;

struct End {
    dev: Device,
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn open(pair: &VethPair, side: Side, opts: &DeviceOptions) -> End {
    let dev = pair
        .run_in(side, || Device::open_with(&pair.end(side).ifname, opts))
        .expect("enter netns")
        .unwrap_or_else(|e| panic!("open device on side {side:?}: {e}"));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let mr = pd.reg_mr(REGION, Access::ALL).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 256)).unwrap();
    End { dev, cq, mr, qp }
}

fn connect(a: &End, b: &End) {
    let o = ConnectOpts {
        access: Access::ALL,
        path_mtu: Mtu::Mtu1024,
        timeout: 10,
        ..ConnectOpts::default()
    };
    let gid = |d: &Device| d.query_gid(1).expect("IPv4 GID at index 1");
    let (qa, qb) = (a.qp.qp_num(), b.qp.qp_num());
    a.qp.connect(
        &Remote {
            qpn: qb,
            psn: 0x200,
            gid: gid(&b.dev),
        },
        0x100,
        1,
        &o,
    )
    .expect("connect a");
    b.qp.connect(
        &Remote {
            qpn: qa,
            psn: 0x100,
            gid: gid(&a.dev),
        },
        0x200,
        1,
        &o,
    )
    .expect("connect b");
}

fn wait_n(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let start = Instant::now();
    let mut out = Vec::new();
    while out.len() < n {
        cq.wait_into(n - out.len(), Duration::from_millis(100), &mut out);
        assert!(
            start.elapsed() < PATIENCE,
            "{} of {n} completions",
            out.len()
        );
    }
    out
}

/// A writes MSGS × LEN bytes into B, all signaled; every byte checked.
fn write_all(a: &End, b: &End) {
    let data: Vec<u8> = (0..MSGS * LEN).map(|i| (i * 7 + (i >> 9)) as u8).collect();
    a.mr.write(0, &data).unwrap();
    for i in 0..MSGS {
        let mut wr = SendWr::new(i as u64, WrOpcode::RdmaWrite);
        wr.sg_list = vec![a.mr.sge(i * LEN, LEN as u32)];
        wr.rdma.remote_addr = b.mr.addr() + (i * LEN) as u64;
        wr.rdma.rkey = b.mr.rkey();
        wr.send_flags = xrnic::verbs::SendFlags::SIGNALED;
        a.qp.post_send(wr).unwrap();
    }
    for wc in wait_n(&a.cq, MSGS) {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    let mut got = vec![0u8; MSGS * LEN];
    b.mr.read(0, &mut got).unwrap();
    assert!(got == data, "the data arrived intact");
}

/// DCQCN with a rate floor of 1 Gb/s: cuts happen but the transfer stays quick.
fn params() -> DcqcnParams {
    let mut p = DcqcnParams::connectx();
    p.apply("rp_min_rate=1000").unwrap();
    p
}

#[test]
#[ignore = "needs root"]
fn ce_marks_become_cnps_that_cut_the_senders_rate() {
    let pair = VethPair::new(1500).expect("veth pair");
    let dir = std::env::temp_dir().join(format!("xrnic-cc-veth-{}", std::process::id()));
    let a = open(
        &pair,
        Side::A,
        &DeviceOptions {
            dcqcn: Some(params()),
            stat_dir: Some(dir.clone()),
            stat_interval: Duration::from_millis(50),
            ..DeviceOptions::default()
        },
    );
    let b = open(
        &pair,
        Side::B,
        &DeviceOptions {
            dcqcn: Some(params()),
            rx_ce_mark: 0.05,
            seed: 7,
            ..DeviceOptions::default()
        },
    );
    connect(&a, &b);
    let before = a.qp.rate_status().expect("DCQCN is on");
    assert_eq!(before.rate_bps, before.target_bps, "unthrottled at first");
    assert_eq!(before.rp_cnp_handled, 0);

    let line = before.rate_bps;
    write_all(&a, &b);

    let marked = b.dev.driver_stats().unwrap().fault_ce_marked;
    assert!(marked > 0, "the driver marked some of {MSGS} × {LEN} bytes");
    let cb = b.dev.counters().unwrap();
    assert_eq!(
        cb.np_ecn_marked_roce_packets, marked,
        "the NP counts every CE-marked frame it received"
    );
    assert!(
        cb.np_cnp_sent > 0 && cb.np_cnp_sent <= marked,
        "CNPs at most one per marked frame: {cb:?}"
    );
    // Every CNP crosses the lossless veth; wait for the last ones to be taken.
    let start = Instant::now();
    let ca = loop {
        let c = a.dev.counters().unwrap();
        if c.rp_cnp_handled + c.rp_cnp_ignored >= cb.np_cnp_sent {
            break c;
        }
        assert!(start.elapsed() < PATIENCE, "CNPs lost: {c:?} vs {cb:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(ca.rp_cnp_handled + ca.rp_cnp_ignored, cb.np_cnp_sent);
    assert!(ca.rp_cnp_handled > 0, "{ca:?}");
    assert_eq!(ca.np_cnp_sent, 0, "A's data was never marked");

    let st = a.qp.rate_status().unwrap();
    assert_eq!(
        st.rp_cnp_handled, ca.rp_cnp_handled,
        "one QP: its CNPs are the device's"
    );
    let alpha = st.alpha.expect("DCQCN has an α");
    // With ConnectX's g = 1019/1024 per 1 µs period, α is back at 0 a few hundred µs after
    // the last CNP: any value of [0, 1].
    assert!((0.0..=1.0).contains(&alpha), "α {alpha}");
    let cong = a.dev.congestion().expect("DCQCN is on");
    assert_eq!(cong.counters.rp_cnp_handled, ca.rp_cnp_handled);
    assert_eq!(cong.line_rate_bps, line);
    assert_eq!(cong.qps.len(), 1);
    assert_eq!(cong.qps[0].0, a.qp.qp_num());
    assert!(
        cong.qps[0].1.rate_bps >= 1_000_000_000,
        "never below rp_min_rate"
    );

    // The stat snapshot (what `xrnic stat` shows) carries the QP's rate state and the
    // device counters.
    let start = Instant::now();
    let snap = loop {
        let path = pair
            .run_in(Side::A, || {
                xrnic::verbs::stat_file(&dir, &pair.end(Side::A).ifname)
            })
            .unwrap()
            .unwrap();
        if let Ok(t) = std::fs::read(&path) {
            let s: xrnic::driver::Snapshot = serde_json::from_slice(&t).unwrap();
            if s.device["rp_cnp_handled"].as_u64() == Some(ca.rp_cnp_handled) {
                break s;
            }
        }
        assert!(start.elapsed() < PATIENCE, "no fresh snapshot");
        std::thread::sleep(Duration::from_millis(20));
    };
    let rate = snap.qps[0]
        .rate
        .expect("the snapshot has the QP's rate state");
    assert_eq!(rate.rp_cnp_handled, ca.rp_cnp_handled);
    assert!(rate.alpha.is_some());
    let text = xrnic_cli::cli::stat::render(&snap, true);
    assert!(text.contains("dcqcn: rate_mbps "), "{text}");
    assert!(
        text.contains(&format!("rp_cnp_handled {}", ca.rp_cnp_handled)),
        "{text}"
    );
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs root"]
fn without_dcqcn_data_is_not_ecn_capable_and_nothing_is_marked() {
    let pair = VethPair::new(1500).expect("veth pair");
    // Only the sender is off: the receiver's NP would answer marks, but a switch marks
    // only ECN-capable frames, and ours are not.
    let a = open(
        &pair,
        Side::A,
        &DeviceOptions {
            dcqcn: None,
            ..DeviceOptions::default()
        },
    );
    let b = open(
        &pair,
        Side::B,
        &DeviceOptions {
            dcqcn: Some(params()),
            rx_ce_mark: 0.5,
            ..DeviceOptions::default()
        },
    );
    connect(&a, &b);
    assert!(a.qp.rate_status().is_none() && a.dev.congestion().is_none());
    write_all(&a, &b);
    assert_eq!(b.dev.driver_stats().unwrap().fault_ce_marked, 0);
    let cb = b.dev.counters().unwrap();
    assert_eq!((cb.np_ecn_marked_roce_packets, cb.np_cnp_sent), (0, 0));
    let ca = a.dev.counters().unwrap();
    assert_eq!((ca.rp_cnp_handled, ca.rp_cnp_ignored), (0, 0));
}

#[test]
#[ignore = "needs root"]
fn a_traffic_class_with_ect1_is_kept_and_marked() {
    let pair = VethPair::new(1500).expect("veth pair");
    // No DCQCN on A, but its QP asks for DSCP 26 with ECT(1) itself: the frames are
    // ECN-capable, so the "switch" marks them and B's NP answers.
    let a = open(
        &pair,
        Side::A,
        &DeviceOptions {
            dcqcn: None,
            ..DeviceOptions::default()
        },
    );
    let b = open(
        &pair,
        Side::B,
        &DeviceOptions {
            dcqcn: Some(params()),
            rx_ce_mark: 0.05,
            ..DeviceOptions::default()
        },
    );
    let o = ConnectOpts {
        access: Access::ALL,
        path_mtu: Mtu::Mtu1024,
        traffic_class: (26 << 2) | 1,
        ..ConnectOpts::default()
    };
    let gid = |d: &Device| d.query_gid(1).unwrap();
    let (qa, qb) = (a.qp.qp_num(), b.qp.qp_num());
    a.qp.connect(
        &Remote {
            qpn: qb,
            psn: 1,
            gid: gid(&b.dev),
        },
        2,
        1,
        &o,
    )
    .unwrap();
    b.qp.connect(
        &Remote {
            qpn: qa,
            psn: 2,
            gid: gid(&a.dev),
        },
        1,
        1,
        &ConnectOpts {
            access: Access::ALL,
            path_mtu: Mtu::Mtu1024,
            ..ConnectOpts::default()
        },
    )
    .unwrap();
    assert_eq!(a.qp.query().unwrap().ah_attr.traffic_class, (26 << 2) | 1);
    write_all(&a, &b);
    let marked = b.dev.driver_stats().unwrap().fault_ce_marked;
    assert!(marked > 0);
    assert_eq!(b.dev.counters().unwrap().np_ecn_marked_roce_packets, marked);
    // A has no reaction point: the CNPs change nothing and are dropped as a service it
    // does not run, as before congestion control existed.
    let sent = b.dev.counters().unwrap().np_cnp_sent;
    assert!(sent > 0);
    let start = Instant::now();
    while a.dev.counters().unwrap().unsupported_dropped < sent {
        assert!(start.elapsed() < PATIENCE, "CNPs lost");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ca = a.dev.counters().unwrap();
    assert_eq!((ca.rp_cnp_handled, ca.rp_cnp_ignored), (0, 0));
}

/// Devices opened with the default options run DCQCN like a ConnectX port: their data is
/// ECN-capable (ECT(0), so the "switch" can mark it at all), CE marks are answered with
/// CNPs, and the sender takes them as a reaction point.
#[test]
#[ignore = "needs root"]
fn default_devices_mark_ect0_and_answer_ce_like_connectx() {
    assert_eq!(
        DeviceOptions::default().dcqcn,
        Some(DcqcnParams::connectx()),
        "on by default, ConnectX parameters"
    );
    let pair = VethPair::new(1500).expect("veth pair");
    let a = open(&pair, Side::A, &DeviceOptions::default());
    let b = open(
        &pair,
        Side::B,
        &DeviceOptions {
            rx_ce_mark: 0.05,
            seed: 11,
            ..DeviceOptions::default()
        },
    );
    connect(&a, &b);
    assert!(a.qp.rate_status().is_some(), "DCQCN runs on the default QP");
    write_all(&a, &b);
    // The injector marks only ECN-capable frames: marks prove ECT on A's data.
    let marked = b.dev.driver_stats().unwrap().fault_ce_marked;
    assert!(marked > 0, "A's default data frames are ECN-capable");
    let sent = b.dev.counters().unwrap().np_cnp_sent;
    assert!(sent > 0, "B's default NP answers CE marks");
    let start = Instant::now();
    loop {
        let c = a.dev.counters().unwrap();
        if c.rp_cnp_handled + c.rp_cnp_ignored >= sent {
            assert!(c.rp_cnp_handled > 0, "{c:?}");
            assert_eq!(c.unsupported_dropped, 0, "CNPs are not dropped as unknown");
            break;
        }
        assert!(start.elapsed() < PATIENCE, "CNPs lost: {c:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
