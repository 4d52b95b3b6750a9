//! The CM MADs that real rxe (kernel cm.c / cma.c) sent for rping, decoded by
//! `xrnic::wire::mad`: ../shared/vectors/rxe and interop/captures/rping_v4.pcapng.

use xrnic::wire::mad::{CmMsg, CmaHdr, Mad, RDMA_PS_TCP, service_port};
use xrnic::wire::{FrameView, Opcode};

fn mads(path: &std::path::Path) -> Vec<(Vec<u8>, Mad)> {
    let mut out = Vec::new();
    for fr in xrnic::io::capture::read_file(path).unwrap() {
        let Ok(v) = FrameView::parse(&fr.data) else {
            continue;
        };
        if v.bth().opcode() != Opcode::UD_SEND_ONLY || v.bth().dest_qp().value() != 1 {
            continue;
        }
        let mad = Mad::parse(v.payload()).unwrap_or_else(|e| panic!("#{}: {e}", fr.number));
        // The frame's IPv4 source / destination.
        out.push((fr.data[26..34].to_vec(), mad));
    }
    out
}

fn check(path: std::path::PathBuf, want_port: u16, want_disconnect: bool) {
    let m = mads(&path);
    let names: Vec<_> = m.iter().map(|(_, x)| x.msg.name()).collect();
    assert!(names.len() >= 3, "{}: {names:?}", path.display());
    assert_eq!(names[..3], ["REQ", "REP", "RTU"], "{}", path.display());
    let (ips, req) = (&m[0].0, &m[0].1);
    let CmMsg::Req(r) = &req.msg else { panic!() };
    let (ps, port) = service_port(r.service_id).unwrap();
    assert_eq!((ps, port), (RDMA_PS_TCP, want_port));
    // RoCE: permissive LIDs, GIDs are the IPv4-mapped addresses of the frame.
    assert_eq!(
        (r.primary.local_lid, r.primary.remote_lid),
        (0xffff, 0xffff)
    );
    assert_eq!(r.primary.local_gid[12..], ips[..4]);
    assert_eq!(r.primary.remote_gid[12..], ips[4..]);
    assert_eq!((r.transport_service_type, r.partition_key), (0, 0xffff));
    assert_eq!((r.remote_cm_response_timeout, r.max_cm_retries), (20, 15));
    let h = CmaHdr::parse(&r.private_data).expect("cma header");
    assert_eq!(
        h.src.ip().to_string(),
        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(&ips[..4]).unwrap()).to_string()
    );
    let CmMsg::Rep(p) = &m[1].1.msg else { panic!() };
    assert_eq!(p.remote_comm_id, r.local_comm_id);
    assert_eq!(m[1].1.tid, req.tid, "the REP answers the REQ's transaction");
    let CmMsg::Rtu(u) = &m[2].1.msg else { panic!() };
    assert_eq!(
        (u.local_comm_id, u.remote_comm_id),
        (r.local_comm_id, p.local_comm_id)
    );
    // Every MAD re-emits byte for byte.
    for (_, x) in &m {
        assert_eq!(Mad::parse(&x.emit()).unwrap(), *x);
    }
    if want_disconnect {
        let i = names.iter().position(|n| *n == "DREQ").expect("a DREQ");
        assert_eq!(names[i + 1], "DREP");
        let CmMsg::Dreq(d) = &m[i].1.msg else {
            panic!()
        };
        assert!(d.remote_qpn == p.local_qpn || d.remote_qpn == r.local_qpn);
    }
}

#[test]
#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]
fn rxe_rping_mads_from_the_shared_vectors() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/vectors/rxe");
    for f in ["monty_test.pcap", "monty_roce_capture_read-write-ecn.pcap"] {
        // These two were recorded with `rping -p 7471`.
        check(dir.join(f), 7471, true);
    }
}

#[test]
fn rxe_rping_mads_from_the_interop_capture() {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("interop/captures/rping_v4.pcapng");
    // rping's default port 7174.
    check(p, 7174, false);
}
