//! Congestion control for RoCE v2, sans-IO: DCQCN (Zhu et al., SIGCOMM 2015) as ConnectX
//! runs it, with the paper's three roles (docs/congestion.md) — the switch (CP) marks ECN CE, the
//! receiver's notification point ([`np`]) answers CE marks with CNPs, the sender's reaction
//! point ([`dcqcn`]) cuts and recovers the QP's rate, and a [`pacer`] holds the QP's frames
//! to that rate.
//!
//! Contract:
//! - No I/O, no clock: every input carries `now` (an engine [`Instant`]); outputs are
//!   rates, "send now / not before t" answers, CNP decisions and, per QP, the two deadlines
//!   of [`CongestionControl::qp_timers`].
//! - Timers are per QP, never device-wide: the engine copies a QP's two deadlines (its
//!   rate controller's next event, its pacer's release) into the QP's `TimerTable`
//!   (`Timer::Rate`, `Timer::Pacer`) after every call for that QP, its scheduler orders
//!   them with the transport's, and [`CongestionControl::handle_qp_timeout`] runs one QP's.
//!   Nothing here walks every QP, so 10 000 idle QPs cost nothing per step
//!   (docs/performance.md, "Many QPs").
//! - [`CongestionControl`] is the one object an engine embeds: it owns, per local QP, a
//!   [`RateController`] and a [`Pacer`] that always runs at the controller's current rate,
//!   and the device's [`NotificationPoint`]. Rate changes reach the pacer within the same
//!   call that caused them.
//! - Bad input never panics: a CNP for an unknown QP, or a frame that is not a CNP, is
//!   counted in `rp_cnp_ignored` and otherwise ignored.
//! - Counters carry the mlx5 names users know: `np_cnp_sent`, `np_ecn_marked_roce_packets`,
//!   `rp_cnp_handled`, `rp_cnp_ignored`; per QP the current rate, target rate and α are
//!   readable at any time ([`CongestionControl::qp_status`]).
//!
//! Other algorithms plug in through [`RateController`] (one file each, like [`dcqcn`]) and
//! a variant of [`Algorithm`].

pub mod dcqcn;
pub mod np;
pub mod pacer;
pub mod params;

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use super::time::{Duration, Instant};
use super::trace::Event;
use crate::wire::{FrameView, Opcode, Qpn};

pub use dcqcn::{Dcqcn, Phase};
pub use np::{NotificationPoint, NpCounters, build_cnp};
pub use pacer::Pacer;
pub use params::{DcqcnParams, DcqcnStyle, PARAMS, ParamError, ParamInfo};

/// What a reaction point did with a CNP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CnpVerdict {
    /// The rate was cut (counted in `rp_cnp_handled`).
    Handled,
    /// Nothing changed: too soon after the last cut, for an unknown QP, or not a CNP
    /// (counted in `rp_cnp_ignored`).
    Ignored,
}

/// The sending side of one congestion-control algorithm for one QP.
pub trait RateController: core::fmt::Debug + Send {
    /// A CNP for this QP arrived at `now`.
    fn on_cnp(&mut self, now: Instant) -> CnpVerdict;
    /// `bytes` of this QP left at `now`.
    fn on_bytes_sent(&mut self, now: Instant, bytes: u64);
    /// Run whatever fell due up to `now`; harmless to call early.
    fn on_timer(&mut self, now: Instant);
    /// When `on_timer` has work next: every timer the algorithm runs, folded into one
    /// deadline (the engine schedules it as the QP's `Timer::Rate`).
    fn poll_timeout(&self) -> Option<Instant>;
    /// The rate the QP may send at now, bit/s.
    fn rate_bps(&self) -> u64;
    /// The rate the controller is heading for, bit/s.
    fn target_bps(&self) -> u64;
    /// DCQCN's α, for algorithms that have one.
    fn alpha(&self) -> Option<f64>;
    /// Short name for tools (`dcqcn`).
    fn name(&self) -> &'static str;
    /// DCQCN's stage counters (timer and byte-counter events since the last cut), and
    /// whether a cut is owed; for traces.
    fn stage_state(&self) -> (u32, u32, bool) {
        (0, 0, false)
    }
}

/// Which algorithm new QPs get.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Algorithm {
    /// No congestion control: QPs send at line rate (CE marks are still answered with
    /// CNPs, as a ConnectX NP does regardless of its RP).
    None,
    Dcqcn(DcqcnParams),
}

/// Device-wide congestion counters (mlx5 names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CongestionCounters {
    pub np_cnp_sent: u64,
    pub np_ecn_marked_roce_packets: u64,
    pub rp_cnp_handled: u64,
    pub rp_cnp_ignored: u64,
}

/// One QP's rate state, readable at any time.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QpRateStatus {
    pub rate_bps: u64,
    pub target_bps: u64,
    pub alpha: Option<f64>,
    pub rp_cnp_handled: u64,
    pub rp_cnp_ignored: u64,
}

#[derive(Debug)]
struct QpCc {
    cc: Option<Box<dyn RateController>>,
    pacer: Pacer,
    handled: u64,
    ignored: u64,
    /// Bytes this QP sent (for traces).
    bytes_sent: u64,
    /// Refused by [`CongestionControl::may_send`] until then (the QP's pacer timer).
    held_until: Option<Instant>,
}

impl QpCc {
    fn rate(&self, line: u64) -> u64 {
        self.cc.as_ref().map_or(line, |c| c.rate_bps())
    }

    fn timers(&self) -> QpCcTimers {
        QpCcTimers {
            rate: self.cc.as_ref().and_then(|c| c.poll_timeout()),
            pacer: self.held_until,
        }
    }
}

/// One QP's congestion-control deadlines (the engine's `Timer::Rate` and `Timer::Pacer`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCcTimers {
    /// The rate controller's next event ([`RateController::poll_timeout`]).
    pub rate: Option<Instant>,
    /// When the pacer lets a held QP's refused frame go.
    pub pacer: Option<Instant>,
}

/// The hasher of [`CongestionControl`]'s QP map. Its keys are QPNs the device hands out
/// itself (consecutive numbers, not chosen by a peer), so one multiplication by an odd
/// 64-bit constant (the golden ratio's fraction) spreads them over the table's buckets
/// at a fraction of SipHash's cost: consecutive QPNs get distinct low bits, and the
/// high bits mix every bit of the QPN.
#[derive(Clone, Copy, Debug, Default)]
pub struct QpnHasher(u64);

impl Hasher for QpnHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
}

/// Congestion control of one device: a reaction point and pacer per QP, and the NP.
#[derive(Debug)]
pub struct CongestionControl {
    algorithm: Algorithm,
    line_rate_bps: u64,
    burst: u64,
    /// Per local QP, looked up by QPN several times per packet (`may_send`, `on_sent`,
    /// `qp_timers`): a hash map, not an ordered one, so that the lookup costs the same
    /// with 10 000 QPs as with one (docs/performance.md, "Many QPs").
    qps: HashMap<Qpn, QpCc, BuildHasherDefault<QpnHasher>>,
    np: NotificationPoint,
    /// Local QPs that owe their peer a CNP, oldest first.
    cnps: VecDeque<Qpn>,
    handled: u64,
    ignored: u64,
    /// Whether QPs at the maximum rate are paced too (see [`Self::set_pace_unthrottled`]).
    pace_unthrottled: bool,
    /// The device name trace events carry.
    pub(crate) dev: &'static str,
}

impl CongestionControl {
    /// Congestion control for a port of `line_rate_bps`, pacers with `burst_bytes`
    /// buckets. The NP interval and CNP DSCP come from the DCQCN parameters (ConnectX
    /// defaults with [`Algorithm::None`]).
    pub fn new(algorithm: Algorithm, line_rate_bps: u64, burst_bytes: u64) -> Self {
        let np_params = match algorithm {
            Algorithm::Dcqcn(p) => p,
            Algorithm::None => DcqcnParams::connectx(),
        };
        CongestionControl {
            algorithm,
            line_rate_bps,
            burst: burst_bytes,
            qps: HashMap::default(),
            np: NotificationPoint::new(Duration::from_nanos(np_params.np_interval_ns())),
            cnps: VecDeque::new(),
            handled: 0,
            ignored: 0,
            pace_unthrottled: true,
            dev: "",
        }
    }

    /// Whether a QP sending at the maximum rate (never throttled, or recovered) is held to
    /// it by its pacer (the default), or left alone. A real port paces at line rate by
    /// itself, and ConnectX attaches a rate limiter to a flow only once a CNP throttled it;
    /// pacing every frame at line rate would also break up the driver's transmit batches
    /// (a bucket of a few frames per wake-up).
    pub fn set_pace_unthrottled(&mut self, on: bool) {
        self.pace_unthrottled = on;
    }

    /// The line rate given to the reaction points, bit/s.
    pub fn line_rate_bps(&self) -> u64 {
        self.line_rate_bps
    }

    /// The DCQCN parameters, when the algorithm is DCQCN.
    pub fn dcqcn_params(&self) -> Option<DcqcnParams> {
        match self.algorithm {
            Algorithm::Dcqcn(p) => Some(p),
            Algorithm::None => None,
        }
    }

    /// Every tracked QP with its rate state, in QPN order.
    pub fn qp_statuses(&self) -> Vec<(Qpn, QpRateStatus)> {
        let mut v: Vec<(Qpn, QpRateStatus)> = self
            .qps
            .keys()
            .filter_map(|&q| Some((q, self.qp_status(q)?)))
            .collect();
        v.sort_unstable_by_key(|&(q, _)| q);
        v
    }

    /// The algorithm new QPs get.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The DSCP and 802.1p priority our CNPs carry.
    pub fn cnp_marking(&self) -> (u8, u8) {
        let p = match self.algorithm {
            Algorithm::Dcqcn(p) => p,
            Algorithm::None => DcqcnParams::connectx(),
        };
        (p.np_cnp_dscp as u8, p.np_cnp_prio as u8)
    }

    /// Start tracking local QP `qpn` (unthrottled, full pacer bucket).
    pub fn add_qp(&mut self, now: Instant, qpn: Qpn) {
        let cc: Option<Box<dyn RateController>> = match self.algorithm {
            Algorithm::None => None,
            Algorithm::Dcqcn(p) => Some(Box::new(Dcqcn::new(p, self.line_rate_bps))),
        };
        let rate = cc.as_ref().map_or(self.line_rate_bps, |c| c.rate_bps());
        self.qps.insert(
            qpn,
            QpCc {
                cc,
                pacer: Pacer::new(now, rate, self.burst),
                handled: 0,
                ignored: 0,
                bytes_sent: 0,
                held_until: None,
            },
        );
    }

    /// Stop tracking a destroyed QP.
    pub fn remove_qp(&mut self, qpn: Qpn) {
        self.qps.remove(&qpn);
        self.np.remove_qp(qpn);
        self.cnps.retain(|&q| q != qpn);
    }

    fn sync(q: &mut QpCc, now: Instant, line: u64, dev: &'static str, qpn: Qpn) {
        let r = q.rate(line);
        if r != q.pacer.rate_bps() {
            q.pacer.set_rate(now, r);
            // A DCQCN update: rate, target and α after it.
            if crate::proto::trace::enabled() {
                let (target, alpha) =
                    q.cc.as_ref()
                        .map_or((line, None), |c| (c.target_bps(), c.alpha()));
                crate::proto::trace::qp_event!(
                    now,
                    dev,
                    qpn,
                    Event::RateUpdate,
                    rate_bps = r,
                    target_bps = target,
                    alpha = alpha.unwrap_or(0.0)
                );
            }
        }
    }

    /// A CNP for local QP `qpn` arrived at `now`.
    pub fn on_cnp(&mut self, now: Instant, qpn: Qpn) -> CnpVerdict {
        let (line, dev) = (self.line_rate_bps, self.dev);
        let v = match self.qps.get_mut(&qpn) {
            Some(q) => {
                let v = match q.cc.as_mut() {
                    Some(cc) => cc.on_cnp(now),
                    // No reaction point: a CNP changes nothing.
                    None => CnpVerdict::Ignored,
                };
                match v {
                    CnpVerdict::Handled => q.handled += 1,
                    CnpVerdict::Ignored => q.ignored += 1,
                }
                Self::sync(q, now, line, dev, qpn);
                // Every CNP with the reaction point's state after it, and the bytes the
                // QP sent so far: enough to replay the run against another model.
                if crate::proto::trace::enabled() {
                    if let Some(cc) = q.cc.as_ref() {
                        let (t, bc, cut_due) = cc.stage_state();
                        crate::proto::trace::qp_event!(
                            now,
                            dev,
                            qpn,
                            Event::Cnp,
                            handled = v == CnpVerdict::Handled,
                            rate_bps = cc.rate_bps(),
                            target_bps = cc.target_bps(),
                            alpha = cc.alpha().unwrap_or(0.0),
                            timer_events = t,
                            byte_events = bc,
                            cut_due = cut_due,
                            bytes_sent = q.bytes_sent
                        );
                    }
                }
                v
            }
            None => CnpVerdict::Ignored,
        };
        match v {
            CnpVerdict::Handled => self.handled += 1,
            CnpVerdict::Ignored => self.ignored += 1,
        }
        v
    }

    /// A received frame that may be a CNP (already parsed; the caller verified its ICRC).
    /// Returns `None` when it is not a CNP at all, so the caller can go on with it.
    pub fn handle_cnp_frame(&mut self, now: Instant, frame: &FrameView<'_>) -> Option<CnpVerdict> {
        let bth = frame.bth();
        if bth.opcode() != Opcode::CNP {
            return None;
        }
        // Accepted with or without BECN: the annex asks senders to set it, and we are
        // liberal in what we accept (docs/wire-format.md §5).
        Some(self.on_cnp(now, bth.dest_qp()))
    }

    /// Local QP `qpn` received a RoCE packet with IP ECN field `ecn` at `now`: true when a
    /// CNP must go back to its peer now. The QP is then also queued for [`Self::poll_cnp`].
    pub fn on_received(&mut self, now: Instant, qpn: Qpn, ecn: u8) -> bool {
        let send = self.np.on_packet(now, qpn, ecn);
        if send && !self.cnps.contains(&qpn) {
            self.cnps.push_back(qpn);
        }
        send
    }

    /// The next local QP whose peer must get a CNP (build it with [`build_cnp`], DestQP =
    /// the QP's remote QPN, marking from [`Self::cnp_marking`]).
    #[must_use = "a drained CNP must be sent"]
    pub fn poll_cnp(&mut self) -> Option<Qpn> {
        self.cnps.pop_front()
    }

    /// May QP `qpn` send a frame of `len` bytes at `now`? When not, the QP is remembered
    /// as held until its pacer allows it: that time is its pacer timer
    /// ([`Self::qp_timers`]).
    pub fn may_send(&mut self, now: Instant, qpn: Qpn, len: usize) -> bool {
        let line = self.line_rate_bps;
        let pace_all = self.pace_unthrottled;
        let Some(q) = self.qps.get_mut(&qpn) else {
            return true;
        };
        if !pace_all && q.rate(line) >= line {
            q.held_until = None;
            return true;
        }
        let t = q.pacer.next_send_time(now, len);
        if t <= now {
            q.held_until = None;
            true
        } else {
            q.held_until = Some(t);
            false
        }
    }

    /// When QP `qpn` may send a frame of `len` bytes: `now` if it may now. Unknown QPs are
    /// not paced.
    pub fn next_send_time(&self, now: Instant, qpn: Qpn, len: usize) -> Instant {
        let line = self.line_rate_bps;
        self.qps.get(&qpn).map_or(now, |q| {
            if !self.pace_unthrottled && q.rate(line) >= line {
                now
            } else {
                q.pacer.next_send_time(now, len)
            }
        })
    }

    /// How many frames of `len` bytes QP `qpn` sends in `d` at its current rate, when a
    /// reaction point holds it below the line rate; `None` when unthrottled.
    pub fn throttled_packets_within(&self, qpn: Qpn, d: Duration, len: usize) -> Option<u32> {
        let q = self.qps.get(&qpn)?;
        let rate = q.rate(self.line_rate_bps);
        if rate >= self.line_rate_bps || len == 0 {
            return None;
        }
        let bits = u128::from(rate) * d.as_nanos() / 1_000_000_000;
        Some(u32::try_from(bits / (len as u128 * 8)).unwrap_or(u32::MAX))
    }

    /// QP `qpn` sent a frame of `len` bytes at `now`.
    pub fn on_sent(&mut self, now: Instant, qpn: Qpn, len: usize) {
        let (line, dev) = (self.line_rate_bps, self.dev);
        let pace_all = self.pace_unthrottled;
        if let Some(q) = self.qps.get_mut(&qpn) {
            q.held_until = None;
            q.bytes_sent = q.bytes_sent.saturating_add(len as u64);
            // An unpaced QP leaves its bucket full, for the first frames after a cut.
            if pace_all || q.rate(line) < line {
                q.pacer.consume(now, len);
            }
            if let Some(cc) = q.cc.as_mut() {
                cc.on_bytes_sent(now, len as u64);
            }
            Self::sync(q, now, line, dev, qpn);
        }
    }

    /// QP `qpn`'s two deadlines: its rate controller's next event and, while the pacer
    /// holds it, its release. The engine keeps them in the QP's timer table after every
    /// call for the QP (none for an unknown QP).
    #[must_use = "the deadlines must be scheduled"]
    pub fn qp_timers(&self, qpn: Qpn) -> QpCcTimers {
        self.qps
            .get(&qpn)
            .map_or(QpCcTimers::default(), QpCc::timers)
    }

    /// Run QP `qpn`'s congestion-control timers due at `now` (its rate controller's
    /// events, its pacer's release); harmless when none is due. Its deadlines after that:
    /// [`Self::qp_timers`].
    pub fn handle_qp_timeout(&mut self, now: Instant, qpn: Qpn) {
        let (line, dev) = (self.line_rate_bps, self.dev);
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        if q.held_until.is_some_and(|t| t <= now) {
            // Released: the engine asks `may_send` again when it next transmits.
            q.held_until = None;
        }
        let due =
            q.cc.as_ref()
                .and_then(|c| c.poll_timeout())
                .is_some_and(|t| t <= now);
        if due {
            if let Some(cc) = q.cc.as_mut() {
                cc.on_timer(now);
            }
            Self::sync(q, now, line, dev, qpn);
        }
    }

    /// Rate, target and α of QP `qpn`.
    pub fn qp_status(&self, qpn: Qpn) -> Option<QpRateStatus> {
        let q = self.qps.get(&qpn)?;
        Some(QpRateStatus {
            rate_bps: q.rate(self.line_rate_bps),
            target_bps: q.cc.as_ref().map_or(self.line_rate_bps, |c| c.target_bps()),
            alpha: q.cc.as_ref().and_then(|c| c.alpha()),
            rp_cnp_handled: q.handled,
            rp_cnp_ignored: q.ignored,
        })
    }

    /// The device counters.
    pub fn counters(&self) -> CongestionCounters {
        let np = self.np.counters();
        CongestionCounters {
            np_cnp_sent: np.np_cnp_sent,
            np_ecn_marked_roce_packets: np.np_ecn_marked_roce_packets,
            rp_cnp_handled: self.handled,
            rp_cnp_ignored: self.ignored,
        }
    }
}
