//! The fence indicator (IBTA vol. 1 §10.8, work request processing: a work request with the fence
//! flag is not begun until every RDMA READ and atomic before it on the send queue has
//! completed; rxe `req_next_wqe` holds such a WQE while `qp->req.rd_atomic` is in use).
//! Each rule is shown on the wire (the capture) and in memory, beside a control run
//! without the flag that shows what the fence prevents.

#[path = "transport_common/mod.rs"]
mod common;

use common::*;
use xrnic::proto::{Access, Instant, SendFlags, WcStatus, WrOpcode};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair, RcPair, Side};
use xrnic::wire::Opcode;

const LEN: u32 = 16 * 1024;
/// A link slow enough that a 16 KiB READ's responses take many packet times to come back.
fn slow_link() -> LinkConfig {
    LinkConfig {
        delay_ns: 50_000,
        ..LinkConfig::default()
    }
}

fn limit() -> Instant {
    Instant::from_nanos(1_000_000_000)
}

fn captured_pair() -> (Pair, RcPair) {
    let (mut p, c) = pair(slow_link(), &ConnectOpts::default());
    p.capture = Some(Vec::new());
    (p, c)
}

/// First send time (ns) of any of `ops` from `from`.
fn first_of(p: &Pair, from: Side, ops: &[Opcode]) -> u64 {
    ops.iter()
        .flat_map(|&o| frames(p, from, o))
        .map(|f| f.0)
        .min()
        .expect("frame sent")
}

/// Last send time (ns) of any of `ops` from `from`.
fn last_of(p: &Pair, from: Side, ops: &[Opcode]) -> u64 {
    ops.iter()
        .flat_map(|&o| frames(p, from, o))
        .map(|f| f.0)
        .max()
        .expect("frame sent")
}

const READ_RESPONSES: [Opcode; 4] = [
    Opcode::RC_READ_RESPONSE_FIRST,
    Opcode::RC_READ_RESPONSE_MIDDLE,
    Opcode::RC_READ_RESPONSE_LAST,
    Opcode::RC_READ_RESPONSE_ONLY,
];
const WRITES: [Opcode; 4] = [
    Opcode::RC_WRITE_FIRST,
    Opcode::RC_WRITE_MIDDLE,
    Opcode::RC_WRITE_LAST,
    Opcode::RC_WRITE_ONLY,
];

/// READ B's `remote` into A's `local`, then WRITE `local` to B's `copy`, the WRITE fenced
/// or not: the classic use of the fence (forward what a READ fetched). Returns B's copy.
fn read_then_forward(fence: bool) -> (Pair, Vec<u8>, Vec<u8>) {
    let (mut p, c) = captured_pair();
    let local = mr(&mut p, Side::A, &c, LEN as usize, Access::LOCAL_WRITE);
    let remote = mr(&mut p, Side::B, &c, 2 * LEN as usize, Access::ALL);
    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8 + 1).collect();
    p.b.mr_bytes_mut(remote.lkey).unwrap()[..LEN as usize].copy_from_slice(&pattern);

    let mut read = send_wr(1, WrOpcode::RdmaRead, sge(&local, 0, LEN));
    read.rdma.remote_addr = remote.addr;
    read.rdma.rkey = remote.rkey;
    let mut write = send_wr(2, WrOpcode::RdmaWrite, sge(&local, 0, LEN));
    write.rdma.remote_addr = remote.addr + u64::from(LEN);
    write.rdma.rkey = remote.rkey;
    if fence {
        write.send_flags = write.send_flags | SendFlags::FENCE;
    }
    p.a.post_send(c.qp_a, read).unwrap();
    p.a.post_send(c.qp_a, write).unwrap();
    let mut wcs = Vec::new();
    run_for_wcs(&mut p, Side::A, &c, 2, limit(), &mut wcs);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2]);
    let copy = p.b.mr_bytes(remote.lkey).unwrap()[LEN as usize..].to_vec();
    (p, copy, pattern)
}

#[test]
fn a_fenced_write_starts_after_the_read_before_it_completed() {
    let (p, copy, pattern) = read_then_forward(true);
    // On the wire: A's first WRITE packet leaves after B's last READ response (and after
    // it arrived: the link delay lies between).
    let last_response = last_of(&p, Side::B, &READ_RESPONSES);
    let first_write = first_of(&p, Side::A, &WRITES);
    assert!(
        first_write >= last_response + slow_link().delay_ns,
        "fenced WRITE at {first_write} ns, last READ response sent at {last_response} ns"
    );
    // In memory: the WRITE forwarded what the READ fetched.
    assert_eq!(copy, pattern);
}

#[test]
fn without_the_fence_the_write_overtakes_the_read() {
    // The control: the same work requests without the flag. The WRITE is sent behind the
    // READ request at once, so it carries the buffer before the READ filled it.
    let (p, copy, pattern) = read_then_forward(false);
    let first_response = first_of(&p, Side::B, &READ_RESPONSES);
    let first_write = first_of(&p, Side::A, &WRITES);
    assert!(
        first_write < first_response,
        "unfenced WRITE at {first_write} ns, first READ response at {first_response} ns"
    );
    assert_ne!(copy, pattern);
    assert!(
        copy.iter().all(|&b| b == 0),
        "the WRITE carried the unfilled buffer"
    );
}

#[test]
fn a_fenced_send_waits_for_an_atomic() {
    let (mut p, c) = captured_pair();
    let local = mr(&mut p, Side::A, &c, 64, Access::LOCAL_WRITE);
    let target = mr(&mut p, Side::B, &c, 64, Access::ALL);
    let rbuf = mr(&mut p, Side::B, &c, 64, Access::LOCAL_WRITE);
    p.b.post_recv(c.qp_b, recv_wr(9, sge(&rbuf, 0, 64)))
        .unwrap();
    let mut fadd = send_wr(1, WrOpcode::AtomicFetchAndAdd, sge(&local, 0, 8));
    fadd.atomic.remote_addr = target.addr;
    fadd.atomic.rkey = target.rkey;
    fadd.atomic.compare_add = 5;
    let mut send = send_wr(2, WrOpcode::Send, sge(&local, 0, 8));
    send.send_flags = send.send_flags | SendFlags::FENCE;
    p.a.post_send(c.qp_a, fadd).unwrap();
    p.a.post_send(c.qp_a, send).unwrap();
    let mut wcs = Vec::new();
    run_for_wcs(&mut p, Side::A, &c, 2, limit(), &mut wcs);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let atomic_ack = last_of(&p, Side::B, &[Opcode::RC_ATOMIC_ACK]);
    let first_send = first_of(&p, Side::A, &[Opcode::RC_SEND_ONLY]);
    assert!(
        first_send >= atomic_ack + slow_link().delay_ns,
        "fenced SEND at {first_send} ns, atomic ACK sent at {atomic_ack} ns"
    );
    // The SEND arrived, and the FETCH_ADD was executed once.
    let mut rwc = Vec::new();
    run_for_wcs(&mut p, Side::B, &c, 1, limit(), &mut rwc);
    assert_eq!(rwc[0].status, WcStatus::Success);
    assert_eq!(p.b.mr_bytes(target.lkey).unwrap()[..8], 5u64.to_le_bytes());
}

#[test]
fn the_fence_does_not_wait_for_writes() {
    // Only READs and atomics hold a fenced request back (IBTA vol. 1 §10.8): a fenced WRITE behind
    // a WRITE leaves right behind it, before the first WRITE is acknowledged.
    let (mut p, c) = captured_pair();
    let src = mr(&mut p, Side::A, &c, 2 * LEN as usize, Access::LOCAL_WRITE);
    let dst = mr(&mut p, Side::B, &c, 2 * LEN as usize, Access::ALL);
    for i in 0..2u64 {
        let off = i * u64::from(LEN);
        let mut w = send_wr(i + 1, WrOpcode::RdmaWrite, sge(&src, off, LEN));
        w.rdma.remote_addr = dst.addr + off;
        w.rdma.rkey = dst.rkey;
        if i == 1 {
            w.send_flags = w.send_flags | SendFlags::FENCE;
        }
        p.a.post_send(c.qp_a, w).unwrap();
    }
    let mut wcs = Vec::new();
    run_for_wcs(&mut p, Side::A, &c, 2, limit(), &mut wcs);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let first_ack = first_of(&p, Side::B, &[Opcode::RC_ACK]);
    // The second WRITE's FIRST packet is the second RC_WRITE_FIRST on the wire.
    let mut firsts: Vec<u64> = frames(&p, Side::A, Opcode::RC_WRITE_FIRST)
        .iter()
        .map(|f| f.0)
        .collect();
    firsts.sort_unstable();
    assert_eq!(firsts.len(), 2, "{firsts:?}");
    assert!(
        firsts[1] < first_ack,
        "fenced WRITE at {} ns, first ACK at {first_ack} ns",
        firsts[1]
    );
}
