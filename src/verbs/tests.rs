//! Completions that no frame produced wake the threads waiting for them, as the ones
//! a frame produced do: a flush on modify to ERR, a post on a QP in ERR (send and receive), and a WR failed
//! at the head of the send queue (bad lkey: LOC_PROT_ERR).
//!
//! Each case holds the device's port ([`crate::driver::PortHold`]), so that no thread
//! steps: no frame is received or sent and no timer runs, and the only way the waiting
//! thread can learn of the completion is the signal of the call that added it. The verb
//! runs only after the waiter has looked at its CQ, found it empty and gone to sleep
//! (`DriverStats::cq_waits`, counted under the engine lock in the same hold as the empty
//! look). The waiter must then have been signalled (`cq_wakeups`) and not have slept to
//! its timeout (`cq_wait_timeouts`); the timeout only bounds how long a failing run takes.

use std::sync::Arc;
use std::time::Duration;

use super::{
    Access, ConnectOpts, Cq, Device, Lkey, Mr, Qp, QpAttr, QpInitAttr, QpState, RecvWr, Remote,
    SendWr, WcStatus, WorkCompletion, WrOpcode,
};
use crate::driver::{PortHold, Shared};
use crate::proto::AttrMask;

/// Bounds a failing run only: a woken waiter returns as soon as it is signalled.
const BOUND: Duration = Duration::from_secs(30);

struct End {
    dev: Device,
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn end(dev: &Device) -> End {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let mr = pd.reg_mr(4096, Access::ALL).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 16)).unwrap();
    End {
        dev: dev.clone(),
        cq,
        mr,
        qp,
    }
}

/// Two connected ends on the simulated link.
fn pair() -> (End, End) {
    let (da, db) = Device::open_sim_pair().unwrap();
    let (a, b) = (end(&da), end(&db));
    let o = ConnectOpts {
        access: Access::ALL,
        ..ConnectOpts::default()
    };
    let g = |d: &Device| d.query_gid(1).unwrap();
    let remote = |e: &End| Remote {
        qpn: e.qp.qp_num(),
        psn: 0x10,
        gid: g(&e.dev),
    };
    a.qp.connect(&remote(&b), 0x10, 1, &o).unwrap();
    b.qp.connect(&remote(&a), 0x10, 1, &o).unwrap();
    (a, b)
}

fn shared(d: &Device) -> Arc<Shared> {
    d.inner.soft().unwrap().clone()
}

fn to_err(qp: &Qp) {
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    qp.modify(&attr, AttrMask::STATE).unwrap();
}

/// With the port held: start a thread waiting on `e.cq` (on the socket when
/// `receiving`), wait until it sleeps with its CQ empty, run `act`, and return what the
/// waiter got, with the wake-ups the device signalled and the waits that timed out.
fn completed_while_waiting(
    e: &End,
    receiving: bool,
    act: impl FnOnce(&End, &mut PortHold<'_>),
) -> Waited {
    let sh = shared(&e.dev);
    let mut hold = sh.hold_port();
    let before = e.dev.driver_stats().unwrap();
    std::thread::scope(|s| {
        let cq = e.cq.clone();
        let waiter = s.spawn(move || {
            let mut out = Vec::new();
            if receiving {
                cq.wait_receiving(1, BOUND, &mut out);
            } else {
                cq.wait_into(1, BOUND, &mut out);
            }
            out
        });
        // Asleep with an empty CQ once counted (the count and the empty look share one
        // hold of the engine lock).
        while e.dev.driver_stats().unwrap().cq_waits == before.cq_waits {
            assert!(!waiter.is_finished(), "the waiter returned before sleeping");
            std::thread::yield_now();
        }
        act(e, &mut hold);
        let got = waiter.join().unwrap();
        let after = e.dev.driver_stats().unwrap();
        Waited {
            got,
            wakeups: after.cq_wakeups - before.cq_wakeups,
            timeouts: after.cq_wait_timeouts - before.cq_wait_timeouts,
        }
    })
}

struct Waited {
    got: Vec<WorkCompletion>,
    wakeups: u64,
    timeouts: u64,
}

/// What the waiter saw: the completion, signalled (a wake-up counted), its sleep not run
/// to the timeout. A waiter nobody signals still returns the completion, when its
/// timeout ends and it looks once more: only the counters tell the two apart.
fn check(case: &str, receiving: bool, w: &Waited, wr_id: u64, st: WcStatus) {
    let case = format!("{case} (waiting on the socket: {receiving})");
    assert_eq!(
        w.got
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        [(wr_id, st)],
        "{case}"
    );
    assert!(
        w.wakeups >= 1,
        "{case}: the call that completed signalled nobody"
    );
    assert_eq!(w.timeouts, 0, "{case}: the waiter slept until its timeout");
}

#[test]
fn a_flush_on_modify_to_err_wakes_the_waiter() {
    for receiving in [false, true] {
        let (a, _b) = pair();
        a.qp.post_recv(RecvWr {
            wr_id: 11,
            sg_list: vec![a.mr.sge(0, 64)],
        })
        .unwrap();
        let w = completed_while_waiting(&a, receiving, |e, _| to_err(&e.qp));
        check("modify to ERR", receiving, &w, 11, WcStatus::WrFlushErr);
    }
}

#[test]
fn a_post_send_on_a_qp_in_err_wakes_the_waiter() {
    for receiving in [false, true] {
        let (a, _b) = pair();
        to_err(&a.qp);
        let w = completed_while_waiting(&a, receiving, |e, _| {
            let mut wr = SendWr::new(12, WrOpcode::Send);
            wr.sg_list = vec![e.mr.sge(0, 8)];
            e.qp.post_send(wr).unwrap();
        });
        check("post_send in ERR", receiving, &w, 12, WcStatus::WrFlushErr);
    }
}

#[test]
fn a_post_recv_on_a_qp_in_err_wakes_the_waiter() {
    for receiving in [false, true] {
        let (a, _b) = pair();
        to_err(&a.qp);
        let w = completed_while_waiting(&a, receiving, |e, _| {
            e.qp.post_recv(RecvWr {
                wr_id: 13,
                sg_list: vec![e.mr.sge(0, 64)],
            })
            .unwrap();
        });
        check("post_recv in ERR", receiving, &w, 13, WcStatus::WrFlushErr);
    }
}

#[test]
fn a_bad_lkey_failed_at_the_head_of_the_send_queue_wakes_the_waiter() {
    for receiving in [false, true] {
        let (a, _b) = pair();
        let w = completed_while_waiting(&a, receiving, |e, hold| {
            let mut wr = SendWr::new(14, WrOpcode::Send);
            wr.send_flags = crate::proto::SendFlags::SIGNALED;
            let mut sge = e.mr.sge(0, 8);
            sge.lkey = Lkey(e.mr.lkey().0 ^ 0x00ff_ff00);
            wr.sg_list = vec![sge];
            e.qp.post_send(wr).unwrap();
            // The doorbell found the port held: the step that fails the WR runs here,
            // and sends nothing (no frame moved, no timer ran).
            hold.step();
        });
        check("bad lkey", receiving, &w, 14, WcStatus::LocProtErr);
    }
}

/// An empty busy poll skips its step, without the engine lock (driver/poll.rs,
/// `Port::quiet`), only while a step would find nothing: a verb since the last step, a
/// frame waiting on the port or a timer due each make the next poll step. With the port
/// held no other thread steps A's port, so what the test sees is the verbs' doing and
/// the peer's answers.
#[test]
fn an_empty_poll_steps_only_when_there_is_something_to_do() {
    let (a, b) = pair();
    b.qp.post_recv(RecvWr {
        wr_id: 20,
        sg_list: vec![b.mr.sge(0, 64)],
    })
    .unwrap();
    let sh = shared(&a.dev);
    let mut hold = sh.hold_port();
    hold.step();
    let now = sh.now();
    assert!(hold.quiet_at(now), "an idle device steps for nothing");
    assert_eq!(hold.cached_deadline(), None, "no timer armed");

    // A post (its doorbell finds the port held) leaves work for the next poll.
    let mut wr = SendWr::new(21, WrOpcode::Send);
    wr.sg_list = vec![a.mr.sge(0, 8)];
    wr.send_flags = crate::proto::SendFlags::SIGNALED;
    a.qp.post_send(wr).unwrap();
    assert!(!hold.quiet_at(now), "a post must make the next poll step");

    // The step sends the SEND and arms its local ACK timer: cached when the step ends.
    // B's port is held meanwhile, so that its answer cannot reach A's port before the
    // checks of "nothing to do" below (under load B's driver could otherwise answer
    // between the step and the check).
    let sh_b = shared(&b.dev);
    let hold_b = sh_b.hold_port();
    hold.step();
    let deadline = hold.cached_deadline().expect("the SEND's ACK timer");
    assert!(deadline > now, "{deadline} {now}");
    assert!(
        hold.quiet_at(now),
        "nothing to do before the timer or an answer"
    );
    assert!(
        !hold.quiet_at(deadline),
        "a timer due must make the poll step"
    );

    // B acknowledges: the ACK waiting on A's port makes the poll step.
    drop(hold_b);
    let until = std::time::Instant::now() + BOUND;
    while hold.quiet_at(now) {
        assert!(std::time::Instant::now() < until, "B never answered");
        std::thread::yield_now();
    }
    hold.step();
    assert_eq!(hold.cached_deadline(), None, "the ACK cleared the timer");
    assert!(hold.quiet_at(sh.now()), "nothing left after the ACK");
    drop(hold);

    // Through the verb: polls of the empty CQ after the completion skip their steps.
    let mut out = Vec::new();
    while out.is_empty() {
        a.cq.poll_into(1, &mut out);
    }
    assert_eq!((out[0].wr_id, out[0].status), (21, WcStatus::Success));
    let q = sh.quiet_polls();
    let until = std::time::Instant::now() + BOUND;
    while sh.quiet_polls() == q {
        assert!(std::time::Instant::now() < until, "no poll was quiet");
        assert_eq!(a.cq.poll(1).len(), 0);
    }
}
