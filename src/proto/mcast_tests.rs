//! Multicast on the engine (src/proto/mcast_verbs.rs): a datagram to a group reaches
//! every QP attached to it and no other, on the wire as IBTA §10.5 and the kernel's
//! multicast mapping say; a Q_Key mismatch is dropped and counted at that QP only; a
//! detach stops delivery; a destroyed QP leaves its groups; the checks of the verbs.

use crate::proto::{
    Access, AddressVector, AttrMask, Cq, GRH_LEN, Instant, MrInfo, QpAttr, QpInitAttr, QpState,
    QpType, RecvWr, Rnic, RxVerdict, SendWr, Sge, UdDest, VerbsError, WcOpcode, WcStatus, WrOpcode,
    ipv4_gid,
};
use crate::sim::{LinkConfig, Pair, Side};
use crate::wire::{FrameRepr, FrameView, MULTICAST_QPN, Psn, Qpn, multicast_mac};

const QKEY: u32 = 0x0123_4567;
const BUF: u64 = 2048;
const GROUP: [u8; 4] = [239, 1, 2, 3];

struct Ud {
    cq: Cq,
    qpn: Qpn,
    mr: MrInfo,
}

fn ud_qp(d: &mut Rnic, qkey: u32, qp_type: QpType) -> Ud {
    let pd = d.alloc_pd();
    let cq = d.create_cq(256);
    let init = QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        max_send_wr: 64,
        max_recv_wr: 64,
        sq_sig_all: false,
        qp_type,
        srq: None,
    };
    let qpn = d.create_qp(pd, &init).unwrap();
    let mr = d
        .reg_mr(pd, (16 * BUF) as usize, Access::LOCAL_WRITE)
        .unwrap();
    if qp_type == QpType::Ud {
        let mut a = QpAttr {
            qp_state: QpState::Init,
            qkey,
            ..QpAttr::default()
        };
        let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY;
        d.modify_qp(qpn, &a, m).unwrap();
        a.qp_state = QpState::Rtr;
        d.modify_qp(qpn, &a, AttrMask::STATE).unwrap();
        a.qp_state = QpState::Rts;
        a.sq_psn = Psn::new(0);
        d.modify_qp(qpn, &a, AttrMask::STATE | AttrMask::SQ_PSN)
            .unwrap();
        for s in 8..16 {
            d.post_recv(
                qpn,
                RecvWr {
                    wr_id: s,
                    sg_list: sge(&mr, s, BUF as u32),
                },
            )
            .unwrap();
        }
    }
    Ud { cq, qpn, mr }
}

fn sge(mr: &MrInfo, slot: u64, len: u32) -> Vec<Sge> {
    vec![Sge {
        addr: mr.addr + slot * BUF,
        length: len,
        lkey: mr.lkey,
    }]
}

/// The address handle `ibv_create_ah` makes for the group: its MAC derived.
fn to_group(qkey: u32) -> UdDest {
    let dgid = ipv4_gid(GROUP);
    UdDest {
        av: AddressVector {
            dmac: multicast_mac(&dgid).unwrap(),
            dgid,
            sgid_index: 0,
            hop_limit: 64,
            ..AddressVector::default()
        },
        remote_qpn: Qpn::new(MULTICAST_QPN),
        remote_qkey: qkey,
    }
}

fn send(p: &mut Pair, u: &Ud, slot: u64, data: &[u8], qkey: u32) {
    let off = (slot * BUF) as usize;
    p.a.mr_bytes_mut(u.mr.lkey).unwrap()[off..off + data.len()].copy_from_slice(data);
    let mut wr = SendWr::new(slot, WrOpcode::Send);
    wr.sg_list = sge(&u.mr, slot, data.len() as u32);
    p.a.post_send_ud(u.qpn, wr, &to_group(qkey)).unwrap();
    p.run_until(Instant::from_nanos(1_000_000_000), |_| false);
}

fn recvs(d: &mut Rnic, u: &Ud) -> Vec<crate::proto::WorkCompletion> {
    let mut v = Vec::new();
    d.poll_cq(u.cq, usize::MAX, &mut v);
    v.retain(|w| w.opcode == WcOpcode::Recv);
    v
}

fn group_gid() -> [u8; 16] {
    ipv4_gid(GROUP)
}

#[test]
fn a_datagram_to_a_group_reaches_each_attached_qp_and_no_other() {
    let mut p = Pair::new(LinkConfig::default(), 3);
    p.capture = Some(Vec::new());
    let tx = ud_qp(&mut p.a, QKEY, QpType::Ud);
    let b1 = ud_qp(&mut p.b, QKEY, QpType::Ud);
    let b2 = ud_qp(&mut p.b, QKEY, QpType::Ud);
    let outsider = ud_qp(&mut p.b, QKEY, QpType::Ud);
    let wrong_key = ud_qp(&mut p.b, 0x0bad_0bad, QpType::Ud);
    for u in [&b1, &b2, &wrong_key] {
        assert_eq!(p.b.attach_mcast(u.qpn, &group_gid()), Ok(true));
    }
    assert_eq!(
        p.b.attach_mcast(b1.qpn, &group_gid()),
        Ok(false),
        "a second attach succeeds and changes nothing"
    );
    assert_eq!(p.b.mcast_members(&group_gid()).len(), 3);
    let data: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
    send(&mut p, &tx, 0, &data, QKEY);

    // On the wire: the group's MAC and address, DQPN 0xFFFFFF, the sender's QPN in the DETH.
    let cap = p.capture.take().unwrap();
    let frames: Vec<&Vec<u8>> = cap
        .iter()
        .filter(|(_, s, _)| *s == Side::A)
        .map(|(_, _, f)| f)
        .collect();
    assert_eq!(frames.len(), 1);
    let f = frames[0];
    assert_eq!(&f[..6], &[0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]);
    let v = FrameView::parse(f).unwrap();
    assert_eq!(v.ip_addrs().1, &GROUP[..]);
    assert_eq!(v.bth().dest_qp().value(), MULTICAST_QPN);

    for u in [&b1, &b2] {
        let w = recvs(&mut p.b, u);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].status, WcStatus::Success);
        assert!(w[0].grh);
        assert_eq!(w[0].src_qp, tx.qpn);
        assert_eq!(w[0].qp_num, u.qpn);
        assert_eq!(w[0].byte_len as usize, GRH_LEN + data.len());
        let slot = w[0].wr_id;
        let off = (slot * BUF) as usize;
        let bytes = p.b.mr_bytes(u.mr.lkey).unwrap();
        // The GRH holds the frame's IPv4 header: its destination is the group.
        assert_eq!(&bytes[off + 20 + 16..off + 20 + 20], &GROUP[..]);
        assert_eq!(&bytes[off + GRH_LEN..off + GRH_LEN + data.len()], &data[..]);
        assert_eq!(p.b.ud_counters(u.qpn).unwrap().datagrams_received, 1);
    }
    assert!(recvs(&mut p.b, &outsider).is_empty());
    assert_eq!(p.b.ud_counters(outsider.qpn).unwrap().datagrams_received, 0);
    // The Q_Key mismatch is that QP's drop, counted there; the others took the copy.
    assert!(recvs(&mut p.b, &wrong_key).is_empty());
    let c = p.b.ud_counters(wrong_key.qpn).unwrap();
    assert_eq!((c.bad_qkey_dropped, c.datagrams_received), (1, 0));
    assert_eq!(p.b.counters().wrong_address_dropped, 0);

    // Replayed by hand: the frame's verdict is Taken (two QPs took it).
    let now = Instant::from_nanos(2_000_000_000);
    assert_eq!(p.b.handle_frame(now, f), RxVerdict::Taken);
    assert_eq!(p.b.ud_counters(wrong_key.qpn).unwrap().bad_qkey_dropped, 2);
    let _ = (recvs(&mut p.b, &b1), recvs(&mut p.b, &b2));

    // Detach stops delivery to that QP only.
    p.b.detach_mcast(b2.qpn, &group_gid()).unwrap();
    send(&mut p, &tx, 1, &data[..10], QKEY);
    assert_eq!(recvs(&mut p.b, &b1).len(), 1);
    assert!(recvs(&mut p.b, &b2).is_empty());
    assert!(
        p.b.detach_mcast(b2.qpn, &group_gid()).is_err(),
        "not attached any more (rxe: EINVAL)"
    );

    // A destroyed QP leaves its groups; once none is left the group's frames are not ours.
    p.b.destroy_qp(b1.qpn).unwrap();
    p.b.destroy_qp(wrong_key.qpn).unwrap();
    assert!(p.b.mcast_groups().is_empty());
    assert_eq!(p.b.handle_frame(now, f), RxVerdict::WrongAddress);
}

/// `frame` with its BTH destination QP replaced (ICRC recomputed).
fn with_dest_qp(frame: &[u8], qpn: u32) -> Vec<u8> {
    let mut r = FrameRepr::parse(frame).unwrap();
    r.roce.bth.dest_qp = Qpn::new(qpn);
    let mut out = vec![0u8; r.buffer_len()];
    let n = r.emit(&mut out).unwrap();
    out.truncate(n);
    out
}

#[test]
fn a_group_frame_needs_the_multicast_qpn_and_the_groups_mac() {
    let mut p = Pair::new(LinkConfig::default(), 4);
    p.capture = Some(Vec::new());
    let tx = ud_qp(&mut p.a, QKEY, QpType::Ud);
    let b1 = ud_qp(&mut p.b, QKEY, QpType::Ud);
    p.b.attach_mcast(b1.qpn, &group_gid()).unwrap();
    send(&mut p, &tx, 0, b"hello", QKEY);
    assert_eq!(recvs(&mut p.b, &b1).len(), 1);
    let f = p.capture.take().unwrap()[0].2.clone();
    let now = Instant::from_nanos(2_000_000_000);
    // To the group but to a unicast QPN (even the member's own): not a multicast packet.
    let to_qp = with_dest_qp(&f, b1.qpn.value());
    assert_eq!(p.b.handle_frame(now, &to_qp), RxVerdict::UnknownQp);
    // Another group's MAC for the group's address.
    let mut r = FrameRepr::parse(&f).unwrap();
    r.eth.dst[5] ^= 1;
    let mut other_mac = vec![0u8; r.buffer_len()];
    let n = r.emit(&mut other_mac).unwrap();
    assert_eq!(
        p.b.handle_frame(now, &other_mac[..n]),
        RxVerdict::WrongAddress
    );
    assert!(recvs(&mut p.b, &b1).is_empty());
    assert_eq!(p.b.handle_frame(now, &f), RxVerdict::Taken);
}

#[test]
fn only_ud_qps_attach_and_only_to_multicast_gids() {
    let mut p = Pair::new(LinkConfig::default(), 5);
    let ud = ud_qp(&mut p.b, QKEY, QpType::Ud);
    let rc = ud_qp(&mut p.b, QKEY, QpType::Rc);
    let uc = ud_qp(&mut p.b, QKEY, QpType::Uc);
    for q in [rc.qpn, uc.qpn] {
        assert!(matches!(
            p.b.attach_mcast(q, &group_gid()),
            Err(VerbsError::InvalidValue(_))
        ));
    }
    // A unicast GID is no group (ib_core `rdma_is_multicast_addr`).
    assert!(matches!(
        p.b.attach_mcast(ud.qpn, &ipv4_gid([192, 0, 2, 9])),
        Err(VerbsError::InvalidValue(_))
    ));
    assert!(matches!(
        p.b.attach_mcast(Qpn::new(0x00ab_cdef), &group_gid()),
        Err(VerbsError::NotFound(_))
    ));
    // IPv6 groups (ff0e::/16 and any ff00::/8) attach.
    let mut g6 = [0u8; 16];
    g6[0] = 0xff;
    g6[1] = 0x0e;
    g6[15] = 0x42;
    assert_eq!(p.b.attach_mcast(ud.qpn, &g6), Ok(true));
    assert_eq!(p.b.mcast_groups(), vec![g6]);
    // QP1 is the GSI QP (IB_QPT_GSI to ib_core): refused.
    let pd = p.b.alloc_pd();
    let cq = p.b.create_cq(16);
    let gsi =
        p.b.create_gsi_qp(
            pd,
            &QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                max_send_wr: 4,
                max_recv_wr: 4,
                sq_sig_all: false,
                qp_type: QpType::Ud,
                srq: None,
            },
        )
        .unwrap();
    assert!(p.b.attach_mcast(gsi, &group_gid()).is_err());
}
