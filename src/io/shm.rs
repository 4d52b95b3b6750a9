//! Shared-memory rings and the Unix socket calls of the device service (src/service,
//! docs/rnic.md "One device, many processes").
//!
//! A [`Ring`] is a single-producer single-consumer queue of fixed-size slots in a memfd
//! that both processes map: the client posts work requests into its submission ring and
//! reaps completions from a CQ's ring, the service the other way round, with no system
//! call but the doorbell (an eventfd) per batch.
//!
//! Contract:
//! - The service creates every memfd ([`Ring::create`]), sizes it and seals it
//!   (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) before passing it, so a client cannot
//!   shrink the file under the service's mapping (which would fault it with SIGBUS); the
//!   client maps what it gets ([`Ring::map`]) after checking the size.
//! - Layout: producer index (u32) at byte 0, consumer index at byte 64 (its own cache
//!   line), the consumer's "done" index at byte 96 (how far it has finished acting on
//!   what it took: [`Ring::set_done`]), at byte 100 the index after the last slot it
//!   refused ([`Ring::set_refused`]), slots from byte 128. Indices run free (wrapping u32); `prod - cons` is the fill.
//! - Every access to the shared bytes is an atomic load or store of a u64 (or the u32
//!   indices): the other process may write anything at any time, and a data race with it
//!   is then still defined behaviour here. What a slot says is checked by its reader
//!   (the service decodes it as untrusted input); an impossible fill (more than the
//!   capacity) is [`Pop::Corrupt`]: the consumer resynchronises and counts it.
//! - Wakeups (the doorbell, the completion and event notifiers, a CQ's event) are pipes
//!   ([`wakeup_pipe`]): the service keeps one end and passes the other, so each process
//!   holds its own open file description (pipe(7): the two ends are two descriptions).
//!   What a client does to its end (clear O_NONBLOCK with fcntl(2), leave the pipe full,
//!   close it) changes nothing of the service's end: the service's reads and writes never
//!   block. An eventfd passed by SCM_RIGHTS would be one description with one counter
//!   for both (eventfd(2)): a client could make the service's read or write block.
//!   A full pipe already holds a wakeup its reader has not taken, so [`wake`] takes
//!   EAGAIN as done.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

const PROD: usize = 0;
const CONS: usize = 64;
const DONE: usize = 96;
const REFUSED: usize = 100;
const SLOTS: usize = 128;

/// A mapped ring (see the module documentation).
#[derive(Debug)]
pub struct Ring {
    base: NonNull<u8>,
    map_len: usize,
    /// Slot size in u64 words.
    words: usize,
    cap: u32,
    fd: OwnedFd,
}

// SAFETY: the mapping is shared memory touched only through atomics (see the module
// documentation); it stays mapped until drop, whichever thread holds the value.
unsafe impl Send for Ring {}
// SAFETY: as above; `&Ring` allows atomic loads and stores only.
unsafe impl Sync for Ring {}

/// What [`Ring::pop`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Pop {
    Empty,
    /// One slot was copied out.
    Item,
    /// The producer index is more than the capacity ahead: the ring was reset to empty
    /// (everything in it dropped).
    Corrupt,
}

impl Ring {
    /// The bytes of a ring of `cap` slots of `slot_bytes` (its memfd's size).
    pub fn bytes(cap: u32, slot_bytes: usize) -> usize {
        SLOTS + cap as usize * slot_bytes
    }

    /// A new sealed memfd ring of `cap` slots (a power of two) of `slot_bytes` bytes (a
    /// multiple of 8).
    pub fn create(name: &str, cap: u32, slot_bytes: usize) -> io::Result<Ring> {
        if !cap.is_power_of_two() || slot_bytes % 8 != 0 || slot_bytes == 0 {
            return Err(io::Error::other("ring: capacity or slot size not allowed"));
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        let len = Ring::bytes(cap, slot_bytes);
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        Ring::map(fd, cap, slot_bytes)
    }

    /// Map a ring another process made (the size must be what `cap` and `slot_bytes`
    /// make).
    pub fn map(fd: OwnedFd, cap: u32, slot_bytes: usize) -> io::Result<Ring> {
        if !cap.is_power_of_two() || slot_bytes % 8 != 0 || slot_bytes == 0 || cap > 1 << 20 {
            return Err(io::Error::other("ring: capacity or slot size not allowed"));
        }
        let len = Ring::bytes(cap, slot_bytes);
        if rustix::fs::fstat(&fd)?.st_size != len as i64 {
            return Err(io::Error::other("ring: the memfd has the wrong size"));
        }
        // SAFETY: a fresh shared mapping of `len` bytes of a memfd at least that long
        // (checked above; the service seals its size), at an address the kernel picks:
        // nothing else of this process is affected.
        let p = unsafe {
            rustix::mm::mmap(
                core::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        Ok(Ring {
            base: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap gave NULL"))?,
            map_len: len,
            words: slot_bytes / 8,
            cap,
            fd,
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn capacity(&self) -> u32 {
        self.cap
    }

    fn index(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is PROD or CONS, 4-byte aligned offsets inside the mapping (page
        // aligned, at least SLOTS bytes), accessed only atomically.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(at).cast()) }
    }

    fn word(&self, slot: u32, w: usize) -> &AtomicU64 {
        let off = SLOTS + ((slot & (self.cap - 1)) as usize * self.words + w) * 8;
        debug_assert!(off + 8 <= self.map_len);
        // SAFETY: slot is masked below `cap` and `w < words` (callers iterate over the
        // slot's words), so the 8-byte aligned word is inside the mapping; atomic only.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(off).cast()) }
    }

    /// Slots filled, as the indices say now (may be garbage on a corrupt ring).
    pub fn fill(&self) -> u32 {
        let p = self.index(PROD).load(Ordering::Acquire);
        let c = self.index(CONS).load(Ordering::Acquire);
        p.wrapping_sub(c)
    }

    /// Producer: append one slot (`words` longer than a slot are cut, shorter ones padded
    /// with zeros). False when full.
    pub fn push(&self, words: &[u64]) -> bool {
        let p = self.index(PROD).load(Ordering::Relaxed);
        let c = self.index(CONS).load(Ordering::Acquire);
        if p.wrapping_sub(c) >= self.cap {
            return false;
        }
        for w in 0..self.words {
            self.word(p, w)
                .store(words.get(w).copied().unwrap_or(0), Ordering::Relaxed);
        }
        self.index(PROD).store(p.wrapping_add(1), Ordering::Release);
        true
    }

    /// Consumer: copy the oldest slot into `out` (its first `words` words) and free it.
    pub fn pop(&self, out: &mut [u64]) -> Pop {
        let c = self.index(CONS).load(Ordering::Relaxed);
        let p = self.index(PROD).load(Ordering::Acquire);
        let fill = p.wrapping_sub(c);
        if fill == 0 {
            return Pop::Empty;
        }
        if fill > self.cap {
            self.index(CONS).store(p, Ordering::Release);
            return Pop::Corrupt;
        }
        for (w, o) in out.iter_mut().enumerate().take(self.words) {
            *o = self.word(c, w).load(Ordering::Relaxed);
        }
        self.index(CONS).store(c.wrapping_add(1), Ordering::Release);
        Pop::Item
    }

    /// The producer index as it is now.
    pub fn producer(&self) -> u32 {
        self.index(PROD).load(Ordering::Acquire)
    }

    /// The consumer index as it is now.
    pub fn consumer(&self) -> u32 {
        self.index(CONS).load(Ordering::Acquire)
    }

    /// Consumer: every slot before index `v` has been acted upon (not only taken).
    pub fn set_done(&self, v: u32) {
        self.index(DONE).store(v, Ordering::Release);
    }

    /// What the consumer last said with [`Ring::set_done`] (untrusted: the other
    /// process may write anything there).
    pub fn done(&self) -> u32 {
        self.index(DONE).load(Ordering::Acquire)
    }

    /// Consumer: the slot before index `v` was refused (written before its
    /// [`Ring::set_done`]).
    pub fn set_refused(&self, v: u32) {
        self.index(REFUSED).store(v, Ordering::Release);
    }

    /// What the consumer last said with [`Ring::set_refused`] (untrusted).
    pub fn refused(&self) -> u32 {
        self.index(REFUSED).load(Ordering::Acquire)
    }

    /// Tests: overwrite the producer index (what a broken client could do).
    pub fn poke_producer(&self, v: u32) {
        self.index(PROD).store(v, Ordering::Release);
    }

    /// Tests: overwrite word `w` of the slot the next push writes.
    pub fn poke_next_slot(&self, w: usize, v: u64) {
        if w < self.words {
            let p = self.index(PROD).load(Ordering::Relaxed);
            self.word(p, w).store(v, Ordering::Relaxed);
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; every reference handed out
        // borrows `self`, so none outlives it.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.map_len) };
    }
}

/// The size of a wakeup pipe: one page (the least fcntl(2) F_SETPIPE_SZ sets), so one
/// read of [`WAKE_BUF`] bytes takes every wakeup a pipe of this size holds.
const WAKE_PIPE: usize = 4096;
const WAKE_BUF: usize = 4096;

/// A wakeup pipe `(read end, write end)`, both ends close-on-exec and non-blocking
/// (see the module documentation).
pub fn wakeup_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pipe::PipeFlags;
    let (r, w) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
    // Smaller than the default (16 pages) so that one read drains it; failing leaves
    // the default, which only costs the reader another round.
    let _ = rustix::pipe::fcntl_setpipe_size(&w, WAKE_PIPE);
    Ok((r, w))
}

/// Signal the reader of wakeup pipe end `fd`: one byte. A full pipe (EAGAIN) already
/// holds a wakeup not yet taken: done. EPIPE (the reader is gone) is returned; the
/// service ignores SIGPIPE, as every Rust program does (std sets SIG_IGN before main).
pub fn wake(fd: BorrowedFd<'_>) -> io::Result<()> {
    match rustix::io::write(fd, &[1u8]) {
        Ok(_) | Err(rustix::io::Errno::AGAIN) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// What [`take_wakeups`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wakeups {
    None,
    /// At least one wakeup was there (all taken, or the pipe was made larger by the other
    /// side: it then stays readable and the next take gets the rest).
    Some,
    /// Every writer is gone (EOF): the other process closed its end or ended.
    Closed,
}

/// Take the wakeups waiting in the read end `fd` of a wakeup pipe, without blocking
/// (its own description is O_NONBLOCK). At most a few reads: a pipe the other side made
/// larger is taken over the next calls.
pub fn take_wakeups(fd: BorrowedFd<'_>) -> Wakeups {
    let mut b = [0u8; WAKE_BUF];
    let mut got = Wakeups::None;
    for _ in 0..4 {
        match rustix::io::read(fd, &mut b) {
            Ok(0) if got == Wakeups::None => return Wakeups::Closed,
            Ok(n) if n == b.len() => got = Wakeups::Some,
            Ok(0) => break,
            Ok(_) => return Wakeups::Some,
            Err(_) => break,
        }
    }
    got
}

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 4;

/// Send one datagram with `fds` attached (SCM_RIGHTS).
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && (fds.len() > MAX_FDS || !anc.push(SendAncillaryMessage::ScmRights(fds))) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    let n = rustix::net::sendmsg(
        sock,
        &[io::IoSlice::new(data)],
        &mut anc,
        SendFlags::NOSIGNAL,
    )?;
    if n != data.len() {
        return Err(io::Error::other("short send on a SOCK_SEQPACKET socket"));
    }
    Ok(())
}

/// Receive one datagram into `buf` and the descriptors it carries. `Ok(None)`: the peer
/// closed (EOF). A truncated message is an error.
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: RecvFlags,
) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(
        sock,
        &mut [io::IoSliceMut::new(buf)],
        &mut anc,
        flags | RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    if r.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    if r.flags.contains(rustix::net::ReturnFlags::TRUNC) {
        return Err(io::Error::other("message larger than the buffer"));
    }
    Ok(Some((r.bytes, fds)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_moves_slots_in_order_and_survives_a_garbage_index() {
        let a = Ring::create("t", 4, 16).unwrap();
        let dup = a.fd().try_clone_to_owned().unwrap();
        let b = Ring::map(dup, 4, 16).unwrap();
        for i in 0..4u64 {
            assert!(a.push(&[i, i * 10]));
        }
        assert!(!a.push(&[9]), "full");
        let mut out = [0u64; 2];
        assert_eq!(b.pop(&mut out), Pop::Item);
        assert_eq!(out, [0, 0]);
        assert_eq!(b.pop(&mut out), Pop::Item);
        assert_eq!(out, [1, 10]);
        a.poke_producer(1000);
        assert_eq!(b.pop(&mut out), Pop::Corrupt);
        assert_eq!(b.pop(&mut out), Pop::Empty);
        assert!(a.push(&[7]));
        assert_eq!(b.pop(&mut out), Pop::Item);
        assert_eq!(out, [7, 0]);
        // The size is sealed: the file cannot shrink under a mapping.
        assert!(rustix::fs::ftruncate(a.fd(), 8).is_err());
        // A mapping of the wrong geometry is refused.
        assert!(Ring::map(a.fd().try_clone_to_owned().unwrap(), 8, 16).is_err());
    }
}
