//! The engine's asynchronous events (srq.rs [`AsyncEvent`], IBTA vol. 1 §11.6.3) on a
//! simulated link: each raised when and only when its cause happens.

use crate::proto::{
    Access, AsyncEvent, AttrMask, QpState, RecvWr, RxVerdict, SendWr, Sge, SrqAttr, WcStatus,
    WrOpcode,
};
use crate::sim::{ConnectOpts, LinkConfig, Pair, QpEnd, RcPair, Side};

fn events(p: &mut Pair, s: Side) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| p.dev(s).poll_async_event()).collect()
}

/// Run until both sides are idle (bounded).
fn settle(p: &mut Pair) {
    let limit = p.now + std::time::Duration::from_secs(1);
    p.run_until(limit, |_| false);
}

fn write(p: &mut Pair, c: &RcPair, len: u32, rkey: crate::wire::Rkey, addr: u64) {
    let src = p.a.reg_mr(c.pd_a, 4096, Access::LOCAL_WRITE).unwrap();
    let mut w = SendWr::new(7, WrOpcode::RdmaWrite);
    w.sg_list = vec![Sge {
        addr: src.addr,
        length: len,
        lkey: src.lkey,
    }];
    w.send_flags = crate::proto::SendFlags::SIGNALED;
    w.rdma.remote_addr = addr;
    w.rdma.rkey = rkey;
    p.a.post_send(c.qp_a, w).unwrap();
}

/// B's QP back to RTR with the attributes it had (RESET, INIT, RTR): the state in which
/// the first packet raises COMM_EST.
fn b_back_to_rtr(p: &mut Pair, c: &RcPair) {
    let a = p.b.query_qp(c.qp_b).unwrap();
    let mut attr = a;
    attr.qp_state = QpState::Reset;
    p.b.modify_qp(c.qp_b, &attr, AttrMask::STATE).unwrap();
    let mut attr = crate::proto::QpAttr::rc_init(Access::ALL);
    p.b.modify_qp(c.qp_b, &attr, AttrMask::RC_INIT).unwrap();
    attr.qp_state = QpState::Rtr;
    attr.ah_attr = a.ah_attr;
    attr.path_mtu = a.path_mtu;
    attr.dest_qp_num = a.dest_qp_num;
    attr.rq_psn = a.rq_psn;
    attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
    attr.min_rnr_timer = a.min_rnr_timer;
    p.b.modify_qp(c.qp_b, &attr, AttrMask::RC_RTR).unwrap();
}

#[test]
fn comm_est_is_raised_once_by_the_first_packet_in_rtr() {
    let mut p = Pair::new(LinkConfig::default(), 1);
    let c = p.connect(&ConnectOpts::default()).unwrap();
    let dst = p.b.reg_mr(c.pd_b, 4096, Access::ALL).unwrap();
    // Both in RTS: traffic raises nothing.
    write(&mut p, &c, 64, dst.rkey, dst.addr);
    settle(&mut p);
    assert_eq!(events(&mut p, Side::A), []);
    assert_eq!(events(&mut p, Side::B), []);
    b_back_to_rtr(&mut p, &c);
    assert_eq!(events(&mut p, Side::B), [], "modify raises nothing");
    // An RDMA WRITE (no completion at B) to B in RTR: COMM_EST, once.
    for _ in 0..2 {
        write(&mut p, &c, 64, dst.rkey, dst.addr);
        settle(&mut p);
    }
    assert_eq!(p.b.query_qp(c.qp_b).unwrap().qp_state, QpState::Rtr);
    assert_eq!(events(&mut p, Side::B), [AsyncEvent::CommEst(c.qp_b)]);
    assert_eq!(events(&mut p, Side::A), []);
}

#[test]
fn a_responder_access_error_raises_qp_access_err_on_the_responder_only() {
    let mut p = Pair::new(LinkConfig::default(), 1);
    let c = p.connect(&ConnectOpts::default()).unwrap();
    // A region without REMOTE_WRITE.
    let ro = p.b.reg_mr(c.pd_b, 4096, Access::REMOTE_READ).unwrap();
    write(&mut p, &c, 64, ro.rkey, ro.addr);
    settle(&mut p);
    let mut wcs = vec![];
    p.a.poll_cq(c.cq_a, 8, &mut wcs);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::RemAccessErr);
    // The requester's error is reported by its completion: no event on A.
    assert_eq!(events(&mut p, Side::A), []);
    assert_eq!(events(&mut p, Side::B), [AsyncEvent::QpAccessErr(c.qp_b)]);
    assert_eq!(p.b.query_qp(c.qp_b).unwrap().qp_state, QpState::Err);
}

#[test]
fn a_send_longer_than_the_receive_raises_qp_req_err() {
    let mut p = Pair::new(LinkConfig::default(), 1);
    let c = p.connect(&ConnectOpts::default()).unwrap();
    let rb = p.b.reg_mr(c.pd_b, 4096, Access::LOCAL_WRITE).unwrap();
    p.b.post_recv(
        c.qp_b,
        RecvWr {
            wr_id: 1,
            sg_list: vec![Sge {
                addr: rb.addr,
                length: 16,
                lkey: rb.lkey,
            }],
        },
    )
    .unwrap();
    let src = p.a.reg_mr(c.pd_a, 4096, Access::LOCAL_WRITE).unwrap();
    let mut w = SendWr::new(2, WrOpcode::Send);
    w.sg_list = vec![Sge {
        addr: src.addr,
        length: 64,
        lkey: src.lkey,
    }];
    p.a.post_send(c.qp_a, w).unwrap();
    settle(&mut p);
    assert_eq!(events(&mut p, Side::B), [AsyncEvent::QpReqErr(c.qp_b)]);
    assert_eq!(events(&mut p, Side::A), []);
}

#[test]
fn a_qp_on_an_srq_entering_err_raises_last_wqe_reached_once() {
    let mut p = Pair::new(LinkConfig::default(), 1);
    let mut ends = vec![];
    for s in [Side::A, Side::B] {
        let d = p.dev(s);
        let pd = d.alloc_pd();
        let cq = d.create_cq(64);
        let srq = (s == Side::B).then(|| {
            d.create_srq(
                pd,
                &SrqAttr {
                    max_wr: 16,
                    max_sge: 1,
                    srq_limit: 0,
                },
            )
            .unwrap()
        });
        ends.push(QpEnd { pd, cq, srq });
    }
    let c = p
        .connect_ends(&ConnectOpts::default(), ends[0], ends[1])
        .unwrap();
    let mut attr = p.b.query_qp(c.qp_b).unwrap();
    attr.qp_state = QpState::Err;
    for _ in 0..2 {
        p.b.modify_qp(c.qp_b, &attr, AttrMask::STATE).unwrap();
    }
    assert_eq!(
        events(&mut p, Side::B),
        [AsyncEvent::QpLastWqeReached(c.qp_b)]
    );
    // A QP with its own receive queue raises nothing.
    let mut attr = p.a.query_qp(c.qp_a).unwrap();
    attr.qp_state = QpState::Err;
    p.a.modify_qp(c.qp_a, &attr, AttrMask::STATE).unwrap();
    assert_eq!(events(&mut p, Side::A), []);
}

#[test]
fn a_completion_into_a_full_cq_raises_cq_err() {
    let mut p = Pair::new(LinkConfig::default(), 1);
    let c = p
        .connect(&ConnectOpts {
            cq_size: 1,
            ..ConnectOpts::default()
        })
        .unwrap();
    let dst = p.b.reg_mr(c.pd_b, 4096, Access::ALL).unwrap();
    write(&mut p, &c, 8, dst.rkey, dst.addr);
    settle(&mut p);
    assert_eq!(events(&mut p, Side::A), [], "the CQ had room");
    write(&mut p, &c, 8, dst.rkey, dst.addr);
    settle(&mut p);
    assert_eq!(events(&mut p, Side::A), [AsyncEvent::CqErr(c.cq_a)]);
}

/// A QP's state moved with only the STATE bit (RTS <-> SQD need nothing else).
fn move_to(p: &mut Pair, s: Side, qpn: crate::wire::Qpn, to: QpState) {
    let mut attr = p.dev(s).query_qp(qpn).unwrap();
    attr.qp_state = to;
    p.dev(s).modify_qp(qpn, &attr, AttrMask::STATE).unwrap();
}

#[test]
fn sq_drained_is_raised_once_the_outstanding_message_completes() {
    let mut p = Pair::new(LinkConfig::default(), 1);
    let c = p.connect(&ConnectOpts::default()).unwrap();
    let dst = p.b.reg_mr(c.pd_b, 4096, Access::ALL).unwrap();
    // Nothing outstanding: drained at once, once per entry into SQD.
    move_to(&mut p, Side::A, c.qp_a, QpState::Sqd);
    assert_eq!(events(&mut p, Side::A), [AsyncEvent::SqDrained(c.qp_a)]);
    move_to(&mut p, Side::A, c.qp_a, QpState::Sqd);
    assert_eq!(events(&mut p, Side::A), [], "SQD -> SQD raises nothing");
    move_to(&mut p, Side::A, c.qp_a, QpState::Rts);
    assert_eq!(events(&mut p, Side::A), []);
    // A WRITE on the wire, not yet acknowledged: SQD waits for its ACK.
    write(&mut p, &c, 64, dst.rkey, dst.addr);
    let now = p.now;
    let mut frames = vec![];
    let mut buf = vec![0u8; 9000];
    while let Some(n) = p.a.poll_transmit(now, &mut buf) {
        frames.push(buf[..n].to_vec());
    }
    assert_eq!(frames.len(), 1, "the WRITE went out");
    move_to(&mut p, Side::A, c.qp_a, QpState::Sqd);
    assert!(p.a.query_qp(c.qp_a).unwrap().sq_draining);
    assert_eq!(events(&mut p, Side::A), [], "still outstanding");
    for f in &frames {
        assert_eq!(p.b.handle_frame(now, f), RxVerdict::Taken);
    }
    while let Some(n) = p.b.poll_transmit(now, &mut buf) {
        assert_eq!(p.a.handle_frame(now, &buf[..n]), RxVerdict::Taken);
    }
    let mut wcs = vec![];
    p.a.poll_cq(c.cq_a, 8, &mut wcs);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert!(!p.a.query_qp(c.qp_a).unwrap().sq_draining);
    assert_eq!(events(&mut p, Side::A), [AsyncEvent::SqDrained(c.qp_a)]);
    assert_eq!(events(&mut p, Side::B), []);
    // Leaving SQD before the drain owes nothing: RTS -> SQD -> RTS with an outstanding
    // WRITE, then its ACK, raises no event.
    write(&mut p, &c, 64, dst.rkey, dst.addr);
    move_to(&mut p, Side::A, c.qp_a, QpState::Rts);
    frames.clear();
    while let Some(n) = p.a.poll_transmit(now, &mut buf) {
        frames.push(buf[..n].to_vec());
    }
    move_to(&mut p, Side::A, c.qp_a, QpState::Sqd);
    assert_eq!(events(&mut p, Side::A), []);
    move_to(&mut p, Side::A, c.qp_a, QpState::Rts);
    for f in &frames {
        assert_eq!(p.b.handle_frame(now, f), RxVerdict::Taken);
    }
    while let Some(n) = p.b.poll_transmit(now, &mut buf) {
        assert_eq!(p.a.handle_frame(now, &buf[..n]), RxVerdict::Taken);
    }
    wcs.clear();
    p.a.poll_cq(c.cq_a, 8, &mut wcs);
    assert_eq!(wcs.len(), 1, "the second WRITE completed");
    settle(&mut p);
    assert_eq!(events(&mut p, Side::A), [], "the drain was no longer owed");
}
