//! Loopback: a frame the device sends to its own MAC address never reaches the wire; it
//! goes back into the device's receive path, as rxe loops packets to one of its own GIDs
//! (rxe_net.c: `rxe_loopback`). So two QPs of one device (two processes of the device
//! service, or one program) talk without a peer on the link.
//!
//! Contract: [`Loopback`] wraps the port's [`FrameIo`]. Frames whose destination MAC is
//! the device's go to a queue that the next `recv_batch` hands out before the port's
//! frames; the others go to the port unchanged and in order. Its `poll_fd` is an epoll
//! descriptor holding the port's descriptor and an eventfd written when the queue fills,
//! so a driver asleep on it wakes for a looped frame as for a received one. The number
//! of looped frames is [`Loopback::looped`] (`tx_frames` / `rx_frames` of the port do not
//! count them).
//!
//! Multicast: a frame to a group Ethernet address that is in the device's [`LoopGroups`]
//! (the MACs of the groups a QP of this device is attached to, kept by
//! src/verbs/mcast.rs) goes to the wire and, once the port took it, a copy into the queue:
//! each local member receives it too, the sending QP included when it is attached. rxe
//! gets the same from the IP stack, whose multicast loopback (`ip_mc_output`,
//! `ip6_finish_output2`) delivers a copy to local listeners when the host is a member of
//! the group on the interface; this device holds that membership exactly while one of
//! its QPs is attached (docs/verbs-abi.md, "Multicast").

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use rustix::event::EventfdFlags;

use crate::io::frame::{BATCH, FrameIo, IoStats};

/// The group MACs whose frames loop back as well as leave (see the module's contract).
pub type LoopGroups = Arc<Mutex<Vec<[u8; 6]>>>;

/// A port with loopback of frames to `mac`.
pub struct Loopback {
    inner: Box<dyn FrameIo>,
    mac: [u8; 6],
    groups: LoopGroups,
    queue: VecDeque<Vec<u8>>,
    bell: OwnedFd,
    /// The bell was written and not read back since: `recv_batch` reads it only then,
    /// not on every call (an empty busy poll steps the port in a tight loop, and a read
    /// of an eventfd is a system call).
    rung: bool,
    /// Reads of the bell so far (what `rung` saves).
    bell_reads: u64,
    looped: u64,
}

impl Loopback {
    pub fn new(inner: Box<dyn FrameIo>, mac: [u8; 6]) -> io::Result<Loopback> {
        Self::with_groups(inner, mac, LoopGroups::default())
    }

    /// As [`Loopback::new`], with the multicast groups whose frames loop back too.
    pub fn with_groups(
        inner: Box<dyn FrameIo>,
        mac: [u8; 6],
        groups: LoopGroups,
    ) -> io::Result<Loopback> {
        let bell = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Loopback {
            inner,
            mac,
            groups,
            queue: VecDeque::new(),
            bell,
            rung: false,
            bell_reads: 0,
            looped: 0,
        })
    }

    /// Frames looped back so far.
    pub fn looped(&self) -> u64 {
        self.looped
    }

    fn is_local(&self, f: &[u8]) -> bool {
        f.get(..6) == Some(&self.mac[..])
    }

    /// Copy into the queue the frames of `sent` (taken by the port) that go to a group
    /// with a local member; true when there was one.
    fn loop_group_frames(&mut self, sent: &[&[u8]]) -> bool {
        if !sent.iter().any(|f| crate::wire::mac_is_multicast(f)) {
            return false;
        }
        let groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let mut any = false;
        for f in sent {
            if f.get(..6)
                .is_some_and(|m| groups.iter().any(|g| g[..] == *m))
            {
                self.queue.push_back(f.to_vec());
                self.looped += 1;
                any = true;
            }
        }
        any
    }

    /// Take frames in order: local ones into the queue, runs of the others through
    /// `out` (`send_batch` or `queue_batch` of the port).
    fn take(
        &mut self,
        frames: &[&[u8]],
        out: fn(&mut dyn FrameIo, &[&[u8]]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let mut done = 0;
        let mut rang = false;
        while done < frames.len() {
            if self.is_local(frames[done]) {
                self.queue.push_back(frames[done].to_vec());
                self.looped += 1;
                done += 1;
                rang = true;
                continue;
            }
            let run = frames[done..]
                .iter()
                .position(|f| self.is_local(f))
                .map_or(frames.len(), |p| done + p);
            let n = match out(&mut *self.inner, &frames[done..run]) {
                Ok(n) => n,
                Err(e) if done == 0 => return Err(e),
                Err(_) => 0,
            };
            rang |= self.loop_group_frames(&frames[done..(done + n).min(run)]);
            done += n;
            if done < run {
                break;
            }
        }
        if rang && !self.rung {
            let _ = rustix::io::write(&self.bell, &1u64.to_ne_bytes());
            self.rung = true;
        }
        Ok(done)
    }
}

impl FrameIo for Loopback {
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut n = 0;
        while n < BATCH {
            let Some(fr) = self.queue.pop_front() else {
                break;
            };
            f(&fr);
            n += 1;
        }
        if self.queue.is_empty() && self.rung {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&self.bell, &mut b);
            self.rung = false;
            self.bell_reads += 1;
        }
        Ok(n + self.inner.recv_batch(f)?)
    }

    fn send_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        self.take(frames, |io, f| io.send_batch(f))
    }

    fn queue_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        self.take(frames, |io, f| io.queue_batch(f))
    }

    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.inner.poll_fd()
    }

    fn bell_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.bell.as_fd())
    }

    fn unkicked(&self) -> u32 {
        self.inner.unkicked()
    }

    fn flush(&mut self) -> io::Result<u32> {
        self.inner.flush()
    }

    fn io_stats(&self) -> IoStats {
        self.inner.io_stats()
    }

    fn rx_pending(&mut self) -> bool {
        !self.queue.is_empty() || self.inner.rx_pending()
    }

    fn tx_pending(&mut self) -> bool {
        self.inner.tx_pending()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::frame::sim_link;
    use crate::proto::MAX_FRAME_LEN;
    use rustix::event::{PollFd, PollFlags};

    /// Whether a thread asleep on the port (its `poll_fd` and `bell_fd`, as the driver
    /// sleeps) would wake now.
    fn readable(lo: &Loopback) -> bool {
        let (fd, bell) = (
            lo.poll_fd(),
            lo.bell_fd().expect("a loopback port has a bell"),
        );
        let mut p = [
            PollFd::new(&fd, PollFlags::IN),
            PollFd::new(&bell, PollFlags::IN),
        ];
        rustix::event::poll(
            &mut p,
            Some(&rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            }),
        )
        .unwrap_or(0)
            > 0
    }

    #[test]
    fn frames_to_our_mac_come_back_and_others_leave_in_order() {
        let (a, mut b) = sim_link(MAX_FRAME_LEN + 64).unwrap();
        let me = [2, 0, 0, 0, 0, 1];
        let mut lo = Loopback::new(Box::new(a), me).unwrap();
        assert!(!readable(&lo));
        let local = [&me[..], &[0xaa; 20][..]].concat();
        let other1 = [&[2, 0, 0, 0, 0, 2][..], &[1; 20][..]].concat();
        let other2 = [&[2, 0, 0, 0, 0, 2][..], &[2; 20][..]].concat();
        let n = lo.send_batch(&[&other1, &local, &other2]).unwrap();
        assert_eq!(n, 3);
        assert_eq!(lo.looped(), 1);
        assert!(readable(&lo), "a looped frame wakes a sleeping driver");
        let mut got = Vec::new();
        lo.recv_batch(&mut |f| got.push(f.to_vec())).unwrap();
        assert_eq!(got, vec![local.clone()]);
        assert!(!readable(&lo), "drained");
        let mut wire = Vec::new();
        b.recv_batch(&mut |f| wire.push(f.to_vec())).unwrap();
        assert_eq!(
            wire,
            vec![other1, other2],
            "the others reach the link, in order"
        );
        // A frame from the link still wakes it.
        b.send_batch(&[&local]).unwrap();
        assert!(readable(&lo));
    }

    /// A looped frame counts as waiting to be received (an empty busy poll must not
    /// skip the step that would deliver it).
    #[test]
    fn frames_to_a_group_with_a_local_member_leave_and_come_back() {
        let (a, mut b) = sim_link(MAX_FRAME_LEN + 64).unwrap();
        let me = [2, 0, 0, 0, 0, 1];
        let groups = LoopGroups::default();
        let mut lo = Loopback::with_groups(Box::new(a), me, groups.clone()).unwrap();
        let member = [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03];
        let other = [0x01, 0x00, 0x5e, 0x01, 0x02, 0x04];
        let to_member = [&member[..], &[7; 20][..]].concat();
        let to_other = [&other[..], &[8; 20][..]].concat();
        assert_eq!(lo.send_batch(&[&to_member]).unwrap(), 1);
        assert_eq!(lo.looped(), 0, "no local member yet");
        groups.lock().unwrap().push(member);
        assert_eq!(lo.send_batch(&[&to_member, &to_other]).unwrap(), 2);
        assert_eq!(lo.looped(), 1);
        assert!(readable(&lo));
        let mut got = Vec::new();
        lo.recv_batch(&mut |f| got.push(f.to_vec())).unwrap();
        assert_eq!(
            got,
            vec![to_member.clone()],
            "only the member's group came back"
        );
        let mut wire = Vec::new();
        while b.recv_batch(&mut |f| wire.push(f.to_vec())).unwrap() > 0 {}
        assert_eq!(
            wire,
            vec![to_member.clone(), to_member, to_other],
            "all left"
        );
    }

    #[test]
    fn a_looped_frame_is_pending_until_received() {
        let (a, _b) = sim_link(MAX_FRAME_LEN + 64).unwrap();
        let me = [2, 0, 0, 0, 0, 1];
        let mut lo = Loopback::new(Box::new(a), me).unwrap();
        assert!(!lo.rx_pending());
        let local = [&me[..], &[0xaa; 20][..]].concat();
        lo.send_batch(&[&local]).unwrap();
        assert!(lo.rx_pending());
        lo.recv_batch(&mut |_| {}).unwrap();
        assert!(!lo.rx_pending());
    }

    /// An empty queue costs no system call: the bell is read back once after it rang,
    /// not on every `recv_batch` (a busy-polling application steps the port in a tight
    /// loop).
    #[test]
    fn the_bell_is_read_only_after_it_rang() {
        let (a, _b) = sim_link(MAX_FRAME_LEN + 64).unwrap();
        let me = [2, 0, 0, 0, 0, 1];
        let mut lo = Loopback::new(Box::new(a), me).unwrap();
        let local = [&me[..], &[0xaa; 20][..]].concat();
        for _ in 0..100 {
            lo.recv_batch(&mut |_| {}).unwrap();
        }
        assert_eq!(lo.bell_reads, 0, "nothing rang");
        lo.send_batch(&[&local, &local]).unwrap();
        let mut n = 0;
        for _ in 0..100 {
            lo.recv_batch(&mut |_| n += 1).unwrap();
        }
        assert_eq!((n, lo.bell_reads), (2, 1));
        assert!(!readable(&lo), "read back: a sleeping driver stays asleep");
    }
}
