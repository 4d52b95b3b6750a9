//! `xrnic decode` and `xrnic explain` on UC traffic the engine sends (UC opcodes
//! 0x20-0x2B): every opcode named, the ICRCs valid, and a lost UC packet shown as a gap
//! (UC has no retransmission to name).

use xrnic::proto::Instant;
mod cli_support;

use cli_support::*;
use xrnic::proto::{Access, QpType, RecvWr, SendWr, Sge, WrOpcode};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair};

/// The frames of a UC SEND of 2500 bytes and a WRITE ONLY with immediate, as side A
/// sent them.
fn uc_frames() -> Vec<Vec<u8>> {
    let mut p = Pair::new(LinkConfig::default(), 1);
    let o = ConnectOpts {
        qp_type: QpType::Uc,
        ..ConnectOpts::default()
    };
    let c = p.connect(&o).unwrap();
    let src = p.a.reg_mr(c.pd_a, 4096, Access::LOCAL_WRITE).unwrap();
    let dst = p.b.reg_mr(c.pd_b, 8192, Access::ALL).unwrap();
    let sg = |m: &xrnic::proto::MrInfo, len| {
        vec![Sge {
            addr: m.addr,
            length: len,
            lkey: m.lkey,
        }]
    };
    p.b.post_recv(
        c.qp_b,
        RecvWr {
            wr_id: 1,
            sg_list: sg(&dst, 4096),
        },
    )
    .unwrap();
    let mut w = SendWr::new(1, WrOpcode::Send);
    w.sg_list = sg(&src, 2500);
    p.a.post_send(c.qp_a, w).unwrap();
    let mut w = SendWr::new(2, WrOpcode::RdmaWriteWithImm);
    w.sg_list = sg(&src, 100);
    w.rdma.remote_addr = dst.addr + 4096;
    w.rdma.rkey = dst.rkey;
    w.imm_data = 0x55;
    p.a.post_send(c.qp_a, w).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; xrnic::proto::MAX_FRAME_LEN];
    while let Some(n) = p.a.poll_transmit(Instant::ZERO, &mut buf) {
        out.push(buf[..n].to_vec());
    }
    assert!(p.b.poll_transmit(Instant::ZERO, &mut buf).is_none());
    out
}

#[test]
fn uc_opcodes_decode_with_their_names_and_valid_icrcs() {
    let frames = uc_frames();
    let path = pcapng_of("uc.pcapng", &frames);
    let p = decode_json(&path);
    let names: Vec<&str> = p
        .iter()
        .map(|x| x["opcode_name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "UC_SEND_FIRST",
            "UC_SEND_MIDDLE",
            "UC_SEND_LAST",
            "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"
        ]
    );
    assert!(p.iter().all(|x| x["icrc_ok"] == true));
    assert_eq!(p[3]["immdt"]["data"], 0x55);
    assert_eq!(p[3]["reth"]["dma_len"], 100);
    assert!(p.iter().all(|x| x["ack_req"] == false));
}

#[test]
fn explain_shows_a_lost_uc_packet_as_a_gap() {
    let mut frames = uc_frames();
    frames.remove(1);
    let path = pcapng_of("uc-gap.pcapng", &frames);
    let o = xrnic(&["explain", "--json", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let sum: serde_json::Value = serde_json::from_str(stdout(&o).lines().last().unwrap()).unwrap();
    assert_eq!(sum["gaps"], 1, "{sum}");
    assert_eq!(sum["retransmitted_packets"], 0, "{sum}");
    let text = stdout(&xrnic(&["explain", path.to_str().unwrap()]));
    assert!(text.contains("UC_SEND_FIRST"), "{text}");
    assert!(text.contains("UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"), "{text}");
}
