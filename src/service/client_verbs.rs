//! A client's verbs on its own objects, one function per object family: PDs and MRs
//! ([`pd_mr_verb`]), CQs ([`cq_verb`]) and QPs ([`qp_verb`]); AHs, SRQs and multicast
//! are `super::super::objects`, the GSI relay `gsi_port.rs`, the verbs that name an
//! address `resolver.rs`. Each looks up only the client's own handles and keeps to
//! its caps ([`Limits`]).

use std::os::fd::OwnedFd;

use super::{Client, CqEnt, Limits, MrEnt, QpEnt, bad, errno_resp, fd_errno, over, res};
use crate::io::shm::{self, Ring};
use crate::ipc::{self, Req, Resp};
use crate::verbs::{self, Access, Device, QpInitAttr};

/// A verb's answer, possibly with descriptors (create_cq).
pub(super) enum Answer {
    Plain(Resp),
    Fds(Resp, Vec<OwnedFd>),
}

/// Client `c`'s verb `req` (after hello, not one of the GSI relay's): each family's
/// function answers its own verbs.
pub(super) fn client_verb(dev: &Device, lim: &Limits, c: &mut Client, req: Req) -> Answer {
    use Answer::Plain;
    if let Some(r) = crate::service::objects::verb(lim, c, &req) {
        return Plain(r);
    }
    match req {
        Req::AllocPd | Req::DeallocPd { .. } | Req::RegMr { .. } | Req::DeregMr { .. } => {
            Plain(pd_mr_verb(dev, lim, c, &req))
        }
        Req::CreateCq { .. } | Req::DestroyCq { .. } | Req::ResizeCq { .. } => {
            cq_verb(dev, lim, c, &req)
        }
        Req::CreateQp { .. }
        | Req::ModifyQp { .. }
        | Req::QueryQp { .. }
        | Req::DestroyQp { .. } => Plain(qp_verb(lim, c, &req)),
        Req::AsyncEvents => Plain({
            let (events, elements) = c.events.drain(..).unzip();
            Resp::AsyncEvents { events, elements }
        }),
        // AH and SRQ verbs were answered by `objects::verb` above.
        Req::Hello { .. }
        | Req::Res
        | Req::ResPage { .. }
        | Req::Shutdown
        | Req::CreateAh { .. }
        | Req::DestroyAh { .. }
        | Req::AttachMcast { .. }
        | Req::DetachMcast { .. }
        | Req::McastGroups { .. }
        | Req::CreateSrq { .. }
        | Req::ModifySrq { .. }
        | Req::QuerySrq { .. }
        | Req::DestroySrq { .. }
        | Req::GsiOpen
        | Req::GsiListen { .. }
        | Req::GsiUnlisten { .. }
        | Req::GsiSend { .. }
        | Req::GsiRecv => Plain(bad(libc::EINVAL, "unexpected")),
    }
}

/// AllocPd, DeallocPd (EBUSY while anything of the client's is on the PD), RegMr (over
/// the client's own memory, within its MR caps) and DeregMr.
fn pd_mr_verb(dev: &Device, lim: &Limits, c: &mut Client, req: &Req) -> Resp {
    let id = c.next;
    match *req {
        Req::AllocPd if c.pds.len() >= lim.max_pds => over("PDs", lim.max_pds),
        Req::AllocPd => match dev.alloc_pd() {
            Ok(pd) => {
                c.next += 1;
                c.pds.insert(id, pd);
                Resp::Pd { pd: id }
            }
            Err(e) => errno_resp(&e),
        },
        Req::DeallocPd { pd } => {
            if !c.pds.contains_key(&pd) {
                return bad(libc::ENOENT, "no such PD");
            }
            if c.mrs.values().any(|m| m.pd == pd)
                || c.qps.values().any(|q| q.pd == pd)
                || c.ahs.values().any(|a| a.pd == pd)
                || c.srqs.values().any(|s| s.pd == pd)
            {
                return bad(libc::EBUSY, "the PD still has MRs, QPs, AHs or SRQs");
            }
            c.pds.remove(&pd);
            Resp::Ok
        }
        Req::RegMr {
            pd,
            addr,
            len,
            iova,
            access,
        } => {
            let Some(p) = c.pds.get(&pd) else {
                return bad(libc::ENOENT, "no such PD");
            };
            let Some(space) = &c.mem else {
                return bad(libc::EPROTO, "say hello first");
            };
            let Ok(len_us) = usize::try_from(len) else {
                return bad(libc::EINVAL, "length");
            };
            if c.mrs.len() >= lim.max_mrs {
                return over("MRs", lim.max_mrs);
            }
            if c.mr_bytes.saturating_add(len) > lim.max_mr_bytes {
                return over("registered bytes", lim.max_mr_bytes);
            }
            match p.reg_process_mr(space, addr, len_us, iova, Access(access)) {
                Ok(mr) => {
                    c.mr_bytes += len;
                    let (lkey, rkey) = (mr.lkey().0, mr.rkey().0);
                    c.mrs.insert(
                        lkey,
                        MrEnt {
                            mr,
                            pd,
                            addr: iova,
                            len,
                        },
                    );
                    Resp::Mr { lkey, rkey }
                }
                Err(e) => errno_resp(&e),
            }
        }
        Req::DeregMr { lkey } => match c.mrs.remove(&lkey) {
            Some(m) => {
                c.mr_bytes -= m.len;
                Resp::Ok
            }
            None => bad(libc::ENOENT, "no such MR"),
        },
        _ => bad(libc::EINVAL, "unexpected"),
    }
}

/// CreateCq (the engine's CQ, its completion ring and event pipe, within the client's
/// CQ caps; answered with the ring's memfd and the pipe's read end) and DestroyCq
/// (EBUSY while a QP uses it).
fn cq_verb(dev: &Device, lim: &Limits, c: &mut Client, req: &Req) -> Answer {
    use Answer::Plain;
    match *req {
        Req::CreateCq { cqe } => {
            if cqe == 0 || cqe > crate::verbs::MAX_CQE {
                return Plain(bad(libc::EINVAL, "cqe"));
            }
            let slots = cqe.next_power_of_two().max(16);
            if c.cqs.len() >= lim.max_cqs {
                return Plain(over("CQs", lim.max_cqs));
            }
            if c.cq_slots + u64::from(slots) > lim.max_cq_slots {
                return Plain(over("completion ring slots", lim.max_cq_slots));
            }
            let made = dev
                .create_cq(cqe as usize)
                .map_err(|e| errno_resp(&e))
                .and_then(|cq| {
                    let ring = Ring::create("xrnic-cq", slots, ipc::CQ_SLOT_BYTES)
                        .map_err(|e| bad(fd_errno(&e), &e.to_string()))?;
                    // The CQ's event: a pipe whose read end is the client's (shm.rs).
                    let (event_r, event) =
                        shm::wakeup_pipe().map_err(|e| bad(fd_errno(&e), &e.to_string()))?;
                    let ring_fd = ring
                        .fd()
                        .try_clone_to_owned()
                        .map_err(|e| bad(fd_errno(&e), &e.to_string()))?;
                    Ok((cq, ring, event, vec![ring_fd, event_r]))
                });
            match made {
                Ok((cq, ring, event, fds)) => {
                    let id = c.next;
                    c.next += 1;
                    c.cq_slots += u64::from(slots);
                    c.cqs.insert(
                        id,
                        CqEnt {
                            cq,
                            ring,
                            event,
                            cqe,
                        },
                    );
                    Answer::Fds(Resp::Cq { cq: id, slots }, fds)
                }
                Err(r) => Plain(r),
            }
        }
        Req::ResizeCq { cq, cqe } => {
            if cqe == 0 || cqe > crate::verbs::MAX_CQE {
                return Plain(bad(libc::EINVAL, "cqe"));
            }
            let Some(e) = c.cqs.get_mut(&cq) else {
                return Plain(bad(libc::EINVAL, "no such CQ"));
            };
            // The completions queued are those in the client's ring and those the
            // engine's CQ still holds: fewer slots than that is EINVAL, as rxe's
            // `rxe_cq_chk_attr`. The ring keeps its slots; the engine's CQ holds what
            // does not fit there until the client makes room (`pump_completions`).
            let queued = e.ring.fill() as usize + e.cq.pending().unwrap_or(0);
            if (cqe as usize) < queued {
                return Plain(bad(libc::EINVAL, "cqe below the completions queued"));
            }
            match e.cq.resize(cqe as usize) {
                Ok(()) => {
                    e.cqe = cqe;
                    Plain(Resp::Ok)
                }
                Err(err) => Plain(errno_resp(&err)),
            }
        }
        Req::DestroyCq { cq } => {
            if c.qps.values().any(|q| q.send_cq == cq || q.recv_cq == cq) {
                return Plain(bad(libc::EBUSY, "a QP still uses the CQ"));
            }
            match c.cqs.remove(&cq) {
                Some(e) => {
                    c.cq_slots -= u64::from(e.ring.capacity());
                    Plain(Resp::Ok)
                }
                None => Plain(bad(libc::ENOENT, "no such CQ")),
            }
        }
        _ => Plain(bad(libc::EINVAL, "unexpected")),
    }
}

/// CreateQp (RC, UC or UD, on the client's PD, CQs and SRQ, within its QP cap),
/// ModifyQp (no address vector: that is `resolver.rs`; a controlled Q_Key only with
/// CAP_NET_RAW), QueryQp and DestroyQp.
fn qp_verb(lim: &Limits, c: &mut Client, req: &Req) -> Resp {
    match *req {
        Req::CreateQp {
            pd,
            send_cq,
            recv_cq,
            max_send_wr,
            max_recv_wr,
            sq_sig_all,
            qp_type,
            srq,
        } => {
            let (Some(p), Some(s), Some(r)) =
                (c.pds.get(&pd), c.cqs.get(&send_cq), c.cqs.get(&recv_cq))
            else {
                return bad(libc::ENOENT, "no such PD or CQ");
            };
            let on_srq = match crate::service::objects::qp_srq(c, srq, qp_type) {
                Ok(x) => x,
                Err(r) => return r,
            };
            if c.qps.len() >= lim.max_qps {
                return over("QPs", lim.max_qps);
            }
            let mut init = QpInitAttr::new(&s.cq, &r.cq, max_send_wr);
            init.max_recv_wr = max_recv_wr;
            init.sq_sig_all = sq_sig_all;
            let made = match qp_type {
                crate::proto::QpType::Ud => p.create_ud_qp(&init),
                t => p.create_qp_ext(&init, t, on_srq),
            };
            match made {
                Ok(qp) => {
                    let qpn = qp.qp_num().value();
                    c.qps.insert(
                        qpn,
                        QpEnt {
                            qp,
                            pd,
                            send_cq,
                            recv_cq,
                            srq,
                            qp_type,
                        },
                    );
                    Resp::Qp { qpn }
                }
                Err(e) => errno_resp(&e),
            }
        }
        Req::ModifyQp { qpn, attr, mask } => {
            let Some(q) = c.qps.get(&qpn) else {
                return bad(libc::ENOENT, "no such QP");
            };
            // An address vector's path is the service's own (resolver.rs): never here.
            if mask.contains(verbs::AttrMask::AV) {
                return bad(libc::EINVAL, "unexpected");
            }
            // A controlled Q_Key (high-order bit set, IBTA vol. 1 §3.5.3, e.g. QP1's
            // 0x80010000) is not the consumer's to choose: the kernel refuses it to a
            // process without CAP_NET_RAW (uverbs `modify_qp`, EPERM). Here it would
            // also let a UD QP speak CM to QP1 past the GSI relay's checks (gsi.rs).
            if mask.contains(verbs::AttrMask::QKEY)
                && attr.qkey & 0x8000_0000 != 0
                && !res::has_cap(c.pid, c.uid, res::CAP_NET_RAW)
            {
                return bad(
                    libc::EPERM,
                    "a controlled Q_Key (high-order bit set) needs CAP_NET_RAW",
                );
            }
            match q.qp.modify(&attr, mask) {
                Ok(()) => Resp::Ok,
                Err(e) => errno_resp(&e),
            }
        }
        Req::QueryQp { qpn } => match c.qps.get(&qpn).map(|q| q.qp.query()) {
            Some(Ok(attr)) => Resp::QpAttr { attr },
            Some(Err(e)) => errno_resp(&e),
            None => bad(libc::ENOENT, "no such QP"),
        },
        Req::DestroyQp { qpn } => match c.qps.remove(&qpn) {
            Some(_) => Resp::Ok,
            None => bad(libc::ENOENT, "no such QP"),
        },
        _ => bad(libc::EINVAL, "unexpected"),
    }
}
