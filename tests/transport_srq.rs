//! Shared receive queues on virtual time (IBTA vol. 1 §10.2.9; rxe `rxe_srq.c`,
//! `get_srq_wqe`): 16 RC QPs on one SRQ with RNR NAKs while it is empty, the limit event
//! raised once and disarmed, re-armed by modify; UC QPs on an SRQ; the verbs' errors.

use std::time::Duration;
use xrnic::proto::Instant;
#[path = "transport_common/mod.rs"]
mod common;

use common::*;
use xrnic::proto::{
    Access, AsyncEvent, AttrMask, Pd, QpAttr, QpInitAttr, QpState, QpType, Srq, SrqAttr,
    SrqAttrMask, VerbsError, WcStatus, WrOpcode,
};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair, QpEnd, RcPair, Side};
use xrnic::wire::Qpn;

const QPS: usize = 16;

fn pattern(qp: usize, j: usize, len: usize) -> Vec<u8> {
    (0..len).map(|b| (qp * 37 + j * 11 + b) as u8).collect()
}

struct Setup {
    p: Pair,
    conns: Vec<RcPair>,
    srq: Srq,
    pd_b: Pd,
    dst: xrnic::proto::MrInfo,
}

/// `QPS` connections of `qp_type`; side B's QPs all take their WQEs from one SRQ.
fn setup(qp_type: QpType, link: LinkConfig) -> Setup {
    let mut p = Pair::new(link, 7);
    let o = ConnectOpts {
        qp_type,
        ..ConnectOpts::default()
    };
    let pd_a = p.a.alloc_pd();
    let cq_a = p.a.create_cq(4096);
    let pd_b = p.b.alloc_pd();
    let cq_b = p.b.create_cq(4096);
    let srq =
        p.b.create_srq(
            pd_b,
            &SrqAttr {
                max_wr: 256,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let mut conns = Vec::new();
    for _ in 0..QPS {
        let a = QpEnd {
            pd: pd_a,
            cq: cq_a,
            srq: None,
        };
        let b = QpEnd {
            pd: pd_b,
            cq: cq_b,
            srq: Some(srq),
        };
        conns.push(p.connect_ends(&o, a, b).unwrap());
    }
    let dst = p.b.reg_mr(pd_b, 256 * 1024, Access::ALL).unwrap();
    Setup {
        p,
        conns,
        srq,
        pd_b,
        dst,
    }
}

fn post_srq(s: &mut Setup, first: u64, n: u64) {
    for id in first..first + n {
        let r = recv_wr(id, sge(&s.dst, 1024 * id, 1024));
        s.p.b.post_srq_recv(s.srq, r).unwrap();
    }
}

/// Each A-side QP sends `per_qp` messages of 300 bytes; returns the source region.
fn send_all(s: &mut Setup, per_qp: usize) {
    let c0 = s.conns[0];
    let src = mr(
        &mut s.p,
        Side::A,
        &c0,
        QPS * per_qp * 300,
        Access::LOCAL_WRITE,
    );
    for (i, c) in s.conns.clone().iter().enumerate() {
        for j in 0..per_qp {
            let off = (i * per_qp + j) * 300;
            s.p.a.mr_bytes_mut(src.lkey).unwrap()[off..off + 300]
                .copy_from_slice(&pattern(i, j, 300));
            let w = send_wr(
                (i * 100 + j) as u64,
                WrOpcode::Send,
                sge(&src, off as u64, 300),
            );
            s.p.a.post_send(c.qp_a, w).unwrap();
        }
    }
}

#[test]
fn srq_shared_by_16_rc_qps_rnr_while_empty_and_limit_event_once() {
    let mut s = setup(QpType::Rc, LinkConfig::default());
    post_srq(&mut s, 0, 8);
    // Arm the limit at 4: the event comes when a QP's take leaves 3.
    s.p.b
        .modify_srq(
            s.srq,
            &SrqAttr {
                srq_limit: 4,
                ..SrqAttr::default()
            },
            SrqAttrMask::LIMIT,
        )
        .unwrap();
    assert_eq!(s.p.b.query_srq(s.srq).unwrap().srq_limit, 4);
    send_all(&mut s, 2);
    // Until the SRQ runs dry: 8 delivered, the rest waits on RNR NAKs.
    let cq_b = s.conns[0].cq_b;
    let mut got = Vec::new();
    let delivered_8 = s.p.run_until(Instant::from_nanos(50_000_000), |p| {
        p.b.poll_cq(cq_b, usize::MAX, &mut got);
        got.len() >= 8
    });
    assert!(delivered_8, "{got:?}");
    s.p.run_until(s.p.now + Duration::from_nanos(2_000_000), |_| false);
    let mut more = Vec::new();
    s.p.b.poll_cq(cq_b, usize::MAX, &mut more);
    got.extend(more);
    assert_eq!(got.len(), 8, "no more than the SRQ held");
    assert_eq!(s.p.b.srq_len(s.srq), Some(0));
    let rnr: u64 = s
        .conns
        .iter()
        .map(|c| s.p.b.qp_counters(c.qp_b).unwrap().rnr_naks_sent)
        .sum();
    assert!(rnr > 0, "RC QPs on an empty SRQ answer RNR NAK");
    // The limit event, exactly once, and the limit disarmed.
    assert_eq!(
        s.p.b.poll_async_event(),
        Some(AsyncEvent::SrqLimitReached(s.srq))
    );
    assert_eq!(s.p.b.poll_async_event(), None);
    assert_eq!(s.p.b.query_srq(s.srq).unwrap().srq_limit, 0);
    // Refill: every message arrives, each on the QP it was sent to, byte for byte.
    post_srq(&mut s, 8, 24);
    let done =
        s.p.run_until(s.p.now + Duration::from_nanos(200_000_000), |p| {
            p.b.poll_cq(cq_b, usize::MAX, &mut got);
            got.len() >= 2 * QPS
        });
    assert!(done, "{} of {}", got.len(), 2 * QPS);
    assert_eq!(s.p.b.poll_async_event(), None, "disarmed: nothing more");
    let mut seen = vec![0usize; QPS];
    let mem = s.p.b.mr_bytes(s.dst.lkey).unwrap().to_vec();
    for w in &got {
        assert_eq!(w.status, WcStatus::Success);
        assert_eq!(w.byte_len, 300);
        let i = s
            .conns
            .iter()
            .position(|c| c.qp_b == w.qp_num)
            .expect("one of ours");
        let j = seen[i];
        seen[i] += 1;
        let off = 1024 * w.wr_id as usize;
        assert_eq!(
            &mem[off..off + 300],
            &pattern(i, j, 300)[..],
            "QP {i} message {j}"
        );
    }
    assert!(seen.iter().all(|&n| n == 2), "{seen:?}");
    // Re-armed by modify, the event comes once more.
    post_srq(&mut s, 32, 6);
    let lim = SrqAttr {
        srq_limit: 5,
        ..SrqAttr::default()
    };
    s.p.b.modify_srq(s.srq, &lim, SrqAttrMask::LIMIT).unwrap();
    let c0 = s.conns[0];
    let src = mr(&mut s.p, Side::A, &c0, 64, Access::LOCAL_WRITE);
    for k in 0..3 {
        let w = send_wr(900 + k, WrOpcode::Send, sge(&src, 0, 64));
        s.p.a.post_send(c0.qp_a, w).unwrap();
    }
    let before = got.len();
    s.p.run_until(s.p.now + Duration::from_nanos(50_000_000), |p| {
        p.b.poll_cq(cq_b, usize::MAX, &mut got);
        got.len() >= before + 3
    });
    assert_eq!(got.len(), before + 3);
    assert_eq!(s.p.b.srq_len(s.srq), Some(3));
    assert_eq!(
        s.p.b.poll_async_event(),
        Some(AsyncEvent::SrqLimitReached(s.srq))
    );
    assert_eq!(s.p.b.poll_async_event(), None);
}

#[test]
fn uc_qps_on_an_srq_drop_messages_while_it_is_empty() {
    let mut s = setup(QpType::Uc, LinkConfig::default());
    send_all(&mut s, 1);
    s.p.run_until(Instant::from_nanos(50_000_000), |_| false);
    let cq_b = s.conns[0].cq_b;
    let mut got = Vec::new();
    s.p.b.poll_cq(cq_b, usize::MAX, &mut got);
    assert!(got.is_empty());
    let sum = |s: &mut Setup, f: fn(&xrnic::proto::QpCounters) -> u64| -> u64 {
        s.conns
            .iter()
            .map(|c| f(&s.p.b.qp_counters(c.qp_b).unwrap()))
            .sum()
    };
    assert_eq!(sum(&mut s, |c| c.uc_messages_dropped), QPS as u64);
    assert_eq!(sum(&mut s, |c| c.out_of_buffer), QPS as u64);
    assert_eq!(sum(&mut s, |c| c.rnr_naks_sent), 0);
    post_srq(&mut s, 0, QPS as u64);
    send_all(&mut s, 1);
    s.p.run_until(s.p.now + Duration::from_nanos(50_000_000), |_| false);
    s.p.b.poll_cq(cq_b, usize::MAX, &mut got);
    assert_eq!(got.len(), QPS);
    let mem = s.p.b.mr_bytes(s.dst.lkey).unwrap().to_vec();
    for w in &got {
        let i = s.conns.iter().position(|c| c.qp_b == w.qp_num).unwrap();
        let off = 1024 * w.wr_id as usize;
        assert_eq!(&mem[off..off + 300], &pattern(i, 0, 300)[..]);
    }
    let res = s.p.b.resources();
    let lines = res.qp_lines();
    let pdn = res.qps.iter().find(|q| q.srq.is_some()).unwrap().pd;
    let want = format!("type UC state RTS pdn {pdn} srqn {}", s.srq.0);
    assert_eq!(lines.matches(&want).count(), QPS, "{lines}");
}

#[test]
fn srq_verb_errors() {
    let mut s = setup(QpType::Rc, LinkConfig::default());
    let c = s.conns[0];
    // post_recv on a QP created with an SRQ: EINVAL.
    assert!(matches!(
        s.p.b.post_recv(c.qp_b, recv_wr(1, sge(&s.dst, 0, 64))),
        Err(VerbsError::InvalidValue(_))
    ));
    // Destroying an SRQ in use: busy ("still used", EBUSY in the C library).
    match s.p.b.destroy_srq(s.srq) {
        Err(VerbsError::InUse(w)) => assert!(w.contains("still used"), "{w}"),
        e => panic!("{e:?}"),
    }
    // Limit above max_wr, resize below what it holds, too many SGEs, a full SRQ.
    let bad = SrqAttr {
        srq_limit: 257,
        ..SrqAttr::default()
    };
    assert!(s.p.b.modify_srq(s.srq, &bad, SrqAttrMask::LIMIT).is_err());
    post_srq(&mut s, 0, 4);
    let small = SrqAttr {
        max_wr: 3,
        ..SrqAttr::default()
    };
    assert!(
        s.p.b
            .modify_srq(s.srq, &small, SrqAttrMask::MAX_WR)
            .is_err()
    );
    let ok = SrqAttr {
        max_wr: 5,
        ..SrqAttr::default()
    };
    s.p.b.modify_srq(s.srq, &ok, SrqAttrMask::MAX_WR).unwrap();
    assert_eq!(s.p.b.query_srq(s.srq).unwrap().max_wr, 5);
    post_srq(&mut s, 4, 1);
    assert_eq!(
        s.p.b.post_srq_recv(s.srq, recv_wr(9, Vec::new())),
        Err(VerbsError::QueueFull)
    );
    let two = vec![sge(&s.dst, 0, 8)[0], sge(&s.dst, 8, 8)[0]];
    s.p.b
        .modify_srq(
            s.srq,
            &SrqAttr {
                max_wr: 8,
                ..SrqAttr::default()
            },
            SrqAttrMask::MAX_WR,
        )
        .unwrap();
    assert!(matches!(
        s.p.b.post_srq_recv(s.srq, recv_wr(9, two)),
        Err(VerbsError::InvalidValue(_))
    ));
    // A QP on an SRQ of another PD; a PD that still has an SRQ.
    let other_pd = s.p.b.alloc_pd();
    let cq = s.p.b.create_cq(4);
    let init = QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        max_send_wr: 4,
        max_recv_wr: 4,
        sq_sig_all: false,
        qp_type: QpType::Rc,
        srq: Some(s.srq),
    };
    assert!(matches!(
        s.p.b.create_qp(other_pd, &init),
        Err(VerbsError::InvalidValue(_))
    ));
    assert!(s.p.b.create_qp(s.pd_b, &init).is_ok());
    // A QP in ERR flushes only the WQE it took, never the SRQ's.
    let held = s.p.b.srq_len(s.srq).unwrap();
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    s.p.b.modify_qp(c.qp_b, &err, AttrMask::STATE).unwrap();
    assert_eq!(s.p.b.srq_len(s.srq), Some(held));
    // Once no QP uses it, it goes.
    let qpns: Vec<Qpn> =
        s.p.b
            .resources()
            .qps
            .iter()
            .map(|q| Qpn::new(q.qpn))
            .collect();
    for q in qpns {
        s.p.b.destroy_qp(q).unwrap();
    }
    assert!(
        s.p.b.dealloc_pd(s.pd_b).is_err(),
        "the PD still has the SRQ"
    );
    s.p.b.destroy_srq(s.srq).unwrap();
    assert_eq!(s.p.b.srq_len(s.srq), None);
    assert!(matches!(
        s.p.b.post_srq_recv(s.srq, recv_wr(1, Vec::new())),
        Err(VerbsError::NotFound(_))
    ));
    // A new SRQ never takes the old one's number: the stale handle stays dead.
    let pd = s.p.b.alloc_pd();
    let attr = SrqAttr {
        max_wr: 4,
        max_sge: 1,
        srq_limit: 0,
    };
    let again = s.p.b.create_srq(pd, &attr).unwrap();
    assert_ne!(again, s.srq);
    assert_eq!(s.p.b.srq_len(s.srq), None);
}

/// With loss, RC QPs on one SRQ still deliver every message exactly once (a WQE a QP
/// took stays with it through retransmissions).
#[test]
fn srq_with_loss_delivers_each_message_once() {
    let link = LinkConfig {
        loss: 0.05,
        delay_ns: 1_000,
        ..LinkConfig::default()
    };
    let mut s = setup(QpType::Rc, link);
    post_srq(&mut s, 0, 2 * QPS as u64);
    send_all(&mut s, 2);
    let cq_b = s.conns[0].cq_b;
    let mut got = Vec::new();
    let done = s.p.run_until(Instant::from_nanos(2_000_000_000), |p| {
        p.b.poll_cq(cq_b, usize::MAX, &mut got);
        got.len() >= 2 * QPS
    });
    assert!(done);
    s.p.run_until(s.p.now + Duration::from_nanos(100_000_000), |_| false);
    s.p.b.poll_cq(cq_b, usize::MAX, &mut got);
    assert_eq!(got.len(), 2 * QPS);
    assert!(s.p.link.stats.lost > 0);
    let mut ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 2 * QPS, "each WQE used once");
}
