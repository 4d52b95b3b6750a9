//! Memory of a process that died (a killed device-service client, src/service) before its
//! resources were torn down: its QP behaves as a destroyed one towards the peer (no NAK,
//! the peer's retries go unanswered, `RETRY_EXC_ERR`), and nothing of it reaches the wire
//! (docs/transport.md, "Memory of another process").

use xrnic::proto::{Access, QpState, RecvWr, SendFlags, SendWr, Sge, UserMem, WcStatus, WrOpcode};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair, RcPair};

/// A child that was killed and is not reaped yet: its pid stays reserved (no other
/// process can get it) while its memory is gone, as a killed service client's is before
/// its socket closes. Reaped when dropped.
struct Zombie(std::process::Child);

impl Zombie {
    fn new() -> Zombie {
        let mut c = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("spawn sleep");
        c.kill().expect("kill sleep");
        let stat = format!("/proc/{}/stat", c.id());
        for _ in 0..2000 {
            // Field 3 of /proc/PID/stat, after the parenthesised name, is the state.
            let st = std::fs::read_to_string(&stat).unwrap_or_default();
            if st.rsplit(") ").next().is_some_and(|r| r.starts_with('Z')) {
                return Zombie(c);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _ = c.wait();
        panic!("child never became a zombie");
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Zombie {
    fn drop(&mut self) {
        let _ = self.0.wait();
    }
}

#[test]
fn a_copy_into_a_dead_process_marks_the_region_gone() {
    let z = Zombie::new();
    let m = UserMem::remote(z.pid(), 0x10000, 64).unwrap();
    assert!(!m.owner_gone());
    assert!(!m.write(0, b"abc"), "nothing to write into");
    assert!(m.owner_gone(), "ESRCH is remembered");
    let mut got = [0u8; 3];
    assert!(!m.read(0, &mut got));
    assert!(m.owner_gone());
    // An unmapped page of a live process (ours) is a fault, not a death.
    let live = UserMem::remote(std::process::id() as i32, 4096, 64).unwrap();
    assert!(!live.write(0, b"x"));
    assert!(!live.owner_gone());
}

/// Where the zombie's "memory" sits: any address works, the process has none left.
const IOVA: u64 = 0x10000;

fn settle(p: &mut Pair) {
    let limit = p.now + std::time::Duration::from_secs(2);
    p.run_until(limit, |_| false);
}

fn one_wc(p: &mut Pair, c: &RcPair) -> WcStatus {
    let mut wcs = vec![];
    p.a.poll_cq(c.cq_a, 8, &mut wcs);
    assert_eq!(wcs.len(), 1, "one completion: {wcs:?}");
    wcs[0].status
}

/// Each operation that makes B's responder touch memory of a dead process: B answers
/// nothing, moves its QP to ERR, and A's WR ends in retries exhausted, not in a NAK.
#[test]
fn a_request_into_a_dead_processs_memory_goes_unanswered() {
    let ops = [
        WrOpcode::RdmaWrite,
        WrOpcode::Send,
        WrOpcode::RdmaRead,
        WrOpcode::AtomicFetchAndAdd,
    ];
    for op in ops {
        let z = Zombie::new();
        let mut p = Pair::new(LinkConfig::default(), 1);
        let c = p.connect(&ConnectOpts::default()).unwrap();
        let dead = UserMem::remote(z.pid(), IOVA, 4096).unwrap();
        let mr = p.b.reg_user_mr(c.pd_b, dead, IOVA, Access::ALL).unwrap();
        if op == WrOpcode::Send {
            let sg_list = vec![Sge {
                addr: IOVA,
                length: 4096,
                lkey: mr.lkey,
            }];
            p.b.post_recv(c.qp_b, RecvWr { wr_id: 1, sg_list }).unwrap();
        }
        let src = p.a.reg_mr(c.pd_a, 4096, Access::ALL).unwrap();
        let mut w = SendWr::new(7, op);
        w.sg_list = vec![Sge {
            addr: src.addr,
            length: if op == WrOpcode::AtomicFetchAndAdd {
                8
            } else {
                64
            },
            lkey: src.lkey,
        }];
        w.send_flags = SendFlags::SIGNALED;
        w.rdma.remote_addr = IOVA;
        w.rdma.rkey = mr.rkey;
        w.atomic.remote_addr = IOVA;
        w.atomic.rkey = mr.rkey;
        w.atomic.compare_add = 1;
        p.a.post_send(c.qp_a, w).unwrap();
        settle(&mut p);
        assert_eq!(one_wc(&mut p, &c), WcStatus::RetryExcErr, "{op:?}");
        let b = p.b.qp_counters(c.qp_b).unwrap();
        assert_eq!(b.naks_sent, 0, "{op:?}: no NAK from a dead process's QP");
        assert_eq!(b.acks_sent, 0, "{op:?}");
        assert_eq!(b.dropped_owner_gone, 1, "{op:?}");
        assert!(
            b.dropped_wrong_state > 0,
            "{op:?}: the retries are dropped in ERR"
        );
        assert_eq!(p.b.query_qp(c.qp_b).unwrap().qp_state, QpState::Err);
        drop(z);
    }
}

/// A WR whose payload lives in a dead process's memory sends nothing (no zero bytes in
/// its place) and completes LOC_PROT_ERR.
#[test]
fn a_payload_from_a_dead_processs_memory_never_reaches_the_wire() {
    let z = Zombie::new();
    let mut p = Pair::new(LinkConfig::default(), 1);
    let c = p.connect(&ConnectOpts::default()).unwrap();
    let dead = UserMem::remote(z.pid(), IOVA, 4096).unwrap();
    let src = p.a.reg_user_mr(c.pd_a, dead, IOVA, Access::ALL).unwrap();
    let dst = p.b.reg_mr(c.pd_b, 4096, Access::ALL).unwrap();
    let before = p.b.counters().qp.packets_received;
    let mut w = SendWr::new(7, WrOpcode::RdmaWrite);
    w.sg_list = vec![Sge {
        addr: IOVA,
        length: 64,
        lkey: src.lkey,
    }];
    w.send_flags = SendFlags::SIGNALED;
    w.rdma.remote_addr = dst.addr;
    w.rdma.rkey = dst.rkey;
    p.a.post_send(c.qp_a, w).unwrap();
    settle(&mut p);
    assert_eq!(one_wc(&mut p, &c), WcStatus::LocProtErr);
    assert_eq!(
        p.b.counters().qp.packets_received,
        before,
        "nothing was sent"
    );
    assert_eq!(p.a.query_qp(c.qp_a).unwrap().qp_state, QpState::Err);
    drop(z);
}
