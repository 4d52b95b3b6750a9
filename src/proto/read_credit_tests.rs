//! Engine tests of the READ credit (`super::read_credit`) on the simulated pair: a large
//! READ goes out as several READ requests whose PSNs follow each other (IBTA vol. 1
//! §9.7.1), completes once with all its bytes, stays within the QP's and the device's
//! bounds at every step, keeps within max_rd_atomic and the responder's
//! max_dest_rd_atomic, and recovers from a response lost in the middle of a part.

use crate::proto::{Access, Config, Instant, Mtu, SendWr, Sge, WcStatus, WorkCompletion, WrOpcode};
use crate::sim::{ConnectOpts, LinkConfig, Pair, RcPair, Side, side_config};
use crate::wire::{FrameRepr, Opcode, Psn};

use super::MAX_FRAME_LEN;

const MTU: u32 = 1024;

fn pair(qp_pkts: u32, dev_pkts: u32, link: LinkConfig) -> Pair {
    let cfg = |s| Config {
        read_qp_pkts: qp_pkts,
        read_device_pkts: dev_pkts,
        ..side_config(s)
    };
    Pair::with_configs(cfg(Side::A), cfg(Side::B), link, 7)
}

fn opts(max_rd_atomic: u8) -> ConnectOpts {
    ConnectOpts {
        mtu: Mtu::Mtu1024,
        max_rd_atomic,
        ..ConnectOpts::default()
    }
}

/// A READ of `len` bytes by A from a region of B filled with a pattern, into a region of
/// A: (the WR posted, the expected bytes, A's destination lkey).
struct Read {
    wr: SendWr,
    want: Vec<u8>,
    dst: crate::wire::Lkey,
}

fn read(p: &mut Pair, c: &RcPair, wr_id: u64, len: u32) -> Read {
    let src = p.b.reg_mr(c.pd_b, len as usize, Access::ALL).unwrap();
    let dst =
        p.a.reg_mr(c.pd_a, len as usize, Access::LOCAL_WRITE)
            .unwrap();
    let want: Vec<u8> = (0..len)
        .map(|i| (i / 7 + wr_id as u32) as u8 ^ (i >> 10) as u8)
        .collect();
    p.b.mr_bytes_mut(src.lkey).unwrap().copy_from_slice(&want);
    let mut wr = SendWr::new(wr_id, WrOpcode::RdmaRead);
    wr.sg_list = vec![Sge {
        addr: dst.addr,
        length: len,
        lkey: dst.lkey,
    }];
    wr.rdma.remote_addr = src.addr;
    wr.rdma.rkey = src.rkey;
    Read {
        wr,
        want,
        dst: dst.lkey,
    }
}

/// A's READ credit now: (its QP's outstanding response packets, the device's, the QP's
/// READ requests in flight).
fn credit(p: &Pair, c: &RcPair) -> (u32, u32, u32) {
    let i = p.a.slot(c.qp_a).unwrap();
    let req = &p.a.qps[i].as_ref().unwrap().req;
    (
        req.read_outstanding(),
        p.a.read_pool.outstanding(),
        req.rd_atomic_in_flight(),
    )
}

fn completions(p: &mut Pair, c: &RcPair) -> Vec<WorkCompletion> {
    let mut out = vec![];
    p.a.poll_cq(c.cq_a, 1024, &mut out);
    out
}

/// The READ requests A sent, as (PSN, remote address, DMA length), in order.
fn read_requests(p: &Pair) -> Vec<(Psn, u64, u32)> {
    p.capture
        .as_ref()
        .unwrap()
        .iter()
        .filter(|(_, s, _)| *s == Side::A)
        .filter_map(|(_, _, f)| {
            let r = FrameRepr::parse(f).unwrap();
            let reth = r.roce.ext.reth?;
            (r.roce.bth.opcode == Opcode::RC_READ_REQUEST).then_some((
                r.roce.bth.psn,
                reth.va,
                reth.dma_len,
            ))
        })
        .collect()
}

/// A 100 KiB READ with a QP bound of 16 packets and 16 READs allowed in flight: parts of
/// 4 packets (16 / 4), 25 READ requests at consecutive part PSNs and addresses; one
/// completion with every byte; the bound held at every step; the credit all back after.
#[test]
fn a_large_read_goes_out_in_parts_and_completes_once() {
    let mut p = pair(16, 64, LinkConfig::default());
    p.capture = Some(vec![]);
    let c = p.connect(&opts(16)).unwrap();
    let r = read(&mut p, &c, 1, 100 * MTU);
    let first = p.a.query_qp(c.qp_a).unwrap().sq_psn;
    p.a.post_send(c.qp_a, r.wr.clone()).unwrap();
    let mut wcs = vec![];
    let mut peak = (0, 0);
    let done = p.run_until(Instant::from_nanos(1_000_000_000), |p| {
        let (q, d, _) = credit(p, &c);
        assert!(
            q <= 16 && d <= 64,
            "QP {q} device {d} response packets outstanding"
        );
        peak = (peak.0.max(q), peak.1.max(d));
        wcs.extend(completions(p, &c));
        !wcs.is_empty()
    });
    assert!(done);
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    assert_eq!(wcs[0].byte_len, 100 * MTU);
    assert_eq!(p.a.mr_bytes(r.dst).unwrap(), &r.want[..]);
    assert_eq!(peak.0, 16, "the QP's bound is used, not more");
    let reqs = read_requests(&p);
    let want: Vec<(Psn, u64, u32)> = (0..25u32)
        .map(|j| {
            let k = j * 4;
            (
                first.add(k),
                r.wr.rdma.remote_addr + u64::from(k * MTU),
                4 * MTU,
            )
        })
        .collect();
    assert_eq!(reqs, want);
    let k = p.a.qp_counters(c.qp_a).unwrap();
    assert_eq!(k.read_requests_split, 24);
    assert!(k.read_held_qp_credit > 0);
    assert_eq!(k.retransmitted_packets, 0);
    assert_eq!(p.b.qp_counters(c.qp_b).unwrap().rd_atomic_over_limit, 0);
    assert_eq!(credit(&p, &c), (0, 0, 0), "all credit back");
    // The PSNs the READ took are the sq_psn the next message gets.
    assert_eq!(p.a.query_qp(c.qp_a).unwrap().sq_psn, first.add(100));
}

/// A READ no larger than a part is one READ request, as before.
#[test]
fn a_small_read_is_one_request() {
    let mut p = pair(16, 64, LinkConfig::default());
    p.capture = Some(vec![]);
    let c = p.connect(&opts(16)).unwrap();
    let r = read(&mut p, &c, 1, 4 * MTU - 10);
    p.a.post_send(c.qp_a, r.wr.clone()).unwrap();
    let mut wcs = vec![];
    assert!(p.run_until(Instant::from_nanos(1_000_000_000), |p| {
        wcs.extend(completions(p, &c));
        !wcs.is_empty()
    }));
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(read_requests(&p).len(), 1);
    assert_eq!(p.a.mr_bytes(r.dst).unwrap(), &r.want[..]);
    assert_eq!(p.a.qp_counters(c.qp_a).unwrap().read_requests_split, 0);
}

/// Two QPs on the same devices, each with a 64-packet READ, a device bound of 12 packets
/// and a QP bound of 8: the device's outstanding responses never pass 12, one QP waits
/// for the other's responses (counted `read_held_device_credit`) and is woken by them,
/// both complete with their bytes, the device's credit is all back.
#[test]
fn the_device_bound_holds_across_qps_and_wakes_the_waiting_one() {
    let mut p = pair(8, 12, LinkConfig::default());
    let c1 = p.connect(&opts(16)).unwrap();
    let c2 = p.connect(&opts(16)).unwrap();
    let r1 = read(&mut p, &c1, 1, 64 * MTU);
    let r2 = read(&mut p, &c2, 2, 64 * MTU);
    p.a.post_send(c1.qp_a, r1.wr.clone()).unwrap();
    p.a.post_send(c2.qp_a, r2.wr.clone()).unwrap();
    let (mut w1, mut w2) = (vec![], vec![]);
    let done = p.run_until(Instant::from_nanos(1_000_000_000), |p| {
        let d = p.a.read_pool.outstanding();
        assert!(d <= 12, "device: {d} response packets outstanding");
        w1.extend(completions(p, &c1));
        w2.extend(completions(p, &c2));
        !w1.is_empty() && !w2.is_empty()
    });
    assert!(done, "both complete: the held QP was woken");
    assert_eq!(
        (w1[0].status, w2[0].status),
        (WcStatus::Success, WcStatus::Success)
    );
    assert_eq!(p.a.mr_bytes(r1.dst).unwrap(), &r1.want[..]);
    assert_eq!(p.a.mr_bytes(r2.dst).unwrap(), &r2.want[..]);
    let held: u64 = [c1.qp_a, c2.qp_a]
        .iter()
        .map(|&q| p.a.qp_counters(q).unwrap().read_held_device_credit)
        .sum();
    assert!(held > 0, "the device bound held a part back");
    assert_eq!(p.a.read_pool.outstanding(), 0);
    assert_eq!(p.a.counters().qp.retransmitted_packets, 0);
}

/// max_rd_atomic 1 and 2 (the responder given as many): each part is a READ of its
/// own, so no more than max_rd_atomic are ever in flight (the whole QP bound in one part
/// for 1), and the responder never sees more READs than its resources
/// (`rd_atomic_over_limit` 0).
#[test]
fn parts_keep_within_max_rd_atomic() {
    for (max_rd, parts) in [(1u8, 4usize), (2, 8)] {
        let mut p = pair(16, 64, LinkConfig::default());
        p.capture = Some(vec![]);
        let c = p.connect(&opts(max_rd)).unwrap();
        let r = read(&mut p, &c, 1, 64 * MTU);
        // A second READ behind it: it waits for a slot too.
        let r2 = read(&mut p, &c, 2, 3 * MTU);
        p.a.post_send(c.qp_a, r.wr.clone()).unwrap();
        p.a.post_send(c.qp_a, r2.wr.clone()).unwrap();
        let mut wcs = vec![];
        assert!(p.run_until(Instant::from_nanos(1_000_000_000), |p| {
            let (_, _, inflight) = credit(p, &c);
            assert!(inflight <= u32::from(max_rd), "{inflight} READs in flight");
            wcs.extend(completions(p, &c));
            wcs.len() == 2
        }));
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(p.a.mr_bytes(r.dst).unwrap(), &r.want[..]);
        assert_eq!(p.a.mr_bytes(r2.dst).unwrap(), &r2.want[..]);
        assert_eq!(read_requests(&p).len(), parts + 1, "max_rd_atomic {max_rd}");
        assert_eq!(p.b.qp_counters(c.qp_b).unwrap().rd_atomic_over_limit, 0);
    }
}

/// Frames exchanged by hand at time zero until both sides are quiet, dropping the first
/// frame B sends that `drop` picks (once).
fn exchange(p: &mut Pair, mut drop: impl FnMut(&FrameRepr) -> bool) {
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let mut dropped = false;
    loop {
        let mut moved = false;
        while let Some(n) = p.a.poll_transmit(Instant::ZERO, &mut buf) {
            p.capture
                .as_mut()
                .unwrap()
                .push((Instant::ZERO, Side::A, buf[..n].to_vec()));
            let _ = p.b.handle_frame(Instant::ZERO, &buf[..n]);
            moved = true;
        }
        while let Some(n) = p.b.poll_transmit(Instant::ZERO, &mut buf) {
            moved = true;
            if !dropped && drop(&FrameRepr::parse(&buf[..n]).unwrap()) {
                dropped = true;
                continue;
            }
            let _ = p.a.handle_frame(Instant::ZERO, &buf[..n]);
        }
        if !moved {
            return;
        }
    }
}

/// A response lost in the middle of the third part (IBTA vol. 1 §9.7.4 implied NAK from
/// the next one): A asks again from the missing response to the end of that part only,
/// then for the later parts again (Go-Back-N); the WR completes once with every byte,
/// and the credit is all back.
#[test]
fn a_response_lost_mid_part_is_asked_for_again_to_the_part_end() {
    let mut p = pair(16, 64, LinkConfig::default());
    p.capture = Some(vec![]);
    let c = p.connect(&opts(16)).unwrap();
    let r = read(&mut p, &c, 1, 40 * MTU);
    let first = p.a.query_qp(c.qp_a).unwrap().sq_psn;
    p.a.post_send(c.qp_a, r.wr.clone()).unwrap();
    let lost = first.add(9); // part 2 is packets 8..12
    exchange(&mut p, |f| {
        f.roce.bth.psn == lost && f.roce.bth.opcode == Opcode::RC_READ_RESPONSE_MIDDLE
    });
    let wcs = completions(&mut p, &c);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(p.a.mr_bytes(r.dst).unwrap(), &r.want[..]);
    let reqs = read_requests(&p);
    let base = r.wr.rdma.remote_addr;
    let retry = reqs
        .iter()
        .find(|(psn, ..)| *psn == lost)
        .expect("a READ from the lost response on");
    assert_eq!(*retry, (lost, base + u64::from(9 * MTU), 3 * MTU));
    // Every part's request is one of the part grid or that retry.
    for (psn, va, len) in &reqs {
        let k = psn.diff(first) as u32;
        assert_eq!(*va, base + u64::from(k * MTU));
        assert_eq!(k + len / MTU, (k / 4 + 1) * 4, "ends at its part's end");
    }
    let k = p.a.qp_counters(c.qp_a).unwrap();
    assert!(k.implied_nak_seq_err > 0);
    assert!(k.retransmitted_packets > 0);
    assert_eq!(credit(&p, &c), (0, 0, 0));
}

/// A lossy link (5 %, seeded): a split 256 KiB READ and a SEND behind it complete with
/// every byte, through timeouts and implied NAKs; the credit is all back after.
#[test]
fn a_split_read_survives_a_lossy_link() {
    let link = LinkConfig {
        loss: 0.05,
        ..LinkConfig::default()
    };
    let mut p = pair(32, 64, link);
    let c = p.connect(&opts(16)).unwrap();
    let r = read(&mut p, &c, 1, 256 * MTU);
    p.a.post_send(c.qp_a, r.wr.clone()).unwrap();
    let mut wcs = vec![];
    assert!(p.run_until(Instant::from_nanos(60_000_000_000), |p| {
        wcs.extend(completions(p, &c));
        !wcs.is_empty()
    }));
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(p.a.mr_bytes(r.dst).unwrap(), &r.want[..]);
    assert!(p.link.stats.lost > 0);
    assert_eq!(credit(&p, &c), (0, 0, 0));
}

/// A QP destroyed mid-READ gives its credit back to the device.
#[test]
fn a_destroyed_qp_returns_its_credit() {
    let mut p = pair(16, 64, LinkConfig::default());
    let c = p.connect(&opts(16)).unwrap();
    let r = read(&mut p, &c, 1, 64 * MTU);
    p.a.post_send(c.qp_a, r.wr).unwrap();
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    // A's READ requests go out; no response comes back.
    while p.a.poll_transmit(Instant::ZERO, &mut buf).is_some() {}
    assert_eq!(p.a.read_pool.outstanding(), 16);
    p.a.modify_qp(
        c.qp_a,
        &crate::proto::QpAttr {
            qp_state: crate::proto::QpState::Err,
            ..crate::proto::QpAttr::default()
        },
        crate::proto::AttrMask::STATE,
    )
    .unwrap();
    while p.a.poll_transmit(Instant::ZERO, &mut buf).is_some() {}
    let _ = completions(&mut p, &c);
    p.a.destroy_qp(c.qp_a).unwrap();
    assert_eq!(p.a.read_pool.outstanding(), 0);
}
