//! UC QPs on virtual time (IBTA vol. 1 §9.4; rxe `check_psn` / `check_op_seq` for UC):
//! UC opcodes on the wire, no ACKs, completion on transmission, a PSN gap drops the rest
//! of the message (a SEND is never delivered torn), resynchronisation on the next
//! FIRST/ONLY, WRITE with immediate, and the UC `post_send` / `modify_qp` rules.

use xrnic::proto::{Instant, RxVerdict};
#[path = "transport_common/mod.rs"]
mod common;

use common::*;
use xrnic::proto::{
    Access, AttrMask, MrInfo, QpAttr, QpState, QpType, VerbsError, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode, uc,
};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair, RcPair, Side};
use xrnic::wire::{FrameView, Opcode};

fn uc_opts() -> ConnectOpts {
    ConnectOpts {
        qp_type: QpType::Uc,
        ..ConnectOpts::default()
    }
}

/// Message `k`'s bytes: its number first, then a pattern of it.
fn pattern(k: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| match j {
            0..4 => k.to_le_bytes()[j],
            _ => (k as usize * 31 + j * 7) as u8,
        })
        .collect()
}

/// Every frame side `from` has ready now, in order (nothing delivered).
fn drain(p: &mut Pair, from: Side) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; xrnic::proto::MAX_FRAME_LEN];
    let now = p.now;
    while let Some(n) = p.dev(from).poll_transmit(now, &mut buf) {
        out.push(buf[..n].to_vec());
    }
    out
}

fn opcode_of(f: &[u8]) -> Opcode {
    FrameView::parse(f).unwrap().repr().roce.bth.opcode
}

fn setup(sizes: &[usize]) -> (Pair, RcPair, MrInfo, MrInfo, Vec<usize>) {
    let (mut p, c) = pair(LinkConfig::default(), &uc_opts());
    let total: usize = sizes.iter().sum();
    let src = mr(&mut p, Side::A, &c, total.max(1), Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 4096 * sizes.len().max(1), Access::ALL);
    let mut offs = Vec::new();
    let mut off = 0;
    for (k, &n) in sizes.iter().enumerate() {
        p.dev(Side::A).mr_bytes_mut(src.lkey).unwrap()[off..off + n]
            .copy_from_slice(&pattern(k as u32, n));
        offs.push(off);
        off += n;
    }
    (p, c, src, dst, offs)
}

#[test]
fn uc_send_uses_uc_opcodes_completes_on_transmission_and_gets_no_ack() {
    let sizes = [3000usize, 10, 0];
    let (mut p, c, src, dst, offs) = setup(&sizes);
    for k in 0..sizes.len() {
        let r = recv_wr(k as u64, sge(&dst, 4096 * k as u64, 4096));
        p.dev(Side::B).post_recv(c.qp_b, r).unwrap();
        let w = send_wr(
            k as u64,
            WrOpcode::Send,
            sge(&src, offs[k] as u64, sizes[k] as u32),
        );
        p.dev(Side::A).post_send(c.qp_a, w).unwrap();
    }
    let frames = drain(&mut p, Side::A);
    let ops: Vec<u8> = frames.iter().map(|f| opcode_of(f).0).collect();
    // SEND FIRST, MIDDLE, LAST (3000 bytes at MTU 1024), ONLY, ONLY: the UC codes.
    assert_eq!(ops, [0x20, 0x21, 0x22, 0x24, 0x24]);
    for f in &frames {
        assert!(!FrameView::parse(f).unwrap().repr().roce.bth.ack_req);
    }
    // All three WRs completed as their last packets left, before any delivery.
    let wcs = poll(&mut p, Side::A, &c);
    assert_eq!(wcs.len(), 3, "{wcs:?}");
    assert!(
        wcs.iter()
            .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Send)
    );
    assert_eq!(p.dev(Side::A).poll_timeout(), None, "no ACK timer on UC");
    let now = p.now;
    for f in &frames {
        assert_eq!(p.dev(Side::B).handle_frame(now, f), RxVerdict::Taken);
    }
    let got = poll(&mut p, Side::B, &c);
    assert_eq!(got.len(), 3);
    for (k, w) in got.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status, w.byte_len),
            (k as u64, WcStatus::Success, sizes[k] as u32)
        );
        let b = &p.dev(Side::B).mr_bytes(dst.lkey).unwrap()[4096 * k..4096 * k + sizes[k]];
        assert_eq!(b, &pattern(k as u32, sizes[k])[..]);
    }
    // The responder never answers.
    assert!(drain(&mut p, Side::B).is_empty());
    let cb = p.dev(Side::B).qp_counters(c.qp_b).unwrap();
    assert_eq!(
        (cb.acks_sent, cb.naks_sent, cb.uc_messages_dropped),
        (0, 0, 0)
    );
}

/// Drop chosen packets by hand and check exactly which messages arrive and what the
/// counters say.
#[test]
fn uc_psn_gap_drops_the_rest_of_the_message_and_resyncs_on_first() {
    // Messages: 0 = 3 packets, 1 = 3 packets, 2 = 1 packet, 3 = 2 packets, 4 = 1 packet.
    let sizes = [3000usize, 2100, 100, 2000, 50];
    let (mut p, c, src, dst, offs) = setup(&sizes);
    for k in 0..sizes.len() {
        let r = recv_wr(100 + k as u64, sge(&dst, 4096 * k as u64, 4096));
        p.dev(Side::B).post_recv(c.qp_b, r).unwrap();
        let w = send_wr(
            k as u64,
            WrOpcode::Send,
            sge(&src, offs[k] as u64, sizes[k] as u32),
        );
        p.dev(Side::A).post_send(c.qp_a, w).unwrap();
    }
    let frames = drain(&mut p, Side::A);
    assert_eq!(frames.len(), 3 + 3 + 1 + 2 + 1);
    // Lose message 0's MIDDLE (index 1) and message 3's LAST (index 8).
    let now = p.now;
    for (i, f) in frames.iter().enumerate() {
        if i != 1 && i != 8 {
            assert_eq!(p.dev(Side::B).handle_frame(now, f), RxVerdict::Taken);
        }
    }
    let got = poll(&mut p, Side::B, &c);
    // Message 0 torn: dropped (its LAST too), never delivered. 1 and 2 arrive whole in
    // the first two receive WQEs (the torn SEND's WQE served message 1). Message 3 has
    // no LAST: dropped when message 4's ONLY starts a new one, which arrives.
    let delivered: Vec<(u64, u32)> = got.iter().map(|w| (w.wr_id, w.byte_len)).collect();
    assert_eq!(delivered, [(100, 2100), (101, 100), (102, 50)]);
    assert!(got.iter().all(|w| w.status == WcStatus::Success));
    for (slot, k) in [(0usize, 1u32), (1, 2), (2, 4)] {
        let n = sizes[k as usize];
        let b = &p.dev(Side::B).mr_bytes(dst.lkey).unwrap()[4096 * slot..4096 * slot + n];
        assert_eq!(b, &pattern(k, n)[..], "message {k} in WQE {slot}");
    }
    let cb = p.dev(Side::B).qp_counters(c.qp_b).unwrap();
    assert_eq!(cb.uc_messages_dropped, 2, "{cb:?}");
    // Message 0's LAST (its MIDDLE was lost); message 3's FIRST was executed.
    assert_eq!(cb.uc_packets_dropped, 1, "{cb:?}");
    // 0's LAST after the lost MIDDLE, 1's FIRST (resynchronising), 4's ONLY after the
    // lost LAST of 3.
    assert_eq!(cb.out_of_sequence, 3);
    assert_eq!((cb.naks_sent, cb.acks_sent), (0, 0));
    // Nothing was sent back: no ACK, no NAK.
    assert!(drain(&mut p, Side::B).is_empty());
    // Two receive WQEs are left (the torn messages used none).
    assert_eq!(p.dev(Side::B).resources().qps[0].rq_wrs, 2);
}

#[test]
fn uc_write_with_and_without_immediate_and_torn_write_keeps_placed_bytes() {
    let sizes = [2500usize, 2500, 300];
    let (mut p, c, src, dst, offs) = setup(&sizes);
    p.dev(Side::B)
        .post_recv(c.qp_b, recv_wr(7, Vec::new()))
        .unwrap();
    let ops = [
        WrOpcode::RdmaWrite,
        WrOpcode::RdmaWriteWithImm,
        WrOpcode::RdmaWriteWithImm,
    ];
    for k in 0..3 {
        let mut w = send_wr(k as u64, ops[k], sge(&src, offs[k] as u64, sizes[k] as u32));
        w.rdma.remote_addr = dst.addr + 4096 * k as u64;
        w.rdma.rkey = dst.rkey;
        w.imm_data = 0x1000 + k as u32;
        p.dev(Side::A).post_send(c.qp_a, w).unwrap();
    }
    let frames = drain(&mut p, Side::A);
    let ops: Vec<u8> = frames.iter().map(|f| opcode_of(f).0).collect();
    // WRITE FIRST, MIDDLE, LAST; FIRST, MIDDLE, LAST with immediate; ONLY with immediate.
    assert_eq!(ops, [0x26, 0x27, 0x28, 0x26, 0x27, 0x29, 0x2b]);
    assert_eq!(poll(&mut p, Side::A, &c).len(), 3);
    // Lose the second WRITE's LAST (index 5): its first 2048 bytes are placed, no
    // completion; the third arrives with its immediate.
    let now = p.now;
    for (i, f) in frames.iter().enumerate() {
        if i != 5 {
            assert_eq!(p.dev(Side::B).handle_frame(now, f), RxVerdict::Taken);
        }
    }
    let got: Vec<WorkCompletion> = poll(&mut p, Side::B, &c);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (
            got[0].wr_id,
            got[0].opcode,
            got[0].imm_data,
            got[0].byte_len
        ),
        (7, WcOpcode::RecvRdmaWithImm, Some(0x1002), 300)
    );
    let mem = p.dev(Side::B).mr_bytes(dst.lkey).unwrap().to_vec();
    assert_eq!(&mem[..2500], &pattern(0, 2500)[..]);
    assert_eq!(
        &mem[4096..4096 + 2048],
        &pattern(1, 2500)[..2048],
        "placed bytes stay"
    );
    assert!(mem[4096 + 2048..4096 + 2500].iter().all(|&b| b == 0));
    assert_eq!(&mem[8192..8192 + 300], &pattern(2, 300)[..]);
    let cb = p.dev(Side::B).qp_counters(c.qp_b).unwrap();
    assert_eq!(cb.uc_messages_dropped, 1);
}

#[test]
fn uc_write_with_immediate_and_no_receive_wqe_is_dropped_silently() {
    let (mut p, c, src, dst, offs) = setup(&[64]);
    let mut w = send_wr(1, WrOpcode::RdmaWriteWithImm, sge(&src, offs[0] as u64, 64));
    w.rdma.remote_addr = dst.addr;
    w.rdma.rkey = dst.rkey;
    p.dev(Side::A).post_send(c.qp_a, w).unwrap();
    p.run_until(Instant::from_nanos(10_000_000), |_| false);
    let cb = p.dev(Side::B).qp_counters(c.qp_b).unwrap();
    assert_eq!(
        (cb.out_of_buffer, cb.uc_messages_dropped, cb.rnr_naks_sent),
        (1, 1, 0)
    );
    assert!(poll(&mut p, Side::B, &c).is_empty());
    // The requester completed it anyway: UC has no acknowledgement.
    let a = poll(&mut p, Side::A, &c);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].status, WcStatus::Success);
}

/// A seeded lossy link with many messages of 1 to 4 packets: every delivered message is
/// byte-exact and whole, each lost one is absent, and the counters account for them.
#[test]
fn uc_lossy_link_delivers_whole_messages_or_none() {
    const N: usize = 400;
    let link = LinkConfig {
        loss: 0.04,
        delay_ns: 2_000,
        ..LinkConfig::default()
    };
    let mut p = Pair::new(link, 0x005e_ed0c);
    let c = p.connect(&uc_opts()).unwrap();
    let sizes: Vec<usize> = (0..N).map(|k| 4 + (k * 977) % 4000).collect();
    let total: usize = sizes.iter().sum();
    let src = mr(&mut p, Side::A, &c, total, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 4096 * N, Access::ALL);
    let mut off = 0;
    for (k, &n) in sizes.iter().enumerate() {
        p.dev(Side::A).mr_bytes_mut(src.lkey).unwrap()[off..off + n]
            .copy_from_slice(&pattern(k as u32, n));
        let r = recv_wr(k as u64, sge(&dst, 4096 * k as u64, 4096));
        p.dev(Side::B).post_recv(c.qp_b, r).unwrap();
        let w = send_wr(k as u64, WrOpcode::Send, sge(&src, off as u64, n as u32));
        p.dev(Side::A).post_send(c.qp_a, w).unwrap();
        off += n;
    }
    let mut a_wcs = Vec::new();
    run_for_wcs(
        &mut p,
        Side::A,
        &c,
        N,
        Instant::from_nanos(1_000_000_000),
        &mut a_wcs,
    );
    p.run_until(Instant::from_nanos(1_000_000_000), |_| false);
    assert!(a_wcs.iter().all(|w| w.status == WcStatus::Success));
    let got = poll(&mut p, Side::B, &c);
    let mem = p.dev(Side::B).mr_bytes(dst.lkey).unwrap().to_vec();
    let mut last_k = None;
    for (slot, w) in got.iter().enumerate() {
        assert_eq!(w.status, WcStatus::Success);
        // WQEs are used in order; the message a WQE holds names itself.
        assert_eq!(w.wr_id, slot as u64);
        let b = &mem[4096 * slot..4096 * slot + w.byte_len as usize];
        let k = u32::from_le_bytes(b[..4].try_into().unwrap_or([0xff; 4]));
        let n = *sizes.get(k as usize).expect("a message number");
        assert_eq!(w.byte_len as usize, n, "message {k} whole");
        assert_eq!(b, &pattern(k, n)[..], "message {k} byte for byte");
        assert!(last_k.is_none_or(|l| k > l), "in order, each once");
        last_k = Some(k);
    }
    let cb = p.dev(Side::B).qp_counters(c.qp_b).unwrap();
    let lost = p.link.stats.lost;
    assert!(lost > 10, "the link lost frames ({lost})");
    assert!(
        got.len() < N && got.len() > N / 2,
        "{} of {N} delivered",
        got.len()
    );
    // Every message is delivered, counted as dropped (some packet of it arrived), or
    // lost whole (each such one took at least one lost frame with it).
    let dropped = cb.uc_messages_dropped as usize;
    assert!(dropped > 0);
    assert!(got.len() + dropped <= N);
    assert!(N - got.len() - dropped <= lost as usize);
    assert_eq!((cb.acks_sent, cb.naks_sent), (0, 0));
    assert_eq!(
        p.dev(Side::A)
            .qp_counters(c.qp_a)
            .unwrap()
            .retransmitted_packets,
        0
    );
}

#[test]
fn uc_post_send_refuses_read_atomics_and_invalidate() {
    let (mut p, c, src, _dst, _) = setup(&[8]);
    for op in [
        WrOpcode::RdmaRead,
        WrOpcode::AtomicCmpAndSwp,
        WrOpcode::AtomicFetchAndAdd,
        WrOpcode::SendWithInv,
    ] {
        let w = send_wr(1, op, sge(&src, 0, 8));
        assert!(
            matches!(
                p.dev(Side::A).post_send(c.qp_a, w),
                Err(VerbsError::InvalidValue(_))
            ),
            "{op:?}"
        );
    }
    assert_eq!(p.dev(Side::A).send_queue_len(c.qp_a), 0);
}

#[test]
fn uc_state_moves_need_only_the_uc_attributes() {
    let (mut p, _c, _, _, _) = setup(&[1]);
    let d = p.dev(Side::A);
    let pd = d.alloc_pd();
    let cq = d.create_cq(8);
    let init = xrnic::proto::QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        max_send_wr: 4,
        max_recv_wr: 4,
        sq_sig_all: false,
        qp_type: QpType::Uc,
        srq: None,
    };
    let q = d.create_qp(pd, &init).unwrap();
    let mut a = QpAttr::rc_init(Access::REMOTE_WRITE);
    d.modify_qp(q, &a, AttrMask::RC_INIT).unwrap();
    a.qp_state = QpState::Rtr;
    a.dest_qp_num = xrnic::wire::Qpn::new(0x40);
    // RC's RTR mask names MAX_DEST_RD_ATOMIC and MIN_RNR_TIMER: not UC attributes.
    assert!(matches!(
        d.modify_qp(q, &a, AttrMask::RC_RTR),
        Err(VerbsError::UnexpectedAttributes(_))
    ));
    assert_eq!(
        d.modify_qp(q, &a, uc::UC_RTR.without(AttrMask::RQ_PSN)),
        Err(VerbsError::MissingAttributes(AttrMask::RQ_PSN))
    );
    d.modify_qp(q, &a, uc::UC_RTR).unwrap();
    a.qp_state = QpState::Rts;
    assert!(matches!(
        d.modify_qp(q, &a, AttrMask::RC_RTS),
        Err(VerbsError::UnexpectedAttributes(_))
    ));
    d.modify_qp(q, &a, uc::UC_RTS).unwrap();
    assert_eq!(d.query_qp(q).unwrap().qp_state, QpState::Rts);
    let res = d.resources();
    let line = res.qp_lines();
    assert!(
        line.contains(&format!("lqpn {} rqpn 64 type UC state RTS", q.value())),
        "{line}"
    );
}

#[test]
fn rc_qp_drops_uc_opcodes_and_uc_qp_drops_rc_opcodes() {
    // An RC pair and a UC pair; a UC frame turned RC (and back) is refused by the QP.
    let (mut p, c, src, dst, offs) = setup(&[16]);
    p.dev(Side::B)
        .post_recv(c.qp_b, recv_wr(1, sge(&dst, 0, 64)))
        .unwrap();
    let w = send_wr(1, WrOpcode::Send, sge(&src, offs[0] as u64, 16));
    p.dev(Side::A).post_send(c.qp_a, w).unwrap();
    let f = drain(&mut p, Side::A).remove(0);
    let mut v = FrameView::parse(&f).unwrap().repr();
    v.roce.bth.opcode = Opcode::RC_SEND_ONLY;
    let mut rc = vec![0u8; f.len() + 64];
    let n = v.emit(&mut rc).unwrap();
    let now = p.now;
    assert_eq!(
        p.dev(Side::B).handle_frame(now, &rc[..n]),
        RxVerdict::WrongService
    );
    assert!(poll(&mut p, Side::B, &c).is_empty());
    assert_eq!(
        p.dev(Side::B).qp_counters(c.qp_b).unwrap().invalid_requests,
        1
    );
    assert_eq!(p.dev(Side::B).handle_frame(now, &f), RxVerdict::Taken);
    assert_eq!(poll(&mut p, Side::B, &c).len(), 1);
}
