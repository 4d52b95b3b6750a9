//! The device service's verbs of address handles, shared receive queues and multicast
//! attachments, and the posts that name AHs and SRQs (UD sends, SRQ receives): docs/rnic.md "One device, many
//! processes".
//!
//! Contract:
//! - An AH is made by the service's own device with the path the service resolves
//!   (src/service/resolver.rs: never a client's MAC or VLAN tag, and never waiting in
//!   the loop); the client gets a handle and the resolved address vector. A UD send
//!   slot names the AH by that handle, which is looked up in the sending client's table
//!   only: another client's handle is a malformed slot (dropped and counted), as is an
//!   unknown SRQ handle.
//! - An SRQ belongs to the client that made it; its QPs must be that client's (a QP
//!   names it by the client's handle); it cannot be destroyed while one of them uses it
//!   (EBUSY, as the in-process engine answers). Its SRQ_LIMIT_REACHED goes to that
//!   client only, naming its handle ([`srq_owner`]).
//! - Multicast: a client's UD QP is attached to a group by the service's device, which
//!   joins it in the kernel (src/verbs/mcast.rs), so rxe's limits on groups and
//!   attachments are the device's, shared by all clients.
//! - Caps: `Limits::max_ahs`, `Limits::max_srqs` per client (ENOMEM past them).

use super::server::{Client, Limits, bad, errno_resp, over};
use crate::ipc::{self, AhRes, Req, Resp, SrqRes};
use crate::verbs::{Ah, Srq};

/// An address handle of a client.
pub(super) struct AhEnt {
    pub ah: Ah,
    pub pd: u32,
}

/// An SRQ of a client.
pub(super) struct SrqEnt {
    pub srq: Srq,
    pub pd: u32,
}

/// Answer one AH or SRQ verb of client `c` (`None`: not one of these verbs).
pub(super) fn verb(lim: &Limits, c: &mut Client, req: &Req) -> Option<Resp> {
    let id = c.next;
    Some(match *req {
        // Its path is the service's own: src/service/resolver.rs.
        Req::CreateAh { .. } => bad(libc::EINVAL, "unexpected"),
        Req::DestroyAh { ah } => match c.ahs.remove(&ah) {
            Some(_) => Resp::Ok,
            None => bad(libc::ENOENT, "no such AH"),
        },
        // The service's own device holds the kernel membership while any QP (of any
        // client) is attached; a dead client's QPs are destroyed, which detaches them.
        Req::AttachMcast { qpn, gid, lid } => match c.qps.get(&qpn) {
            Some(q) => match q.qp.attach_mcast(&gid, lid) {
                Ok(()) => Resp::Ok,
                Err(e) => errno_resp(&e),
            },
            None => bad(libc::ENOENT, "no such QP"),
        },
        Req::DetachMcast { qpn, gid, lid } => match c.qps.get(&qpn) {
            Some(q) => match q.qp.detach_mcast(&gid, lid) {
                Ok(()) => Resp::Ok,
                Err(e) => errno_resp(&e),
            },
            None => bad(libc::ENOENT, "no such QP"),
        },
        Req::McastGroups { qpn } => match c.qps.get(&qpn) {
            Some(q) => Resp::Groups {
                gids: q.qp.mcast_groups(),
            },
            None => bad(libc::ENOENT, "no such QP"),
        },
        Req::CreateSrq { pd, attr } => {
            let Some(p) = c.pds.get(&pd) else {
                return Some(bad(libc::ENOENT, "no such PD"));
            };
            if c.srqs.len() >= lim.max_srqs {
                return Some(over("SRQs", lim.max_srqs));
            }
            // A receive carries at most MAX_SGE entries through the ring.
            if attr.max_sge as usize > ipc::MAX_SGE {
                return Some(bad(
                    libc::EINVAL,
                    "max_sge beyond what the service's ring carries",
                ));
            }
            match p.create_srq(&attr).and_then(|s| Ok((s.query()?, s))) {
                Ok((got, srq)) => {
                    c.next += 1;
                    c.srqs.insert(id, SrqEnt { srq, pd });
                    Resp::Srq { srq: id, attr: got }
                }
                Err(e) => errno_resp(&e),
            }
        }
        Req::ModifySrq { srq, attr, mask } => match c.srqs.get(&srq) {
            Some(s) => match s.srq.modify(&attr, mask) {
                Ok(()) => Resp::Ok,
                Err(e) => errno_resp(&e),
            },
            None => bad(libc::ENOENT, "no such SRQ"),
        },
        Req::QuerySrq { srq } => match c.srqs.get(&srq) {
            Some(s) => match s.srq.query() {
                Ok(a) => Resp::SrqAttr {
                    attr: a,
                    len: s.srq.len() as u32,
                },
                Err(e) => errno_resp(&e),
            },
            None => bad(libc::ENOENT, "no such SRQ"),
        },
        Req::DestroySrq { srq } => {
            if !c.srqs.contains_key(&srq) {
                return Some(bad(libc::ENOENT, "no such SRQ"));
            }
            if c.qps.values().any(|q| q.srq == Some(srq)) {
                return Some(bad(libc::EBUSY, "a QP still uses the SRQ"));
            }
            let Some(s) = c.srqs.remove(&srq) else {
                return Some(bad(libc::ENOENT, "no such SRQ"));
            };
            match s.srq.destroy() {
                Ok(()) => Resp::Ok,
                Err(e) => errno_resp(&e),
            }
        }
        _ => return None,
    })
}

/// Post a receive to client `c`'s SRQ `srq`: `None` when the handle is not its own (a
/// malformed slot), else whether the engine took it. A receive the engine refuses (the
/// SRQ is full) has no CQ to be reported on: the caller marks the slot refused in the
/// ring (`Ring::set_refused`), where the client's post, which waits for the slot to be
/// done, finds it and fails as in-process (ENOMEM through the library).
pub(super) fn post_srq_recv(c: &Client, srq: u32, wr: crate::proto::RecvWr) -> Option<bool> {
    let s = c.srqs.get(&srq)?;
    match s.srq.post_recv(wr) {
        Ok(()) => Some(true),
        Err(e) => {
            tracing::debug!(pid = c.pid, srq, "SRQ receive refused: {e}");
            Some(false)
        }
    }
}

/// The client, and its handle, of the engine's SRQ `num` (an SRQ_LIMIT_REACHED).
pub(super) fn srq_owner(clients: &mut [Client], num: u32) -> Option<(&mut Client, u32)> {
    clients.iter_mut().find_map(|c| {
        let h = *c.srqs.iter().find(|(_, s)| s.srq.srq_num() == num)?.0;
        Some((c, h))
    })
}

/// The AH of handle `ah` of client `c`.
pub(super) fn ah_of(c: &Client, ah: u32) -> Option<&Ah> {
    c.ahs.get(&ah).map(|a| &a.ah)
}

/// The client's QP's SRQ, checked: `Ok(None)` without one, an error for a handle that is
/// not the client's (ENOENT) or a QP type that takes none (UD: EOPNOTSUPP, as
/// in-process).
pub(super) fn qp_srq(
    c: &Client,
    srq: Option<u32>,
    qp_type: crate::proto::QpType,
) -> Result<Option<&Srq>, Resp> {
    let Some(h) = srq else {
        return Ok(None);
    };
    if qp_type == crate::proto::QpType::Ud {
        return Err(bad(libc::EOPNOTSUPP, "a UD QP on an SRQ"));
    }
    match c.srqs.get(&h) {
        Some(s) => Ok(Some(&s.srq)),
        None => Err(bad(libc::ENOENT, "no such SRQ")),
    }
}

/// `xrnic res`: the client's AHs and SRQs.
pub(super) fn res(c: &Client) -> (Vec<AhRes>, Vec<SrqRes>) {
    let mut ahs: Vec<AhRes> = c
        .ahs
        .iter()
        .map(|(&ah, a)| AhRes {
            ah,
            pd: a.pd,
            dgid: gid_text(&a.ah.attr().dgid),
        })
        .collect();
    ahs.sort_by_key(|a| a.ah);
    let mut srqs: Vec<SrqRes> = c
        .srqs
        .iter()
        .map(|(&srq, s)| {
            let a = s.srq.query().unwrap_or_default();
            SrqRes {
                srq,
                pd: s.pd,
                max_wr: a.max_wr,
                srq_limit: a.srq_limit,
            }
        })
        .collect();
    srqs.sort_by_key(|s| s.srq);
    (ahs, srqs)
}

fn gid_text(g: &[u8; 16]) -> String {
    let a = std::net::Ipv6Addr::from(*g);
    match a.to_ipv4_mapped() {
        Some(v4) => v4.to_string(),
        None => a.to_string(),
    }
}
