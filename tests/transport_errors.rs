//! Error paths: retry exhaustion on a black-hole link (with the virtual time it takes),
//! remote access errors, and local errors.

#[path = "transport_common/mod.rs"]
mod common;

use common::*;
use xrnic::proto::Instant;
use xrnic::proto::{Access, QpState, WcStatus, WrOpcode, timers::local_ack_timeout};
use xrnic::sim::{ConnectOpts, LinkConfig, Side};
use xrnic::wire::{NakCode, Opcode, Syndrome};

#[test]
fn black_hole_gives_retry_exc_err_after_retry_cnt_plus_one_timeouts() {
    for (timeout, retry_cnt) in [(10u8, 3u8), (12, 0), (8, 7)] {
        let opts = ConnectOpts {
            timeout,
            retry_cnt,
            ..ConnectOpts::default()
        };
        let link = LinkConfig {
            loss: 1.0,
            ..LinkConfig::default()
        };
        let (mut p, c) = pair(link, &opts);
        let src = mr(&mut p, Side::A, &c, 4096, Access::LOCAL_WRITE);
        let mut w = send_wr(1, WrOpcode::RdmaWrite, sge(&src, 0, 4096));
        w.rdma.remote_addr = 0x1_0000_0000;
        p.a.post_send(c.qp_a, w).unwrap();
        p.a.post_send(c.qp_a, send_wr(2, WrOpcode::Send, sge(&src, 0, 1)))
            .unwrap();
        let t0 = p.now;
        let mut wcs = vec![];
        run_for_wcs(
            &mut p,
            Side::A,
            &c,
            2,
            Instant::from_nanos(u64::MAX / 2),
            &mut wcs,
        );
        let t = local_ack_timeout(timeout).unwrap();
        assert_eq!(
            p.now - t0,
            (u32::from(retry_cnt) + 1) * t,
            "timeout {timeout} retry_cnt {retry_cnt}"
        );
        assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
        assert_eq!(wcs[1].status, WcStatus::WrFlushErr);
        assert_eq!(p.a.query_qp(c.qp_a).unwrap().qp_state, QpState::Err);
        let ca = p.a.qp_counters(c.qp_a).unwrap();
        assert_eq!(ca.local_ack_timeout_err, u64::from(retry_cnt) + 1);
        assert_eq!(ca.retry_exceeded_err, 1);
        // MTU 1024: four WRITE packets and the SEND per try, resent retry_cnt times.
        assert_eq!(ca.retransmitted_packets, 5 * u64::from(retry_cnt));
        assert_eq!(ca.packets_sent, 5 * (u64::from(retry_cnt) + 1));
    }
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    BadRkey,
    OutOfBounds,
    NoPermission,
    UnalignedAtomic,
    QpAccessFlags,
    OtherPd,
}

#[test]
fn remote_access_errors_nak_and_touch_nothing() {
    for fault in [
        Fault::BadRkey,
        Fault::OutOfBounds,
        Fault::NoPermission,
        Fault::UnalignedAtomic,
        Fault::QpAccessFlags,
        Fault::OtherPd,
    ] {
        for op in [
            WrOpcode::RdmaWrite,
            WrOpcode::RdmaRead,
            WrOpcode::AtomicFetchAndAdd,
        ] {
            if matches!(fault, Fault::UnalignedAtomic) && !op.is_atomic() {
                continue;
            }
            let mut opts = ConnectOpts::default();
            if matches!(fault, Fault::QpAccessFlags) {
                opts.access = Access::LOCAL_WRITE;
            }
            let (mut p, c) = pair(LinkConfig::default(), &opts);
            p.capture = Some(Vec::new());
            let src = mr(&mut p, Side::A, &c, 2048, Access::LOCAL_WRITE);
            p.a.mr_bytes_mut(src.lkey).unwrap().fill(0x11);
            let access = match fault {
                Fault::NoPermission => Access::LOCAL_WRITE,
                _ => Access::ALL,
            };
            let target = if matches!(fault, Fault::OtherPd) {
                let pd = p.b.alloc_pd();
                p.b.reg_mr(pd, 2048, access).unwrap()
            } else {
                mr(&mut p, Side::B, &c, 2048, access)
            };
            p.b.mr_bytes_mut(target.lkey).unwrap().fill(0xee);
            let (mut va, mut rkey) = (target.addr, target.rkey);
            let len = if op.is_atomic() { 8 } else { 2048 };
            match fault {
                Fault::BadRkey => rkey.0 ^= 0x100,
                // The range ends 8 bytes past the region (aligned, for atomics).
                Fault::OutOfBounds => va += 2048 - u64::from(len) + 8,
                Fault::UnalignedAtomic => va += 4,
                _ => {}
            }
            let mut w = send_wr(1, op, sge(&src, 0, len));
            w.rdma.remote_addr = va;
            w.rdma.rkey = rkey;
            w.atomic.remote_addr = va;
            w.atomic.rkey = rkey;
            w.atomic.compare_add = 1;
            p.a.post_send(c.qp_a, w).unwrap();
            p.a.post_send(c.qp_a, send_wr(2, WrOpcode::Send, vec![]))
                .unwrap();
            let mut wcs = vec![];
            let what = format!("{fault:?} {op:?}");
            run_for_wcs(
                &mut p,
                Side::A,
                &c,
                2,
                Instant::from_nanos(1_000_000_000),
                &mut wcs,
            );
            // An operation the QP's access flags do not enable is an invalid request
            // (IBTA vol. 1 §9.7.5.2, rxe `check_op_valid`); the region's own checks are
            // remote access errors.
            let qp_flags = matches!(fault, Fault::QpAccessFlags);
            let (want_wc, want_nak) = if qp_flags {
                (WcStatus::RemInvReqErr, NakCode::InvalidRequest)
            } else {
                (WcStatus::RemAccessErr, NakCode::RemoteAccessError)
            };
            assert_eq!(wcs[0].status, want_wc, "{what}");
            assert_eq!(wcs[1].status, WcStatus::WrFlushErr, "{what}");
            let naks = frames(&p, Side::B, Opcode::RC_ACK);
            assert_eq!(naks.len(), 1, "{what}");
            assert_eq!(naks[0].1, Some(Syndrome::Nak(want_nak)), "{what}");
            assert!(
                p.b.mr_bytes(target.lkey)
                    .unwrap()
                    .iter()
                    .all(|&b| b == 0xee),
                "{what}: target untouched"
            );
            assert!(
                p.a.mr_bytes(src.lkey).unwrap().iter().all(|&b| b == 0x11),
                "{what}: source untouched"
            );
            let b = p.b.qp_counters(c.qp_b).unwrap();
            let counted = if qp_flags {
                b.invalid_requests
            } else {
                b.remote_access_errors
            };
            assert_eq!(counted, 1, "{what}");
            assert_eq!(p.b.qp_counters(c.qp_b).unwrap().naks_sent, 1, "{what}");
            assert_eq!(p.a.qp_counters(c.qp_a).unwrap().naks_received, 1, "{what}");
            assert_eq!(
                p.b.qp_counters(c.qp_b).unwrap().atomics_executed,
                0,
                "{what}"
            );
            assert_eq!(
                p.a.query_qp(c.qp_a).unwrap().qp_state,
                QpState::Err,
                "{what}"
            );
            // Class C errors are fatal for the responder as well (rxe behaves so).
            assert_eq!(
                p.b.query_qp(c.qp_b).unwrap().qp_state,
                QpState::Err,
                "{what}"
            );
        }
    }
}

#[test]
fn receive_too_small_is_loc_len_err_there_and_rem_inv_req_here() {
    let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
    p.capture = Some(Vec::new());
    let src = mr(&mut p, Side::A, &c, 3000, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 3000, Access::LOCAL_WRITE);
    p.b.post_recv(c.qp_b, recv_wr(7, sge(&dst, 0, 1500)))
        .unwrap();
    p.a.post_send(c.qp_a, send_wr(1, WrOpcode::Send, sge(&src, 0, 3000)))
        .unwrap();
    let mut wcs = vec![];
    run_for_wcs(
        &mut p,
        Side::A,
        &c,
        1,
        Instant::from_nanos(1_000_000_000),
        &mut wcs,
    );
    assert_eq!(wcs[0].status, WcStatus::RemInvReqErr);
    let rx = poll(&mut p, Side::B, &c);
    assert_eq!((rx[0].wr_id, rx[0].status), (7, WcStatus::LocLenErr));
    let naks = frames(&p, Side::B, Opcode::RC_ACK);
    assert_eq!(
        naks.last().unwrap().1,
        Some(Syndrome::Nak(NakCode::InvalidRequest))
    );
}

#[test]
fn bad_local_key_is_loc_prot_err_in_order() {
    let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
    let src = mr(&mut p, Side::A, &c, 64, Access::NONE);
    let dst = mr(&mut p, Side::B, &c, 64, Access::ALL);
    p.b.post_recv(c.qp_b, recv_wr(1, sge(&dst, 0, 64))).unwrap();
    p.a.post_send(c.qp_a, send_wr(1, WrOpcode::Send, sge(&src, 0, 64)))
        .unwrap();
    // READ into a region without local write: a local protection error.
    let mut r = send_wr(2, WrOpcode::RdmaRead, sge(&src, 0, 8));
    r.rdma.remote_addr = dst.addr;
    r.rdma.rkey = dst.rkey;
    p.a.post_send(c.qp_a, r).unwrap();
    let mut bad = sge(&src, 0, 64);
    bad[0].lkey.0 ^= 0x100;
    p.a.post_send(c.qp_a, send_wr(3, WrOpcode::Send, bad))
        .unwrap();
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
            (1, WcStatus::Success),
            (2, WcStatus::LocProtErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.a.query_qp(c.qp_a).unwrap().qp_state, QpState::Err);
}
