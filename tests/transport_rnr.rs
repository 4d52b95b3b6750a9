//! RNR: a SEND without a posted receive is RNR-NAKed with the responder's min_rnr_timer;
//! the requester waits that long on virtual time and retries; a posted receive lets it
//! finish; an exhausted rnr_retry fails the WR, moves the QP to ERR and flushes the rest.

use std::time::Duration;
use xrnic::proto::Instant;
#[path = "transport_common/mod.rs"]
mod common;

use common::*;
use xrnic::proto::{Access, QpState, WcStatus, WrOpcode};
use xrnic::sim::{ConnectOpts, LinkConfig, Side};
use xrnic::wire::{Opcode, Syndrome, rnr_timer_ns};

#[test]
fn rnr_nak_carries_the_timer_the_sender_waits_and_a_receive_finishes_it() {
    let opts = ConnectOpts {
        min_rnr_timer: 14, // 1.28 ms
        rnr_retry: 7,      // forever
        ..ConnectOpts::default()
    };
    let (mut p, c) = pair(LinkConfig::default(), &opts);
    p.capture = Some(Vec::new());
    let src = mr(&mut p, Side::A, &c, 100, Access::LOCAL_WRITE);
    p.a.mr_bytes_mut(src.lkey).unwrap().fill(0x5a);
    let dst = mr(&mut p, Side::B, &c, 100, Access::LOCAL_WRITE);
    p.a.post_send(c.qp_a, send_wr(1, WrOpcode::Send, sge(&src, 0, 100)))
        .unwrap();

    // Five RNR rounds on virtual time, no receive posted.
    p.run_until(Instant::from_nanos(5 * rnr_timer_ns(14) + 50_000), |_| {
        false
    });
    let naks = frames(&p, Side::B, Opcode::RC_ACK);
    assert!(naks.len() >= 4, "{naks:?}");
    for (_, syn, _) in &naks {
        assert_eq!(
            *syn,
            Some(Syndrome::RnrNak { timer: 14 }),
            "RNR NAK with min_rnr_timer"
        );
    }
    let sends = frames(&p, Side::A, Opcode::RC_SEND_ONLY);
    assert_eq!(sends.len(), naks.len(), "one retry per RNR NAK");
    for w in sends.windows(2) {
        let gap = w[1].0 - w[0].0;
        // The wait is the timer of the NAK plus one round trip on the link (2 × 2 µs
        // propagation + serialization), never less than the timer.
        assert!(gap >= rnr_timer_ns(14), "retried after {gap} ns");
        assert!(gap < rnr_timer_ns(14) + 10_000, "retried after {gap} ns");
        assert_eq!(w[0].2, w[1].2, "the same PSN is retried");
    }
    assert!(
        poll(&mut p, Side::A, &c).is_empty(),
        "still waiting, no completion"
    );

    p.b.post_recv(c.qp_b, recv_wr(9, sge(&dst, 0, 100)))
        .unwrap();
    let mut wcs = vec![];
    let limit = p.now + Duration::from_nanos(10 * rnr_timer_ns(14));
    run_for_wcs(&mut p, Side::A, &c, 1, limit, &mut wcs);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(wcs[0].wr_id, 1);
    let rx = poll(&mut p, Side::B, &c);
    assert_eq!(
        (rx[0].wr_id, rx[0].status, rx[0].byte_len),
        (9, WcStatus::Success, 100)
    );
    assert!(p.b.mr_bytes(dst.lkey).unwrap().iter().all(|&b| b == 0x5a));

    let (ca, cb) = (
        p.a.qp_counters(c.qp_a).unwrap(),
        p.b.qp_counters(c.qp_b).unwrap(),
    );
    assert_eq!(cb.rnr_naks_sent, naks.len() as u64);
    assert_eq!(cb.out_of_buffer, naks.len() as u64);
    assert_eq!(ca.rnr_naks_received, naks.len() as u64);
    assert_eq!(ca.rnr_nak_retry_err, 0);
}

#[test]
fn rnr_retry_exhausted_fails_moves_to_err_and_flushes() {
    let opts = ConnectOpts {
        min_rnr_timer: 5, // 60 µs
        rnr_retry: 2,
        ..ConnectOpts::default()
    };
    let (mut p, c) = pair(LinkConfig::default(), &opts);
    p.capture = Some(Vec::new());
    let src = mr(&mut p, Side::A, &c, 64, Access::LOCAL_WRITE);
    for id in 1..=3 {
        p.a.post_send(c.qp_a, send_wr(id, WrOpcode::Send, sge(&src, 0, 64)))
            .unwrap();
    }
    let t0 = p.now;
    let mut wcs = vec![];
    run_for_wcs(
        &mut p,
        Side::A,
        &c,
        3,
        Instant::from_nanos(1_000_000_000),
        &mut wcs,
    );
    let st: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        [
            (1, WcStatus::RnrRetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.a.query_qp(c.qp_a).unwrap().qp_state, QpState::Err);
    // The first try and two retries were all NAKed; the third NAK exhausts the budget.
    let naks = frames(&p, Side::B, Opcode::RC_ACK);
    assert_eq!(naks.len(), 3);
    assert!(p.now - t0 >= Duration::from_nanos(2 * rnr_timer_ns(5)));
    let ca = p.a.qp_counters(c.qp_a).unwrap();
    assert_eq!(ca.rnr_nak_retry_err, 1);
    assert_eq!(ca.rnr_naks_received, 3);
    // Later posts complete at once, flushed.
    p.a.post_send(c.qp_a, send_wr(4, WrOpcode::Send, sge(&src, 0, 64)))
        .unwrap();
    let w = poll(&mut p, Side::A, &c);
    assert_eq!((w[0].wr_id, w[0].status), (4, WcStatus::WrFlushErr));
}

#[test]
fn write_with_immediate_needs_a_receive_too() {
    let opts = ConnectOpts {
        min_rnr_timer: 3,
        ..ConnectOpts::default()
    };
    let (mut p, c) = pair(LinkConfig::default(), &opts);
    let src = mr(&mut p, Side::A, &c, 3000, Access::LOCAL_WRITE);
    p.a.mr_bytes_mut(src.lkey).unwrap().fill(7);
    let dst = mr(
        &mut p,
        Side::B,
        &c,
        3000,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    let mut w = send_wr(1, WrOpcode::RdmaWriteWithImm, sge(&src, 0, 3000));
    w.rdma.remote_addr = dst.addr;
    w.rdma.rkey = dst.rkey;
    w.imm_data = 0xdead_beef;
    p.a.post_send(c.qp_a, w).unwrap();
    p.run_until(Instant::from_nanos(200_000), |_| false);
    assert!(p.b.qp_counters(c.qp_b).unwrap().rnr_naks_sent >= 1);
    p.b.post_recv(c.qp_b, recv_wr(5, vec![])).unwrap();
    let mut wcs = vec![];
    run_for_wcs(
        &mut p,
        Side::A,
        &c,
        1,
        Instant::from_nanos(10_000_000),
        &mut wcs,
    );
    assert_eq!(wcs[0].status, WcStatus::Success);
    let rx = poll(&mut p, Side::B, &c);
    assert_eq!(rx.len(), 1);
    assert_eq!(rx[0].imm_data, Some(0xdead_beef));
    assert_eq!(rx[0].byte_len, 3000);
    assert!(p.b.mr_bytes(dst.lkey).unwrap().iter().all(|&b| b == 7));
}
