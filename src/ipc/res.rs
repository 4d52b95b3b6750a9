//! `xrnic res` through the service: the resources a client may see, and their paging.

use serde::{Deserialize, Serialize};

/// `xrnic res` through the service: the resources the asker may see, each with its
/// owner (src/service/res.rs).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ResDoc {
    pub service_pid: u32,
    pub netdev: String,
    pub clients: Vec<ClientRes>,
    /// The GSI relay's counters (src/service/gsi.rs).
    #[serde(default)]
    pub gsi: RelayCounters,
}

/// What the service's GSI relay saw (src/service/gsi.rs) (`xrnic res --json`, `gsi`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RelayCounters {
    /// MADs handed to a client.
    pub routed: u64,
    /// REQs / SIDR_REQs for a ServiceID nobody listens on (answered with a reject).
    pub unmatched: u64,
    /// MADs naming no client's connection (dropped; a DREQ is counted in
    /// `orphan_dreq` instead).
    pub unknown_id: u64,
    /// DREQs naming no client's connection, answered with a DREP.
    #[serde(default)]
    pub orphan_dreq: u64,
    /// MADs that are not CM MADs, or LAP/APR/ClassPortInfo without an owner.
    pub malformed: u64,
    /// MADs a client asked to send that were not its to send.
    pub refused: u64,
}

/// Most entries (a client, or one of its objects or listens) of one [`Resp::ResPage`](crate::ipc::Resp::ResPage):
/// its JSON stays well under the 64 KiB a client reads an answer into.
pub const RES_PAGE: usize = 256;

impl ResDoc {
    /// The [`RES_PAGE`] entries after the first `skip` (each client's entries: the
    /// client itself, then its PDs, MRs, CQs, QPs, AHs, SRQs and listens; a client some
    /// of whose entries are in the page is in it with those), and the `skip` of the next
    /// page (`None`: this was the last).
    pub fn page(&self, skip: u64, max: usize) -> (ResDoc, Option<u64>) {
        let skip = usize::try_from(skip).unwrap_or(usize::MAX);
        let mut out = ResDoc {
            service_pid: self.service_pid,
            netdev: self.netdev.clone(),
            clients: Vec::new(),
            gsi: self.gsi,
        };
        let (mut at, mut room) = (0usize, max.max(1));
        for c in &self.clients {
            let n = 1
                + c.pds.len()
                + c.mrs.len()
                + c.cqs.len()
                + c.qps.len()
                + c.ahs.len()
                + c.srqs.len()
                + c.gsi_listens.len();
            if at + n <= skip || room == 0 {
                at += n;
                continue;
            }
            let mut p = ClientRes {
                id: c.id,
                pid: c.pid,
                uid: c.uid,
                comm: c.comm.clone(),
                bad_slots: c.bad_slots,
                ..Default::default()
            };
            let from = skip.saturating_sub(at);
            // The client itself is entry 0 of its own.
            let mut i = 1usize;
            if from == 0 {
                room -= 1;
            }
            cut(&c.pds, &mut p.pds, &mut i, from, &mut room);
            cut(&c.mrs, &mut p.mrs, &mut i, from, &mut room);
            cut(&c.cqs, &mut p.cqs, &mut i, from, &mut room);
            cut(&c.qps, &mut p.qps, &mut i, from, &mut room);
            cut(&c.ahs, &mut p.ahs, &mut i, from, &mut room);
            cut(&c.srqs, &mut p.srqs, &mut i, from, &mut room);
            cut(&c.gsi_listens, &mut p.gsi_listens, &mut i, from, &mut room);
            out.clients.push(p);
            at += n;
        }
        let taken = max.max(1) - room;
        let next = skip.saturating_add(taken);
        (out, (next < at).then_some(next as u64))
    }

    /// Add a page ([`ResDoc::page`]) to what the earlier pages gave.
    pub fn merge(&mut self, page: ResDoc) {
        self.service_pid = page.service_pid;
        self.netdev = page.netdev;
        self.gsi = page.gsi;
        for p in page.clients {
            let Some(c) = self
                .clients
                .iter_mut()
                .find(|c| (c.id, c.pid) == (p.id, p.pid))
            else {
                self.clients.push(p);
                continue;
            };
            c.bad_slots = p.bad_slots;
            c.pds.extend(p.pds);
            c.mrs.extend(p.mrs);
            c.cqs.extend(p.cqs);
            c.qps.extend(p.qps);
            c.ahs.extend(p.ahs);
            c.srqs.extend(p.srqs);
            c.gsi_listens.extend(p.gsi_listens);
        }
    }
}

/// Entries `*at..` are `src`: copy those from entry `from` on into `dst`, at most `room`.
fn cut<T: Clone>(src: &[T], dst: &mut Vec<T>, at: &mut usize, from: usize, room: &mut usize) {
    let start = from.saturating_sub(*at).min(src.len());
    let n = (src.len() - start).min(*room);
    dst.extend_from_slice(&src[start..start + n]);
    *room -= n;
    *at += src.len();
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClientRes {
    /// The service's name of the connection (pages of one client are merged by it).
    #[serde(default)]
    pub id: u64,
    pub pid: i32,
    pub uid: u32,
    pub comm: String,
    pub pds: Vec<u32>,
    pub mrs: Vec<MrRes>,
    pub cqs: Vec<CqRes>,
    pub qps: Vec<QpRes>,
    #[serde(default)]
    pub ahs: Vec<AhRes>,
    #[serde(default)]
    pub srqs: Vec<SrqRes>,
    /// Ring slots the service dropped as malformed.
    pub bad_slots: u64,
    /// The ServiceIDs the client listens on through the GSI relay.
    #[serde(default)]
    pub gsi_listens: Vec<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MrRes {
    pub lkey: u32,
    pub rkey: u32,
    pub pd: u32,
    pub addr: u64,
    pub length: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CqRes {
    pub cq: u32,
    pub cqe: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct QpRes {
    pub lqpn: u32,
    pub rqpn: u32,
    pub pd: u32,
    pub state: String,
    /// "RC", "UC" or "UD" (absent from an older service: RC).
    #[serde(default)]
    pub qp_type: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AhRes {
    pub ah: u32,
    pub pd: u32,
    /// The destination GID as an address (IPv4 for a mapped GID).
    pub dgid: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SrqRes {
    pub srq: u32,
    pub pd: u32,
    pub max_wr: u32,
    pub srq_limit: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of any size put back together give the listing they came from, each page
    /// within its size (the client itself counts as an entry), the last one saying so.
    #[test]
    fn res_pages_merge_back_into_the_whole_listing() {
        let client = |id: u64, n: u32| ClientRes {
            id,
            pid: id as i32,
            uid: 7,
            comm: format!("c{id}"),
            pds: (0..n % 3).collect(),
            mrs: (0..n)
                .map(|k| MrRes {
                    lkey: k,
                    rkey: k + 1,
                    ..Default::default()
                })
                .collect(),
            cqs: (0..n / 2).map(|cq| CqRes { cq, cqe: 16 }).collect(),
            gsi_listens: vec![u64::from(n)],
            ..Default::default()
        };
        let doc = ResDoc {
            service_pid: 9,
            netdev: "eth0".into(),
            clients: vec![client(1, 0), client(2, 1000), client(3, 5), client(4, 0)],
            gsi: Default::default(),
        };
        let whole = serde_json::to_value(&doc).unwrap();
        for max in [1, 2, 7, 256, 5000] {
            let (mut got, mut skip, mut pages) = (ResDoc::default(), Some(0), 0);
            while let Some(s) = skip {
                let (page, next) = doc.page(s, max);
                let entries: usize = page
                    .clients
                    .iter()
                    .map(|c| c.pds.len() + c.mrs.len() + c.cqs.len() + c.gsi_listens.len())
                    .sum();
                assert!(entries <= max, "page of {entries} entries, max {max}");
                assert!(next.is_none_or(|n| n > s), "pages advance");
                got.merge(page);
                skip = next;
                pages += 1;
            }
            assert_eq!(serde_json::to_value(&got).unwrap(), whole, "max {max}");
            assert!(max < 5000 || pages == 1);
        }
        // Past the end: an empty last page.
        let (page, next) = doc.page(1_000_000, 10);
        assert!(page.clients.is_empty() && next.is_none());
    }
}
