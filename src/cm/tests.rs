//! Two CMs on a virtual link that can lose chosen MADs; virtual time jumps to the next
//! deadline whenever nothing is in flight.

use super::*;
use crate::wire::mad::{RDMA_PS_TCP, RDMA_PS_UDP, service_id};

const GA: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1];
const GB: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 2];
const SID: u64 = service_id(RDMA_PS_TCP, 7471);

struct Net {
    a: Cm,
    b: Cm,
    now: Instant,
    /// (message name, how many of them to lose).
    lose: Vec<(&'static str, u32)>,
    lost: Vec<&'static str>,
    /// Every MAD that crossed, by name, in order (A→B as "A:REQ").
    ladder: Vec<String>,
    ev_a: Vec<CmEvent>,
    ev_b: Vec<CmEvent>,
    /// B accepts requests (else rejects with CONSUMER_DEFINED and private data "no").
    b_accepts: bool,
    /// B is dead: everything to it is lost.
    b_dead: bool,
}

fn cfg(first: u32) -> CmConfig {
    CmConfig {
        ca_guid: u64::from(first),
        first_comm_id: first,
        ..CmConfig::default()
    }
}

fn path() -> Path {
    Path {
        local_gid: GA,
        remote_gid: GB,
        mtu: 3,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
    }
}

fn param(qpn: u32, psn: u32) -> ConnParam {
    ConnParam {
        qpn,
        psn,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    }
}

impl Net {
    fn new() -> Net {
        let mut b = Cm::new(cfg(0x2000));
        assert!(b.listen(SID, 77));
        Net {
            a: Cm::new(cfg(0x1000)),
            b,
            now: Instant::ZERO,
            lose: Vec::new(),
            lost: Vec::new(),
            ladder: Vec::new(),
            ev_a: Vec::new(),
            ev_b: Vec::new(),
            b_accepts: true,
            b_dead: false,
        }
    }

    fn name(mad: &[u8; 256]) -> &'static str {
        crate::wire::mad::Mad::parse(mad).unwrap().msg.name()
    }

    /// Move MADs and run the consumers until nothing is in flight and no deadline is
    /// left, or `until` on the virtual clock.
    fn run(&mut self, until: Instant) {
        for _ in 0..10_000 {
            let mut moved = false;
            while let Some(t) = self.a.poll_transmit() {
                moved = true;
                assert_eq!(t.to, GB);
                let n = Self::name(&t.mad);
                if self.b_dead || self.drop(n) {
                    continue;
                }
                self.ladder.push(format!("A:{n}"));
                self.b.handle_mad(self.now, GA, GB, &t.mad);
            }
            while let Some(t) = self.b.poll_transmit() {
                moved = true;
                assert_eq!(t.to, GA);
                let n = Self::name(&t.mad);
                if self.drop(n) {
                    continue;
                }
                self.ladder.push(format!("B:{n}"));
                self.a.handle_mad(self.now, GB, GA, &t.mad);
            }
            while let Some(e) = self.a.poll_event() {
                moved = true;
                if let CmEvent::ConnectResponse { id, .. } = &e {
                    assert!(self.a.rtu(*id));
                }
                self.ev_a.push(e);
            }
            while let Some(e) = self.b.poll_event() {
                moved = true;
                if let CmEvent::ConnectRequest { id, listener, .. } = &e {
                    assert_eq!(*listener, 77);
                    if self.b_accepts {
                        assert!(self.b.accept(self.now, *id, param(0x22, 0x222)));
                    } else {
                        assert!(self.b.reject(*id, rej_reason::CONSUMER_DEFINED, b"no"));
                    }
                }
                // rping's answer to DISCONNECTED: rdma_disconnect (a DREP).
                if let CmEvent::Disconnected { id } = &e {
                    if self.b.state(*id) == Some(State::DreqRcvd) {
                        assert!(self.b.disconnect(self.now, *id));
                    }
                }
                if let CmEvent::SidrRequest { id, .. } = &e {
                    assert!(self.b.sidr_accept(*id, 0x33, 0x1111_2222, b"ud"));
                }
                self.ev_b.push(e);
            }
            if moved {
                continue;
            }
            let next = [self.a.poll_timeout(), self.b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t <= until => {
                    self.now = self.now.max(t);
                    self.a.handle_timeout(self.now);
                    self.b.handle_timeout(self.now);
                }
                _ => return,
            }
        }
        panic!("the CMs never went quiet");
    }

    fn drop(&mut self, name: &'static str) -> bool {
        for (n, left) in &mut self.lose {
            if *n == name && *left > 0 {
                *left -= 1;
                self.lost.push(name);
                return true;
            }
        }
        false
    }

    fn connect(&mut self) -> CmId {
        let id = self.a.connect(self.now, SID, path(), param(0x11, 0x111));
        self.run(self.now + Duration::from_nanos(1));
        id
    }
}

fn established(ev: &[CmEvent]) -> Vec<CmId> {
    ev.iter()
        .filter_map(|e| match e {
            CmEvent::Established { id } => Some(*id),
            _ => None,
        })
        .collect()
}

fn b_id(n: &Net) -> CmId {
    n.ev_b
        .iter()
        .find_map(|e| match e {
            CmEvent::ConnectRequest { id, .. } => Some(*id),
            _ => None,
        })
        .expect("B saw the REQ")
}

#[test]
fn req_mra_rep_rtu_then_dreq_drep_and_timewait() {
    let mut n = Net::new();
    let a = n.connect();
    assert_eq!(n.ladder, ["A:REQ", "B:MRA", "B:REP", "A:RTU"]);
    let b = b_id(&n);
    assert_eq!(established(&n.ev_a), [a]);
    assert_eq!(established(&n.ev_b), [b]);
    assert_eq!(n.a.state(a), Some(State::Established));
    assert_eq!(n.b.state(b), Some(State::Established));
    // The QP moves each side makes: the other's QPN; each receives from the PSN it
    // announced and sends from the PSN the other announced (the kernel's cm.c reading:
    // A's REQ said 0x111, B's REP 0x222).
    let qa = n.a.qp_attr(a).unwrap();
    assert_eq!(
        (qa.dest_qpn, qa.rq_psn, qa.sq_psn, qa.path_mtu),
        (0x22, 0x111, 0x222, 3)
    );
    let qb = n.b.qp_attr(b).unwrap();
    assert_eq!(
        (qb.dest_qpn, qb.rq_psn, qb.sq_psn, qb.path_mtu),
        (0x11, 0x222, 0x111, 3)
    );
    assert_eq!(qb.path.remote_gid, GA);
    assert_eq!((qa.retry_cnt, qa.rnr_retry, qb.rnr_retry), (7, 7, 7));
    // The REQ's CM response timeout: nothing resent on a clean link.
    assert_eq!(n.a.counters().resent + n.b.counters().resent, 0);

    assert!(n.a.disconnect(n.now, a));
    n.run(Instant::MAX);
    assert!(n.ev_b.contains(&CmEvent::Disconnected { id: b }));
    assert_eq!(&n.ladder[4..], ["A:DREQ", "B:DREP"]);
    assert!(n.ev_a.contains(&CmEvent::Disconnected { id: a }));
    assert!(n.ev_a.contains(&CmEvent::TimewaitExit { id: a }));
    assert!(n.ev_b.contains(&CmEvent::TimewaitExit { id: b }));
    assert_eq!((n.a.state(a), n.b.state(b)), (None, None));
}

/// Lose each MAD of the exchange once: the resend timers (or the duplicate handlers)
/// still bring both sides to ESTABLISHED and through the disconnect.
#[test]
fn loss_of_each_mad_once_still_connects_and_disconnects() {
    for lost in ["REQ", "MRA", "REP", "RTU", "DREQ", "DREP"] {
        let mut n = Net::new();
        n.lose = vec![(lost, 1)];
        let a = n.a.connect(Instant::ZERO, SID, path(), param(0x11, 0x111));
        n.run(Instant::MAX);
        let b = b_id(&n);
        assert_eq!(established(&n.ev_a), [a], "lost {lost}: {:?}", n.ladder);
        if lost != "RTU" {
            assert_eq!(established(&n.ev_b), [b], "lost {lost}: {:?}", n.ladder);
        }
        assert!(n.a.disconnect(n.now, a), "lost {lost}");
        n.run(Instant::MAX);
        assert!(
            n.ev_b.contains(&CmEvent::Disconnected { id: b }),
            "lost {lost}"
        );
        assert_eq!(n.lost, [lost], "{:?}", n.ladder);
        assert!(
            n.ev_a.contains(&CmEvent::Disconnected { id: a }),
            "lost {lost}: {:?} {:?}",
            n.ladder,
            n.ev_a
        );
        assert_eq!(n.a.state(a), None, "lost {lost}: timewait ended");
        match lost {
            // REQ, REP, DREQ: their own timers resend them.
            "REQ" | "REP" | "DREQ" => assert!(n.a.counters().resent + n.b.counters().resent > 0),
            // A lost RTU: B's REP is resent and A answers the duplicate with the RTU.
            "RTU" => {
                assert!(n.b.counters().resent > 0);
                assert!(n.a.counters().duplicates > 0);
                assert_eq!(established(&n.ev_b), [b], "{:?}", n.ladder);
            }
            // A lost DREP: A resends the DREQ; B answers it with a DREP again (its
            // timewait is over by then: a DREQ for no id gets a DREP, cm.c
            // `cm_issue_drep`).
            "DREP" => {
                assert!(n.a.counters().resent > 0);
                assert_eq!(n.ladder[4..], ["A:DREQ", "A:DREQ", "B:DREP"]);
            }
            // A lost MRA changes nothing: the REP follows.
            _ => {}
        }
    }
}

#[test]
fn no_listener_is_rej_invalid_service_id() {
    let mut n = Net::new();
    let a = n.a.connect(
        Instant::ZERO,
        service_id(RDMA_PS_TCP, 9),
        path(),
        param(0x11, 1),
    );
    n.run(Instant::MAX);
    assert_eq!(n.ladder, ["A:REQ", "B:REJ"]);
    assert_eq!(
        n.ev_a,
        [CmEvent::Rejected {
            id: a,
            reason: rej_reason::INVALID_SERVICE_ID,
            private_data: vec![0; 148]
        }]
    );
    assert_eq!(n.a.state(a), None);
    assert!(n.ev_b.is_empty());
}

#[test]
fn a_listener_that_rejects_gives_consumer_defined_with_its_private_data() {
    let mut n = Net::new();
    n.b_accepts = false;
    let a = n.a.connect(Instant::ZERO, SID, path(), param(0x11, 1));
    n.run(Instant::MAX);
    assert_eq!(n.ladder, ["A:REQ", "B:MRA", "B:REJ"]);
    let Some(CmEvent::Rejected {
        id,
        reason,
        private_data,
    }) = n.ev_a.first()
    else {
        panic!("{:?}", n.ev_a)
    };
    assert_eq!((*id, *reason), (a, rej_reason::CONSUMER_DEFINED));
    assert_eq!(private_data[..2], *b"no");
    assert_eq!(n.b.ids(), []);
}

/// A dead peer: the REQ goes out 1 + max_cm_retries times, each after the response
/// timeout, then UNREACHABLE.
#[test]
fn dead_peer_req_retries_then_unreachable() {
    let mut n = Net::new();
    n.b_dead = true;
    let a = n.a.connect(Instant::ZERO, SID, path(), param(0x11, 1));
    n.run(Instant::MAX);
    let c = CmConfig::default();
    assert_eq!(n.a.counters().sent, 1 + u64::from(c.max_cm_retries));
    assert_eq!(n.a.counters().resent, u64::from(c.max_cm_retries));
    assert_eq!(n.ev_a, [CmEvent::Unreachable { id: a }]);
    let wait = 2 * cm_time(c.packet_life_time) + cm_time(c.response_timeout);
    assert_eq!(
        n.now,
        Instant::ZERO + wait * (1 + u32::from(c.max_cm_retries))
    );
}

/// The peer dies while connected: our DREQ is resent, then DISCONNECTED anyway, then
/// timewait.
#[test]
fn dead_peer_dreq_retries_then_disconnected_and_timewait() {
    let mut n = Net::new();
    let a = n.connect();
    n.b_dead = true;
    let before = n.a.counters().sent;
    assert!(n.a.disconnect(n.now, a));
    n.run(Instant::MAX);
    assert_eq!(
        n.a.counters().sent - before,
        1 + u64::from(CmConfig::default().max_cm_retries)
    );
    // Not a plain DISCONNECTED: librdmacm gives this one status -ETIMEDOUT, as cma.c.
    assert!(n.ev_a.ends_with(&[
        CmEvent::DreqError { id: a },
        CmEvent::TimewaitExit { id: a }
    ]));
}

/// The passive side's REP unanswered (the active side died after its REQ): UNREACHABLE.
#[test]
fn rep_without_rtu_is_unreachable_on_the_passive_side() {
    let mut n = Net::new();
    n.lose = vec![("REP", u32::MAX)];
    n.a.connect(Instant::ZERO, SID, path(), param(0x11, 1));
    // A stops existing once its REQ is out.
    n.run(Instant::ZERO);
    n.a = Cm::new(cfg(0x5000));
    n.run(Instant::MAX);
    let b = b_id(&n);
    assert!(
        n.ev_b.contains(&CmEvent::Unreachable { id: b }),
        "{:?}",
        n.ev_b
    );
    assert_eq!(n.b.state(b), None);
}

#[test]
fn duplicate_req_is_answered_with_mra_not_a_second_id() {
    let mut n = Net::new();
    n.b_accepts = false;
    let id = n.a.connect(Instant::ZERO, SID, path(), param(0x11, 1));
    let req = n.a.poll_transmit().unwrap();
    n.b.handle_mad(Instant::ZERO, GA, GB, &req.mad);
    n.b.handle_mad(Instant::ZERO, GA, GB, &req.mad);
    let names: Vec<_> = std::iter::from_fn(|| n.b.poll_transmit())
        .map(|t| Net::name(&t.mad))
        .collect();
    assert_eq!(names, ["MRA", "MRA"]);
    assert_eq!(n.b.ids().len(), 1);
    assert_eq!(n.b.counters().duplicates, 1);
    let _ = id;
}

#[test]
fn sidr_resolves_the_ud_qp_and_no_listener_is_unsupported() {
    let mut n = Net::new();
    let sid = service_id(RDMA_PS_UDP, 7174);
    assert!(n.b.listen(sid, 77));
    n.lose = vec![("SIDR_REQ", 1)];
    let a = n.a.sidr_request(Instant::ZERO, sid, path(), b"hi");
    n.run(Instant::MAX);
    assert_eq!(n.ladder, ["A:SIDR_REQ", "B:SIDR_REP"]);
    let Some(CmEvent::SidrReply { id, rep }) = n.ev_a.first() else {
        panic!("{:?}", n.ev_a)
    };
    assert_eq!(
        (*id, rep.qpn, rep.qkey, rep.status),
        (a, 0x33, 0x1111_2222, 0)
    );
    assert_eq!(rep.private_data[..2], *b"ud");
    let Some(CmEvent::SidrRequest { req, .. }) = n.ev_b.first() else {
        panic!()
    };
    assert_eq!(req.private_data[..2], *b"hi");

    let mut n = Net::new();
    let a =
        n.a.sidr_request(Instant::ZERO, service_id(RDMA_PS_UDP, 1), path(), &[]);
    n.run(Instant::MAX);
    assert!(matches!(n.ev_a[..], [CmEvent::Rejected { id, reason: 1, .. }] if id == a));
}

#[test]
fn both_sides_disconnect_at_once() {
    let mut n = Net::new();
    let a = n.connect();
    let b = b_id(&n);
    assert!(n.a.disconnect(n.now, a));
    assert!(n.b.disconnect(n.now, b));
    n.run(Instant::MAX);
    assert!(n.ev_a.contains(&CmEvent::Disconnected { id: a }));
    assert!(n.ev_b.contains(&CmEvent::Disconnected { id: b }));
    assert_eq!((n.a.state(a), n.b.state(b)), (None, None));
}

#[test]
fn garbage_and_stray_mads_are_counted_not_fatal() {
    let mut cm = Cm::new(cfg(1));
    cm.handle_mad(Instant::ZERO, GA, GB, &[0u8; 10]);
    let rtu = crate::wire::mad::Mad {
        tid: 1,
        msg: CmMsg::Rtu(Box::new(Rtu {
            local_comm_id: 5,
            remote_comm_id: 999,
            private_data: [0; 224],
        })),
    }
    .emit();
    cm.handle_mad(Instant::ZERO, GA, GB, &rtu);
    assert_eq!(cm.counters().dropped, 2);
    assert!(cm.poll_event().is_none());
}

/// The passive side retries as the REQ asked, whatever its accept says (rping's server
/// accepts with retry_count 0: a QP with retry_cnt 0 failed on the first lost packet).
#[test]
fn passive_retry_counts_come_from_the_req_and_active_rnr_retry_from_the_rep() {
    let mut a = Cm::new(cfg(1));
    let mut b = Cm::new(cfg(2));
    assert!(b.listen(SID, 1));
    let mut p = param(0x11, 1);
    p.retry_count = 6;
    p.rnr_retry_count = 5;
    let ia = a.connect(Instant::ZERO, SID, path(), p);
    let req = a.poll_transmit().unwrap();
    b.handle_mad(Instant::ZERO, GA, GB, &req.mad);
    let Some(CmEvent::ConnectRequest { id: ib, .. }) = b.poll_event() else {
        panic!()
    };
    let mut acc = param(0x22, 2);
    acc.retry_count = 0;
    acc.rnr_retry_count = 3;
    assert!(b.accept(Instant::ZERO, ib, acc));
    let q = b.qp_attr(ib).unwrap();
    assert_eq!((q.retry_cnt, q.rnr_retry), (6, 5));
    while let Some(t) = b.poll_transmit() {
        a.handle_mad(Instant::ZERO, GB, GA, &t.mad);
    }
    let q = a.qp_attr(ia).unwrap();
    assert_eq!((q.retry_cnt, q.rnr_retry), (6, 3), "RNR retry of the REP");
}

/// A CM given a range of comm IDs (a client of the device service) takes its IDs
/// inside it, starting at `base + first_comm_id % span`, and wraps inside it.
#[test]
fn comm_ids_stay_in_the_configured_range() {
    let mut cm = Cm::new(CmConfig {
        first_comm_id: 0x1006,
        comm_ids: Some((0x300000, 8)),
        ..CmConfig::default()
    });
    let ids: Vec<CmId> = (0..5)
        .map(|_| cm.connect(Instant::ZERO, SID, path(), param(0x11, 1)))
        .collect();
    assert_eq!(ids, [0x300006, 0x300007, 0x300000, 0x300001, 0x300002]);
}
