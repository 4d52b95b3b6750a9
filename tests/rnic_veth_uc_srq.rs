//! UC QPs and an SRQ on a real wire: two xrnic devices (driver thread + AF_XDP) on a
//! veth pair in two network namespaces, through the verbs API: UC SEND and UC WRITE with
//! immediate byte for byte (nothing sent back), and RC QPs on one SRQ with RNR NAKs
//! while it is empty and the limit event. `#[ignore = "needs root"]` (docs/testing.md).

use std::time::Duration;

use xrnic::verbs::{
    Access, AsyncEvent, ConnectOpts, Cq, Device, DeviceOptions, Mr, Mtu, Pd, Qp, QpInitAttr,
    QpType, RecvWr, Remote, SendWr, Srq, SrqAttr, SrqAttrMask, WcOpcode, WcStatus, WorkCompletion,
    WrOpcode,
};
use xrnic_netns::{Side, VethPair};

/// A guard against hanging, not a performance threshold.
const PATIENCE: Duration = Duration::from_secs(10);

fn open(pair: &VethPair, side: Side) -> Device {
    pair.run_in(side, || {
        Device::open_with(&pair.end(side).ifname, &DeviceOptions::default())
    })
    .expect("enter netns")
    .unwrap_or_else(|e| panic!("open device on side {side:?}: {e}"))
}

struct End {
    dev: Device,
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn end(dev: &Device, pd: &Pd, ty: QpType, srq: Option<&Srq>) -> End {
    let cq = dev.create_cq(1024).unwrap();
    let mr = pd.reg_mr(1 << 16, Access::ALL).unwrap();
    let qp = pd
        .create_qp_ext(&QpInitAttr::new(&cq, &cq, 256), ty, srq)
        .unwrap();
    End {
        dev: dev.clone(),
        cq,
        mr,
        qp,
    }
}

fn connect(a: &End, b: &End) {
    let o = ConnectOpts {
        access: Access::ALL,
        path_mtu: Mtu::Mtu1024,
        timeout: 10,
        min_rnr_timer: 1,
        ..ConnectOpts::default()
    };
    let gid = |d: &Device| d.query_gid(1).expect("gid 1");
    let r = |e: &End, psn| Remote {
        qpn: e.qp.qp_num(),
        psn,
        gid: gid(&e.dev),
    };
    a.qp.connect(&r(b, 0x200), 0x100, 1, &o).expect("connect a");
    b.qp.connect(&r(a, 0x100), 0x200, 1, &o).expect("connect b");
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

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed * 131 + i * 7) as u8).collect()
}

#[test]
#[ignore = "needs root"]
fn uc_send_and_write_with_immediate_and_an_srq_over_a_veth() {
    let pair = VethPair::new(1500).expect("veth pair");
    let da = open(&pair, Side::A);
    let db = open(&pair, Side::B);
    let pa = da.alloc_pd().unwrap();
    let pb = db.alloc_pd().unwrap();

    // UC: a 5000-byte SEND (5 packets) and a 3000-byte WRITE with immediate.
    let a = end(&da, &pa, QpType::Uc, None);
    let b = end(&db, &pb, QpType::Uc, None);
    connect(&a, &b);
    a.mr.write(0, &pattern(1, 5000)).unwrap();
    a.mr.write(8192, &pattern(2, 3000)).unwrap();
    for (id, off) in [(1, 0), (2, 0)] {
        let sg = if id == 1 {
            vec![b.mr.sge(off, 8192)]
        } else {
            vec![]
        };
        b.qp.post_recv(RecvWr {
            wr_id: id,
            sg_list: sg,
        })
        .unwrap();
    }
    let mut w = SendWr::new(10, WrOpcode::Send);
    w.sg_list = vec![a.mr.sge(0, 5000)];
    a.qp.post_send(w).unwrap();
    let mut w = SendWr::new(11, WrOpcode::RdmaWriteWithImm);
    w.sg_list = vec![a.mr.sge(8192, 3000)];
    w.rdma.remote_addr = b.mr.addr() + 16384;
    w.rdma.rkey = b.mr.rkey();
    w.imm_data = 0x1234_5678;
    a.qp.post_send(w).unwrap();
    let sent = wait_n(&a.cq, 2);
    assert!(
        sent.iter().all(|w| w.status == WcStatus::Success),
        "{sent:?}"
    );
    let got = wait_n(&b.cq, 2);
    assert_eq!((got[0].wr_id, got[0].byte_len), (1, 5000));
    assert_eq!(
        (
            got[1].wr_id,
            got[1].opcode,
            got[1].imm_data,
            got[1].byte_len
        ),
        (2, WcOpcode::RecvRdmaWithImm, Some(0x1234_5678), 3000)
    );
    let mut buf = vec![0u8; 5000];
    b.mr.read(0, &mut buf).unwrap();
    assert_eq!(buf, pattern(1, 5000));
    let mut buf = vec![0u8; 3000];
    b.mr.read(16384, &mut buf).unwrap();
    assert_eq!(buf, pattern(2, 3000));
    let cb = b.qp.counters().unwrap();
    assert_eq!((cb.packets_sent, cb.uc_messages_dropped), (0, 0), "{cb:?}");

    // Four RC QPs on one SRQ of side B: RNR while it is empty, the limit event, then
    // every message byte for byte.
    let srq = pb
        .create_srq(&SrqAttr {
            max_wr: 64,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let srq_mr = pb.reg_mr(64 * 1024, Access::ALL).unwrap();
    let ends: Vec<(End, End)> = (0..4)
        .map(|_| {
            let x = end(&da, &pa, QpType::Rc, None);
            let y = end(&db, &pb, QpType::Rc, Some(&srq));
            connect(&x, &y);
            (x, y)
        })
        .collect();
    for (i, (x, _)) in ends.iter().enumerate() {
        x.mr.write(0, &pattern(10 + i, 1000)).unwrap();
        let mut w = SendWr::new(i as u64, WrOpcode::Send);
        w.sg_list = vec![x.mr.sge(0, 1000)];
        x.qp.post_send(w).unwrap();
    }
    // Nothing posted yet: the requesters wait on RNR NAKs (rnr_retry 7 = forever).
    let deadline = std::time::Instant::now() + PATIENCE;
    while ends
        .iter()
        .map(|(_, y)| y.qp.counters().unwrap().rnr_naks_sent)
        .sum::<u64>()
        == 0
    {
        assert!(std::time::Instant::now() < deadline, "no RNR NAK");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Armed before the WQEs come: the RNR retries may take them at once.
    let lim = SrqAttr {
        srq_limit: 3,
        ..SrqAttr::default()
    };
    srq.modify(&lim, SrqAttrMask::LIMIT).unwrap();
    for k in 0..6 {
        srq.post_recv(RecvWr {
            wr_id: 100 + k,
            sg_list: vec![srq_mr.sge(1024 * k as usize, 1024)],
        })
        .unwrap();
    }
    for (i, (_, y)) in ends.iter().enumerate() {
        let w = wait_n(&y.cq, 1);
        assert_eq!((w[0].status, w[0].byte_len), (WcStatus::Success, 1000));
        let mut buf = vec![0u8; 1000];
        srq_mr
            .read(1024 * (w[0].wr_id - 100) as usize, &mut buf)
            .unwrap();
        assert_eq!(buf, pattern(10 + i, 1000), "QP {i}");
    }
    assert_eq!(srq.len(), 2);
    assert_eq!(
        db.poll_async_event(),
        Some(AsyncEvent::SrqLimitReached(xrnic::proto::Srq(
            srq.srq_num()
        )))
    );
    assert_eq!(db.poll_async_event(), None);
}
