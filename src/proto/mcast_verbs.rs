//! Multicast on the engine: the attach / detach verbs of UD QPs and the delivery of a
//! datagram sent to a group to every QP attached to it (IBTA vol. 1 §10.5 and §11.2.5;
//! the table itself is `super::mcast`).
//!
//! Contract:
//! - [`Rnic::attach_mcast`] / [`Rnic::detach_mcast`] take a multicast GID (ib_core
//!   `ib_attach_mcast` refuses any other, and any QP that is not UD: EINVAL; the GSI QP
//!   is `IB_QPT_GSI` there, refused too). The MLID is not the engine's business: on
//!   RoCE ib_core ignores it (`is_valid_mcast_lid`).
//! - Receiving: a frame to a group Ethernet address goes to [`Rnic::handle_mcast`]
//!   (from `judge_frame`, after the ICRC). It is ours when its IP destination is a group
//!   with a QP attached and its destination MAC is that group's (`multicast_mac`);
//!   otherwise `WrongAddress`. Only UD is sent to groups (rxe `check_type_state`), with
//!   DQPN 0xFFFFFF (§10.5.2.2; rxe takes the multicast path on `IB_MULTICAST_QPN`):
//!   another service or QPN is `UnknownQp`. The P_Key is checked once for the frame.
//!   Then each attached QP gets its own copy through the UD receive of `super::ud`, with
//!   that QP's checks (state, Q_Key, a receive WQE): one failing does not keep the others
//!   from theirs, as rxe's `rxe_rcv_mcast_pkt` "moves on and tries the rest". Each QP's
//!   verdict is counted at that QP (`count_rx`: a Q_Key mismatch in its
//!   `bad_qkey_dropped`); the frame's verdict is `Taken` when any QP took it, else the
//!   first QP's. A QP attached twice gets one copy.
//! - Destroying a QP detaches it from every group (`destroy_qp`).

use crate::wire::{FrameView, MULTICAST_QPN, Qpn, Service, gid_is_multicast, multicast_mac};

use super::device::Rnic;
use super::qp::{QpType, VerbsError};
use super::time::Instant;
use super::ud;
use super::verdict::RxVerdict;

impl Rnic {
    /// `ibv_attach_mcast`: attach UD QP `qpn` to multicast group `gid`. True when the
    /// QP was not attached to it before (a second attach succeeds and does nothing).
    pub fn attach_mcast(&mut self, qpn: Qpn, gid: &[u8; 16]) -> Result<bool, VerbsError> {
        self.alive()?;
        self.check_mcast_qp(qpn, gid)?;
        self.mcast.attach(gid, qpn)
    }

    /// `ibv_detach_mcast`: detach `qpn` from `gid`; an error when it is not attached.
    pub fn detach_mcast(&mut self, qpn: Qpn, gid: &[u8; 16]) -> Result<(), VerbsError> {
        self.alive()?;
        self.check_mcast_qp(qpn, gid)?;
        self.mcast.detach(gid, qpn)
    }

    /// The groups with at least one QP attached, in GID order.
    pub fn mcast_groups(&self) -> Vec<[u8; 16]> {
        self.mcast.groups().copied().collect()
    }

    /// The QPs attached to group `gid`, in attach order.
    pub fn mcast_members(&self, gid: &[u8; 16]) -> Vec<Qpn> {
        self.mcast.members(gid).to_vec()
    }

    /// ib_core `ib_attach_mcast`'s checks: a multicast GID, a UD QP (not QP1).
    fn check_mcast_qp(&self, qpn: Qpn, gid: &[u8; 16]) -> Result<(), VerbsError> {
        if !gid_is_multicast(gid) {
            return Err(VerbsError::InvalidValue("not a multicast GID"));
        }
        let qp = self
            .slot(qpn)
            .and_then(|i| self.qps[i].as_ref())
            .ok_or(VerbsError::NotFound("QP"))?;
        if qp.init.qp_type != QpType::Ud || qpn == ud::GSI_QPN {
            return Err(VerbsError::InvalidValue(
                "only UD QPs attach to multicast groups",
            ));
        }
        Ok(())
    }

    /// A frame to a group Ethernet address, its ICRC checked: a copy to every QP
    /// attached to its group (see the module's contract). Counts each QP's verdict
    /// itself; the slot returned is always `None`.
    pub(super) fn handle_mcast(
        &mut self,
        now: Instant,
        view: &FrameView<'_>,
    ) -> (RxVerdict, Option<usize>) {
        let (_, dst_ip) = view.ip_addrs();
        let dst_mac = view.bytes().get(..6);
        let Some((gid, members)) = self.mcast.members_of_ip(dst_ip) else {
            return (RxVerdict::WrongAddress, None);
        };
        if multicast_mac(gid).as_ref().map(|m| &m[..]) != dst_mac {
            return (RxVerdict::WrongAddress, None);
        }
        let bth = view.bth();
        if view.info().service != Service::Ud || bth.dest_qp().value() != MULTICAST_QPN {
            return (RxVerdict::UnknownQp, None);
        }
        if !ud::PKEY_TABLE
            .iter()
            .any(|&k| super::device::pkey_matches(bth.pkey().0, k))
        {
            return (RxVerdict::BadPkey, None);
        }
        let mut qpns = std::mem::take(&mut self.mcast_scratch);
        qpns.clear();
        qpns.extend_from_slice(members);
        let len = view.bytes().len();
        let mut frame_verdict: Option<RxVerdict> = None;
        let mut first_at_qp: Option<RxVerdict> = None;
        let mut taken = false;
        for &qpn in &qpns {
            let Some(slot) = self.slot(qpn) else { continue };
            let Some((qp, ctx)) = self.split_slot(slot, now) else {
                continue;
            };
            match ud::receive(qp, ctx, slot, now, view) {
                (v, Some(i)) => {
                    self.count_rx(v, Some(i), len);
                    self.touch(i);
                    taken |= v.is_taken();
                    first_at_qp.get_or_insert(v);
                }
                (v, None) => {
                    frame_verdict.get_or_insert(v);
                }
            }
        }
        self.mcast_scratch = qpns;
        let v = if taken {
            RxVerdict::Taken
        } else {
            first_at_qp
                .or(frame_verdict)
                .unwrap_or(RxVerdict::UnknownQp)
        };
        (v, None)
    }
}

#[cfg(test)]
#[path = "mcast_tests.rs"]
mod tests;
