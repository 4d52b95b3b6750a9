//! The service's GSI relay: the device's GSI QP (QP1) is the service's, and the CM MADs
//! it receives are handed to the clients whose `xrnic::cm::Cm` they are for, as the
//! kernel's ib_cm demultiplexes them among its consumers (IBTA vol. 1 §12.6,
//! docs/rnic.md "rdma_cm through the service"). This part is sans-IO: which client a MAD
//! goes to, and what a client may send; src/service/server.rs moves the MADs.
//!
//! Contract:
//! - A client that opens the relay ([`Relay::open`]) gets a block of local
//!   communication IDs of its own, `block << BLOCK_BITS ..` ([`BLOCK_BITS`] low bits),
//!   and its CM takes its IDs only there (`CmConfig::comm_ids`).
//! - A REQ or SIDR_REQ goes by its ServiceID to the client that listens on it
//!   ([`Relay::listen`]; a second listen on the same ID, by anyone, is EADDRINUSE, as
//!   rdma_listen says). Nobody listening: [`Route::Unmatched`], which the service answers
//!   as an in-process CM does (a CM with no listener: REJ "invalid service ID", a
//!   SIDR_REP "reject").
//! - The relay learns from the MADs it carries which connections each client takes part
//!   in: `(local comm ID, remote comm ID, peer GID)`. A client's REQ (SIDR_REQ) starts one
//!   with the remote ID unknown; a REQ (SIDR_REQ) handed to a client is an offer, which
//!   its MRA, REP or REJ (SIDR_REP) answers; the remote ID is learnt from the first REP
//!   or MRA that answers a REQ; a DREP, a REJ or a SIDR_REP ends it. The kernel's cm.c
//!   finds a connection by both comm IDs (`cm_acquire_id(local_id, remote_id)`); the
//!   relay also checks the peer's GID.
//! - Every other CM MAD received (REP, RTU, REJ, MRA, DREQ, DREP, LAP, APR, SIDR_REP) goes
//!   to a client only when it names one of that client's connections exactly: its
//!   RemoteCommID (SIDR_REP: RequestID) the client's ID, its LocalCommID the peer's ID
//!   the relay learnt (or may learn: a REP or MRA of a REQ, a REJ of a REQ), and its
//!   sender the peer. Anything else is dropped and counted, except a DREQ: one that
//!   names no connection exactly, whether or not the ID it names is a client's, is
//!   [`Route::Orphan`], which the service answers with a DREP as an in-process CM does for
//!   a DREQ of a connection it does not know (the kernel's cm.c `cm_dreq_handler` →
//!   `cm_issue_drep`). So a DREQ naming another client's connection is answered exactly
//!   as one naming no connection, and that connection is not touched: no answer tells
//!   whether another client's connection exists. cm.c answers no other MAD of an unknown
//!   connection (an unknown REP, RTU, REJ, MRA, DREP, LAP or SIDR_REP is dropped:
//!   `cm_dup_rep_handler` and the other handlers return when `cm_acquire_id` finds
//!   nothing), so neither does the service.
//! - A MAD that does not parse as a CM MAD is dropped and counted; nothing panics.
//! - A client sends ([`Relay::may_send`]) a REQ or SIDR_REQ only from an ID of its block;
//!   an MRA, REP or REJ only for one of its connections or for an offer it holds (to
//!   that peer, naming the peer's ID); an RTU, DREQ or DREP only for one of its
//!   connections whose remote ID is known, with both IDs and the peer; a SIDR_REP only
//!   for an offer it holds, on a ServiceID it listens on. A REJ with LocalCommID 0 (a
//!   CM that has no ID for the REQ it rejects: cm.c `cm_match_req` → `cm_issue_rej`) only
//!   for an offer it holds. LAP and APR are not sent.
//! - Each client keeps at most [`MAX_CONNS`] connections and [`MAX_OFFERS`] offers in
//!   the relay (the oldest are forgotten past that: a client that never ends its
//!   connections forgets its own, no one else's).
//! - [`Relay::close`] (the client closed its connection, or died) frees its block, its
//!   listens, its connections and its offers.

use std::collections::HashMap;

use crate::wire::mad::{AttrId, CmMsg, Mad, MsgRef};

/// Low bits of a comm ID that a client's CM chooses; the bits above are its block.
pub const BLOCK_BITS: u32 = 20;
/// Blocks: 1 .. MAX_BLOCKS (block 0 would hold comm ID 0, which no CM uses).
pub const MAX_BLOCKS: u32 = 1 << (32 - BLOCK_BITS);
/// Most connections the relay keeps for one client.
pub const MAX_CONNS: usize = 4096;
/// Most unanswered REQs / SIDR_REQs the relay keeps for one client.
pub const MAX_OFFERS: usize = 1024;

/// Where a received MAD goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// To the client with this key.
    Client(u64),
    /// A REQ or SIDR_REQ for a ServiceID no one listens on: answer it as a CM with no
    /// listener does.
    Unmatched,
    /// A DREQ naming no client's connection exactly: answer it as a CM that does not know
    /// the connection does (a DREP, cm.c `cm_issue_drep`).
    Orphan,
    /// Dropped (counted): it names no client's connection, or it is not a CM MAD.
    Drop,
}

pub use crate::ipc::RelayCounters;

/// One connection of a client, as the relay learnt it.
#[derive(Clone, Copy, Debug)]
struct Link {
    client: u64,
    /// The peer's comm ID; 0 until its REP or MRA (a CM never takes ID 0).
    remote: u32,
    peer: [u8; 16],
    /// A SIDR_REQ's (its SIDR_REP ends it).
    sidr: bool,
    /// Age, for forgetting the oldest past [`MAX_CONNS`].
    seq: u64,
}

/// A client's links and offers in the order they came (for forgetting the oldest).
#[derive(Debug, Default)]
struct Ages {
    links: usize,
    link_order: std::collections::VecDeque<(u32, u64)>,
    offers: usize,
    offer_order: std::collections::VecDeque<(([u8; 16], u32), u64)>,
}

/// Which client holds which comm-ID block, which ServiceIDs and which connections.
#[derive(Debug, Default)]
pub struct Relay {
    blocks: HashMap<u64, u32>,
    listens: HashMap<u64, u64>,
    /// By the client's (local) comm ID.
    links: HashMap<u32, Link>,
    /// REQs / SIDR_REQs handed to a client and not yet answered, by (peer GID, the
    /// peer's ID): the client and the age.
    offers: HashMap<([u8; 16], u32), (u64, u64)>,
    /// Per client: its links and offers, each with its age, oldest first (entries whose
    /// link or offer went, or was renewed, are skipped and compacted away).
    ages: HashMap<u64, Ages>,
    seq: u64,
    next_block: u32,
    pub counters: RelayCounters,
}

/// The fields of a CM MAD that name a connection: (LocalCommID, RemoteCommID) as the
/// sender wrote them.
fn ids(msg: &CmMsg) -> Option<(u32, u32)> {
    Some(match msg {
        CmMsg::Req(r) => (r.local_comm_id, 0),
        CmMsg::Rep(r) => (r.local_comm_id, r.remote_comm_id),
        CmMsg::Rtu(r) | CmMsg::Drep(r) => (r.local_comm_id, r.remote_comm_id),
        CmMsg::Rej(r) => (r.local_comm_id, r.remote_comm_id),
        CmMsg::Mra(r) => (r.local_comm_id, r.remote_comm_id),
        CmMsg::Dreq(r) => (r.local_comm_id, r.remote_comm_id),
        CmMsg::SidrReq(r) => (r.request_id, 0),
        CmMsg::SidrRep(r) => (0, r.request_id),
        CmMsg::Unsupported {
            attr: AttrId::Lap | AttrId::Apr,
            local_comm_id,
            remote_comm_id,
        } => (*local_comm_id, *remote_comm_id),
        CmMsg::Unsupported { .. } => return None,
    })
}

/// Whether the message answers a REQ (an MRA of the REQ, a REP, a REJ of the REQ): the
/// one kind that may name a connection whose remote ID is not known yet.
fn answers_req(msg: &CmMsg) -> bool {
    match msg {
        CmMsg::Rep(_) => true,
        CmMsg::Mra(m) => m.message_mraed == MsgRef::Req,
        CmMsg::Rej(r) => r.message_rejected == MsgRef::Req,
        _ => false,
    }
}

impl Relay {
    /// The comm-ID range `(base, span)` of `client`, giving it a block on its first
    /// open; `None` when every block is taken.
    pub fn open(&mut self, client: u64) -> Option<(u32, u32)> {
        if let Some(b) = self.blocks.get(&client) {
            return Some((b << BLOCK_BITS, 1 << BLOCK_BITS));
        }
        let taken: std::collections::HashSet<u32> = self.blocks.values().copied().collect();
        // The next free block after the last one given (so that a block just freed is not
        // given again at once: MADs for the dead client's IDs may still be in flight).
        let b = (1..MAX_BLOCKS)
            .map(|i| (self.next_block + i - 1) % (MAX_BLOCKS - 1) + 1)
            .find(|b| !taken.contains(b))?;
        self.next_block = b;
        self.blocks.insert(client, b);
        Some((b << BLOCK_BITS, 1 << BLOCK_BITS))
    }

    /// Whether `client` opened the relay.
    pub fn is_open(&self, client: u64) -> bool {
        self.blocks.contains_key(&client)
    }

    /// `client` listens on `service_id`: an errno when it did not open the relay
    /// (EPROTO) or someone listens there already (EADDRINUSE).
    pub fn listen(&mut self, client: u64, service_id: u64) -> Result<(), i32> {
        if !self.is_open(client) {
            return Err(libc::EPROTO);
        }
        if self.listens.contains_key(&service_id) {
            return Err(libc::EADDRINUSE);
        }
        self.listens.insert(service_id, client);
        Ok(())
    }

    /// `client` stops listening on `service_id` (nothing if it did not listen there).
    pub fn unlisten(&mut self, client: u64, service_id: u64) {
        if self.listens.get(&service_id) == Some(&client) {
            self.listens.remove(&service_id);
        }
    }

    /// `client` is gone: its block, listens, connections and offers are free.
    pub fn close(&mut self, client: u64) {
        self.blocks.remove(&client);
        self.listens.retain(|_, c| *c != client);
        self.links.retain(|_, l| l.client != client);
        self.offers.retain(|_, (c, _)| *c != client);
        self.ages.remove(&client);
    }

    /// The ServiceIDs `client` listens on.
    pub fn listens_of(&self, client: u64) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .listens
            .iter()
            .filter(|(_, c)| **c == client)
            .map(|(s, _)| *s)
            .collect();
        v.sort();
        v
    }

    /// How many connections the relay knows for `client` (the tests).
    pub fn links_of(&self, client: u64) -> usize {
        self.ages.get(&client).map_or(0, |a| a.links)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Learn (or renew) connection `local` of `client`, forgetting the client's oldest
    /// past [`MAX_CONNS`].
    fn learn(&mut self, client: u64, local: u32, remote: u32, peer: [u8; 16], sidr: bool) {
        let seq = self.next_seq();
        let link = Link {
            client,
            remote,
            peer,
            sidr,
            seq,
        };
        let fresh = self.links.insert(local, link).is_none();
        let ages = self.ages.entry(client).or_default();
        ages.links += usize::from(fresh);
        ages.link_order.push_back((local, seq));
        while ages.links > MAX_CONNS {
            let Some((k, s)) = ages.link_order.pop_front() else {
                break;
            };
            if self.links.get(&k).is_some_and(|l| l.seq == s) {
                self.links.remove(&k);
                ages.links -= 1;
            }
        }
        if ages.link_order.len() > 2 * MAX_CONNS {
            let links = &self.links;
            ages.link_order
                .retain(|(k, s)| links.get(k).is_some_and(|l| l.seq == *s));
        }
    }

    /// Forget connection `local` (its client's).
    fn unlink(&mut self, local: u32) {
        let Some(l) = self.links.remove(&local) else {
            return;
        };
        if let Some(a) = self.ages.get_mut(&l.client) {
            a.links -= 1;
        }
    }

    /// A REQ / SIDR_REQ from `peer` (its ID `remote`) was handed to `client`; the
    /// client's oldest offers are forgotten past [`MAX_OFFERS`].
    fn offer(&mut self, client: u64, peer: [u8; 16], remote: u32) {
        let seq = self.next_seq();
        let key = (peer, remote);
        if let Some(a) =
            (self.offers.insert(key, (client, seq))).and_then(|(old, _)| self.ages.get_mut(&old))
        {
            a.offers -= 1;
        }
        let ages = self.ages.entry(client).or_default();
        ages.offers += 1;
        ages.offer_order.push_back((key, seq));
        while ages.offers > MAX_OFFERS {
            let Some((k, s)) = ages.offer_order.pop_front() else {
                break;
            };
            if self.offers.get(&k).is_some_and(|o| *o == (client, s)) {
                self.offers.remove(&k);
                ages.offers -= 1;
            }
        }
        if ages.offer_order.len() > 2 * MAX_OFFERS {
            let offers = &self.offers;
            ages.offer_order
                .retain(|(k, s)| offers.get(k).is_some_and(|o| *o == (client, *s)));
        }
    }

    /// Forget the offer `(peer, remote)`.
    fn unoffer(&mut self, peer: [u8; 16], remote: u32) {
        if let Some(a) =
            (self.offers.remove(&(peer, remote))).and_then(|(c, _)| self.ages.get_mut(&c))
        {
            a.offers -= 1;
        }
    }

    /// Where the MAD `buf`, received from the port of GID `from`, goes (counted).
    pub fn route(&mut self, from: &[u8; 16], buf: &[u8]) -> Route {
        let Ok(mad) = Mad::parse(buf) else {
            self.counters.malformed += 1;
            return Route::Drop;
        };
        let Some((theirs, mine)) = ids(&mad.msg) else {
            self.counters.malformed += 1;
            return Route::Drop;
        };
        match &mad.msg {
            CmMsg::Req(r) => return self.by_service(r.service_id, from, theirs),
            CmMsg::SidrReq(r) => return self.by_service(r.service_id, from, theirs),
            _ => {}
        }
        let sidr = matches!(mad.msg, CmMsg::SidrRep(_));
        let hit = self.links.get(&mine).copied().filter(|l| {
            l.peer == *from
                && l.sidr == sidr
                && (sidr
                    || l.remote == theirs && theirs != 0
                    || l.remote == 0 && answers_req(&mad.msg))
        });
        let Some(l) = hit else {
            if matches!(mad.msg, CmMsg::Dreq(_)) {
                self.counters.orphan_dreq += 1;
                return Route::Orphan;
            }
            self.counters.unknown_id += 1;
            return Route::Drop;
        };
        match &mad.msg {
            // The peer's ID, from the first answer that carries it.
            CmMsg::Rep(_) | CmMsg::Mra(_) if l.remote == 0 => {
                if let Some(x) = self.links.get_mut(&mine) {
                    x.remote = theirs;
                }
            }
            // The connection ends.
            CmMsg::Rej(_) | CmMsg::Drep(_) | CmMsg::SidrRep(_) => {
                self.unlink(mine);
            }
            _ => {}
        }
        self.counters.routed += 1;
        Route::Client(l.client)
    }

    fn by_service(&mut self, sid: u64, from: &[u8; 16], theirs: u32) -> Route {
        match self.listens.get(&sid) {
            Some(&c) => {
                self.offer(c, *from, theirs);
                self.counters.routed += 1;
                Route::Client(c)
            }
            None => {
                self.counters.unmatched += 1;
                Route::Unmatched
            }
        }
    }

    /// Whether `client` may send the MAD `buf` to the port of GID `to` (counted when
    /// not); what it sends teaches the relay its connections.
    pub fn may_send(&mut self, client: u64, to: &[u8; 16], buf: &[u8]) -> bool {
        let ok = self.check_send(client, to, buf);
        if !ok {
            self.counters.refused += 1;
        }
        ok
    }

    fn check_send(&mut self, client: u64, to: &[u8; 16], buf: &[u8]) -> bool {
        let Some(&block) = self.blocks.get(&client) else {
            return false;
        };
        let Ok(mad) = Mad::parse(buf) else {
            return false;
        };
        let Some((local, remote)) = ids(&mad.msg) else {
            return false;
        };
        let in_block = |id: u32| id >> BLOCK_BITS == block;
        let offered = self.offers.get(&(*to, remote)).map(|(c, _)| *c) == Some(client);
        let link = self
            .links
            .get(&local)
            .copied()
            .filter(|l| l.client == client && l.peer == *to);
        match &mad.msg {
            CmMsg::Req(_) | CmMsg::SidrReq(_) => {
                if !in_block(local) {
                    return false;
                }
                let sidr = matches!(mad.msg, CmMsg::SidrReq(_));
                // A resent REQ keeps what the relay learnt of its connection.
                let remote = link.filter(|l| l.sidr == sidr).map_or(0, |l| l.remote);
                self.learn(client, local, remote, *to, sidr);
                true
            }
            CmMsg::Mra(_) | CmMsg::Rep(_) => {
                let known = link.is_some_and(|l| !l.sidr && l.remote == remote && remote != 0);
                if !in_block(local) || !(known || offered) {
                    return false;
                }
                self.unoffer(*to, remote);
                self.learn(client, local, remote, *to, false);
                true
            }
            CmMsg::Rej(_) => {
                // Its own connection (the remote ID as far as it is known), or the answer
                // to an offer, with its own ID or none (0).
                let known = link.is_some_and(|l| !l.sidr && l.remote == remote);
                let ok = if local == 0 {
                    offered
                } else {
                    in_block(local) && (known || offered)
                };
                if ok {
                    self.unoffer(*to, remote);
                    if local != 0 {
                        self.unlink(local);
                    }
                }
                ok
            }
            CmMsg::Rtu(_) | CmMsg::Dreq(_) | CmMsg::Drep(_) => {
                let ok = link.is_some_and(|l| !l.sidr && l.remote == remote && remote != 0);
                if ok && matches!(mad.msg, CmMsg::Drep(_)) {
                    self.unlink(local);
                }
                ok
            }
            CmMsg::SidrRep(r) => {
                let ok = offered && self.listens.get(&r.service_id) == Some(&client);
                if ok {
                    self.unoffer(*to, remote);
                }
                ok
            }
            CmMsg::Unsupported { .. } => false,
        }
    }
}

#[cfg(test)]
#[path = "gsi_tests.rs"]
mod tests;
