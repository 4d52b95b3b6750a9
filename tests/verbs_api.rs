//! One test suite for the public verbs API, written once and run against both backends:
//!
//! - `software::*`: xrnic's own RNIC, two devices on the in-process simulated link
//!   ([`Device::open_sim_pair`]; no root needed).
//! - `offload::*`: an RDMA device through libibverbs ([`Device::open_rdma`]), two handles
//!   on the one device talking to each other (loopback, as rxe and ConnectX do it). The
//!   device is `$XRNIC_RDMA_DEVICE` or the first one libibverbs lists. Marked
//!   `#[ignore = "needs an RDMA device"]`: run them with `--ignored offload::` where there
//!   is one (without one they fail).
//! - `offload_in_rxe_guest`: where this machine has no RDMA device (the host kernel here
//!   has no RDMA support), the `offload::*` cases run inside a Linux rxe guest of the
//!   interop harness (`interop/run-offload.sh -t api`, which copies this test binary and
//!   `xrnic` into the guest and runs them there with `--ignored` on rxe0). Root and qemu
//!   needed: `#[ignore = "needs root"]`, run by `make test` as root (docs/testing.md).
//!
//! Every case checks delivered bytes and completions (status, opcode, length, immediate),
//! not just that calls return.

#[path = "common/bin_path.rs"]
mod bin_path;
use bin_path::xrnic_bin;

use std::time::Duration;

use xrnic::verbs::{
    Access, AtomicInfo, AttrMask, Backend, ConnectOpts, Cq, Device, GidType, Mr, Mtu, Qp, QpAttr,
    QpInitAttr, QpState, RdmaInfo, RecvWr, Remote, SendWr, WcOpcode, WcStatus, WorkCompletion,
    WrOpcode,
};

/// Long enough for a TCG guest's rxe; nothing here depends on it being short.
const PATIENCE: Duration = Duration::from_secs(30);

struct End {
    dev: Device,
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn end(dev: &Device, len: usize, access: Access) -> End {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256).unwrap();
    let mr = pd.reg_mr(len, access).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 64)).unwrap();
    End {
        dev: dev.clone(),
        cq,
        mr,
        qp,
    }
}

/// The first IPv4-mapped RoCE v2 GID: both backends have one on 192.0.2.x.
fn gid_index(d: &Device) -> u8 {
    d.gid_table()
        .iter()
        .enumerate()
        .position(|(i, g)| {
            g[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
                && d.gid_type(i) == Some(GidType::RoceV2)
        })
        .expect("an IPv4 RoCE v2 GID") as u8
}

fn opts() -> ConnectOpts {
    ConnectOpts {
        access: Access::ALL,
        path_mtu: Mtu::Mtu1024,
        timeout: 14,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ..ConnectOpts::default()
    }
}

fn connect_with(a: &End, b: &End, oa: &ConnectOpts, ob: &ConnectOpts) {
    let (ga, gb) = (gid_index(&a.dev), gid_index(&b.dev));
    let gid = |d: &Device, i: u8| d.query_gid(i.into()).unwrap();
    a.qp.connect(
        &Remote {
            qpn: b.qp.qp_num(),
            psn: 0x10_0000,
            gid: gid(&b.dev, gb),
        },
        0x20_0000,
        ga,
        oa,
    )
    .unwrap();
    b.qp.connect(
        &Remote {
            qpn: a.qp.qp_num(),
            psn: 0x20_0000,
            gid: gid(&a.dev, ga),
        },
        0x10_0000,
        gb,
        ob,
    )
    .unwrap();
}

fn pair(a: &Device, b: &Device, len: usize) -> (End, End) {
    let (x, y) = (end(a, len, Access::ALL), end(b, len, Access::ALL));
    connect_with(&x, &y, &opts(), &opts());
    (x, y)
}

/// Exactly one completion.
fn one(cq: &Cq) -> WorkCompletion {
    let w = cq.wait(1, PATIENCE);
    assert_eq!(w.len(), 1, "no completion within {PATIENCE:?}");
    w[0]
}

fn send_wr(id: u64, op: WrOpcode, mr: &Mr, off: usize, len: u32) -> SendWr {
    let mut w = SendWr::new(id, op);
    w.sg_list = vec![mr.sge(off, len)];
    w
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn device_and_port_are_described(a: &Device, _b: &Device) {
    let d = a.query_device();
    assert_eq!(d.phys_port_cnt, 1);
    assert!(
        d.max_qp_wr >= 64 && d.max_sge >= 2 && d.max_cqe >= 256,
        "{d:?}"
    );
    let p = a.query_port();
    assert_eq!(p.state, xrnic::verbs::PortState::Active);
    assert!(p.active_mtu.bytes() >= 1024, "{p:?}");
    let gi = gid_index(a);
    assert!(a.query_gid(usize::from(gi)).is_some());
    assert_eq!(a.query_gid(a.gid_table().len()), None);
}

fn send_with_immediate_and_two_sges(a: &Device, b: &Device) {
    let (x, y) = pair(a, b, 8192);
    let msg = pattern(3000, 1);
    x.mr.write(0, &msg[..1000]).unwrap();
    x.mr.write(4096, &msg[1000..]).unwrap();
    y.qp.post_recv(RecvWr {
        wr_id: 77,
        sg_list: vec![y.mr.sge(100, 4000)],
    })
    .unwrap();
    let mut w = SendWr::new(5, WrOpcode::SendWithImm);
    w.sg_list = vec![x.mr.sge(0, 1000), x.mr.sge(4096, 2000)];
    w.imm_data = 0xdead_beef;
    x.qp.post_send(w).unwrap();
    let r = one(&y.cq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len, r.imm_data),
        (
            77,
            WcStatus::Success,
            WcOpcode::Recv,
            3000,
            Some(0xdead_beef)
        )
    );
    assert_eq!(r.qp_num, y.qp.qp_num());
    let s = one(&x.cq);
    assert_eq!(
        (s.wr_id, s.status, s.opcode),
        (5, WcStatus::Success, WcOpcode::Send)
    );
    let mut got = vec![0u8; 3000];
    y.mr.read(100, &mut got).unwrap();
    assert_eq!(got, msg);
}

fn write_and_write_with_immediate(a: &Device, b: &Device) {
    let (x, y) = pair(a, b, 16384);
    let data = pattern(10_000, 7);
    x.mr.write(0, &data).unwrap();
    let mut w = send_wr(1, WrOpcode::RdmaWrite, &x.mr, 0, 10_000);
    w.rdma = RdmaInfo {
        remote_addr: y.mr.addr() + 2000,
        rkey: y.mr.rkey(),
    };
    x.qp.post_send(w).unwrap();
    let s = one(&x.cq);
    assert_eq!(
        (s.status, s.opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let mut got = vec![0u8; 10_000];
    y.mr.read(2000, &mut got).unwrap();
    assert_eq!(got, data);
    // WRITE with immediate consumes a receive WQE and reports the immediate there.
    y.qp.post_recv(RecvWr {
        wr_id: 9,
        sg_list: vec![],
    })
    .unwrap();
    let mut w = send_wr(2, WrOpcode::RdmaWriteWithImm, &x.mr, 0, 16);
    w.imm_data = 0x0102_0304;
    w.rdma = RdmaInfo {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    x.qp.post_send(w).unwrap();
    let r = one(&y.cq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.imm_data),
        (
            9,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            Some(0x0102_0304)
        )
    );
    assert_eq!(one(&x.cq).status, WcStatus::Success);
}

fn read_brings_remote_bytes(a: &Device, b: &Device) {
    let (x, y) = pair(a, b, 16384);
    let data = pattern(5000, 3);
    y.mr.write(1000, &data).unwrap();
    let mut w = send_wr(3, WrOpcode::RdmaRead, &x.mr, 8000, 5000);
    w.rdma = RdmaInfo {
        remote_addr: y.mr.addr() + 1000,
        rkey: y.mr.rkey(),
    };
    x.qp.post_send(w).unwrap();
    let s = one(&x.cq);
    assert_eq!(
        (s.wr_id, s.status, s.opcode, s.byte_len),
        (3, WcStatus::Success, WcOpcode::RdmaRead, 5000)
    );
    let mut got = vec![0u8; 5000];
    x.mr.read(8000, &mut got).unwrap();
    assert_eq!(got, data);
}

fn atomics_return_the_old_value(a: &Device, b: &Device) {
    let (x, y) = pair(a, b, 4096);
    y.mr.write(64, &40u64.to_ne_bytes()).unwrap();
    let mut w = send_wr(4, WrOpcode::AtomicFetchAndAdd, &x.mr, 0, 8);
    w.atomic = AtomicInfo {
        remote_addr: y.mr.addr() + 64,
        rkey: y.mr.rkey(),
        compare_add: 2,
        swap: 0,
    };
    x.qp.post_send(w).unwrap();
    let s = one(&x.cq);
    assert_eq!(
        (s.status, s.opcode, s.byte_len),
        (WcStatus::Success, WcOpcode::FetchAdd, 8)
    );
    let mut old = [0u8; 8];
    x.mr.read(0, &mut old).unwrap();
    assert_eq!(u64::from_ne_bytes(old), 40);
    let mut w = send_wr(5, WrOpcode::AtomicCmpAndSwp, &x.mr, 8, 8);
    w.atomic = AtomicInfo {
        remote_addr: y.mr.addr() + 64,
        rkey: y.mr.rkey(),
        compare_add: 42,
        swap: 1000,
    };
    x.qp.post_send(w).unwrap();
    let s = one(&x.cq);
    assert_eq!(
        (s.status, s.opcode),
        (WcStatus::Success, WcOpcode::CompSwap)
    );
    x.mr.read(8, &mut old).unwrap();
    assert_eq!(u64::from_ne_bytes(old), 42);
    let mut now = [0u8; 8];
    y.mr.read(64, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 1000);
}

fn a_write_without_remote_write_right_is_a_remote_access_error(a: &Device, b: &Device) {
    let x = end(a, 4096, Access::ALL);
    let y = end(b, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ);
    connect_with(&x, &y, &opts(), &opts());
    y.mr.write(0, &[5; 16]).unwrap();
    let mut w = send_wr(6, WrOpcode::RdmaWrite, &x.mr, 0, 16);
    w.rdma = RdmaInfo {
        remote_addr: y.mr.addr(),
        rkey: y.mr.rkey(),
    };
    x.qp.post_send(w).unwrap();
    let s = one(&x.cq);
    assert_eq!((s.wr_id, s.status), (6, WcStatus::RemAccessErr));
    let mut got = [0u8; 16];
    y.mr.read(0, &mut got).unwrap();
    assert_eq!(got, [5; 16], "the refused WRITE changed nothing");
    // The requester's QP is in the error state now.
    assert_eq!(x.qp.query().unwrap().qp_state, QpState::Err);
}

fn a_send_without_receive_and_no_rnr_retry_fails(a: &Device, b: &Device) {
    let x = end(a, 4096, Access::ALL);
    let y = end(b, 4096, Access::ALL);
    let o = ConnectOpts {
        rnr_retry: 0,
        ..opts()
    };
    connect_with(&x, &y, &o, &opts());
    x.qp.post_send(send_wr(7, WrOpcode::Send, &x.mr, 0, 8))
        .unwrap();
    let s = one(&x.cq);
    assert_eq!((s.wr_id, s.status), (7, WcStatus::RnrRetryExcErr));
}

fn query_qp_reports_what_connect_set(a: &Device, b: &Device) {
    let (x, y) = pair(a, b, 4096);
    let q = x.qp.query().unwrap();
    assert_eq!(q.qp_state, QpState::Rts);
    assert_eq!(q.dest_qp_num, y.qp.qp_num());
    assert_eq!(q.path_mtu, Mtu::Mtu1024);
    assert_eq!(q.sq_psn.value(), 0x20_0000);
    assert_eq!(q.rq_psn.value(), 0x10_0000);
    assert_eq!((q.timeout, q.retry_cnt, q.rnr_retry), (14, 7, 7));
    assert_eq!((q.max_rd_atomic, q.max_dest_rd_atomic), (4, 4));
    assert!(q.qp_access_flags.contains(Access::REMOTE_WRITE));
}

fn refused_verbs_are_errors(a: &Device, _b: &Device) {
    let x = end(a, 4096, Access::ALL);
    // RESET -> RTS skips two states.
    let attr = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    assert!(x.qp.modify(&attr, AttrMask::STATE).is_err());
    assert_eq!(x.qp.query().unwrap().qp_state, QpState::Reset);
    // Posting a send in RESET is refused.
    assert!(
        x.qp.post_send(send_wr(1, WrOpcode::Send, &x.mr, 0, 4))
            .is_err()
    );
    // A range past the region.
    let mut buf = [0u8; 8];
    assert!(x.mr.read(4090, &mut buf).is_err());
    // Nothing completes: a wait times out empty.
    assert!(x.cq.wait(1, Duration::from_millis(50)).is_empty());
    assert!(x.cq.poll(4).is_empty());
}

fn many_messages_complete_in_order(a: &Device, b: &Device) {
    let (x, y) = pair(a, b, 64 * 256);
    for i in 0..32u64 {
        y.qp.post_recv(RecvWr {
            wr_id: 1000 + i,
            sg_list: vec![y.mr.sge(i as usize * 256, 256)],
        })
        .unwrap();
    }
    for i in 0..32usize {
        x.mr.write(i * 256, &pattern(200, i as u8)).unwrap();
        x.qp.post_send(send_wr(i as u64, WrOpcode::Send, &x.mr, i * 256, 200))
            .unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 32 {
        let w = y.cq.wait(32, PATIENCE);
        assert!(!w.is_empty(), "only {} of 32 receives", got.len());
        got.extend(w);
    }
    for (i, w) in got.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status, w.byte_len),
            (1000 + i as u64, WcStatus::Success, 200)
        );
        let mut m = vec![0u8; 200];
        y.mr.read(i * 256, &mut m).unwrap();
        assert_eq!(m, pattern(200, i as u8));
    }
    let mut sent = 0;
    while sent < 32 {
        let w = x.cq.wait(32, PATIENCE);
        assert!(!w.is_empty());
        assert!(w.iter().all(|c| c.status == WcStatus::Success));
        sent += w.len();
    }
}

/// `Mr::with` / `with_mut` lend a copy and hold no lock while the closure runs (a verb
/// called from the closure would otherwise deadlock), the same on both backends: verbs work inside them, and `with_mut` writes back
/// only the bytes it changed, so a remote WRITE into other bytes meanwhile is kept.
fn verbs_work_inside_mr_with_and_with_mut(a: &Device, b: &Device) {
    let (x, y) = pair(a, b, 8192);
    x.mr.write(0, b"lent").unwrap();
    let st =
        x.mr.with(|bytes| {
            assert_eq!(&bytes[..4], b"lent");
            y.qp.post_recv(RecvWr {
                wr_id: 1,
                sg_list: vec![y.mr.sge(0, 64)],
            })
            .unwrap();
            x.qp.post_send(send_wr(2, WrOpcode::Send, &x.mr, 0, 4))
                .unwrap();
            (
                one(&x.cq).status,
                one(&y.cq).status,
                x.qp.query().unwrap().qp_state,
            )
        })
        .unwrap();
    assert_eq!(st, (WcStatus::Success, WcStatus::Success, QpState::Rts));
    let data = pattern(64, 9);
    x.mr.write(1000, &data).unwrap();
    y.mr.with_mut(|bytes| {
        bytes[..3].copy_from_slice(b"own");
        let mut w = send_wr(3, WrOpcode::RdmaWrite, &x.mr, 1000, 64);
        w.rdma = RdmaInfo {
            remote_addr: y.mr.addr() + 4000,
            rkey: y.mr.rkey(),
        };
        x.qp.post_send(w).unwrap();
        assert_eq!(one(&x.cq).status, WcStatus::Success);
    })
    .unwrap();
    let mut got = vec![0u8; 64];
    y.mr.read(4000, &mut got).unwrap();
    assert_eq!(got, data, "the remote WRITE was overwritten by with_mut");
    let mut own = [0u8; 4];
    y.mr.read(0, &mut own).unwrap();
    assert_eq!(&own, b"ownt", "with_mut's change, and the SEND's last byte");
}

fn backend_is_what_was_opened(a: &Device, _b: &Device) {
    let want = if a.name().starts_with("xrnic_") {
        Backend::Software
    } else {
        Backend::Offload
    };
    assert_eq!(a.backend(), want);
    if want == Backend::Offload {
        // What the offload backend lacks is an error, not a made-up answer.
        let g = a.query_gid(gid_index(a).into()).unwrap();
        assert!(matches!(
            a.resolve_dmac(&g),
            Err(xrnic::verbs::Error::Unsupported { .. })
        ));
        // The engine's counters do not exist there: an error, never zeros.
        let unsupported = |r: Result<(), xrnic::verbs::Error>| {
            matches!(r, Err(xrnic::verbs::Error::Unsupported { .. }))
        };
        assert!(unsupported(a.counters().map(drop)));
        assert!(unsupported(a.driver_stats().map(drop)));
        assert!(unsupported(a.io_stats().map(drop)));
    } else {
        a.counters().unwrap();
        a.driver_stats().unwrap();
        a.io_stats().unwrap();
    }
}

fn sim() -> (Device, Device) {
    Device::open_sim_pair().unwrap()
}

/// The RDMA device of this machine (see the module doc); none is a failure.
fn rdma() -> (Device, Device) {
    let name = match std::env::var("XRNIC_RDMA_DEVICE") {
        Ok(n) => n,
        Err(_) => match xrnic::verbs::list_devices().rdma {
            Ok(v) if !v.is_empty() => v[0].clone(),
            other => panic!(
                "no RDMA device on this machine ({other:?}); offload_in_rxe_guest runs these \
                 cases in an rxe guest"
            ),
        },
    };
    let open = || Device::open_rdma(&name).unwrap_or_else(|e| panic!("open {name}: {e}"));
    (open(), open())
}

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        /// How many cases the suite has (each runs once per backend).
        const CASES: usize = [$(stringify!($case)),*].len();
        mod software {
            $(#[test]
            fn $case() {
                let (a, b) = super::sim();
                super::$case(&a, &b);
            })*
        }
        mod offload {
            $(#[test]
            #[ignore = "needs an RDMA device"]
            fn $case() {
                let (a, b) = super::rdma();
                super::$case(&a, &b);
            })*
        }
    };
}

suite!(
    device_and_port_are_described,
    send_with_immediate_and_two_sges,
    write_and_write_with_immediate,
    read_brings_remote_bytes,
    atomics_return_the_old_value,
    a_write_without_remote_write_right_is_a_remote_access_error,
    a_send_without_receive_and_no_rnr_retry_fails,
    query_qp_reports_what_connect_set,
    refused_verbs_are_errors,
    many_messages_complete_in_order,
    verbs_work_inside_mr_with_and_with_mut,
    backend_is_what_was_opened,
);

/// Run `offload::*` in an rxe guest (module doc). Where this machine has an RDMA device,
/// `make test` runs `offload::*` on it as well (docs/testing.md).
#[test]
#[ignore = "needs root"]
fn offload_in_rxe_guest() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let me = std::env::current_exe().unwrap();
    let outdir = format!("{dir}/target/interop/offload-api");
    let _ = std::fs::remove_file(format!("{outdir}/A.console"));
    let out = std::process::Command::new(format!("{dir}/interop/run-offload.sh"))
        .args(["-o", &outdir, "-t", "api"])
        .env("XRNIC", xrnic_bin())
        .env("XRNIC_API_TEST", &me)
        .output()
        .expect("run interop/run-offload.sh");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the suite failed in the rxe guest:\n{text}"
    );
    // The guest ran every case of the suite on rxe0, not zero of them.
    let console = std::fs::read_to_string(format!("{outdir}/A.console")).unwrap_or_default();
    assert!(
        console.contains(&format!("test result: ok. {CASES} passed")),
        "expected the {CASES} offload cases to pass in the guest:\n{text}\n{console}"
    );
}
