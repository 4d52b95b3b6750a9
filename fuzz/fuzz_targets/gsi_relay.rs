//! Fuzz target `gsi_relay`: any sequence of clients opening and closing the service's GSI
//! relay, listening, sending MADs and MADs arriving (src/service/gsi.rs) never panics,
//! and the relay keeps its promises: a MAD other than a REQ / SIDR_REQ reaches only an
//! open client, and only for a comm ID that client itself used in a MAD it was let send
//! (its own connection); a client is let send only MADs whose LocalCommID is 0 (a REJ, a
//! SIDR_REP) or in its own block.
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use xrnic::service::gsi::{BLOCK_BITS, Relay, Route};
use xrnic::wire::mad::{CmMsg, MAD_LEN, Mad};

const GIDS: [[u8; 16]; 2] = [[1; 16], [2; 16]];

/// (LocalCommID, RemoteCommID) of a CM MAD; SIDR_REQ: (RequestID, 0), SIDR_REP (0,
/// RequestID).
fn ids(m: &CmMsg) -> (u32, u32) {
    match m {
        CmMsg::Req(r) => (r.local_comm_id, 0),
        CmMsg::Rep(r) => (r.local_comm_id, r.remote_comm_id),
        CmMsg::Rtu(r) | CmMsg::Drep(r) => (r.local_comm_id, r.remote_comm_id),
        CmMsg::Rej(r) => (r.local_comm_id, r.remote_comm_id),
        CmMsg::Mra(r) => (r.local_comm_id, r.remote_comm_id),
        CmMsg::Dreq(r) => (r.local_comm_id, r.remote_comm_id),
        CmMsg::SidrReq(r) => (r.request_id, 0),
        CmMsg::SidrRep(r) => (0, r.request_id),
        CmMsg::Unsupported {
            local_comm_id,
            remote_comm_id,
            ..
        } => (*local_comm_id, *remote_comm_id),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Relay::default();
    let mut open: HashSet<u64> = HashSet::new();
    // (client, comm ID) of every MAD a client was let send with its own LocalCommID.
    let mut used: HashSet<(u64, u32)> = HashSet::new();
    let mut rest = data;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        let client = u64::from(op >> 4 & 3) + 1;
        let gid = GIDS[usize::from(op >> 6 & 1)];
        match op & 0x0f {
            0 => {
                if r.open(client).is_some() {
                    open.insert(client);
                }
            }
            1 => {
                r.close(client);
                open.remove(&client);
                used.retain(|(c, _)| *c != client);
            }
            2 | 3 => {
                let sid = u64::from(op >> 6);
                if op & 1 == 0 {
                    let _ = r.listen(client, sid);
                } else {
                    r.unlisten(client, sid);
                }
            }
            k => {
                let n = rest.len().min(MAD_LEN);
                let mut mad = [0u8; MAD_LEN];
                mad[..n].copy_from_slice(&rest[..n]);
                rest = &rest[n..];
                let parsed = Mad::parse(&mad).ok();
                if k < 10 {
                    if r.may_send(client, &gid, &mad) {
                        let m = parsed.expect("a MAD let through parses");
                        let (local, _) = ids(&m.msg);
                        let (base, span) = r.open(client).expect("an open client");
                        assert!(
                            local == 0 || (local >= base && local - base < span),
                            "client {client} sent LocalCommID {local:#x} outside {base:#x}"
                        );
                        assert_eq!(local >> BLOCK_BITS, base >> BLOCK_BITS);
                        if local != 0 {
                            used.insert((client, local));
                        }
                    }
                } else if let Route::Client(c) = r.route(&gid, &mad) {
                    assert!(open.contains(&c), "to a client that is not open");
                    let m = parsed.expect("a MAD routed parses");
                    if !matches!(m.msg, CmMsg::Req(_) | CmMsg::SidrReq(_)) {
                        let (_, remote) = ids(&m.msg);
                        assert!(
                            used.contains(&(c, remote)),
                            "{:?} for {remote:#x} to client {c}, which never used it",
                            m.msg.attr_id()
                        );
                    }
                }
            }
        }
    }
});
