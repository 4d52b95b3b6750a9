//! One conversion per C type between verbs.h's values and structures ([`super::abi`]) and
//! the engine's types: the drop-in library (src/abi) and the offload backend
//! ([`super`]) both convert here, so the two cannot disagree.
//!
//! The C enums are `int`s whose values come from rdma-core's `<infiniband/verbs.h>`
//! (`enum ibv_mtu`, `enum ibv_qp_state`, `enum ibv_wc_opcode`, `enum ibv_wr_opcode`); a
//! value the header does not define is an error ([`VerbsError::InvalidValue`], EINVAL
//! through [`crate::verbs::Error::errno`]), never a guess. The structures convert with
//! `From`/`TryFrom`.

use core::ffi::c_int;

use super::abi::{ibv_ah_attr, ibv_global_route, ibv_qp_attr};
use crate::proto::{
    Access, AddressVector, AttrMask, Mtu, QpAttr, QpState, VerbsError, WcOpcode, WrOpcode,
};
use crate::wire::{Psn, Qpn};

/// The 20 bits of a GRH flow label (IBTA vol. 1 §8.3.1, the GRH's FlowLabel field):
/// rdma-core's `ibv_global_route.flow_label` is a `uint32_t`, and a program's high bits
/// are not the label's.
pub const FLOW_LABEL_MASK: u32 = 0xf_ffff;

/// Every IB MTU, smallest first.
const MTUS: [Mtu; 5] = [
    Mtu::Mtu256,
    Mtu::Mtu512,
    Mtu::Mtu1024,
    Mtu::Mtu2048,
    Mtu::Mtu4096,
];

/// `enum ibv_mtu` (1..=5) of an MTU.
pub fn mtu_to_ibv(m: Mtu) -> c_int {
    match m {
        Mtu::Mtu256 => 1,
        Mtu::Mtu512 => 2,
        Mtu::Mtu1024 => 3,
        Mtu::Mtu2048 => 4,
        Mtu::Mtu4096 => 5,
    }
}

/// The MTU of an `enum ibv_mtu` value; `None` for a value verbs.h does not define.
pub fn mtu_from_ibv(v: c_int) -> Option<Mtu> {
    MTUS.into_iter().find(|&m| mtu_to_ibv(m) == v)
}

/// `enum ibv_qp_state` of a QP state.
pub fn qp_state_to_ibv(s: QpState) -> c_int {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Sqd => 4,
        QpState::Sqe => 5,
        QpState::Err => 6,
    }
}

/// The QP state of an `enum ibv_qp_state` value.
pub fn qp_state_from_ibv(v: c_int) -> Result<QpState, VerbsError> {
    QpState::ALL
        .into_iter()
        .find(|&s| qp_state_to_ibv(s) == v)
        .ok_or(VerbsError::InvalidValue("QP state"))
}

/// `enum ibv_wc_opcode` of a completion's opcode.
pub fn wc_opcode_to_ibv(o: WcOpcode) -> c_int {
    match o {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::CompSwap => 3,
        WcOpcode::FetchAdd => 4,
        WcOpcode::Recv => 128,
        WcOpcode::RecvRdmaWithImm => 129,
    }
}

/// The opcode of an `enum ibv_wc_opcode` value. libibverbs leaves the opcode undefined
/// in an error completion, so a value the engine has no opcode for is read as SEND (the
/// caller checks the status first, as with libibverbs).
pub fn wc_opcode_from_ibv(v: c_int) -> WcOpcode {
    [
        WcOpcode::RdmaWrite,
        WcOpcode::RdmaRead,
        WcOpcode::CompSwap,
        WcOpcode::FetchAdd,
        WcOpcode::Recv,
        WcOpcode::RecvRdmaWithImm,
    ]
    .into_iter()
    .find(|&o| wc_opcode_to_ibv(o) == v)
    .unwrap_or(WcOpcode::Send)
}

/// `enum ibv_wr_opcode` of a send work request's opcode.
pub fn wr_opcode_to_ibv(o: WrOpcode) -> c_int {
    match o {
        WrOpcode::RdmaWrite => 0,
        WrOpcode::RdmaWriteWithImm => 1,
        WrOpcode::Send => 2,
        WrOpcode::SendWithImm => 3,
        WrOpcode::RdmaRead => 4,
        WrOpcode::AtomicCmpAndSwp => 5,
        WrOpcode::AtomicFetchAndAdd => 6,
        WrOpcode::SendWithInv => 9,
    }
}

/// The opcode of an `enum ibv_wr_opcode` value: one the engine executes, else an error
/// (the TSO, local-invalidate, bind-MW and driver opcodes: EINVAL, as rxe's
/// `rxe_post_send` refuses an opcode its QP type has no row for).
pub fn wr_opcode_from_ibv(v: c_int) -> Result<WrOpcode, VerbsError> {
    [
        WrOpcode::RdmaWrite,
        WrOpcode::RdmaWriteWithImm,
        WrOpcode::Send,
        WrOpcode::SendWithImm,
        WrOpcode::RdmaRead,
        WrOpcode::AtomicCmpAndSwp,
        WrOpcode::AtomicFetchAndAdd,
        WrOpcode::SendWithInv,
    ]
    .into_iter()
    .find(|&o| wr_opcode_to_ibv(o) == v)
    .ok_or(VerbsError::InvalidValue("send opcode"))
}

/// The GRH fields of an address vector from `ibv_ah_attr.grh`, the flow label cut to
/// its 20 bits; the MAC and VLAN are the engine's to resolve.
fn av_from_grh(g: &ibv_global_route) -> AddressVector {
    AddressVector {
        dmac: [0; 6],
        dgid: g.dgid.raw,
        sgid_index: g.sgid_index,
        traffic_class: g.traffic_class,
        hop_limit: g.hop_limit,
        flow_label: g.flow_label & FLOW_LABEL_MASK,
        vlan_tci: None,
    }
}

/// The address vector of an `ibv_create_ah`'s `ibv_ah_attr`. RoCE needs the GRH (IBTA
/// vol. 1 annex A17.4; ib_core `rdma_check_ah_attr` refuses a RoCE AH without
/// IB_AH_GRH); port 1 is the only port. The flow label keeps its low 20 bits, the GRH's
/// field (IBTA vol. 1 §8.3.1): ib_core stores what the caller gives and the hardware and
/// rxe put only those bits on the wire, so programs pass more (UCX 1.13's UD transport
/// gives 0xffffffff) and succeed.
impl TryFrom<&ibv_ah_attr> for AddressVector {
    type Error = VerbsError;

    fn try_from(a: &ibv_ah_attr) -> Result<AddressVector, VerbsError> {
        if a.is_global == 0 {
            return Err(VerbsError::InvalidValue("address handle without a GRH"));
        }
        if a.port_num != 1 {
            return Err(VerbsError::InvalidValue("port number"));
        }
        Ok(av_from_grh(&a.grh))
    }
}

/// `ibv_modify_qp`'s attributes: the fields `mask` names, the enums among them checked
/// (an undefined state or MTU is EINVAL, as rxe's `rxe_qp_chk_attr` and the kernel's
/// `ib_modify_qp_is_ok` refuse them). An address vector must carry a GRH: RoCE addresses
/// its destination by GID (IBTA vol. 1 annex A17.4; rdma-core's `ibv_modify_qp` on a
/// RoCE port without `is_global` fails in the kernel's `ib_resolve_eth_dmac`). The
/// fields outside `mask` are copied as they are (the engine reads only the masked ones).
impl TryFrom<(&ibv_qp_attr, AttrMask)> for QpAttr {
    type Error = VerbsError;

    fn try_from((a, m): (&ibv_qp_attr, AttrMask)) -> Result<QpAttr, VerbsError> {
        let mut q = QpAttr::from_ibv_unmasked(a);
        if m.contains(AttrMask::STATE) {
            q.qp_state = qp_state_from_ibv(a.qp_state)?;
        }
        if m.contains(AttrMask::CUR_STATE) {
            q.cur_qp_state = qp_state_from_ibv(a.cur_qp_state)?;
        }
        if m.contains(AttrMask::PATH_MTU) {
            q.path_mtu = mtu_from_ibv(a.path_mtu).ok_or(VerbsError::InvalidValue("path MTU"))?;
        }
        if m.contains(AttrMask::AV) && a.ah_attr.is_global == 0 {
            return Err(VerbsError::InvalidValue("address vector without a GRH"));
        }
        Ok(q)
    }
}

impl QpAttr {
    /// Every field of `a` as the engine's, an enum value verbs.h does not define read as
    /// the default (a provider's `ibv_query_qp` answer, whose unset fields are zero).
    fn from_ibv_unmasked(a: &ibv_qp_attr) -> QpAttr {
        QpAttr {
            qp_state: qp_state_from_ibv(a.qp_state).unwrap_or(QpState::Reset),
            cur_qp_state: qp_state_from_ibv(a.cur_qp_state).unwrap_or(QpState::Reset),
            path_mtu: mtu_from_ibv(a.path_mtu).unwrap_or_default(),
            // Relaxed ordering and the other optional bits are hints (verbs.h).
            qp_access_flags: Access(a.qp_access_flags & Access::ALL.0),
            pkey_index: a.pkey_index,
            port_num: a.port_num,
            ah_attr: av_from_grh(&a.ah_attr.grh),
            dest_qp_num: Qpn::new(a.dest_qp_num),
            rq_psn: Psn::new(a.rq_psn),
            sq_psn: Psn::new(a.sq_psn),
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            min_rnr_timer: a.min_rnr_timer,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            qkey: a.qkey,
            sq_draining: a.sq_draining != 0,
        }
    }

    /// A provider's `ibv_query_qp` answer: its QP state must be one verbs.h defines;
    /// every other field as `QpAttr::from_ibv_unmasked` reads it.
    pub fn from_ibv_query(a: &ibv_qp_attr) -> Result<QpAttr, VerbsError> {
        Ok(QpAttr {
            qp_state: qp_state_from_ibv(a.qp_state)?,
            ..QpAttr::from_ibv_unmasked(a)
        })
    }
}

/// The C form of the engine's attributes. RoCE: every address vector is global (GRH);
/// the kernel resolves the MAC and takes the route's hop limit (`ib_resolve_eth_dmac`).
impl From<&QpAttr> for ibv_qp_attr {
    fn from(q: &QpAttr) -> ibv_qp_attr {
        let av = &q.ah_attr;
        ibv_qp_attr {
            qp_state: qp_state_to_ibv(q.qp_state),
            cur_qp_state: qp_state_to_ibv(q.cur_qp_state),
            path_mtu: mtu_to_ibv(q.path_mtu),
            qp_access_flags: q.qp_access_flags.0,
            pkey_index: q.pkey_index,
            port_num: q.port_num,
            ah_attr: ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: super::abi::ibv_gid { raw: av.dgid },
                    flow_label: av.flow_label & FLOW_LABEL_MASK,
                    sgid_index: av.sgid_index,
                    hop_limit: av.hop_limit,
                    traffic_class: av.traffic_class,
                },
                is_global: 1,
                port_num: q.port_num.max(1),
                ..ibv_ah_attr::default()
            },
            dest_qp_num: q.dest_qp_num.value(),
            rq_psn: q.rq_psn.value(),
            sq_psn: q.sq_psn.value(),
            timeout: q.timeout,
            retry_cnt: q.retry_cnt,
            rnr_retry: q.rnr_retry,
            min_rnr_timer: q.min_rnr_timer,
            max_rd_atomic: q.max_rd_atomic,
            max_dest_rd_atomic: q.max_dest_rd_atomic,
            qkey: q.qkey,
            sq_draining: u8::from(q.sq_draining),
            ..ibv_qp_attr::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_round_trips_and_refuses_undefined_values() {
        for m in MTUS {
            assert_eq!(mtu_from_ibv(mtu_to_ibv(m)), Some(m));
        }
        assert_eq!((mtu_to_ibv(Mtu::Mtu256), mtu_to_ibv(Mtu::Mtu4096)), (1, 5));
        for v in [-1, 0, 6, 7] {
            assert_eq!(mtu_from_ibv(v), None, "{v}");
        }
    }

    #[test]
    fn qp_state_round_trips_and_refuses_undefined_values() {
        for s in QpState::ALL {
            assert_eq!(qp_state_from_ibv(qp_state_to_ibv(s)), Ok(s));
        }
        assert_eq!(qp_state_to_ibv(QpState::Rts), 3);
        assert_eq!(qp_state_to_ibv(QpState::Err), 6);
        for v in [-1, 7, 8] {
            assert!(qp_state_from_ibv(v).is_err(), "{v}");
        }
    }

    #[test]
    fn wc_opcode_round_trips() {
        for o in [
            WcOpcode::Send,
            WcOpcode::RdmaWrite,
            WcOpcode::RdmaRead,
            WcOpcode::CompSwap,
            WcOpcode::FetchAdd,
            WcOpcode::Recv,
            WcOpcode::RecvRdmaWithImm,
        ] {
            assert_eq!(wc_opcode_from_ibv(wc_opcode_to_ibv(o)), o);
        }
        assert_eq!(wc_opcode_to_ibv(WcOpcode::RecvRdmaWithImm), 129);
        // An error completion's undefined opcode reads as SEND.
        assert_eq!(wc_opcode_from_ibv(77), WcOpcode::Send);
    }

    #[test]
    fn wr_opcodes_are_verbs_h() {
        for v in [0, 1, 2, 3, 4, 5, 6, 9] {
            assert_eq!(wr_opcode_from_ibv(v).map(wr_opcode_to_ibv), Ok(v));
        }
        // LOCAL_INV 7, BIND_MW 8, TSO 10, DRIVER1 11, and what verbs.h does not define.
        for v in [-1, 7, 8, 10, 11, 12] {
            assert!(wr_opcode_from_ibv(v).is_err(), "{v}");
        }
        assert_eq!(wr_opcode_to_ibv(WrOpcode::RdmaWrite), 0);
        assert_eq!(wr_opcode_to_ibv(WrOpcode::SendWithInv), 9);
        assert_eq!(wr_opcode_to_ibv(WrOpcode::AtomicFetchAndAdd), 6);
    }

    fn rts_attr() -> QpAttr {
        QpAttr {
            qp_state: QpState::Rts,
            cur_qp_state: QpState::Rtr,
            path_mtu: Mtu::Mtu1024,
            qp_access_flags: Access(Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0),
            port_num: 1,
            ah_attr: AddressVector {
                dmac: [0; 6],
                dgid: [7; 16],
                sgid_index: 2,
                traffic_class: 3,
                hop_limit: 64,
                flow_label: 0x1_2345,
                vlan_tci: None,
            },
            dest_qp_num: Qpn::new(0x11),
            rq_psn: Psn::new(5),
            sq_psn: Psn::new(6),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
            qkey: 0x1111,
            ..QpAttr::default()
        }
    }

    #[test]
    fn qp_attr_round_trips_through_the_c_structure() {
        let q = rts_attr();
        let c = ibv_qp_attr::from(&q);
        assert_eq!((c.ah_attr.is_global, c.ah_attr.port_num), (1, 1));
        let all = AttrMask((1 << 21) - 1);
        assert_eq!(QpAttr::try_from((&c, all)), Ok(q));
        assert_eq!(QpAttr::from_ibv_query(&c), Ok(q));
    }

    #[test]
    fn the_flow_label_keeps_its_20_bits() {
        let mut c = ibv_qp_attr::from(&rts_attr());
        c.ah_attr.grh.flow_label = 0xfff1_2345;
        let q = QpAttr::try_from((&c, AttrMask::AV)).unwrap();
        assert_eq!(q.ah_attr.flow_label, 0x1_2345);
        assert_eq!(
            QpAttr::from_ibv_query(&c).unwrap().ah_attr.flow_label,
            0x1_2345
        );
    }

    #[test]
    fn an_address_vector_without_a_grh_is_refused_only_when_masked() {
        let mut c = ibv_qp_attr::from(&rts_attr());
        c.ah_attr.is_global = 0;
        assert!(QpAttr::try_from((&c, AttrMask::AV)).is_err());
        assert!(QpAttr::try_from((&c, AttrMask::STATE)).is_ok());
        // A query answer (a QP before RTR has no address vector) is not refused.
        assert!(QpAttr::from_ibv_query(&c).is_ok());
    }

    #[test]
    fn an_ah_attr_needs_its_grh_and_port_1() {
        let mut a = ibv_qp_attr::from(&rts_attr()).ah_attr;
        a.grh.flow_label = 0xffff_ffff;
        let av = AddressVector::try_from(&a).unwrap();
        assert_eq!(
            (av.flow_label, av.dgid, av.sgid_index),
            (0xf_ffff, [7; 16], 2)
        );
        assert_eq!((av.hop_limit, av.traffic_class, av.vlan_tci), (64, 3, None));
        a.port_num = 2;
        assert!(AddressVector::try_from(&a).is_err());
        a.port_num = 1;
        a.is_global = 0;
        assert!(AddressVector::try_from(&a).is_err());
    }

    #[test]
    fn undefined_enum_values_are_refused_only_when_masked() {
        let mut c = ibv_qp_attr::from(&rts_attr());
        c.path_mtu = 9;
        c.cur_qp_state = 42;
        assert!(QpAttr::try_from((&c, AttrMask::PATH_MTU)).is_err());
        assert!(QpAttr::try_from((&c, AttrMask::CUR_STATE)).is_err());
        assert!(QpAttr::try_from((&c, AttrMask::STATE)).is_ok());
        c.qp_state = -1;
        assert!(QpAttr::try_from((&c, AttrMask::STATE)).is_err());
        assert!(QpAttr::from_ibv_query(&c).is_err());
    }
}
