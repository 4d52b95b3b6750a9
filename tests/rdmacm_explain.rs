//! `xrnic explain` draws connection management (docs/rdmacm.md): the CM MADs on QP 1 of a real
//! rxe capture (interop/captures/rping_v4.pcapng: rping's REQ, REP, RTU) and of frames
//! made from it carrying each other CM message (MRA, REJ with its reason, DREQ, DREP,
//! SIDR_REQ, SIDR_REP, a resent REQ), each on the CM's own ladder.

use std::path::Path;
use std::time::Duration;

use xrnic::io::capture::{CapturedFrame, read_file};
use xrnic::wire::mad::{
    CmMsg, Dreq, Mad, MsgRef, Rej, Rtu, SidrRep, SidrReq, rej_reason, service_id,
};
use xrnic::wire::{FrameRepr, IpRepr};
use xrnic_cli::cli::explain::{Ladder, StepKind, explain_frames, render_text};

fn rping() -> Vec<CapturedFrame> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("interop/captures/rping_v4.pcapng");
    read_file(&p).expect("rping_v4.pcapng")
}

/// The ladder between the two QP 1s.
fn cm_ladder(ladders: &[Ladder]) -> &Ladder {
    ladders
        .iter()
        .find(|l| l.left.ends_with(" QP 1") && l.right.ends_with(" QP 1"))
        .expect("a QP 1 <-> QP 1 ladder")
}

#[test]
fn rxe_rping_capture_draws_req_rep_rtu_on_the_cm_ladder() {
    let frames = rping();
    let (ladders, sum) = explain_frames(&frames, &[], false);
    let cm = cm_ladder(&ladders);
    let labels: Vec<&str> = cm.steps.iter().map(|s| s.label.as_str()).collect();
    assert!(
        cm.steps.iter().all(|s| s.kind == StepKind::Cm),
        "{labels:?}"
    );
    let names: Vec<&str> = labels
        .iter()
        .map(|l| l.split(' ').nth(1).unwrap_or(""))
        .collect();
    assert_eq!(&names[..3], &["REQ", "REP", "RTU"], "{labels:?}");
    // rping's client (192.0.2.12) asks for RDMA_PS_TCP port 7174 on the server (.11);
    // the REQ's private data holds the rdma_cm IP header with both addresses.
    let req = labels[0];
    assert!(req.contains("RDMA_PS_TCP port 7174"), "{req}");
    assert!(req.contains("to 192.0.2.11"), "{req}");
    assert!(req.contains("from 192.0.2.12:"), "{req}");
    // The REQ and the REP come from opposite ends; the RTU from the REQ's.
    assert_ne!(cm.steps[0].from_left, cm.steps[1].from_left);
    assert_eq!(cm.steps[0].from_left, cm.steps[2].from_left);
    // The QPNs the REQ and REP announce are the data ladder's QPs.
    let qpn = |l: &str| {
        let h = l.split("qpn ").nth(1).unwrap().split(' ').next().unwrap();
        u32::from_str_radix(h.trim_start_matches("0x"), 16).unwrap()
    };
    let (q_req, q_rep) = (qpn(labels[0]), qpn(labels[1]));
    let data = ladders
        .iter()
        .find(|l| !l.left.ends_with(" QP 1"))
        .expect("rping's data ladder");
    let ends = format!("{} {}", data.left, data.right);
    assert!(ends.contains(&format!("QP {q_req}")), "{ends} / {q_req}");
    assert!(ends.contains(&format!("QP {q_rep}")), "{ends} / {q_rep}");
    assert_eq!(sum.cm_mads, cm.steps.len());
    assert_eq!(sum.cm_rejects, 0);
    let text = render_text(cm);
    assert!(text.contains("CM MADs (0 refusals)"), "{text}");
}

/// A frame like `model` (the capture's REQ, client to server) carrying `mad`, the other
/// way round when `reverse`.
fn frame(model: &CapturedFrame, mad: &Mad, reverse: bool, n: usize) -> CapturedFrame {
    let mut r = FrameRepr::parse(&model.data).expect("the model frame parses");
    let bytes = mad.emit();
    r.roce.payload = &bytes;
    if reverse {
        std::mem::swap(&mut r.eth.src, &mut r.eth.dst);
        if let IpRepr::V4 { src, dst, .. } = &mut r.ip {
            std::mem::swap(src, dst);
        }
    }
    let mut out = vec![0u8; r.buffer_len()];
    let len = r.emit(&mut out).expect("emit");
    out.truncate(len);
    CapturedFrame {
        number: n,
        timestamp: Duration::from_millis(n as u64),
        ethernet: true,
        data: out,
    }
}

#[test]
fn every_cm_message_is_drawn_with_its_fields_and_a_rej_with_its_reason_name() {
    let frames = rping();
    let (model, req) = frames
        .iter()
        .find_map(|f| {
            let v = xrnic::wire::FrameView::parse(&f.data).ok()?;
            let m = Mad::parse(v.payload()).ok()?;
            matches!(m.msg, CmMsg::Req(_)).then(|| (f.clone(), m))
        })
        .expect("a REQ in rping_v4.pcapng");
    let CmMsg::Req(r) = &req.msg else {
        unreachable!()
    };
    let (a, b) = (r.local_comm_id, 0x0bad_cafe_u32);
    let mut pd = [0u8; 148];
    pd[..5].copy_from_slice(b"nope!");
    let msgs: Vec<(Mad, bool)> = vec![
        (req.clone(), false),
        // The same REQ again (same transaction ID): a resend.
        (req.clone(), false),
        (
            Mad {
                tid: req.tid,
                msg: CmMsg::Mra(Box::new(xrnic::wire::mad::Mra {
                    local_comm_id: b,
                    remote_comm_id: a,
                    message_mraed: MsgRef::Req,
                    service_timeout: 24,
                    private_data: [0; 222],
                })),
            },
            true,
        ),
        (
            Mad {
                tid: req.tid,
                msg: CmMsg::Rej(Box::new(Rej {
                    local_comm_id: b,
                    remote_comm_id: a,
                    message_rejected: MsgRef::Req,
                    reject_info_length: 0,
                    reason: rej_reason::CONSUMER_DEFINED,
                    ari: [0; 72],
                    private_data: pd,
                })),
            },
            true,
        ),
        (
            Mad {
                tid: 7,
                msg: CmMsg::Dreq(Box::new(Dreq {
                    local_comm_id: a,
                    remote_comm_id: b,
                    remote_qpn: 0x11,
                    private_data: [0; 220],
                })),
            },
            false,
        ),
        (
            Mad {
                tid: 7,
                msg: CmMsg::Drep(Box::new(Rtu {
                    local_comm_id: b,
                    remote_comm_id: a,
                    private_data: [0; 224],
                })),
            },
            true,
        ),
        (
            Mad {
                tid: 8,
                msg: CmMsg::SidrReq(Box::new(SidrReq {
                    request_id: 0x42,
                    partition_key: 0xffff,
                    service_id: service_id(xrnic::wire::mad::RDMA_PS_UDP, 7174),
                    private_data: [0; 216],
                })),
            },
            false,
        ),
        (
            Mad {
                tid: 8,
                msg: CmMsg::SidrRep(Box::new(SidrRep {
                    request_id: 0x42,
                    status: 1,
                    additional_info_length: 0,
                    qpn: 0,
                    service_id: service_id(xrnic::wire::mad::RDMA_PS_UDP, 7174),
                    qkey: 0,
                    additional_info: [0; 72],
                    private_data: [0; 136],
                })),
            },
            true,
        ),
    ];
    let frames: Vec<CapturedFrame> = msgs
        .iter()
        .enumerate()
        .map(|(i, (m, rev))| frame(&model, m, *rev, i + 1))
        .collect();
    let (ladders, sum) = explain_frames(&frames, &[], true);
    assert_eq!(ladders.len(), 1, "one CM ladder");
    let cm = cm_ladder(&ladders);
    let l: Vec<String> = cm
        .steps
        .iter()
        .map(|s| format!("{} [{}]", s.label, s.notes.join("; ")))
        .collect();
    assert_eq!(l.len(), 8, "{l:?}");
    assert!(
        l[0].starts_with("CM REQ comm") && l[0].ends_with("[]"),
        "{l:?}"
    );
    assert!(l[1].contains("resent (same transaction ID)"), "{l:?}");
    assert!(
        l[2].starts_with(&format!("CM MRA comm {b:#010x}->{a:#010x} for REQ")),
        "{l:?}"
    );
    assert!(l[2].contains("wait 68719 ms"), "{l:?}");
    assert!(
        l[3].contains("CM REJ") && l[3].contains("reason 28 (consumer defined), 5 B private data"),
        "{l:?}"
    );
    assert!(
        l[4].starts_with("CM DREQ") && l[4].contains("qpn 0x000011"),
        "{l:?}"
    );
    assert!(
        l[5].starts_with(&format!("CM DREP comm {b:#010x}->{a:#010x}")),
        "{l:?}"
    );
    assert!(
        l[6].contains("CM SIDR_REQ request 0x00000042 RDMA_PS_UDP port 7174"),
        "{l:?}"
    );
    assert!(
        l[7].contains("SIDR_REP request 0x00000042 status 1 (unsupported)"),
        "{l:?}"
    );
    let dirs: Vec<bool> = cm.steps.iter().map(|s| s.from_left).collect();
    let want: Vec<bool> = msgs.iter().map(|(_, rev)| dirs[0] != *rev).collect();
    assert_eq!(dirs, want);
    assert_eq!((sum.cm_mads, sum.cm_rejects), (8, 2));
    assert_eq!(sum.messages, 0, "CM MADs are not data messages");
}

#[test]
fn rej_reason_names_follow_ibta_table_103() {
    assert_eq!(rej_reason::name(rej_reason::TIMEOUT), Some("timeout"));
    assert_eq!(rej_reason::TIMEOUT, 4);
    assert_eq!(rej_reason::INVALID_COMM_ID, 6);
    assert_eq!(rej_reason::name(8), Some("invalid service ID"));
    assert_eq!(rej_reason::name(28), Some("consumer defined"));
    assert_eq!(rej_reason::name(34), None);
}
