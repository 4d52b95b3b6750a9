//! The device's QP scheduler: which QP slots may have a frame to send, and which have a
//! transport timer armed, so that `Rnic::poll_transmit`, `poll_timeout` and
//! `handle_timeout` cost what the QPs with work cost, not what every QP costs
//! (docs/performance.md, "Many QPs"). A device with 10 000 QPs of which a few hundred
//! are busy then walks those few hundred.
//!
//! - The ready list: slots in round-robin order. A slot is put there ([`Scheduler::wake`])
//!   by whatever may give its QP a frame to send: a post, a received frame for it, a timer
//!   of it that ran, a state change. `poll_transmit` takes slots from the front and puts a
//!   slot that sent a frame back at the end (packet-by-packet round robin, as the scan
//!   over all slots did before); a slot that had nothing to send leaves the list until the
//!   next wake.
//! - The timer set: each slot's earliest deadline (its QP's `TimerTable`: retransmission,
//!   RNR wait, the congestion control's rate timer and pacer release), ordered, updated by
//!   [`Scheduler::track`] after every call that may arm, move or clear one; its first
//!   entry is the device's earliest deadline. A QP the DCQCN pacer refused leaves the
//!   ready list like one with nothing to send; its pacer timer brings it back.

use std::collections::{BTreeSet, VecDeque};

use super::time::Instant;

#[derive(Debug, Default)]
pub(crate) struct Scheduler {
    ready: VecDeque<usize>,
    /// Whether each slot is in `ready`.
    queued: Vec<bool>,
    /// (deadline, slot) of every slot with a timer armed.
    timers: BTreeSet<(Instant, usize)>,
    /// Each slot's entry in `timers`.
    armed: Vec<Option<Instant>>,
    /// Slots tried at the front of the ready list and handed out by `take_due` since
    /// creation.
    visits: u64,
}

/// Grow `v` so that index `i` exists.
fn reach<T: Default + Clone>(v: &mut Vec<T>, i: usize) {
    if v.len() <= i {
        v.resize(i + 1, T::default());
    }
}

impl Scheduler {
    /// Slot `i` may have something to send: queue it (once) at the end.
    // Inlined: called per packet (after every received frame); the common case is one
    // load and one store.
    #[inline]
    pub fn wake(&mut self, i: usize) {
        if let Some(q) = self.queued.get_mut(i) {
            if !*q {
                *q = true;
                self.ready.push_back(i);
            }
            return;
        }
        reach(&mut self.queued, i);
        self.queued[i] = true;
        self.ready.push_back(i);
    }

    /// The next slot to try, left at the front of the ready list: the caller then either
    /// [`Self::requeue_front`]s it (it sent a frame) or [`Self::drop_front`]s it (it had
    /// nothing). Taking the slot off and waking it again when it sent would give the
    /// same order; this does not take a lone slot off the list and put it back per
    /// packet.
    #[inline]
    pub fn peek_ready(&self) -> Option<usize> {
        self.ready.front().copied()
    }

    /// The front slot sent a frame: to the end of the list (round robin; a lone slot
    /// stays where it is, which is the end too).
    #[inline]
    pub fn requeue_front(&mut self) {
        self.visits += 1;
        if self.ready.len() > 1
            && let Some(i) = self.ready.pop_front()
        {
            self.ready.push_back(i);
        }
    }

    /// The front slot had nothing to send: off the list until the next wake.
    #[inline]
    pub fn drop_front(&mut self) {
        self.visits += 1;
        if let Some(i) = self.ready.pop_front() {
            self.queued[i] = false;
        }
    }

    /// How many slots were tried at the front of the ready list ([`Self::requeue_front`],
    /// [`Self::drop_front`]) or handed out by [`Self::take_due`] since the scheduler was
    /// made: the QPs the transmit and timer paths visited.
    pub fn visits(&self) -> u64 {
        self.visits
    }

    /// Slots on the ready list now.
    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Slot `i`'s earliest deadline is now `deadline` (None: no timer armed).
    // Inlined: called twice per packet, and the deadline has usually not moved.
    #[inline]
    pub fn track(&mut self, i: usize, deadline: Option<Instant>) {
        if self.armed.get(i) == Some(&deadline) {
            return;
        }
        self.retrack(i, deadline);
    }

    /// [`Self::track`] when the deadline moved (or the slot is new).
    #[inline(never)]
    fn retrack(&mut self, i: usize, deadline: Option<Instant>) {
        reach(&mut self.armed, i);
        if self.armed[i] == deadline {
            return;
        }
        if let Some(old) = self.armed[i] {
            self.timers.remove(&(old, i));
        }
        if let Some(d) = deadline {
            self.timers.insert((d, i));
        }
        self.armed[i] = deadline;
    }

    /// The earliest deadline of any slot.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.first().map(|&(d, _)| d)
    }

    /// Take the slots whose deadline is at or before `now` into `out` (their entries
    /// removed: the caller runs their timers and tracks them again).
    pub fn take_due(&mut self, now: Instant, out: &mut Vec<usize>) {
        while let Some(&(d, i)) = self.timers.first() {
            if d > now {
                break;
            }
            self.timers.pop_first();
            self.armed[i] = None;
            self.visits += 1;
            out.push(i);
        }
    }

    /// Slot `i` is gone (its QP destroyed): forget its timer. A stale ready entry
    /// is harmless (an empty slot sends nothing).
    pub fn forget(&mut self, i: usize) {
        self.track(i, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    #[test]
    fn ready_list_is_round_robin_and_each_slot_is_queued_once() {
        let mut s = Scheduler::default();
        for i in [3, 1, 3, 7, 1] {
            s.wake(i);
        }
        assert_eq!(s.ready_len(), 3);
        assert_eq!(s.peek_ready(), Some(3));
        // A slot that sent goes back to the end; one that had nothing stays off.
        s.requeue_front();
        // Still queued: a wake does not add it twice.
        s.wake(3);
        assert_eq!(s.ready_len(), 3);
        assert_eq!(s.peek_ready(), Some(1));
        s.drop_front();
        assert_eq!(s.peek_ready(), Some(7));
        s.drop_front();
        assert_eq!(s.peek_ready(), Some(3));
        // A lone slot that sent stays (it is the end too).
        s.requeue_front();
        assert_eq!(s.peek_ready(), Some(3));
        s.drop_front();
        assert_eq!(s.peek_ready(), None);
        assert_eq!(s.ready_len(), 0);
        // Taken off, it can be queued again.
        s.wake(1);
        assert_eq!(s.peek_ready(), Some(1));
        assert_eq!(s.visits(), 5);
    }

    #[test]
    fn timers_give_the_earliest_deadline_and_follow_moves() {
        let mut s = Scheduler::default();
        assert_eq!(s.next_deadline(), None);
        s.track(0, Some(t(500)));
        s.track(9, Some(t(300)));
        s.track(4, Some(t(800)));
        assert_eq!(s.next_deadline(), Some(t(300)));
        // Moved later, then cleared: the set follows exactly.
        s.track(9, Some(t(900)));
        assert_eq!(s.next_deadline(), Some(t(500)));
        s.track(0, None);
        assert_eq!(s.next_deadline(), Some(t(800)));
        let mut due = Vec::new();
        s.take_due(t(799), &mut due);
        assert!(due.is_empty());
        s.take_due(t(900), &mut due);
        assert_eq!(due, [4, 9]);
        assert_eq!(s.next_deadline(), None);
        // A slot taken is untracked: tracking it again re-arms it.
        s.track(4, Some(t(1000)));
        assert_eq!(s.next_deadline(), Some(t(1000)));
        s.forget(4);
        assert_eq!(s.next_deadline(), None);
    }

    #[test]
    fn equal_deadlines_of_different_slots_are_both_kept() {
        let mut s = Scheduler::default();
        s.track(1, Some(t(100)));
        s.track(2, Some(t(100)));
        let mut due = Vec::new();
        s.take_due(t(100), &mut due);
        assert_eq!(due, [1, 2]);
    }
}
