//! Helpers shared by the transport integration tests.
#![allow(dead_code)]

use xrnic::proto::{Access, Instant, MrInfo, RecvWr, SendWr, Sge, WorkCompletion, WrOpcode};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair, RcPair, Side};
use xrnic::wire::{FrameView, Opcode, Syndrome};

pub fn pair(link: LinkConfig, opts: &ConnectOpts) -> (Pair, RcPair) {
    let mut p = Pair::new(link, 1);
    let c = p.connect(opts).expect("connect");
    (p, c)
}

pub fn mr(p: &mut Pair, side: Side, c: &RcPair, len: usize, access: Access) -> MrInfo {
    let pd = match side {
        Side::A => c.pd_a,
        Side::B => c.pd_b,
    };
    p.dev(side).reg_mr(pd, len, access).expect("reg_mr")
}

pub fn sge(m: &MrInfo, off: u64, len: u32) -> Vec<Sge> {
    vec![Sge {
        addr: m.addr + off,
        length: len,
        lkey: m.lkey,
    }]
}

pub fn send_wr(id: u64, op: WrOpcode, sg: Vec<Sge>) -> SendWr {
    let mut w = SendWr::new(id, op);
    w.sg_list = sg;
    w
}

pub fn recv_wr(id: u64, sg: Vec<Sge>) -> RecvWr {
    RecvWr {
        wr_id: id,
        sg_list: sg,
    }
}

/// Poll everything on side `s`'s CQ.
pub fn poll(p: &mut Pair, s: Side, c: &RcPair) -> Vec<WorkCompletion> {
    let cq = match s {
        Side::A => c.cq_a,
        Side::B => c.cq_b,
    };
    let mut v = Vec::new();
    p.dev(s).poll_cq(cq, usize::MAX, &mut v);
    v
}

/// Run until side `s` has at least `n` completions (collected into `acc`).
pub fn run_for_wcs(
    p: &mut Pair,
    s: Side,
    c: &RcPair,
    n: usize,
    limit: Instant,
    acc: &mut Vec<WorkCompletion>,
) {
    let done = p.run_until(limit, |pr| {
        let cq = match s {
            Side::A => c.cq_a,
            Side::B => c.cq_b,
        };
        pr.dev(s).poll_cq(cq, usize::MAX, acc);
        acc.len() >= n
    });
    assert!(
        done,
        "only {} of {n} completions by t={}: {acc:?}",
        acc.len(),
        p.now
    );
}

/// Captured frames sent by `from` with `opcode`: (time in ns, AETH syndrome if any, PSN).
pub fn frames(p: &Pair, from: Side, opcode: Opcode) -> Vec<(u64, Option<Syndrome>, u32)> {
    p.capture
        .as_ref()
        .expect("capture on")
        .iter()
        .filter(|(_, s, _)| *s == from)
        .filter_map(|(t, _, b)| {
            let v = FrameView::parse(b).expect("we emit valid frames");
            v.verify_icrc().expect("we emit valid ICRCs");
            let r = v.repr();
            (r.roce.bth.opcode == opcode).then(|| {
                (
                    t.as_nanos(),
                    r.roce.ext.aeth.map(|a| a.syndrome),
                    r.roce.bth.psn.value(),
                )
            })
        })
        .collect()
}
