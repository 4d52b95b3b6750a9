//! The GSI relay end to end on a simulated link (no root): the service's QP1 on one
//! side, a peer's CM with its own GSI QP on the other, raw clients of the service.
//! A REQ reaches the client listening on its ServiceID and no other; that client's REP
//! goes out, another client may not send it; a REQ nobody listens on is rejected with
//! "invalid service ID" as in-process; a gone client's listen is free again.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use rustix::net::{AddressFamily, RecvFlags, SocketAddrUnix, SocketFlags, SocketType};

use super::*;
use crate::cm::{Cm, CmConfig, CmEvent, ConnParam, Path};
use crate::proto::{GRH_LEN, GSI_QKEY};
use crate::verbs::{Access, AddressVector, QpInitAttr, RecvWr, SendWr, WrOpcode};
use crate::wire::mad::{CmMsg, MAD_LEN, Mad, RDMA_PS_TCP, rej_reason, service_id};

const SID: u64 = service_id(RDMA_PS_TCP, 7174);
const SID_NONE: u64 = service_id(RDMA_PS_TCP, 7175);

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

fn call(svc: &mut Service, sock: &OwnedFd, req: &Req) -> (Resp, Vec<OwnedFd>) {
    shm::send_with_fds(sock.as_fd(), &serde_json::to_vec(req).unwrap(), &[]).unwrap();
    let mut buf = vec![0u8; 256 * 1024];
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

/// A client that said hello and opened the relay: its socket and comm-ID range.
struct Client {
    sock: OwnedFd,
    range: (u32, u32),
    _keep: Vec<OwnedFd>,
}

impl Client {
    fn new(svc: &mut Service, name: &str) -> Client {
        let sock = connect(name);
        let (resp, mut keep) = call(svc, &sock, &Req::Hello { comm: "cm".into() });
        assert!(matches!(resp, Resp::Hello { .. }), "{resp:?}");
        let (resp, fds) = call(svc, &sock, &Req::GsiOpen);
        let Resp::GsiOpened {
            comm_base,
            comm_span,
        } = resp
        else {
            panic!("{resp:?}")
        };
        assert_eq!(fds.len(), 1, "the notifier");
        keep.extend(fds);
        Client {
            sock,
            range: (comm_base, comm_span),
            _keep: keep,
        }
    }

    fn call(&self, svc: &mut Service, req: Req) -> Resp {
        call(svc, &self.sock, &req).0
    }

    fn errno(&self, svc: &mut Service, req: Req) -> Option<i32> {
        match self.call(svc, req) {
            Resp::Err { errno, .. } => Some(errno),
            _ => None,
        }
    }

    fn recv(&self, svc: &mut Service) -> Vec<ipc::GsiMad> {
        match self.call(svc, Req::GsiRecv) {
            Resp::GsiMads { mads } => mads,
            r => panic!("{r:?}"),
        }
    }
}

/// The peer's QP1 and CM (as src/abi/rdmacm_port.rs makes them in-process).
struct Peer {
    qp: crate::verbs::Qp,
    ah: crate::verbs::Ah,
    cq: crate::verbs::Cq,
    mr: crate::verbs::Mr,
    _pd: crate::verbs::Pd,
    cm: Cm,
}

const SVC_GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1];
const PEER_GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 2];

impl Peer {
    fn new(dev: &Device) -> Peer {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        let qp = pd.create_gsi_qp(&QpInitAttr::new(&cq, &cq, 16)).unwrap();
        qp.ud_ready(GSI_QKEY, 0).unwrap();
        let mr = pd.reg_mr(32 * 1024, Access::LOCAL_WRITE).unwrap();
        for i in 0..8 {
            qp.post_recv(RecvWr {
                wr_id: i,
                sg_list: vec![mr.sge(i as usize * 1024, 1024)],
            })
            .unwrap();
        }
        let ah = pd
            .create_ah(&AddressVector {
                dgid: SVC_GID,
                sgid_index: 1,
                ..AddressVector::default()
            })
            .unwrap();
        Peer {
            qp,
            ah,
            cq,
            mr,
            _pd: pd,
            cm: Cm::new(CmConfig::default()),
        }
    }

    /// Send what the peer's CM queued to the service's QP1.
    fn flush(&mut self) {
        while let Some(t) = self.cm.poll_transmit() {
            assert_eq!(t.to, SVC_GID);
            self.mr.write(16 * 1024, &t.mad).unwrap();
            let mut wr = SendWr::new(1 << 32, WrOpcode::Send);
            wr.sg_list = vec![self.mr.sge(16 * 1024, MAD_LEN as u32)];
            self.qp
                .post_send_ud(wr, &self.ah, Qpn::new(1), GSI_QKEY)
                .unwrap();
            let w = self.cq.wait(1, Duration::from_secs(5));
            assert_eq!(w.len(), 1, "the send completes");
        }
    }

    /// The next MAD the peer's QP1 receives, stepping the service meanwhile.
    fn take(&mut self, svc: &mut Service) -> Mad {
        for _ in 0..200 {
            svc.once(Duration::ZERO).unwrap();
            for w in self.cq.wait(1, Duration::from_millis(10)) {
                if w.wr_id >> 32 != 0 {
                    continue;
                }
                let mut b = vec![0u8; GRH_LEN + MAD_LEN];
                let off = w.wr_id as usize * 1024;
                self.mr.read(off, &mut b).unwrap();
                self.qp
                    .post_recv(RecvWr {
                        wr_id: w.wr_id,
                        sg_list: vec![self.mr.sge(off, 1024)],
                    })
                    .unwrap();
                self.cm.handle_mad(
                    crate::proto::Instant::ZERO,
                    SVC_GID,
                    PEER_GID,
                    &b[GRH_LEN..],
                );
                return Mad::parse(&b[GRH_LEN..]).unwrap();
            }
        }
        panic!("the peer received nothing");
    }
}

/// Step the service until `c` has MADs waiting (or give up: empty).
fn wait_mads(svc: &mut Service, c: &Client) -> Vec<ipc::GsiMad> {
    for _ in 0..200 {
        svc.once(Duration::from_millis(5)).unwrap();
        let m = c.recv(svc);
        if !m.is_empty() {
            return m;
        }
    }
    Vec::new()
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

/// The peer's path to the service's port.
fn peer_path() -> Path {
    Path {
        local_gid: PEER_GID,
        remote_gid: SVC_GID,
        mtu: 3,
        hop_limit: 64,
        ..Path::default()
    }
}

/// A client's own CM (its block of comm IDs `range`), listening on `SID`, accepts the REQ
/// the relay gave it: the CM, the connection's id and the REP to send through the service.
fn accept_in_client(range: (u32, u32), req: &[u8]) -> (Cm, crate::cm::CmId, crate::cm::Transmit) {
    let mut cm = Cm::new(CmConfig {
        comm_ids: Some(range),
        ..CmConfig::default()
    });
    assert!(cm.listen(SID, 1));
    cm.handle_mad(crate::proto::Instant::ZERO, PEER_GID, SVC_GID, req);
    let Some(CmEvent::ConnectRequest { id, .. }) = cm.poll_event() else {
        panic!("the client's CM sees the REQ")
    };
    assert!(cm.accept(crate::proto::Instant::ZERO, id, param(0x77)));
    let rep = std::iter::from_fn(|| cm.poll_transmit()).last().unwrap();
    (cm, id, rep)
}

#[test]
fn cm_mads_reach_their_client_only_and_unmatched_requests_are_rejected() {
    let (dev, peer_dev) = Device::open_sim_pair().unwrap();
    let name = format!("svc-gsi-{}", std::process::id());
    let mut svc = Service::new(dev, &name).unwrap();
    let a = Client::new(&mut svc, &name);
    let b = Client::new(&mut svc, &name);
    assert_ne!(a.range, b.range);
    assert!(matches!(
        a.call(&mut svc, Req::GsiListen { service_id: SID }),
        Resp::Ok
    ));
    assert_eq!(
        b.errno(&mut svc, Req::GsiListen { service_id: SID }),
        Some(libc::EADDRINUSE)
    );
    let mut peer = Peer::new(&peer_dev);
    let path = peer_path();
    peer.cm
        .connect(crate::proto::Instant::ZERO, SID, path, param(0x99));
    peer.flush();
    let got = wait_mads(&mut svc, &a);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].from, got[0].to), (PEER_GID, SVC_GID));
    assert!(matches!(
        Mad::parse(&got[0].mad).unwrap().msg,
        CmMsg::Req(_)
    ));
    assert!(b.recv(&mut svc).is_empty(), "B gets nothing of A's");

    // A's CM answers; B may not send A's REP; A's goes out and reaches the peer.
    let (_cm, _, rep) = accept_in_client(a.range, &got[0].mad);
    let send = |to, mad: &[u8; 256]| Req::GsiSend {
        to,
        mad: mad.to_vec(),
    };
    assert_eq!(b.errno(&mut svc, send(rep.to, &rep.mad)), Some(libc::EPERM));
    assert!(matches!(a.call(&mut svc, send(rep.to, &rep.mad)), Resp::Ok));
    let m = peer.take(&mut svc);
    assert!(matches!(m.msg, CmMsg::Rep(_)), "{m:?}");

    // A REQ nobody listens on: the service's REJ "invalid service ID".
    peer.cm
        .connect(crate::proto::Instant::ZERO, SID_NONE, path, param(0x98));
    peer.flush();
    let m = peer.take(&mut svc);
    match m.msg {
        CmMsg::Rej(r) => assert_eq!(r.reason, rej_reason::INVALID_SERVICE_ID),
        m => panic!("{m:?}"),
    }
    assert!(a.recv(&mut svc).is_empty() && b.recv(&mut svc).is_empty());
    let doc = svc.res_doc();
    assert_eq!(doc.gsi.unmatched, 1);
    assert!(doc.gsi.routed >= 1 && doc.gsi.refused == 1, "{:?}", doc.gsi);

    // A is gone: its listen is free for B.
    drop(a);
    for _ in 0..3 {
        svc.once(Duration::ZERO).unwrap();
    }
    assert!(matches!(
        b.call(&mut svc, Req::GsiListen { service_id: SID }),
        Resp::Ok
    ));
}

#[test]
fn a_dreq_for_a_dead_clients_connection_is_answered_with_a_drep() {
    let (dev, peer_dev) = Device::open_sim_pair().unwrap();
    let name = format!("svc-gsi-drep-{}", std::process::id());
    let mut svc = Service::new(dev, &name).unwrap();
    let a = Client::new(&mut svc, &name);
    assert!(matches!(
        a.call(&mut svc, Req::GsiListen { service_id: SID }),
        Resp::Ok
    ));
    let mut peer = Peer::new(&peer_dev);
    let path = peer_path();
    let pid = peer
        .cm
        .connect(crate::proto::Instant::ZERO, SID, path, param(0x99));
    peer.flush();
    let got = wait_mads(&mut svc, &a);
    assert_eq!(got.len(), 1, "{got:?}");
    let (cm, id, rep) = accept_in_client(a.range, &got[0].mad);
    assert!(matches!(
        a.call(
            &mut svc,
            Req::GsiSend {
                to: rep.to,
                mad: rep.mad.to_vec()
            }
        ),
        Resp::Ok
    ));
    assert!(matches!(peer.take(&mut svc).msg, CmMsg::Rep(_)));
    assert!(peer.cm.rtu(pid));
    peer.flush();
    while peer.cm.poll_event().is_some() {}
    let rtu = wait_mads(&mut svc, &a);
    assert!(matches!(
        Mad::parse(&rtu[0].mad).unwrap().msg,
        CmMsg::Rtu(_)
    ));

    // A dies with the connection up (its CM with it); the peer disconnects.
    drop(a);
    drop(cm);
    for _ in 0..3 {
        svc.once(Duration::ZERO).unwrap();
    }
    assert!(peer.cm.disconnect(crate::proto::Instant::ZERO, pid));
    peer.flush();
    // The service answers for the dead client as its CM would have: a DREP.
    let m = peer.take(&mut svc);
    match m.msg {
        CmMsg::Drep(d) => assert_eq!((d.local_comm_id, d.remote_comm_id), (id, pid)),
        m => panic!("not a DREP: {m:?}"),
    }
    assert_eq!(
        std::iter::from_fn(|| peer.cm.poll_event()).collect::<Vec<_>>(),
        [CmEvent::Disconnected { id: pid }]
    );
    let doc = svc.res_doc();
    assert_eq!(
        (doc.gsi.orphan_dreq, doc.gsi.unknown_id),
        (1, 0),
        "{:?}",
        doc.gsi
    );
}
