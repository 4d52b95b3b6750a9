//! Engine tests that need to reach inside the device: the response cache after a PSN
//! wrap-around (a cached response must still be found after the PSN wraps) takes 2^24 PSNs of traffic, which only READ requests of
//! 2^31 bytes consume fast enough; their 2^24 responses are discarded here instead of sent.
//! And the QPN numbering (`Config::first_qpn`), which reaches the device's slots.

use crate::proto::{Access, Instant, Mtu, RecvWr, RxVerdict, SendWr, Sge, WrOpcode};
use crate::sim::{ConnectOpts, LinkConfig, Pair, RcPair, Side};
use crate::wire::{FrameRepr, Psn};

use super::MAX_FRAME_LEN;

fn drain(p: &mut Pair, side: Side) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    while let Some(n) = p.dev(side).poll_transmit(Instant::ZERO, &mut buf) {
        out.push(buf[..n].to_vec());
    }
    out
}

/// `frame` with its PSN and RETH DMA length replaced (lengths and ICRC recomputed).
fn repsn(frame: &[u8], psn: Psn, dma_len: Option<u32>) -> Vec<u8> {
    let mut r = FrameRepr::parse(frame).unwrap();
    r.roce.bth.psn = psn;
    if let (Some(reth), Some(n)) = (r.roce.ext.reth.as_mut(), dma_len) {
        reth.dma_len = n;
    }
    let mut out = vec![0u8; r.buffer_len()];
    let n = r.emit(&mut out).unwrap();
    out.truncate(n);
    out
}

/// B's responder takes `frame`; whatever it queued in answer is thrown away.
fn take_and_discard(p: &mut Pair, c: &RcPair, frame: &[u8]) {
    assert_eq!(p.b.handle_frame(Instant::ZERO, frame), RxVerdict::Taken);
    let i = p.b.slot(c.qp_b).unwrap();
    p.b.qps[i].as_mut().unwrap().resp.drop_queued_responses();
}

/// The atomic ACKs' original values B sends now.
fn atomic_origs(p: &mut Pair) -> Vec<u64> {
    drain(p, Side::B)
        .iter()
        .filter_map(|f| {
            FrameRepr::parse(f)
                .unwrap()
                .roce
                .ext
                .atomic_ack
                .map(|a| a.orig)
        })
        .collect()
}

/// Bug 5. A duplicate is looked up within the 2^23 PSNs before the expected one (IBTA
/// §9.7.5 duplicate detection window); the response cache is searched newest first
/// and an entry made 2^24 PSNs ago for the same 24-bit PSN is not that request.
#[test]
fn atomic_cache_after_psn_wrap_answers_with_the_newest_entry_only() {
    // `new_atomic`: the PSN comes round again as a new atomic (its duplicate must get the new
    // original value), or as a SEND (a duplicate atomic there matches nothing).
    for new_atomic in [true, false] {
        let opts = ConnectOpts {
            mtu: Mtu::Mtu256,
            ..ConnectOpts::default()
        };
        let mut p = Pair::new(LinkConfig::default(), 1);
        let c = p.connect(&opts).unwrap();
        let src = p.a.reg_mr(c.pd_a, 1 << 16, Access::LOCAL_WRITE).unwrap();
        // 2^31 bytes, never touched: zero pages are not allocated until written.
        let big = p.b.reg_mr(c.pd_b, 1 << 31, Access::ALL).unwrap();
        let rbuf = p.b.reg_mr(c.pd_b, 64, Access::LOCAL_WRITE).unwrap();
        p.b.mr_bytes_mut(big.lkey).unwrap()[..8].copy_from_slice(&100u64.to_ne_bytes());
        let sg = |len| {
            vec![Sge {
                addr: src.addr,
                length: len,
                lkey: src.lkey,
            }]
        };
        let mut at = SendWr::new(1, WrOpcode::AtomicFetchAndAdd);
        at.sg_list = sg(8);
        at.atomic.remote_addr = big.addr;
        at.atomic.rkey = big.rkey;
        at.atomic.compare_add = 5;
        let mut rd = SendWr::new(2, WrOpcode::RdmaRead);
        rd.sg_list = sg(256);
        rd.rdma.remote_addr = big.addr;
        rd.rdma.rkey = big.rkey;
        let mut send = SendWr::new(3, WrOpcode::Send);
        send.sg_list = sg(8);
        for w in [at, rd, send] {
            p.a.post_send(c.qp_a, w).unwrap();
        }
        let f = drain(&mut p, Side::A);
        assert_eq!(f.len(), 3);
        let (atomic, read, send) = (&f[0], &f[1], &f[2]);
        let p0 = FrameRepr::parse(atomic).unwrap().roce.bth.psn;
        assert_eq!(p.b.handle_frame(Instant::ZERO, atomic), RxVerdict::Taken);
        assert_eq!(atomic_origs(&mut p), [100]);
        // 2^24 - 1 PSNs of READs: 2^23 - 1 and 2^23 response packets at MTU 256.
        take_and_discard(&mut p, &c, &repsn(read, p0.add(1), Some((1 << 31) - 256)));
        take_and_discard(&mut p, &c, &repsn(read, p0.add(1 << 23), Some(1 << 31)));
        assert_eq!(p.b.query_qp(c.qp_b).unwrap().rq_psn, p0, "wrapped round");
        if new_atomic {
            assert_eq!(p.b.handle_frame(Instant::ZERO, atomic), RxVerdict::Taken);
            assert_eq!(atomic_origs(&mut p), [105]);
        } else {
            p.b.post_recv(
                c.qp_b,
                RecvWr {
                    wr_id: 9,
                    sg_list: vec![Sge {
                        addr: rbuf.addr,
                        length: 64,
                        lkey: rbuf.lkey,
                    }],
                },
            )
            .unwrap();
            assert_eq!(
                p.b.handle_frame(Instant::ZERO, &repsn(send, p0, None)),
                RxVerdict::Taken
            );
            drain(&mut p, Side::B);
        }
        // The atomic at that PSN again: a duplicate.
        assert_eq!(p.b.handle_frame(Instant::ZERO, atomic), RxVerdict::Taken);
        let want: &[u64] = if new_atomic { &[105] } else { &[] };
        assert_eq!(atomic_origs(&mut p), want, "new_atomic {new_atomic}");
        let executed = p.b.qp_counters(c.qp_b).unwrap().atomics_executed;
        assert_eq!(executed, 1 + u64::from(new_atomic));
    }
}

/// Bug 5, READ cache: after 2^24 PSNs a new READ at the same 24-bit PSN, of another
/// region, is the one its duplicate means (newest first); the stale entry, of another
/// R_Key, must not make the duplicate look foreign and be dropped.
#[test]
fn read_cache_after_psn_wrap_answers_the_new_read() {
    let opts = ConnectOpts {
        mtu: Mtu::Mtu256,
        ..ConnectOpts::default()
    };
    let mut p = Pair::new(LinkConfig::default(), 1);
    let c = p.connect(&opts).unwrap();
    let src = p.a.reg_mr(c.pd_a, 1 << 16, Access::LOCAL_WRITE).unwrap();
    let big = p.b.reg_mr(c.pd_b, 1 << 31, Access::ALL).unwrap();
    let other = p.b.reg_mr(c.pd_b, 256, Access::ALL).unwrap();
    p.b.mr_bytes_mut(other.lkey).unwrap().fill(0x3c);
    let mut rd = SendWr::new(1, WrOpcode::RdmaRead);
    rd.sg_list = vec![Sge {
        addr: src.addr,
        length: 256,
        lkey: src.lkey,
    }];
    rd.rdma.remote_addr = big.addr;
    rd.rdma.rkey = big.rkey;
    let mut rd2 = rd.clone();
    rd2.rdma.remote_addr = other.addr;
    rd2.rdma.rkey = other.rkey;
    p.a.post_send(c.qp_a, rd).unwrap();
    p.a.post_send(c.qp_a, rd2).unwrap();
    let f = drain(&mut p, Side::A);
    assert_eq!(f.len(), 2);
    let p0 = FrameRepr::parse(&f[0]).unwrap().roce.bth.psn;
    take_and_discard(&mut p, &c, &f[0]);
    // 2^24 - 1 more PSNs: the expected PSN is p0 again.
    take_and_discard(&mut p, &c, &repsn(&f[0], p0.add(1), Some((1 << 31) - 256)));
    take_and_discard(&mut p, &c, &repsn(&f[0], p0.add(1 << 23), Some(1 << 31)));
    assert_eq!(p.b.query_qp(c.qp_b).unwrap().rq_psn, p0, "wrapped round");
    let new_read = repsn(&f[1], p0, None);
    assert_eq!(p.b.handle_frame(Instant::ZERO, &new_read), RxVerdict::Taken);
    assert_eq!(drain(&mut p, Side::B).len(), 1);
    // Its duplicate is served, with the other region's bytes.
    assert_eq!(p.b.handle_frame(Instant::ZERO, &new_read), RxVerdict::Taken);
    let out = drain(&mut p, Side::B);
    assert_eq!(out.len(), 1, "the duplicate is answered");
    let r = FrameRepr::parse(&out[0]).unwrap();
    assert_eq!(r.roce.bth.psn, p0);
    assert!(r.roce.payload.iter().all(|&b| b == 0x3c));
}

/// A SEND from A's QP to B's, both sides settled; B's receive completion.
fn send_once(p: &mut Pair, c: &RcPair) -> Vec<crate::proto::WorkCompletion> {
    let rb = p.b.reg_mr(c.pd_b, 4096, Access::LOCAL_WRITE).unwrap();
    p.b.post_recv(
        c.qp_b,
        RecvWr {
            wr_id: 9,
            sg_list: vec![Sge {
                addr: rb.addr,
                length: 64,
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
    let limit = p.now + std::time::Duration::from_secs(1);
    p.run_until(limit, |_| false);
    let mut wcs = vec![];
    p.b.poll_cq(c.cq_b, 8, &mut wcs);
    wcs
}

/// QPNs start at `Config::first_qpn` and wrap from 0xFFFFFF to 0x11, never into QP0/QP1
/// or past 24 bits; every QPN handed out reaches its QP (`slot`), and traffic to a
/// wrapped QPN is delivered.
#[test]
fn qpns_start_at_the_configured_qpn_and_wrap_past_the_24_bit_top_to_0x11() {
    let mut a = crate::sim::side_config(Side::A);
    a.first_qpn = 0xFF_FFFF;
    let mut b = crate::sim::side_config(Side::B);
    b.first_qpn = 0x12_3456;
    let mut p = Pair::with_configs(a, b, LinkConfig::default(), 1);
    let c1 = p.connect(&ConnectOpts::default()).unwrap();
    let c2 = p.connect(&ConnectOpts::default()).unwrap();
    assert_eq!(c1.qp_a.value(), 0xFF_FFFF);
    assert_eq!(
        c2.qp_a.value(),
        0x11,
        "wraps to the first QPN after QP0/QP1"
    );
    assert_eq!((c1.qp_b.value(), c2.qp_b.value()), (0x12_3456, 0x12_3457));
    for c in [&c1, &c2] {
        assert_eq!(
            p.a.slot(c.qp_a).map(|i| p.a.qps[i].as_ref().unwrap().qpn),
            Some(c.qp_a)
        );
        let wcs = send_once(&mut p, c);
        assert_eq!(wcs.len(), 1, "{wcs:?}");
        assert_eq!(wcs[0].status, crate::proto::WcStatus::Success);
        assert_eq!(wcs[0].qp_num, c.qp_b);
    }
    // Numbers outside what was handed out reach no QP.
    for n in [0u32, 1, 0x10, 0x12, 0xFF_FFFE, 0x12_3456] {
        assert_eq!(p.a.slot(crate::wire::Qpn::new(n)), None, "{n:#x}");
    }
    // A start below 0x11 counts as 0x11.
    let mut low = crate::sim::side_config(Side::A);
    low.first_qpn = 1;
    let mut p = Pair::with_configs(
        low,
        crate::sim::side_config(Side::B),
        LinkConfig::default(),
        1,
    );
    assert_eq!(
        p.connect(&ConnectOpts::default()).unwrap().qp_a.value(),
        0x11
    );
}

/// Each device opened on an interface draws its own start (the "stale connection" of a
/// quickly restarted process, docs/rnic.md): in range, and not the same every time.
#[test]
fn random_first_qpns_are_24_bit_past_qp1_and_vary() {
    let v: Vec<u32> = (0..16).map(|_| super::random_first_qpn()).collect();
    assert!(v.iter().all(|&q| (0x11..=0xFF_FFFF).contains(&q)), "{v:x?}");
    let mut d = v.clone();
    d.sort_unstable();
    d.dedup();
    // 16 draws from 2^24 - 17 values: a repeat is a one-in-a-hundred-thousand event; all
    // equal (the old fixed 0x11) is what this catches.
    assert!(d.len() >= 15, "{v:x?}");
}
