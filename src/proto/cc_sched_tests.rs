//! The congestion control's timers go through the QP's timer table and the device's
//! scheduler (docs/performance.md "Many QPs"): a QP whose DCQCN timer is
//! due is visited, and idle QPs are not visited at all, however many there are. Visits are
//! counted (`Rnic::qp_visits`), never timed.

use crate::proto::congestion::{Algorithm, CongestionControl, DcqcnParams, Pacer, build_cnp};
use crate::proto::time::Duration;
use crate::proto::{Instant, Rnic};
use crate::sim::{ConnectOpts, LinkConfig, Pair, QpEnd, Side};
use crate::wire::{EthRepr, IpRepr, Qpn};

use super::MAX_FRAME_LEN;

const LINE: u64 = 10_000_000_000;

fn with_dcqcn(p: &mut Pair) {
    for s in [Side::A, Side::B] {
        let mut cc = CongestionControl::new(
            Algorithm::Dcqcn(DcqcnParams::connectx()),
            LINE,
            Pacer::DEFAULT_BURST,
        );
        cc.set_pace_unthrottled(false);
        p.dev(s).enable_congestion_control(cc);
    }
}

/// A CNP from B to A's QP `qpn` (RoCE v2 annex A17.9), handed to A at `now`.
fn cnp_to_a(a: &mut Rnic, now: Instant, qpn: Qpn) {
    let eth = EthRepr {
        dst: [0x02, 0, 0, 0, 0, 1],
        src: [0x02, 0, 0, 0, 0, 2],
        vlan_tci: None,
    };
    let ip = IpRepr::V4 {
        src: [192, 0, 2, 2],
        dst: [192, 0, 2, 1],
        tos: 0,
        identification: 0,
        dont_fragment: true,
        ttl: 64,
    };
    let mut buf = [0u8; 128];
    let n = build_cnp(eth, ip, qpn, 48, 6).emit(&mut buf).unwrap();
    let v = a.handle_frame(now, &buf[..n]);
    assert_eq!(v, super::RxVerdict::Taken);
}

fn rate(a: &Rnic, qpn: Qpn) -> u64 {
    a.congestion().unwrap().qp_status(qpn).unwrap().rate_bps
}

/// One driver step as `crate::driver` makes it: the timers if due, then transmit until
/// nothing is left. Returns the frames sent.
fn step(a: &mut Rnic, now: Instant) -> usize {
    if a.poll_timeout().is_some_and(|t| t <= now) {
        a.handle_timeout(now);
    }
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let mut n = 0;
    while a.poll_transmit(now, &mut buf).is_some() {
        n += 1;
    }
    n
}

#[test]
fn a_qp_whose_congestion_timer_is_due_is_visited() {
    let mut p = Pair::new(LinkConfig::default(), 1);
    with_dcqcn(&mut p);
    let c = p.connect(&ConnectOpts::default()).unwrap();
    let t0 = Instant::from_nanos(1_000_000);
    assert_eq!(step(&mut p.a, t0), 0);
    assert_eq!(
        p.a.poll_timeout(),
        None,
        "an idle, unthrottled QP has no timer"
    );

    // ConnectX: the CNP's cut comes at the end of the 4 µs monitor period, a deadline of
    // the QP's rate timer only (nothing else is armed on an idle QP).
    cnp_to_a(&mut p.a, t0, c.qp_a);
    let cut = t0 + Duration::from_micros(4);
    assert_eq!(p.a.poll_timeout(), Some(cut));
    let v0 = p.a.qp_visits();
    // Early: nothing is due, nothing is visited.
    step(&mut p.a, cut - Duration::from_nanos(1));
    assert_eq!(p.a.qp_visits(), v0);
    assert_eq!(rate(&p.a, c.qp_a), LINE);
    // Due: the QP is visited by the timer (and once by transmit, finding nothing).
    step(&mut p.a, cut);
    assert_eq!(p.a.qp_visits(), v0 + 2);
    let cut_rate = rate(&p.a, c.qp_a);
    assert!(cut_rate < LINE, "the deferred cut ran: {cut_rate}");

    // Then the rate-increase timer (rp_time_reset, 300 µs after the cut) raises it.
    let inc = cut + Duration::from_micros(300);
    assert_eq!(p.a.poll_timeout(), Some(inc));
    step(&mut p.a, inc);
    assert!(rate(&p.a, c.qp_a) > cut_rate);
    assert_eq!(p.a.qp_visits(), v0 + 4);
}

/// A QP the pacer refuses leaves the ready list and comes back by its pacer timer, not by
/// a release of every held QP each time any timer runs.
#[test]
fn a_paced_qp_waits_on_its_pacer_timer() {
    let mut p = Pair::new(LinkConfig::default(), 1);
    with_dcqcn(&mut p);
    let o = ConnectOpts::default();
    let c = p.connect(&o).unwrap();
    let mr =
        p.a.reg_mr(c.pd_a, 1 << 20, crate::proto::Access::ALL)
            .unwrap();
    let rmr =
        p.b.reg_mr(c.pd_b, 1 << 20, crate::proto::Access::ALL)
            .unwrap();
    let t0 = Instant::from_nanos(1_000_000);
    cnp_to_a(&mut p.a, t0, c.qp_a);
    let cut = t0 + Duration::from_micros(4);
    step(&mut p.a, cut);
    // 1 MiB WRITE: far more than the 16 KiB bucket lets go at once.
    let mut w = crate::proto::SendWr::new(1, crate::proto::WrOpcode::RdmaWrite);
    w.sg_list = vec![crate::proto::Sge {
        addr: mr.addr,
        length: 1 << 20,
        lkey: mr.lkey,
    }];
    w.rdma.remote_addr = rmr.addr;
    w.rdma.rkey = rmr.rkey;
    p.a.post_send(c.qp_a, w).unwrap();
    let sent = step(&mut p.a, cut);
    assert!(sent > 0 && sent < 64, "a bucket's worth: {sent}");
    // Held: the next deadline is its pacer release, before the ACK timeout and the rate
    // timer; at that time the QP is visited and sends again.
    let release = p.a.poll_timeout().unwrap();
    assert!(release > cut && release < cut + Duration::from_micros(300));
    let v0 = p.a.qp_visits();
    assert_eq!(step(&mut p.a, release - Duration::from_nanos(1)), 0);
    assert_eq!(p.a.qp_visits(), v0, "not tried before its release");
    assert!(step(&mut p.a, release) > 0, "released by its pacer timer");
}

/// A throttled QP that sent everything it had is not held by its pacer: with nothing at
/// its send position the requester does not ask the congestion control, whose refusal
/// (the bucket is spent) would arm a pacer hold, and a timer that wakes the device for
/// nothing.
#[test]
fn a_qp_with_nothing_to_send_is_not_held_by_its_pacer() {
    let mut p = Pair::new(LinkConfig::default(), 1);
    with_dcqcn(&mut p);
    let c = p.connect(&ConnectOpts::default()).unwrap();
    let mr =
        p.a.reg_mr(c.pd_a, 1 << 20, crate::proto::Access::ALL)
            .unwrap();
    let rmr =
        p.b.reg_mr(c.pd_b, 1 << 20, crate::proto::Access::ALL)
            .unwrap();
    let t0 = Instant::from_nanos(1_000_000);
    cnp_to_a(&mut p.a, t0, c.qp_a);
    let cut = t0 + Duration::from_micros(4);
    step(&mut p.a, cut);
    assert!(rate(&p.a, c.qp_a) < LINE, "throttled");
    // 15 KiB at path MTU 1024: 15 packets, all within the 16 KiB bucket, which they
    // leave with less than one more packet's tokens.
    let mut w = crate::proto::SendWr::new(1, crate::proto::WrOpcode::RdmaWrite);
    w.sg_list = vec![crate::proto::Sge {
        addr: mr.addr,
        length: 15 * 1024,
        lkey: mr.lkey,
    }];
    w.rdma.remote_addr = rmr.addr;
    w.rdma.rkey = rmr.rkey;
    p.a.post_send(c.qp_a, w).unwrap();
    assert_eq!(step(&mut p.a, cut), 15);
    let cc = p.a.congestion().unwrap();
    let next = 1024 + crate::proto::requester::PACING_HEADROOM;
    assert!(
        cc.next_send_time(cut, c.qp_a, next) > cut,
        "the bucket is spent: a packet more would be refused"
    );
    assert_eq!(
        cc.qp_timers(c.qp_a).pacer,
        None,
        "nothing to send: no pacer hold"
    );
}

/// 10 000 connected, idle QPs with DCQCN on, then one of them throttled: a thousand driver
/// steps visit none, then only that one, twice per timer event of it (the timer, then one
/// transmit try).
#[test]
fn ten_thousand_idle_qps_with_congestion_control_cost_no_per_step_walk() {
    let mut p = Pair::new(LinkConfig::default(), 1);
    with_dcqcn(&mut p);
    let o = ConnectOpts {
        max_wr: 1,
        cq_size: 16,
        ..ConnectOpts::default()
    };
    let mut ends = Vec::new();
    for s in [Side::A, Side::B] {
        let d = p.dev(s);
        let pd = d.alloc_pd();
        let cq = d.create_cq(o.cq_size);
        ends.push(QpEnd { pd, cq, srq: None });
    }
    let mut qps = Vec::new();
    for _ in 0..10_000 {
        qps.push(p.connect_ends(&o, ends[0], ends[1]).unwrap().qp_a);
    }
    let mut now = Instant::from_nanos(1_000_000);
    // Whatever the connections left queued goes first.
    step(&mut p.a, now);
    assert_eq!(p.a.poll_timeout(), None);
    let v0 = p.a.qp_visits();
    for _ in 0..1000 {
        now += Duration::from_micros(1);
        step(&mut p.a, now);
    }
    assert_eq!(p.a.qp_visits(), v0, "idle QPs are never visited");

    // One QP throttled: its cut and rate-increase events, nothing else.
    let q = qps[4321];
    cnp_to_a(&mut p.a, now, q);
    let v1 = p.a.qp_visits();
    let mut events = 0;
    for _ in 0..1000 {
        now += Duration::from_micros(1);
        if p.a.poll_timeout().is_some_and(|t| t <= now) {
            events += 1;
        }
        step(&mut p.a, now);
    }
    // 1 ms: the cut at 4 µs, then an increase every 300 µs until the QP is back at the
    // line rate (ConnectX then releases it: no timer left).
    assert!(events >= 2, "the cut and an increase at least: {events}");
    assert_eq!(p.a.qp_visits(), v1 + 2 * events);
    assert_eq!(rate(&p.a, qps[0]), LINE);
    if rate(&p.a, q) == LINE {
        assert_eq!(p.a.poll_timeout(), None);
    }
}
