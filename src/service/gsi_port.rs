//! The service's side of the GSI relay (src/service/gsi.rs): the device's GSI QP
//! (QP1, IBTA §13.5.1), made when the first client opens the relay; the requests
//! `GsiOpen`, `GsiListen`, `GsiUnlisten`, `GsiSend`, `GsiRecv`; and the round of the loop
//! that takes what QP1 received and hands each MAD to its client (its inbox, and its
//! notifier pipe written).
//!
//! A REQ or SIDR_REQ nobody listens on is given to a CM of the service's own that
//! listens on nothing: it answers as an in-process CM with no listener does (REJ
//! "invalid service ID", SIDR_REP "reject"), so a peer sees the same thing whether the
//! host runs the service or not. The same CM answers a DREQ for a comm ID no live client
//! holds ([`Route::Orphan`]): it knows no such connection either, so it sends the DREP
//! that an in-process CM sends then (src/cm/mod.rs `on_dreq`, as cm.c `cm_issue_drep`).
//! That CM takes its comm IDs in block 0, which no client gets.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use super::{Service, bad, errno_resp};
use crate::cm::{Cm, CmConfig};
use crate::ipc::{GsiMad, Req, Resp};
use crate::proto::{GRH_LEN, GSI_QKEY};
use crate::service::gsi::{self, Route};
use crate::verbs::{self, AddressVector, Ah, Cq, Mr, Pd, Qp, RecvWr, SendWr, WrOpcode};
use crate::wire::Qpn;
use crate::wire::mad::MAD_LEN;

const RECV_SLOTS: usize = 256;
const SEND_SLOTS: usize = 256;
const RECV_SLOT: usize = verbs::GSI_RECV_SLOT;
/// Most address handles QP1 keeps (one per destination GID).
const MAX_AHS: usize = 1024;
/// Most MADs waiting for one client (the oldest go first past it: a CM resends).
pub(super) const MAX_INBOX: usize = 256;

/// A client's end of the relay.
pub(super) struct GsiInbox {
    /// The write end of the client's notifier pipe.
    fd: OwnedFd,
    /// Its read end, which the service never reads: what a second `GsiOpen` gets.
    theirs: OwnedFd,
    pub mads: VecDeque<GsiMad>,
}

/// QP1 of the service's device. Fields drop in order: the QP before its CQ and PD.
pub(super) struct GsiPort {
    qp: Qp,
    ahs: HashMap<[u8; 16], Ah>,
    rmr: Mr,
    smr: Mr,
    cq: Cq,
    pd: Pd,
    next_send: usize,
    /// MADs to GIDs whose path is being resolved (src/service/resolver.rs).
    held: HashMap<[u8; 16], Vec<Vec<u8>>>,
    central: Cm,
    start: Instant,
}

impl GsiPort {
    fn open(dev: &verbs::Device) -> verbs::Result<GsiPort> {
        let verbs::GsiQueues {
            qp,
            pd,
            cq,
            rmr,
            smr,
        } = verbs::GsiQueues::open(dev, RECV_SLOTS, SEND_SLOTS)?;
        // The node GUID as the CA GUID, as the in-process CM takes it.
        let guid = verbs::node_guid(dev.mac());
        let central = Cm::new(CmConfig {
            ca_guid: guid,
            first_comm_id: 1,
            comm_ids: Some((1, (1 << gsi::BLOCK_BITS) - 1)),
            ..CmConfig::default()
        });
        Ok(GsiPort {
            qp,
            ahs: HashMap::new(),
            rmr,
            smr,
            cq,
            pd,
            next_send: 0,
            held: HashMap::new(),
            central,
            start: Instant::now(),
        })
    }

    /// The AH of QP1 to GID `to` with its path resolved (`path`), kept for the next MADs.
    fn make_ah(
        &mut self,
        dev: &verbs::Device,
        to: &[u8; 16],
        path: ([u8; 6], u8),
    ) -> verbs::Result<Ah> {
        let sgid_index = verbs::cm_sgid_index(dev, to);
        let a = self.pd.create_ah_resolved(
            &AddressVector {
                dgid: *to,
                sgid_index,
                ..AddressVector::default()
            },
            path,
        )?;
        // Clients name the destinations: the cache stays bounded (a MAD to a GID no
        // longer cached just makes its AH again).
        if self.ahs.len() >= MAX_AHS {
            self.ahs.clear();
        }
        self.ahs.insert(*to, a.clone());
        Ok(a)
    }

    /// Post one MAD from QP1 to QP1 of the port of `ah`.
    fn post(&mut self, ah: &Ah, mad: &[u8]) -> verbs::Result<()> {
        let slot = self.next_send;
        self.next_send = (slot + 1) % SEND_SLOTS;
        self.smr.write(slot * MAD_LEN, mad)?;
        let mut wr = SendWr::new(slot as u64 | 1 << 32, WrOpcode::Send);
        wr.sg_list = vec![self.smr.sge(slot * MAD_LEN, MAD_LEN as u32)];
        self.qp.post_send_ud(wr, ah, Qpn::new(1), GSI_QKEY)
    }

    fn now(&self) -> crate::proto::Instant {
        crate::proto::Instant::ZERO.saturating_add(self.start.elapsed())
    }
}

impl Service {
    /// Send `mad` from QP1 to QP1 of the port of GID `to`: at once when its path is
    /// known, else held until it resolves (src/service/resolver.rs), never waiting.
    fn gsi_send(&mut self, to: &[u8; 16], mad: &[u8]) -> Result<(), Resp> {
        let Some(p) = self.gsi.as_mut() else {
            return Err(bad(libc::EPROTO, "open the GSI relay first"));
        };
        if let Some(ah) = p.ahs.get(to).cloned() {
            return p.post(&ah, mad).map_err(|e| errno_resp(&e));
        }
        if let Some(h) = p.held.get_mut(to) {
            // A CM resends what got no answer: past the bound, the MAD is dropped.
            if h.len() < super::resolver::MAX_HELD {
                h.push(mad.to_vec());
            }
            return Ok(());
        }
        let sgid = self
            .dev
            .query_gid(usize::from(verbs::cm_sgid_index(&self.dev, to)));
        match self.dev.path_step(sgid.as_ref(), to) {
            Ok(verbs::PathStep::Ready(mac, hl)) => p
                .make_ah(&self.dev, to, (mac, hl))
                .and_then(|ah| p.post(&ah, mad))
                .map_err(|e| errno_resp(&e)),
            Ok(verbs::PathStep::Neighbour {
                ifindex,
                hop,
                hop_limit,
            }) => {
                if p.held.len() >= super::resolver::MAX_HELD_GIDS {
                    return Err(bad(libc::EAGAIN, "QP1 holds MADs for too many addresses"));
                }
                p.held.insert(*to, vec![mad.to_vec()]);
                let r = self.gsi_wait((ifindex, hop), *to, hop_limit);
                if r.is_err()
                    && let Some(p) = self.gsi.as_mut()
                {
                    p.held.remove(to);
                }
                r
            }
            Err(e) => Err(errno_resp(&e)),
        }
    }

    /// The path of `to` resolved (or not): QP1's MADs held for it go out (or are
    /// dropped: the CMs that sent them time out as when a MAD is lost).
    pub(super) fn gsi_resolved(
        &mut self,
        to: &[u8; 16],
        path: Result<([u8; 6], u8), &(i32, String)>,
    ) {
        let Some(p) = self.gsi.as_mut() else { return };
        let held = p.held.remove(to).unwrap_or_default();
        let ah = match path {
            Ok(path) => p.make_ah(&self.dev, to, path),
            Err((_, why)) => {
                tracing::debug!("GSI: {} MADs dropped: {why}", held.len());
                return;
            }
        };
        match ah {
            Ok(ah) => {
                for mad in held {
                    if let Err(e) = p.post(&ah, &mad) {
                        tracing::debug!("GSI: a held MAD not sent: {e}");
                    }
                }
            }
            Err(e) => tracing::debug!("GSI: {} MADs dropped: {e}", held.len()),
        }
    }

    /// A GSI request of client `i`, or `None` for any other request.
    pub(super) fn gsi_verb(&mut self, i: usize, req: &Req) -> Option<(Resp, Vec<OwnedFd>)> {
        let key = self.clients[i].key;
        let plain = |r| Some((r, Vec::new()));
        match req {
            Req::GsiOpen => {
                if self.gsi.is_none() {
                    match GsiPort::open(&self.dev) {
                        Ok(p) => self.gsi = Some(p),
                        Err(e) => {
                            tracing::warn!("the GSI QP: {e}");
                            return plain(errno_resp(&e));
                        }
                    }
                }
                let Some((comm_base, comm_span)) = self.relay.open(key) else {
                    return plain(bad(libc::ENOMEM, "every comm-ID block is taken"));
                };
                let c = &mut self.clients[i];
                let fd = match &c.gsi {
                    Some(g) => g.theirs.try_clone(),
                    // A pipe: the client's end is not the service's (src/io/shm.rs).
                    None => crate::io::shm::wakeup_pipe().and_then(|(r, fd)| {
                        let dup = r.try_clone()?;
                        c.gsi = Some(GsiInbox {
                            fd,
                            theirs: r,
                            mads: VecDeque::new(),
                        });
                        Ok(dup)
                    }),
                };
                match fd {
                    Ok(fd) => Some((
                        Resp::GsiOpened {
                            comm_base,
                            comm_span,
                        },
                        vec![fd],
                    )),
                    Err(e) => plain(bad(libc::EMFILE, &e.to_string())),
                }
            }
            Req::GsiListen { service_id } => match self.relay.listen(key, *service_id) {
                Ok(()) => plain(Resp::Ok),
                Err(errno) if errno == libc::EADDRINUSE => plain(bad(
                    errno,
                    &format!("service ID {service_id:#x} has a listener already"),
                )),
                Err(errno) => plain(bad(errno, "open the GSI relay first")),
            },
            Req::GsiUnlisten { service_id } => {
                self.relay.unlisten(key, *service_id);
                plain(Resp::Ok)
            }
            Req::GsiSend { to, mad } => {
                if mad.len() != MAD_LEN || !self.relay.may_send(key, to, mad) {
                    return plain(bad(
                        libc::EPERM,
                        "not a CM MAD of this client's comm IDs or listens",
                    ));
                }
                match self.gsi_send(to, mad) {
                    Ok(()) => plain(Resp::Ok),
                    Err(r) => plain(r),
                }
            }
            Req::GsiRecv => {
                let c = &mut self.clients[i];
                let Some(g) = c.gsi.as_mut() else {
                    return plain(bad(libc::EPROTO, "open the GSI relay first"));
                };
                let n = g.mads.len().min(crate::ipc::GSI_MADS_PER_ANSWER);
                let mads: Vec<GsiMad> = g.mads.drain(..n).collect();
                if !g.mads.is_empty() {
                    // More than one answer holds: the client comes back.
                    let _ = crate::io::shm::wake(g.fd.as_fd());
                }
                plain(Resp::GsiMads { mads })
            }
            _ => None,
        }
    }

    /// Hand what QP1 received to the clients (see the module comment); answer what no
    /// one listens on.
    pub(super) fn pump_gsi(&mut self) {
        let Some(p) = self.gsi.as_mut() else { return };
        let mut wcs = Vec::new();
        let mut buf = vec![0u8; RECV_SLOT];
        let mut woken: Vec<u64> = Vec::new();
        loop {
            wcs.clear();
            if p.cq.take_into(64, &mut wcs) == 0 {
                break;
            }
            for w in &wcs {
                if w.wr_id >> 32 != 0 {
                    continue; // a send completion
                }
                let slot = w.wr_id as usize;
                let got = w.status == verbs::WcStatus::Success
                    && w.byte_len as usize >= RECV_SLOT
                    && p.rmr.read(slot * RECV_SLOT, &mut buf).is_ok();
                let _ = p.qp.post_recv(RecvWr {
                    wr_id: slot as u64,
                    sg_list: vec![p.rmr.sge(slot * RECV_SLOT, RECV_SLOT as u32)],
                });
                let Some((from, to)) = got
                    .then(|| crate::proto::ud::grh_gids(&buf[..GRH_LEN]))
                    .flatten()
                else {
                    self.relay.counters.malformed += 1;
                    continue;
                };
                let mad = &buf[GRH_LEN..];
                match self.relay.route(&from, mad) {
                    Route::Client(key) => {
                        let Some(g) = self
                            .clients
                            .iter_mut()
                            .find(|c| c.key == key)
                            .and_then(|c| c.gsi.as_mut())
                        else {
                            continue;
                        };
                        if g.mads.len() >= MAX_INBOX {
                            g.mads.pop_front();
                        }
                        g.mads.push_back(GsiMad {
                            from,
                            to,
                            mad: mad.to_vec(),
                        });
                        if !woken.contains(&key) {
                            woken.push(key);
                        }
                    }
                    Route::Unmatched | Route::Orphan => {
                        let now = p.now();
                        p.central.handle_mad(now, from, to, mad);
                    }
                    Route::Drop => {}
                }
            }
        }
        let now = p.now();
        p.central.handle_timeout(now);
        let mut out = Vec::new();
        while let Some(t) = p.central.poll_transmit() {
            out.push(t);
        }
        while p.central.poll_event().is_some() {}
        for t in out {
            if let Err(r) = self.gsi_send(&t.to, &t.mad) {
                tracing::debug!("GSI: the answer to an unmatched MAD not sent: {r:?}");
            }
        }
        for c in self.clients.iter().filter(|c| woken.contains(&c.key)) {
            if let Some(g) = &c.gsi {
                let _ = crate::io::shm::wake(g.fd.as_fd());
            }
        }
    }
}
