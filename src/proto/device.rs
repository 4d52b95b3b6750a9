//! The engine: one RNIC device owning its PDs, MRs, CQs and QPs, with the sans-IO surface
//! (`handle_frame`, `poll_transmit`, `poll_timeout`, `handle_timeout`).
//!
//! Contract: see the module documentation of [`crate::proto`]. Frames are whole
//! Ethernet/IP/UDP/BTH frames; addresses come from the device [`Config`] (source MAC and
//! GID table) and from each QP's address vector (given at RTR, like `ah_attr`), through
//! the QP's header template (see `framing`). A received frame is checked by
//! `FrameView::parse` and its ICRC; the transport then reads the few fields it needs (BTH
//! destination QP, PSN, AckReq, the extension headers the opcode has, the IP addresses)
//! in place.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::wire::{ExtHeaders, FrameView, Qpn, Service, gid_is, mac_is_multicast};

use super::completer;
use super::config::QPN_SPACE;
pub use super::config::{Config, FIRST_QPN, random_first_qpn};
use super::congestion::{CongestionControl, build_cnp};
use super::counters::{DeviceCounters, QpCounters};
use super::cq::{CompletionQueue, Cq, WcOpcode, WcStatus, WorkCompletion};
use super::execute;
use super::framing::{emit, frame_addrs};
use super::mcast::McastGroups;
use super::memory::resolve_sges;
use super::memory::{Access, MemTable, MrInfo, Pd};
use super::packet::{Tx, TxBufs};
use super::qp::{
    AttrMask, Qp, QpAttr, QpInitAttr, QpState, QpType, UdCounters, UdDest, VerbsError, check_modify,
};
use super::requester::{ReqTxEnv, SendWqe};
use super::responder::RecvWqe;
use super::sched::Scheduler;
use super::srq::Srq;
use super::time::Instant;
use super::timers::Timer;
use super::trace::{Event, TxReason, qp_event};
use super::ud;
use super::verdict::RxVerdict;
use super::wr::{RecvWr, SendWr};
use super::{Ctx, completer::handle_response};

/// The largest frame `poll_transmit` writes: Ethernet + VLAN + IPv6 + UDP + BTH + the
/// largest extension headers + 4096 bytes of payload + ICRC, rounded up.
pub const MAX_FRAME_LEN: usize = 4096 + 256;

/// A software RNIC.
#[derive(Debug)]
pub struct Rnic {
    pub(super) cfg: Config,
    pub(super) mem: MemTable,
    cqs: Vec<Option<CompletionQueue>>,
    pub(super) qps: Vec<Option<Qp>>,
    /// Shared receive queues (see `super::srq`).
    pub(super) srqs: Vec<Option<super::srq::SharedRq>>,
    /// Asynchronous events not yet read ([`Rnic::poll_async_event`]).
    pub(super) async_events: std::collections::VecDeque<super::srq::AsyncEvent>,
    retired: QpCounters,
    dev: DeviceCounters,
    /// Which QPs may have a frame to send and which have a timer armed
    /// (`super::sched`): what `poll_transmit` and the timers walk instead of every slot.
    pub(super) sched: Scheduler,
    /// Scratch of `handle_timeout`: the slots whose timers are due.
    due: Vec<usize>,
    scratch: Vec<u8>,
    /// Congestion control (DCQCN), when enabled.
    cc: Option<CongestionControl>,
    /// The name trace events carry.
    name: &'static str,
    /// The `now` of the latest sans-IO call: the time verbs' trace events carry.
    pub(super) last_now: Instant,
    /// Completions added to any CQ, shared with each CQ ([`Rnic::completions_added`]).
    completions_added: Arc<AtomicU64>,
    /// The slot of the GSI QP (QPN 1, `ud::GSI_QPN`), when created.
    gsi_slot: Option<usize>,
    /// The device is gone ([`Rnic::device_fatal`]): verbs that need it fail.
    pub(super) fatal: bool,
    /// How far the first slot's QPN is past [`FIRST_QPN`]: `Config::first_qpn` taken
    /// once (a remainder per received frame otherwise, in `slot`).
    qpn_offset: u32,
    /// The multicast groups and their UD QPs (`super::mcast`, `super::mcast_verbs`).
    pub(super) mcast: McastGroups,
    /// Scratch of `handle_mcast`: the QPNs of the group a frame goes to.
    pub(super) mcast_scratch: Vec<Qpn>,
    /// READ responses its QPs asked for and have not received (`super::read_credit`).
    read_pool: super::read_credit::ReadPool,
}

impl Rnic {
    pub fn new(cfg: Config) -> Self {
        Rnic {
            qpn_offset: cfg.first_qpn.saturating_sub(FIRST_QPN) % QPN_SPACE,
            cfg,
            mem: MemTable::new(),
            cqs: Vec::new(),
            qps: Vec::new(),
            srqs: Vec::new(),
            async_events: std::collections::VecDeque::new(),
            retired: QpCounters::default(),
            dev: DeviceCounters::default(),
            sched: Scheduler::default(),
            due: Vec::new(),
            scratch: Vec::new(),
            cc: None,
            name: "xrnic0",
            last_now: Instant::ZERO,
            completions_added: Arc::new(AtomicU64::new(0)),
            gsi_slot: None,
            fatal: false,
            mcast: McastGroups::default(),
            mcast_scratch: Vec::new(),
            read_pool: Default::default(),
        }
    }

    /// Name the device in trace events (default "xrnic0").
    pub fn set_name(&mut self, name: &'static str) {
        self.name = name;
        if let Some(cc) = self.cc.as_mut() {
            cc.dev = name;
        }
    }

    /// The device name trace events carry.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Turn on congestion control: CNPs received cut the rate of their QP, requester
    /// frames are paced, CE-marked packets are answered with CNPs.
    pub fn enable_congestion_control(&mut self, mut cc: CongestionControl) {
        for q in self.qps.iter().flatten() {
            cc.add_qp(Instant::ZERO, q.qpn);
        }
        cc.dev = self.name;
        self.cc = Some(cc);
    }

    /// The congestion-control state (rates, α, counters), when enabled.
    pub fn congestion(&self) -> Option<&CongestionControl> {
        self.cc.as_ref()
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    // ----- verbs -------------------------------------------------------------------

    pub fn alloc_pd(&mut self) -> Pd {
        self.mem.alloc_pd()
    }

    pub fn dealloc_pd(&mut self, pd: Pd) -> Result<(), VerbsError> {
        if self.qps.iter().flatten().any(|q| q.pd == pd) {
            return Err(VerbsError::InUse("protection domain still has QPs"));
        }
        if self.pd_has_srq(pd) {
            return Err(VerbsError::InUse("protection domain still has SRQs"));
        }
        // A refused PD that still exists has memory regions: in use (EBUSY).
        self.mem
            .dealloc_pd(pd)
            .map_err(|w| match self.mem.pd_exists(pd) {
                true => VerbsError::InUse(w),
                false => VerbsError::Resource(w),
            })
    }

    /// Register a zeroed memory region of `length` bytes owned by the engine.
    pub fn reg_mr(&mut self, pd: Pd, length: usize, access: Access) -> Result<MrInfo, VerbsError> {
        self.alive()?;
        self.mem
            .reg_mr(pd, length, access)
            .map_err(VerbsError::Resource)
    }

    /// Register memory of the application ([`super::UserMem`]) at I/O virtual address
    /// `iova`.
    pub fn reg_user_mr(
        &mut self,
        pd: Pd,
        mem: super::UserMem,
        iova: u64,
        access: Access,
    ) -> Result<MrInfo, VerbsError> {
        self.alive()?;
        self.mem
            .reg_user_mr(pd, mem, iova, access)
            .map_err(VerbsError::Resource)
    }

    pub fn dereg_mr(&mut self, lkey: crate::wire::Lkey) -> Result<(), VerbsError> {
        self.mem.dereg_mr(lkey).map_err(VerbsError::Resource)
    }

    /// A region's bytes, for the application.
    pub fn mr_bytes(&self, lkey: crate::wire::Lkey) -> Option<&[u8]> {
        self.mem.mr_bytes(lkey)
    }

    /// A region's bytes, writable, for the application.
    pub fn mr_bytes_mut(&mut self, lkey: crate::wire::Lkey) -> Option<&mut [u8]> {
        self.mem.mr_bytes_mut(lkey)
    }

    pub fn create_cq(&mut self, cqe: usize) -> Cq {
        self.cqs.push(Some(CompletionQueue::new(
            cqe.max(1),
            self.completions_added.clone(),
        )));
        Cq(self.cqs.len() as u32 - 1)
    }

    /// `ibv_resize_cq`: room for `cqe` completions, those waiting kept in order; fewer
    /// than wait is refused, as rxe's `rxe_cq_chk_attr` refuses it.
    pub fn resize_cq(&mut self, cq: Cq, cqe: usize) -> Result<(), VerbsError> {
        match self.cqs.get_mut(cq.0 as usize) {
            Some(Some(q)) => q.resize(cqe.max(1)),
            _ => Err(VerbsError::NotFound("completion queue")),
        }
    }

    pub fn destroy_cq(&mut self, cq: Cq) -> Result<(), VerbsError> {
        if self
            .qps
            .iter()
            .flatten()
            .any(|q| q.send_cq == cq || q.recv_cq == cq)
        {
            return Err(VerbsError::InUse("completion queue still used by a QP"));
        }
        match self.cqs.get_mut(cq.0 as usize) {
            Some(slot @ Some(_)) => {
                *slot = None;
                Ok(())
            }
            _ => Err(VerbsError::NotFound("completion queue")),
        }
    }

    /// How many completions this engine has added to its CQs so far, by any call: a
    /// frame, a timer, or a verb (a flush on modify to ERR, a post on a QP in ERR, a WR
    /// failed at the head of its send queue). It only grows: a caller that reads it
    /// before and after a call knows whether that call completed anything, and wakes the
    /// threads waiting for completions (`crate::driver`).
    pub fn completions_added(&self) -> u64 {
        self.completions_added.load(Ordering::Relaxed)
    }

    /// How many times the transmit and timer paths visited a QP since the device was
    /// made (`super::sched`: a slot taken from the ready list or from the due timers). A
    /// driver step costs the QPs it visits, so 10 000 idle QPs cost nothing; tests count
    /// this instead of timing it.
    pub fn qp_visits(&self) -> u64 {
        self.sched.visits()
    }

    /// How many completions `cq` holds (`None`: no such CQ).
    pub fn cq_len(&self, cq: Cq) -> Option<usize> {
        match self.cqs.get(cq.0 as usize) {
            Some(Some(q)) => Some(q.depth().0),
            _ => None,
        }
    }

    /// The count of `cq`'s waiting completions, kept up to date by the CQ and readable
    /// without this `Rnic` (its owner's lock): a poller that reads 0 need not lock.
    pub fn cq_ready(&self, cq: Cq) -> Option<Arc<AtomicUsize>> {
        match self.cqs.get(cq.0 as usize) {
            Some(Some(q)) => Some(q.ready()),
            _ => None,
        }
    }

    /// Raise IBV_EVENT_PORT_ACTIVE (`active`) or PORT_ERR for the one port: its link
    /// changed (the link watcher, src/verbs/link_watch.rs, calls this).
    pub fn raise_port_event(&mut self, active: bool) {
        let ev = if active {
            super::srq::AsyncEvent::PortActive(1)
        } else {
            super::srq::AsyncEvent::PortErr(1)
        };
        if self.async_events.len() < super::srq::MAX_ASYNC_EVENTS {
            self.async_events.push_back(ev);
        }
    }

    /// Drain up to `max` completions into `out`; returns how many.
    pub fn poll_cq(&mut self, cq: Cq, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        match self.cqs.get_mut(cq.0 as usize) {
            Some(Some(q)) => q.poll(out, max),
            _ => 0,
        }
    }

    /// Create an RC, UC or UD QP in RESET, on its own receive queue or on an SRQ.
    pub fn create_qp(&mut self, pd: Pd, init: &QpInitAttr) -> Result<Qpn, VerbsError> {
        self.alive()?;
        if !self.mem.pd_exists(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        self.check_qp_srq(pd, init.srq)?;
        for cq in [init.send_cq, init.recv_cq] {
            if !matches!(self.cqs.get(cq.0 as usize), Some(Some(_))) {
                return Err(VerbsError::NotFound("completion queue"));
            }
        }
        if init.max_send_wr > self.cfg.max_qp_wr || init.max_recv_wr > self.cfg.max_qp_wr {
            return Err(VerbsError::InvalidValue(
                "max_send_wr/max_recv_wr above max_qp_wr",
            ));
        }
        let slot = match self.qps.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.qps.push(None);
                self.qps.len() - 1
            }
        };
        let qpn = self.slot_qpn(slot);
        self.qps[slot] = Some(Qp::new(qpn, pd, *init));
        if let Some(cc) = self.cc.as_mut() {
            cc.add_qp(Instant::ZERO, qpn);
        }
        Ok(qpn)
    }

    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        let i = self.slot(qpn).ok_or(VerbsError::NotFound("QP"))?;
        if let Some(q) = self.qps[i].take() {
            self.retired.add(&q.counters);
        }
        self.mcast.forget_qp(qpn);
        self.sched.forget(i);
        if self.gsi_slot == Some(i) {
            self.gsi_slot = None;
        }
        if let Some(cc) = self.cc.as_mut() {
            cc.remove_qp(qpn);
        }
        Ok(())
    }

    /// Checks of `create_qp` for a QP on an SRQ: the SRQ exists and shares the QP's PD
    /// (IBTA §10.2.9.1: a QP and its SRQ are in one protection domain).
    fn check_qp_srq(&self, pd: Pd, srq: Option<Srq>) -> Result<(), VerbsError> {
        let Some(srq) = srq else { return Ok(()) };
        match self.srqs.get(srq.0 as usize) {
            Some(Some(s)) if s.pd == pd => Ok(()),
            Some(Some(_)) => Err(VerbsError::InvalidValue(
                "the SRQ belongs to another protection domain",
            )),
            _ => Err(VerbsError::NotFound("shared receive queue")),
        }
    }

    /// True when the PD still has an SRQ (`dealloc_pd` refuses then).
    fn pd_has_srq(&self, pd: Pd) -> bool {
        self.srqs.iter().flatten().any(|s| s.pd == pd)
    }

    /// QP slot `i` may have work now: it goes on the ready list and its timers are
    /// tracked (`super::sched`). Called after every call that may give a QP something to
    /// send or arm, move or clear its timers.
    // Inlined (as `track`): after every received frame and every transmit, per packet.
    #[inline(always)]
    pub(super) fn touch(&mut self, i: usize) {
        if self.track(i) {
            self.sched.wake(i);
        }
    }

    /// QP slot `i`'s deadlines may have changed: its congestion-control deadlines are
    /// copied into its timer table (`Timer::Rate`, `Timer::Pacer`), and the table's
    /// earliest deadline is tracked by the scheduler. False when the slot is empty.
    #[inline(always)]
    fn track(&mut self, i: usize) -> bool {
        let Some(Some(qp)) = self.qps.get_mut(i) else {
            return false;
        };
        if let Some(cc) = self.cc.as_ref() {
            let t = cc.qp_timers(qp.qpn);
            qp.req.timers_mut().set(Timer::Rate, t.rate);
            qp.req.timers_mut().set(Timer::Pacer, t.pacer);
        }
        self.sched.track(i, qp_deadline(qp));
        true
    }

    pub(super) fn touch_qpn(&mut self, qpn: Qpn) {
        if let Some(i) = self.slot(qpn) {
            self.touch(i);
        }
    }

    /// How far the first slot's QPN is past [`FIRST_QPN`] (from `Config::first_qpn`).
    fn qpn_offset(&self) -> u32 {
        self.qpn_offset
    }

    /// The QPN of QP slot `slot`: `Config::first_qpn` onwards, wrapping within the 24 bits.
    fn slot_qpn(&self, slot: usize) -> Qpn {
        let i = (u64::from(self.qpn_offset()) + slot as u64) % u64::from(QPN_SPACE);
        Qpn::new(FIRST_QPN + i as u32)
    }

    pub(super) fn slot(&self, qpn: Qpn) -> Option<usize> {
        let i = match qpn {
            ud::GSI_QPN => self.gsi_slot?,
            _ => {
                // Both below QPN_SPACE (a QPN has 24 bits, the offset was taken modulo
                // it), so one conditional subtraction is the remainder: no division per
                // received frame.
                let from_first = qpn.value().checked_sub(FIRST_QPN)?;
                let i = from_first + QPN_SPACE - self.qpn_offset();
                (if i >= QPN_SPACE { i - QPN_SPACE } else { i }) as usize
            }
        };
        // The GSI QP's slot does not answer to the QPN the slot would have.
        matches!(self.qps.get(i), Some(Some(q)) if q.qpn == qpn).then_some(i)
    }

    fn split(&mut self, qpn: Qpn, now: Instant) -> Option<(&mut Qp, Ctx<'_>)> {
        let i = self.slot(qpn)?;
        self.split_slot(i, now)
    }

    /// The QP in slot `i` and a context over the rest of the device.
    pub(super) fn split_slot(&mut self, i: usize, now: Instant) -> Option<(&mut Qp, Ctx<'_>)> {
        let qp = self.qps.get_mut(i)?.as_mut()?;
        Some((
            qp,
            Ctx {
                mem: &mut self.mem,
                cqs: &mut self.cqs,
                cfg: &self.cfg,
                now,
                dev: self.name,
                srqs: &mut self.srqs,
                events: &mut self.async_events,
            },
        ))
    }

    /// `ibv_modify_qp` for RC: see [`super::qp::check_modify`] for the rules.
    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr, mask: AttrMask) -> Result<(), VerbsError> {
        self.alive()?;
        let r = self.modify_qp_now(qpn, attr, mask);
        self.touch_qpn(qpn);
        r
    }

    fn modify_qp_now(&mut self, qpn: Qpn, attr: &QpAttr, mask: AttrMask) -> Result<(), VerbsError> {
        let ngids = self.cfg.gids.len();
        let (qp, mut ctx) = self
            .split(qpn, self.last_now)
            .ok_or(VerbsError::NotFound("QP"))?;
        let to = match qp.init.qp_type {
            QpType::Ud => ud::check_modify_ud(qp.state, attr, mask)?,
            super::qp::QpType::Uc => {
                super::qp::check_modify_with(super::uc::transition_rule, qp.state, attr, mask)?
            }
            _ => check_modify(qp.state, attr, mask)?,
        };
        if mask.contains(AttrMask::AV) && usize::from(attr.ah_attr.sgid_index) >= ngids {
            return Err(VerbsError::InvalidValue("sgid_index beyond the GID table"));
        }
        let a = &mut qp.attr;
        macro_rules! take {
            ($m:ident, $f:ident) => {
                if mask.contains(AttrMask::$m) {
                    a.$f = attr.$f;
                }
            };
        }
        take!(ACCESS_FLAGS, qp_access_flags);
        take!(PKEY_INDEX, pkey_index);
        take!(PORT, port_num);
        take!(AV, ah_attr);
        take!(PATH_MTU, path_mtu);
        take!(DEST_QPN, dest_qp_num);
        take!(TIMEOUT, timeout);
        take!(RETRY_CNT, retry_cnt);
        take!(RNR_RETRY, rnr_retry);
        take!(MIN_RNR_TIMER, min_rnr_timer);
        take!(MAX_QP_RD_ATOMIC, max_rd_atomic);
        take!(MAX_DEST_RD_ATOMIC, max_dest_rd_atomic);
        take!(QKEY, qkey);
        // The header template follows the attributes: rebuilt at the next frame.
        qp.tx_template = None;
        if mask.contains(AttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
            qp.resp.set_rq_psn(attr.rq_psn);
        }
        if mask.contains(AttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
            qp.req.set_sq_psn(attr.sq_psn);
        }
        if mask.contains(AttrMask::RETRY_CNT) {
            qp.req.set_retry_cnt(attr.retry_cnt);
        }
        if mask.contains(AttrMask::RNR_RETRY) {
            qp.req.set_rnr_retry(attr.rnr_retry);
        }
        // SQ_DRAINED is owed from RTS -> SQD on, and due at once with nothing outstanding
        // (after that, when the last outstanding message completes: `handle_frame`).
        let entering_sqd = to == QpState::Sqd && qp.state != QpState::Sqd;
        if entering_sqd {
            qp.req.owe_sq_drained(true);
        } else if to != QpState::Sqd {
            qp.req.owe_sq_drained(false);
        }
        // Entering ERR is traced by `enter_error`, whatever drives the QP there.
        if to != qp.state && to != QpState::Err {
            qp_event!(ctx.now, ctx.dev, qpn, Event::State, from = ?qp.state, to = ?to);
        }
        match to {
            QpState::Reset => qp.reset(),
            QpState::Err => {
                if qp.state != QpState::Err {
                    qp.enter_error(&mut ctx);
                }
            }
            s => {
                qp.state = s;
                qp.attr.qp_state = s;
            }
        }
        if entering_sqd && qp.req.drained_now() {
            ctx.raise(super::srq::AsyncEvent::SqDrained(qpn));
        }
        // The GSI QP's Q_Key is fixed (IBTA §13.5.1), through RESET too.
        if qpn == ud::GSI_QPN {
            qp.attr.qkey = ud::GSI_QKEY;
        }
        Ok(())
    }

    /// `ibv_query_qp`: the current attributes.
    pub fn query_qp(&self, qpn: Qpn) -> Result<QpAttr, VerbsError> {
        let q = self
            .slot(qpn)
            .and_then(|i| self.qps[i].as_ref())
            .ok_or(VerbsError::NotFound("QP"))?;
        let mut a = q.attr;
        a.qp_state = q.state;
        a.cur_qp_state = q.state;
        a.sq_psn = q.req.next_psn();
        a.rq_psn = q.resp.epsn();
        a.sq_draining = q.state == QpState::Sqd && q.req.outstanding();
        Ok(a)
    }

    /// `ibv_post_send`. Malformed requests are refused here (like EINVAL/ENOMEM); a bad
    /// local key completes the WR with LOC_PROT_ERR when it reaches the queue head.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        self.alive()?;
        let r = self.post_send_rc(qpn, wr);
        self.touch_qpn(qpn);
        r
    }

    fn post_send_rc(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        let max_wr = self.cfg.max_qp_wr;
        let max_unacked = self.cfg.max_unacked_psns;
        let (qp, mut ctx) = self
            .split(qpn, self.last_now)
            .ok_or(VerbsError::NotFound("QP"))?;
        if qp.init.qp_type == QpType::Ud {
            return Err(VerbsError::InvalidValue(
                "a UD QP sends with post_send_ud (an address handle per WR)",
            ));
        }
        let len64: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        match qp.state {
            QpState::Rts | QpState::Sqd => {}
            QpState::Err => {
                // Posting to a QP in ERR is legal; the WR completes flushed (§10.3).
                let wc = WorkCompletion {
                    wr_id: wr.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: wr.opcode.wc_opcode(),
                    byte_len: 0,
                    imm_data: None,
                    invalidated_rkey: None,
                    qp_num: qp.qpn,
                    src_qp: qp.attr.dest_qp_num,
                    grh: false,
                    sl: 0,
                };
                ctx.complete(qp.send_cq, wc);
                return Ok(());
            }
            s => return Err(VerbsError::WrongState(s)),
        }
        if qp.init.qp_type == super::qp::QpType::Uc && !super::uc::wr_allowed(wr.opcode) {
            // rxe's opcode table has no UC entry for READ, atomics or SEND with
            // invalidate: `post_send` fails EINVAL.
            return Err(VerbsError::InvalidValue("opcode not supported on a UC QP"));
        }
        if qp.req.sq_len() >= qp.init.max_send_wr.min(max_wr) as usize {
            return Err(VerbsError::QueueFull);
        }
        if wr.opcode.is_read_or_atomic() && qp.attr.max_rd_atomic == 0 {
            return Err(VerbsError::InvalidValue(
                "READ/atomic on a QP with max_rd_atomic 0",
            ));
        }
        let need = if wr.opcode.is_read_or_atomic() {
            Access::LOCAL_WRITE
        } else {
            Access::NONE
        };
        let mut segs = resolve_sges(ctx.mem, qp.pd, &wr.sg_list, need);
        // Message size limit 2^31 (§9.7.2 / ibv_devinfo max_msg_sz); atomics move exactly
        // eight bytes.
        if len64 > 1 << 31 || (wr.opcode.is_atomic() && len64 != 8) {
            segs = Err(WcStatus::LocLenErr);
        } else if !wr.opcode.is_atomic()
            && len64.div_ceil(u64::from(qp.attr.path_mtu.bytes())) > max_message_psns(max_unacked)
        {
            // PSNs compare within half the 24-bit space (§9.7.1, §9.7.5): a message
            // and the window before it must span fewer than 2^23 PSNs, or its responses
            // and ACKs cannot be told from old ones (2^31 bytes at MTU 256 are 2^23
            // packets). Refused like a length beyond max_msg_sz in rxe (EINVAL).
            return Err(VerbsError::InvalidValue(
                "message needs more PSNs than the 2^23 PSN window allows at this path MTU",
            ));
        }
        qp_event!(
            ctx.now,
            ctx.dev,
            qpn,
            Event::WqePosted,
            queue = "sq",
            wr_id = wr.wr_id,
            opcode = ?wr.opcode,
            len = len64
        );
        qp.req
            .post(SendWqe::new(wr, segs, len64.min(1 << 31) as u32));
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), VerbsError> {
        self.alive()?;
        let max_wr = self.cfg.max_qp_wr;
        let (qp, mut ctx) = self
            .split(qpn, self.last_now)
            .ok_or(VerbsError::NotFound("QP"))?;
        super::qp::refuse_post_recv(qp)?;
        match qp.state {
            QpState::Reset => return Err(VerbsError::WrongState(QpState::Reset)),
            QpState::Err => {
                let wc = WorkCompletion {
                    wr_id: wr.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    imm_data: None,
                    invalidated_rkey: None,
                    qp_num: qp.qpn,
                    src_qp: qp.attr.dest_qp_num,
                    grh: false,
                    sl: 0,
                };
                ctx.complete(qp.recv_cq, wc);
                return Ok(());
            }
            _ => {}
        }
        if qp.resp.rq_len() >= qp.init.max_recv_wr.min(max_wr) as usize {
            return Err(VerbsError::QueueFull);
        }
        let len = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        let segs = resolve_sges(ctx.mem, qp.pd, &wr.sg_list, Access::LOCAL_WRITE);
        qp_event!(
            ctx.now,
            ctx.dev,
            qpn,
            Event::WqePosted,
            queue = "rq",
            wr_id = wr.wr_id,
            len = len
        );
        qp.resp.post_recv(RecvWqe {
            wr_id: wr.wr_id,
            segs,
            len,
        });
        Ok(())
    }

    /// Send work requests of `qpn` posted and not yet completed (0 for an unknown QP).
    pub fn send_queue_len(&self, qpn: Qpn) -> usize {
        self.slot(qpn)
            .and_then(|i| self.qps[i].as_ref())
            .map_or(0, |q| q.req.sq_len())
    }

    /// Counters of one QP.
    pub fn qp_counters(&self, qpn: Qpn) -> Option<QpCounters> {
        self.slot(qpn)
            .and_then(|i| self.qps[i].as_ref())
            .map(|q| q.counters)
    }

    /// Device counters: the sum over all QPs ever created plus frame-level drops.
    pub fn counters(&self) -> DeviceCounters {
        let mut d = self.dev;
        d.qp = self.retired;
        for q in self.qps.iter().flatten() {
            d.qp.add(&q.counters);
        }
        d.cq_overruns = self.cqs.iter().flatten().map(|c| c.overruns).sum();
        if let Some(cc) = &self.cc {
            let c = cc.counters();
            d.np_cnp_sent = c.np_cnp_sent;
            d.np_ecn_marked_roce_packets = c.np_ecn_marked_roce_packets;
            d.rp_cnp_handled = c.rp_cnp_handled;
            d.rp_cnp_ignored = c.rp_cnp_ignored;
        }
        d
    }

    /// A snapshot of every QP, MR and CQ, like `rdma resource show` (see
    /// [`super::resources`]).
    pub fn resources(&self) -> super::resources::Resources {
        use super::resources::{CqResource, QpResource, Resources};
        // ib_core counts a QP once per role (`ib_qp_usecnt_inc`: send CQ, then receive
        // CQ), so a QP with one CQ for both queues counts twice, as `rdma` shows it.
        let mut users = vec![0u32; self.cqs.len()];
        for q in self.qps.iter().flatten() {
            for cq in [q.send_cq, q.recv_cq] {
                if let Some(u) = users.get_mut(cq.0 as usize) {
                    *u += 1;
                }
            }
        }
        Resources {
            dev: self.name.to_string(),
            qps: self
                .qps
                .iter()
                .flatten()
                .map(|q| QpResource {
                    qpn: q.qpn.value(),
                    qp_type: super::resources::qp_type_name(q.init.qp_type).to_string(),
                    srq: q.init.srq.map(|s| s.0),
                    pd: q.pd.0,
                    state: q.state,
                    dest_qpn: q.attr.dest_qp_num.value(),
                    path_mtu: q.attr.path_mtu.bytes(),
                    sq_psn: q.req.next_psn().value(),
                    una_psn: q.req.una().value(),
                    rq_psn: q.resp.epsn().value(),
                    sq_wrs: q.req.sq_len() + q.ud.sq.len(),
                    sq_started: q.req.sq_started(),
                    rq_wrs: q.resp.rq_len(),
                    retry_left: q.req.retry_left(),
                    rnr_left: q.req.rnr_left(),
                    rnr_wait_until_ns: q.req.timers().get(Timer::RnrWait).map(Instant::as_nanos),
                    ack_deadline_ns: q.req.timers().get(Timer::Retransmit).map(Instant::as_nanos),
                    packets_sent: q.counters.packets_sent,
                    retransmitted_packets: q.counters.retransmitted_packets,
                })
                .collect(),
            mrs: self.mem.regions().map(Into::into).collect(),
            cqs: self
                .cqs
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    let c = c.as_ref()?;
                    let (queued, cqe) = c.depth();
                    Some(CqResource {
                        cqn: i as u32,
                        cqe,
                        users: users.get(i).copied().unwrap_or(0),
                        queued,
                        overruns: c.overruns,
                    })
                })
                .collect(),
            owner: None,
        }
    }

    /// Memory one QP occupies now (see `Qp::memory_bytes`).
    pub fn qp_memory_bytes(&self, qpn: Qpn) -> Option<usize> {
        self.slot(qpn)
            .and_then(|i| self.qps[i].as_ref())
            .map(|q| q.memory_bytes())
    }

    // ----- sans-IO surface ----------------------------------------------------------

    /// Create the GSI QP (QP1): a UD QP numbered 1 with Q_Key 0x80010000 (IBTA §13.5.1),
    /// in RESET like any QP; the MAD layer (the CM) drives it.
    pub fn create_gsi_qp(&mut self, pd: Pd, init: &QpInitAttr) -> Result<Qpn, VerbsError> {
        if self.slot(ud::GSI_QPN).is_some() {
            return Err(VerbsError::Resource("the GSI QP exists already"));
        }
        let init = QpInitAttr {
            qp_type: QpType::Ud,
            ..*init
        };
        let q = self.create_qp(pd, &init)?;
        let i = self.slot(q).ok_or(VerbsError::NotFound("QP"))?;
        let Some(qp) = self.qps[i].as_mut() else {
            return Err(VerbsError::NotFound("QP"));
        };
        qp.qpn = ud::GSI_QPN;
        qp.src_port = super::qp::udp_src_port(ud::GSI_QPN);
        qp.attr.qkey = ud::GSI_QKEY;
        self.gsi_slot = Some(i);
        if let Some(cc) = self.cc.as_mut() {
            cc.remove_qp(q);
            cc.add_qp(Instant::ZERO, ud::GSI_QPN);
        }
        Ok(ud::GSI_QPN)
    }

    /// The P_Key at `index` of the port's P_Key table (`ibv_query_pkey`): index 0 is
    /// 0xFFFF, the default full-membership key.
    pub fn query_pkey(&self, index: u16) -> Option<u16> {
        ud::PKEY_TABLE.get(usize::from(index)).copied()
    }

    /// The counters of a UD QP.
    pub fn ud_counters(&self, qpn: Qpn) -> Option<UdCounters> {
        self.slot(qpn)
            .and_then(|i| self.qps[i].as_ref())
            .map(|q| q.ud.counters)
    }

    /// Send WRs of a UD QP not yet sent (the verbs layer lets them leave before it
    /// destroys the QP: rxe sends a UD datagram inside `ibv_post_send`).
    pub fn ud_pending_sends(&self, qpn: Qpn) -> usize {
        self.slot(qpn)
            .and_then(|i| self.qps[i].as_ref())
            .map_or(0, |q| q.ud.sq.len())
    }

    /// `ibv_post_send` on a UD QP: SEND or SEND with immediate to `dest`.
    pub fn post_send_ud(&mut self, qpn: Qpn, wr: SendWr, dest: &UdDest) -> Result<(), VerbsError> {
        self.alive()?;
        let r = self.post_send_ud_now(qpn, wr, dest);
        self.touch_qpn(qpn);
        r
    }

    fn post_send_ud_now(&mut self, qpn: Qpn, wr: SendWr, dest: &UdDest) -> Result<(), VerbsError> {
        let max_wr = self.cfg.max_qp_wr;
        let ngids = self.cfg.gids.len();
        let (qp, ctx) = self
            .split(qpn, self.last_now)
            .ok_or(VerbsError::NotFound("QP"))?;
        ud::post_send(qp, ctx, wr, dest, max_wr, ngids)
    }

    /// A UD datagram (service UD, P_Key checked) for one of our QPs: its verdict, and the
    /// QP's slot when the verdict was reached at the QP (the caller counts both).
    fn handle_ud(&mut self, now: Instant, view: &FrameView<'_>) -> (RxVerdict, Option<usize>) {
        let bth = view.bth();
        let Some(slot) = self.slot(bth.dest_qp()) else {
            return (RxVerdict::UnknownQp, None);
        };
        let Some((qp, ctx)) = self.split_slot(slot, now) else {
            return (RxVerdict::UnknownQp, None);
        };
        ud::receive(qp, ctx, slot, now, view)
    }

    /// Take one received frame and say what became of it. Never panics; every frame not
    /// taken is counted, in one place (`count_rx`, see [`super::verdict`]).
    // Inlined into the few loops that feed frames (the sim's, the driver's, the capture
    // tap's): per packet, a call here costs as much as several of the checks below.
    #[inline(always)]
    pub fn handle_frame(&mut self, now: Instant, frame: &[u8]) -> RxVerdict {
        let (v, slot) = self.judge_frame(now, frame);
        self.count_rx(v, slot, frame.len());
        if let Some(i) = slot {
            self.touch(i);
        }
        if self.read_pool.take_held(self.cfg.read_device_pkts) {
            self.wake_read_held();
        }
        v
    }

    /// Wake the QPs whose next READ part waits for the device's READ credit
    /// (`super::read_credit`): responses just freed some.
    #[cold]
    fn wake_read_held(&mut self) {
        for i in 0..self.qps.len() {
            if self.qps[i]
                .as_ref()
                .is_some_and(|q| q.req.read_held_by_device())
            {
                self.touch(i);
            }
        }
    }

    /// Count one frame's verdict: the only code that moves the receive drop counters and
    /// a QP's `packets_received` (see [`super::verdict`] for the contract). `slot` is the
    /// QP's slot for a verdict reached at a QP.
    #[inline(always)]
    pub(super) fn count_rx(&mut self, v: RxVerdict, slot: Option<usize>, len: usize) {
        let d = &mut self.dev;
        match v {
            RxVerdict::Malformed => d.malformed_frames_dropped += 1,
            RxVerdict::BadIcrc => {
                d.malformed_frames_dropped += 1;
                d.icrc_errors += 1;
            }
            RxVerdict::WrongAddress => d.wrong_address_dropped += 1,
            RxVerdict::Unsupported => d.unsupported_dropped += 1,
            RxVerdict::BadPkey => d.bad_pkey_dropped += 1,
            RxVerdict::UnknownQp | RxVerdict::WrongPeer => d.unknown_qp_dropped += 1,
            RxVerdict::Taken
            | RxVerdict::WrongState
            | RxVerdict::WrongService
            | RxVerdict::BadQkey
            | RxVerdict::NoRecvWqe => {}
        }
        let Some(qp) = slot
            .and_then(|i| self.qps.get_mut(i))
            .and_then(Option::as_mut)
        else {
            return;
        };
        qp.counters.packets_received += 1;
        qp.counters.bytes_received += len as u64;
        let ud = qp.init.qp_type == QpType::Ud;
        match v {
            RxVerdict::WrongState if ud => qp.ud.counters.wrong_state_dropped += 1,
            RxVerdict::WrongState => qp.counters.dropped_wrong_state += 1,
            RxVerdict::WrongService => qp.counters.invalid_requests += 1,
            RxVerdict::BadQkey => qp.ud.counters.bad_qkey_dropped += 1,
            RxVerdict::NoRecvWqe => qp.ud.counters.no_recv_wqe_dropped += 1,
            _ => {}
        }
    }

    /// Judge one frame and hand it to its QP's transport when it is taken: the verdict,
    /// and the QP's slot when the verdict was reached at a QP. Counts nothing itself.
    #[inline(always)]
    fn judge_frame(&mut self, now: Instant, frame: &[u8]) -> (RxVerdict, Option<usize>) {
        self.last_now = now;
        // Borrowed, not moved out of the `Result`: a copy of the whole view per packet.
        let parsed = FrameView::parse_inline(frame);
        let Ok(view) = &parsed else {
            return (RxVerdict::Malformed, None);
        };
        if view.verify_icrc().is_err() {
            return (RxVerdict::BadIcrc, None);
        }
        // Only the fields the transport needs are read, straight from the checked frame
        // (`view.repr()` would rebuild every header).
        let b = view.bytes();
        // As a fixed-size array: six bytes compared in two loads, not a `bcmp` call.
        let dst_mac = b.get(..6).and_then(|d| <[u8; 6]>::try_from(d).ok());
        if dst_mac != Some(self.cfg.mac) {
            // A frame to a group: each QP attached to it gets a copy (`super::mcast_verbs`;
            // rxe `rxe_rcv_mcast_pkt`).
            if mac_is_multicast(b) && !self.mcast.is_empty() {
                return self.handle_mcast(now, view);
            }
            return (RxVerdict::WrongAddress, None);
        }
        let (src_ip, dst_ip) = view.ip_addrs();
        if !self.cfg.gids.iter().any(|g| gid_is(g, dst_ip)) {
            return (RxVerdict::WrongAddress, None);
        }
        let info = view.info();
        if info.service == Service::Cnp {
            // A CNP names the QP whose sending must slow down (RoCE v2 annex A17.9).
            let qpn = view.bth().dest_qp();
            return match self.cc.as_mut() {
                Some(cc) => {
                    let v = cc.handle_cnp_frame(now, view);
                    qp_event!(now, self.name, qpn, Event::CnpReceived, verdict = ?v);
                    // The cut (or the one owed at the monitor period's end) moves the
                    // QP's rate timer.
                    if let Some(i) = self.slot(qpn) {
                        self.track(i);
                    }
                    (RxVerdict::Taken, None)
                }
                None => (RxVerdict::Unsupported, None),
            };
        }
        if !matches!(info.service, Service::Rc | Service::Uc | Service::Ud) {
            return (RxVerdict::Unsupported, None);
        }
        // The BTH fields the transport uses, read in place.
        let bth = view.bth();
        // P_Key (IBTA §9.6, §10.9): a packet whose P_Key matches no table
        // entry is dropped and counted (rxe `check_keys`, port `bad_pkey_cntr`).
        let pkey = bth.pkey().0;
        if !ud::PKEY_TABLE.iter().any(|&k| pkey_matches(pkey, k)) {
            return (RxVerdict::BadPkey, None);
        }
        if info.service == Service::Ud {
            return self.handle_ud(now, view);
        }
        let (dest_qp, psn, ack_req) = (bth.dest_qp(), bth.psn(), bth.ack_req());
        // Most packets (SEND/WRITE MIDDLE, plain READ responses) carry none.
        let ext_buf;
        let ext = if info.exts.is_empty() {
            &ExtHeaders::NONE
        } else {
            ext_buf = view.ext_headers();
            &ext_buf
        };
        let Some(slot) = self.slot(dest_qp) else {
            return (RxVerdict::UnknownQp, None);
        };
        let Some((qp, mut ctx)) = self.split_slot(slot, now) else {
            return (RxVerdict::UnknownQp, None);
        };
        // An RC packet for a UD QP is not this QP's (rxe `check_type_state`).
        if qp.init.qp_type == QpType::Ud {
            return (RxVerdict::UnknownQp, None);
        }
        let has_peer = !matches!(qp.state, QpState::Reset | QpState::Init);
        // An RC QP talks to one peer only (IBTA §9.6, packet source validation): a frame
        // from another address is not this QP's, as if the QP did not exist (its own
        // counters do not see it).
        if has_peer && !gid_is(&qp.attr.ah_attr.dgid, src_ip) {
            return (RxVerdict::WrongPeer, None);
        }
        if !has_peer {
            return (RxVerdict::WrongState, Some(slot));
        }
        let payload = view.payload();
        let uc = qp.init.qp_type == super::qp::QpType::Uc;
        if uc != (info.service == Service::Uc) {
            // An opcode of the other connected service: not this QP's transport.
            return (RxVerdict::WrongService, Some(slot));
        }
        if uc {
            if info.is_request() {
                super::uc::handle_request(qp, &mut ctx, info, psn, ext, payload);
            } else {
                return (RxVerdict::WrongState, Some(slot));
            }
        } else if info.is_request() {
            execute::handle_request(qp, &mut ctx, info, psn, ack_req, ext, payload);
        } else {
            handle_response(qp, &mut ctx, info, psn, ext, payload);
            if qp.state == QpState::Sqd && qp.req.drained_now() {
                ctx.raise(super::srq::AsyncEvent::SqDrained(qp.qpn));
            }
        }
        // Notification point: a CE mark on any packet the QP took may owe its peer a CNP.
        if let Some(cc) = self.cc.as_mut() {
            cc.on_received(now, dest_qp, view.ip_ecn());
        }
        (RxVerdict::Taken, Some(slot))
    }

    /// The earliest time `handle_timeout` has work, if any.
    #[must_use = "the caller must call handle_timeout at this deadline"]
    pub fn poll_timeout(&self) -> Option<Instant> {
        // Every QP's timers, the congestion control's too, are in the scheduler's set.
        self.sched.next_deadline()
    }

    /// Run every timer that is due at `now`: only the QPs with a timer due are visited.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.last_now = now;
        let mut due = std::mem::take(&mut self.due);
        self.sched.take_due(now, &mut due);
        for &i in &due {
            let Some(qp) = self.qps[i].as_mut() else {
                continue;
            };
            // The tracked deadline is the QP's own (`touch` follows every change).
            if let Some(cc) = self.cc.as_mut() {
                if qp.req.timers().any_expired(&Timer::CONGESTION, now) {
                    // Rate events; a pacer hold ends (the QP is woken below and asks the
                    // pacer again).
                    cc.handle_qp_timeout(now, qp.qpn);
                }
            }
            if qp.req.timers().any_expired(&Timer::TRANSPORT, now) {
                let mut ctx = Ctx {
                    mem: &mut self.mem,
                    cqs: &mut self.cqs,
                    cfg: &self.cfg,
                    now,
                    dev: self.name,
                    srqs: &mut self.srqs,
                    events: &mut self.async_events,
                };
                completer::handle_timeout(qp, &mut ctx);
            }
            // Re-arms (or clears) its timer and lets it send what the timer released.
            self.touch(i);
        }
        due.clear();
        self.due = due;
    }

    /// Write the next frame to send into `buf` and return its length. `buf` must hold
    /// [`MAX_FRAME_LEN`] bytes; a shorter buffer gets nothing.
    #[must_use = "the frame written into `buf` must be sent"]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        self.poll_transmit_with_reason(now, buf).map(|(n, _)| n)
    }

    /// [`Self::poll_transmit`], also telling why the frame is sent (see [`TxReason`]).
    #[must_use = "the frame written into `buf` must be sent"]
    pub fn poll_transmit_with_reason(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Option<(usize, TxReason)> {
        self.last_now = now;
        if buf.len() < MAX_FRAME_LEN {
            return None;
        }
        // CNPs go first and unpaced: they are what slows the congestion down.
        if let Some(len) = self.transmit_cnp(buf) {
            return Some((len, TxReason::Cnp));
        }
        // The ready list, not every slot (`super::sched`): each slot tried at most once.
        for _ in 0..self.sched.ready_len() {
            let Some(i) = self.sched.peek_ready() else {
                break;
            };
            // Nothing in `transmit_qp` wakes a slot: the front is still `i` after it.
            let r = self.transmit_qp(i, now, buf);
            // Sending arms the retransmission timer, a local error may have cleared it,
            // and the pacer may hold the QP (its `Timer::Pacer`).
            if !self.track(i) {
                self.sched.drop_front();
                continue;
            }
            if r.is_some() {
                // Back at the end: packet-by-packet round robin.
                self.sched.requeue_front();
                return r;
            }
            // Otherwise it has nothing to send until something wakes it: a post, a frame,
            // or one of its timers (a pacer hold ends with its `Timer::Pacer`).
            self.sched.drop_front();
        }
        None
    }

    /// Emit the next CNP owed to a peer, if any.
    fn transmit_cnp(&mut self, buf: &mut [u8]) -> Option<usize> {
        loop {
            let qpn = self.cc.as_mut()?.poll_cnp()?;
            let (dscp, prio) = self.cc.as_ref()?.cnp_marking();
            let Some(qp) = self.slot(qpn).and_then(|i| self.qps[i].as_ref()) else {
                continue;
            };
            // Only a QP with an address vector (RTR onwards) knows its peer.
            if !matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                continue;
            }
            let (eth, ip) = frame_addrs(&self.cfg, qp);
            let frame = build_cnp(eth, ip, qp.attr.dest_qp_num, dscp, prio);
            qp_event!(
                self.last_now,
                self.name,
                qpn,
                Event::CnpSent,
                dest_qp = qp.attr.dest_qp_num.value()
            );
            if let Ok(n) = frame.emit(buf) {
                return Some(n);
            }
        }
    }

    // Once per packet, from one call site: inlined into `poll_transmit_with_reason`.
    #[inline(always)]
    fn transmit_qp(&mut self, i: usize, now: Instant, buf: &mut [u8]) -> Option<(usize, TxReason)> {
        // With congestion control on, data is ECN-capable so that switches mark it CE
        // instead of dropping it (ConnectX and hiroce send ECT(0), docs/wire-format.md §5).
        let ect = self.cc.is_some();
        let qp = self.qps[i].as_mut()?;
        if !matches!(
            qp.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Err
        ) {
            return None;
        }
        let mut ctx = Ctx {
            mem: &mut self.mem,
            cqs: &mut self.cqs,
            cfg: &self.cfg,
            now,
            dev: self.name,
            srqs: &mut self.srqs,
            events: &mut self.async_events,
        };
        if qp.init.qp_type == QpType::Ud {
            return ud::transmit(qp, &mut ctx, &mut self.scratch, buf);
        }
        if fail_local_error_at_head(qp, &mut ctx) {
            return None;
        }
        let mtu = qp.attr.path_mtu.bytes();
        let uc = qp.init.qp_type == QpType::Uc;
        // The two sides alternate packet by packet; `tx_turn` says who goes first.
        let resp_first = qp.tx_turn;
        for pass in 0..2 {
            if (pass == 0) == resp_first {
                let bufs = TxBufs {
                    mem: ctx.mem,
                    scratch: &mut self.scratch,
                };
                let advertise = self.cfg.advertise_credits;
                let Some(tx) = qp
                    .resp
                    .poll_transmit(mtu, advertise, bufs, &mut qp.counters)
                else {
                    continue;
                };
                qp.tx_turn = false;
                let len = match tx {
                    Tx::Send(p) => emit(&self.cfg, qp, ect, &p, buf).map(|l| (l, p.reason)),
                    Tx::Unreadable => None,
                    Tx::OwnerGone(psn) => {
                        execute::owner_gone(qp, &mut ctx, psn);
                        return None;
                    }
                };
                if qp.resp.error_due() {
                    qp.enter_error(&mut ctx);
                }
                if let Some((l, reason)) = len {
                    qp.counters.packets_sent += 1;
                    qp.counters.bytes_sent += l as u64;
                    return Some((l, reason));
                }
            } else {
                if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
                    continue;
                }
                let env = ReqTxEnv {
                    cfg: &self.cfg,
                    cc: self.cc.as_mut(),
                    counters: &mut qp.counters,
                    qpn: qp.qpn,
                    dev: self.name,
                    now,
                    mtu,
                    timeout: qp.attr.timeout,
                    max_rd_atomic: qp.attr.max_rd_atomic,
                    draining: qp.state == QpState::Sqd,
                    uc,
                    read_pool: &self.read_pool,
                };
                let bufs = TxBufs {
                    mem: ctx.mem,
                    scratch: &mut self.scratch,
                };
                let Some(tx) = qp.req.poll_transmit(env, bufs) else {
                    // The packet's bytes may just have been found gone.
                    if fail_local_error_at_head(qp, &mut ctx) {
                        return None;
                    }
                    continue;
                };
                qp.tx_turn = true;
                let Tx::Send(p) = tx else {
                    continue;
                };
                let len = emit(&self.cfg, qp, ect, &p, buf);
                let reason = p.reason;
                if uc {
                    super::uc::packet_sent(qp, &mut ctx);
                }
                if let Some(l) = len {
                    qp.counters.packets_sent += 1;
                    qp.counters.bytes_sent += l as u64;
                    if let Some(cc) = self.cc.as_mut() {
                        cc.on_sent(now, qp.qpn, l);
                    }
                    return Some((l, reason));
                }
            }
        }
        None
    }
}

/// A QP's earliest deadline: retransmission, the end of an RNR wait, or a
/// congestion-control timer (rate event, pacer release).
fn qp_deadline(qp: &Qp) -> Option<Instant> {
    qp.req.timers().next_timeout()
}

/// A WR whose local check failed (at post time, or when its data was gathered: the
/// region went away) completes in error once it heads the queue, and the QP goes to ERR.
/// Returns true when that happened.
fn fail_local_error_at_head(qp: &mut Qp, ctx: &mut Ctx<'_>) -> bool {
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
        return false;
    }
    let Some(st) = qp.req.head_local_error() else {
        return false;
    };
    qp.complete_send_front(ctx, st, 0);
    qp.enter_error(ctx);
    true
}

/// The most packets one message may take: with up to `max_unacked` PSNs already
/// outstanding when it starts, its last PSN stays within 2^23 − 1 of the oldest
/// unacknowledged one (see `post_send`).
pub(crate) const fn max_message_psns(max_unacked: u32) -> u64 {
    (1 << 23) - 1 - max_unacked as u64
}

/// The BTH P_Key of a received packet matches the table entry `ours` (IBTA §10.9, rxe
/// `pkey_match`): the low 15 bits are equal and not zero, and not both are limited
/// members (bit 15 clear).
#[inline(always)]
pub(super) fn pkey_matches(theirs: u16, ours: u16) -> bool {
    let base = theirs & 0x7fff;
    base != 0 && base == ours & 0x7fff && (theirs | ours) & 0x8000 != 0
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "event_tests.rs"]
mod event_tests;

#[cfg(test)]
#[path = "cc_sched_tests.rs"]
mod cc_sched_tests;

#[cfg(test)]
#[path = "read_credit_tests.rs"]
mod read_credit_tests;
