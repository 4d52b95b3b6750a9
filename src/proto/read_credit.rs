//! READ credit: the requester bounds the READ response packets it has asked for and not
//! yet received, per QP ([`Config::read_qp_pkts`]) and per device
//! ([`Config::read_device_pkts`]), so that a loss-free link never overflows its own
//! receive path (docs/transport.md, "READ credit").
//!
//! Only the requester knows how many responses it asked for: the responder answers every
//! READ at once and as fast as it can. A READ larger than the QP's part size goes out as
//! several ordinary READ requests ("parts"), each for the next `part_pkts` response
//! packets at the matching remote address, each at the PSN its first response takes
//! (IBTA vol. 1 §9.7.1: a READ request consumes one PSN per response packet, so the
//! parts' PSNs follow each other as one READ's would). The work request completes once
//! its last response is in. A part is issued only while the responses outstanding plus
//! the part fit both bounds (or nothing is outstanding at all, so that a bound smaller
//! than a part still lets one through); a retried part (Go-Back-N) asks again for packets
//! already counted and is never held.
//!
//! Contract: [`ReadPool`] is the device's count, shared by its QPs' requesters (each
//! returns what it still counts when dropped, so a QP destroyed or reset mid-READ gives its
//! credit back). It is an atomic so that the engine stays `Send`; only the engine's thread
//! touches it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::config::Config;

/// Most READ requests a QP has in flight at once when splitting (each part counts against
/// `max_rd_atomic` and the responder's `max_dest_rd_atomic` like any READ): the QP's
/// bound is cut into this many parts so that responses keep coming while the next part
/// is asked for.
pub(crate) const PARTS_IN_FLIGHT: u32 = 4;

/// The device's READ response packets outstanding, shared by its QPs' requesters.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReadPool(Arc<PoolShared>);

#[derive(Debug, Default)]
struct PoolShared {
    /// Response packets asked for and not yet received, over all QPs.
    out: AtomicU32,
    /// A QP was held back by the device bound since the last [`ReadPool::take_held`].
    held: AtomicBool,
}

impl ReadPool {
    /// Response packets outstanding on the device.
    pub fn outstanding(&self) -> u32 {
        self.0.out.load(Ordering::Relaxed)
    }

    pub(crate) fn add(&self, n: u32) {
        self.0.out.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn sub(&self, n: u32) {
        // Never below zero: each requester returns only what it added.
        let _ = self
            .0
            .out
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
    }

    pub(crate) fn mark_held(&self) {
        self.0.held.store(true, Ordering::Relaxed);
    }

    /// True once after a QP was held back by the device bound and room came back
    /// (`out` below `limit`): the device then wakes the QPs that wait for it.
    #[inline]
    pub fn take_held(&self, limit: u32) -> bool {
        self.0.held.load(Ordering::Relaxed)
            && self.outstanding() < limit
            && self.0.held.swap(false, Ordering::Relaxed)
    }
}

/// Which bound held a READ part back, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// The QP's own bound, [`Config::read_qp_pkts`].
    Qp,
    /// The device's bound, [`Config::read_device_pkts`].
    Device,
}

/// The two bounds, from the device configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadBounds {
    /// The QP's bound, never above the device's nor below one packet.
    pub qp: u32,
    /// The device's bound, at least one packet.
    pub device: u32,
}

impl ReadBounds {
    pub fn of(cfg: &Config) -> ReadBounds {
        let device = cfg.read_device_pkts.max(1);
        ReadBounds {
            qp: cfg.read_qp_pkts.clamp(1, device),
            device,
        }
    }

    /// Response packets per READ request for a READ of `npkts` packets on a QP allowed
    /// `max_rd_atomic` READs in flight: the QP's bound cut into up to
    /// [`PARTS_IN_FLIGHT`] parts (one part when only one READ may be in flight), never
    /// more than the READ.
    pub fn part_pkts(self, max_rd_atomic: u32, npkts: u32) -> u32 {
        let parts = max_rd_atomic.clamp(1, PARTS_IN_FLIGHT);
        (self.qp / parts).max(1).min(npkts.max(1))
    }

    /// Rule: may a new part of `n` response packets go out, with `qp_out` outstanding on
    /// the QP and `dev_out` on the device? Nothing outstanding always may (progress).
    pub fn admit(self, n: u32, qp_out: u32, dev_out: u32) -> Result<(), Held> {
        if qp_out > 0 && qp_out.saturating_add(n) > self.qp {
            return Err(Held::Qp);
        }
        if dev_out > 0 && dev_out.saturating_add(n) > self.device {
            return Err(Held::Device);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(qp: u32, dev: u32) -> ReadBounds {
        ReadBounds::of(&Config {
            read_qp_pkts: qp,
            read_device_pkts: dev,
            ..Config::default()
        })
    }

    #[test]
    fn parts_cut_the_qp_bound_by_reads_in_flight() {
        let c = cfg(256, 512);
        assert_eq!(c.part_pkts(16, 8192), 64);
        assert_eq!(c.part_pkts(2, 8192), 128);
        assert_eq!(c.part_pkts(1, 8192), 256);
        // max_rd_atomic 0 (not set yet) counts as one.
        assert_eq!(c.part_pkts(0, 8192), 256);
        // Never more than the READ, never zero.
        assert_eq!(c.part_pkts(16, 10), 10);
        assert_eq!(cfg(2, 512).part_pkts(16, 100), 1);
        // The QP's bound never exceeds the device's.
        assert_eq!(cfg(4096, 100).part_pkts(1, 8192), 100);
    }

    #[test]
    fn admit_names_the_bound_that_holds() {
        let c = cfg(256, 512);
        assert_eq!(c.admit(64, 0, 0), Ok(()));
        assert_eq!(c.admit(64, 192, 192), Ok(()));
        assert_eq!(c.admit(64, 193, 193), Err(Held::Qp));
        assert_eq!(c.admit(64, 64, 449), Err(Held::Device));
        // Nothing outstanding: a part larger than the bound still goes.
        assert_eq!(cfg(8, 8).admit(64, 0, 0), Ok(()));
        assert_eq!(cfg(8, 8).admit(64, 0, 1), Err(Held::Device));
    }

    #[test]
    fn pool_counts_and_reports_a_hold_once_room_is_back() {
        let p = ReadPool::default();
        let q = p.clone();
        p.add(100);
        q.add(20);
        assert_eq!(p.outstanding(), 120);
        p.mark_held();
        assert!(!p.take_held(100), "no room yet");
        q.sub(30);
        assert!(p.take_held(100));
        assert!(!p.take_held(100), "reported once");
        p.sub(1000);
        assert_eq!(p.outstanding(), 0);
    }
}
