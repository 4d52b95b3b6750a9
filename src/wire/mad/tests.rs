use super::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

fn req() -> Req {
    let mut private_data = [0u8; 92];
    CmaHdr {
        src: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), 0xa129),
        dst: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
    }
    .emit(&mut private_data);
    Req {
        local_comm_id: 0xac66_08b9,
        service_id: service_id(RDMA_PS_TCP, 7471),
        local_ca_guid: 0x5054_00ff_feda_f92d,
        local_qkey: 0,
        local_qpn: 0x17,
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_service_type: 0,
        end_to_end_flow_control: false,
        starting_psn: 0x89bb0e,
        local_cm_response_timeout: 20,
        retry_count: 7,
        partition_key: 0xffff,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport_type: 0,
        primary: CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped().octets(),
            remote_gid: Ipv4Addr::new(192, 0, 2, 2).to_ipv6_mapped().octets(),
            flow_label: 0x3a126,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 19,
        },
        alternate: CmPath::default(),
        private_data,
    }
}

fn every_msg() -> Vec<CmMsg> {
    let mut pd = [0u8; 224];
    pd[0] = 0x5a;
    pd[223] = 0xa5;
    vec![
        CmMsg::Req(Box::new(req())),
        CmMsg::Mra(Box::new(Mra {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_mraed: MsgRef::Rep,
            service_timeout: 23,
            private_data: [7; 222],
        })),
        CmMsg::Rej(Box::new(Rej {
            local_comm_id: 3,
            remote_comm_id: 4,
            message_rejected: MsgRef::Req,
            reject_info_length: 0,
            reason: rej_reason::INVALID_SERVICE_ID,
            ari: [1; 72],
            private_data: [2; 148],
        })),
        CmMsg::Rep(Box::new(Rep {
            local_comm_id: 0xc857_7fdb,
            remote_comm_id: 0xac66_08b9,
            local_qkey: 0,
            local_qpn: 0x11,
            local_eecn: 0,
            starting_psn: 0xc23298,
            responder_resources: 1,
            initiator_depth: 1,
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: 7,
            srq: false,
            local_ca_guid: 0x5054_00ff_fe8b_2d12,
            private_data: [3; 196],
        })),
        CmMsg::Rtu(Box::new(Rtu {
            local_comm_id: 5,
            remote_comm_id: 6,
            private_data: pd,
        })),
        CmMsg::Dreq(Box::new(Dreq {
            local_comm_id: 7,
            remote_comm_id: 8,
            remote_qpn: 0x11,
            private_data: [4; 220],
        })),
        CmMsg::Drep(Box::new(Rtu {
            local_comm_id: 9,
            remote_comm_id: 10,
            private_data: [0; 224],
        })),
        CmMsg::SidrReq(Box::new(SidrReq {
            request_id: 11,
            partition_key: 0xffff,
            service_id: service_id(RDMA_PS_UDP, 7174),
            private_data: [5; 216],
        })),
        CmMsg::SidrRep(Box::new(SidrRep {
            request_id: 11,
            status: sidr_status::OK,
            additional_info_length: 0,
            qpn: 0x12,
            service_id: service_id(RDMA_PS_UDP, 7174),
            qkey: 0x1234_5678,
            additional_info: [0; 72],
            private_data: [6; 136],
        })),
    ]
}

#[test]
fn every_message_round_trips() {
    for (i, msg) in every_msg().into_iter().enumerate() {
        let m = Mad {
            tid: 0x0000_0002_b908_66ac + i as u64,
            msg,
        };
        let b = m.emit();
        assert_eq!(b[..4], [1, 7, 2, 3], "{}", m.msg.name());
        assert_eq!(u16::from_be_bytes([b[16], b[17]]), m.msg.attr_id() as u16);
        assert_eq!(Mad::parse(&b).unwrap(), m, "{}", m.msg.name());
    }
}

/// The REQ fields sit where IBTA Table 99 puts them: the bytes below are the ones rxe sent
/// (kernel cm.c) for rping, checked field by field against the capture in
/// ../shared/vectors/rxe/monty_test.pcap (tests/cm_mads.rs decodes the capture itself).
#[test]
fn req_fields_are_at_table_99_offsets() {
    let b = Mad {
        tid: 2,
        msg: CmMsg::Req(Box::new(req())),
    }
    .emit();
    let d = &b[MAD_HDR_LEN..];
    assert_eq!(d[8..16], 0x0000_0000_0106_1d2fu64.to_be_bytes());
    assert_eq!(d[32..36], [0, 0, 0x17, 1]);
    assert_eq!(
        d[40..52],
        [
            0, 0, 0, 0xa0, 0x89, 0xbb, 0x0e, 0xa7, 0xff, 0xff, 0x37, 0xf0
        ]
    );
    assert_eq!(d[88..96], [0x3a, 0x12, 0x60, 0x00, 0x00, 0x40, 0x00, 0x98]);
    assert_eq!(d[140..144], [0x00, 0x40, 0xa1, 0x29]);
    assert_eq!(d[156..160], [192, 0, 2, 1]);
    assert_eq!(d[172..176], [192, 0, 2, 2]);
}

#[test]
fn truncated_and_foreign_mads_are_errors_not_panics() {
    let b = Mad {
        tid: 1,
        msg: CmMsg::Req(Box::new(req())),
    }
    .emit();
    for n in 0..MAD_LEN {
        assert_eq!(Mad::parse(&b[..n]), Err(MadError::Short { present: n }));
    }
    let mut x = b;
    x[1] = 0x81; // a directed-route SMP
    assert!(matches!(
        Mad::parse(&x),
        Err(MadError::NotCm { class: 0x81, .. })
    ));
    let mut x = b;
    x[2] = 1;
    assert!(matches!(
        Mad::parse(&x),
        Err(MadError::NotCm { version: 1, .. })
    ));
    let mut x = b;
    x[3] = 0x81; // GetResp
    assert!(matches!(
        Mad::parse(&x),
        Err(MadError::NotCm { method: 0x81, .. })
    ));
    let mut x = b;
    x[17] = 0x42;
    assert_eq!(Mad::parse(&x), Err(MadError::UnknownAttr(0x42)));
    // Junk of every attribute decodes without a panic.
    for attr in [
        0x10u8, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a,
    ] {
        let mut j = [0xffu8; MAD_LEN];
        j[..4].copy_from_slice(&[1, 7, 2, 3]);
        j[16] = 0;
        j[17] = attr;
        assert!(Mad::parse(&j).is_ok());
    }
}

#[test]
fn lap_and_apr_decode_as_unsupported_with_their_comm_ids() {
    for attr in [AttrId::Lap, AttrId::Apr] {
        let mut b = [0u8; MAD_LEN];
        b[..4].copy_from_slice(&[1, 7, 2, 3]);
        b[17] = attr as u8;
        b[24..28].copy_from_slice(&9u32.to_be_bytes());
        b[28..32].copy_from_slice(&10u32.to_be_bytes());
        assert_eq!(
            Mad::parse(&b).unwrap().msg,
            CmMsg::Unsupported {
                attr,
                local_comm_id: 9,
                remote_comm_id: 10
            }
        );
    }
}

#[test]
fn cma_header_ipv4_and_ipv6() {
    let v4 = CmaHdr {
        src: "192.0.2.1:7471".parse().unwrap(),
        dst: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
    };
    let mut b = [0xeeu8; 40];
    v4.emit(&mut b);
    assert_eq!(b[..4], [0, 0x40, 0x1d, 0x2f]);
    assert_eq!(b[4..16], [0; 12]);
    assert_eq!(CmaHdr::parse(&b), Some(v4));
    let v6 = CmaHdr {
        src: "[fd00::1]:9".parse().unwrap(),
        dst: IpAddr::V6("fd00::2".parse::<Ipv6Addr>().unwrap()),
    };
    v6.emit(&mut b);
    assert_eq!(b[1], 0x60);
    assert_eq!(CmaHdr::parse(&b), Some(v6));
    assert_eq!(CmaHdr::parse(&b[..35]), None);
    b[1] = 0x50;
    assert_eq!(CmaHdr::parse(&b), None);
}

#[test]
fn service_ids_of_the_port_spaces() {
    assert_eq!(service_id(RDMA_PS_TCP, 7471), 0x0000_0000_0106_1d2f);
    assert_eq!(service_id(RDMA_PS_UDP, 7174), 0x0000_0000_0111_1c06);
    assert_eq!(
        service_port(0x0000_0000_0106_1d2f),
        Some((RDMA_PS_TCP, 7471))
    );
    assert_eq!(service_port(0x1234), None);
}
