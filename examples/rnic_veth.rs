//! The verbs API on a real wire: builds a veth pair between two network namespaces, opens
//! an xrnic device on each end (AF_XDP + XDP, a driver thread each), connects an RC QP
//! pair, and runs a SEND, an RDMA WRITE into the passive side, a READ back and a
//! FETCH_ADD, checking every byte. Run as root:
//!
//! ```text
//! cargo run --example rnic_veth            # IPv4 GIDs, veth MTU 1500 (path MTU 1024)
//! cargo run --example rnic_veth -- 6 9000  # IPv6 GIDs, veth MTU 9000 (path MTU 4096)
//! ```
//!
//! The namespaces and the veth pair are removed at the end (also on failure). Without
//! root it says so and exits 1; the rustdoc example of `xrnic::verbs` runs the same
//! calls on the in-process simulated link instead.

use std::process::ExitCode;
use std::time::Duration;

use xrnic::verbs::{
    Access, ConnectOpts, Device, QpInitAttr, RecvWr, Remote, SendWr, WcStatus, WrOpcode,
};
use xrnic_netns::{Side, VethPair};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rnic_veth: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let ipv6 = args.next().as_deref() == Some("6");
    let mtu: u32 = args.next().map(|m| m.parse()).transpose()?.unwrap_or(1500);
    if !rustix::process::geteuid().is_root() {
        return Err("needs root (network namespaces, AF_XDP, XDP)".into());
    }
    let pair = VethPair::new(mtu)?;
    let open = |side: Side| -> Result<Device, String> {
        pair.run_in(side, || Device::open(&pair.end(side).ifname))
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    };
    let (a, b) = (open(Side::A)?, open(Side::B)?);
    let port = a.query_port();
    println!(
        "{} on {}: active MTU {} (interface MTU {}), GIDs:",
        a.name(),
        a.netdev(),
        port.active_mtu.bytes(),
        port.netdev_mtu
    );
    for (i, g) in a.gid_table().iter().enumerate() {
        println!("  GID[{i}] {}", xrnic::verbs::netdev::gid_text(g));
    }
    let gid_index: u8 = if ipv6 { 2 } else { 1 };

    let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
    let (cq_a, cq_b) = (a.create_cq(64)?, b.create_cq(64)?);
    const LEN: usize = 1 << 20;
    let mr_a = pd_a.reg_mr(LEN, Access::ALL)?;
    let mr_b = pd_b.reg_mr(LEN, Access::ALL)?;
    let qp_a = pd_a.create_qp(&QpInitAttr::new(&cq_a, &cq_a, 64))?;
    let qp_b = pd_b.create_qp(&QpInitAttr::new(&cq_b, &cq_b, 64))?;
    let opts = ConnectOpts {
        access: Access::ALL,
        path_mtu: port.active_mtu,
        ..ConnectOpts::default()
    };
    let gid = |d: &Device| d.query_gid(gid_index.into()).ok_or("no such GID");
    qp_a.connect(
        &Remote {
            qpn: qp_b.qp_num(),
            psn: 0x100,
            gid: gid(&b)?,
        },
        0x200,
        gid_index,
        &opts,
    )?;
    qp_b.connect(
        &Remote {
            qpn: qp_a.qp_num(),
            psn: 0x200,
            gid: gid(&a)?,
        },
        0x100,
        gid_index,
        &opts,
    )?;
    let wait = |cq: &xrnic::verbs::Cq| -> Result<(), String> {
        let wc = cq.wait(1, Duration::from_secs(5));
        match wc.first() {
            Some(w) if w.status == WcStatus::Success => Ok(()),
            Some(w) => Err(format!("completion {w:?}")),
            None => Err("no completion within 5 s".into()),
        }
    };

    // SEND 64 KiB.
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 + i / 251) as u8).collect();
    mr_a.write(0, &data)?;
    qp_b.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![mr_b.sge(0, data.len() as u32)],
    })?;
    let mut wr = SendWr::new(2, WrOpcode::Send);
    wr.sg_list = vec![mr_a.sge(0, data.len() as u32)];
    qp_a.post_send(wr)?;
    wait(&cq_a)?;
    wait(&cq_b)?;
    let mut got = vec![0u8; data.len()];
    mr_b.read(0, &mut got)?;
    assert_eq!(got, data, "SEND payload");
    println!("SEND of {} bytes: every byte right", data.len());

    // WRITE 512 KiB into B and READ it back: B's application makes no call.
    let half = LEN / 2;
    let big: Vec<u8> = (0..half).map(|i| (i % 253) as u8).collect();
    mr_a.write(0, &big)?;
    let mut wr = SendWr::new(3, WrOpcode::RdmaWrite);
    wr.sg_list = vec![mr_a.sge(0, half as u32)];
    wr.rdma.remote_addr = mr_b.addr() + half as u64;
    wr.rdma.rkey = mr_b.rkey();
    qp_a.post_send(wr)?;
    wait(&cq_a)?;
    let mut wr = SendWr::new(4, WrOpcode::RdmaRead);
    wr.sg_list = vec![mr_a.sge(half, half as u32)];
    wr.rdma.remote_addr = mr_b.addr() + half as u64;
    wr.rdma.rkey = mr_b.rkey();
    qp_a.post_send(wr)?;
    wait(&cq_a)?;
    let mut back = vec![0u8; half];
    mr_a.read(half, &mut back)?;
    assert_eq!(back, big, "WRITE then READ");
    println!("WRITE + READ of {half} bytes: every byte right");

    // FETCH_ADD on a word of B.
    mr_b.write(0, &41u64.to_ne_bytes())?;
    let mut wr = SendWr::new(5, WrOpcode::AtomicFetchAndAdd);
    wr.sg_list = vec![mr_a.sge(0, 8)];
    wr.atomic.remote_addr = mr_b.addr();
    wr.atomic.rkey = mr_b.rkey();
    wr.atomic.compare_add = 1;
    qp_a.post_send(wr)?;
    wait(&cq_a)?;
    let (mut old, mut new) = ([0u8; 8], [0u8; 8]);
    mr_a.read(0, &mut old)?;
    mr_b.read(0, &mut new)?;
    assert_eq!(
        (u64::from_ne_bytes(old), u64::from_ne_bytes(new)),
        (41, 42),
        "FETCH_ADD"
    );
    println!("FETCH_ADD: 41 -> 42");
    let c = qp_a.counters()?;
    println!(
        "QP {:#x}: {} packets sent, {} received, {} retransmitted",
        qp_a.qp_num().value(),
        c.packets_sent,
        c.packets_received,
        c.retransmitted_packets
    );
    Ok(())
}
