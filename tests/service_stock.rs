//! The device service on one interface (docs/rnic.md "One device, many processes"): the
//! service (`xrnic up IF`, root) on one end of a veth pair, and Debian's stock rdma-core /
//! perftest tools as an unprivileged user (`setpriv --reuid=nobody`) through `xrnic exec`,
//! server and client on the same device (their traffic loops back inside the driver);
//! several pairs at once; kill -9 of a client; a client that writes garbage into its
//! shared rings. Root tests
//! (`#[ignore = "needs root"]`, docs/testing.md). The library must be built
//! (`cargo build --workspace`).

mod common;
mod service_support;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{all_output, retry_perftest, text};
use service_support::{RcPair, Svc, out};
use xrnic_netns::Side;
#[test]
#[cfg_attr(
    not(any(xrnic_no_ibverbs_utils, xrnic_no_perftest)),
    ignore = "needs root"
)]
#[cfg_attr(
    any(xrnic_no_ibverbs_utils, xrnic_no_perftest),
    ignore = "needs root and ibverbs-utils and perftest"
)]
fn stock_tools_as_nobody_server_and_client_on_one_device() {
    let s = Svc::start();
    let o = s
        .root(&["devinfo", "--netdev", s.ifname()])
        .output()
        .unwrap();
    assert!(out(&o).contains("\t\t\tservice:\t\tpid "), "{}", text(&o));
    let (_, c) = s.pair_run(
        "ibv_rc_pingpong",
        &["-g", "1", "-n", "200", "-s", "4096", "-c"],
        18515,
    );
    assert!(out(&c).contains("200 iters in"), "{}", text(&c));
    // The ibv_wr_* API (-N) and an extended CQ with completion timestamps (-t) through
    // the service.
    let (sv, c) = s.pair_run(
        "ibv_rc_pingpong",
        &["-g", "1", "-n", "100", "-s", "1024", "-c", "-N", "-t"],
        18518,
    );
    for o in [&sv, &c] {
        assert!(
            out(o).contains("100 iters in")
                && out(o).contains("Max receive completion clock cycles"),
            "{}",
            text(o)
        );
    }
    let (_, c) = s.pair_run(
        "ib_write_bw",
        &["-x", "1", "-n", "200", "-s", "65536"],
        18516,
    );
    assert!(out(&c).contains("65536      200"), "{}", text(&c));
    let (_, c) = s.pair_run("ib_read_lat", &["-x", "1", "-n", "200"], 18517);
    assert!(out(&c).contains("t_typical"), "{}", text(&c));
    // Everything the tools made went with them.
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
#[cfg_attr(not(xrnic_no_perftest), ignore = "needs root")]
#[cfg_attr(xrnic_no_perftest, ignore = "needs root and perftest")]
fn four_send_bw_pairs_at_once() {
    let s = Svc::start();
    // All four again (bounded) when perftest refused to measure in one of them: its own
    // clock calibration fails on a busy machine (common::retry_perftest).
    let outputs = retry_perftest(
        "four ib_send_bw pairs",
        || {
            let pairs: Vec<_> = (0..4)
                .map(|i| {
                    s.pair_spawn(
                        "ib_send_bw",
                        &["-x", "1", "-n", "300", "-s", "8192"],
                        18520 + i,
                    )
                })
                .collect();
            pairs
                .into_iter()
                .map(|(sv, cl)| {
                    (
                        cl.wait_with_output().unwrap(),
                        sv.wait_with_output().unwrap(),
                    )
                })
                .collect::<Vec<_>>()
        },
        |o| o.iter().map(|(c, sv)| all_output(&[c, sv])).collect(),
    );
    for (c, sv) in outputs {
        assert!(sv.status.success(), "server: {}", text(&sv));
        assert!(c.status.success(), "client: {}", text(&c));
        assert!(out(&c).contains("8192       300"), "{}", text(&c));
    }
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
#[cfg_attr(
    not(any(xrnic_no_ibverbs_utils, xrnic_no_perftest)),
    ignore = "needs root"
)]
#[cfg_attr(
    any(xrnic_no_ibverbs_utils, xrnic_no_perftest),
    ignore = "needs root and ibverbs-utils and perftest"
)]
fn kill_9_of_a_client_frees_its_resources_and_the_next_client_is_served() {
    let s = Svc::start();
    // A long transfer, so that the kill lands mid-transfer.
    let (server, mut client) = s.pair_spawn(
        "ib_write_bw",
        &["-x", "1", "-n", "1000000", "-s", "4096"],
        18530,
    );
    // Both tools hold a QP once they are connected.
    let end = Instant::now() + Duration::from_secs(60);
    // (perftest's server stops at RTR for WRITE; the client, which writes, is in RTS.)
    let victim = loop {
        let r = s.res();
        let qps = |state: &str| -> Vec<i64> {
            r.iter()
                .filter(|o| o["kind"] == "qp" && o["comm"] == "ib_write_bw" && o["state"] == state)
                .map(|o| o["pid"].as_i64().unwrap())
                .collect()
        };
        if let ([c], [_]) = (&qps("RTS")[..], &qps("RTR")[..]) {
            break *c;
        }
        assert!(Instant::now() < end, "the tools never connected: {r:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let kinds = |pid: i64| {
        let mut k: Vec<String> = s
            .res()
            .iter()
            .filter(|o| o["pid"] == pid)
            .map(|o| o["kind"].as_str().unwrap().to_string())
            .collect();
        k.sort();
        k.dedup();
        k
    };
    assert_eq!(kinds(victim), ["cq", "mr", "pd", "qp"], "{:?}", s.res());
    std::thread::sleep(Duration::from_millis(300));
    let killed = Instant::now();
    let st = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let mut gone = false;
    while killed.elapsed() < Duration::from_secs(1) {
        if kinds(victim).is_empty() {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        gone,
        "the killed client's resources are still there after 1 s: {:?}",
        s.res()
    );
    let _ = client.child().wait();
    // Its peer is gone: the server is ended here (perftest's server waits on TCP).
    drop(server);
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
    // The service goes on serving.
    let (_, c) = s.pair_run("ibv_rc_pingpong", &["-g", "1", "-n", "50"], 18531);
    assert!(out(&c).contains("50 iters in"), "{}", text(&c));
}

#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn garbage_in_a_clients_rings_stops_neither_the_service_nor_other_clients() {
    use xrnic::io::shm::Ring;
    use xrnic::ipc;
    use xrnic::verbs::{AttrMask, Device, QpAttr, QpInitAttr, QpState, RecvWr};
    let s = Svc::start();
    let ifname = s.ifname().to_string();
    // Other clients: a stock ping-pong pair, running while the garbage flows.
    let (server, client) = s.pair_spawn("ibv_rc_pingpong", &["-g", "1", "-n", "400"], 18540);
    let bad_slots = s
        .pair
        .run_in(Side::A, || {
            let before = memfds();
            let dev = Device::open(&ifname).unwrap();
            assert!(
                dev.service_pid().is_some(),
                "the device goes through the service"
            );
            let pd = dev.alloc_pd().unwrap();
            let cq = dev.create_cq(16).unwrap();
            let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 16)).unwrap();
            // INIT: a receive posted there is queued on the ring and rings the doorbell
            // (in RESET the client refuses it at once, src/verbs/remote.rs).
            let init = QpAttr {
                qp_state: QpState::Init,
                ..QpAttr::default()
            };
            let mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
            qp.modify(&init, mask | AttrMask::ACCESS_FLAGS).unwrap();
            // This process's submission ring, mapped a second time.
            let fd = memfds()
                .into_iter()
                .find(|f| !before.contains(f))
                .expect("the client's submission ring");
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("/proc/self/fd/{fd}"))
                .unwrap();
            let ring = Ring::map(file.into(), ipc::SQ_SLOTS, ipc::SQ_SLOT_BYTES).unwrap();
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for round in 0..200 {
                for _ in 0..50 {
                    let mut w = [0u64; ipc::SQ_WORDS];
                    for v in &mut w {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        *v = x;
                    }
                    // Some slots claim to be sends or receives of our QP with garbage
                    // SGEs and opcodes; the rest is noise.
                    if round % 2 == 0 {
                        w[0] = (w[0] & !0xff) | (1 + (x & 1));
                        w[0] &= !(0xf0 << 8);
                        w[1] = u64::from(qp.qp_num().value());
                    }
                    let _ = ring.push(&w);
                }
                match round % 10 {
                    // Indices far ahead: the service resets the ring.
                    0 => ring.poke_producer(ring.producer().wrapping_add(1 << 20)),
                    // Within the capacity: the service reads stale slots.
                    5 => ring.poke_producer(ring.producer().wrapping_add(3000)),
                    _ => {}
                }
                // A legitimate post rings the doorbell (an empty receive: taken, or
                // refused once the receive queue is full: an error completion, not a
                // hang).
                let _ = qp.post_recv(RecvWr {
                    wr_id: round,
                    sg_list: vec![],
                });
            }
            // The service still answers this client.
            let pd2 = dev.alloc_pd().unwrap();
            drop(pd2);
            let doc = xrnic_cli::cli::service::res_of(&ifname).unwrap().unwrap();
            let me = std::process::id() as i32;
            doc.clients.iter().find(|c| c.pid == me).unwrap().bad_slots
        })
        .unwrap();
    assert!(bad_slots > 0, "the garbage was seen and dropped");
    let (c, sv) = (
        client.wait_with_output().unwrap(),
        server.wait_with_output().unwrap(),
    );
    assert!(sv.status.success(), "server: {}", text(&sv));
    assert!(c.status.success(), "client: {}", text(&c));
    assert!(out(&c).contains("400 iters in"), "{}", text(&c));
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// This process's descriptors that are memfds.
fn memfds() -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let link = std::fs::read_link(e.path()).unwrap_or_default();
        if link.to_string_lossy().starts_with("/memfd:xrnic-sq") {
            if let Ok(n) = e.file_name().to_string_lossy().parse() {
                v.push(n);
            }
        }
    }
    v
}

/// The Rust API through the service: two clients (two connections of this process), one
/// QP each, connected to each other on the device's own GID (loopback): SEND, RDMA
/// WRITE, RDMA READ and FETCH_ADD, every byte checked in the clients' own memory.
#[test]
#[ignore = "needs root"]
fn rust_api_clients_talk_through_the_service_every_operation() {
    use xrnic::verbs::{RecvWr, SendWr, WcStatus, WrOpcode};
    let s = Svc::start();
    let ifname = s.ifname().to_string();
    s.pair
        .run_in(Side::A, || {
            let RcPair {
                a,
                b,
                ca,
                cb,
                ma,
                mb,
                qa,
                qb,
            } = RcPair::connect(&ifname);
            assert!(a.service_pid().is_some() && b.service_pid().is_some());
            let wait = |cq: &xrnic::verbs::Cq| {
                let wc = cq.wait(1, Duration::from_secs(10));
                assert_eq!(wc.len(), 1, "a completion");
                assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
                wc[0]
            };
            // SEND
            qb.post_recv(RecvWr {
                wr_id: 1,
                sg_list: vec![mb.sge(0, 64)],
            })
            .unwrap();
            ma.write(0, b"hello service").unwrap();
            let mut wr = SendWr::new(2, WrOpcode::Send);
            wr.sg_list = vec![ma.sge(0, 13)];
            qa.post_send(wr).unwrap();
            assert_eq!(wait(&cb).byte_len, 13);
            wait(&ca);
            let mut got = [0u8; 13];
            mb.read(0, &mut got).unwrap();
            assert_eq!(&got, b"hello service");
            // RDMA WRITE
            ma.write(100, b"one-sided").unwrap();
            let mut wr = SendWr::new(3, WrOpcode::RdmaWrite);
            wr.sg_list = vec![ma.sge(100, 9)];
            wr.rdma.remote_addr = mb.addr() + 1000;
            wr.rdma.rkey = mb.rkey();
            qa.post_send(wr).unwrap();
            wait(&ca);
            let mut got = [0u8; 9];
            mb.read(1000, &mut got).unwrap();
            assert_eq!(&got, b"one-sided");
            // RDMA READ
            mb.write(2000, b"read me").unwrap();
            let mut wr = SendWr::new(4, WrOpcode::RdmaRead);
            wr.sg_list = vec![ma.sge(2000, 7)];
            wr.rdma.remote_addr = mb.addr() + 2000;
            wr.rdma.rkey = mb.rkey();
            qa.post_send(wr).unwrap();
            wait(&ca);
            let mut got = [0u8; 7];
            ma.read(2000, &mut got).unwrap();
            assert_eq!(&got, b"read me");
            // FETCH_ADD
            mb.write(3000, &41u64.to_ne_bytes()).unwrap();
            let mut wr = SendWr::new(5, WrOpcode::AtomicFetchAndAdd);
            wr.sg_list = vec![ma.sge(3000, 8)];
            wr.atomic.remote_addr = mb.addr() + 3000;
            wr.atomic.rkey = mb.rkey();
            wr.atomic.compare_add = 1;
            qa.post_send(wr).unwrap();
            wait(&ca);
            let (mut old, mut new) = ([0u8; 8], [0u8; 8]);
            ma.read(3000, &mut old).unwrap();
            mb.read(3000, &mut new).unwrap();
            assert_eq!((u64::from_ne_bytes(old), u64::from_ne_bytes(new)), (41, 42));
        })
        .unwrap();
    let left = s.wait_empty(Duration::from_secs(1));
    assert!(left.is_empty(), "left behind: {left:?}");
}
