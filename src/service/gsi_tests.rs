//! The GSI relay's demultiplexing with real CM MADs: two clients' CMs (each in its
//! comm-ID block, as the service gives them) and a peer's CM on another host.

use super::*;
use crate::cm::{Cm, CmConfig, CmEvent, ConnParam, Path};
use crate::proto::Instant;
use crate::wire::mad::{RDMA_PS_TCP, RDMA_PS_UDP, rej_reason, service_id};

const HOST: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1];
const PEER: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 2];
const SID_A: u64 = service_id(RDMA_PS_TCP, 7471);
const SID_B: u64 = service_id(RDMA_PS_TCP, 7472);
const SID_NONE: u64 = service_id(RDMA_PS_TCP, 9999);
const SID_PEER: u64 = service_id(RDMA_PS_TCP, 5000);
const T0: Instant = Instant::ZERO;

fn path(local: [u8; 16], remote: [u8; 16]) -> Path {
    Path {
        local_gid: local,
        remote_gid: remote,
        mtu: 3,
        hop_limit: 64,
        ..Path::default()
    }
}

fn param(qpn: u32) -> ConnParam {
    ConnParam {
        qpn,
        psn: 1,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    }
}

/// A client's CM in the range the relay gave it.
fn client_cm(range: (u32, u32)) -> Cm {
    Cm::new(CmConfig {
        first_comm_id: 5,
        comm_ids: Some(range),
        ..CmConfig::default()
    })
}

/// The last MAD `cm` queued (a passive side queues an MRA before its REP; the relay
/// routes both the same way, by the comm IDs they share).
fn one_mad(cm: &mut Cm) -> [u8; 256] {
    std::iter::from_fn(|| cm.poll_transmit())
        .last()
        .expect("a MAD")
        .mad
}

#[test]
fn requests_go_by_service_id_and_the_rest_by_comm_id_to_their_client_only() {
    let mut r = Relay::default();
    let (ra, rb) = (r.open(1).unwrap(), r.open(2).unwrap());
    assert_ne!(ra.0, rb.0, "disjoint blocks");
    assert_eq!(r.open(1), Some(ra), "open twice: the same block");
    assert_eq!(r.listen(3, SID_A), Err(libc::EPROTO), "not opened");
    assert_eq!(r.listen(1, SID_A), Ok(()));
    assert_eq!(
        r.listen(2, SID_A),
        Err(libc::EADDRINUSE),
        "one listener per ID"
    );
    assert_eq!(
        r.listen(1, SID_A),
        Err(libc::EADDRINUSE),
        "as rdma_listen twice"
    );
    assert_eq!(r.listen(2, SID_B), Ok(()));
    let (mut a, mut b) = (client_cm(ra), client_cm(rb));
    assert!(a.listen(SID_A, 10));
    let mut peer = Cm::new(CmConfig::default());
    assert!(peer.listen(SID_PEER, 20));

    // The peer connects to A's service: the REQ goes to A.
    let pid = peer.connect(T0, SID_A, path(PEER, HOST), param(0x100));
    let req = one_mad(&mut peer);
    assert_eq!(r.route(&PEER, &req), Route::Client(1));
    a.handle_mad(T0, PEER, HOST, &req);
    let Some(CmEvent::ConnectRequest { id: aid, .. }) = a.poll_event() else {
        panic!("A sees the request");
    };
    assert_eq!(
        aid >> BLOCK_BITS,
        ra.0 >> BLOCK_BITS,
        "A's ID is in A's block"
    );
    assert!(a.accept(T0, aid, param(0x200)));
    let rep = one_mad(&mut a);
    assert!(!r.may_send(2, &PEER, &rep), "B may not send A's REP");
    assert!(r.may_send(1, &PEER, &rep), "A sends its own REP");
    peer.handle_mad(T0, HOST, PEER, &rep);
    while peer.poll_event().is_some() {}
    assert!(peer.rtu(pid));
    let rtu = one_mad(&mut peer);
    assert_eq!(
        r.route(&PEER, &rtu),
        Route::Client(1),
        "the RTU names A's ID"
    );

    // B connects to the peer: the REP comes back to B, not to A.
    b.connect(T0, SID_PEER, path(HOST, PEER), param(0x300));
    let breq = one_mad(&mut b);
    assert!(r.may_send(2, &PEER, &breq));
    assert!(!r.may_send(1, &PEER, &breq), "A may not send B's REQ");
    peer.handle_mad(T0, HOST, PEER, &breq);
    let Some(p2) = std::iter::from_fn(|| peer.poll_event()).find_map(|e| match e {
        CmEvent::ConnectRequest { id, .. } => Some(id),
        _ => None,
    }) else {
        panic!("the peer sees B's request");
    };
    assert!(peer.accept(T0, p2, param(0x400)));
    let brep = one_mad(&mut peer);
    assert_eq!(r.route(&PEER, &brep), Route::Client(2));

    // A SIDR_REQ goes by its ServiceID too.
    peer.sidr_request(T0, service_id(RDMA_PS_UDP, 7), path(PEER, HOST), &[]);
    let sidr = one_mad(&mut peer);
    assert_eq!(r.route(&PEER, &sidr), Route::Unmatched);
    r.listen(2, service_id(RDMA_PS_UDP, 7)).unwrap();
    assert_eq!(r.route(&PEER, &sidr), Route::Client(2));
    assert_eq!(r.counters.routed, 4);
    assert_eq!(r.counters.unmatched, 1);
}

#[test]
fn unmatched_requests_are_rejected_as_in_process_and_unknown_ids_dropped() {
    let mut r = Relay::default();
    r.open(1).unwrap();
    let mut peer = Cm::new(CmConfig::default());
    peer.connect(T0, SID_NONE, path(PEER, HOST), param(0x100));
    let req = one_mad(&mut peer);
    assert_eq!(r.route(&PEER, &req), Route::Unmatched);
    assert_eq!(r.counters.unmatched, 1);
    // What the service does with it: its own CM with no listener answers.
    let mut central = central_cm();
    central.handle_mad(T0, PEER, HOST, &req);
    let rej = one_mad(&mut central);
    match Mad::parse(&rej).unwrap().msg {
        CmMsg::Rej(j) => assert_eq!(j.reason, rej_reason::INVALID_SERVICE_ID),
        m => panic!("not a REJ: {m:?}"),
    }
    peer.handle_mad(T0, HOST, PEER, &rej);
    assert!(matches!(
        peer.poll_event(),
        Some(CmEvent::Rejected { reason: 8, .. })
    ));

    // A REP naming an ID in a block no client holds: dropped and counted.
    let mut stray = client_cm((7 << BLOCK_BITS, 1 << BLOCK_BITS));
    stray.connect(T0, SID_PEER, path(HOST, PEER), param(0x1));
    let stray_req = one_mad(&mut stray);
    let mut peer2 = Cm::new(CmConfig::default());
    assert!(peer2.listen(SID_PEER, 1));
    peer2.handle_mad(T0, HOST, PEER, &stray_req);
    let Some(CmEvent::ConnectRequest { id, .. }) = peer2.poll_event() else {
        panic!()
    };
    assert!(peer2.accept(T0, id, param(0x2)));
    let rep = one_mad(&mut peer2);
    assert_eq!(r.route(&PEER, &rep), Route::Drop);
    assert_eq!(r.counters.unknown_id, 1);
    // A client not given that block may not send for it either.
    assert!(!r.may_send(1, &PEER, &stray_req));
    assert_eq!(r.counters.refused, 1);

    // Garbage, a short MAD, another management class: dropped and counted.
    assert_eq!(r.route(&PEER, &[0u8; 256]), Route::Drop);
    assert_eq!(r.route(&PEER, &[7u8; 10]), Route::Drop);
    let mut other = rep;
    other[1] = 0x04; // a PerfMgt class MAD
    assert_eq!(r.route(&PEER, &other), Route::Drop);
    assert_eq!(r.counters.malformed, 3);
    assert!(!r.may_send(1, &PEER, &[0u8; 256]));
}

#[test]
fn a_gone_client_frees_its_listens_and_ids() {
    let mut r = Relay::default();
    let ra = r.open(1).unwrap();
    r.open(2).unwrap();
    r.listen(1, SID_A).unwrap();
    assert_eq!(r.listens_of(1), vec![SID_A]);
    let mut a = client_cm(ra);
    a.connect(T0, SID_PEER, path(HOST, PEER), param(0x1));
    let areq = one_mad(&mut a);
    assert!(r.may_send(1, &PEER, &areq));
    let mut peer = Cm::new(CmConfig::default());
    assert!(peer.listen(SID_PEER, 1));
    peer.handle_mad(T0, HOST, PEER, &areq);
    let Some(CmEvent::ConnectRequest { id, .. }) = peer.poll_event() else {
        panic!()
    };
    assert!(peer.accept(T0, id, param(0x2)));
    let rep = one_mad(&mut peer);
    assert_eq!(r.route(&PEER, &rep), Route::Client(1));

    r.close(1);
    assert!(r.listens_of(1).is_empty());
    assert_eq!(
        r.route(&PEER, &rep),
        Route::Drop,
        "no one holds A's IDs now"
    );
    assert!(
        !r.may_send(1, &PEER, &areq),
        "a closed client sends nothing"
    );
    assert_eq!(r.listen(2, SID_A), Ok(()), "A's port is free for B");
    peer.connect(T0, SID_A, path(PEER, HOST), param(0x3));
    let req = one_mad(&mut peer);
    assert_eq!(r.route(&PEER, &req), Route::Client(2));
    // A new client does not get A's block back at once (its MADs may be in flight).
    let rc = r.open(3).unwrap();
    assert_ne!(rc, ra);
}

/// The service's CM of its own, as src/service/gsi_port.rs makes it (block 0).
fn central_cm() -> Cm {
    Cm::new(CmConfig {
        first_comm_id: 1,
        comm_ids: Some((1, (1 << BLOCK_BITS) - 1)),
        ..CmConfig::default()
    })
}

#[test]
fn a_dreq_for_a_gone_clients_or_no_ones_id_is_answered_with_a_drep() {
    let mut r = Relay::default();
    let ra = r.open(1).unwrap();
    // A connects to the peer; both ends reach ESTABLISHED.
    let mut a = client_cm(ra);
    let aid = a.connect(T0, SID_PEER, path(HOST, PEER), param(0x1));
    let areq = one_mad(&mut a);
    assert!(r.may_send(1, &PEER, &areq));
    let mut peer = Cm::new(CmConfig::default());
    assert!(peer.listen(SID_PEER, 1));
    peer.handle_mad(T0, HOST, PEER, &areq);
    let Some(CmEvent::ConnectRequest { id: pid, .. }) = peer.poll_event() else {
        panic!("the peer sees A's request")
    };
    assert!(peer.accept(T0, pid, param(0x2)));
    let rep = one_mad(&mut peer);
    assert_eq!(r.route(&PEER, &rep), Route::Client(1));
    a.handle_mad(T0, PEER, HOST, &rep);
    assert!(a.rtu(aid));
    let rtu = one_mad(&mut a);
    peer.handle_mad(T0, HOST, PEER, &rtu);
    while peer.poll_event().is_some() {}

    // A dies with the connection up; the peer disconnects: its DREQ names A's ID.
    r.close(1);
    assert!(peer.disconnect(T0, pid));
    let dreq = one_mad(&mut peer);
    let dreq_tid = Mad::parse(&dreq).unwrap().tid;
    assert_eq!(r.route(&PEER, &dreq), Route::Orphan);
    assert_eq!((r.counters.orphan_dreq, r.counters.unknown_id), (1, 0));
    // The service's CM answers it: a DREP with the IDs swapped and the DREQ's TID.
    let mut central = central_cm();
    central.handle_mad(T0, PEER, HOST, &dreq);
    let t = central.poll_transmit().expect("a DREP");
    assert_eq!(t.to, PEER);
    assert!(central.poll_transmit().is_none(), "one MAD");
    let drep = Mad::parse(&t.mad).unwrap();
    assert_eq!(drep.tid, dreq_tid);
    match drep.msg {
        CmMsg::Drep(d) => assert_eq!((d.local_comm_id, d.remote_comm_id), (aid, pid)),
        m => panic!("not a DREP: {m:?}"),
    }
    assert!(central.poll_event().is_none(), "nothing for the service");
    // The peer's disconnect completes without resending its DREQ.
    peer.handle_mad(T0, HOST, PEER, &t.mad);
    assert_eq!(
        std::iter::from_fn(|| peer.poll_event()).collect::<Vec<_>>(),
        [CmEvent::Disconnected { id: pid }]
    );

    // A DREQ naming an ID in a block no client was ever given: the same answer.
    let mut stray = Cm::new(CmConfig::default());
    let mut other = client_cm((9 << BLOCK_BITS, 1 << BLOCK_BITS));
    assert!(other.listen(SID_A, 1));
    let sid = stray.connect(T0, SID_A, path(PEER, HOST), param(0x5));
    other.handle_mad(T0, PEER, HOST, &one_mad(&mut stray));
    let Some(CmEvent::ConnectRequest { id: oid, .. }) = other.poll_event() else {
        panic!()
    };
    assert!(other.accept(T0, oid, param(0x6)));
    stray.handle_mad(T0, HOST, PEER, &one_mad(&mut other));
    assert!(stray.rtu(sid));
    let _ = one_mad(&mut stray);
    assert!(stray.disconnect(T0, sid));
    let dreq2 = one_mad(&mut stray);
    assert_eq!(r.route(&PEER, &dreq2), Route::Orphan);
    assert_eq!(r.counters.orphan_dreq, 2);

    // Other MADs of an unknown connection stay unanswered (cm.c drops them): a DREP.
    assert_eq!(r.route(&PEER, &t.mad), Route::Drop);
    assert_eq!(r.counters.unknown_id, 1);
}

/// `mad` with its LocalCommID and RemoteCommID replaced (what a hostile client writes).
fn with_ids(mad: &[u8; 256], local: u32, remote: u32) -> [u8; 256] {
    let mut m = Mad::parse(mad).unwrap();
    match &mut m.msg {
        CmMsg::Rep(r) => (r.local_comm_id, r.remote_comm_id) = (local, remote),
        CmMsg::Rej(r) => (r.local_comm_id, r.remote_comm_id) = (local, remote),
        CmMsg::Mra(r) => (r.local_comm_id, r.remote_comm_id) = (local, remote),
        CmMsg::Rtu(r) | CmMsg::Drep(r) => (r.local_comm_id, r.remote_comm_id) = (local, remote),
        CmMsg::Dreq(r) => (r.local_comm_id, r.remote_comm_id) = (local, remote),
        m => panic!("{m:?}"),
    }
    m.emit()
}

/// Client 1 (the victim) connected to the peer through the relay, ESTABLISHED at both
/// ends; client 2 (the attacker) opened the relay. The relay, the victim's CM and ID,
/// the peer's CM and ID, the attacker's block base.
fn victim_established() -> (Relay, Cm, u32, Cm, u32, u32) {
    let mut r = Relay::default();
    let mut v = client_cm(r.open(1).unwrap());
    let eve = r.open(2).unwrap().0;
    let vid = v.connect(T0, SID_PEER, path(HOST, PEER), param(0x1));
    let req = one_mad(&mut v);
    assert!(r.may_send(1, &PEER, &req));
    let mut peer = Cm::new(CmConfig::default());
    assert!(peer.listen(SID_PEER, 1));
    peer.handle_mad(T0, HOST, PEER, &req);
    let Some(CmEvent::ConnectRequest { id: pid, .. }) = peer.poll_event() else {
        panic!("the peer sees the victim's request")
    };
    assert!(peer.accept(T0, pid, param(0x2)));
    let rep = one_mad(&mut peer);
    assert_eq!(r.route(&PEER, &rep), Route::Client(1));
    v.handle_mad(T0, PEER, HOST, &rep);
    assert!(v.rtu(vid));
    let rtu = one_mad(&mut v);
    assert!(r.may_send(1, &PEER, &rtu));
    peer.handle_mad(T0, HOST, PEER, &rtu);
    while peer.poll_event().is_some() {}
    while v.poll_event().is_some() {}
    (r, v, vid, peer, pid, eve)
}

/// A DREQ from `local` for `remote` (any QPN), as a hostile client writes it.
fn dreq(local: u32, remote: u32) -> [u8; 256] {
    Mad {
        tid: 0x77,
        msg: CmMsg::Dreq(Box::new(crate::wire::mad::Dreq {
            local_comm_id: local,
            remote_comm_id: remote,
            remote_qpn: 0x11,
            private_data: [0; 220],
        })),
    }
    .emit()
}

#[test]
fn a_dreq_sweep_reaches_no_other_clients_connection_and_tells_nothing() {
    let (mut r, mut v, vid, mut peer, pid, eve) = victim_established();
    // DREQs from the attacker's block for the IDs of the victim's block around the live
    // one, to this host and to the peer, naming the peer's ID or not: each refused.
    let base = vid & !((1 << BLOCK_BITS) - 1);
    for id in base..base + 64 {
        for to in [HOST, PEER] {
            assert!(!r.may_send(2, &to, &dreq(eve + 5, id)), "{id:#x} to {to:?}");
            assert!(!r.may_send(2, &to, &dreq(pid, id)), "{id:#x} to {to:?}");
        }
    }
    assert_eq!(r.counters.refused, 64 * 4);
    // The same DREQs arriving at QP1 (from this host, or from the peer with another
    // LocalCommID, or with the peer's ID from this host): every one an orphan, the live
    // connection's as the others.
    for id in base..base + 64 {
        for from in [HOST, PEER] {
            assert_eq!(r.route(&from, &dreq(eve + 5, id)), Route::Orphan, "{id:#x}");
        }
        assert_eq!(r.route(&HOST, &dreq(pid, id)), Route::Orphan, "{id:#x}");
    }
    // What the service answers an orphan: the same DREP for the live ID as for another
    // (the IDs it names swapped), to the sender.
    let mut central = central_cm();
    for id in [vid, vid + 1] {
        central.handle_mad(T0, HOST, HOST, &dreq(eve + 5, id));
        let t = central.poll_transmit().expect("a DREP");
        assert!(central.poll_transmit().is_none());
        assert_eq!(t.to, HOST);
        match Mad::parse(&t.mad).unwrap().msg {
            CmMsg::Drep(d) => assert_eq!((d.local_comm_id, d.remote_comm_id), (id, eve + 5)),
            m => panic!("not a DREP: {m:?}"),
        }
    }
    assert!(central.poll_event().is_none());
    // The victim's connection was not touched: the peer's own DREQ still reaches it.
    assert!(v.poll_event().is_none());
    assert!(peer.disconnect(T0, pid));
    let real = one_mad(&mut peer);
    assert_eq!(r.route(&PEER, &real), Route::Client(1));
    v.handle_mad(T0, PEER, HOST, &real);
    assert_eq!(v.poll_event(), Some(CmEvent::Disconnected { id: vid }));
}

/// Client 1 (the victim) has a REQ out, to the peer or to a listener on this host
/// (client 3); client 2 is the attacker. The relay, the victim's CM and ID, the REQ.
fn victim_pending(to: [u8; 16]) -> (Relay, Cm, u32, [u8; 256]) {
    let mut r = Relay::default();
    let mut v = client_cm(r.open(1).unwrap());
    r.open(2).unwrap();
    r.open(3).unwrap();
    r.listen(3, SID_A).unwrap();
    let vid = v.connect(T0, SID_A, path(HOST, to), param(0x1));
    let req = one_mad(&mut v);
    assert!(r.may_send(1, &to, &req));
    (r, v, vid, req)
}

/// A REP from `local` for `remote`, as a hostile client writes it (a real REP's bytes
/// with its IDs replaced).
fn rep(local: u32, remote: u32) -> [u8; 256] {
    let mut p = Cm::new(CmConfig::default());
    assert!(p.listen(SID_A, 1));
    let mut c = Cm::new(CmConfig::default());
    c.connect(T0, SID_A, path(HOST, PEER), param(0x5));
    p.handle_mad(T0, HOST, PEER, &one_mad(&mut c));
    let Some(CmEvent::ConnectRequest { id, .. }) = p.poll_event() else {
        panic!()
    };
    assert!(p.accept(T0, id, param(0x6)));
    with_ids(&one_mad(&mut p), local, remote)
}

#[test]
fn a_rep_naming_another_clients_pending_req_is_refused_and_not_delivered() {
    for to in [PEER, HOST] {
        let (mut r, mut v, vid, _) = victim_pending(to);
        let eve = 2 << BLOCK_BITS; // the attacker's block (the second given)
        // The attacker's REP for the victim's pending REQ, and for an ID no one has:
        // refused alike, to either GID.
        for dst in [HOST, PEER] {
            assert!(!r.may_send(2, &dst, &rep(eve + 1, vid)), "to {dst:?}");
            assert!(!r.may_send(2, &dst, &rep(eve + 1, vid + 1)), "to {dst:?}");
        }
        // Such a REP arriving from a GID that is not the one the REQ went to: dropped.
        let other = if to == PEER { HOST } else { PEER };
        assert_eq!(r.route(&other, &rep(eve + 1, vid)), Route::Drop);
        // The REQ is still pending at the victim, and an answer from where it went still
        // gets there.
        assert!(v.poll_event().is_none());
        assert_eq!(r.route(&to, &rep(0x4242, vid)), Route::Client(1));
    }
}

#[test]
fn a_rej_with_local_comm_id_0_is_refused_unless_it_answers_the_senders_own_offer() {
    let (mut r, _v, vid, req) = victim_pending(HOST);
    let eve = 2 << BLOCK_BITS;
    // A REJ of a REQ: a real one's bytes (the service's CM with no listener answers a
    // REQ with a REJ "invalid service ID" whose LocalCommID is 0, cm.c `cm_issue_rej`).
    let mut central = central_cm();
    central.handle_mad(T0, HOST, HOST, &req);
    let rej0 = one_mad(&mut central);
    match Mad::parse(&rej0).unwrap().msg {
        CmMsg::Rej(j) => assert_eq!((j.local_comm_id, j.remote_comm_id), (0, vid)),
        m => panic!("not a REJ: {m:?}"),
    }
    // The attacker: LocalCommID 0 or its own, for the victim's REQ or for an ID no one
    // has, to either GID: refused alike.
    for dst in [HOST, PEER] {
        for local in [0, eve + 1] {
            assert!(!r.may_send(2, &dst, &with_ids(&rej0, local, vid)));
            assert!(!r.may_send(2, &dst, &with_ids(&rej0, local, vid + 1)));
        }
    }
    // The REQ reaches its listener (client 3): it may reject it, with 0 too, to the
    // victim's host only.
    assert_eq!(r.route(&HOST, &req), Route::Client(3));
    assert!(!r.may_send(3, &PEER, &rej0));
    assert!(r.may_send(3, &HOST, &rej0));
    assert_eq!(r.route(&HOST, &rej0), Route::Client(1));
    // Answered: a second REJ of the same REQ is not the listener's to send any more.
    assert!(!r.may_send(3, &HOST, &rej0));
}

#[test]
fn a_client_keeps_its_own_connections_only_up_to_its_caps() {
    let mut r = Relay::default();
    let base = r.open(1).unwrap().0;
    r.listen(1, SID_A).unwrap();
    let mut v = client_cm(r.open(2).unwrap());
    // The victim's connection, learnt first.
    v.connect(T0, SID_PEER, path(HOST, PEER), param(0x1));
    assert!(r.may_send(2, &PEER, &one_mad(&mut v)));
    // Client 1 starts more connections than its cap, and is offered more REQs.
    let mut own = client_cm((base, 1 << BLOCK_BITS));
    for _ in 0..MAX_CONNS + 10 {
        own.connect(T0, SID_PEER, path(HOST, PEER), param(0x2));
        assert!(r.may_send(1, &PEER, &one_mad(&mut own)));
    }
    assert_eq!(r.links_of(1), MAX_CONNS);
    let mut peer = Cm::new(CmConfig::default());
    for _ in 0..MAX_OFFERS + 10 {
        peer.connect(T0, SID_A, path(PEER, HOST), param(0x3));
        assert_eq!(r.route(&PEER, &one_mad(&mut peer)), Route::Client(1));
    }
    assert_eq!(r.ages[&1].offers, MAX_OFFERS);
    assert!(r.ages[&1].link_order.len() <= 2 * MAX_CONNS);
    // The victim's connection is still known; client 1 gone, nothing of it is.
    assert_eq!(r.links_of(2), 1);
    r.close(1);
    assert_eq!((r.links_of(1), r.links.len(), r.offers.len()), (0, 1, 0));
}
