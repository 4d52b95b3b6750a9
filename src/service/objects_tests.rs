//! The service's AHs and SRQs on a simulated device (no root): each client names only
//! its own (another's handle is ENOENT, or a dropped and counted slot), the caps, the
//! SRQ limit event going to the owner under its handle, and a dead client's AHs and
//! SRQs freed. A child of `server`, so it steps the loop with `Service::once`.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use rustix::net::{AddressFamily, RecvFlags, SocketAddrUnix, SocketFlags, SocketType};

use super::*;
use crate::ipc::UdTarget;
use crate::proto::{AddressVector, QpType, SrqAttr, SrqAttrMask};
use crate::proto::{RecvWr, SendWr, WrOpcode};

/// A raw client: its socket and, after hello, its submission ring and doorbell.
struct Raw {
    sock: OwnedFd,
    ring: Option<(Ring, OwnedFd)>,
    _keep: Vec<OwnedFd>,
}

fn connect(name: &str) -> OwnedFd {
    let sock = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    let addr = SocketAddrUnix::new_abstract_name(&ipc::socket_name(name)).unwrap();
    rustix::net::connect(&sock, &addr).unwrap();
    sock
}

/// Send `req`, step the loop until the answer is there, return it.
fn call(svc: &mut Service, sock: &OwnedFd, req: &Req) -> (Resp, Vec<OwnedFd>) {
    shm::send_with_fds(sock.as_fd(), &serde_json::to_vec(req).unwrap(), &[]).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    for _ in 0..10 {
        svc.once(Duration::ZERO).unwrap();
        match shm::recv_with_fds(sock.as_fd(), &mut buf, RecvFlags::DONTWAIT) {
            Ok(Some((n, fds))) => return (serde_json::from_slice(&buf[..n]).unwrap(), fds),
            Ok(None) => panic!("the service closed the connection"),
            Err(_) => continue,
        }
    }
    panic!("no answer to {req:?}");
}

fn hello(svc: &mut Service, name: &str, comm: &str) -> Raw {
    let sock = connect(name);
    let (resp, mut fds) = call(svc, &sock, &Req::Hello { comm: comm.into() });
    assert!(matches!(resp, Resp::Hello { .. }), "{resp:?}");
    let events = fds.pop().unwrap();
    let notify = fds.pop().unwrap();
    let bell = fds.pop().unwrap();
    let ring = Ring::map(fds.pop().unwrap(), ipc::SQ_SLOTS, ipc::SQ_SLOT_BYTES).unwrap();
    Raw {
        sock,
        ring: Some((ring, bell)),
        _keep: vec![events, notify],
    }
}

impl Raw {
    fn call(&self, svc: &mut Service, req: Req) -> Resp {
        call(svc, &self.sock, &req).0
    }

    fn errno(&self, svc: &mut Service, req: Req) -> i32 {
        match self.call(svc, req) {
            Resp::Err { errno, .. } => errno,
            r => panic!("expected an error, got {r:?}"),
        }
    }

    /// Push one slot and ring; one round takes it.
    fn post(&self, svc: &mut Service, w: [u64; ipc::SQ_WORDS]) {
        let (ring, bell) = self.ring.as_ref().unwrap();
        assert!(ring.push(&w));
        rustix::io::write(bell, &1u64.to_ne_bytes()).unwrap();
        svc.once(Duration::ZERO).unwrap();
    }
}

fn pd(svc: &mut Service, c: &Raw) -> u32 {
    match c.call(svc, Req::AllocPd) {
        Resp::Pd { pd } => pd,
        r => panic!("{r:?}"),
    }
}

fn cq(svc: &mut Service, c: &Raw) -> u32 {
    match call(svc, &c.sock, &Req::CreateCq { cqe: 16 }).0 {
        Resp::Cq { cq, .. } => cq,
        r => panic!("{r:?}"),
    }
}

fn qp(svc: &mut Service, c: &Raw, pd: u32, cq: u32, qp_type: QpType, srq: Option<u32>) -> Resp {
    c.call(
        svc,
        Req::CreateQp {
            pd,
            send_cq: cq,
            recv_cq: cq,
            max_send_wr: 8,
            max_recv_wr: 8,
            sq_sig_all: false,
            qp_type,
            srq,
        },
    )
}

/// The peer's GID on the simulated link (192.0.2.2, `Device::open_sim_pair`).
fn peer_av() -> AddressVector {
    AddressVector {
        dgid: crate::wire::ipv4_gid([192, 0, 2, 2]),
        sgid_index: 1,
        hop_limit: 64,
        ..AddressVector::default()
    }
}

fn srq_attr(max_wr: u32, limit: u32) -> SrqAttr {
    SrqAttr {
        max_wr,
        max_sge: 1,
        srq_limit: limit,
    }
}

fn service(tag: &str, limits: Limits) -> (Service, String, Device) {
    let (dev, peer) = Device::open_sim_pair().unwrap();
    let name = format!("svc-{tag}-{}", std::process::id());
    (
        Service::with_limits(dev, &name, limits).unwrap(),
        name,
        peer,
    )
}

#[test]
fn ahs_and_srqs_are_their_clients_own_and_capped() {
    let limits = Limits {
        max_ahs: 2,
        max_srqs: 1,
        ..Limits::default()
    };
    let (mut svc, name, _peer) = service("own", limits);
    let a = hello(&mut svc, &name, "a");
    let b = hello(&mut svc, &name, "b");
    let pa = pd(&mut svc, &a);
    let Resp::Ah { ah, av } = a.call(
        &mut svc,
        Req::CreateAh {
            pd: pa,
            av: peer_av(),
        },
    ) else {
        panic!("create_ah")
    };
    assert_eq!(
        av.dmac,
        [2, 0, 0, 0, 0, 2],
        "the MAC resolved by the service"
    );
    let Resp::Srq { srq, attr } = a.call(
        &mut svc,
        Req::CreateSrq {
            pd: pa,
            attr: srq_attr(4, 0),
        },
    ) else {
        panic!("create_srq")
    };
    assert_eq!(attr.max_wr, 4);
    // Caps: a second AH is fine, a third is ENOMEM; a second SRQ too.
    assert!(matches!(
        a.call(
            &mut svc,
            Req::CreateAh {
                pd: pa,
                av: peer_av()
            }
        ),
        Resp::Ah { .. }
    ));
    let third = Req::CreateAh {
        pd: pa,
        av: peer_av(),
    };
    assert_eq!(a.errno(&mut svc, third), libc::ENOMEM);
    let second = Req::CreateSrq {
        pd: pa,
        attr: srq_attr(4, 0),
    };
    assert_eq!(a.errno(&mut svc, second), libc::ENOMEM);
    // The PD is busy while its AHs and SRQ live.
    assert_eq!(a.errno(&mut svc, Req::DeallocPd { pd: pa }), libc::EBUSY);

    // B names A's handles: each is ENOENT for B, and A's objects are untouched.
    // Handles count per client from 1: B's first objects take the numbers of A's AH
    // and SRQ as other kinds (pd 1, CQs 2 and 3), so that only a per-client, per-kind
    // lookup refuses them.
    let pb = pd(&mut svc, &b);
    let cb = cq(&mut svc, &b);
    let _cb2 = cq(&mut svc, &b);
    assert_eq!((ah, srq), (2, 3), "A's handles, which B holds as CQs");
    assert_eq!(b.errno(&mut svc, Req::DestroyAh { ah }), libc::ENOENT);
    assert_eq!(b.errno(&mut svc, Req::QuerySrq { srq }), libc::ENOENT);
    let m = Req::ModifySrq {
        srq,
        attr: srq_attr(8, 0),
        mask: SrqAttrMask::MAX_WR,
    };
    assert_eq!(b.errno(&mut svc, m), libc::ENOENT);
    assert_eq!(b.errno(&mut svc, Req::DestroySrq { srq }), libc::ENOENT);
    let on_a = qp(&mut svc, &b, pb, cb, QpType::Rc, Some(srq));
    assert!(
        matches!(
            on_a,
            Resp::Err {
                errno: libc::ENOENT,
                ..
            }
        ),
        "{on_a:?}"
    );
    // A UD QP on an SRQ: EOPNOTSUPP, as in-process.
    let Resp::Srq { srq: sb, .. } = b.call(
        &mut svc,
        Req::CreateSrq {
            pd: pb,
            attr: srq_attr(4, 0),
        },
    ) else {
        panic!("b's create_srq")
    };
    let ud_srq = qp(&mut svc, &b, pb, cb, QpType::Ud, Some(sb));
    assert!(
        matches!(
            ud_srq,
            Resp::Err {
                errno: libc::EOPNOTSUPP,
                ..
            }
        ),
        "{ud_srq:?}"
    );
    // Slots naming A's AH (a UD send of B's UD QP) and A's SRQ: dropped and counted,
    // and A's SRQ gets no WQE from B.
    let Resp::Qp { qpn } = qp(&mut svc, &b, pb, cb, QpType::Ud, None) else {
        panic!("b's UD QP")
    };
    let bad = |svc: &Service| svc.clients[1].bad_slots;
    let mut wr = SendWr::new(1, WrOpcode::Send);
    wr.send_flags = crate::proto::SendFlags::SIGNALED;
    let to = UdTarget {
        ah,
        remote_qpn: Qpn::new(5),
        remote_qkey: 0x11,
    };
    let w = ipc::encode_send_ud(Qpn::new(qpn), &wr, &to).unwrap();
    b.post(&mut svc, w);
    assert_eq!(bad(&svc), 1, "a UD send to A's AH");
    let r = RecvWr {
        wr_id: 2,
        sg_list: vec![],
    };
    assert_ne!(sb, srq);
    b.post(&mut svc, ipc::encode_srq_recv(srq, &r).unwrap());
    assert_eq!(bad(&svc), 2, "a receive for A's SRQ");
    let Resp::SrqAttr { len, .. } = a.call(&mut svc, Req::QuerySrq { srq }) else {
        panic!("query_srq")
    };
    assert_eq!(len, 0, "A's SRQ got nothing from B");
    // B's own SRQ takes B's receive, and the ring's done index says it is in the engine
    // (what a client's UD / UC / SRQ receive waits for, src/verbs/remote.rs `wait_done`).
    let ring = &b.ring.as_ref().unwrap().0;
    let before = ring.done();
    b.post(&mut svc, ipc::encode_srq_recv(sb, &r).unwrap());
    assert_eq!(bad(&svc), 2);
    assert_eq!(ring.done(), ring.producer());
    assert_eq!(ring.done(), before.wrapping_add(1));
    // B's SRQ holds 4: the fifth receive is refused and the ring's refused index names
    // its slot (what the client's post then fails with), the fourth's did not.
    for _ in 0..3 {
        b.post(&mut svc, ipc::encode_srq_recv(sb, &r).unwrap());
        assert_ne!(ring.refused(), ring.producer());
    }
    b.post(&mut svc, ipc::encode_srq_recv(sb, &r).unwrap());
    assert_eq!(ring.refused(), ring.producer(), "the SRQ was full");
    assert_eq!(bad(&svc), 2, "a refusal is no malformed slot");
    let Resp::SrqAttr { len, .. } = b.call(&mut svc, Req::QuerySrq { srq: sb }) else {
        panic!("query_srq")
    };
    assert_eq!(len, 4, "B's own four, none of A's");
    // Multicast: B attaches its own UD QP; A cannot attach, detach or list B's QP.
    let group = crate::wire::ipv4_gid([239, 1, 2, 3]);
    let attach = |qpn| Req::AttachMcast {
        qpn,
        gid: group,
        lid: 0,
    };
    assert!(matches!(b.call(&mut svc, attach(qpn)), Resp::Ok));
    assert_eq!(a.errno(&mut svc, attach(qpn)), libc::ENOENT);
    let detach = Req::DetachMcast {
        qpn,
        gid: group,
        lid: 0,
    };
    assert_eq!(a.errno(&mut svc, detach), libc::ENOENT);
    assert_eq!(a.errno(&mut svc, Req::McastGroups { qpn }), libc::ENOENT);
    let Resp::Groups { gids } = b.call(&mut svc, Req::McastGroups { qpn }) else {
        panic!("b's groups")
    };
    assert_eq!(gids, [group]);
    // A's AH and SRQ are still there for A.
    assert!(matches!(a.call(&mut svc, Req::DestroyAh { ah }), Resp::Ok));
    assert!(matches!(
        a.call(&mut svc, Req::QuerySrq { srq }),
        Resp::SrqAttr { .. }
    ));
}

/// A UC QP of client A on A's SRQ, connected to a QP of the simulated peer: the peer's
/// SEND takes a WQE from the SRQ, the count drops below the armed limit, and
/// SRQ_LIMIT_REACHED (IBTA §10.2.9.3) goes to A under A's handle of the SRQ, not to B.
/// The SRQ is busy while the QP uses it.
#[test]
fn an_srq_in_use_is_busy_and_its_limit_event_goes_to_its_owner_by_handle() {
    use crate::proto::{Access, AttrMask, QpAttr, QpState, QpType};
    use crate::verbs::{ConnectOpts, QpInitAttr, Remote};
    let (mut svc, name, peer) = service("srq", Limits::default());
    let b = hello(&mut svc, &name, "b");
    let a = hello(&mut svc, &name, "a");
    let pb = pd(&mut svc, &b);
    // B's own SRQ, so that A's handle differs from B's engine numbering.
    assert!(matches!(
        b.call(
            &mut svc,
            Req::CreateSrq {
                pd: pb,
                attr: srq_attr(8, 0)
            }
        ),
        Resp::Srq { .. }
    ));
    let pa = pd(&mut svc, &a);
    let ca = cq(&mut svc, &a);
    let Resp::Srq { srq, .. } = a.call(
        &mut svc,
        Req::CreateSrq {
            pd: pa,
            attr: srq_attr(8, 0),
        },
    ) else {
        panic!("create_srq")
    };
    let Resp::Qp { qpn } = qp(&mut svc, &a, pa, ca, QpType::Uc, Some(srq)) else {
        panic!("UC QP on the SRQ")
    };
    assert_eq!(a.errno(&mut svc, Req::DestroySrq { srq }), libc::EBUSY);
    // The peer's UC QP.
    let ppd = peer.alloc_pd().unwrap();
    let pcq = peer.create_cq(16).unwrap();
    let pqp = ppd
        .create_qp_ext(&QpInitAttr::new(&pcq, &pcq, 8), QpType::Uc, None)
        .unwrap();
    // A: INIT, RTR towards the peer, RTS (the UC masks).
    let mut at = QpAttr::rc_init(Access::LOCAL_WRITE);
    let modify = |svc: &mut Service, at: &QpAttr, mask: AttrMask| {
        let r = a.call(
            svc,
            Req::ModifyQp {
                qpn,
                attr: *at,
                mask,
            },
        );
        assert!(matches!(r, Resp::Ok), "{r:?}");
    };
    modify(&mut svc, &at, AttrMask::RC_INIT);
    at.qp_state = QpState::Rtr;
    at.path_mtu = crate::proto::Mtu::Mtu1024;
    at.dest_qp_num = pqp.qp_num();
    at.ah_attr.dgid = peer.query_gid(1).unwrap();
    at.ah_attr.sgid_index = 1;
    modify(&mut svc, &at, crate::proto::uc::UC_RTR);
    at.qp_state = QpState::Rts;
    modify(&mut svc, &at, crate::proto::uc::UC_RTS);
    let to_a = Remote {
        qpn: Qpn::new(qpn),
        psn: 0,
        gid: svc.dev.query_gid(1).unwrap(),
    };
    pqp.connect(&to_a, 0, 1, &ConnectOpts::default()).unwrap();
    // Three WQEs, the limit armed at 3: the first one taken fires it.
    for i in 0..3 {
        let r = RecvWr {
            wr_id: i,
            sg_list: vec![],
        };
        a.post(&mut svc, ipc::encode_srq_recv(srq, &r).unwrap());
    }
    let arm = Req::ModifySrq {
        srq,
        attr: srq_attr(8, 3),
        mask: SrqAttrMask::LIMIT,
    };
    assert!(matches!(a.call(&mut svc, arm), Resp::Ok));
    let mut wr = SendWr::new(9, WrOpcode::Send);
    wr.send_flags = crate::proto::SendFlags::SIGNALED;
    pqp.post_send(wr).unwrap();
    let got = pcq.wait(1, Duration::from_secs(10));
    assert_eq!(got.len(), 1, "the peer's SEND completed");
    // Bounded: the driver delivers the SEND and the engine raises the event.
    let mut events = Vec::new();
    for _ in 0..1000 {
        svc.once(Duration::from_millis(10)).unwrap();
        if let Resp::AsyncEvents {
            events: e,
            elements,
        } = a.call(&mut svc, Req::AsyncEvents)
        {
            events.extend(e.into_iter().zip(elements));
        }
        if !events.is_empty() {
            break;
        }
    }
    assert_eq!(
        events,
        [(ipc::EV_SRQ_LIMIT_REACHED, srq)],
        "A's event, by A's handle"
    );
    let Resp::AsyncEvents { events, .. } = b.call(&mut svc, Req::AsyncEvents) else {
        panic!("b's events")
    };
    assert!(events.is_empty(), "B hears nothing of A's SRQ: {events:?}");
    let Resp::SrqAttr { attr, len } = a.call(&mut svc, Req::QuerySrq { srq }) else {
        panic!("query_srq")
    };
    assert_eq!(
        (len, attr.srq_limit),
        (2, 0),
        "one WQE taken, the limit disarmed"
    );
    // Once the QP is gone the SRQ can go.
    assert!(matches!(a.call(&mut svc, Req::DestroyQp { qpn }), Resp::Ok));
    assert!(matches!(
        a.call(&mut svc, Req::DestroySrq { srq }),
        Resp::Ok
    ));
    assert_eq!(a.errno(&mut svc, Req::QuerySrq { srq }), libc::ENOENT);
}

#[test]
fn a_gone_clients_ahs_and_srqs_are_freed() {
    let (mut svc, name, _peer) = service("gone", Limits::default());
    let a = hello(&mut svc, &name, "a");
    let pa = pd(&mut svc, &a);
    let ca = cq(&mut svc, &a);
    let Resp::Srq { srq, .. } = a.call(
        &mut svc,
        Req::CreateSrq {
            pd: pa,
            attr: srq_attr(8, 0),
        },
    ) else {
        panic!("create_srq")
    };
    assert!(matches!(
        qp(&mut svc, &a, pa, ca, QpType::Rc, Some(srq)),
        Resp::Qp { .. }
    ));
    assert!(matches!(
        a.call(
            &mut svc,
            Req::CreateAh {
                pd: pa,
                av: peer_av()
            }
        ),
        Resp::Ah { .. }
    ));
    let doc = svc.res_doc();
    assert_eq!(
        (doc.clients[0].ahs.len(), doc.clients[0].srqs.len()),
        (1, 1)
    );
    // The service's own handle of the engine's SRQ, to see it go with the client.
    let engine_srq = svc.clients[0].srqs[&srq].srq.clone();
    assert!(engine_srq.query().is_ok());
    drop(a);
    svc.once(Duration::ZERO).unwrap();
    assert!(svc.clients.is_empty(), "the client is gone");
    assert!(svc.res_doc().clients.is_empty());
    // Its tables went (the AH, the SRQ, the QP on it); the clone of the SRQ kept here
    // is now its last holder, and the engine's destroy succeeds only because no QP uses
    // the SRQ any more (the dead client's QP was destroyed first).
    assert_eq!(engine_srq.len(), 0);
    engine_srq.destroy().expect("no QP left on the SRQ");
}

/// Addresses come from the service (src/service/resolver.rs): a client's `dmac` in an AH
/// or a QP's address vector is replaced by the one the service resolves, and a VLAN tag
/// is refused (EPERM) in both.
#[test]
fn a_clients_mac_is_replaced_and_its_vlan_tag_refused() {
    let (mut svc, name, _peer) = service("addr", Limits::default());
    let a = hello(&mut svc, &name, "a");
    let pa = pd(&mut svc, &a);
    let evil = AddressVector {
        dmac: [0x02, 0xde, 0xad, 0xbe, 0xef, 0x01],
        ..peer_av()
    };
    let Resp::Ah { av, .. } = a.call(&mut svc, Req::CreateAh { pd: pa, av: evil }) else {
        panic!("create_ah")
    };
    assert_eq!(
        av.dmac,
        [2, 0, 0, 0, 0, 2],
        "the peer's MAC, not the client's"
    );
    let tagged = AddressVector {
        vlan_tci: Some(100),
        ..evil
    };
    let req = Req::CreateAh { pd: pa, av: tagged };
    assert_eq!(a.errno(&mut svc, req), libc::EPERM);
    let c = cq(&mut svc, &a);
    let Resp::Qp { qpn } = qp(&mut svc, &a, pa, c, QpType::Rc, None) else {
        panic!("create_qp")
    };
    let mut attr = crate::verbs::QpAttr::rc_init(crate::verbs::Access::ALL);
    let init = Req::ModifyQp {
        qpn,
        attr,
        mask: crate::verbs::AttrMask::RC_INIT,
    };
    assert!(matches!(a.call(&mut svc, init), Resp::Ok));
    attr.qp_state = crate::verbs::QpState::Rtr;
    attr.dest_qp_num = crate::wire::Qpn::new(0x66);
    attr.ah_attr = evil;
    let rtr = |attr: &crate::verbs::QpAttr| Req::ModifyQp {
        qpn,
        attr: *attr,
        mask: crate::verbs::AttrMask::RC_RTR,
    };
    attr.ah_attr.vlan_tci = Some(100);
    assert_eq!(a.errno(&mut svc, rtr(&attr)), libc::EPERM);
    attr.ah_attr.vlan_tci = None;
    assert!(matches!(a.call(&mut svc, rtr(&attr)), Resp::Ok));
    let Resp::QpAttr { attr: got } = a.call(&mut svc, Req::QueryQp { qpn }) else {
        panic!("query_qp")
    };
    assert_eq!(
        got.ah_attr.dmac,
        [2, 0, 0, 0, 0, 2],
        "the peer's MAC, not the client's"
    );
    assert_eq!(got.ah_attr.vlan_tci, None);
}

/// A controlled Q_Key (high-order bit set, IBTA vol. 1 §3.5.3: QP1's 0x80010000) is
/// refused to a client without CAP_NET_RAW, as the kernel's uverbs `modify_qp` refuses
/// it (EPERM): with it a UD QP could send CM MADs to any QP1 past the GSI relay's
/// checks. An ordinary Q_Key is taken; root may set a controlled one.
#[test]
fn a_controlled_qkey_needs_cap_net_raw() {
    use crate::verbs::{AttrMask, QpAttr, QpState};
    let (mut svc, name, _peer) = service("qkey", Limits::default());
    let a = hello(&mut svc, &name, "a");
    let pa = pd(&mut svc, &a);
    let c = cq(&mut svc, &a);
    let Resp::Qp { qpn } = qp(&mut svc, &a, pa, c, QpType::Ud, None) else {
        panic!("create_qp")
    };
    let init = |qkey: u32| {
        let attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        Req::ModifyQp {
            qpn,
            attr,
            mask: AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        }
    };
    // The test's own connection is this process: make its client someone else (nobody),
    // whose effective uid this process is not, so it holds no capability there.
    let me = svc.clients.len() - 1;
    let uid = svc.clients[me].uid;
    svc.clients[me].uid = 65534;
    assert_eq!(a.errno(&mut svc, init(crate::verbs::GSI_QKEY)), libc::EPERM);
    assert_eq!(a.errno(&mut svc, init(0x8000_0001)), libc::EPERM);
    assert!(matches!(a.call(&mut svc, init(0x1111_1111)), Resp::Ok));
    // Root may (the kernel lets CAP_NET_RAW).
    svc.clients[me].uid = 0;
    let back = Req::ModifyQp {
        qpn,
        attr: QpAttr {
            qkey: crate::verbs::GSI_QKEY,
            ..QpAttr::default()
        },
        mask: AttrMask::QKEY,
    };
    assert!(matches!(a.call(&mut svc, back), Resp::Ok));
    svc.clients[me].uid = uid;
}
