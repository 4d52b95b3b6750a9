//! Responder behaviour seen frame by frame: frames of A are handed to B by hand (no link),
//! in chosen orders, and B's answers are read back.

use xrnic::proto::{Instant, RxVerdict};
#[path = "transport_common/mod.rs"]
mod common;

use common::*;
use xrnic::proto::{Access, MAX_FRAME_LEN, WrOpcode};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair, RcPair, Side};
use xrnic::wire::{FrameRepr, NakCode, Opcode, Syndrome};

/// Every frame `side` wants to send now.
fn drain(p: &mut Pair, side: Side) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    while let Some(n) = p.dev(side).poll_transmit(Instant::ZERO, &mut buf) {
        out.push(buf[..n].to_vec());
    }
    out
}

/// (opcode, PSN, syndrome, MSN, atomic original value) of a frame.
fn info(f: &[u8]) -> (Opcode, u32, Option<Syndrome>, Option<u32>, Option<u64>) {
    let r = FrameRepr::parse(f).unwrap();
    (
        r.roce.bth.opcode,
        r.roce.bth.psn.value(),
        r.roce.ext.aeth.map(|a| a.syndrome),
        r.roce.ext.aeth.map(|a| a.msn.value()),
        r.roce.ext.atomic_ack.map(|a| a.orig),
    )
}

fn setup() -> (Pair, RcPair, xrnic::proto::MrInfo, xrnic::proto::MrInfo) {
    let (mut p, c) = pair(LinkConfig::default(), &ConnectOpts::default());
    let src = mr(&mut p, Side::A, &c, 1 << 16, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 1 << 16, Access::ALL);
    (p, c, src, dst)
}

#[test]
fn acks_coalesce_and_carry_the_msn() {
    let (mut p, c, src, dst) = setup();
    for i in 0..5 {
        p.b.post_recv(c.qp_b, recv_wr(i, sge(&dst, 0, 64))).unwrap();
        p.a.post_send(c.qp_a, send_wr(i, WrOpcode::Send, sge(&src, 0, 8)))
            .unwrap();
    }
    let frames = drain(&mut p, Side::A);
    assert_eq!(frames.len(), 5);
    let psn0 = info(&frames[0]).1;
    for f in &frames {
        assert_eq!(p.b.handle_frame(Instant::ZERO, f), RxVerdict::Taken);
    }
    // Five AckReq packets handled before B transmits: one ACK, for the last PSN, MSN 5.
    let acks = drain(&mut p, Side::B);
    assert_eq!(acks.len(), 1);
    let (op, psn, syn, msn, _) = info(&acks[0]);
    assert_eq!(op, Opcode::RC_ACK);
    assert_eq!(psn, (psn0 + 4) & 0xff_ffff);
    assert_eq!(syn, Some(Syndrome::ACK_UNLIMITED));
    assert_eq!(msn, Some(5));
    assert_eq!(p.a.handle_frame(Instant::ZERO, &acks[0]), RxVerdict::Taken);
    assert_eq!(
        poll(&mut p, Side::A, &c).len(),
        5,
        "one ACK completes all five"
    );
}

#[test]
fn out_of_sequence_is_naked_once_until_the_expected_psn_arrives() {
    let (mut p, c, src, dst) = setup();
    for i in 0..6 {
        p.b.post_recv(c.qp_b, recv_wr(i, sge(&dst, 0, 64))).unwrap();
        p.a.post_send(c.qp_a, send_wr(i, WrOpcode::Send, sge(&src, 0, 8)))
            .unwrap();
    }
    let f = drain(&mut p, Side::A);
    let psn = |i: usize| info(&f[i]).1;
    assert_eq!(p.b.handle_frame(Instant::ZERO, &f[0]), RxVerdict::Taken);
    for i in [2, 3, 4] {
        assert_eq!(p.b.handle_frame(Instant::ZERO, &f[i]), RxVerdict::Taken);
    }
    let out = drain(&mut p, Side::B);
    let naks: Vec<_> = out
        .iter()
        .map(|x| info(x))
        .filter(|x| x.2 == Some(Syndrome::Nak(NakCode::PsnSequenceError)))
        .collect();
    assert_eq!(naks.len(), 1, "one NAK for three out-of-sequence packets");
    assert_eq!(naks[0].1, psn(1), "the NAK names the expected PSN");
    let cb = p.b.qp_counters(c.qp_b).unwrap();
    assert_eq!(cb.out_of_sequence, 3);
    // The expected packet arrives; a new gap earns a new NAK.
    assert_eq!(p.b.handle_frame(Instant::ZERO, &f[1]), RxVerdict::Taken);
    assert_eq!(p.b.handle_frame(Instant::ZERO, &f[3]), RxVerdict::Taken);
    let out = drain(&mut p, Side::B);
    let kinds: Vec<_> = out.iter().map(|x| (info(x).2, info(x).1)).collect();
    assert_eq!(
        kinds,
        [
            (Some(Syndrome::ACK_UNLIMITED), psn(1)),
            (Some(Syndrome::Nak(NakCode::PsnSequenceError)), psn(2))
        ]
    );
    assert_eq!(
        poll(&mut p, Side::B, &c).len(),
        2,
        "only in-sequence SENDs were received"
    );
}

#[test]
fn duplicate_atomics_are_answered_from_the_cache_not_executed_again() {
    let (mut p, c, src, dst) = setup();
    p.b.mr_bytes_mut(dst.lkey).unwrap()[..8].copy_from_slice(&100u64.to_ne_bytes());
    let mut w = send_wr(1, WrOpcode::AtomicFetchAndAdd, sge(&src, 0, 8));
    w.atomic.remote_addr = dst.addr;
    w.atomic.rkey = dst.rkey;
    w.atomic.compare_add = 5;
    p.a.post_send(c.qp_a, w).unwrap();
    let f = drain(&mut p, Side::A);
    assert_eq!(f.len(), 1);
    for _ in 0..3 {
        assert_eq!(p.b.handle_frame(Instant::ZERO, &f[0]), RxVerdict::Taken);
    }
    let out = drain(&mut p, Side::B);
    assert_eq!(out.len(), 3);
    for x in &out {
        let (op, _, _, _, orig) = info(x);
        assert_eq!((op, orig), (Opcode::RC_ATOMIC_ACK, Some(100)));
    }
    assert_eq!(
        u64::from_ne_bytes(p.b.mr_bytes(dst.lkey).unwrap()[..8].try_into().unwrap()),
        105
    );
    let cb = p.b.qp_counters(c.qp_b).unwrap();
    assert_eq!(
        (
            cb.atomics_executed,
            cb.duplicate_request,
            cb.responses_replayed
        ),
        (1, 2, 2)
    );
}

#[test]
fn a_duplicate_atomic_with_other_operands_is_an_invalid_request() {
    let (mut p, c, src, dst) = setup();
    let mut w = send_wr(1, WrOpcode::AtomicFetchAndAdd, sge(&src, 0, 8));
    w.atomic.remote_addr = dst.addr;
    w.atomic.rkey = dst.rkey;
    w.atomic.compare_add = 5;
    p.a.post_send(c.qp_a, w).unwrap();
    let f = drain(&mut p, Side::A);
    assert_eq!(p.b.handle_frame(Instant::ZERO, &f[0]), RxVerdict::Taken);
    let mut other = FrameRepr::parse(&f[0]).unwrap();
    other.roce.ext.atomic.as_mut().unwrap().swap_add = 6;
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let n = other.emit(&mut buf).unwrap();
    assert_eq!(p.b.handle_frame(Instant::ZERO, &buf[..n]), RxVerdict::Taken);
    let out = drain(&mut p, Side::B);
    assert_eq!(info(&out[0]).0, Opcode::RC_ATOMIC_ACK);
    assert_eq!(
        info(&out[1]).2,
        Some(Syndrome::Nak(NakCode::InvalidRequest))
    );
    assert_eq!(p.b.qp_counters(c.qp_b).unwrap().atomics_executed, 1);
    assert_eq!(
        u64::from_ne_bytes(p.b.mr_bytes(dst.lkey).unwrap()[..8].try_into().unwrap()),
        5
    );
}

#[test]
fn duplicate_read_is_answered_again_from_the_psn_asked_for() {
    let (mut p, c, src, dst) = setup();
    for (i, b) in p.b.mr_bytes_mut(dst.lkey).unwrap().iter_mut().enumerate() {
        *b = (i * 7) as u8;
    }
    let mut r = send_wr(1, WrOpcode::RdmaRead, sge(&src, 0, 4000));
    r.rdma.remote_addr = dst.addr;
    r.rdma.rkey = dst.rkey;
    p.a.post_send(c.qp_a, r).unwrap();
    let req = drain(&mut p, Side::A);
    assert_eq!(p.b.handle_frame(Instant::ZERO, &req[0]), RxVerdict::Taken);
    let resp = drain(&mut p, Side::B);
    let ops: Vec<_> = resp.iter().map(|x| info(x).0).collect();
    assert_eq!(
        ops,
        [
            Opcode::RC_READ_RESPONSE_FIRST,
            Opcode::RC_READ_RESPONSE_MIDDLE,
            Opcode::RC_READ_RESPONSE_MIDDLE,
            Opcode::RC_READ_RESPONSE_LAST
        ]
    );
    // A gets FIRST and LAST only: the gap is an implied NAK, and A asks again from the
    // second response's PSN, for the remaining 3000 bytes.
    assert_eq!(p.a.handle_frame(Instant::ZERO, &resp[0]), RxVerdict::Taken);
    assert_eq!(p.a.handle_frame(Instant::ZERO, &resp[3]), RxVerdict::Taken);
    let again = drain(&mut p, Side::A);
    assert_eq!(again.len(), 1);
    let r2 = FrameRepr::parse(&again[0]).unwrap();
    assert_eq!(r2.roce.bth.psn.value(), info(&resp[1]).1);
    let reth = r2.roce.ext.reth.unwrap();
    assert_eq!((reth.va, reth.dma_len), (dst.addr + 1024, 4000 - 1024));
    assert_eq!(p.a.qp_counters(c.qp_a).unwrap().implied_nak_seq_err, 1);
    // B answers the duplicate with a new run for the tail.
    assert_eq!(p.b.handle_frame(Instant::ZERO, &again[0]), RxVerdict::Taken);
    let tail = drain(&mut p, Side::B);
    let ops: Vec<_> = tail.iter().map(|x| info(x).0).collect();
    assert_eq!(
        ops,
        [
            Opcode::RC_READ_RESPONSE_FIRST,
            Opcode::RC_READ_RESPONSE_MIDDLE,
            Opcode::RC_READ_RESPONSE_LAST
        ]
    );
    for x in &tail {
        assert_eq!(p.a.handle_frame(Instant::ZERO, x), RxVerdict::Taken);
    }
    let wcs = poll(&mut p, Side::A, &c);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].byte_len, 4000);
    assert_eq!(
        p.a.mr_bytes(src.lkey).unwrap()[..4000],
        p.b.mr_bytes(dst.lkey).unwrap()[..4000]
    );
    let cb = p.b.qp_counters(c.qp_b).unwrap();
    assert_eq!(
        (
            cb.duplicate_request,
            cb.responses_replayed,
            cb.retransmitted_packets
        ),
        (1, 1, 3)
    );
}

#[test]
fn new_message_inside_a_send_is_an_invalid_request() {
    let (mut p, c, src, dst) = setup();
    p.b.post_recv(c.qp_b, recv_wr(1, sge(&dst, 0, 4096)))
        .unwrap();
    p.a.post_send(c.qp_a, send_wr(1, WrOpcode::Send, sge(&src, 0, 3000)))
        .unwrap();
    let f = drain(&mut p, Side::A);
    assert_eq!(info(&f[0]).0, Opcode::RC_SEND_FIRST);
    // FIRST, then FIRST again in place of MIDDLE (re-stamped with the next PSN).
    assert_eq!(p.b.handle_frame(Instant::ZERO, &f[0]), RxVerdict::Taken);
    let mut bogus = FrameRepr::parse(&f[0]).unwrap();
    bogus.roce.bth.psn = bogus.roce.bth.psn.add(1);
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let n = bogus.emit(&mut buf).unwrap();
    assert_eq!(p.b.handle_frame(Instant::ZERO, &buf[..n]), RxVerdict::Taken);
    let out = drain(&mut p, Side::B);
    assert_eq!(
        info(&out[0]).2,
        Some(Syndrome::Nak(NakCode::InvalidRequest))
    );
    assert_eq!(p.b.qp_counters(c.qp_b).unwrap().invalid_requests, 1);
}

#[test]
fn solicited_event_is_set_on_the_last_packet_only() {
    let (mut p, c, src, _) = setup();
    let mut w = send_wr(1, WrOpcode::SendWithImm, sge(&src, 0, 2500));
    w.send_flags = w.send_flags | xrnic::proto::SendFlags::SOLICITED;
    p.a.post_send(c.qp_a, w).unwrap();
    let f = drain(&mut p, Side::A);
    let se: Vec<_> = f
        .iter()
        .map(|x| {
            let r = FrameRepr::parse(x).unwrap();
            (r.roce.bth.opcode, r.roce.bth.solicited, r.roce.ext.immdt)
        })
        .collect();
    assert_eq!(
        se,
        [
            (Opcode::RC_SEND_FIRST, false, None),
            (Opcode::RC_SEND_MIDDLE, false, None),
            (Opcode::RC_SEND_LAST_IMM, true, Some(0))
        ]
    );
}
