//! The frame port interface below the driver ([`FrameIo`]: whole Ethernet frames in and
//! out, a descriptor to sleep on, the port's counters), its AF_XDP implementation (over
//! [`XskPort`]) and the socket-pair port ([`SimIo`], [`sim_link`]): an in-process link for
//! the runnable examples and for tests of the API without root.
//!
//! Contract: frames are byte slices; nothing here parses them. A port hands out at most
//! [`BATCH`] frames per `recv_batch`.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixDatagram;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use serde::Serialize;

use crate::io::afxdp::XskPort;

/// Frames moved per batch (receive and transmit).
pub const BATCH: usize = 64;

/// Frame I/O below the driver: whole Ethernet frames in and out, and a descriptor that
/// `poll(2)` reports readable when frames wait.
pub trait FrameIo: Send {
    /// Hand every waiting frame (at most a bounded batch) to `f`; never blocks.
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8])) -> io::Result<usize>;
    /// Queue frames in order; returns how many of the leading ones were taken.
    fn send_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize>;
    /// Readable when frames can be received.
    fn poll_fd(&self) -> BorrowedFd<'_>;
    /// A second descriptor, readable when frames wait that `poll_fd` does not report
    /// (the loopback queue, driver/loopback.rs); a thread that sleeps until frames
    /// arrive polls both. `None` (the default): `poll_fd` covers everything.
    fn bell_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    /// [`FrameIo::send_batch`], but the frames may wait in the port until the next
    /// `send_batch` or `flush` pushes them out together with others (the AF_XDP port
    /// leaves them on its tx ring without the `sendto`). Order is kept.
    fn queue_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize>;
    /// Frames queued by `queue_batch` that still wait for a push.
    fn unkicked(&self) -> u32;
    /// Push queued frames out and reclaim finished ones; returns how many frames the
    /// port still has on its way out.
    fn flush(&mut self) -> io::Result<u32>;
    /// Counters of the port.
    fn io_stats(&self) -> IoStats;
    /// Whether a `recv_batch` now might deliver a frame: `false` only when the port
    /// knows, cheaply and without blocking, that nothing waits. A busy poll that finds
    /// nothing to do skips its step on `false` (driver/poll.rs); `true` is always correct.
    fn rx_pending(&mut self) -> bool {
        true
    }
    /// Whether frames given to the port may still be on their way out (queued without a
    /// push, or not yet reaped as sent): a `flush` would have work. `true` is always
    /// correct.
    fn tx_pending(&mut self) -> bool {
        true
    }
}

/// Port counters for the stat snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IoStats {
    pub rx_frames: u64,
    pub tx_frames: u64,
    pub tx_backpressure: u64,
    /// Pushes of queued frames to the wire (AF_XDP: `sendto` kicks; the simulated link:
    /// sends of held frames).
    pub tx_kicks: u64,
    /// Frames the kernel dropped for want of a UMEM chunk: the fill ring was empty
    /// (AF_XDP only; `XDP_STATISTICS` `rx_dropped`).
    pub kernel_rx_dropped: u64,
    /// Frames the kernel dropped because the RX ring was full (AF_XDP only;
    /// `XDP_STATISTICS` `rx_ring_full`, which the kernel keeps apart from `rx_dropped`).
    pub kernel_rx_ring_full: u64,
    /// Times the kernel found the fill ring empty (AF_XDP only; `XDP_STATISTICS`
    /// `rx_fill_ring_empty_descs`).
    pub kernel_fill_ring_empty: u64,
    /// RoCE v2 frames the XDP filter redirected to the socket (AF_XDP only).
    pub filter_redirected: u64,
}

impl FrameIo for XskPort {
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        XskPort::recv_batch(self, f).map_err(io::Error::other)
    }
    fn send_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        XskPort::send_batch(self, frames).map_err(io::Error::other)
    }
    fn queue_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        XskPort::queue_batch(self, frames).map_err(io::Error::other)
    }
    fn unkicked(&self) -> u32 {
        XskPort::unkicked(self)
    }
    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
    fn flush(&mut self) -> io::Result<u32> {
        // Reap first: in copy mode the kernel completes frames inside the kick itself, so
        // most of the time nothing is left and no extra system call is needed.
        self.reap_completions();
        if self.frame_counts().in_tx == 0 {
            return Ok(0);
        }
        XskPort::flush(self).map_err(io::Error::other)
    }
    fn rx_pending(&mut self) -> bool {
        XskPort::rx_pending(self)
    }
    fn tx_pending(&mut self) -> bool {
        // Copy mode completes frames inside the kick: reaping (ring reads, no system
        // call) usually leaves nothing in flight.
        self.reap_completions();
        self.unkicked() > 0 || self.frame_counts().in_tx > 0
    }
    fn io_stats(&self) -> IoStats {
        let s = self.stats();
        let k = self.kernel_stats().ok();
        IoStats {
            rx_frames: s.rx_frames,
            tx_frames: s.tx_frames,
            tx_backpressure: s.tx_backpressure,
            tx_kicks: s.tx_kicks,
            kernel_rx_dropped: k.map_or(0, |k| k.rx_dropped),
            kernel_rx_ring_full: k.map_or(0, |k| k.rx_ring_full),
            kernel_fill_ring_empty: k.map_or(0, |k| k.rx_fill_ring_empty_descs),
            filter_redirected: self
                .filter_stats()
                .and_then(Result::ok)
                .map(|f| f.redirected)
                .unwrap_or(0),
        }
    }
}

/// One end of an in-process link: a Unix datagram socket pair carries one frame per
/// datagram. For the runnable examples and for tests of the API without root.
#[derive(Debug)]
pub struct SimIo {
    sock: UnixDatagram,
    buf: Vec<u8>,
    /// Frames queued by `queue_batch`, sent by the next `send_batch` or `flush` (like
    /// frames on an AF_XDP tx ring waiting for the kick).
    held: Vec<Vec<u8>>,
    stats: IoStats,
}

/// Two connected [`SimIo`] ends, each receiving frames of up to `max_frame_len` bytes
/// (a longer datagram is cut there, as a NIC cuts a frame past its buffer).
pub fn sim_link(max_frame_len: usize) -> io::Result<(SimIo, SimIo)> {
    let (a, b) = UnixDatagram::pair()?;
    let mk = |s: UnixDatagram| -> io::Result<SimIo> {
        s.set_nonblocking(true)?;
        Ok(SimIo {
            sock: s,
            buf: vec![0; max_frame_len],
            held: Vec::new(),
            stats: IoStats::default(),
        })
    };
    Ok((mk(a)?, mk(b)?))
}

impl FrameIo for SimIo {
    fn recv_batch(&mut self, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut n = 0;
        while n < BATCH {
            match self.sock.recv(&mut self.buf) {
                Ok(len) => {
                    f(&self.buf[..len]);
                    n += 1;
                    self.stats.rx_frames += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }
    fn send_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        if self.push_held()? > 0 {
            // Held frames go first; what did not fit stays held, and nothing may
            // overtake it.
            return Ok(0);
        }
        self.stats.tx_kicks += 1;
        self.send_now(frames)
    }
    fn queue_batch(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        self.held.extend(frames.iter().map(|f| f.to_vec()));
        Ok(frames.len())
    }
    fn unkicked(&self) -> u32 {
        self.held.len() as u32
    }
    fn poll_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
    fn flush(&mut self) -> io::Result<u32> {
        self.push_held()
    }
    fn io_stats(&self) -> IoStats {
        self.stats
    }
    fn rx_pending(&mut self) -> bool {
        // A zero-timeout poll(2): a system call, but no engine lock (this port serves
        // tests and examples, not the fast path).
        let mut p = [PollFd::new(&self.sock, PollFlags::IN)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // An error reads as "maybe": the step that follows finds out.
        poll(&mut p, Some(&zero)).map_or(true, |n| n > 0)
    }
    fn tx_pending(&mut self) -> bool {
        !self.held.is_empty()
    }
}

impl SimIo {
    fn send_now(&mut self, frames: &[&[u8]]) -> io::Result<usize> {
        for (i, f) in frames.iter().enumerate() {
            match self.sock.send(f) {
                Ok(_) => self.stats.tx_frames += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.stats.tx_backpressure += 1;
                    return Ok(i);
                }
                // The other end is gone: the frame is lost, like on a cut cable.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(e),
            }
        }
        Ok(frames.len())
    }

    /// Send the held frames; returns how many are still held (the socket was full).
    fn push_held(&mut self) -> io::Result<u32> {
        if self.held.is_empty() {
            return Ok(0);
        }
        self.stats.tx_kicks += 1;
        let held = std::mem::take(&mut self.held);
        let refs: Vec<&[u8]> = held.iter().map(Vec::as_slice).collect();
        let n = self.send_now(&refs);
        let sent = *n.as_ref().unwrap_or(&0);
        self.held = held;
        self.held.drain(..sent);
        n.map(|_| self.held.len() as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine's largest frame (a 4096-byte MTU and its headers).
    const MAX: usize = 4096 + 256;

    #[test]
    fn sim_link_carries_whole_frames_both_ways() {
        let (mut a, mut b) = sim_link(MAX + 64).unwrap();
        let f1 = vec![1u8; 60];
        let f2 = vec![2u8; MAX];
        assert_eq!(a.send_batch(&[&f1, &f2]).unwrap(), 2);
        let mut got = vec![];
        b.recv_batch(&mut |f| got.push(f.to_vec())).unwrap();
        assert_eq!(got, vec![f1.clone(), f2]);
        assert_eq!(b.send_batch(&[&f1]).unwrap(), 1);
        let mut n = 0;
        a.recv_batch(&mut |_| n += 1).unwrap();
        assert_eq!(n, 1);
        assert_eq!(a.io_stats().tx_frames, 2);
        assert_eq!(a.io_stats().rx_frames, 1);
    }

    /// What a busy poll asks before it skips its step: frames waiting to be received,
    /// frames queued and not yet pushed.
    #[test]
    fn sim_link_says_when_frames_wait_either_way() {
        let (mut a, mut b) = sim_link(MAX + 64).unwrap();
        assert!(!b.rx_pending() && !a.tx_pending());
        let f = vec![3u8; 60];
        assert_eq!(a.queue_batch(&[&f]).unwrap(), 1);
        assert!(a.tx_pending(), "a queued frame waits for its push");
        assert!(!b.rx_pending(), "not sent yet");
        assert_eq!(a.flush().unwrap(), 0);
        assert!(!a.tx_pending());
        assert!(b.rx_pending(), "a frame waits on the receive side");
        b.recv_batch(&mut |_| {}).unwrap();
        assert!(!b.rx_pending());
    }
}
