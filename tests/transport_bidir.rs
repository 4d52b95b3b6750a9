//! Both QPs as requester and responder at once, scatter/gather lists on both ends, PSNs
//! crossing the 2^24 wrap, over a lossy link.

use xrnic::proto::Instant;
#[path = "transport_common/mod.rs"]
mod common;

use common::*;
use xrnic::proto::{Access, MrInfo, Mtu, Sge, WcOpcode, WcStatus, WrOpcode};
use xrnic::sim::{ConnectOpts, LinkConfig, Side};

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const N: usize = 40;
const LEN: usize = 3000;

struct End {
    src: MrInfo,
    rcv: MrInfo,
    win: MrInfo,
    ro: MrInfo,
    back: MrInfo,
    ctr: MrInfo,
}

#[test]
fn both_directions_with_scatter_gather_over_a_lossy_link() {
    let link = LinkConfig {
        loss: 0.02,
        reorder: 0.02,
        dup: 0.02,
        corrupt: 0.02,
        ..LinkConfig::default()
    };
    let opts = ConnectOpts {
        mtu: Mtu::Mtu512,
        ..ConnectOpts::default()
    };
    let (mut p, c) = pair(link, &opts);
    let mut ends = vec![];
    for (k, s) in [Side::A, Side::B].into_iter().enumerate() {
        let seed = k as u8 + 1;
        let e = End {
            src: mr(&mut p, s, &c, N * LEN, Access::LOCAL_WRITE),
            rcv: mr(&mut p, s, &c, N * LEN, Access::LOCAL_WRITE),
            win: mr(
                &mut p,
                s,
                &c,
                N * LEN,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            ),
            ro: mr(&mut p, s, &c, N * LEN, Access::REMOTE_READ),
            back: mr(&mut p, s, &c, N * LEN + 8 * N, Access::LOCAL_WRITE),
            ctr: mr(
                &mut p,
                s,
                &c,
                8,
                Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
            ),
        };
        p.dev(s)
            .mr_bytes_mut(e.src.lkey)
            .unwrap()
            .copy_from_slice(&pattern(seed, N * LEN));
        p.dev(s)
            .mr_bytes_mut(e.ro.lkey)
            .unwrap()
            .copy_from_slice(&pattern(seed + 10, N * LEN));
        ends.push(e);
    }
    for (k, s) in [Side::A, Side::B].into_iter().enumerate() {
        let (me, peer) = (&ends[k], &ends[1 - k]);
        let qp = if s == Side::A { c.qp_a } else { c.qp_b };
        for i in 0..N {
            let base = (i * LEN) as u64;
            let at = |m: &MrInfo, off: u64, len: u32| Sge {
                addr: m.addr + off,
                length: len,
                lkey: m.lkey,
            };
            // Receives in two SGEs (1700 + 1300), sends in three (1000 + 1500 + 500).
            let rsg = vec![at(&me.rcv, base, 1700), at(&me.rcv, base + 1700, 1300)];
            p.dev(s).post_recv(qp, recv_wr(i as u64, rsg)).unwrap();
            let ssg = vec![
                at(&me.src, base, 1000),
                at(&me.src, base + 1000, 1500),
                at(&me.src, base + 2500, 500),
            ];
            let mut w = send_wr(4 * i as u64, WrOpcode::SendWithImm, ssg);
            w.imm_data = i as u32;
            p.dev(s).post_send(qp, w).unwrap();
            // WRITE our source slice to the peer's window.
            let mut w = send_wr(
                4 * i as u64 + 1,
                WrOpcode::RdmaWrite,
                vec![at(&me.src, base, LEN as u32)],
            );
            w.rdma.remote_addr = peer.win.addr + base;
            w.rdma.rkey = peer.win.rkey;
            p.dev(s).post_send(qp, w).unwrap();
            // READ the peer's read-only slice into two SGEs.
            let bsg = vec![
                at(&me.back, base, 100),
                at(&me.back, base + 100, LEN as u32 - 100),
            ];
            let mut r = send_wr(4 * i as u64 + 2, WrOpcode::RdmaRead, bsg);
            r.rdma.remote_addr = peer.ro.addr + base;
            r.rdma.rkey = peer.ro.rkey;
            p.dev(s).post_send(qp, r).unwrap();
            // Fetch-and-add 1 on the peer's counter; the old value lands in `back`.
            let off = (N * LEN + 8 * i) as u64;
            let mut f = send_wr(
                4 * i as u64 + 3,
                WrOpcode::AtomicFetchAndAdd,
                vec![at(&me.back, off, 8)],
            );
            f.atomic.remote_addr = peer.ctr.addr;
            f.atomic.rkey = peer.ctr.rkey;
            f.atomic.compare_add = 1;
            p.dev(s).post_send(qp, f).unwrap();
        }
    }
    let (cqa, cqb) = (c.cq_a, c.cq_b);
    let (mut wa, mut wb) = (vec![], vec![]);
    let done = p.run_until(Instant::from_nanos(60_000_000_000), |pr| {
        pr.a.poll_cq(cqa, usize::MAX, &mut wa);
        pr.b.poll_cq(cqb, usize::MAX, &mut wb);
        wa.len() >= 5 * N && wb.len() >= 5 * N
    });
    assert!(done, "{} {}", wa.len(), wb.len());
    for (k, wcs) in [&wa, &wb].into_iter().enumerate() {
        let s = if k == 0 { Side::A } else { Side::B };
        let (me, peer_seed) = (&ends[k], 2 - k as u8);
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
        let sends: Vec<_> = wcs
            .iter()
            .filter(|w| w.opcode != WcOpcode::Recv)
            .map(|w| w.wr_id)
            .collect();
        assert_eq!(
            sends,
            (0..4 * N as u64).collect::<Vec<_>>(),
            "in order, once each"
        );
        let recvs: Vec<_> = wcs.iter().filter(|w| w.opcode == WcOpcode::Recv).collect();
        assert_eq!(recvs.len(), N);
        for (i, r) in recvs.iter().enumerate() {
            assert_eq!(
                (r.wr_id, r.byte_len, r.imm_data),
                (i as u64, LEN as u32, Some(i as u32))
            );
        }
        let d = p.dev(s);
        // The peer's SENDs landed across our receive SGEs, its WRITEs in our window.
        assert_eq!(
            d.mr_bytes(me.rcv.lkey).unwrap(),
            &pattern(peer_seed, N * LEN)[..]
        );
        assert_eq!(
            d.mr_bytes(me.win.lkey).unwrap(),
            &pattern(peer_seed, N * LEN)[..]
        );
        // Our READs brought the peer's read-only bytes.
        let back = d.mr_bytes(me.back.lkey).unwrap();
        assert_eq!(&back[..N * LEN], &pattern(peer_seed + 10, N * LEN)[..]);
        // Fetch-and-add results: 0, 1, ..., N-1 in order; our counter ends at N.
        for i in 0..N {
            let o = N * LEN + 8 * i;
            assert_eq!(
                u64::from_ne_bytes(back[o..o + 8].try_into().unwrap()),
                i as u64
            );
        }
        assert_eq!(
            u64::from_ne_bytes(d.mr_bytes(me.ctr.lkey).unwrap().try_into().unwrap()),
            N as u64
        );
        let q = if k == 0 { c.qp_a } else { c.qp_b };
        let cnt = d.qp_counters(q).unwrap();
        assert_eq!(cnt.atomics_executed, N as u64, "no atomic executed twice");
        assert!(cnt.retransmitted_packets > 0);
        // The PSNs started at 0xffff00 / 0xfffff0 and crossed 2^24.
        assert!(d.query_qp(q).unwrap().sq_psn.value() < 0x10_0000);
    }
}
