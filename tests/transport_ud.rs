//! UD QPs and the GSI QP on virtual time: datagrams both ways over IPv4 and IPv6 with the
//! GRH checked byte for byte against the frame on the wire, a lossy, reordering and
//! duplicating link (whole datagrams or none, the rest counted, nothing resent), Q_Key
//! checks and the privileged Q_Key, the too-long send, receive-side errors, and real rxe
//! CM MADs (UD on QP1, ../shared/vectors/rxe) landing on our QP1 with the GRH rxe writes.

use xrnic::proto::{
    Access, AddressVector, AttrMask, Config, Cq, GRH_LEN, GSI_QKEY, GSI_QPN, MrInfo, Mtu, QpAttr,
    QpInitAttr, QpState, QpType, RecvWr, Rnic, SendWr, Sge, UdDest, VerbsError, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode, ipv4_gid,
};
use xrnic::proto::{Instant, RxVerdict};
use xrnic::sim::{LinkConfig, Pair, Side, side_config};
use xrnic::wire::{FrameView, Opcode, Psn, Qpn};

const QKEY: u32 = 0x1111_2222;
const BUF: u64 = 4096 + 64;

/// One UD QP of a device, with a region for its buffers.
struct Ud {
    cq: Cq,
    qpn: Qpn,
    mr: MrInfo,
}

fn ud_init(cq: Cq, depth: u32) -> QpInitAttr {
    QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        max_send_wr: depth,
        max_recv_wr: depth,
        sq_sig_all: false,
        qp_type: QpType::Ud,
        srq: None,
    }
}

/// RESET → INIT (P_Key index 0, port 1, `qkey`) → RTR → RTS, ibv_ud_pingpong's masks.
fn to_rts(d: &mut Rnic, qpn: Qpn, qkey: u32) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qkey,
        ..QpAttr::default()
    };
    d.modify_qp(
        qpn,
        &a,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    d.modify_qp(qpn, &a, AttrMask::STATE).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = Psn::new(0x100);
    d.modify_qp(qpn, &a, AttrMask::STATE | AttrMask::SQ_PSN)
        .unwrap();
}

fn ud_qp(d: &mut Rnic, slots: u64, qkey: u32) -> Ud {
    let pd = d.alloc_pd();
    let cq = d.create_cq(4096);
    let qpn = d.create_qp(pd, &ud_init(cq, 1024)).unwrap();
    to_rts(d, qpn, qkey);
    let mr = d
        .reg_mr(pd, (slots * BUF) as usize, Access::LOCAL_WRITE)
        .unwrap();
    Ud { cq, qpn, mr }
}

fn sge(u: &Ud, slot: u64, len: u32) -> Vec<Sge> {
    vec![Sge {
        addr: u.mr.addr + slot * BUF,
        length: len,
        lkey: u.mr.lkey,
    }]
}

fn post_recvs(d: &mut Rnic, u: &Ud, slots: std::ops::Range<u64>) {
    for s in slots {
        d.post_recv(
            u.qpn,
            RecvWr {
                wr_id: s,
                sg_list: sge(u, s, BUF as u32),
            },
        )
        .unwrap();
    }
}

/// The address handle of side `to` as seen from the other side (`v6`: GID index 1).
fn dest(to: Side, qpn: Qpn, qkey: u32, v6: bool) -> UdDest {
    let cfg = side_config(to);
    let i = usize::from(v6);
    UdDest {
        av: AddressVector {
            dmac: cfg.mac,
            dgid: cfg.gids[i],
            sgid_index: i as u8,
            traffic_class: 0,
            hop_limit: 0,
            flow_label: 0,
            vlan_tci: None,
        },
        remote_qpn: qpn,
        remote_qkey: qkey,
    }
}

fn payload(seq: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seq as usize * 131 + i * 7) as u8 ^ 0x5a)
        .collect()
}

/// Write `data` at `slot` of `u`'s region and post it as a UD send to `to`.
fn send(d: &mut Rnic, u: &Ud, slot: u64, data: &[u8], to: &UdDest, imm: Option<u32>) {
    let off = (slot * BUF) as usize;
    d.mr_bytes_mut(u.mr.lkey).unwrap()[off..off + data.len()].copy_from_slice(data);
    let mut wr = SendWr::new(
        slot,
        if imm.is_some() {
            WrOpcode::SendWithImm
        } else {
            WrOpcode::Send
        },
    );
    wr.imm_data = imm.unwrap_or(0);
    wr.sg_list = sge(u, slot, data.len() as u32);
    d.post_send_ud(u.qpn, wr, to).unwrap();
}

fn poll(d: &mut Rnic, cq: Cq) -> Vec<WorkCompletion> {
    let mut v = Vec::new();
    d.poll_cq(cq, usize::MAX, &mut v);
    v
}

fn run(p: &mut Pair) {
    p.run_until(Instant::from_nanos(1_000_000_000), |_| false);
}

fn slot_bytes(d: &Rnic, u: &Ud, slot: u64, len: usize) -> Vec<u8> {
    let off = (slot * BUF) as usize;
    d.mr_bytes(u.mr.lkey).unwrap()[off..off + len].to_vec()
}

/// What a receive buffer must start with for `frame` (rxe `build_rdma_network_hdr`).
fn expected_grh(frame: &[u8]) -> Vec<u8> {
    let v = FrameView::parse(frame).unwrap();
    let mut g = vec![0u8; GRH_LEN];
    // The IP header starts after the 14-byte Ethernet header (no VLAN here).
    if v.is_ipv6() {
        g.copy_from_slice(&frame[14..54]);
    } else {
        g[20..].copy_from_slice(&frame[14..34]);
    }
    g
}

fn both_ways(v6: bool) {
    let mut p = Pair::new(LinkConfig::default(), 7);
    p.capture = Some(Vec::new());
    let ua = ud_qp(&mut p.a, 16, QKEY);
    let ub = ud_qp(&mut p.b, 16, QKEY);
    post_recvs(&mut p.a, &ua, 8..16);
    post_recvs(&mut p.b, &ub, 8..16);
    let to_b = dest(Side::B, ub.qpn, QKEY, v6);
    let to_a = dest(Side::A, ua.qpn, QKEY, v6);
    let sizes = [0usize, 1, 255, 1024, 4096];
    for (i, &n) in sizes.iter().enumerate() {
        let imm = (i % 2 == 1).then_some(0xfeed_0000 + i as u32);
        send(&mut p.a, &ua, i as u64, &payload(i as u64, n), &to_b, imm);
        send(
            &mut p.b,
            &ub,
            i as u64,
            &payload(100 + i as u64, n),
            &to_a,
            imm,
        );
    }
    run(&mut p);
    let cap = p.capture.take().unwrap();
    for (side, me, peer_qpn, seq0) in [(Side::B, &ub, ua.qpn, 0u64), (Side::A, &ua, ub.qpn, 100)] {
        let frames: Vec<&Vec<u8>> = cap
            .iter()
            .filter(|(_, s, _)| *s == side.other())
            .map(|(_, _, f)| f)
            .collect();
        assert_eq!(frames.len(), sizes.len(), "one frame per datagram, no ACKs");
        let wcs = poll(p.dev(side), me.cq);
        let recvs: Vec<_> = wcs.iter().filter(|w| w.opcode == WcOpcode::Recv).collect();
        assert_eq!(recvs.len(), sizes.len(), "{wcs:?}");
        for (i, (w, f)) in recvs.iter().zip(&frames).enumerate() {
            let view = FrameView::parse(f).unwrap();
            let op = view.bth().opcode();
            assert_eq!(view.is_ipv6(), v6);
            assert_eq!(w.status, WcStatus::Success);
            assert!(w.grh);
            assert_eq!(w.src_qp, peer_qpn);
            assert_eq!(w.qp_num, me.qpn);
            assert_eq!(w.byte_len as usize, GRH_LEN + sizes[i]);
            let imm = (i % 2 == 1).then_some(0xfeed_0000 + i as u32);
            assert_eq!(w.imm_data, imm);
            assert_eq!(
                op,
                if imm.is_some() {
                    Opcode::UD_SEND_ONLY_IMM
                } else {
                    Opcode::UD_SEND_ONLY
                }
            );
            let got = slot_bytes(p.dev(side), me, w.wr_id, GRH_LEN + sizes[i]);
            assert_eq!(got[..GRH_LEN], expected_grh(f)[..], "GRH of datagram {i}");
            assert_eq!(got[GRH_LEN..], payload(seq0 + i as u64, sizes[i])[..]);
        }
    }
    // Signaled sends completed with their length; the PSNs counted up from sq_psn.
    let sends: Vec<_> = poll(p.dev(Side::A), ua.cq);
    assert!(sends.is_empty(), "receives were drained above: {sends:?}");
    let psns: Vec<u32> = cap
        .iter()
        .filter(|(_, s, _)| *s == Side::A)
        .map(|(_, _, f)| FrameView::parse(f).unwrap().bth().psn().value())
        .collect();
    assert_eq!(psns, vec![0x100, 0x101, 0x102, 0x103, 0x104]);
}

#[test]
fn ud_datagrams_both_ways_ipv4_grh_is_the_ipv4_header() {
    both_ways(false);
}

#[test]
fn ud_datagrams_both_ways_ipv6_grh_is_the_ipv6_header() {
    both_ways(true);
}

#[test]
fn ud_send_completions_and_deth() {
    let mut p = Pair::new(LinkConfig::default(), 1);
    p.capture = Some(Vec::new());
    let ua = ud_qp(&mut p.a, 4, QKEY);
    let ub = ud_qp(&mut p.b, 4, QKEY);
    post_recvs(&mut p.b, &ub, 2..4);
    // The privileged Q_Key rule (IBTA §10.2.5): a WR Q_Key with the high bit set sends
    // the QP's own Q_Key.
    send(
        &mut p.a,
        &ua,
        0,
        b"hello",
        &dest(Side::B, ub.qpn, 0x8000_0000, false),
        None,
    );
    run(&mut p);
    let wcs = poll(&mut p.a, ua.cq);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(wcs[0].opcode, WcOpcode::Send);
    assert_eq!(wcs[0].byte_len, 5);
    let cap = p.capture.take().unwrap();
    assert_eq!(cap.len(), 1);
    let v = FrameView::parse(&cap[0].2).unwrap();
    let deth = xrnic::wire::DethRepr::parse(v.ext_bytes(xrnic::wire::Ext::Deth).unwrap());
    assert_eq!(deth.qkey, QKEY);
    assert_eq!(deth.src_qp, ua.qpn);
    assert_eq!(v.bth().dest_qp(), ub.qpn);
    // rxe's conventions for a UD frame (its CM MADs in ../shared/vectors/rxe): AckReq
    // set, the default P_Key.
    assert!(v.bth().ack_req());
    assert_eq!(v.bth().pkey().0, 0xffff);
    let r = poll(&mut p.b, ub.cq);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].status, WcStatus::Success);
    assert_eq!(p.b.ud_counters(ub.qpn).unwrap().datagrams_received, 1);
}

#[test]
fn ud_lossy_link_delivers_whole_datagrams_and_counts_the_rest() {
    let link = LinkConfig {
        loss: 0.15,
        reorder: 0.2,
        dup: 0.1,
        ..LinkConfig::default()
    };
    let mut p = Pair::new(link, 42);
    const N: u64 = 300;
    let ua = ud_qp(&mut p.a, 1, QKEY);
    let ub = ud_qp(&mut p.b, 1024, QKEY);
    post_recvs(&mut p.b, &ub, 0..1024);
    let to_b = dest(Side::B, ub.qpn, QKEY, false);
    // The sender reuses one buffer per datagram: post, let it go, next.
    for i in 0..N {
        let len = 16 + (i as usize * 37) % 1000;
        let mut data = payload(i, len);
        data[..8].copy_from_slice(&i.to_be_bytes());
        send(&mut p.a, &ua, 0, &data, &to_b, None);
        run(&mut p);
    }
    let st = p.link.stats;
    assert_eq!(st.frames_sent, N, "UD never retransmits");
    assert!(
        st.lost > 0 && st.duplicated > 0 && st.reordered > 0,
        "{st:?}"
    );
    let sends = poll(&mut p.a, ua.cq);
    assert_eq!(sends.len() as u64, N);
    assert!(sends.iter().all(|w| w.status == WcStatus::Success));
    let wcs = poll(&mut p.b, ub.cq);
    assert_eq!(wcs.len() as u64, st.frames_delivered);
    let mut seen = vec![0u32; N as usize];
    for w in &wcs {
        assert_eq!(w.status, WcStatus::Success);
        let n = w.byte_len as usize - GRH_LEN;
        let got = slot_bytes(&p.b, &ub, w.wr_id, GRH_LEN + n);
        let seq = u64::from_be_bytes(got[GRH_LEN..GRH_LEN + 8].try_into().unwrap());
        let len = 16 + (seq as usize * 37) % 1000;
        assert_eq!(n, len, "datagram {seq} whole");
        let mut data = payload(seq, len);
        data[..8].copy_from_slice(&seq.to_be_bytes());
        assert_eq!(got[GRH_LEN..], data[..], "datagram {seq} byte-exact");
        seen[seq as usize] += 1;
    }
    let missing = seen.iter().filter(|&&c| c == 0).count() as u64;
    let extra: u64 = seen.iter().map(|&c| u64::from(c.saturating_sub(1))).sum();
    // Every datagram lost on the link is missing, every duplicate delivered twice; the
    // counters say as much.
    assert!(missing > 0 && extra > 0);
    assert_eq!(N - missing + extra, st.frames_delivered);
    let c = p.b.ud_counters(ub.qpn).unwrap();
    assert_eq!(c.datagrams_received, st.frames_delivered);
    assert_eq!(p.a.ud_counters(ua.qpn).unwrap().datagrams_sent, N);
}

#[test]
fn qkey_mismatch_is_dropped_and_counted() {
    let mut p = Pair::new(LinkConfig::default(), 3);
    let ua = ud_qp(&mut p.a, 4, QKEY);
    let ub = ud_qp(&mut p.b, 4, QKEY);
    post_recvs(&mut p.b, &ub, 0..4);
    send(
        &mut p.a,
        &ua,
        0,
        b"wrong",
        &dest(Side::B, ub.qpn, QKEY ^ 1, false),
        None,
    );
    send(
        &mut p.a,
        &ua,
        1,
        b"right",
        &dest(Side::B, ub.qpn, QKEY, false),
        None,
    );
    run(&mut p);
    let c = p.b.ud_counters(ub.qpn).unwrap();
    assert_eq!(c.bad_qkey_dropped, 1);
    assert_eq!(c.datagrams_received, 1);
    let wcs = poll(&mut p.b, ub.cq);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].byte_len as usize, GRH_LEN + 5);
    assert_eq!(
        slot_bytes(&p.b, &ub, wcs[0].wr_id, GRH_LEN + 5)[GRH_LEN..],
        b"right"[..]
    );
    // The wrong datagram took no receive WQE.
    assert_eq!(wcs[0].wr_id, 0);
    // A Q_Key changed by RTS→RTS takes effect.
    let a = QpAttr {
        qp_state: QpState::Rts,
        qkey: QKEY ^ 1,
        ..QpAttr::default()
    };
    p.b.modify_qp(ub.qpn, &a, AttrMask::QKEY).unwrap();
    assert_eq!(p.b.query_qp(ub.qpn).unwrap().qkey, QKEY ^ 1);
    send(
        &mut p.a,
        &ua,
        2,
        b"again",
        &dest(Side::B, ub.qpn, QKEY ^ 1, false),
        None,
    );
    run(&mut p);
    assert_eq!(poll(&mut p.b, ub.cq).len(), 1);
}

#[test]
fn too_long_ud_send_completes_without_a_frame() {
    let mut a_cfg = side_config(Side::A);
    a_cfg.port_mtu = Mtu::Mtu1024;
    let mut p = Pair::with_configs(a_cfg, side_config(Side::B), LinkConfig::default(), 5);
    p.capture = Some(Vec::new());
    let ua = ud_qp(&mut p.a, 4, QKEY);
    let ub = ud_qp(&mut p.b, 4, QKEY);
    post_recvs(&mut p.b, &ub, 0..4);
    let to_b = dest(Side::B, ub.qpn, QKEY, false);
    send(&mut p.a, &ua, 0, &payload(0, 1025), &to_b, None);
    send(&mut p.a, &ua, 1, &payload(1, 1024), &to_b, None);
    run(&mut p);
    // IBTA C10-93.1.1 / rxe: the overlong message completes successfully and sends
    // nothing; the next one goes.
    let wcs = poll(&mut p.a, ua.cq);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(0, WcStatus::Success), (1, WcStatus::Success)]
    );
    assert_eq!(p.capture.as_ref().unwrap().len(), 1);
    assert_eq!(p.a.ud_counters(ua.qpn).unwrap().too_long_not_sent, 1);
    let r = poll(&mut p.b, ub.cq);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].byte_len as usize, GRH_LEN + 1024);
}

#[test]
fn receive_errors_no_wqe_small_buffer_wrong_state() {
    let mut p = Pair::new(LinkConfig::default(), 9);
    let ua = ud_qp(&mut p.a, 4, QKEY);
    let ub = ud_qp(&mut p.b, 4, QKEY);
    let to_b = dest(Side::B, ub.qpn, QKEY, false);
    // No receive WQE: dropped and counted, no RNR NAK (UD has none).
    send(&mut p.a, &ua, 0, b"nobody", &to_b, None);
    run(&mut p);
    assert_eq!(p.b.ud_counters(ub.qpn).unwrap().no_recv_wqe_dropped, 1);
    // A buffer without room for GRH + payload: LOC_LEN_ERR, the QP carries on.
    p.b.post_recv(
        ub.qpn,
        RecvWr {
            wr_id: 7,
            sg_list: sge(&ub, 0, (GRH_LEN + 3) as u32),
        },
    )
    .unwrap();
    post_recvs(&mut p.b, &ub, 1..2);
    send(&mut p.a, &ua, 0, b"four", &to_b, None);
    send(&mut p.a, &ua, 1, b"ok", &to_b, None);
    run(&mut p);
    let wcs = poll(&mut p.b, ub.cq);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(7, WcStatus::LocLenErr), (1, WcStatus::Success)]
    );
    assert_eq!(p.b.query_qp(ub.qpn).unwrap().qp_state, QpState::Rts);
    // A QP still in INIT takes nothing.
    let pd = p.b.alloc_pd();
    let cq = p.b.create_cq(4);
    let q = p.b.create_qp(pd, &ud_init(cq, 4)).unwrap();
    let a = QpAttr {
        qp_state: QpState::Init,
        qkey: QKEY,
        ..QpAttr::default()
    };
    p.b.modify_qp(
        q,
        &a,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
    )
    .unwrap();
    send(
        &mut p.a,
        &ua,
        2,
        b"early",
        &dest(Side::B, q, QKEY, false),
        None,
    );
    run(&mut p);
    assert_eq!(p.b.ud_counters(q).unwrap().wrong_state_dropped, 1);
}

#[test]
fn ud_verbs_refuse_what_ud_cannot_do() {
    let mut d = Rnic::new(Config::default());
    let pd = d.alloc_pd();
    let cq = d.create_cq(8);
    let q = d.create_qp(pd, &ud_init(cq, 4)).unwrap();
    // RC attributes are not UD's.
    let a = QpAttr {
        qp_state: QpState::Init,
        ..QpAttr::default()
    };
    assert_eq!(
        d.modify_qp(q, &a, AttrMask::RC_INIT),
        Err(VerbsError::MissingAttributes(AttrMask::QKEY))
    );
    to_rts(&mut d, q, QKEY);
    let mut wr = SendWr::new(1, WrOpcode::RdmaWrite);
    wr.sg_list = vec![];
    let to = UdDest {
        av: AddressVector {
            dgid: ipv4_gid([192, 0, 2, 2]),
            ..AddressVector::default()
        },
        remote_qpn: Qpn::new(0x20),
        remote_qkey: QKEY,
    };
    assert!(matches!(
        d.post_send_ud(q, wr, &to),
        Err(VerbsError::InvalidValue(_))
    ));
    // A UD QP has no connected post_send.
    assert!(matches!(
        d.post_send(q, SendWr::new(2, WrOpcode::Send)),
        Err(VerbsError::InvalidValue(_))
    ));
}

#[test]
fn gsi_qp_is_qp1_with_the_gsi_qkey_and_the_pkey_table() {
    let mut d = Rnic::new(Config::default());
    let pd = d.alloc_pd();
    let cq = d.create_cq(8);
    let q = d.create_gsi_qp(pd, &ud_init(cq, 4)).unwrap();
    assert_eq!(q, GSI_QPN);
    assert_eq!(q.value(), 1);
    assert_eq!(d.query_qp(q).unwrap().qkey, GSI_QKEY);
    assert!(d.create_gsi_qp(pd, &ud_init(cq, 4)).is_err(), "one QP1");
    // Its Q_Key stays 0x80010000 whatever INIT asks.
    to_rts(&mut d, q, QKEY);
    assert_eq!(d.query_qp(q).unwrap().qkey, GSI_QKEY);
    // ... and after a trip through RESET.
    d.modify_qp(
        q,
        &QpAttr {
            qp_state: QpState::Reset,
            ..QpAttr::default()
        },
        AttrMask::STATE,
    )
    .unwrap();
    assert_eq!(d.query_qp(q).unwrap().qkey, GSI_QKEY);
    to_rts(&mut d, q, QKEY);
    assert_eq!(d.query_qp(q).unwrap().qkey, GSI_QKEY);
    assert_eq!(d.query_pkey(0), Some(0xffff));
    assert_eq!(d.query_pkey(1), None);
    // Other QPs keep their numbers; QP1 goes away and may come back.
    let other = d.create_qp(pd, &ud_init(cq, 4)).unwrap();
    assert!(other.value() >= 0x11);
    d.destroy_qp(q).unwrap();
    assert!(d.query_qp(q).is_err());
    assert_eq!(d.create_gsi_qp(pd, &ud_init(cq, 4)).unwrap(), GSI_QPN);
}

/// The CM MADs rxe sent as UD datagrams to QP1 (a real capture): each lands on our QP1
/// whole, after the GRH rxe itself would write, 20 zero bytes and the frame's IPv4
/// header, with `src_qp` 1 and `byte_len` 40 + 256.
#[test]
#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]
fn rxe_cm_mads_land_on_qp1_with_the_grh_rxe_writes() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/vectors/rxe");
    let mut checked = 0;
    for f in std::fs::read_dir(&dir).unwrap() {
        let f = f.unwrap().path();
        for fr in xrnic::io::capture::read_file(&f).unwrap() {
            let Ok(v) = FrameView::parse(&fr.data) else {
                continue;
            };
            if v.bth().opcode() != Opcode::UD_SEND_ONLY {
                continue;
            }
            let b = &fr.data;
            let dst_mac: [u8; 6] = b[..6].try_into().unwrap();
            let dst_ip: [u8; 4] = b[30..34].try_into().unwrap();
            let mut d = Rnic::new(Config {
                mac: dst_mac,
                gids: vec![ipv4_gid(dst_ip)],
                ..Config::default()
            });
            let pd = d.alloc_pd();
            let cq = d.create_cq(8);
            let q = d.create_gsi_qp(pd, &ud_init(cq, 4)).unwrap();
            to_rts(&mut d, q, 0);
            let mr = d.reg_mr(pd, 512, Access::LOCAL_WRITE).unwrap();
            d.post_recv(
                q,
                RecvWr {
                    wr_id: 9,
                    sg_list: vec![Sge {
                        addr: mr.addr,
                        length: 512,
                        lkey: mr.lkey,
                    }],
                },
            )
            .unwrap();
            assert_eq!(d.handle_frame(Instant::ZERO, b), RxVerdict::Taken);
            let mut wcs = Vec::new();
            d.poll_cq(cq, 8, &mut wcs);
            assert_eq!(wcs.len(), 1, "{} #{}", f.display(), fr.number);
            let w = wcs[0];
            let mad = v.payload();
            assert_eq!(mad.len(), 256, "a MAD");
            assert_eq!(w.status, WcStatus::Success);
            assert!(w.grh);
            assert_eq!(w.byte_len as usize, GRH_LEN + 256);
            assert_eq!(w.src_qp, Qpn::new(1));
            let got = &d.mr_bytes(mr.lkey).unwrap()[..GRH_LEN + 256];
            assert_eq!(got[..20], [0u8; 20]);
            assert_eq!(got[20..40], b[14..34]);
            assert_eq!(got[GRH_LEN..], *mad);
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "the captures hold REQ, REP, RTU, DREQ, DREP: {checked}"
    );
}

/// `xrnic res` / `rdma resource show qp` print the QP type.
#[test]
fn resources_show_the_qp_type() {
    let mut p = Pair::new(LinkConfig::default(), 2);
    let ua = ud_qp(&mut p.a, 1, QKEY);
    let rc = p
        .connect(&xrnic::sim::ConnectOpts::default())
        .expect("connect");
    let lines = p.a.resources().qp_lines();
    let line = |q: Qpn| {
        lines
            .lines()
            .find(|l| l.contains(&format!(" lqpn {} ", q.value())))
            .unwrap_or_else(|| panic!("{lines}"))
            .to_string()
    };
    assert!(line(ua.qpn).contains(" type UD state RTS "), "{lines}");
    assert!(line(rc.qp_a).contains(" type RC state RTS "), "{lines}");
}

/// rxe's UD datagrams over IPv6 (link-local GIDs), from a capture the project recorded
/// against rxe (interop/captures/stock_ud_pingpong_ll.pcapng): each lands on an xrnic UD QP
/// after a GRH that is the frame's own 40-byte IPv6 header (rxe
/// `build_rdma_network_hdr`), with `src_qp` and `byte_len` 40 + payload.
#[test]
fn rxe_ud_datagrams_over_ipv6_land_after_the_ipv6_header_as_grh() {
    let f = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("interop/captures/stock_ud_pingpong_ll.pcapng");
    let mut checked = 0;
    for fr in xrnic::io::capture::read_file(&f).unwrap() {
        let Ok(v) = FrameView::parse(&fr.data) else {
            continue;
        };
        // rxe's frames: the guest's qemu MAC (52:54:00:...) as the source.
        if v.bth().opcode() != Opcode::UD_SEND_ONLY || fr.data[6..9] != [0x52, 0x54, 0x00] {
            continue;
        }
        assert!(v.is_ipv6());
        let b = &fr.data;
        let dst_mac: [u8; 6] = b[..6].try_into().unwrap();
        let dst_gid: [u8; 16] = b[38..54].try_into().unwrap();
        let mut d = Rnic::new(Config {
            mac: dst_mac,
            gids: vec![dst_gid],
            ..Config::default()
        });
        let pd = d.alloc_pd();
        let cq = d.create_cq(8);
        let mut init = ud_init(cq, 4);
        init.qp_type = QpType::Ud;
        let q = d.create_qp(pd, &init).unwrap();
        assert_eq!(q, v.bth().dest_qp(), "the capture's QP is the first one");
        to_rts(&mut d, q, 0x1111_1111);
        let mr = d.reg_mr(pd, 1024, Access::LOCAL_WRITE).unwrap();
        d.post_recv(
            q,
            RecvWr {
                wr_id: 3,
                sg_list: vec![Sge {
                    addr: mr.addr,
                    length: 1024,
                    lkey: mr.lkey,
                }],
            },
        )
        .unwrap();
        assert_eq!(d.handle_frame(Instant::ZERO, b), RxVerdict::Taken);
        let mut wcs = Vec::new();
        d.poll_cq(cq, 8, &mut wcs);
        assert_eq!(wcs.len(), 1, "frame #{}", fr.number);
        let w = wcs[0];
        let payload = v.payload();
        assert_eq!(w.status, WcStatus::Success);
        assert!(w.grh);
        assert_eq!(w.src_qp, Qpn::new(0x11));
        assert_eq!(w.byte_len as usize, GRH_LEN + payload.len());
        let got = &d.mr_bytes(mr.lkey).unwrap()[..GRH_LEN + payload.len()];
        assert_eq!(got[..GRH_LEN], b[14..54], "the GRH is the IPv6 header");
        assert_eq!(got[GRH_LEN..], *payload);
        checked += 1;
    }
    assert!(checked >= 8, "rxe's datagrams in the capture: {checked}");
}
