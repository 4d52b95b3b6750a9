//! The software RNIC on a real wire: two xrnic devices (driver thread + AF_XDP) on the two
//! ends of a veth pair in two network namespaces, driven through the verbs API. Every
//! operation with data verified, IPv4 and IPv6 GIDs, path MTU 1024 on a 1500 link and
//! 4096 on a 9000 link, one-sided traffic into a passive server, loss injected by the
//! driver's fault injector, malformed frames from the kernel's own UDP stack, clean
//! shutdown. The root tests are `#[ignore = "needs root"]`
//! (docs/testing.md).

mod common;

use std::net::UdpSocket;
use std::time::Duration;

use xrnic::io::afxdp::PortOptions;
use xrnic::verbs::{
    Access, ConnectOpts, Cq, Device, DeviceOptions, Mr, Mtu, Qp, QpInitAttr, RecvWr, Remote,
    SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use xrnic_netns::{Side, VethPair};

/// A guard against hanging, not a performance threshold.
const PATIENCE: Duration = Duration::from_secs(10);
const REGION: usize = 1 << 20;

fn open(pair: &VethPair, side: Side, opts: &DeviceOptions) -> Device {
    pair.run_in(side, || Device::open_with(&pair.end(side).ifname, opts))
        .expect("enter netns")
        .unwrap_or_else(|e| panic!("open device on side {side:?}: {e}"))
}

/// One connected end.
struct End {
    dev: Device,
    pd: xrnic::verbs::Pd,
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn end(dev: Device) -> End {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let mr = pd.reg_mr(REGION, Access::ALL).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 1024)).unwrap();
    End {
        dev,
        pd,
        cq,
        mr,
        qp,
    }
}

/// Connect the two ends with the GID at `gid_index` on both sides.
fn connect(a: &End, b: &End, gid_index: u8, mtu: Mtu) {
    // 4.096 µs * 2^10 ≈ 4 ms: quick recovery of a lost last packet in lossy tests.
    connect_with_timeout(a, b, gid_index, mtu, 10);
}

/// [`connect`] with this local ACK timeout (4.096 µs * 2^timeout, IBTA vol. 1 §9.7.6.1.3).
fn connect_with_timeout(a: &End, b: &End, gid_index: u8, mtu: Mtu, timeout: u8) {
    let o = ConnectOpts {
        access: Access::ALL,
        path_mtu: mtu,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        timeout,
        min_rnr_timer: 1,
        ..ConnectOpts::default()
    };
    let gid = |d: &Device| d.query_gid(gid_index.into()).expect("gid index");
    a.qp.connect(
        &Remote {
            qpn: b.qp.qp_num(),
            psn: 0xfffff0,
            gid: gid(&b.dev),
        },
        0x123456,
        gid_index,
        &o,
    )
    .expect("connect a");
    b.qp.connect(
        &Remote {
            qpn: a.qp.qp_num(),
            psn: 0x123456,
            gid: gid(&a.dev),
        },
        0xfffff0,
        gid_index,
        &o,
    )
    .expect("connect b");
}

/// Both ends of `pair` opened with these options and connected over the IPv4-mapped GID
/// (index 1) with path MTU 1024: the setup most tests here share.
fn connected(pair: &VethPair, a_opts: &DeviceOptions, b_opts: &DeviceOptions) -> (End, End) {
    let a = end(open(pair, Side::A, a_opts));
    let b = end(open(pair, Side::B, b_opts));
    connect(&a, &b, 1, Mtu::Mtu1024);
    (a, b)
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed as usize * 131 + i * 7 + (i >> 8)) as u8)
        .collect()
}

/// Wait for exactly `n` completions on `cq`.
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

fn ok(wc: &WorkCompletion, op: WcOpcode) {
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, op), "{wc:?}");
}

/// SEND, SEND_WITH_IMM, WRITE, WRITE_WITH_IMM, READ, CMP_SWAP, FETCH_ADD from `a` to
/// `b`, every byte and value checked.
fn every_operation(a: &End, b: &End, len: usize) {
    // SEND and SEND_WITH_IMM into receives.
    for (i, op) in [WrOpcode::Send, WrOpcode::SendWithImm]
        .into_iter()
        .enumerate()
    {
        let data = pattern(i as u32, len);
        a.mr.write(0, &data).unwrap();
        b.mr.with_mut(|m| m[..len].fill(0)).unwrap();
        b.qp.post_recv(RecvWr {
            wr_id: 100 + i as u64,
            sg_list: vec![b.mr.sge(0, len as u32)],
        })
        .unwrap();
        let mut wr = SendWr::new(i as u64, op);
        wr.sg_list = vec![a.mr.sge(0, len as u32)];
        wr.imm_data = 0xdead_0000 + i as u32;
        a.qp.post_send(wr).unwrap();
        ok(&wait_n(&a.cq, 1)[0], WcOpcode::Send);
        let r = wait_n(&b.cq, 1)[0];
        ok(&r, WcOpcode::Recv);
        assert_eq!(r.byte_len as usize, len);
        assert_eq!(r.wr_id, 100 + i as u64);
        assert_eq!(
            r.imm_data,
            (op == WrOpcode::SendWithImm).then_some(0xdead_0000 + i as u32)
        );
        let mut got = vec![0u8; len];
        b.mr.read(0, &mut got).unwrap();
        assert!(got == data, "{op:?} {len} bytes differ");
    }

    // WRITE, then WRITE_WITH_IMM (which consumes a receive WQE at b).
    for (i, op) in [WrOpcode::RdmaWrite, WrOpcode::RdmaWriteWithImm]
        .into_iter()
        .enumerate()
    {
        let data = pattern(10 + i as u32, len);
        a.mr.write(0, &data).unwrap();
        if op == WrOpcode::RdmaWriteWithImm {
            b.qp.post_recv(RecvWr {
                wr_id: 200,
                sg_list: vec![],
            })
            .unwrap();
        }
        let off = 4096 * (1 + i);
        let mut wr = SendWr::new(10 + i as u64, op);
        wr.sg_list = vec![a.mr.sge(0, len as u32)];
        wr.rdma.remote_addr = b.mr.addr() + off as u64;
        wr.rdma.rkey = b.mr.rkey();
        wr.imm_data = 0x1234;
        a.qp.post_send(wr).unwrap();
        ok(&wait_n(&a.cq, 1)[0], WcOpcode::RdmaWrite);
        if op == WrOpcode::RdmaWriteWithImm {
            let r = wait_n(&b.cq, 1)[0];
            ok(&r, WcOpcode::RecvRdmaWithImm);
            assert_eq!((r.imm_data, r.byte_len as usize), (Some(0x1234), len));
        }
        let mut got = vec![0u8; len];
        b.mr.read(off, &mut got).unwrap();
        assert!(got == data, "{op:?} {len} bytes differ");
    }

    // READ b's bytes back into a fresh part of a's region.
    let data = pattern(20, len);
    b.mr.write(8192, &data).unwrap();
    let mut wr = SendWr::new(20, WrOpcode::RdmaRead);
    wr.sg_list = vec![a.mr.sge(REGION / 2, len as u32)];
    wr.rdma.remote_addr = b.mr.addr() + 8192;
    wr.rdma.rkey = b.mr.rkey();
    a.qp.post_send(wr).unwrap();
    let r = wait_n(&a.cq, 1)[0];
    ok(&r, WcOpcode::RdmaRead);
    let mut got = vec![0u8; len];
    a.mr.read(REGION / 2, &mut got).unwrap();
    assert!(got == data, "READ {len} bytes differ");

    // CMP_SWAP (hit, then miss) and FETCH_ADD on an 8-byte word of b.
    let word = REGION - 64;
    // Atomics operate on host-order words (rxe does the same: a native 64-bit access).
    b.mr.write(word, &7u64.to_ne_bytes()).unwrap();
    for (wr_id, op, cmp, swap, old, new) in [
        (30, WrOpcode::AtomicCmpAndSwp, 7u64, 99u64, 7u64, 99u64),
        (31, WrOpcode::AtomicCmpAndSwp, 7, 1, 99, 99),
        (32, WrOpcode::AtomicFetchAndAdd, 1000, 0, 99, 1099),
    ] {
        let mut wr = SendWr::new(wr_id, op);
        wr.sg_list = vec![a.mr.sge(0, 8)];
        wr.atomic.remote_addr = b.mr.addr() + word as u64;
        wr.atomic.rkey = b.mr.rkey();
        wr.atomic.compare_add = cmp;
        wr.atomic.swap = swap;
        a.qp.post_send(wr).unwrap();
        let r = wait_n(&a.cq, 1)[0];
        let want = if op == WrOpcode::AtomicFetchAndAdd {
            WcOpcode::FetchAdd
        } else {
            WcOpcode::CompSwap
        };
        ok(&r, want);
        let mut v = [0u8; 8];
        a.mr.read(0, &mut v).unwrap();
        assert_eq!(
            u64::from_ne_bytes(v),
            old,
            "{op:?} returned the original value"
        );
        let mut w = [0u8; 8];
        b.mr.read(word, &mut w).unwrap();
        assert_eq!(u64::from_ne_bytes(w), new, "{op:?} left the remote word");
    }
}

fn run_pair(mtu: u32, path_mtu: Mtu, gid_indexes: &[u8], len: usize) {
    run_pair_with(mtu, path_mtu, gid_indexes, len, &DeviceOptions::default());
}

fn run_pair_with(mtu: u32, path_mtu: Mtu, gid_indexes: &[u8], len: usize, opts: &DeviceOptions) {
    let pair = VethPair::new(mtu).expect("veth pair");
    let da = open(&pair, Side::A, opts);
    let db = open(&pair, Side::B, opts);
    assert_eq!(da.query_port().active_mtu, path_mtu, "active MTU on {mtu}");
    for &gi in gid_indexes {
        let a = end(da.clone());
        let b = end(db.clone());
        connect(&a, &b, gi, path_mtu);
        let before = a.qp.counters().unwrap();
        every_operation(&a, &b, len);
        let c = a.qp.counters().unwrap();
        // Segmentation at the path MTU: the 2 SENDs and 2 WRITEs take ceil(len / MTU)
        // packets each (plus READ request and 3 atomics; ACKs are not counted as sent
        // requests by the requester but by the responder of b).
        let per_msg = len.div_ceil(path_mtu.bytes() as usize) as u64;
        // A loaded 2-core machine can stall a side past the test's 4 ms ACK timeout: the
        // resends that causes are not new packets (and are counted as such).
        let resent = c.retransmitted_packets - before.retransmitted_packets;
        assert_eq!(
            c.packets_sent - before.packets_sent - resent,
            4 * per_msg + 1 + 3,
            "gid {gi}: packets a sent at path MTU {} ({c:?})",
            path_mtu.bytes()
        );
        // Nothing is lost on a clean veth: no NAK, and a resend only after a timeout.
        assert_eq!(
            c.naks_received, before.naks_received,
            "no loss on a clean veth"
        );
        assert!(
            resent == 0 || c.local_ack_timeout_err > before.local_ack_timeout_err,
            "resends without a timeout on a clean veth: {c:?}"
        );
    }
    assert_eq!(da.counters().unwrap().malformed_frames_dropped, 0);
}

#[test]
#[ignore = "needs root"]
fn every_operation_ipv4_and_ipv6_gids_pmtu1024_on_a_1500_veth() {
    // GID 1 = ::ffff:192.0.2.x, GID 2 = fd00::x (GID 0 is the link-local one).
    run_pair(1500, Mtu::Mtu1024, &[1, 2], 10_000);
}

#[test]
#[ignore = "needs root"]
fn every_operation_pmtu4096_on_a_9000_veth() {
    run_pair(9000, Mtu::Mtu4096, &[1, 2], 65_536);
}

/// The single-buffer path a kernel before 6.6 takes (no `XDP_USE_SG`), forced here: on a
/// 9000 link the port offers 2048 (a frame must fit one 4 KiB chunk) instead of 4096,
/// refuses a 4096 path MTU, and carries every operation at 2048 with 64 KiB messages.
#[test]
#[ignore = "needs root"]
fn single_buffer_port_caps_the_mtu_at_2048_and_carries_every_operation() {
    let single = DeviceOptions {
        port: PortOptions {
            single_buffer: true,
            ..PortOptions::default()
        },
        ..DeviceOptions::default()
    };
    {
        let pair = VethPair::new(9000).expect("veth pair");
        let multi = open(&pair, Side::A, &DeviceOptions::default());
        assert_eq!(multi.query_port().max_mtu, Mtu::Mtu4096);
        assert_eq!(multi.query_port().active_mtu, Mtu::Mtu4096);
        drop(multi);
        let da = open(&pair, Side::A, &single);
        let db = open(&pair, Side::B, &single);
        assert_eq!(da.query_port().max_mtu, Mtu::Mtu2048);
        assert_eq!(da.query_port().active_mtu, Mtu::Mtu2048);
        let (a, b) = (end(da), end(db));
        let e =
            a.qp.connect(
                &Remote {
                    qpn: b.qp.qp_num(),
                    psn: 0,
                    gid: b.dev.query_gid(1).unwrap(),
                },
                0,
                1,
                &ConnectOpts {
                    path_mtu: Mtu::Mtu4096,
                    ..ConnectOpts::default()
                },
            )
            .unwrap_err();
        assert!(
            e.to_string().contains("exceeds the port's active MTU 2048"),
            "{e}"
        );
    }
    run_pair_with(9000, Mtu::Mtu2048, &[1, 2], 65_536, &single);
}

#[test]
#[ignore = "needs root"]
fn device_reports_gids_and_mtu_like_rxe_and_refuses_a_too_large_path_mtu() {
    let pair = VethPair::new(1500).expect("veth pair");
    let da = open(&pair, Side::A, &DeviceOptions::default());
    let db = open(&pair, Side::B, &DeviceOptions::default());
    let mac = pair.end(Side::A).mac;
    let t: Vec<String> = da
        .gid_table()
        .iter()
        .map(xrnic::verbs::netdev::gid_text)
        .collect();
    // RFC 4291 appendix A: modified EUI-64 of the MAC (U/L bit flipped, ff:fe inserted).
    let w = |x: u8, y: u8| u16::from_be_bytes([x, y]);
    let ll = std::net::Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        w(mac[0] ^ 2, mac[1]),
        w(mac[2], 0xff),
        w(0xfe, mac[3]),
        w(mac[4], mac[5]),
    )
    .to_string();
    assert_eq!(t, [ll, "::ffff:192.0.2.1".into(), "fd00::1".into()]);
    let p = da.query_port();
    assert_eq!((p.active_mtu, p.netdev_mtu), (Mtu::Mtu1024, 1500));
    assert_eq!(p.state, xrnic::verbs::PortState::Active);
    let a = end(da);
    let b = end(db);
    let e =
        a.qp.connect(
            &Remote {
                qpn: b.qp.qp_num(),
                psn: 0,
                gid: b.dev.query_gid(1).unwrap(),
            },
            0,
            1,
            &ConnectOpts {
                path_mtu: Mtu::Mtu4096,
                ..ConnectOpts::default()
            },
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("exceeds the port's active MTU 1024"),
        "{e}"
    );
    // An IPv4 source GID towards an IPv6 destination is refused, not sent.
    let e =
        a.qp.connect(
            &Remote {
                qpn: b.qp.qp_num(),
                psn: 0,
                gid: b.dev.query_gid(2).unwrap(),
            },
            0,
            1,
            &ConnectOpts::default(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("not both IPv4"), "{e}");
}

#[test]
#[ignore = "needs root"]
fn neighbour_missing_from_the_table_is_resolved_through_the_kernel() {
    let pair = VethPair::new(1500).expect("veth pair");
    let da = open(&pair, Side::A, &DeviceOptions::default());
    let db = open(&pair, Side::B, &DeviceOptions::default());
    for gi in [1usize, 2] {
        let gid = db.query_gid(gi).unwrap();
        let ip = xrnic::verbs::netdev::gid_ip(&gid).to_string();
        // Make sure the table does not have it yet.
        let _ = pair.exec(Side::A, &["ip", "neigh", "flush", "to", &ip]);
        let mac = da.resolve_dmac(&gid).expect("resolve");
        assert_eq!(mac, pair.end(Side::B).mac, "{ip}");
    }
    // An address nobody has: a clear, bounded error.
    let mut nobody = [0u8; 16];
    nobody[10] = 0xff;
    nobody[11] = 0xff;
    nobody[12..].copy_from_slice(&[192, 0, 2, 77]);
    let e = da.resolve_dmac(&nobody).unwrap_err().to_string();
    assert!(e.contains("no neighbour entry for 192.0.2.77"), "{e}");
}

#[test]
#[ignore = "needs root"]
fn one_sided_traffic_needs_no_call_from_the_server_application() {
    let pair = VethPair::new(1500).expect("veth pair");
    let (a, b) = connected(&pair, &DeviceOptions::default(), &DeviceOptions::default());
    let seed = pattern(77, REGION / 2);
    b.mr.write(0, &seed).unwrap();
    let (addr, rkey) = (b.mr.addr(), b.mr.rkey());
    // The server application parks in a thread that makes no call until told to finish.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        rx.recv().unwrap();
        b
    });
    let data = pattern(78, REGION / 2);
    a.mr.write(0, &data).unwrap();
    let mut wr = SendWr::new(1, WrOpcode::RdmaWrite);
    wr.sg_list = vec![a.mr.sge(0, (REGION / 2) as u32)];
    wr.rdma.remote_addr = addr + (REGION / 2) as u64;
    wr.rdma.rkey = rkey;
    a.qp.post_send(wr).unwrap();
    let mut wr = SendWr::new(2, WrOpcode::RdmaRead);
    wr.sg_list = vec![a.mr.sge(REGION / 2, (REGION / 2) as u32)];
    wr.rdma.remote_addr = addr;
    wr.rdma.rkey = rkey;
    a.qp.post_send(wr).unwrap();
    let wcs = wait_n(&a.cq, 2);
    ok(&wcs[0], WcOpcode::RdmaWrite);
    ok(&wcs[1], WcOpcode::RdmaRead);
    let mut got = vec![0u8; REGION / 2];
    a.mr.read(REGION / 2, &mut got).unwrap();
    assert!(got == seed, "READ of the passive server's bytes");
    tx.send(()).unwrap();
    let b = server.join().unwrap();
    let mut got = vec![0u8; REGION / 2];
    b.mr.read(REGION / 2, &mut got).unwrap();
    assert!(got == data, "WRITE into the passive server");
    assert!(
        b.cq.poll(16).is_empty(),
        "one-sided work completes nothing at the server"
    );
    let c = b.qp.counters().unwrap();
    // 512 WRITE packets at path MTU 1024 and the READ's requests (one, plus one per part
    // its READ credit split off, docs/transport.md); nothing is lost on a veth.
    // A starved driver thread (a loaded CI machine) can let A's ACK timeout (67 ms) expire
    // and A go back: B then sees those packets again, each counted as a duplicate.
    let parts = 1 + a.qp.counters().unwrap().read_requests_split;
    assert_eq!(
        c.packets_received - c.duplicate_request,
        512 + parts,
        "{c:?}"
    );
    if c.duplicate_request > 0 {
        let ca = a.qp.counters().unwrap();
        assert!(
            ca.retransmitted_packets > 0,
            "duplicates A never sent: {c:?} {ca:?}"
        );
    }
}

#[test]
#[ignore = "needs root"]
fn injected_loss_is_repaired_every_byte_right_and_counted() {
    let pair = VethPair::new(1500).expect("veth pair");
    let lossy = |seed| DeviceOptions {
        rx_drop: 0.03,
        seed,
        ..DeviceOptions::default()
    };
    let (a, b) = connected(&pair, &lossy(1), &lossy(2));
    const N: usize = 100;
    const LEN: usize = 8192;
    for i in 0..N {
        b.qp.post_recv(RecvWr {
            wr_id: i as u64,
            sg_list: vec![b.mr.sge(i * LEN, LEN as u32)],
        })
        .unwrap();
    }
    for i in 0..N {
        a.mr.write(i * LEN, &pattern(i as u32, LEN)).unwrap();
        let mut wr = SendWr::new(i as u64, WrOpcode::Send);
        wr.sg_list = vec![a.mr.sge(i * LEN, LEN as u32)];
        a.qp.post_send(wr).unwrap();
    }
    let s = wait_n(&a.cq, N);
    let r = wait_n(&b.cq, N);
    for (i, w) in s.iter().enumerate() {
        assert_eq!((w.status, w.wr_id), (WcStatus::Success, i as u64));
    }
    for (i, w) in r.iter().enumerate() {
        assert_eq!((w.status, w.wr_id), (WcStatus::Success, i as u64));
        let mut got = vec![0u8; LEN];
        b.mr.read(i * LEN, &mut got).unwrap();
        assert!(got == pattern(i as u32, LEN), "message {i}");
    }
    // And a READ of everything back over the (zeroed) sources, through the same loss.
    a.mr.with_mut(|m| m.fill(0)).unwrap();
    let mut wr = SendWr::new(999, WrOpcode::RdmaRead);
    wr.sg_list = vec![a.mr.sge(0, (N * LEN) as u32)];
    wr.rdma.remote_addr = b.mr.addr();
    wr.rdma.rkey = b.mr.rkey();
    a.qp.post_send(wr).unwrap();
    ok(&wait_n(&a.cq, 1)[0], WcOpcode::RdmaRead);
    let mut back = vec![0u8; N * LEN];
    a.mr.read(0, &mut back).unwrap();
    for i in 0..N {
        assert!(
            back[i * LEN..(i + 1) * LEN] == pattern(i as u32, LEN),
            "READ {i}"
        );
    }
    let dropped =
        a.dev.driver_stats().unwrap().fault_dropped + b.dev.driver_stats().unwrap().fault_dropped;
    let ca = a.qp.counters().unwrap();
    assert!(dropped > 0, "the injector dropped frames");
    assert!(ca.retransmitted_packets > 0, "{ca:?}");
    let cb = b.qp.counters().unwrap();
    assert!(
        cb.out_of_sequence + cb.duplicate_request + ca.local_ack_timeout_err > 0,
        "losses were noticed: {ca:?} {cb:?}"
    );
}

#[test]
#[ignore = "needs root"]
fn malformed_and_foreign_frames_on_the_wire_are_dropped_and_counted() {
    let pair = VethPair::new(1500).expect("veth pair");
    let (a, b) = connected(&pair, &DeviceOptions::default(), &DeviceOptions::default());
    let before = a.dev.counters().unwrap();
    // The peer's kernel builds Ethernet/IP/UDP; the payload (the RoCE part) is bad. The
    // XDP filter on A redirects anything to UDP 4791, so these reach the engine.
    let bad: Vec<Vec<u8>> = vec![
        vec![0x04],                                           // truncated BTH
        vec![0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 0], // BTH without ICRC
        {
            // SEND ONLY to QP 0x11 with a wrong ICRC.
            let mut v = vec![0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 1];
            v.extend_from_slice(&[0xab; 20]);
            v.extend_from_slice(&[1, 2, 3, 4]);
            v
        },
        {
            // Reserved opcode 0x1f (RC range, unassigned) with padding for an ICRC.
            let mut v = vec![0x1f, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1];
            v.extend_from_slice(&[0; 8]);
            v
        },
    ];
    let sent = pair
        .run_in(Side::B, || {
            let s = UdpSocket::bind("192.0.2.2:0").unwrap();
            for p in &bad {
                s.send_to(p, "192.0.2.1:4791").unwrap();
            }
            bad.len()
        })
        .unwrap();
    // Wait (bounded) until the driver has seen them.
    let mut after = a.dev.counters().unwrap();
    for _ in 0..500 {
        if after.malformed_frames_dropped - before.malformed_frames_dropped >= sent as u64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        after = a.dev.counters().unwrap();
    }
    assert_eq!(
        after.malformed_frames_dropped - before.malformed_frames_dropped,
        sent as u64,
        "{after:?}"
    );
    assert!(after.icrc_errors > before.icrc_errors, "{after:?}");
    // The QP is unharmed: a SEND still goes through.
    every_send_still_works(&a, &b);
}

fn every_send_still_works(a: &End, b: &End) {
    b.qp.post_recv(RecvWr {
        wr_id: 5,
        sg_list: vec![b.mr.sge(0, 64)],
    })
    .unwrap();
    a.mr.write(0, b"still alive").unwrap();
    let mut wr = SendWr::new(6, WrOpcode::Send);
    wr.sg_list = vec![a.mr.sge(0, 11)];
    a.qp.post_send(wr).unwrap();
    ok(&wait_n(&b.cq, 1)[0], WcOpcode::Recv);
    let mut got = [0u8; 11];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"still alive");
}

#[test]
#[ignore = "needs root"]
fn dropping_the_device_stops_the_driver_and_detaches_xdp() {
    let pair = VethPair::new(1500).expect("veth pair");
    let ifname = pair.end(Side::A).ifname.clone();
    let has_xdp = || {
        let out = pair
            .exec(Side::A, &["ip", "-j", "link", "show", "dev", &ifname])
            .unwrap();
        String::from_utf8_lossy(&out.stdout).contains("\"xdp\"")
    };
    assert!(!has_xdp());
    let da = open(&pair, Side::A, &DeviceOptions::default());
    assert!(has_xdp(), "XDP attached while open");
    let a = end(da.clone());
    drop(da);
    assert!(has_xdp(), "objects keep the device open");
    drop(a);
    assert!(!has_xdp(), "the last handle detaches XDP");
    // The interface is free again: a second open works.
    let again = open(&pair, Side::A, &DeviceOptions::default());
    drop(again);
    assert!(!has_xdp());
}

/// The threads of this process whose name (`comm`, 15 bytes at most) is `name`'s.
fn threads_named(name: &str) -> usize {
    let want: String = name.chars().take(15).collect();
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == want)
        })
        .count()
}

/// SO_NETNS_COOKIE (Linux 5.14, asm-generic/socket.h): a socket's network namespace, which
/// is fixed when the socket is made.
const SO_NETNS_COOKIE: libc::c_int = 71;

fn netns_cookie(fd: libc::c_int) -> Option<u64> {
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cookie`, a live u64; a stale or
    // non-socket fd only makes the call fail.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cookie)
}

/// The namespace cookie of each end of `pair`.
fn pair_cookies(pair: &VethPair) -> [u64; 2] {
    [Side::A, Side::B].map(|side| {
        pair.run_in(side, || {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("a socket in the namespace");
            netns_cookie(std::os::fd::AsRawFd::as_raw_fd(&s)).expect("SO_NETNS_COOKIE")
        })
        .expect("enter netns")
    })
}

/// The sockets this process holds in the namespaces with these cookies: this test's
/// devices only (the other tests of this file run at the same time, in their own
/// namespaces, and open and close sockets of their own).
fn sockets_held(cookies: &[u64]) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|f| f.file_name().to_str()?.parse::<libc::c_int>().ok())
        .filter(|&fd| netns_cookie(fd).is_some_and(|c| cookies.contains(&c)))
        .count()
}

/// The interface deleted under a running device (IBV_EVENT_DEVICE_FATAL,
/// src/verbs/link_watch.rs, src/proto/fatal.rs): the device raises DEVICE_FATAL once, every
/// outstanding WR completes flushed, verbs that need the device fail with
/// `VerbsError::DeviceFatal`, the driver thread and the AF_XDP socket go, and the objects
/// are still destroyed cleanly. Deleting one end of a veth deletes both: both devices go.
#[test]
#[ignore = "needs root"]
fn a_deleted_interface_makes_the_device_fatal() {
    use xrnic::verbs::{AsyncEvent, Error, PortState, VerbsError};
    let pair = VethPair::new(1500).expect("veth pair");
    let a = end(open(&pair, Side::A, &DeviceOptions::default()));
    let b = end(open(&pair, Side::B, &DeviceOptions::default()));
    // The outstanding SEND must end by the device's loss (flushed), not by its retry
    // counter: 4.096 µs * 2^20 ≈ 4.3 s per retry outlasts the link watcher's notice on a
    // loaded machine, where 4 ms (the other tests' timeout) did not.
    connect_with_timeout(&a, &b, 1, Mtu::Mtu1024, 20);
    let ifname = pair.end(Side::A).ifname.clone();
    let driver = format!("xrnic-{ifname}");
    // (Both ends' driver threads when the names are cut to the same 15 bytes.)
    assert!(threads_named(&driver) >= 1, "the driver thread runs");
    let cookies = pair_cookies(&pair);
    let sockets = sockets_held(&cookies);
    for id in 1..=3 {
        a.qp.post_recv(RecvWr {
            wr_id: id,
            sg_list: vec![a.mr.sge(0, 64)],
        })
        .unwrap();
    }
    // A SEND that b has no receive for: RNR NAKs, retried for ever (rnr_retry 7), so it
    // is still outstanding when the interface goes.
    let mut wr = SendWr::new(4, WrOpcode::Send);
    wr.sg_list = vec![a.mr.sge(0, 8)];
    a.qp.post_send(wr).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let out = pair.exec(Side::A, &["ip", "link", "del", &ifname]).unwrap();
    assert!(out.status.success(), "{out:?}");
    // PORT_ERR may come first (the kernel takes the link down before it unregisters).
    let until = std::time::Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    while !seen.contains(&AsyncEvent::DeviceFatal) {
        assert!(
            std::time::Instant::now() < until,
            "no DEVICE_FATAL: {seen:?}"
        );
        match a.dev.poll_async_event() {
            Some(e) => seen.push(e),
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    assert!(
        seen.iter()
            .all(|e| matches!(e, AsyncEvent::PortErr(1) | AsyncEvent::DeviceFatal)),
        "{seen:?}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(a.dev.poll_async_event(), None, "DEVICE_FATAL once");
    assert!(a.dev.is_fatal() && b.dev.is_fatal());
    assert_eq!(a.dev.query_port().state, PortState::Down);
    let mut wcs = wait_n(&a.cq, 4);
    wcs.sort_by_key(|w| w.wr_id);
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert!(
        wcs.iter().all(|w| w.status == WcStatus::WrFlushErr),
        "{wcs:?}"
    );
    assert_eq!(wcs[3].opcode, WcOpcode::Send);
    // The driver threads ended (both ends are gone) and the socket is closed.
    assert_eq!(threads_named(&driver), 0, "the driver thread is gone");
    // Each device's AF_XDP socket and its link watcher's netlink socket are closed.
    let left = sockets_held(&cookies);
    assert!(
        sockets >= 4 && left == 0,
        "{sockets} sockets before, {left} after"
    );
    let fatal = |r: Result<(), Error>, what: &str| match r {
        Err(Error::Verbs(VerbsError::DeviceFatal)) => {}
        r => panic!("{what}: {r:?}"),
    };
    let mut wr = SendWr::new(5, WrOpcode::Send);
    wr.sg_list = vec![a.mr.sge(0, 8)];
    fatal(a.qp.post_send(wr), "post_send");
    fatal(
        a.qp.post_recv(RecvWr {
            wr_id: 6,
            sg_list: vec![a.mr.sge(0, 8)],
        }),
        "post_recv",
    );
    fatal(a.dev.alloc_pd().map(drop), "alloc_pd");
    fatal(a.dev.create_cq(16).map(drop), "create_cq");
    let pd = &a.pd;
    fatal(pd.reg_mr(4096, Access::ALL).map(drop), "reg_mr");
    fatal(
        pd.create_qp(&QpInitAttr::new(&a.cq, &a.cq, 16)).map(drop),
        "create_qp",
    );
    let mut attr = a.qp.query().unwrap();
    attr.qp_state = xrnic::verbs::QpState::Reset;
    fatal(
        a.qp.modify(&attr, xrnic::verbs::AttrMask::STATE),
        "modify_qp",
    );
    assert!(a.cq.poll(16).is_empty(), "nothing more completes");
    // Clean-up works: every object (and the devices) dropped without a hang or a panic.
    drop(a);
    drop(b);
}

/// The RoCE part (BTH .. ICRC) of an IPv6 frame from fd00::2 port `sport` to fd00::1:4791,
/// with an ICRC valid for the headers the kernel will build (over IPv6 the ICRC masks
/// traffic class, flow label, hop limit and the UDP checksum, and there is no IP ID), so
/// a plain UDP socket can put well-formed RoCE packets on the wire.
fn roce_payload_v6(sport: u16, opcode: xrnic::wire::Opcode, dest_qp: u32) -> Vec<u8> {
    use xrnic::wire::{
        BthRepr, EthRepr, ExtHeaders, FrameRepr, IpRepr, Psn, Qpn, RoceRepr, UdpRepr,
    };
    let ip = |n: u8| {
        let mut a = [0u8; 16];
        a[0] = 0xfd;
        a[15] = n;
        a
    };
    let payload = [0x5a; 32];
    let repr = FrameRepr {
        eth: EthRepr {
            dst: [0; 6],
            src: [0; 6],
            vlan_tci: None,
        },
        ip: IpRepr::V6 {
            src: ip(2),
            dst: ip(1),
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        },
        udp: UdpRepr {
            src_port: sport,
            checksum: 0,
        },
        roce: RoceRepr {
            bth: BthRepr {
                ack_req: true,
                ..BthRepr::new(opcode, Qpn::new(dest_qp), Psn::new(0))
            },
            ext: ExtHeaders::default(),
            payload: &payload,
        },
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut buf).expect("emit");
    // Ethernet (14) + IPv6 (40) + UDP (8) are the kernel's to build.
    buf[62..n].to_vec()
}

#[test]
#[ignore = "needs root"]
fn foreign_frames_with_valid_icrcs_are_dropped_and_counted() {
    use xrnic::wire::Opcode;
    let pair = VethPair::new(1500).expect("veth pair");
    // Connected over the IPv4 GIDs: the QP's peer is ::ffff:192.0.2.2, not fd00::2.
    let (a, b) = connected(&pair, &DeviceOptions::default(), &DeviceOptions::default());
    let qpn = a.qp.qp_num().value();
    let before = a.dev.counters().unwrap();
    let qp_before = a.qp.counters().unwrap();
    let frames = [
        roce_payload_v6(5555, Opcode::RC_SEND_ONLY, 0x99), // no such QP
        roce_payload_v6(5555, Opcode::RC_SEND_ONLY, qpn),  // our QP, not its peer
        roce_payload_v6(5555, Opcode(0x24), qpn),          // UC SEND ONLY, not from the peer
    ];
    pair.run_in(Side::B, || {
        let s = UdpSocket::bind("[fd00::2]:5555").unwrap();
        for f in &frames {
            s.send_to(f, "[fd00::1]:4791").unwrap();
        }
    })
    .unwrap();
    let mut after = a.dev.counters().unwrap();
    for _ in 0..500 {
        if after.unknown_qp_dropped >= before.unknown_qp_dropped + 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        after = a.dev.counters().unwrap();
    }
    // No such QP, and (twice) not from the QP's peer: none is that QP's frame. UC is a
    // service the engine runs, so the UC frame is judged by its addresses like the RC one.
    assert_eq!(
        after.unknown_qp_dropped - before.unknown_qp_dropped,
        3,
        "{after:?}"
    );
    assert_eq!(
        after.unsupported_dropped - before.unsupported_dropped,
        0,
        "{after:?}"
    );
    let qp_after = a.qp.counters().unwrap();
    assert_eq!(
        (qp_after.packets_received, qp_after.dropped_wrong_state),
        (qp_before.packets_received, qp_before.dropped_wrong_state),
        "a frame from another address than the QP's peer is not the QP's"
    );
    // Their ICRCs were right: nothing counted as malformed.
    assert_eq!(after.icrc_errors, before.icrc_errors, "{after:?}");
    assert_eq!(
        after.malformed_frames_dropped,
        before.malformed_frames_dropped
    );
    every_send_still_works(&a, &b);
}

/// The port follows its interface's link (src/verbs/link_watch.rs): `ip link set down`
/// makes it DOWN and raises PORT_ERR, `up` makes it ACTIVE again and raises PORT_ACTIVE,
/// each once.
#[test]
#[ignore = "needs root"]
fn the_port_follows_the_link_with_port_err_and_port_active() {
    use xrnic::verbs::{AsyncEvent, PortState};
    let pair = VethPair::new(1500).expect("veth pair");
    let da = open(&pair, Side::A, &DeviceOptions::default());
    assert_eq!(da.query_port().state, PortState::Active);
    let e = pair.end(Side::A);
    let set = |how: &str| {
        let o = std::process::Command::new("ip")
            .args(["-n", &e.netns, "link", "set", "dev", &e.ifname, how])
            .output()
            .expect("run ip");
        assert!(o.status.success(), "ip link set {how}: {o:?}");
    };
    let next = || {
        let until = std::time::Instant::now() + PATIENCE;
        loop {
            if let Some(ev) = da.poll_async_event() {
                return Some(ev);
            }
            if std::time::Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    set("down");
    assert_eq!(next(), Some(AsyncEvent::PortErr(1)));
    assert_eq!(da.query_port().state, PortState::Down);
    set("up");
    assert_eq!(next(), Some(AsyncEvent::PortActive(1)));
    assert_eq!(da.query_port().state, PortState::Active);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(da.poll_async_event(), None, "one event per change");
}
