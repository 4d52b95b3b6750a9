//! Communication Management MADs (IBTA vol.1 §16 MAD common header, §12.6 CM messages) and
//! the RDMA CM's private-data header, as the kernel's drivers/infiniband/core/cm.c and
//! cma.c put them on QP1 for RoCE v2.
//!
//! Contract: [`Mad::parse`] never panics; a buffer shorter than 256 bytes, a management
//! class other than CM (0x07), a class version other than 2, or an unknown attribute is a
//! [`MadError`]. LAP (0x19) and APR (0x1A) decode to [`CmMsg::Unsupported`] so that a
//! caller can answer them (xrnic does not do alternate paths). [`Mad::emit`] writes the
//! whole 256-byte MAD. Every field is at the offset of IBTA Table 99 (REQ) ... Table 108
//! (SIDR_REP), relative to the start of the MAD data (byte 24).

use core::fmt;

/// Every MAD on QP1 is 256 bytes (IBTA §13.4.2).
pub const MAD_LEN: usize = 256;
/// The MAD common header (IBTA §13.4.2, Table 142).
pub const MAD_HDR_LEN: usize = 24;
/// Management class of the Communication Manager (IBTA §16.7.1).
pub const MGMT_CLASS_CM: u8 = 0x07;
/// CM class version 2 (what cm.c sends: `IB_CM_CLASS_VERSION`).
pub const CM_CLASS_VERSION: u8 = 2;
/// Method Send (IBTA §13.4.5): every CM message is a Send.
pub const METHOD_SEND: u8 = 0x03;

/// Service ID of an RDMA CM id in port space `ps` (0x0106 RDMA_PS_TCP, 0x0111
/// RDMA_PS_UDP, 0x013F RDMA_PS_IB) bound to `port` (cma.c `rdma_get_service_id`).
pub const fn service_id(ps: u16, port: u16) -> u64 {
    0x0000_0000_0100_0000 | ((ps as u64) << 16) | port as u64
}
/// librdmacm's RDMA_PS_TCP (reliable connected ids).
pub const RDMA_PS_TCP: u16 = 0x0106;
/// librdmacm's RDMA_PS_UDP (UD ids, SIDR).
pub const RDMA_PS_UDP: u16 = 0x0111;
/// librdmacm's RDMA_PS_IPOIB.
pub const RDMA_PS_IPOIB: u16 = 0x0002;

/// The port space and port of an RDMA CM service ID, when it is one.
pub fn service_port(sid: u64) -> Option<(u16, u16)> {
    if sid >> 24 != 1 {
        return None;
    }
    Some(((sid >> 16) as u16, sid as u16))
}

/// The CM attribute IDs (IBTA §16.7.2, Table 223).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum AttrId {
    Req = 0x10,
    Mra = 0x11,
    Rej = 0x12,
    Rep = 0x13,
    Rtu = 0x14,
    Dreq = 0x15,
    Drep = 0x16,
    SidrReq = 0x17,
    SidrRep = 0x18,
    Lap = 0x19,
    Apr = 0x1a,
    ClassPortInfo = 0x01,
}

impl AttrId {
    fn from_u16(v: u16) -> Option<AttrId> {
        use AttrId::*;
        Some(match v {
            0x01 => ClassPortInfo,
            0x10 => Req,
            0x11 => Mra,
            0x12 => Rej,
            0x13 => Rep,
            0x14 => Rtu,
            0x15 => Dreq,
            0x16 => Drep,
            0x17 => SidrReq,
            0x18 => SidrRep,
            0x19 => Lap,
            0x1a => Apr,
            _ => return None,
        })
    }
}

/// Why a MAD could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MadError {
    /// Fewer than 256 bytes.
    Short { present: usize },
    /// Not the CM class / version / method this decoder knows.
    NotCm { class: u8, version: u8, method: u8 },
    /// An attribute ID that is not a CM message.
    UnknownAttr(u16),
}

impl fmt::Display for MadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MadError::Short { present } => {
                write!(f, "MAD: {MAD_LEN} bytes needed, {present} present")
            }
            MadError::NotCm {
                class,
                version,
                method,
            } => write!(
                f,
                "MAD: class {class:#04x} version {version} method {method:#04x} is not a CM Send"
            ),
            MadError::UnknownAttr(a) => write!(f, "MAD: unknown CM attribute {a:#06x}"),
        }
    }
}

impl std::error::Error for MadError {}

/// REJ reasons (IBTA §12.6.7.2, Table 103; kernel include/rdma/ib_cm.h
/// `enum ib_cm_rej_reason`).
pub mod rej_reason {
    pub const NO_QP: u16 = 1;
    pub const TIMEOUT: u16 = 4;
    pub const INVALID_COMM_ID: u16 = 6;
    pub const INVALID_SERVICE_ID: u16 = 8;
    pub const STALE_CONN: u16 = 10;
    pub const INVALID_MTU: u16 = 26;
    pub const CONSUMER_DEFINED: u16 = 28;
    pub const INVALID_CLASS_VERSION: u16 = 31;

    /// The reason's name as IBTA Table 103 gives it (the kernel's `ibcm_rej_reason_strs`
    /// spell the same), `None` for a code the table does not define.
    pub fn name(reason: u16) -> Option<&'static str> {
        Some(match reason {
            1 => "no QP",
            2 => "no EEC",
            3 => "no resources",
            4 => "timeout",
            5 => "unsupported request",
            6 => "invalid comm ID",
            7 => "invalid comm instance",
            8 => "invalid service ID",
            9 => "invalid transport type",
            10 => "stale connection",
            11 => "RDC does not exist",
            12 => "invalid GID",
            13 => "invalid LID",
            14 => "invalid SL",
            15 => "invalid traffic class",
            16 => "invalid hop limit",
            17 => "invalid packet rate",
            18 => "invalid alternate GID",
            19 => "invalid alternate LID",
            20 => "invalid alternate SL",
            21 => "invalid alternate traffic class",
            22 => "invalid alternate hop limit",
            23 => "invalid alternate packet rate",
            24 => "port CM redirect",
            25 => "port redirect",
            26 => "invalid MTU",
            27 => "insufficient responder resources",
            28 => "consumer defined",
            29 => "invalid RNR retry",
            30 => "duplicate local comm ID",
            31 => "invalid class version",
            32 => "invalid flow label",
            33 => "invalid alternate flow label",
            35 => "vendor option not supported",
            _ => return None,
        })
    }
}

/// Which message a REJ or MRA is about (IBTA Table 103: MessageRejected / MessageMRAed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsgRef {
    Req = 0,
    Rep = 1,
    Other = 2,
}

impl MsgRef {
    fn from_bits(v: u8) -> MsgRef {
        match v & 3 {
            0 => MsgRef::Req,
            1 => MsgRef::Rep,
            _ => MsgRef::Other,
        }
    }
}

/// One path of a REQ (primary or alternate), IBTA Table 99 bytes 52..96.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CmPath {
    pub local_lid: u16,
    pub remote_lid: u16,
    pub local_gid: [u8; 16],
    pub remote_gid: [u8; 16],
    /// 20 bits.
    pub flow_label: u32,
    /// 6 bits.
    pub packet_rate: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    /// 4 bits.
    pub sl: u8,
    pub subnet_local: bool,
    /// 5 bits: 4.096 us * 2^n.
    pub local_ack_timeout: u8,
}

impl CmPath {
    const LEN: usize = 44;

    fn parse(b: &[u8]) -> CmPath {
        let fl = be32(b, 36);
        CmPath {
            local_lid: be16(b, 0),
            remote_lid: be16(b, 2),
            local_gid: b[4..20].try_into().unwrap_or([0; 16]),
            remote_gid: b[20..36].try_into().unwrap_or([0; 16]),
            flow_label: fl >> 12,
            packet_rate: (fl & 0x3f) as u8,
            traffic_class: b[40],
            hop_limit: b[41],
            sl: b[42] >> 4,
            subnet_local: b[42] & 0x08 != 0,
            local_ack_timeout: b[43] >> 3,
        }
    }

    fn emit(&self, b: &mut [u8]) {
        put16(b, 0, self.local_lid);
        put16(b, 2, self.remote_lid);
        b[4..20].copy_from_slice(&self.local_gid);
        b[20..36].copy_from_slice(&self.remote_gid);
        put32(
            b,
            36,
            (self.flow_label & 0xf_ffff) << 12 | u32::from(self.packet_rate & 0x3f),
        );
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        b[42] = (self.sl & 0xf) << 4 | u8::from(self.subnet_local) << 3;
        b[43] = (self.local_ack_timeout & 0x1f) << 3;
    }
}

/// ConnectRequest (IBTA §12.6.5, Table 99).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Req {
    pub local_comm_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    pub responder_resources: u8,
    pub local_eecn: u32,
    pub initiator_depth: u8,
    pub remote_eecn: u32,
    /// 5 bits: 4.096 us * 2^n.
    pub remote_cm_response_timeout: u8,
    /// 2 bits: 0 RC, 1 UC, 3 XRC/extended.
    pub transport_service_type: u8,
    pub end_to_end_flow_control: bool,
    /// 24 bits.
    pub starting_psn: u32,
    pub local_cm_response_timeout: u8,
    /// 3 bits.
    pub retry_count: u8,
    pub partition_key: u16,
    /// 4 bits: IBV_MTU_* (1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    pub rdc_exists: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    /// 4 bits.
    pub max_cm_retries: u8,
    pub srq: bool,
    pub extended_transport_type: u8,
    pub primary: CmPath,
    pub alternate: CmPath,
    pub private_data: [u8; 92],
}

/// ConnectReply (IBTA §12.6.8, Table 104).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rep {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub local_eecn: u32,
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 5 bits.
    pub target_ack_delay: u8,
    /// 2 bits.
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    pub private_data: [u8; 196],
}

/// Reject (IBTA §12.6.7, Table 102).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rej {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub message_rejected: MsgRef,
    /// 7 bits.
    pub reject_info_length: u8,
    pub reason: u16,
    pub ari: [u8; 72],
    pub private_data: [u8; 148],
}

/// Message Receipt Acknowledgement (IBTA §12.6.6, Table 101).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mra {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub message_mraed: MsgRef,
    /// 5 bits.
    pub service_timeout: u8,
    pub private_data: [u8; 222],
}

/// RTU, DREQ and DREP share their first words (IBTA Tables 105, 106, 107).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rtu {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: [u8; 224],
}

/// DisconnectRequest (IBTA §12.6.10, Table 106).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dreq {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 24 bits.
    pub remote_qpn: u32,
    pub private_data: [u8; 220],
}

/// ServiceIDResolutionRequest (IBTA §12.11.1, Table 108).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrReq {
    pub request_id: u32,
    pub partition_key: u16,
    pub service_id: u64,
    pub private_data: [u8; 216],
}

/// SIDR_REP status values (IBTA Table 109).
pub mod sidr_status {
    pub const OK: u8 = 0;
    pub const UNSUPPORTED: u8 = 1;
    pub const REJECT: u8 = 2;
    pub const NO_QP: u8 = 3;

    /// The status's name (IBTA Table 109; kernel `enum ib_cm_sidr_status`).
    pub fn name(status: u8) -> &'static str {
        match status {
            0 => "OK",
            1 => "unsupported",
            2 => "rejected",
            3 => "no QP",
            4 => "redirect",
            5 => "unsupported version",
            _ => "unknown status",
        }
    }
}

/// ServiceIDResolutionResponse (IBTA §12.11.2, Table 109).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrRep {
    pub request_id: u32,
    pub status: u8,
    pub additional_info_length: u8,
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    pub additional_info: [u8; 72],
    pub private_data: [u8; 136],
}

/// A CM message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmMsg {
    Req(Box<Req>),
    Mra(Box<Mra>),
    Rej(Box<Rej>),
    Rep(Box<Rep>),
    Rtu(Box<Rtu>),
    Dreq(Box<Dreq>),
    Drep(Box<Rtu>),
    SidrReq(Box<SidrReq>),
    SidrRep(Box<SidrRep>),
    /// LAP, APR, ClassPortInfo: known, not served. `local_comm_id` / `remote_comm_id` are
    /// the first two words (LAP and APR start with them) so that a REJ can name them.
    Unsupported {
        attr: AttrId,
        local_comm_id: u32,
        remote_comm_id: u32,
    },
}

impl CmMsg {
    /// The attribute ID of this message.
    pub fn attr_id(&self) -> AttrId {
        match self {
            CmMsg::Req(_) => AttrId::Req,
            CmMsg::Mra(_) => AttrId::Mra,
            CmMsg::Rej(_) => AttrId::Rej,
            CmMsg::Rep(_) => AttrId::Rep,
            CmMsg::Rtu(_) => AttrId::Rtu,
            CmMsg::Dreq(_) => AttrId::Dreq,
            CmMsg::Drep(_) => AttrId::Drep,
            CmMsg::SidrReq(_) => AttrId::SidrReq,
            CmMsg::SidrRep(_) => AttrId::SidrRep,
            CmMsg::Unsupported { attr, .. } => *attr,
        }
    }

    /// The short name used in traces and the `explain` ladder.
    pub fn name(&self) -> &'static str {
        match self.attr_id() {
            AttrId::Req => "REQ",
            AttrId::Mra => "MRA",
            AttrId::Rej => "REJ",
            AttrId::Rep => "REP",
            AttrId::Rtu => "RTU",
            AttrId::Dreq => "DREQ",
            AttrId::Drep => "DREP",
            AttrId::SidrReq => "SIDR_REQ",
            AttrId::SidrRep => "SIDR_REP",
            AttrId::Lap => "LAP",
            AttrId::Apr => "APR",
            AttrId::ClassPortInfo => "ClassPortInfo",
        }
    }
}

/// A whole CM MAD: the common header's transaction ID and the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mad {
    pub tid: u64,
    pub msg: CmMsg,
}

fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn be64(b: &[u8], o: usize) -> u64 {
    (u64::from(be32(b, o)) << 32) | u64::from(be32(b, o + 4))
}
fn be24(b: &[u8], o: usize) -> u32 {
    be32(b, o) >> 8
}
fn put16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_be_bytes());
}
fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_be_bytes());
}
fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_be_bytes());
}
/// A 24-bit field followed by an 8-bit one in one word.
fn put24_8(b: &mut [u8], o: usize, v24: u32, v8: u8) {
    put32(b, o, (v24 & 0xff_ffff) << 8 | u32::from(v8));
}
fn arr<const N: usize>(b: &[u8], o: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[o..o + N]);
    a
}

impl Mad {
    /// Decode a 256-byte CM MAD (the payload of a UD SEND to QP1 after the DETH).
    pub fn parse(buf: &[u8]) -> Result<Mad, MadError> {
        if buf.len() < MAD_LEN {
            return Err(MadError::Short { present: buf.len() });
        }
        let (class, version, method) = (buf[1], buf[2], buf[3]);
        if buf[0] != 1 || class != MGMT_CLASS_CM || version != CM_CLASS_VERSION {
            return Err(MadError::NotCm {
                class,
                version,
                method,
            });
        }
        if method != METHOD_SEND {
            return Err(MadError::NotCm {
                class,
                version,
                method,
            });
        }
        let tid = be64(buf, 8);
        let a = be16(buf, 16);
        let attr = AttrId::from_u16(a).ok_or(MadError::UnknownAttr(a))?;
        let d = &buf[MAD_HDR_LEN..MAD_LEN];
        let msg = match attr {
            AttrId::Req => CmMsg::Req(Box::new(Req {
                local_comm_id: be32(d, 0),
                service_id: be64(d, 8),
                local_ca_guid: be64(d, 16),
                local_qkey: be32(d, 28),
                local_qpn: be24(d, 32),
                responder_resources: d[35],
                local_eecn: be24(d, 36),
                initiator_depth: d[39],
                remote_eecn: be24(d, 40),
                remote_cm_response_timeout: d[43] >> 3,
                transport_service_type: (d[43] >> 1) & 3,
                end_to_end_flow_control: d[43] & 1 != 0,
                starting_psn: be24(d, 44),
                local_cm_response_timeout: d[47] >> 3,
                retry_count: d[47] & 7,
                partition_key: be16(d, 48),
                path_mtu: d[50] >> 4,
                rdc_exists: d[50] & 8 != 0,
                rnr_retry_count: d[50] & 7,
                max_cm_retries: d[51] >> 4,
                srq: d[51] & 8 != 0,
                extended_transport_type: d[51] & 7,
                primary: CmPath::parse(&d[52..52 + CmPath::LEN]),
                alternate: CmPath::parse(&d[96..96 + CmPath::LEN]),
                private_data: arr(d, 140),
            })),
            AttrId::Mra => CmMsg::Mra(Box::new(Mra {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                message_mraed: MsgRef::from_bits(d[8] >> 6),
                service_timeout: d[9] >> 3,
                private_data: arr(d, 10),
            })),
            AttrId::Rej => CmMsg::Rej(Box::new(Rej {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                message_rejected: MsgRef::from_bits(d[8] >> 6),
                reject_info_length: d[9] >> 1,
                reason: be16(d, 10),
                ari: arr(d, 12),
                private_data: arr(d, 84),
            })),
            AttrId::Rep => CmMsg::Rep(Box::new(Rep {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                local_qkey: be32(d, 8),
                local_qpn: be24(d, 12),
                local_eecn: be24(d, 16),
                starting_psn: be24(d, 20),
                responder_resources: d[24],
                initiator_depth: d[25],
                target_ack_delay: d[26] >> 3,
                failover_accepted: (d[26] >> 1) & 3,
                end_to_end_flow_control: d[26] & 1 != 0,
                rnr_retry_count: d[27] >> 5,
                srq: d[27] & 0x10 != 0,
                local_ca_guid: be64(d, 28),
                private_data: arr(d, 36),
            })),
            AttrId::Rtu | AttrId::Drep => {
                let r = Box::new(Rtu {
                    local_comm_id: be32(d, 0),
                    remote_comm_id: be32(d, 4),
                    private_data: arr(d, 8),
                });
                if attr == AttrId::Rtu {
                    CmMsg::Rtu(r)
                } else {
                    CmMsg::Drep(r)
                }
            }
            AttrId::Dreq => CmMsg::Dreq(Box::new(Dreq {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                remote_qpn: be24(d, 8),
                private_data: arr(d, 12),
            })),
            AttrId::SidrReq => CmMsg::SidrReq(Box::new(SidrReq {
                request_id: be32(d, 0),
                partition_key: be16(d, 4),
                service_id: be64(d, 8),
                private_data: arr(d, 16),
            })),
            AttrId::SidrRep => CmMsg::SidrRep(Box::new(SidrRep {
                request_id: be32(d, 0),
                status: d[4],
                additional_info_length: d[5],
                qpn: be24(d, 8),
                service_id: be64(d, 12),
                qkey: be32(d, 20),
                additional_info: arr(d, 24),
                private_data: arr(d, 96),
            })),
            AttrId::Lap | AttrId::Apr | AttrId::ClassPortInfo => CmMsg::Unsupported {
                attr,
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
            },
        };
        Ok(Mad { tid, msg })
    }

    /// The 256 bytes of this MAD.
    pub fn emit(&self) -> [u8; MAD_LEN] {
        let mut buf = [0u8; MAD_LEN];
        buf[0] = 1;
        buf[1] = MGMT_CLASS_CM;
        buf[2] = CM_CLASS_VERSION;
        buf[3] = METHOD_SEND;
        put64(&mut buf, 8, self.tid);
        put16(&mut buf, 16, self.msg.attr_id() as u16);
        let d = &mut buf[MAD_HDR_LEN..];
        match &self.msg {
            CmMsg::Req(r) => {
                put32(d, 0, r.local_comm_id);
                put64(d, 8, r.service_id);
                put64(d, 16, r.local_ca_guid);
                put32(d, 28, r.local_qkey);
                put24_8(d, 32, r.local_qpn, r.responder_resources);
                put24_8(d, 36, r.local_eecn, r.initiator_depth);
                put24_8(
                    d,
                    40,
                    r.remote_eecn,
                    (r.remote_cm_response_timeout & 0x1f) << 3
                        | (r.transport_service_type & 3) << 1
                        | u8::from(r.end_to_end_flow_control),
                );
                put24_8(
                    d,
                    44,
                    r.starting_psn,
                    (r.local_cm_response_timeout & 0x1f) << 3 | (r.retry_count & 7),
                );
                put16(d, 48, r.partition_key);
                d[50] =
                    (r.path_mtu & 0xf) << 4 | u8::from(r.rdc_exists) << 3 | (r.rnr_retry_count & 7);
                d[51] = (r.max_cm_retries & 0xf) << 4
                    | u8::from(r.srq) << 3
                    | (r.extended_transport_type & 7);
                r.primary.emit(&mut d[52..96]);
                r.alternate.emit(&mut d[96..140]);
                d[140..232].copy_from_slice(&r.private_data);
            }
            CmMsg::Mra(m) => {
                put32(d, 0, m.local_comm_id);
                put32(d, 4, m.remote_comm_id);
                d[8] = (m.message_mraed as u8) << 6;
                d[9] = (m.service_timeout & 0x1f) << 3;
                d[10..232].copy_from_slice(&m.private_data);
            }
            CmMsg::Rej(r) => {
                put32(d, 0, r.local_comm_id);
                put32(d, 4, r.remote_comm_id);
                d[8] = (r.message_rejected as u8) << 6;
                d[9] = (r.reject_info_length & 0x7f) << 1;
                put16(d, 10, r.reason);
                d[12..84].copy_from_slice(&r.ari);
                d[84..232].copy_from_slice(&r.private_data);
            }
            CmMsg::Rep(r) => {
                put32(d, 0, r.local_comm_id);
                put32(d, 4, r.remote_comm_id);
                put32(d, 8, r.local_qkey);
                put24_8(d, 12, r.local_qpn, 0);
                put24_8(d, 16, r.local_eecn, 0);
                put24_8(d, 20, r.starting_psn, 0);
                d[24] = r.responder_resources;
                d[25] = r.initiator_depth;
                d[26] = (r.target_ack_delay & 0x1f) << 3
                    | (r.failover_accepted & 3) << 1
                    | u8::from(r.end_to_end_flow_control);
                d[27] = (r.rnr_retry_count & 7) << 5 | u8::from(r.srq) << 4;
                put64(d, 28, r.local_ca_guid);
                d[36..232].copy_from_slice(&r.private_data);
            }
            CmMsg::Rtu(r) | CmMsg::Drep(r) => {
                put32(d, 0, r.local_comm_id);
                put32(d, 4, r.remote_comm_id);
                d[8..232].copy_from_slice(&r.private_data);
            }
            CmMsg::Dreq(r) => {
                put32(d, 0, r.local_comm_id);
                put32(d, 4, r.remote_comm_id);
                put24_8(d, 8, r.remote_qpn, 0);
                d[12..232].copy_from_slice(&r.private_data);
            }
            CmMsg::SidrReq(r) => {
                put32(d, 0, r.request_id);
                put16(d, 4, r.partition_key);
                put64(d, 8, r.service_id);
                d[16..232].copy_from_slice(&r.private_data);
            }
            CmMsg::SidrRep(r) => {
                put32(d, 0, r.request_id);
                d[4] = r.status;
                d[5] = r.additional_info_length;
                put24_8(d, 8, r.qpn, 0);
                put64(d, 12, r.service_id);
                put32(d, 20, r.qkey);
                d[24..96].copy_from_slice(&r.additional_info);
                d[96..232].copy_from_slice(&r.private_data);
            }
            CmMsg::Unsupported {
                local_comm_id,
                remote_comm_id,
                ..
            } => {
                put32(d, 0, *local_comm_id);
                put32(d, 4, *remote_comm_id);
            }
        }
        buf
    }
}

/// The RDMA CM's IP header at the start of REQ / SIDR_REQ private data (kernel cma.c
/// `struct cma_hdr`, librdmacm's cma.h): version 0, IP version in the high nibble, the
/// source port, then source and destination address (an IPv4 address in the last four
/// bytes of its 16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmaHdr {
    pub src: std::net::SocketAddr,
    pub dst: std::net::IpAddr,
}

/// Length of [`CmaHdr`] on the wire.
pub const CMA_HDR_LEN: usize = 36;

impl CmaHdr {
    /// Decode; `None` when the version is not 0 or the IP version neither 4 nor 6, or the
    /// buffer is short.
    pub fn parse(b: &[u8]) -> Option<CmaHdr> {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
        if b.len() < CMA_HDR_LEN || b[0] != 0 {
            return None;
        }
        let port = be16(b, 2);
        let (src, dst) = match b[1] >> 4 {
            4 => (
                IpAddr::V4(Ipv4Addr::from(arr::<4>(b, 16))),
                IpAddr::V4(Ipv4Addr::from(arr::<4>(b, 32))),
            ),
            6 => (
                IpAddr::V6(Ipv6Addr::from(arr::<16>(b, 4))),
                IpAddr::V6(Ipv6Addr::from(arr::<16>(b, 20))),
            ),
            _ => return None,
        };
        Some(CmaHdr {
            src: SocketAddr::new(src, port),
            dst,
        })
    }

    /// Write the 36 bytes into `b[..36]`.
    pub fn emit(&self, b: &mut [u8]) {
        use std::net::IpAddr;
        b[..CMA_HDR_LEN].fill(0);
        put16(b, 2, self.src.port());
        match (self.src.ip(), self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                b[1] = 4 << 4;
                b[16..20].copy_from_slice(&s.octets());
                b[32..36].copy_from_slice(&d.octets());
            }
            (s, d) => {
                b[1] = 6 << 4;
                b[4..20].copy_from_slice(&to_v6(s).octets());
                b[20..36].copy_from_slice(&to_v6(d).octets());
            }
        }
    }
}

fn to_v6(a: std::net::IpAddr) -> std::net::Ipv6Addr {
    match a {
        std::net::IpAddr::V4(v) => v.to_ipv6_mapped(),
        std::net::IpAddr::V6(v) => v,
    }
}

#[cfg(test)]
mod tests;
