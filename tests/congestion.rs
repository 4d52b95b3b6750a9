//! DCQCN acceptance tests: the reaction point against the paper's equations computed here
//! step by step (independently of the implementation), the notification point and CNP
//! frame against the ConnectX-4 Lx capture, and the pacer's rate bound over a long run.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use xrnic::io::capture;
use xrnic::proto::Instant;
use xrnic::proto::congestion::{
    Algorithm, CnpVerdict, CongestionControl, Dcqcn, DcqcnParams, Pacer, Phase, build_cnp,
};
use xrnic::wire::{EthRepr, Ext, FrameRepr, FrameView, IpRepr, Opcode, Psn, Qpn};

const US: u64 = 1_000;

/// The engine instant `t` nanoseconds after the origin (the congestion control, the pacer
/// and the NP take engine instants; the reaction point's own tests count nanoseconds).
fn ns(t: u64) -> Instant {
    Instant::from_nanos(t)
}
const MB: f64 = 1e6;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[track_caller]
fn assert_state(rp: &Dcqcn, rc: f64, rt: f64, alpha: f64, what: &str) {
    assert!(
        close(rp.rate(), rc),
        "{what}: Rc {} != expected {rc}",
        rp.rate()
    );
    assert!(
        close(rp.target(), rt),
        "{what}: Rt {} != expected {rt}",
        rp.target()
    );
    assert!(
        close(rp.alpha(), alpha),
        "{what}: α {} != expected {alpha}",
        rp.alpha()
    );
}

// ----- reaction point -------------------------------------------------------------------

/// Paper profile, timer only: the CNP cut (Rt ← Rc, Rc ← Rc(1 − α/2), α ← (1 − g)α + g),
/// F = 5 fast-recovery rounds (Rc ← (Rt + Rc)/2), then additive increase (Rt += 40 Mb/s)
/// — never hyper, since the byte counter never fires.
#[test]
fn paper_cut_then_fast_recovery_then_additive_on_the_timer() {
    let line = 40e9;
    let p = DcqcnParams::paper();
    let t_period = 300 * US; // rp_time_reset, kept from ConnectX in the paper profile
    let g = 1.0 / 256.0;
    let k = 55 * US;
    let mut rp = Dcqcn::new(p, line as u64);
    assert_state(&rp, line, line, 1.0, "start");

    let t0 = 1_000 * US;
    assert_eq!(rp.on_cnp(t0), CnpVerdict::Handled);
    // α starts at 1: the first cut halves the rate; α stays 1.
    let (mut rc, mut rt) = (line / 2.0, line);
    let mut alpha = (1.0 - g) * 1.0 + g;
    assert_state(&rp, rc, rt, alpha, "first cut");

    // A second CNP 20 µs later (paper: no monitor period) cuts again, from α = 1.
    assert_eq!(rp.on_cnp(t0 + 20 * US), CnpVerdict::Handled);
    rt = rc;
    rc *= 1.0 - alpha / 2.0;
    alpha = (1.0 - g) * alpha + g;
    assert_state(&rp, rc, rt, alpha, "second cut");
    let t1 = t0 + 20 * US;

    // Timer events at t1 + n·T; α decays once per K since t1.
    for n in 1..=30u64 {
        let now = t1 + n * t_period;
        rp.on_timer(now);
        let phase = if n <= 5 {
            Phase::FastRecovery
        } else {
            rt += 40.0 * MB;
            Phase::AdditiveIncrease
        };
        rc = (rt + rc) / 2.0;
        let periods = (n * t_period) / k;
        let mut a = alpha;
        for _ in 0..periods {
            a *= 1.0 - g;
        }
        assert_eq!(rp.phase(), phase, "event {n}");
        assert_state(&rp, rc, rt, a, &format!("timer event {n}"));
        assert_eq!(rp.stage_counts(), (n as u32, 0));
    }
}

/// α decays by (1 − g) once per full K without a CNP, and a later cut uses the decayed α.
#[test]
fn alpha_decays_without_cnps_and_the_next_cut_uses_it() {
    let p = DcqcnParams::paper();
    let g = 1.0 / 256.0;
    let line = 25e9;
    let mut rp = Dcqcn::new(p, line as u64);
    rp.on_cnp(0);
    let (mut rc, mut rt) = (line / 2.0, line);
    // Every 5 µs up to 250 µs (before the first timer event at 300 µs): α changes exactly
    // at multiples of K = 55 µs.
    let mut expected = 1.0;
    let mut last_period = 0;
    for step in 1..=50u64 {
        let now = step * 5 * US;
        rp.on_timer(now);
        let period = now / (55 * US);
        while last_period < period {
            expected *= 1.0 - g;
            last_period += 1;
        }
        assert!(close(rp.alpha(), expected), "α at {now} ns");
    }
    let mut alpha = expected;
    // A cut at 250 µs + 4 periods more: α decays 4 more times first.
    let now = 250 * US + 4 * 55 * US; // 470 µs: one timer event (300 µs) happened
    rp.on_timer(now);
    for _ in (250 * US / (55 * US))..(now / (55 * US)) {
        alpha *= 1.0 - g;
    }
    rc = (rt + rc) / 2.0; // the fast-recovery round at 300 µs
    assert_state(&rp, rc, rt, alpha, "before the second cut");
    rp.on_cnp(now);
    rt = rc;
    rc *= 1.0 - alpha / 2.0;
    alpha = (1.0 - g) * alpha + g;
    assert_state(&rp, rc, rt, alpha, "second cut with decayed α");
}

/// The byte counter alone (the timer set to its longest period so it never fires):
/// F fast-recovery rounds, then additive increase.
#[test]
fn byte_counter_alone_drives_the_increase() {
    let mut p = DcqcnParams::paper();
    p.rp_time_reset = 131_071;
    let b = 32767 * 64; // rp_byte_reset in 64-byte units
    let line = 100e9;
    let mut rp = Dcqcn::new(p, line as u64);
    // Two cuts (α = 1 both times) so that the target is below the line rate.
    rp.on_cnp(0);
    rp.on_cnp(0);
    let (mut rc, mut rt) = (line / 4.0, line / 2.0);
    // Sending half a counter at a time: an event every second call.
    let mut events = 0;
    for call in 1..=40u64 {
        let now = call * US;
        rp.on_bytes_sent(now, b / 2);
        if call % 2 == 0 {
            events += 1;
            if events > 5 {
                rt += 40.0 * MB;
            }
            rc = (rt + rc) / 2.0;
        }
        assert!(
            close(rp.rate(), rc),
            "call {call}: Rc {} vs {rc}",
            rp.rate()
        );
        assert!(close(rp.target(), rt), "call {call}");
        assert_eq!(rp.stage_counts(), (0, events));
    }
    assert_eq!(rp.phase(), Phase::AdditiveIncrease);
    // One call with many counters' worth of bytes runs every event it contains.
    rp.on_bytes_sent(41 * US, 3 * b);
    for _ in 0..3 {
        rt += 40.0 * MB;
        rc = (rt + rc) / 2.0;
    }
    assert!(close(rp.rate(), rc) && close(rp.target(), rt));
}

/// Timer and byte counter interleaved: once both counts pass F the RP is in hyper increase
/// with Rt += i·R_HAI, i = min(T, BC) − F.
#[test]
fn hyper_increase_when_both_counters_pass_f() {
    let p = DcqcnParams::paper(); // F = 5, R_AI 40 Mb/s, R_HAI 50 Mb/s, T 300 µs
    let b = 32767 * 64;
    let line = 100e9;
    let mut rp = Dcqcn::new(p, line as u64);
    rp.on_cnp(0);
    rp.on_cnp(0);
    let (mut rc, mut rt) = (line / 4.0, line / 2.0);
    // Per round k: a byte event at k·T − 1 µs, then the timer event at k·T.
    // Expected phases written out by hand for F = 5:
    //   BC1 T1 … BC5 T5: fast recovery (max count ≤ 5)
    //   BC6 (T=5, BC=6): additive
    //   T6 (6,6): hyper i=1, BC7 (6,7): hyper i=1, T7 (7,7): hyper i=2, BC8: i=2, …
    let mut script = Vec::new();
    for _ in 0..10 {
        script.push((Phase::FastRecovery, 0.0));
    }
    script.push((Phase::AdditiveIncrease, 40.0 * MB));
    for i in 1..=8 {
        script.push((Phase::HyperIncrease, i as f64 * 50.0 * MB)); // T event
        script.push((Phase::HyperIncrease, i as f64 * 50.0 * MB)); // BC event
    }
    let mut idx = 0;
    for k in 1..=14u64 {
        for is_timer in [false, true] {
            if idx >= script.len() {
                break;
            }
            if is_timer {
                rp.on_timer(k * 300 * US);
            } else {
                rp.on_bytes_sent(k * 300 * US - US, b);
            }
            let (phase, step) = script[idx];
            rt = (rt + step).min(line);
            rc = (rt + rc) / 2.0;
            assert_eq!(rp.phase(), phase, "event {idx}");
            assert!(
                close(rp.rate(), rc),
                "event {idx}: Rc {} vs {rc}",
                rp.rate()
            );
            assert!(
                close(rp.target(), rt),
                "event {idx}: Rt {} vs {rt}",
                rp.target()
            );
            idx += 1;
        }
    }
    assert_eq!(idx, script.len());
}

/// ConnectX profile, as NVIDIA's register descriptions read (mstflint's
/// tools_open_roce_cc_ecn): α updated once per rp_dce_tcp_rtt (1 µs) from the first CNP,
/// α ← g + (1 − g)α with g = 1019/1024 if a CNP came in the period, else (1 − g)α; a cut
/// at each rp_rate_reduce_monitor_period (4 µs) grid point whose period had a CNP, after
/// that point's α update, bounded by rp_min_dec_fac; no clamp of the target without an
/// increase. Computed here tick by tick, independently of the implementation.
#[test]
fn connectx_per_period_alpha_and_cuts_on_the_monitor_grid() {
    let p = DcqcnParams::connectx();
    let line = 10e9;
    let g = 1019.0 / 1024.0;
    let mut rp = Dcqcn::new(p, line as u64);
    let t0 = 10 * US;
    // CNPs every 3 µs from t0 (t0 is the first CNP).
    let cnps: Vec<u64> = (0..120u64).map(|n| t0 + n * 3 * US).collect();
    let (mut rc, rt) = (line, line);
    let mut alpha: f64 = 1023.0 / 1024.0;
    let mut cuts = 0;
    let mut next = 0;
    let end = t0 + 400 * US;
    let mut t = t0;
    while t < end {
        // The CNPs of [t, t + 1 µs): fed to the RP at their times.
        while next < cnps.len() && cnps[next] < t + US {
            assert_eq!(rp.on_cnp(cnps[next]), CnpVerdict::Handled);
            next += 1;
        }
        let had_cnp = cnps.iter().any(|&c| c > t0 && c >= t && c < t + US);
        t += US;
        alpha = if had_cnp {
            g + (1.0 - g) * alpha
        } else {
            (1.0 - g) * alpha
        };
        if (t - t0) % (4 * US) == 0 {
            let lo = t - 4 * US;
            if cnps.iter().any(|&c| c >= lo && c < t) {
                rc = (rc * (1.0 - (alpha / 2.0).min(0.5))).max(1e6);
                cuts += 1;
            }
        }
        rp.on_timer(t);
        assert_state(&rp, rc, rt, alpha, &format!("at {t} ns"));
    }
    assert!(cuts > 50, "{cuts} cuts");
    assert!(rc < line / 100.0, "cut down: {rc}");
    assert_eq!(rp.cnp_counts(), (120, 0));

    // After a timer event, the next cut clamps the target to the current rate.
    let last = rp.last_cut();
    rp.on_timer(last + 300 * US);
    // Fast recovery (F = 1): Rc ← (Rt + Rc)/2.
    rc = (rt + rc) / 2.0;
    assert!(close(rp.rate(), rc));
    rp.on_cnp(last + 301 * US);
    rp.on_timer(last + 304 * US);
    assert!(close(rp.target(), rc), "Rt ← Rc after a timer increase");
}

/// The maximum rate caps Rt and Rc; back at the cap the QP is unthrottled exactly there.
#[test]
fn max_rate_cap_and_line_rate_cap() {
    for (max_mbps, line) in [(2000u32, 10e9), (0, 1e9)] {
        let mut p = DcqcnParams::connectx();
        p.rp_max_rate = max_mbps;
        // Cuts with the CNP, from α = 1023/1024 (with the 4 µs monitor period the first cut
        // would come after four 1 µs α periods at g = 1019/1024, i.e. with α ≈ 0).
        p.rp_rate_reduce_monitor_period = 0;
        let cap = if max_mbps == 0 {
            line
        } else {
            f64::from(max_mbps) * MB
        };
        let mut rp = Dcqcn::new(p, line as u64);
        assert!(close(rp.rate(), cap));
        rp.on_cnp(0);
        assert!(rp.rate() < cap);
        assert!(
            close(rp.target(), cap),
            "no timer increase yet: target kept"
        );
        // After a timer increase the next cut clamps Rt ← Rc below the cap, so additive
        // and hyper increases must be capped on the way back.
        rp.on_timer(300 * US);
        rp.on_cnp(301 * US);
        assert!(rp.target() < cap);
        let mut now = 301 * US;
        let mut events = 0;
        while rp.is_throttled() {
            now += 10 * US;
            rp.on_bytes_sent(now, 32767 * 64);
            rp.on_timer(now);
            assert!(
                rp.target() <= cap && rp.rate() <= cap,
                "never above the cap"
            );
            events += 1;
            assert!(events < 100_000, "never recovered");
        }
        assert_eq!(rp.rate_bps(), cap as u64);
        assert_eq!(rp.target_bps(), cap as u64);
        assert_eq!(rp.poll_timeout(), None);
    }
}

// ----- congestion control of a device ---------------------------------------------------

#[test]
fn pacer_follows_the_reaction_point() {
    let line = 10_000_000_000;
    // No monitor period: the cut comes with the CNP.
    let mut p = DcqcnParams::connectx();
    p.rp_rate_reduce_monitor_period = 0;
    let mut cc = CongestionControl::new(Algorithm::Dcqcn(p), line, 16384);
    let q = Qpn::new(0x11);
    cc.add_qp(ns(0), q);
    cc.on_sent(ns(0), q, 16384); // empty the bucket
    let before = cc.next_send_time(ns(0), q, 4096);
    assert_eq!(cc.on_cnp(ns(0), q), CnpVerdict::Handled);
    let status = cc.qp_status(q).unwrap();
    // α = 1023/1024, rp_gd 11: the rate is cut by α/2.
    let expect_rate = line as f64 * (1.0 - 1023.0 / 2048.0);
    assert!((status.rate_bps as f64 - expect_rate).abs() <= 1.0);
    let after = cc.next_send_time(ns(0), q, 4096);
    // The same 4096 bytes at about half the rate take about twice as long.
    assert!(after > before, "cut applies to the next frame");
    let expect = (4096u64 * 8 * 1_000_000_000).div_ceil(status.rate_bps);
    assert!(
        after.as_nanos().abs_diff(expect) <= 1,
        "{after} vs {expect}"
    );
    // The QP's rate timer brings the rate back up and the pacer with it.
    let t = cc.qp_timers(q).rate.unwrap();
    cc.handle_qp_timeout(t, q);
    assert!(cc.qp_status(q).unwrap().rate_bps > status.rate_bps);
    assert!(cc.next_send_time(t, q, 4096) <= t.max(after));
    // Unknown QPs: a CNP is counted as ignored, sending is not paced, no timers.
    assert_eq!(cc.on_cnp(t, Qpn::new(0x99)), CnpVerdict::Ignored);
    assert_eq!(cc.next_send_time(ns(5), Qpn::new(0x99), 9000), ns(5));
    assert_eq!(cc.qp_timers(Qpn::new(0x99)), Default::default());
    let c = cc.counters();
    assert_eq!((c.rp_cnp_handled, c.rp_cnp_ignored), (1, 1));
}

#[test]
fn each_of_many_qps_keeps_its_own_state_and_statuses_come_in_qpn_order() {
    // 10 000 QPs added out of QPN order (the QPNs wrap past the 24-bit end as a device's
    // do), one of them cut: its state is its own, the others are untouched, a removed
    // QP is gone, and `qp_statuses` lists them in QPN order.
    let line = 10_000_000_000;
    let mut p = DcqcnParams::connectx();
    p.rp_rate_reduce_monitor_period = 0;
    let mut cc = CongestionControl::new(Algorithm::Dcqcn(p), line, 16384);
    let qpns: Vec<Qpn> = (0..10_000u32)
        .map(|i| Qpn::new((0xff_f000 + i * 7919 % 10_000) & 0xff_ffff))
        .collect();
    for &q in qpns.iter().rev() {
        cc.add_qp(ns(0), q);
    }
    let cut = qpns[4321];
    assert_eq!(cc.on_cnp(ns(0), cut), CnpVerdict::Handled);
    let gone = qpns[17];
    cc.remove_qp(gone);
    assert_eq!(cc.qp_status(gone), None);
    let all = cc.qp_statuses();
    assert_eq!(all.len(), 9_999);
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0), "in QPN order");
    for (q, s) in &all {
        if *q == cut {
            assert!(s.rate_bps < line);
            assert_eq!(s.rp_cnp_handled, 1);
        } else {
            assert_eq!((s.rate_bps, s.rp_cnp_handled), (line, 0), "{q:?}");
        }
    }
}

// ----- notification point and the CNP frame ---------------------------------------------

#[test]
fn np_one_cnp_per_interval_per_qp_interleaved() {
    let p = DcqcnParams::connectx(); // 4 µs
    let mut cc = CongestionControl::new(Algorithm::Dcqcn(p), 25_000_000_000, 16384);
    let qps: Vec<Qpn> = (0x11..0x19).map(Qpn::new).collect();
    for &q in &qps {
        cc.add_qp(ns(0), q);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let mut last: HashMap<Qpn, u64> = HashMap::new();
    let (mut marked, mut sent) = (0, 0);
    let mut now = 0u64;
    for _ in 0..20_000 {
        now += rng.random_range(0..1500); // packets 0-1.5 µs apart, QPs interleaved
        let q = qps[rng.random_range(0..qps.len())];
        let ecn = rng.random_range(0..4u8);
        let cnp = cc.on_received(ns(now), q, ecn);
        let expect = ecn == 3 && last.get(&q).is_none_or(|&t| now - t >= 4 * US);
        assert_eq!(cnp, expect, "QP {q:?} at {now}");
        if ecn == 3 {
            marked += 1;
        }
        if cnp {
            sent += 1;
            last.insert(q, now);
        }
    }
    let c = cc.counters();
    assert_eq!(c.np_ecn_marked_roce_packets, marked);
    assert_eq!(c.np_cnp_sent, sent);
    assert!(sent > 1000 && sent < marked, "both outcomes exercised");
}

/// The ConnectX CNP capture; the tests using it are ignored where build.rs found
/// ../shared/vectors missing.
fn connectx_cnp() -> Vec<u8> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/vectors");
    assert!(d.is_dir(), "{} is missing", d.display());
    let f = d.join("single/scapy_cx4lx_cnp.pcap");
    let frames = capture::read_file(&f).expect("read the ConnectX CNP capture");
    assert_eq!(frames.len(), 1);
    frames.into_iter().next().unwrap().data
}

#[test]
#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]
fn our_cnp_has_the_connectx_layout() {
    let cx = connectx_cnp();
    let cxv = FrameView::parse(&cx).unwrap();
    cxv.verify_icrc().unwrap();
    let cxr = cxv.repr();

    let (dscp, prio) = {
        let p = DcqcnParams::connectx();
        (p.np_cnp_dscp as u8, p.np_cnp_prio as u8)
    };
    // Our CNP to the same peer, from the addresses of our data frames to it.
    let IpRepr::V4 { src, dst, .. } = cxr.ip else {
        panic!("the vector is IPv4")
    };
    let ours = build_cnp(
        EthRepr {
            dst: cxr.eth.dst,
            src: cxr.eth.src,
            vlan_tci: None,
        },
        IpRepr::V4 {
            src,
            dst,
            tos: 0,
            identification: 0x1234,
            dont_fragment: true,
            ttl: 64,
        },
        cxr.roce.bth.dest_qp,
        dscp,
        prio,
    );
    let mut buf = [0u8; 256];
    let n = ours.emit(&mut buf).unwrap();
    let v = FrameView::parse(&buf[..n]).unwrap();
    v.verify_icrc().unwrap();
    let r = v.repr();

    // Field by field against ConnectX.
    assert_eq!(v.bth().opcode(), Opcode::CNP);
    assert_eq!(v.bth().opcode(), cxv.bth().opcode());
    assert!(v.bth().becn() && cxv.bth().becn());
    assert_eq!(v.bth().fecn(), cxv.bth().fecn());
    assert_eq!(v.bth().psn(), Psn::new(0));
    assert_eq!(v.bth().psn(), cxv.bth().psn());
    assert_eq!(v.bth().pkey(), cxv.bth().pkey());
    assert_eq!(v.bth().dest_qp(), cxv.bth().dest_qp());
    assert_eq!(v.bth().ack_req(), cxv.bth().ack_req());
    let pad = v.ext_bytes(Ext::CnpPad).unwrap();
    assert_eq!(pad, &[0u8; 16]);
    assert_eq!(pad, cxv.ext_bytes(Ext::CnpPad).unwrap());
    let (
        IpRepr::V4 {
            tos, dont_fragment, ..
        },
        IpRepr::V4 {
            tos: cx_tos,
            dont_fragment: cx_df,
            ..
        },
    ) = (r.ip, cxr.ip)
    else {
        panic!("IPv4")
    };
    assert_eq!(tos, 0xc2);
    assert_eq!(tos, cx_tos);
    assert_eq!(dont_fragment, cx_df);
    assert_eq!(r.udp.src_port, 0);
    assert_eq!(r.udp, cxr.udp);
    assert_eq!(n, cx.len());
    // Byte for byte, except the IP identification, the IP checksum that covers it, and
    // the ICRC (which covers the identification too).
    for (i, (a, b)) in buf[..n].iter().zip(&cx).enumerate() {
        let masked = (18..20).contains(&i) || (24..26).contains(&i) || i >= n - 4;
        if !masked {
            assert_eq!(a, b, "byte {i}");
        }
    }
}

#[test]
#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]
fn connectx_cnp_is_accepted_by_the_reaction_point() {
    let cx = connectx_cnp();
    let view = FrameView::parse(&cx).unwrap();
    let qpn = view.bth().dest_qp();
    let line = 25_000_000_000;
    let mut cc = CongestionControl::new(Algorithm::Dcqcn(DcqcnParams::connectx()), line, 16384);
    cc.add_qp(ns(0), qpn);
    assert_eq!(
        cc.handle_cnp_frame(ns(100 * US), &view),
        Some(CnpVerdict::Handled)
    );
    // The cut at the end of the 4 µs monitor period: the QP's rate timer.
    assert_eq!(cc.qp_timers(qpn).rate, Some(ns(104 * US)));
    cc.handle_qp_timeout(ns(104 * US), qpn);
    let s = cc.qp_status(qpn).unwrap();
    assert!(s.rate_bps < line, "rate cut by the ConnectX CNP");
    assert_eq!(s.target_bps, line);
    assert_eq!(s.rp_cnp_handled, 1);
    // Not for a QP we have.
    cc.remove_qp(qpn);
    assert_eq!(
        cc.handle_cnp_frame(ns(200 * US), &view),
        Some(CnpVerdict::Ignored)
    );
    assert_eq!(cc.counters().rp_cnp_ignored, 1);
    // A frame that is not a CNP is left to the transport.
    let mut other = build_cnp(
        EthRepr::default(),
        IpRepr::V4 {
            src: [192, 0, 2, 1],
            dst: [192, 0, 2, 2],
            tos: 0,
            identification: 0,
            dont_fragment: true,
            ttl: 64,
        },
        qpn,
        48,
        6,
    );
    other.roce.bth.opcode = Opcode::RC_SEND_ONLY;
    let mut buf = [0u8; 128];
    let n = other.emit(&mut buf).unwrap();
    let v = FrameView::parse(&buf[..n]).unwrap();
    assert_eq!(cc.handle_cnp_frame(ns(300 * US), &v), None);
}

/// NP on one side, RP on the other: a CE mark turns into a CNP frame that cuts the sender.
#[test]
fn ce_mark_to_cnp_to_rate_cut() {
    let p = DcqcnParams::connectx();
    let line = 10_000_000_000;
    let mut sender = CongestionControl::new(Algorithm::Dcqcn(p), line, 16384);
    let mut receiver = CongestionControl::new(Algorithm::Dcqcn(p), line, 16384);
    let (sq, rq) = (Qpn::new(0x11), Qpn::new(0x22));
    sender.add_qp(ns(0), sq);
    receiver.add_qp(ns(0), rq);
    assert!(receiver.on_received(ns(10 * US), rq, 3));
    let (dscp, prio) = receiver.cnp_marking();
    let cnp = build_cnp(
        EthRepr::default(),
        IpRepr::V6 {
            src: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            dst: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        },
        sq,
        dscp,
        prio,
    );
    let mut buf = [0u8; 128];
    let n = cnp.emit(&mut buf).unwrap();
    assert_eq!(FrameRepr::parse(&buf[..n]).unwrap(), cnp);
    let v = FrameView::parse(&buf[..n]).unwrap();
    assert_eq!(v.ip_ecn(), 2, "CNPs are ECT(0) like ConnectX's");
    assert_eq!(
        sender.handle_cnp_frame(ns(12 * US), &v),
        Some(CnpVerdict::Handled)
    );
    sender.handle_qp_timeout(ns(16 * US), sq);
    assert!(sender.qp_status(sq).unwrap().rate_bps < line);
}

// ----- pacer ---------------------------------------------------------------------------

/// A greedy sender with random frame sizes over a long virtual run at rate R, with a rate
/// change mid-run: at every send, bytes ≤ ∫R dt + burst; at the end, bytes ≥ ∫R dt − one
/// frame − burst. Integer bookkeeping in units of 10⁻⁹ bit (rate in bit/s × ns).
#[test]
fn pacer_keeps_the_rate_over_a_long_run() {
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let burst: u64 = 16 * 1024;
    let rates = [
        (0u64, 1_000_000_000u64),
        (400_000_000, 300_000_000),
        (700_000_000, 7_000_000_000),
    ];
    let end = 1_000_000_000u64; // 1 s of virtual time
    let mut pacer = Pacer::new(ns(0), rates[0].1, burst);
    let mut seg = 0;
    // ∫R dt up to `t`, in 10⁻⁹ bit.
    let integral = |t: u64| -> u128 {
        let mut acc = 0u128;
        for (i, &(start, r)) in rates.iter().enumerate() {
            let stop = rates.get(i + 1).map_or(u64::MAX, |x| x.0);
            if t > start {
                acc += u128::from(r) * u128::from(t.min(stop) - start);
            }
        }
        acc
    };
    let to_units = |bytes: u64| u128::from(bytes) * 8 * 1_000_000_000;
    let mut now = 0u64;
    let mut sent = 0u64;
    let mut frames = 0u64;
    let mut max_frame = 0u64;
    let mut len = rng.random_range(64..=4200usize);
    loop {
        let mut at = pacer.next_send_time(ns(now), len).as_nanos();
        // A rate change that comes before the frame may leave applies first.
        if let Some(&(t, r)) = rates.get(seg + 1) {
            if at >= t {
                pacer.set_rate(ns(t), r);
                seg += 1;
                now = t;
                continue;
            }
        }
        assert!(at >= now);
        if at > end {
            break;
        }
        // Never earlier than allowed: one ns before, it must refuse.
        if at > now {
            assert!(!pacer.may_send(ns(at - 1), len));
        }
        at = at.max(now);
        pacer.consume(ns(at), len);
        sent += len as u64;
        frames += 1;
        max_frame = max_frame.max(len as u64);
        now = at;
        assert!(
            to_units(sent) <= integral(now) + to_units(burst),
            "{sent} bytes by {now} ns exceed R·t + burst"
        );
        len = rng.random_range(64..=4200usize);
    }
    assert!(
        to_units(sent + max_frame + burst) >= integral(end),
        "{sent} bytes by the end: under R·t − frame − burst"
    );
    assert!(frames > 100_000, "a long run ({frames} frames)");
}

/// A sender that pauses now and then: after a pause the bucket holds at most the burst, so
/// from the end of any pause to any later send, bytes ≤ R·Δt + burst.
#[test]
fn pacer_banks_at_most_the_burst_while_idle() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let burst: u64 = 16 * 1024;
    let rate: u64 = 2_000_000_000;
    let mut pacer = Pacer::new(ns(0), rate, burst);
    let mut now = 0u64;
    let mut sent = 0u64;
    let (mut win_start, mut win_sent) = (0u64, 0u64);
    let mut pauses = 0;
    for _ in 0..200_000 {
        if rng.random_range(0..100) == 0 {
            now += rng.random_range(1..3_000_000);
            (win_start, win_sent) = (now, sent);
            pauses += 1;
        }
        let len = rng.random_range(64..=4200usize);
        now = pacer.next_send_time(ns(now), len).as_nanos().max(now);
        pacer.consume(ns(now), len);
        sent += len as u64;
        let window_bits = u128::from(sent - win_sent) * 8 * 1_000_000_000;
        let allowed =
            u128::from(rate) * u128::from(now - win_start) + u128::from(burst) * 8 * 1_000_000_000;
        assert!(
            window_bits <= allowed,
            "{} bytes since the pause at {win_start}",
            sent - win_sent
        );
    }
    assert!(pauses > 1000);
}

/// docs/congestion.md's parameter table says what the code does: same names, units,
/// defaults of both profiles and ranges, one row per parameter.
#[test]
fn docs_table_matches_the_code() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/congestion.md");
    let doc = std::fs::read_to_string(&path).expect("docs/congestion.md");
    let (cx, paper) = (DcqcnParams::connectx(), DcqcnParams::paper());
    let mut rows = 0;
    let section = doc
        .split("## Parameters")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a Parameters section");
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cols[1].trim_matches('`');
        let info = xrnic::proto::congestion::PARAMS
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("docs row for unknown parameter {name}"));
        assert_eq!(cols[2], info.unit, "{name} unit");
        assert_eq!(
            cols[3],
            cx.get(name).unwrap().to_string(),
            "{name} ConnectX"
        );
        assert_eq!(
            cols[4],
            paper.get(name).unwrap().to_string(),
            "{name} paper"
        );
        assert_eq!(
            cols[5],
            format!("{}…{}", info.min, info.max),
            "{name} range"
        );
        rows += 1;
    }
    assert_eq!(rows, xrnic::proto::congestion::PARAMS.len());
}

/// What the engine drives: CNPs owed are queued once per QP, a QP refused by its pacer is
/// remembered as its pacer timer, so that the engine wakes it when it may send.
#[test]
fn engine_surface_cnp_queue_and_held_qps() {
    let mut cc = CongestionControl::new(
        Algorithm::Dcqcn(DcqcnParams::connectx()),
        1_000_000_000,
        4096,
    );
    let (q1, q2) = (Qpn::new(0x11), Qpn::new(0x12));
    cc.add_qp(ns(0), q1);
    cc.add_qp(ns(0), q2);
    assert!(cc.on_received(ns(0), q2, 3));
    assert!(cc.on_received(ns(0), q1, 3));
    assert!(!cc.on_received(ns(1), q1, 3), "within the interval");
    assert_eq!(cc.poll_cnp(), Some(q2));
    assert_eq!(cc.poll_cnp(), Some(q1));
    assert_eq!(cc.poll_cnp(), None);
    // Held: 4096 bytes at 1 Gb/s refill in 32768 ns; the other QP has no timer.
    assert_eq!(cc.qp_timers(q1).pacer, None);
    assert!(cc.may_send(ns(0), q1, 4096));
    cc.on_sent(ns(0), q1, 4096);
    assert!(!cc.may_send(ns(10), q1, 4096));
    assert_eq!(cc.qp_timers(q1).pacer, Some(ns(32_768)));
    assert_eq!(cc.qp_timers(q2), Default::default());
    // Early: still held.
    cc.handle_qp_timeout(ns(32_767), q1);
    assert_eq!(cc.qp_timers(q1).pacer, Some(ns(32_768)));
    cc.handle_qp_timeout(ns(32_768), q1);
    assert_eq!(cc.qp_timers(q1).pacer, None);
    assert!(cc.may_send(ns(32_768), q1, 4096));
    // A removed QP owes nothing.
    assert!(cc.on_received(ns(100_000), q1, 3));
    cc.remove_qp(q1);
    assert_eq!(cc.poll_cnp(), None);
}

#[test]
fn unthrottled_qps_are_unpaced_when_asked_and_throttled_ones_paced() {
    const LINE: u64 = 10_000_000_000;
    let mut p = DcqcnParams::connectx();
    p.rp_rate_reduce_monitor_period = 0;
    let mut cc = CongestionControl::new(Algorithm::Dcqcn(p), LINE, 4096);
    cc.set_pace_unthrottled(false);
    let q = Qpn::new(0x11);
    cc.add_qp(ns(0), q);
    // At line rate: any number of frames at one instant (the port paces), and the bucket
    // stays full for the first frames after a cut.
    for _ in 0..64 {
        assert!(cc.may_send(ns(0), q, 4096));
        cc.on_sent(ns(0), q, 4096);
    }
    assert_eq!(cc.next_send_time(ns(0), q, 4096), ns(0));
    assert_eq!(
        cc.throttled_packets_within(q, Duration::from_millis(1), 1000),
        None
    );
    // A CNP throttles it to R_c = line · (1 − α/2) with α = 1023/1024 (ConnectX).
    assert_eq!(cc.on_cnp(ns(10), q), CnpVerdict::Handled);
    let r = cc.qp_status(q).unwrap().rate_bps;
    assert!(r < LINE);
    assert!(cc.may_send(ns(10), q, 4096), "a full bucket after the cut");
    cc.on_sent(ns(10), q, 4096);
    assert!(!cc.may_send(ns(10), q, 4096), "paced now");
    // Frames of 1000 bytes in 1 ms at R_c: R_c · 1 ms / 8000 bits.
    assert_eq!(
        cc.throttled_packets_within(q, Duration::from_millis(1), 1000),
        Some((u128::from(r) * 1_000_000 / 1_000_000_000 / 8000) as u32)
    );
    // Paced by default (the sans-IO tests and `xrnic sim` model a NIC at line rate).
    let mut paced = CongestionControl::new(Algorithm::Dcqcn(DcqcnParams::connectx()), LINE, 4096);
    paced.add_qp(ns(0), q);
    assert!(paced.may_send(ns(0), q, 4096));
    paced.on_sent(ns(0), q, 4096);
    assert!(!paced.may_send(ns(0), q, 4096));
}
