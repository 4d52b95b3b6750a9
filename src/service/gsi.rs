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
//! - Every other CM MAD (REP, RTU, REJ, MRA, DREQ, DREP, LAP, APR, SIDR_REP) names in its
//!   RemoteCommID (SIDR_REP: its RequestID) an ID the receiving side chose: it goes to the
//!   client whose block holds that ID, or is dropped and counted. Except a DREQ: one that
//!   names an ID no live client holds (its client died, or it never was one) is
//!   [`Route::Orphan`], which the service answers with a DREP as an in-process CM does for
//!   a DREQ of a connection it does not know (the kernel's cm.c `cm_dreq_handler` →
//!   `cm_issue_drep`), so the peer need not resend it until its timeout. cm.c answers no
//!   other MAD of an unknown connection (an unknown REP, RTU, REJ, MRA, DREP, LAP or
//!   SIDR_REP is dropped: `cm_dup_rep_handler` and the other handlers return when
//!   `cm_acquire_id` finds nothing), so neither does the service.
//! - A MAD that does not parse as a CM MAD is dropped and counted; nothing panics.
//! - A client sends only MADs whose LocalCommID (SIDR_REQ: RequestID) is in its block
//!   (a REJ may say 0: the REJ of a REQ no one had an ID for), and SIDR_REPs only for a
//!   ServiceID it listens on ([`Relay::may_send`]).
//! - [`Relay::close`] (the client closed its connection, or died) frees its block and
//!   its listens.

use std::collections::HashMap;

use crate::wire::mad::{CmMsg, Mad};

/// Low bits of a comm ID that a client's CM chooses; the bits above are its block.
pub const BLOCK_BITS: u32 = 20;
/// Blocks: 1 .. MAX_BLOCKS (block 0 would hold comm ID 0, which no CM uses).
pub const MAX_BLOCKS: u32 = 1 << (32 - BLOCK_BITS);

/// Where a received MAD goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// To the client with this key.
    Client(u64),
    /// A REQ or SIDR_REQ for a ServiceID no one listens on: answer it as a CM with no
    /// listener does.
    Unmatched,
    /// A DREQ naming a comm ID no live client holds: answer it as a CM that does not know
    /// the connection does (a DREP, cm.c `cm_issue_drep`).
    Orphan,
    /// Dropped (counted): no client holds the ID it names, or it is not a CM MAD.
    Drop,
}

/// What the relay saw (`xrnic res --json`, `gsi`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RelayCounters {
    /// MADs handed to a client.
    pub routed: u64,
    /// REQs / SIDR_REQs for a ServiceID nobody listens on (answered with a reject).
    pub unmatched: u64,
    /// MADs naming a comm ID no client holds (dropped; a DREQ is counted in
    /// `orphan_dreq` instead).
    pub unknown_id: u64,
    /// DREQs naming a comm ID no live client holds, answered with a DREP.
    #[serde(default)]
    pub orphan_dreq: u64,
    /// MADs that are not CM MADs, or LAP/APR/ClassPortInfo without an owner.
    pub malformed: u64,
    /// MADs a client asked to send that were not its to send.
    pub refused: u64,
}

/// Which client holds which comm-ID block and which ServiceIDs.
#[derive(Debug, Default)]
pub struct Relay {
    blocks: HashMap<u64, u32>,
    listens: HashMap<u64, u64>,
    next_block: u32,
    pub counters: RelayCounters,
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

    /// `client` is gone: its block and its listens are free.
    pub fn close(&mut self, client: u64) {
        self.blocks.remove(&client);
        self.listens.retain(|_, c| *c != client);
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

    fn owner_of_id(&self, id: u32) -> Option<u64> {
        let b = id >> BLOCK_BITS;
        self.blocks.iter().find(|(_, x)| **x == b).map(|(c, _)| *c)
    }

    /// Where the received MAD `buf` goes (counted).
    pub fn route(&mut self, buf: &[u8]) -> Route {
        let Ok(mad) = Mad::parse(buf) else {
            self.counters.malformed += 1;
            return Route::Drop;
        };
        let by_id = match &mad.msg {
            CmMsg::Req(r) => return self.by_service(r.service_id),
            CmMsg::SidrReq(r) => return self.by_service(r.service_id),
            CmMsg::Rep(r) => r.remote_comm_id,
            CmMsg::Rtu(r) | CmMsg::Drep(r) => r.remote_comm_id,
            CmMsg::Rej(r) => r.remote_comm_id,
            CmMsg::Mra(r) => r.remote_comm_id,
            CmMsg::Dreq(r) => r.remote_comm_id,
            CmMsg::SidrRep(r) => r.request_id,
            CmMsg::Unsupported {
                attr,
                remote_comm_id,
                ..
            } => match attr {
                crate::wire::mad::AttrId::Lap | crate::wire::mad::AttrId::Apr => *remote_comm_id,
                _ => {
                    self.counters.malformed += 1;
                    return Route::Drop;
                }
            },
        };
        match self.owner_of_id(by_id) {
            Some(c) => {
                self.counters.routed += 1;
                Route::Client(c)
            }
            None if matches!(mad.msg, CmMsg::Dreq(_)) => {
                self.counters.orphan_dreq += 1;
                Route::Orphan
            }
            None => {
                self.counters.unknown_id += 1;
                Route::Drop
            }
        }
    }

    fn by_service(&mut self, sid: u64) -> Route {
        match self.listens.get(&sid) {
            Some(&c) => {
                self.counters.routed += 1;
                Route::Client(c)
            }
            None => {
                self.counters.unmatched += 1;
                Route::Unmatched
            }
        }
    }

    /// Whether `client` may send the MAD `buf` (counted when not).
    pub fn may_send(&mut self, client: u64, buf: &[u8]) -> bool {
        let ok = self.check_send(client, buf);
        if !ok {
            self.counters.refused += 1;
        }
        ok
    }

    fn check_send(&self, client: u64, buf: &[u8]) -> bool {
        let Some(&block) = self.blocks.get(&client) else {
            return false;
        };
        let Ok(mad) = Mad::parse(buf) else {
            return false;
        };
        let mine = |id: u32| id >> BLOCK_BITS == block;
        match &mad.msg {
            CmMsg::Req(r) => mine(r.local_comm_id),
            CmMsg::Rep(r) => mine(r.local_comm_id),
            CmMsg::Rtu(r) | CmMsg::Drep(r) => mine(r.local_comm_id),
            CmMsg::Rej(r) => r.local_comm_id == 0 || mine(r.local_comm_id),
            CmMsg::Mra(r) => mine(r.local_comm_id),
            CmMsg::Dreq(r) => mine(r.local_comm_id),
            CmMsg::SidrReq(r) => mine(r.request_id),
            CmMsg::SidrRep(r) => self.listens.get(&r.service_id) == Some(&client),
            CmMsg::Unsupported { .. } => false,
        }
    }
}

/// Source and destination GIDs of a received GRH (the 40 bytes before a UD payload):
/// for RoCE v2 over IPv4 the last 20 bytes are the IPv4 header (rxe's layout), else the
/// IPv6 header. `None` when `g` is shorter than a GRH.
pub fn grh_gids(g: &[u8]) -> Option<([u8; 16], [u8; 16])> {
    if g.len() < crate::proto::GRH_LEN {
        return None;
    }
    let mut s = [0u8; 16];
    let mut d = [0u8; 16];
    if g[20] >> 4 == 4 && g[..20] == [0u8; 20] {
        s[10] = 0xff;
        s[11] = 0xff;
        d[10] = 0xff;
        d[11] = 0xff;
        s[12..].copy_from_slice(&g[32..36]);
        d[12..].copy_from_slice(&g[36..40]);
    } else {
        s.copy_from_slice(&g[8..24]);
        d.copy_from_slice(&g[24..40]);
    }
    Some((s, d))
}

#[cfg(test)]
#[path = "gsi_tests.rs"]
mod tests;
