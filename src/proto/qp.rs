//! The RC queue pair: states, attributes and the `modify_qp` rules.
//!
//! Contract: [`check_modify`] decides, from the current state, the requested state and the
//! attribute mask, whether a modification is legal, exactly as `ibv_modify_qp(3)` documents
//! for RC QPs (the required/optional attributes per transition of IBTA vol. 1 §10.3,
//! as the Linux `ib_modify_qp_is_ok` table encodes it). It changes nothing; the engine
//! applies an accepted modification and performs the state's side effects (flush on ERR,
//! wipe on RESET, drain on SQD).

use crate::wire::{Psn, Qpn};

use super::memory::Access;

/// QP states (IBTA §10.3, `enum ibv_qp_state`). Serialized in capitals, as
/// `rdma resource show` and `xrnic stat` spell them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
}

impl QpState {
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];
}

/// The transport service of a QP (`enum ibv_qp_type`: RC, UC, UD).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum QpType {
    #[default]
    Rc,
    Uc,
    Ud,
}

pub use super::config::Mtu;

/// The address vector of the remote end (`ibv_ah_attr` with a GRH, RoCE v2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct AddressVector {
    /// Destination MAC.
    pub dmac: [u8; 6],
    /// Destination GID: an IPv6 address, or IPv4-mapped `::ffff:a.b.c.d` for IPv4.
    pub dgid: [u8; 16],
    /// Index of the source GID in the device's GID table.
    pub sgid_index: u8,
    /// IP DSCP+ECN byte. DCQCN will set the ECN bits later; 0 by default like rxe.
    pub traffic_class: u8,
    /// IPv6 hop limit / IPv4 TTL; 0 means 64, rxe's value.
    pub hop_limit: u8,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
    /// 802.1Q tag, if any.
    pub vlan_tci: Option<u16>,
}

pub use crate::wire::{gid_is_ipv4, ipv4_gid};

/// Attribute mask bits, the `enum ibv_qp_attr_mask` values.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Default, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct AttrMask(pub u32);

impl AttrMask {
    pub const STATE: AttrMask = AttrMask(1);
    pub const CUR_STATE: AttrMask = AttrMask(1 << 1);
    pub const EN_SQD_ASYNC_NOTIFY: AttrMask = AttrMask(1 << 2);
    pub const ACCESS_FLAGS: AttrMask = AttrMask(1 << 3);
    pub const PKEY_INDEX: AttrMask = AttrMask(1 << 4);
    pub const PORT: AttrMask = AttrMask(1 << 5);
    pub const QKEY: AttrMask = AttrMask(1 << 6);
    pub const AV: AttrMask = AttrMask(1 << 7);
    pub const PATH_MTU: AttrMask = AttrMask(1 << 8);
    pub const TIMEOUT: AttrMask = AttrMask(1 << 9);
    pub const RETRY_CNT: AttrMask = AttrMask(1 << 10);
    pub const RNR_RETRY: AttrMask = AttrMask(1 << 11);
    pub const RQ_PSN: AttrMask = AttrMask(1 << 12);
    pub const MAX_QP_RD_ATOMIC: AttrMask = AttrMask(1 << 13);
    pub const ALT_PATH: AttrMask = AttrMask(1 << 14);
    pub const MIN_RNR_TIMER: AttrMask = AttrMask(1 << 15);
    pub const SQ_PSN: AttrMask = AttrMask(1 << 16);
    pub const MAX_DEST_RD_ATOMIC: AttrMask = AttrMask(1 << 17);
    pub const PATH_MIG_STATE: AttrMask = AttrMask(1 << 18);
    pub const CAP: AttrMask = AttrMask(1 << 19);
    pub const DEST_QPN: AttrMask = AttrMask(1 << 20);

    /// What a RESET→INIT `modify` of an RC QP sets: the state and the transition's
    /// required attributes (IBTA vol. 1 §10.3, [`transition_rule`]), the mask
    /// ibv_rc_pingpong passes.
    pub const RC_INIT: AttrMask = AttrMask::of(&[
        Self::STATE,
        Self::PKEY_INDEX,
        Self::PORT,
        Self::ACCESS_FLAGS,
    ]);
    /// What an INIT→RTR `modify` of an RC QP sets (the state and the required attributes).
    pub const RC_RTR: AttrMask = AttrMask::of(&[
        Self::STATE,
        Self::AV,
        Self::PATH_MTU,
        Self::DEST_QPN,
        Self::RQ_PSN,
        Self::MAX_DEST_RD_ATOMIC,
        Self::MIN_RNR_TIMER,
    ]);
    /// What an RTR→RTS `modify` of an RC QP sets (the state and the required attributes).
    pub const RC_RTS: AttrMask = AttrMask::of(&[
        Self::STATE,
        Self::TIMEOUT,
        Self::RETRY_CNT,
        Self::RNR_RETRY,
        Self::SQ_PSN,
        Self::MAX_QP_RD_ATOMIC,
    ]);

    pub const fn contains(self, o: AttrMask) -> bool {
        self.0 & o.0 == o.0
    }
    pub const fn union(self, o: AttrMask) -> AttrMask {
        AttrMask(self.0 | o.0)
    }
    /// The bits of `self` that are not in `o`.
    pub const fn without(self, o: AttrMask) -> AttrMask {
        AttrMask(self.0 & !o.0)
    }
    const fn of(bits: &[AttrMask]) -> AttrMask {
        let mut m = 0;
        let mut i = 0;
        while i < bits.len() {
            m |= bits[i].0;
            i += 1;
        }
        AttrMask(m)
    }
}

impl core::ops::BitOr for AttrMask {
    type Output = AttrMask;
    fn bitor(self, o: AttrMask) -> AttrMask {
        AttrMask(self.0 | o.0)
    }
}

/// QP attributes (`struct ibv_qp_attr`, RC subset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    pub path_mtu: Mtu,
    pub qp_access_flags: Access,
    pub pkey_index: u16,
    pub port_num: u8,
    pub ah_attr: AddressVector,
    pub dest_qp_num: Qpn,
    pub rq_psn: Psn,
    pub sq_psn: Psn,
    /// Local ACK timeout exponent (0..=31).
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7, 7 = infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer code this QP's responder sends (0..=31).
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests this QP may issue.
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic requests this QP accepts as responder.
    pub max_dest_rd_atomic: u8,
    /// `query_qp` only: SQD with work still outstanding.
    pub sq_draining: bool,
    /// The Q_Key of a UD QP (IBTA §10.2.5; `AttrMask::QKEY`).
    pub qkey: u32,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            qp_access_flags: Access::NONE,
            pkey_index: 0,
            port_num: 1,
            ah_attr: AddressVector::default(),
            dest_qp_num: Qpn::new(0),
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            sq_draining: false,
            qkey: 0,
        }
    }
}

impl QpAttr {
    /// The attributes of an RC QP's RESET→INIT `modify` (mask [`AttrMask::RC_INIT`]): P_Key
    /// index 0, port 1 and `access`, as ibv_rc_pingpong's `pp_init_ctx` sets them.
    pub fn rc_init(access: Access) -> QpAttr {
        QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: access,
            pkey_index: 0,
            port_num: 1,
            ..QpAttr::default()
        }
    }
}

/// Why `modify_qp` (or another verb) refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerbsError {
    /// The transition from → to is not in the table (EINVAL).
    InvalidTransition { from: QpState, to: QpState },
    /// Required attributes missing from the mask.
    MissingAttributes(AttrMask),
    /// Attributes not allowed for this transition.
    UnexpectedAttributes(AttrMask),
    /// `cur_qp_state` disagrees with the QP's state.
    CurrentStateMismatch,
    /// An attribute value out of range.
    InvalidValue(&'static str),
    /// No such object.
    NotFound(&'static str),
    /// The queue is full (ENOMEM in ibverbs).
    QueueFull,
    /// The verb is not allowed in the QP's current state.
    WrongState(QpState),
    /// A PD / MR / CQ rule.
    Resource(&'static str),
    /// The object is still used by another (a PD with QPs, a CQ or SRQ a QP uses): EBUSY
    /// in libibverbs, as the kernel refuses to destroy an object in use.
    InUse(&'static str),
    /// A device limit reached (rxe's multicast limits): ENOMEM in libibverbs.
    Limit(&'static str),
    /// The device is gone (IBV_EVENT_DEVICE_FATAL was raised): EIO in libibverbs.
    DeviceFatal,
}

impl core::fmt::Display for VerbsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            VerbsError::InvalidTransition { from, to } => {
                write!(f, "invalid QP state transition {from:?} -> {to:?}")
            }
            VerbsError::MissingAttributes(m) => write!(f, "missing required attributes {:#x}", m.0),
            VerbsError::UnexpectedAttributes(m) => {
                write!(f, "attributes {:#x} not allowed in this transition", m.0)
            }
            VerbsError::CurrentStateMismatch => write!(f, "cur_qp_state does not match"),
            VerbsError::InvalidValue(w) => write!(f, "invalid value: {w}"),
            VerbsError::NotFound(w) => write!(f, "no such {w}"),
            VerbsError::QueueFull => write!(f, "work queue full"),
            VerbsError::WrongState(s) => write!(f, "not allowed in QP state {s:?}"),
            VerbsError::Resource(w) | VerbsError::InUse(w) | VerbsError::Limit(w) => {
                write!(f, "{w}")
            }
            VerbsError::DeviceFatal => write!(
                f,
                "the device is gone (its interface was removed: IBV_EVENT_DEVICE_FATAL)"
            ),
        }
    }
}

impl std::error::Error for VerbsError {}

/// Required and optional attributes of one RC transition, or `None` if it is invalid.
pub fn transition_rule(from: QpState, to: QpState) -> Option<(AttrMask, AttrMask)> {
    use AttrMask as M;
    use QpState::*;
    let none = M(0);
    Some(match (from, to) {
        // Any state may go to RESET or ERR with no other attribute (IBTA §10.3).
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) => (M::RC_INIT.without(M::STATE), none),
        (Init, Init) => (none, M::of(&[M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS])),
        (Init, Rtr) => (
            M::RC_RTR.without(M::STATE),
            M::of(&[M::ALT_PATH, M::ACCESS_FLAGS, M::PKEY_INDEX]),
        ),
        (Rtr, Rts) => (
            M::RC_RTS.without(M::STATE),
            M::of(&[
                M::CUR_STATE,
                M::ALT_PATH,
                M::ACCESS_FLAGS,
                M::MIN_RNR_TIMER,
                M::PATH_MIG_STATE,
            ]),
        ),
        (Rts, Rts) | (Sqd, Rts) => (
            none,
            M::of(&[
                M::CUR_STATE,
                M::ACCESS_FLAGS,
                M::ALT_PATH,
                M::PATH_MIG_STATE,
                M::MIN_RNR_TIMER,
            ]),
        ),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (
            none,
            M::of(&[
                M::AV,
                M::ALT_PATH,
                M::ACCESS_FLAGS,
                M::PKEY_INDEX,
                M::MIN_RNR_TIMER,
                M::PATH_MIG_STATE,
                M::TIMEOUT,
                M::RETRY_CNT,
                M::RNR_RETRY,
                M::MAX_QP_RD_ATOMIC,
                M::MAX_DEST_RD_ATOMIC,
            ]),
        ),
        (Sqe, Rts) => (none, M::CUR_STATE),
        _ => return None,
    })
}

/// Largest max_rd_atomic / max_dest_rd_atomic this engine accepts (ibv_devinfo
/// `max_qp_rd_atom`), rxe's 128 (ConnectX reports 16). Not less: stock perftest sets each
/// QP's max_rd_atomic to the PEER's announced depth (ctx_modify_qp_to_rts: `dest->out_reads`),
/// so an ib_read_bw / ib_atomic_bw client facing rxe asks for 128, and a smaller limit here
/// failed its modify to RTS (`make interop`, interop/run-stock-rxe.sh read_bw_xc).
pub const MAX_RD_ATOMIC: u8 = 128;

/// Decide whether `modify_qp(attr, mask)` is legal from state `cur`; returns the target
/// state. Mirrors `ibv_modify_qp`: without STATE in the mask the QP stays in its state
/// (a same-state transition, with that transition's rules).
pub fn check_modify(cur: QpState, attr: &QpAttr, mask: AttrMask) -> Result<QpState, VerbsError> {
    check_modify_with(transition_rule, cur, attr, mask)
}

/// [`check_modify`] with the transition table `rule` of another QP type (UC:
/// `super::uc::transition_rule`).
pub fn check_modify_with(
    rule: fn(QpState, QpState) -> Option<(AttrMask, AttrMask)>,
    cur: QpState,
    attr: &QpAttr,
    mask: AttrMask,
) -> Result<QpState, VerbsError> {
    let to = if mask.contains(AttrMask::STATE) {
        attr.qp_state
    } else {
        cur
    };
    if mask.contains(AttrMask::CUR_STATE) && attr.cur_qp_state != cur {
        return Err(VerbsError::CurrentStateMismatch);
    }
    let (req, opt) = rule(cur, to).ok_or(VerbsError::InvalidTransition { from: cur, to })?;
    let given = AttrMask(mask.0 & !AttrMask::STATE.0);
    let missing = AttrMask(req.0 & !given.0);
    if missing.0 != 0 {
        return Err(VerbsError::MissingAttributes(missing));
    }
    // CUR_STATE is harmless wherever it is checked above; the kernel accepts it only where
    // the table lists it, and so do we.
    let extra = AttrMask(given.0 & !(req.0 | opt.0));
    if extra.0 != 0 {
        return Err(VerbsError::UnexpectedAttributes(extra));
    }
    if given.contains(AttrMask::TIMEOUT) && attr.timeout > 31 {
        return Err(VerbsError::InvalidValue("timeout must be 0..=31"));
    }
    if given.contains(AttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
        return Err(VerbsError::InvalidValue("retry_cnt must be 0..=7"));
    }
    if given.contains(AttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
        return Err(VerbsError::InvalidValue("rnr_retry must be 0..=7"));
    }
    if given.contains(AttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return Err(VerbsError::InvalidValue("min_rnr_timer must be 0..=31"));
    }
    if given.contains(AttrMask::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > MAX_RD_ATOMIC {
        return Err(VerbsError::InvalidValue("max_rd_atomic too large"));
    }
    if given.contains(AttrMask::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > MAX_RD_ATOMIC {
        return Err(VerbsError::InvalidValue("max_dest_rd_atomic too large"));
    }
    if given.contains(AttrMask::ACCESS_FLAGS) && attr.qp_access_flags.0 & !Access::ALL.0 != 0 {
        return Err(VerbsError::InvalidValue("unknown access flag"));
    }
    if given.contains(AttrMask::PORT) && attr.port_num != 1 {
        return Err(VerbsError::InvalidValue("port_num must be 1"));
    }
    if given.contains(AttrMask::PKEY_INDEX) && attr.pkey_index != 0 {
        return Err(VerbsError::InvalidValue(
            "only P_Key index 0 (0xffff) exists",
        ));
    }
    if given.contains(AttrMask::AV) && attr.ah_attr.flow_label > 0xf_ffff {
        return Err(VerbsError::InvalidValue("flow_label is 20 bits"));
    }
    if given.contains(AttrMask::DEST_QPN) && attr.dest_qp_num.value() <= 1 {
        return Err(VerbsError::InvalidValue("dest_qp_num must be a RC QP"));
    }
    Ok(to)
}

/// rxe's UDP source port: 0xC000 + a 14-bit multiplicative hash of the QPN (rxe_qp.c, `hash_32`),
/// so that ECMP spreads QPs while all packets of one QP take one path.
pub fn udp_src_port(qpn: Qpn) -> u16 {
    // Golden-ratio multiplicative hash, top 14 bits.
    let h = qpn.value().wrapping_mul(0x61c8_8647) >> (32 - 14);
    0xc000 | (h as u16 & 0x3fff)
}

/// `post_recv` on a QP that takes its WQEs from an SRQ: EINVAL, as rxe `rxe_post_recv`.
pub(crate) fn refuse_post_recv(qp: &Qp) -> Result<(), VerbsError> {
    if qp.init.srq.is_some() {
        return Err(VerbsError::InvalidValue(
            "post_recv on a QP created with an SRQ (post to the SRQ)",
        ));
    }
    if qp.state == QpState::Reset {
        return Err(VerbsError::WrongState(QpState::Reset));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    const ERR: QpState = QpState::Err;

    #[test]
    fn mtu_values() {
        for n in [256, 512, 1024, 2048, 4096] {
            assert_eq!(Mtu::from_bytes(n).unwrap().bytes(), n);
        }
        assert_eq!(Mtu::from_bytes(1500), None);
    }

    #[test]
    fn ipv4_mapped_gid() {
        let g = ipv4_gid([192, 0, 2, 1]);
        assert!(gid_is_ipv4(&g));
        let mut v6 = [0u8; 16];
        v6[0] = 0xfd;
        assert!(!gid_is_ipv4(&v6));
    }

    #[test]
    fn source_port_is_in_rxe_range_and_stable() {
        for q in 0..1000 {
            let p = udp_src_port(Qpn::new(q));
            assert!(p >= 0xc000);
            assert_eq!(p, udp_src_port(Qpn::new(q)));
        }
        assert_ne!(udp_src_port(Qpn::new(17)), udp_src_port(Qpn::new(18)));
    }

    #[test]
    fn valid_transitions_table() {
        // Every (from, to) pair: exactly these are valid for RC.
        let valid = |f: QpState, t: QpState| -> bool {
            matches!(
                (f, t),
                (_, Reset)
                    | (_, ERR)
                    | (Reset, Init)
                    | (Init, Init)
                    | (Init, Rtr)
                    | (Rtr, Rts)
                    | (Rts, Rts)
                    | (Rts, Sqd)
                    | (Sqd, Rts)
                    | (Sqd, Sqd)
                    | (Sqe, Rts)
            )
        };
        let mut n_valid = 0;
        for f in QpState::ALL {
            for t in QpState::ALL {
                assert_eq!(transition_rule(f, t).is_some(), valid(f, t), "{f:?}->{t:?}");
                n_valid += usize::from(valid(f, t));
            }
        }
        // Any → RESET (7), any → ERR (7), and the nine forward/same-state transitions.
        assert_eq!(n_valid, 7 + 7 + 9);
    }

    #[test]
    fn required_and_unexpected_attributes() {
        let a = QpAttr {
            qp_state: Init,
            ..Default::default()
        };
        let e = check_modify(Reset, &a, AttrMask::STATE | AttrMask::PORT).unwrap_err();
        assert_eq!(
            e,
            VerbsError::MissingAttributes(AttrMask::PKEY_INDEX | AttrMask::ACCESS_FLAGS)
        );
        let full = AttrMask::STATE | AttrMask::PORT | AttrMask::PKEY_INDEX | AttrMask::ACCESS_FLAGS;
        assert_eq!(check_modify(Reset, &a, full), Ok(Init));
        assert_eq!(
            check_modify(Reset, &a, full | AttrMask::SQ_PSN),
            Err(VerbsError::UnexpectedAttributes(AttrMask::SQ_PSN))
        );
        let bad = QpAttr {
            qp_state: Rts,
            ..Default::default()
        };
        assert_eq!(
            check_modify(Init, &bad, AttrMask::STATE),
            Err(VerbsError::InvalidTransition {
                from: Init,
                to: Rts
            })
        );
        let mut cur = QpAttr {
            qp_state: Rts,
            cur_qp_state: Rtr,
            ..Default::default()
        };
        assert_eq!(
            check_modify(Rts, &cur, AttrMask::CUR_STATE),
            Err(VerbsError::CurrentStateMismatch)
        );
        cur.cur_qp_state = Rts;
        assert_eq!(check_modify(Rts, &cur, AttrMask::CUR_STATE), Ok(Rts));
        let mut v = QpAttr {
            qp_state: Rts,
            ..Default::default()
        };
        v.retry_cnt = 8;
        let rts = AttrMask::STATE
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC;
        assert!(matches!(
            check_modify(Rtr, &v, rts),
            Err(VerbsError::InvalidValue(_))
        ));
        v.retry_cnt = 7;
        assert_eq!(check_modify(Rtr, &v, rts), Ok(Rts));
    }

    /// What stock perftest asks for against rxe (its max_qp_rd_atom, 128) is accepted, in
    /// both directions; one more is refused.
    #[test]
    fn rd_atomic_depth_up_to_rxes_128() {
        let (rts, rtr) = (AttrMask::RC_RTS, AttrMask::RC_RTR);
        let mut v = QpAttr {
            qp_state: Rts,
            max_rd_atomic: 128,
            ..Default::default()
        };
        assert_eq!(check_modify(Rtr, &v, rts), Ok(Rts));
        v.max_rd_atomic = 129;
        assert!(matches!(
            check_modify(Rtr, &v, rts),
            Err(VerbsError::InvalidValue(_))
        ));
        let mut v = QpAttr {
            qp_state: Rtr,
            max_dest_rd_atomic: 128,
            dest_qp_num: Qpn::new(0x12),
            ..Default::default()
        };
        assert_eq!(check_modify(Init, &v, rtr), Ok(Rtr));
        v.max_dest_rd_atomic = 129;
        assert!(matches!(
            check_modify(Init, &v, rtr),
            Err(VerbsError::InvalidValue(_))
        ));
    }
}

// ---------------------------------------------------------------------------------------
// The QP object the engine keeps.

use super::Ctx;
use super::counters::QpCounters;
use super::cq::{Cq, WcStatus, WorkCompletion};
use super::memory::Pd;
use super::requester::Requester;
use super::responder::Responder;
use super::trace::Event;

/// Sizes and completion queues given at `create_qp` (`struct ibv_qp_init_attr`, RC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInitAttr {
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    /// Generate a completion for every send WR, signaled or not.
    pub sq_sig_all: bool,
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Take receive WQEs from this shared receive queue instead of the QP's own
    /// (`ibv_qp_init_attr.srq`); `post_recv` on the QP is then refused.
    pub srq: Option<super::srq::Srq>,
}

/// One RC queue pair.
#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: Qpn,
    pub pd: Pd,
    pub init: QpInitAttr,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub state: QpState,
    pub attr: QpAttr,
    pub src_port: u16,
    pub req: Requester,
    pub resp: Responder,
    pub counters: QpCounters,
    /// Alternates responder and requester output so neither starves the other.
    pub tx_turn: bool,
    /// The prebuilt header of this QP's frames and the ECT setting it was built with:
    /// built at the first frame after a `modify_qp`, which drops it (the address vector,
    /// destination QPN or traffic class may have changed).
    pub tx_template: Option<(bool, crate::wire::FrameTemplate)>,
    /// The datagram state of a UD QP (empty for the other types).
    pub ud: UdState,
    /// UC responder state (unused by RC QPs).
    pub uc: super::responder::UcResp,
}

impl Qp {
    pub fn new(qpn: Qpn, pd: Pd, init: QpInitAttr) -> Self {
        Qp {
            qpn,
            pd,
            init,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            state: QpState::Reset,
            attr: QpAttr::default(),
            src_port: udp_src_port(qpn),
            req: Requester::default(),
            resp: Responder::default(),
            counters: QpCounters::default(),
            tx_turn: false,
            tx_template: None,
            ud: Default::default(),
            uc: super::responder::UcResp::default(),
        }
    }

    /// Still able to run (not in ERR or RESET).
    pub fn state_ok(&self) -> bool {
        !matches!(self.state, QpState::Err | QpState::Reset)
    }

    /// Pop the head send WR and report it: always when it failed, when successful only
    /// if signaled (§10.8 / `IBV_SEND_SIGNALED`, `sq_sig_all`).
    pub fn complete_send_front(&mut self, ctx: &mut Ctx<'_>, status: WcStatus, byte_len: u32) {
        let Some(w) = self.req.pop_completed() else {
            return;
        };
        let signaled =
            self.init.sq_sig_all || w.wr.send_flags.contains(super::wr::SendFlags::SIGNALED);
        super::trace::qp_event!(
            ctx.now,
            ctx.dev,
            self.qpn,
            Event::WqeCompleted,
            queue = "sq",
            wr_id = w.wr.wr_id,
            status = ?status,
            signaled = signaled
        );
        if status != WcStatus::Success || signaled {
            let wc = WorkCompletion {
                wr_id: w.wr.wr_id,
                status,
                opcode: w.wr.opcode.wc_opcode(),
                byte_len,
                imm_data: None,
                invalidated_rkey: None,
                qp_num: self.qpn,
                src_qp: self.attr.dest_qp_num,
                grh: false,
                sl: 0,
            };
            ctx.complete(self.send_cq, wc);
        }
    }

    /// Move to ERR: every posted WR completes with WR_FLUSH_ERR, in order (IBTA §10.3,
    /// `ibv_modify_qp` to IBV_QPS_ERR).
    /// A QP on an SRQ raises IBV_EVENT_QP_LAST_WQE_REACHED as it enters ERR (§10.2.9.5).
    pub fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        if self.state != QpState::Err {
            super::trace::qp_event!(ctx.now, ctx.dev, self.qpn, Event::State, from = ?self.state, to = ?QpState::Err);
            if self.init.srq.is_some() {
                ctx.raise(super::srq::AsyncEvent::QpLastWqeReached(self.qpn));
            }
        }
        self.state = QpState::Err;
        self.attr.qp_state = QpState::Err;
        while self.req.sq_len() > 0 {
            self.complete_send_front(ctx, WcStatus::WrFlushErr, 0);
        }
        self.req.timers_mut().stop_transport();
        while let Some(r) = self.resp.take_recv() {
            let wc = WorkCompletion {
                wr_id: r.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: super::cq::WcOpcode::Recv,
                byte_len: 0,
                imm_data: None,
                invalidated_rkey: None,
                qp_num: self.qpn,
                src_qp: self.attr.dest_qp_num,
                grh: false,
                sl: 0,
            };
            ctx.complete(self.recv_cq, wc);
        }
        // Requests already executed keep their answer (as rxe's RESPST_ACKNOWLEDGE).
        self.resp.keep_executed_answers();
        ud_flush(self, ctx);
    }

    /// Back to RESET: all state and queued work disappear without completions.
    pub fn reset(&mut self) {
        self.state = QpState::Reset;
        self.attr = QpAttr::default();
        self.req = Requester::default();
        self.resp = Responder::default();
        self.uc = super::responder::UcResp::default();
        self.tx_template = None;
        self.ud = Default::default();
    }

    /// Bytes this QP occupies: the struct plus the heap capacity of its queues (user
    /// buffers live in memory regions and are not counted).
    pub fn memory_bytes(&self) -> usize {
        // A resolved list's heap part: none while its one element is held inline.
        fn spilled_bytes(s: &super::memory::Segs) -> usize {
            if s.spilled() {
                s.capacity() * core::mem::size_of::<super::memory::LocalSeg>()
            } else {
                0
            }
        }
        core::mem::size_of::<Qp>()
            + self.req.heap_bytes(spilled_bytes)
            + self.resp.heap_bytes(spilled_bytes)
    }
}

// The datagram state a QP holds (src/proto/ud.rs works on it; the QP flushes it on ERR).

/// Where one UD send goes: the address handle (`ibv_ah`) and `wr.ud` of `ibv_send_wr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct UdDest {
    /// The address handle's attributes; `dmac` already resolved.
    pub av: AddressVector,
    pub remote_qpn: Qpn,
    /// High bit set: send the QP's own Q_Key instead (§10.2.5).
    pub remote_qkey: u32,
}

/// Counters of one UD QP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UdCounters {
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    /// Datagrams whose DETH Q_Key was not the QP's (rxe `check_keys`).
    pub bad_qkey_dropped: u64,
    /// Datagrams that found no receive WQE.
    pub no_recv_wqe_dropped: u64,
    /// Datagrams taken while the QP was not yet in RTR (or was in ERR).
    pub wrong_state_dropped: u64,
    /// Send WRs longer than the port MTU: completed, never sent (C10-93.1.1).
    pub too_long_not_sent: u64,
}

/// One posted UD send.
#[derive(Debug)]
pub(crate) struct UdWqe {
    pub(crate) wr_id: u64,
    pub(crate) signaled: bool,
    pub(crate) imm: Option<u32>,
    pub(crate) solicited: bool,
    pub(crate) segs: Result<super::memory::Segs, WcStatus>,
    pub(crate) len: u32,
    pub(crate) dest: UdDest,
}

/// The datagram state of a QP (empty unless the QP is UD).
#[derive(Debug, Default)]
pub struct UdState {
    pub(crate) sq: std::collections::VecDeque<UdWqe>,
    pub counters: UdCounters,
}

/// Complete every posted UD send flushed (the QP entered ERR).
pub(crate) fn ud_flush(qp: &mut Qp, ctx: &mut Ctx<'_>) {
    while let Some(w) = qp.ud.sq.pop_front() {
        complete_ud_send(qp, ctx, &w, WcStatus::WrFlushErr);
    }
}

/// Complete UD send `w` of `qp` with `status` (a success only when signaled).
pub(crate) fn complete_ud_send(qp: &Qp, ctx: &mut Ctx<'_>, w: &UdWqe, status: WcStatus) {
    if status == WcStatus::Success && !(w.signaled || qp.init.sq_sig_all) {
        return;
    }
    let wc = WorkCompletion {
        wr_id: w.wr_id,
        status,
        opcode: super::cq::WcOpcode::Send,
        byte_len: if status == WcStatus::Success {
            w.len
        } else {
            0
        },
        imm_data: None,
        invalidated_rkey: None,
        qp_num: qp.qpn,
        src_qp: Qpn::new(0),
        grh: false,
        sl: 0,
    };
    ctx.complete(qp.send_cq, wc);
}
