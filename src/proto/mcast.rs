//! The multicast group table of a device: which UD QPs are attached to which group
//! (IBTA vol. 1 §10.5, "multicast"; §11.2.5, Attach/Detach QP to/from Multicast Group).
//!
//! Contract: a group is named by its multicast GID (for RoCE v2 over IPv4 the IPv4-mapped
//! GID of the group's address, `::ffff:a.b.c.d`, as the kernel's cma `cma_iboe_set_mgid`
//! makes it; over IPv6 the address itself). A QP can be attached to many groups and a
//! group has many QPs. Attaching a QP that is attached already succeeds and changes
//! nothing (rxe `rxe_attach_mcg` returns 0; uverbs also answers 0 for a pair it holds);
//! detaching a QP that is not attached is an error (rxe `rxe_detach_mcg`: EINVAL). A group
//! exists while it has a QP: the last detach (or the QP's destruction, [`McastGroups::
//! forget_qp`]) removes it. Limits are rxe's (rxe_param.h): [`MAX_MCAST_GRP`] groups,
//! [`MAX_MCAST_QP_ATTACH`] QPs a group, [`MAX_TOTAL_MCAST_QP_ATTACH`] attachments in
//! all; past them an attach fails (rxe: ENOMEM). The checks of the QP itself (UD, not the
//! GSI QP) and of the GID (multicast) are the verb's (`Rnic::attach_mcast`).
//!
//! What the table does not do: deliver. The device's receive path looks a group up by
//! the destination address of a frame ([`McastGroups::members_of_ip`]) and hands a copy
//! to each member (`Rnic::handle_mcast`).

use std::collections::BTreeMap;

use crate::wire::{Qpn, gid_is};

use super::qp::VerbsError;

/// Groups a device holds at most (rxe `RXE_MAX_MCAST_GRP`).
pub const MAX_MCAST_GRP: usize = 8192;
/// QPs one group holds at most (rxe `RXE_MAX_MCAST_QP_ATTACH`).
pub const MAX_MCAST_QP_ATTACH: usize = 56;
/// Attachments of all groups together (rxe `RXE_MAX_TOT_MCAST_QP_ATTACH`).
pub const MAX_TOTAL_MCAST_QP_ATTACH: usize = 0x70000;

/// The message of the limit errors (the C library answers them ENOMEM, as rxe).
pub const LIMIT: &str = "multicast limit reached";

/// Groups by multicast GID, each with its attached QPs in attach order.
#[derive(Debug, Default)]
pub struct McastGroups {
    groups: BTreeMap<[u8; 16], Vec<Qpn>>,
    attachments: usize,
}

impl McastGroups {
    /// Attach `qpn` to group `gid`: true when it was not attached before.
    pub fn attach(&mut self, gid: &[u8; 16], qpn: Qpn) -> Result<bool, VerbsError> {
        if let Some(m) = self.groups.get(gid) {
            if m.contains(&qpn) {
                return Ok(false);
            }
            if m.len() >= MAX_MCAST_QP_ATTACH {
                return Err(VerbsError::Limit(LIMIT));
            }
        } else if self.groups.len() >= MAX_MCAST_GRP {
            return Err(VerbsError::Limit(LIMIT));
        }
        if self.attachments >= MAX_TOTAL_MCAST_QP_ATTACH {
            return Err(VerbsError::Limit(LIMIT));
        }
        self.groups.entry(*gid).or_default().push(qpn);
        self.attachments += 1;
        Ok(true)
    }

    /// Detach `qpn` from group `gid`; an error when it is not attached to it.
    pub fn detach(&mut self, gid: &[u8; 16], qpn: Qpn) -> Result<(), VerbsError> {
        let m = self
            .groups
            .get_mut(gid)
            .ok_or(VerbsError::NotFound("multicast group"))?;
        let i = m
            .iter()
            .position(|&q| q == qpn)
            .ok_or(VerbsError::NotFound("QP attached to the multicast group"))?;
        m.remove(i);
        self.attachments -= 1;
        if m.is_empty() {
            self.groups.remove(gid);
        }
        Ok(())
    }

    /// Detach `qpn` from every group (the QP is destroyed: ib_core detaches nothing for
    /// the consumer, rxe's `rxe_qp_do_cleanup` drops its attachments).
    pub fn forget_qp(&mut self, qpn: Qpn) {
        let before = self.attachments;
        self.groups.retain(|_, m| {
            m.retain(|&q| q != qpn);
            !m.is_empty()
        });
        self.attachments = self.groups.values().map(Vec::len).sum();
        debug_assert!(self.attachments <= before);
    }

    /// True when no QP is attached to any group.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The groups that have at least one QP, in GID order.
    pub fn groups(&self) -> impl Iterator<Item = &[u8; 16]> {
        self.groups.keys()
    }

    /// The QPs attached to `gid` (empty when it is no group of ours).
    pub fn members(&self, gid: &[u8; 16]) -> &[Qpn] {
        self.groups.get(gid).map_or(&[], Vec::as_slice)
    }

    /// The group whose GID names the IP address `ip` as it lies in a frame (4 bytes:
    /// IPv4, matched as its mapped GID; 16: IPv6), with its QPs.
    pub fn members_of_ip(&self, ip: &[u8]) -> Option<(&[u8; 16], &[Qpn])> {
        // A handful of groups at most in practice; no GID is built per frame.
        self.groups
            .iter()
            .find(|(g, _)| gid_is(g, ip))
            .map(|(g, m)| (g, m.as_slice()))
    }

    /// The number of attachments of all groups together.
    pub fn attachments(&self) -> usize {
        self.attachments
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipv4_gid;

    #[test]
    fn attach_detach_and_forget() {
        let g1 = ipv4_gid([239, 1, 2, 3]);
        let g2 = ipv4_gid([239, 1, 2, 4]);
        let (a, b) = (Qpn::new(0x11), Qpn::new(0x12));
        let mut t = McastGroups::default();
        assert!(t.is_empty());
        assert_eq!(t.attach(&g1, a), Ok(true));
        assert_eq!(
            t.attach(&g1, a),
            Ok(false),
            "a second attach changes nothing"
        );
        assert_eq!(t.attach(&g1, b), Ok(true));
        assert_eq!(t.attach(&g2, a), Ok(true));
        assert_eq!(t.members(&g1), &[a, b]);
        assert_eq!(t.attachments(), 3);
        assert_eq!(
            t.members_of_ip(&[239, 1, 2, 4]).map(|(_, m)| m.to_vec()),
            Some(vec![a])
        );
        assert!(t.members_of_ip(&[239, 1, 2, 5]).is_none());
        assert!(t.detach(&g2, b).is_err(), "b is not in g2");
        t.detach(&g2, a).unwrap();
        assert!(t.detach(&g2, a).is_err(), "the group went with its last QP");
        assert_eq!(t.groups().count(), 1);
        t.forget_qp(a);
        assert_eq!(t.members(&g1), &[b]);
        t.forget_qp(b);
        assert!(t.is_empty());
        assert_eq!(t.attachments(), 0);
    }

    #[test]
    fn a_group_holds_rxes_number_of_qps() {
        let g = ipv4_gid([239, 0, 0, 1]);
        let mut t = McastGroups::default();
        for i in 0..MAX_MCAST_QP_ATTACH as u32 {
            t.attach(&g, Qpn::new(0x100 + i)).unwrap();
        }
        assert_eq!(
            t.attach(&g, Qpn::new(0x1000)),
            Err(VerbsError::Limit(LIMIT))
        );
    }
}
