//! `xrnic explain FILE`: what the RDMA conversations of a capture did, per QP pair, as a
//! text ladder diagram (or an SVG sequence diagram) with a summary.
//!
//! Contract:
//! - Input is any pcap/pcapng (read with [`crate::io::capture`]); each RoCE packet is decoded
//!   with [`super::decode::decode_frame`]. Packets that do not parse are counted
//!   (`malformed`) and left out of the ladders; a bad ICRC is shown on its line.
//! - A *flow* is one direction (source IP, destination IP, destination QPN). Two opposite
//!   flows form a QP pair when the PSNs of one's responses match the other's requests
//!   (the best-matching reverse flow wins); a flow with no match stands alone. CNPs name
//!   the QP to slow down, so they land in the flow of that QP's responses.
//! - Everything is derived from the capture alone. A request is a *retransmission* when
//!   its PSN is before the highest PSN its flow has used so far: request PSNs, and the
//!   response PSNs of its READs seen coming back. A READ response or atomic ACK is one when
//!   its PSN was already answered in that direction. A request PSN beyond the next
//!   expected one is a *gap* (packets missing from the capture). On a capture taken by
//!   `xrnic sim --pcap` (every frame once, as sent) the retransmission count equals the
//!   simulator's `retransmitted_packets`.
//! - Runs of in-order MIDDLE packets collapse into one line unless `--full`.
//! - Connection management: a packet to QP 1 whose payload is a CM MAD (IBTA vol.1 §12.6,
//!   §12.11; [`crate::wire::mad`]) is drawn as the CM message it carries (REQ, MRA, REP,
//!   RTU, REJ with its reason's name, DREQ, DREP, SIDR_REQ, SIDR_REP) with its comm IDs and
//!   what it negotiates; the two QP 1 flows between two addresses are one ladder (the CM's).
//!   A MAD whose transaction ID and type its side already sent is marked resent (the
//!   CM's retry after `2 × packet life + response timeout`, kernel cm.c).
//! - pcapng packet comments (e.g. the reasons `xrnic sim --pcap` records) are shown.
//! - `--json` prints one JSON object per QP pair and then a summary object
//!   ([`Summary`]) as the last line. Exit status 1 when the file cannot be read or the
//!   SVG cannot be written.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use super::decode::{Outcome, Packet, decode_frame};
use crate::wire::mad::{CmMsg, CmaHdr, Mad, MsgRef, rej_reason, service_port, sidr_status};
use crate::wire::{FrameView, Opcode, Operation, Psn, Segment, V1View};

/// Arguments of `xrnic explain`.
#[derive(Clone, Debug, clap::Args)]
pub struct ExplainArgs {
    /// A pcap or pcapng capture (Ethernet link type).
    pub file: PathBuf,
    /// Show every packet (do not collapse runs of in-order MIDDLE packets).
    #[arg(long)]
    pub full: bool,
    /// Also draw the ladders as an SVG sequence diagram into this file.
    #[arg(long, value_name = "OUT")]
    pub svg: Option<PathBuf>,
    /// JSON: one object per QP pair, then the summary object on the last line.
    #[arg(long)]
    pub json: bool,
}

/// Counts over the whole capture (and per QP pair).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// QP pairs (conversations; a flow without a reverse flow counts as one).
    pub qps: usize,
    /// Every frame in the file.
    pub packets: usize,
    /// RoCE packets placed in a ladder.
    pub roce_packets: usize,
    /// RoCE packets that did not parse.
    pub malformed: usize,
    /// RoCE packets whose ICRC is wrong.
    pub bad_icrc: usize,
    /// Messages started (first transmissions of SEND/WRITE ONLY or LAST, READ requests,
    /// atomics).
    pub messages: usize,
    pub retransmitted_packets: usize,
    /// NAKs other than RNR NAKs.
    pub naks: usize,
    pub rnr_naks: usize,
    pub cnps: usize,
    /// Request PSN gaps (packets missing from the capture).
    pub gaps: usize,
    /// Exchanges closed by a response: ACKs, NAKs, atomic ACKs, last READ responses.
    pub round_trips: usize,
    /// Payload bytes of first transmissions (requests and READ responses).
    pub payload_bytes: u64,
    /// Frame bytes of every RoCE packet.
    pub frame_bytes: u64,
    /// CM MADs (to QP 1), resends included.
    pub cm_mads: usize,
    /// CM REJs and SIDR_REPs with a status other than OK.
    pub cm_rejects: usize,
    /// RoCE v1 packets (EtherType 0x8915) placed in a ladder: decoded only, xrnic
    /// carries RoCE v2.
    pub roce_v1: usize,
}

impl Summary {
    fn add(&mut self, o: &Summary) {
        self.messages += o.messages;
        self.retransmitted_packets += o.retransmitted_packets;
        self.naks += o.naks;
        self.rnr_naks += o.rnr_naks;
        self.cnps += o.cnps;
        self.gaps += o.gaps;
        self.round_trips += o.round_trips;
        self.payload_bytes += o.payload_bytes;
        self.frame_bytes += o.frame_bytes;
        self.roce_packets += o.roce_packets;
        self.bad_icrc += o.bad_icrc;
        self.cm_mads += o.cm_mads;
        self.cm_rejects += o.cm_rejects;
        self.roce_v1 += o.roce_v1;
    }
}

/// One line of a ladder.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub frame: usize,
    /// Microseconds since the first RoCE packet of the file.
    pub time_us: f64,
    /// Sent by the left end of the pair.
    pub from_left: bool,
    pub label: String,
    pub notes: Vec<String>,
    pub kind: StepKind,
    /// For a collapsed run: how many packets the line stands for.
    pub count: usize,
}

/// How a step is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    Request,
    Response,
    Ack,
    Nak,
    RnrNak,
    Cnp,
    Retransmission,
    Collapsed,
    /// A connection-management MAD on QP 1.
    Cm,
    Other,
}

/// One QP pair's ladder.
#[derive(Clone, Debug, Serialize)]
pub struct Ladder {
    pub left: String,
    pub right: String,
    pub steps: Vec<Step>,
    pub summary: Summary,
}

type FlowKey = (String, String, u32);

struct Pkt {
    flow: usize,
    p: Packet,
    comment: Option<String>,
    /// The CM MAD a packet to QP 1 carries.
    cm: Option<Mad>,
}

/// The CM MAD in a frame to QP 1 (the GSI QP, IBTA §13.4), if it holds one.
fn cm_mad(f: &crate::io::capture::CapturedFrame, dest_qp: u32) -> Option<Mad> {
    if dest_qp != 1 {
        return None;
    }
    match FrameView::parse(&f.data) {
        Ok(v) => Mad::parse(v.payload()).ok(),
        // A RoCE v1 frame carries its MAD after a GRH.
        Err(_) => Mad::parse(V1View::parse(&f.data).ok()?.transport().ok()?.payload).ok(),
    }
}

fn msg_ref(m: MsgRef) -> &'static str {
    match m {
        MsgRef::Req => "REQ",
        MsgRef::Rep => "REP",
        MsgRef::Other => "other",
    }
}

/// An RDMA CM service ID as `RDMA_PS_TCP port 7174`, any other as hex.
fn service(sid: u64) -> String {
    match service_port(sid) {
        Some((0x0106, port)) => format!("RDMA_PS_TCP port {port}"),
        Some((0x0111, port)) => format!("RDMA_PS_UDP port {port}"),
        Some((0x0002, port)) => format!("RDMA_PS_IPOIB port {port}"),
        Some((ps, port)) => format!("port space {ps:#06x} port {port}"),
        None => format!("service {sid:#018x}"),
    }
}

/// Private data's used length (the bytes up to the last non-zero one).
fn used(pd: &[u8]) -> usize {
    pd.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1)
}

/// The ladder label of a CM MAD and whether it refuses (REJ, SIDR_REP not OK).
fn cm_label(m: &Mad) -> (String, bool) {
    let mut refuses = false;
    let l = match &m.msg {
        CmMsg::Req(r) => {
            let mut l = format!(
                "CM REQ comm {:#010x} {} qpn {:#08x} psn {} mtu {}",
                r.local_comm_id,
                service(r.service_id),
                r.local_qpn,
                r.starting_psn,
                128u32 << r.path_mtu.min(5)
            );
            if let Some(h) = CmaHdr::parse(&r.private_data) {
                let _ = write!(l, " from {} to {}", h.src, h.dst);
            }
            l
        }
        CmMsg::Mra(r) => format!(
            "CM MRA comm {:#010x}->{:#010x} for {}, wait {} ms",
            r.local_comm_id,
            r.remote_comm_id,
            msg_ref(r.message_mraed),
            crate::cm::cm_time(r.service_timeout).as_millis()
        ),
        CmMsg::Rej(r) => {
            refuses = true;
            let mut l = format!(
                "CM REJ comm {:#010x}->{:#010x} of {}: reason {} ({})",
                r.local_comm_id,
                r.remote_comm_id,
                msg_ref(r.message_rejected),
                r.reason,
                rej_reason::name(r.reason).unwrap_or("unknown")
            );
            let n = used(&r.private_data);
            if n > 0 {
                let _ = write!(l, ", {n} B private data");
            }
            l
        }
        CmMsg::Rep(r) => format!(
            "CM REP comm {:#010x}->{:#010x} qpn {:#08x} psn {}",
            r.local_comm_id, r.remote_comm_id, r.local_qpn, r.starting_psn
        ),
        CmMsg::Rtu(r) => format!(
            "CM RTU comm {:#010x}->{:#010x}",
            r.local_comm_id, r.remote_comm_id
        ),
        CmMsg::Dreq(r) => format!(
            "CM DREQ comm {:#010x}->{:#010x} qpn {:#08x}",
            r.local_comm_id, r.remote_comm_id, r.remote_qpn
        ),
        CmMsg::Drep(r) => format!(
            "CM DREP comm {:#010x}->{:#010x}",
            r.local_comm_id, r.remote_comm_id
        ),
        CmMsg::SidrReq(r) => {
            let mut l = format!(
                "CM SIDR_REQ request {:#010x} {}",
                r.request_id,
                service(r.service_id)
            );
            if let Some(h) = CmaHdr::parse(&r.private_data) {
                let _ = write!(l, " from {} to {}", h.src, h.dst);
            }
            l
        }
        CmMsg::SidrRep(r) => {
            refuses = r.status != sidr_status::OK;
            let mut l = format!(
                "CM SIDR_REP request {:#010x} status {} ({})",
                r.request_id,
                r.status,
                sidr_status::name(r.status)
            );
            if !refuses {
                let _ = write!(l, " qpn {:#08x} qkey {:#010x}", r.qpn, r.qkey);
            }
            l
        }
        CmMsg::Unsupported {
            local_comm_id,
            remote_comm_id,
            ..
        } => format!(
            "CM {} comm {local_comm_id:#010x}->{remote_comm_id:#010x} (not served)",
            m.msg.name()
        ),
    };
    (l, refuses)
}

fn info(p: &Packet) -> Option<&'static crate::wire::OpInfo> {
    Opcode(p.opcode?).info()
}

fn is_response_psn(p: &Packet) -> bool {
    info(p).is_some_and(|i| {
        matches!(
            i.operation,
            Operation::ReadResponse | Operation::AtomicAck | Operation::Ack
        )
    })
}

/// Analyse decoded frames (with their pcapng comments, if any).
pub fn explain_frames(
    frames: &[crate::io::capture::CapturedFrame],
    comments: &[Option<String>],
    full: bool,
) -> (Vec<Ladder>, Summary) {
    let mut total = Summary {
        packets: frames.len(),
        ..Summary::default()
    };
    let mut keys: Vec<FlowKey> = Vec::new();
    let mut index: HashMap<FlowKey, usize> = HashMap::new();
    let mut pkts: Vec<Pkt> = Vec::new();
    let mut t0: Option<f64> = None;
    for (i, f) in frames.iter().enumerate() {
        let Outcome::Roce(p) = decode_frame(f) else {
            continue;
        };
        if p.error.is_some() {
            total.malformed += 1;
            continue;
        }
        let (Some(src), Some(dst), Some(dqp)) = (p.src.clone(), p.dst.clone(), p.dest_qp) else {
            total.malformed += 1;
            continue;
        };
        let key = (src, dst, dqp);
        let flow = *index.entry(key.clone()).or_insert_with(|| {
            keys.push(key);
            keys.len() - 1
        });
        let mut p = *p;
        // Times count from the first RoCE packet of the file.
        let start = *t0.get_or_insert(p.time);
        p.time = (p.time - start) * 1e6;
        let cm = cm_mad(f, dqp);
        pkts.push(Pkt {
            flow,
            p,
            comment: comments.get(i).cloned().flatten(),
            cm,
        });
    }
    let pairs = pair_flows(&keys, &pkts);
    let mut ladders = Vec::new();
    for (l, r) in pairs {
        let lad = ladder(&keys, l, r, &pkts, full);
        total.add(&lad.summary);
        ladders.push(lad);
    }
    total.qps = ladders.len();
    (ladders, total)
}

/// Pair each flow with the reverse flow whose responses best match its requests.
fn pair_flows(keys: &[FlowKey], pkts: &[Pkt]) -> Vec<(usize, Option<usize>)> {
    let n = keys.len();
    let mut req: Vec<std::collections::HashSet<u32>> = vec![Default::default(); n];
    let mut resp: Vec<Vec<u32>> = vec![Vec::new(); n];
    for k in pkts {
        let Some(psn) = k.p.psn else { continue };
        if is_response_psn(&k.p) {
            resp[k.flow].push(psn);
        } else if info(&k.p).is_some_and(|i| i.is_request()) {
            req[k.flow].insert(psn);
            // A READ's responses use the PSNs after it (at least 256 bytes each).
            if let Some(r) = &k.p.reth {
                if info(&k.p).is_some_and(|i| i.operation == Operation::ReadRequest) {
                    for j in 1..r.dma_len.div_ceil(256).min(4096) {
                        req[k.flow].insert(Psn::new(psn).add(j).value());
                    }
                }
            }
        }
    }
    let mut cands = Vec::new();
    for x in 0..n {
        for y in x + 1..n {
            if keys[x].0 != keys[y].1 || keys[x].1 != keys[y].0 {
                continue;
            }
            let s = resp[y].iter().filter(|p| req[x].contains(p)).count()
                + resp[x].iter().filter(|p| req[y].contains(p)).count();
            cands.push((s, x, y));
        }
    }
    cands.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut partner: Vec<Option<usize>> = vec![None; n];
    // The CM's two QP 1 flows between two addresses are one conversation.
    for x in 0..n {
        for y in x + 1..n {
            if keys[x].2 == 1
                && keys[y].2 == 1
                && keys[x].0 == keys[y].1
                && keys[x].1 == keys[y].0
                && partner[x].is_none()
                && partner[y].is_none()
            {
                partner[x] = Some(y);
                partner[y] = Some(x);
            }
        }
    }
    for &(s, x, y) in &cands {
        if s > 0 && partner[x].is_none() && partner[y].is_none() {
            partner[x] = Some(y);
            partner[y] = Some(x);
        }
    }
    // No PSN evidence (e.g. only CNPs one way): pair when the choice is unique.
    for x in 0..n {
        if partner[x].is_some() {
            continue;
        }
        let free: Vec<usize> = (0..n)
            .filter(|&y| {
                y != x && partner[y].is_none() && keys[x].0 == keys[y].1 && keys[x].1 == keys[y].0
            })
            .collect();
        if let [y] = free[..] {
            let others = (0..n)
                .filter(|&z| {
                    z != x
                        && z != y
                        && partner[z].is_none()
                        && keys[z].0 == keys[x].0
                        && keys[z].1 == keys[x].1
                })
                .count();
            if others == 0 {
                partner[x] = Some(y);
                partner[y] = Some(x);
            }
        }
    }
    partner
        .iter()
        .enumerate()
        .filter(|&(x, p)| p.is_none_or(|y| y > x))
        .map(|(x, &p)| (x, p))
        .collect()
}

/// Per-direction state while walking a pair.
#[derive(Default, Clone, Copy)]
struct Dir {
    /// One past the highest PSN used by this side's requests (including READ responses
    /// seen coming back): a request before it is a retransmission.
    req_high: Option<Psn>,
    /// The next request PSN expected when nothing is missing; `None` after a READ of
    /// unknown response count.
    expect: Option<Psn>,
    /// One past the highest READ response / atomic ACK PSN this side sent.
    resp_high: Option<Psn>,
}

fn max_psn(a: Option<Psn>, b: Psn) -> Option<Psn> {
    Some(match a {
        Some(x) if !b.after(x) => x,
        _ => b,
    })
}

fn endpoint(k: &FlowKey, reverse: Option<&FlowKey>) -> (String, String) {
    // The left end sends flow k: it is k's source; its own QPN is the destination QPN of
    // the reverse flow (when there is one).
    let l = match reverse {
        Some(r) => format!("{} QP {}", k.0, r.2),
        None => k.0.clone(),
    };
    let r = format!("{} QP {}", k.1, k.2);
    (l, r)
}

/// The ladder of one QP pair (or one lone flow): flow `l` sends from the left, flow `r`
/// from the right; one step per packet, runs of MIDDLE packets collapsed unless `full`.
fn ladder(keys: &[FlowKey], l: usize, r: Option<usize>, pkts: &[Pkt], full: bool) -> Ladder {
    let (left, right) = endpoint(&keys[l], r.map(|r| &keys[r]));
    let mut walk = Walk::new();
    let mut steps: Vec<Step> = pkts
        .iter()
        .filter(|k| k.flow == l || Some(k.flow) == r)
        .map(|k| walk.step(k, usize::from(k.flow != l)))
        .collect();
    if !full {
        steps = collapse(steps);
    }
    Ladder {
        left,
        right,
        steps,
        summary: walk.summary,
    }
}

/// What the walk through one pair's packets has learnt so far: the counts, each side's
/// PSN state, the largest FIRST/MIDDLE payload (the path MTU, to count a READ's
/// responses) and the CM MADs seen.
struct Walk {
    summary: Summary,
    /// Indexed by the sending side: 0 left, 1 right.
    dirs: [Dir; 2],
    mtu: Option<u32>,
    /// (side, transaction ID, attribute ID) of each CM MAD seen: a second one is a resend.
    cm_seen: std::collections::HashSet<(usize, u64, u16)>,
}

impl Walk {
    fn new() -> Self {
        Walk {
            summary: Summary {
                qps: 1,
                ..Summary::default()
            },
            dirs: [Dir::default(); 2],
            mtu: None,
            cm_seen: Default::default(),
        }
    }

    /// The step of packet `k`, sent by side `d`, counted into the summary.
    fn step(&mut self, k: &Pkt, d: usize) -> Step {
        self.summary.roce_packets += 1;
        self.summary.roce_v1 += usize::from(k.p.roce_v1);
        self.summary.frame_bytes += k.p.len as u64;
        match &k.cm {
            Some(m) => self.cm_step(k, m, d),
            None => self.transport_step(k, d),
        }
    }

    /// A bad ICRC is counted and noted first on its line.
    fn note_bad_icrc(&mut self, p: &Packet, notes: &mut Vec<String>) {
        if p.icrc_ok == Some(false) {
            self.summary.bad_icrc += 1;
            notes.push("bad ICRC: the receiver drops it".to_string());
        }
    }

    /// A CM MAD to QP 1: drawn as its CM message, marked when its side sent it before.
    fn cm_step(&mut self, k: &Pkt, m: &Mad, d: usize) -> Step {
        self.summary.cm_mads += 1;
        let (label, refuses) = cm_label(m);
        self.summary.cm_rejects += usize::from(refuses);
        let mut notes = Vec::new();
        self.note_bad_icrc(&k.p, &mut notes);
        if !self.cm_seen.insert((d, m.tid, m.msg.attr_id() as u16)) {
            notes.push("resent (same transaction ID)".to_string());
        }
        if let Some(c) = &k.comment {
            notes.extend(c.split("; ").map(str::to_string));
        }
        Step {
            frame: k.p.frame,
            time_us: k.p.time,
            from_left: d == 0,
            label,
            notes,
            kind: StepKind::Cm,
            count: 1,
        }
    }

    /// A transport packet: a CNP, an ACK/NAK, a READ response or atomic ACK, or a request.
    fn transport_step(&mut self, k: &Pkt, d: usize) -> Step {
        let p = &k.p;
        let psn = Psn::new(p.psn.unwrap_or(0));
        let plen = p.payload_len.unwrap_or(0);
        let name = p.opcode_name.unwrap_or("unknown").trim_start_matches("RC_");
        let mut notes = Vec::new();
        self.note_bad_icrc(p, &mut notes);
        if let Some(v) = p.vendor {
            notes.push(format!("vendor opcode: {v}"));
        }
        let inf = info(p);
        if let Some(i) = inf {
            if matches!(i.segment, Segment::First | Segment::Middle) && i.has_payload && plen > 0 {
                self.mtu = Some(self.mtu.map_or(plen as u32, |m| m.max(plen as u32)));
            }
        }
        let plain = || format!("{name} psn {}", psn.value());
        let (kind, label) = match inf {
            Some(i) if i.operation == Operation::Cnp => {
                self.summary.cnps += 1;
                (StepKind::Cnp, "CNP (slow down)".into())
            }
            Some(i) if i.operation == Operation::Ack => self.ack(p, psn),
            Some(i) if matches!(i.operation, Operation::ReadResponse | Operation::AtomicAck) => {
                let kind = self.response(i, d, psn, plen, &mut notes);
                (kind, with_payload(plain(), plen))
            }
            Some(i) if i.is_request() => {
                let kind = self.request(i, p, d, psn, plen, &mut notes);
                (kind, request_label(plain(), i.operation, p, plen))
            }
            _ => (StepKind::Other, plain()),
        };
        if p.ecn == Some(3) {
            notes.push("CE".into());
        }
        if let Some(c) = &k.comment {
            merge_comment(&mut notes, kind, c);
        }
        Step {
            frame: p.frame,
            time_us: p.time,
            from_left: d == 0,
            label,
            notes,
            kind,
            count: 1,
        }
    }

    /// An ACK, NAK or RNR NAK (its AETH, IBTA §9.7.5): each closes a round trip.
    fn ack(&mut self, p: &Packet, psn: Psn) -> (StepKind, String) {
        let s = &mut self.summary;
        let a = p.aeth.as_ref();
        let msn = a.map_or(0, |a| a.msn);
        s.round_trips += 1;
        match a.map(|a| a.kind) {
            Some("NAK") => {
                s.naks += 1;
                let label = format!(
                    "NAK {} psn {} msn {msn}",
                    a.and_then(|a| a.nak_name).unwrap_or("?"),
                    psn.value()
                );
                (StepKind::Nak, label)
            }
            Some("RNR_NAK") => {
                s.rnr_naks += 1;
                let label = format!(
                    "RNR NAK psn {} msn {msn}, retry in {} ms",
                    psn.value(),
                    a.and_then(|a| a.rnr_timer_ms).unwrap_or(0.0)
                );
                (StepKind::RnrNak, label)
            }
            _ => (StepKind::Ack, format!("ACK psn {} msn {msn}", psn.value())),
        }
    }

    /// A READ response or atomic ACK from side `d`: a retransmission when its PSN was
    /// answered before; it also tells that the other side's request used this PSN.
    fn response(
        &mut self,
        i: &crate::wire::OpInfo,
        d: usize,
        psn: Psn,
        plen: usize,
        notes: &mut Vec<String>,
    ) -> StepKind {
        let dir = &mut self.dirs[d];
        let again = dir.resp_high.is_some_and(|h| psn.before(h));
        dir.resp_high = max_psn(dir.resp_high, psn.add(1));
        // The requester (other side) has now used this PSN.
        let o = &mut self.dirs[1 - d];
        o.req_high = max_psn(o.req_high, psn.add(1));
        if o.expect.is_none_or(|e| psn.add(1).after(e)) {
            o.expect = Some(psn.add(1));
        }
        if i.segment.ends() {
            self.summary.round_trips += 1;
        }
        if again {
            self.summary.retransmitted_packets += 1;
            notes.push("retransmission (PSN answered before)".into());
            StepKind::Retransmission
        } else {
            self.summary.payload_bytes += plen as u64;
            StepKind::Response
        }
    }

    /// A request from side `d`: a retransmission when its PSN was used before, else new
    /// payload (and a gap note when it skips PSNs); then the next PSN it expects.
    fn request(
        &mut self,
        i: &crate::wire::OpInfo,
        p: &Packet,
        d: usize,
        psn: Psn,
        plen: usize,
        notes: &mut Vec<String>,
    ) -> StepKind {
        let op = i.operation;
        let mtu = self.mtu;
        let s = &mut self.summary;
        let dir = &mut self.dirs[d];
        let again = dir.req_high.is_some_and(|h| psn.before(h));
        let kind = if again {
            s.retransmitted_packets += 1;
            notes.push("retransmission (PSN used before)".into());
            StepKind::Retransmission
        } else {
            if let Some(e) = dir.expect.filter(|&e| psn.after(e)) {
                s.gaps += 1;
                notes.push(gap_note(e, psn));
            }
            s.payload_bytes += plen as u64;
            let msg_end = i.segment.ends()
                || matches!(
                    op,
                    Operation::ReadRequest | Operation::CmpSwap | Operation::FetchAdd
                );
            if msg_end {
                s.messages += 1;
            }
            StepKind::Request
        };
        dir.req_high = max_psn(dir.req_high, psn.add(1));
        let next = next_request_psn(op, p, psn, mtu);
        dir.expect = match (dir.expect, next) {
            (Some(e), Some(n)) if e.after(n) => Some(e),
            (_, n) => n,
        };
        kind
    }
}

/// The note for requests missing before `psn`, the first expected being `e`.
fn gap_note(e: Psn, psn: Psn) -> String {
    let last = psn.sub(1);
    if last == e {
        format!("gap: psn {} not in the capture", e.value())
    } else {
        format!(
            "gap: psn {}..{} not in the capture",
            e.value(),
            last.value()
        )
    }
}

/// The PSN after a request at `psn`: a READ request takes one PSN per response packet
/// (IBTA §9.7.2), known only when the path MTU is (`None` otherwise).
fn next_request_psn(op: Operation, p: &Packet, psn: Psn, mtu: Option<u32>) -> Option<Psn> {
    if op != Operation::ReadRequest {
        return Some(psn.add(1));
    }
    let len = p.reth.map_or(0, |r| r.dma_len);
    match (len, mtu) {
        (0, _) => Some(psn.add(1)),
        (l, Some(m)) if m > 0 => Some(psn.add(l.div_ceil(m))),
        _ => None,
    }
}

/// `label` with the payload length, when there is one.
fn with_payload(mut label: String, plen: usize) -> String {
    if plen > 0 {
        let _ = write!(label, " {plen} B");
    }
    label
}

/// A request's label: the payload, a READ's length, the immediate, the AckReq bit ("A").
fn request_label(label: String, op: Operation, p: &Packet, plen: usize) -> String {
    let mut label = with_payload(label, plen);
    if let Some(r) = p.reth {
        if op == Operation::ReadRequest {
            let _ = write!(label, " (read {} B)", r.dma_len);
        }
    }
    if let Some(imm) = p.immdt {
        let _ = write!(label, " imm 0x{:08x}", imm.data);
    }
    if p.ack_req == Some(true) && op != Operation::ReadRequest {
        label.push_str(" A");
    }
    label
}

/// Adds the parts of a packet comment (`; `-separated, as `xrnic sim --pcap` writes the
/// sender's reasons) that the label does not already say; a sender's reason for a
/// retransmission replaces the generic note.
fn merge_comment(notes: &mut Vec<String>, kind: StepKind, comment: &str) {
    for part in comment.split("; ") {
        let said = match kind {
            StepKind::Nak => part.starts_with("NAK "),
            StepKind::RnrNak => part.starts_with("RNR NAK"),
            StepKind::Cnp => part.starts_with("CNP"),
            _ => false,
        };
        if said {
            continue;
        }
        match part.strip_prefix("retransmission: ") {
            Some(why) if kind == StepKind::Retransmission => {
                notes.retain(|n| !n.starts_with("retransmission ("));
                notes.push(why.to_string());
            }
            _ => notes.push(part.to_string()),
        }
    }
}

/// Merge runs of plain in-order MIDDLE packets from one side: keep the first, then one
/// line "… N more NAME psn a..b".
fn collapse(steps: Vec<Step>) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    let middle = |s: &Step| {
        matches!(
            s.kind,
            StepKind::Request | StepKind::Response | StepKind::Retransmission
        ) && s.label.contains("MIDDLE")
    };
    let mut i = 0;
    while i < steps.len() {
        let s = &steps[i];
        if !middle(s) {
            out.push(s.clone());
            i += 1;
            continue;
        }
        let name = s.label.split(' ').next().unwrap_or("").to_string();
        let psn_of = |s: &Step| {
            s.label
                .split(' ')
                .nth(2)
                .and_then(|x| x.parse::<u32>().ok())
        };
        // The run may interleave with the other side's packets (ACKs); those are kept.
        let mut run = vec![i];
        let mut others = Vec::new();
        let mut j = i + 1;
        while j < steps.len() {
            let t = &steps[j];
            if t.from_left != s.from_left {
                if t.kind == StepKind::Ack && t.notes.is_empty() {
                    others.push(j);
                    j += 1;
                    continue;
                }
                break;
            }
            let last = &steps[*run.last().unwrap_or(&i)];
            let consecutive = match (psn_of(last), psn_of(t)) {
                (Some(a), Some(b)) => Psn::new(a).add(1).value() == b,
                _ => false,
            };
            if middle(t)
                && t.label.starts_with(&name)
                && consecutive
                && t.kind == s.kind
                && t.notes == s.notes
            {
                run.push(j);
                j += 1;
            } else {
                break;
            }
        }
        if run.len() < 4 {
            out.push(s.clone());
            i += 1;
            continue;
        }
        out.push(s.clone());
        let first = psn_of(&steps[run[1]]).unwrap_or(0);
        let last = psn_of(&steps[*run.last().unwrap_or(&i)]).unwrap_or(0);
        let mut c = steps[run[1]].clone();
        c.count = run.len() - 1;
        c.label = format!("… {} more {name} psn {first}..{last}", run.len() - 1);
        c.kind = if s.kind == StepKind::Retransmission {
            StepKind::Retransmission
        } else {
            StepKind::Collapsed
        };
        out.push(c);
        for &o in &others {
            out.push(steps[o].clone());
        }
        i = j;
    }
    out
}

const COL: usize = 52;

/// The text ladder of one pair.
pub fn render_text(l: &Ladder) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "QP pair: {}  <->  {}", l.left, l.right);
    let _ = writeln!(
        o,
        "{:>12}  {:<w$}  {}",
        "time (us)",
        l.left,
        l.right,
        w = COL + 4
    );
    for s in &l.steps {
        let mut label = s.label.clone();
        if !s.notes.is_empty() {
            let _ = write!(label, "  [{}]", s.notes.join("; "));
        }
        if s.from_left {
            let _ = writeln!(o, "{:>12.3}  {label} ---->", s.time_us);
        } else {
            let _ = writeln!(o, "{:>12.3}  {:w$}<---- {label}", s.time_us, "", w = COL);
        }
    }
    let m = &l.summary;
    let _ = writeln!(
        o,
        "  {} packets, {} messages, {} retransmitted, {} NAKs, {} RNR NAKs, {} CNPs, {} gaps, {} round trips, {} payload bytes, {} frame bytes{}{}",
        m.roce_packets,
        m.messages,
        m.retransmitted_packets,
        m.naks,
        m.rnr_naks,
        m.cnps,
        m.gaps,
        m.round_trips,
        m.payload_bytes,
        m.frame_bytes,
        if m.bad_icrc > 0 {
            format!(", {} bad ICRC", m.bad_icrc)
        } else {
            String::new()
        },
        if m.cm_mads > 0 {
            format!(", {} CM MADs ({} refusals)", m.cm_mads, m.cm_rejects)
        } else {
            String::new()
        }
    );
    if m.roce_v1 > 0 {
        let _ = writeln!(
            o,
            "  {} RoCE v1 packets (EtherType 0x8915, GRH + BTH; ends are GIDs): decoded only, xrnic carries RoCE v2",
            m.roce_v1
        );
    }
    o
}

/// `xrnic explain`.
pub fn run(args: &ExplainArgs) -> ExitCode {
    let bytes = match std::fs::read(&args.file) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("xrnic explain: cannot read {}: {e}", args.file.display());
            return ExitCode::from(1);
        }
    };
    let frames = match crate::io::capture::read_bytes(&bytes) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("xrnic explain: cannot read {}: {e}", args.file.display());
            return ExitCode::from(1);
        }
    };
    let comments = crate::io::pcap_out::packet_comments(&bytes);
    let (ladders, sum) = explain_frames(&frames, &comments, args.full);
    if let Some(svg) = &args.svg {
        let text = super::explain_svg::render(&ladders);
        if let Err(e) = std::fs::write(svg, text) {
            eprintln!("xrnic explain: cannot write {}: {e}", svg.display());
            return ExitCode::from(1);
        }
    }
    let mut out = String::new();
    if args.json {
        for l in &ladders {
            match serde_json::to_string(l) {
                Ok(j) => {
                    out += &j;
                    out.push('\n');
                }
                Err(e) => {
                    eprintln!("xrnic explain: {e}");
                    return ExitCode::from(1);
                }
            }
        }
        match serde_json::to_string(&sum) {
            Ok(j) => {
                out += &j;
                out.push('\n');
            }
            Err(e) => {
                eprintln!("xrnic explain: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        for l in &ladders {
            out += &render_text(l);
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "summary: {} QP pairs, {} packets ({} RoCE, {} malformed), {} messages, {} retransmitted, {} NAKs, {} RNR NAKs, {} CNPs, {} round trips, {} payload bytes",
            sum.qps,
            sum.packets,
            sum.roce_packets,
            sum.malformed,
            sum.messages,
            sum.retransmitted_packets,
            sum.naks,
            sum.rnr_naks,
            sum.cnps,
            sum.round_trips,
            sum.payload_bytes
        );
    }
    // A closed pipe is not worth a panic.
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    ExitCode::SUCCESS
}
