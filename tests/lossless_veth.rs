//! No self-inflicted loss on a loss-free link: two xrnic devices (driver thread + AF_XDP)
//! on a veth pair (MTU 9000, path MTU 4096) in two network namespaces, driven through the
//! verbs API. A 32 MiB RDMA READ, then a burst of 64 outstanding 1 MiB READs, complete
//! with every byte and without one frame dropped by either receive path
//! (`kernel_rx_dropped`, `kernel_rx_ring_full`) or one packet retransmitted: the reader's
//! READ credit (docs/transport.md, "READ credit") keeps the responses it asked for
//! within what its rings hold. A UC SEND of every `ib_send_bw -c UC -a` size up to
//! 8 MiB arrives whole (UC never retransmits: one dropped frame loses the message).
//! The root tests are `#[ignore = "needs root"]` (docs/testing.md).

use std::time::Duration;

use xrnic::verbs::{
    Access, ConnectOpts, Cq, Device, DeviceOptions, Mr, Mtu, Qp, QpInitAttr, QpType, RecvWr,
    Remote, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use xrnic_netns::{Side, VethPair};

/// A guard against hanging, not a performance threshold.
const PATIENCE: Duration = Duration::from_secs(60);
const MIB: usize = 1 << 20;

struct End {
    dev: Device,
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn end(pair: &VethPair, side: Side, ty: QpType, region: usize) -> End {
    let dev = pair
        .run_in(side, || {
            Device::open_with(&pair.end(side).ifname, &DeviceOptions::default())
        })
        .expect("enter netns")
        .unwrap_or_else(|e| panic!("open device on side {side:?}: {e}"));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let mr = pd.reg_mr(region, Access::ALL).unwrap();
    let qp = pd
        .create_qp_ext(&QpInitAttr::new(&cq, &cq, 1024), ty, None)
        .unwrap();
    End { dev, cq, mr, qp }
}

/// Connect at path MTU 4096 with a local ACK timeout of 4.096 µs × 2^17 ≈ 0.5 s: what
/// is asserted is that nothing is lost, and on a busy two-core host a shorter timer can
/// expire with nothing lost (the process was not scheduled), which would resend too.
fn connect(a: &End, b: &End) {
    let o = ConnectOpts {
        access: Access::ALL,
        path_mtu: Mtu::Mtu4096,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        timeout: 17,
        min_rnr_timer: 1,
        ..ConnectOpts::default()
    };
    let gid = |d: &Device| d.query_gid(1).expect("gid 1");
    let r = |e: &End, psn| Remote {
        qpn: e.qp.qp_num(),
        psn,
        gid: gid(&e.dev),
    };
    a.qp.connect(&r(b, 0x200), 0x100, 1, &o).expect("connect a");
    b.qp.connect(&r(a, 0x100), 0x200, 1, &o).expect("connect b");
}

fn wait_n(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut rounds = 0;
    while out.len() < n {
        if cq.wait_into(n - out.len(), Duration::from_millis(100), &mut out) == 0 {
            rounds += 1;
            assert!(
                Duration::from_millis(100) * rounds < PATIENCE,
                "only {} of {n} completions",
                out.len()
            );
        }
    }
    out
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed * 131 + i * 7 + (i >> 12)) as u8)
        .collect()
}

/// Frames either receive path dropped, and packets either side retransmitted.
fn losses(ends: [&End; 2]) -> (u64, u64) {
    let mut dropped = 0;
    let mut retx = 0;
    for e in ends {
        let io = e.dev.io_stats().unwrap();
        dropped += io.kernel_rx_dropped + io.kernel_rx_ring_full;
        retx += e.dev.counters().unwrap().qp.retransmitted_packets;
    }
    (dropped, retx)
}

fn read_wr(id: u64, a: &End, off: usize, b: &End, roff: usize, len: usize) -> SendWr {
    let mut wr = SendWr::new(id, WrOpcode::RdmaRead);
    wr.sg_list = vec![a.mr.sge(off, len as u32)];
    wr.rdma.remote_addr = b.mr.addr() + roff as u64;
    wr.rdma.rkey = b.mr.rkey();
    wr
}

#[test]
#[ignore = "needs root"]
fn a_32_mib_read_and_64_outstanding_1_mib_reads_drop_nothing() {
    let pair = VethPair::new(9000).expect("veth pair");
    let a = end(&pair, Side::A, QpType::Rc, 64 * MIB);
    let b = end(&pair, Side::B, QpType::Rc, 32 * MIB);
    connect(&a, &b);
    let data = pattern(1, 32 * MIB);
    b.mr.write(0, &data).unwrap();

    a.qp.post_send(read_wr(1, &a, 0, &b, 0, 32 * MIB)).unwrap();
    let wc = wait_n(&a.cq, 1)[0];
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    let mut got = vec![0u8; 32 * MIB];
    a.mr.read(0, &mut got).unwrap();
    assert!(got == data, "the 32 MiB READ's bytes differ");
    let split = a.qp.counters().unwrap().read_requests_split;
    assert!(split > 0, "a 32 MiB READ goes out in parts");

    // 64 READs of 1 MiB each, all posted before the first completes.
    for i in 0..64 {
        a.qp.post_send(read_wr(
            100 + i as u64,
            &a,
            i * MIB,
            &b,
            (i % 32) * MIB,
            MIB,
        ))
        .unwrap();
    }
    let wcs = wait_n(&a.cq, 64);
    for (i, wc) in wcs.iter().enumerate() {
        assert_eq!((wc.wr_id, wc.status), (100 + i as u64, WcStatus::Success));
    }
    for i in [0, 17, 63] {
        let mut got = vec![0u8; MIB];
        a.mr.read(i * MIB, &mut got).unwrap();
        let r = (i % 32) * MIB;
        assert!(got == data[r..r + MIB], "READ {i}'s bytes differ");
    }
    assert_eq!(losses([&a, &b]), (0, 0), "(frames dropped, packets resent)");
}

/// `ib_send_bw -c UC -a`'s sizes (2 B to 8 MiB, powers of two), one message of each at
/// a time: every message arrives, byte for byte. An 8 MiB message is 2 048 frames of two
/// UMEM chunks at path MTU 4096: the default port's fill ring (4 096 chunks) holds it
/// whole even if the receiver drains nothing meanwhile. (Several such messages back to
/// back can outrun a receiver that is not scheduled: UC has no flow control; measured in
/// docs/performance.md, "Receive capacity".)
#[test]
#[ignore = "needs root"]
fn uc_sends_of_every_size_up_to_8_mib_arrive() {
    let pair = VethPair::new(9000).expect("veth pair");
    let a = end(&pair, Side::A, QpType::Uc, 8 * MIB);
    let b = end(&pair, Side::B, QpType::Uc, 8 * MIB);
    connect(&a, &b);
    let data = pattern(2, 8 * MIB);
    a.mr.write(0, &data).unwrap();
    for shift in 1..=23 {
        let len = 1usize << shift;
        b.mr.with_mut(|m| m[..len].fill(0)).unwrap();
        b.qp.post_recv(RecvWr {
            wr_id: shift,
            sg_list: vec![b.mr.sge(0, len as u32)],
        })
        .unwrap();
        let mut wr = SendWr::new(shift, WrOpcode::Send);
        wr.sg_list = vec![a.mr.sge(0, len as u32)];
        a.qp.post_send(wr).unwrap();
        assert_eq!(wait_n(&a.cq, 1)[0].status, WcStatus::Success);
        let mut wcs = Vec::new();
        let mut rounds = 0;
        while wcs.is_empty() && rounds < 50 {
            if b.cq.wait_into(1, Duration::from_millis(100), &mut wcs) == 0 {
                rounds += 1;
            }
        }
        assert_eq!(
            wcs.len(),
            1,
            "a {len}-byte UC SEND did not arrive; receiver {:?} {:?}",
            b.qp.counters().unwrap(),
            b.dev.io_stats().unwrap(),
        );
        assert_eq!(
            (wcs[0].status, wcs[0].byte_len as usize),
            (WcStatus::Success, len)
        );
        let mut got = vec![0u8; len];
        b.mr.read(0, &mut got).unwrap();
        assert!(got == data[..len], "a {len}-byte SEND's bytes differ");
    }
    assert_eq!(b.qp.counters().unwrap().uc_messages_dropped, 0);
    assert_eq!(losses([&a, &b]).0, 0, "frames dropped");
}
