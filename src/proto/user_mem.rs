//! Memory the application owns, registered as a memory region (`ibv_reg_mr` over its own
//! buffer): the one module of the engine that reads and writes it, and the only `unsafe`
//! code in proto/.
//!
//! The application may touch its buffer at any time (that is the RDMA contract: what it
//! sees while an operation runs is undefined, IBTA vol. 1 §10.6, "memory regions"), so no
//! Rust reference ever covers it: bytes move only by raw-pointer copies, and the 64-bit
//! atomics are real atomic instructions on the word, which makes them atomic with respect
//! to every other RNIC operation and to the CPU (stronger than `IBV_ATOMIC_HCA`).
//!
//! A region may also be memory of *another* process ([`UserMem::remote`]): the device
//! service (`xrnic up`, src/service) registers its clients' buffers that way and moves
//! their bytes with `process_vm_readv` / `process_vm_writev` (the kernel checks that the
//! service may, PTRACE_MODE_ATTACH: root or the same user). Nothing is pinned or mapped; a
//! page the client unmapped makes the copy fail, which the engine sees as any bounds
//! failure. Atomics on such a region are a read and a write under the engine's lock:
//! atomic with respect to every operation of the device (`IBV_ATOMIC_HCA`, what rxe
//! promises too), not with respect to the client's CPU.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// `len` bytes at `ptr` in this process, which the registrant keeps mapped and valid
/// until the region is deregistered (see [`UserMem::new`]).
#[derive(Debug)]
pub struct UserMem {
    ptr: NonNull<u8>,
    len: usize,
    /// `Some(pid)`: `ptr` is an address in process `pid`, never dereferenced here.
    pid: Option<i32>,
    /// A copy found process `pid` gone (ESRCH: it exited, or was killed and its memory
    /// is already released while its sockets are not yet closed). Sticky.
    gone: AtomicBool,
}

// SAFETY: UserMem is an address range, not a borrow; every access goes through the
// methods below, which copy with raw pointers (no aliasing assumption), so using it from
// another thread (the driver's) is as sound as from the registering one.
unsafe impl Send for UserMem {}
// SAFETY: as above: `&UserMem` only allows raw copies and atomic instructions.
unsafe impl Sync for UserMem {}

impl UserMem {
    /// # Safety
    /// `ptr..ptr+len` must stay mapped, readable and writable in this process until this
    /// value is dropped (the region deregistered), whatever the application does with
    /// the bytes meanwhile. `ptr` must not be NULL unless `len` is 0.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Option<UserMem> {
        let ptr = if len == 0 {
            NonNull::dangling()
        } else {
            NonNull::new(ptr)?
        };
        (ptr.as_ptr() as usize).checked_add(len)?;
        Some(UserMem {
            ptr,
            len,
            pid: None,
            gone: AtomicBool::new(false),
        })
    }

    /// `len` bytes at `addr` in process `pid` (see the module documentation). Safe: the
    /// address is only ever handed to the kernel, which refuses what is not mapped there
    /// or not ours to touch. `None` for a NULL or wrapping range or a pid below 1.
    pub fn remote(pid: i32, addr: u64, len: usize) -> Option<UserMem> {
        if pid < 1 {
            return None;
        }
        let a = usize::try_from(addr).ok()?;
        a.checked_add(len)?;
        let ptr = if len == 0 {
            NonNull::dangling()
        } else {
            NonNull::new(a as *mut u8)?
        };
        Some(UserMem {
            ptr,
            len,
            pid: Some(pid),
            gone: AtomicBool::new(false),
        })
    }

    /// The process whose memory this is, when not this one.
    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// True once a copy found the owning process gone (its memory no longer exists).
    /// The engine then treats the region's QP as destroyed, not as an access error: a
    /// dead process's QP must not NAK its peer (the peer of a real NIC whose process
    /// died sees its requests go unanswered: IBTA vol. 1 §9.7.6.1.3, retries).
    pub fn owner_gone(&self) -> bool {
        self.gone.load(Ordering::Relaxed)
    }

    /// One `process_vm_readv` (`write`: `process_vm_writev`) of `local` against `n` bytes
    /// at `off` of the remote region; true when every byte moved.
    fn remote_copy(&self, pid: i32, off: usize, local: *mut u8, n: usize, write: bool) -> bool {
        if n == 0 {
            return true;
        }
        let Some(end) = off.checked_add(n) else {
            return false;
        };
        if end > self.len {
            return false;
        }
        let l = libc::iovec {
            iov_base: local.cast(),
            iov_len: n,
        };
        let r = libc::iovec {
            iov_base: (self.ptr.as_ptr() as usize + off) as *mut libc::c_void,
            iov_len: n,
        };
        // SAFETY: `l` names `n` bytes of this process's memory that the caller owns (a
        // slice it passed in); `r` is only read by the kernel, which checks it against
        // process `pid`'s mappings and our right to access them. One iovec each.
        let done = unsafe {
            if write {
                libc::process_vm_writev(pid, &l, 1, &r, 1, 0)
            } else {
                libc::process_vm_readv(pid, &l, 1, &r, 1, 0)
            }
        };
        if done < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            self.gone.store(true, Ordering::Relaxed);
        }
        done == n as isize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn range(&self, off: usize, n: usize) -> Option<*mut u8> {
        let end = off.checked_add(n)?;
        (end <= self.len).then(|| {
            // SAFETY: off <= len, so the result is inside (or one past) the registered
            // range, which the constructor's contract keeps mapped.
            unsafe { self.ptr.as_ptr().add(off) }
        })
    }

    /// Copy `dst.len()` bytes at `off` out of the region; false when out of bounds.
    pub fn read(&self, off: usize, dst: &mut [u8]) -> bool {
        if let Some(pid) = self.pid {
            return self.remote_copy(pid, off, dst.as_mut_ptr(), dst.len(), false);
        }
        let Some(src) = self.range(off, dst.len()) else {
            return false;
        };
        // SAFETY: `src..src+dst.len()` is inside the registered range (checked above,
        // mapped per `new`'s contract); `dst` is engine memory, never the application's
        // region, so the two do not overlap.
        unsafe { core::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Copy `src` into the region at `off`; false when out of bounds.
    pub fn write(&self, off: usize, src: &[u8]) -> bool {
        if let Some(pid) = self.pid {
            // The kernel only reads `src` for a write (the pointer is not written).
            return self.remote_copy(pid, off, src.as_ptr().cast_mut(), src.len(), true);
        }
        let Some(dst) = self.range(off, src.len()) else {
            return false;
        };
        // SAFETY: as in `read`, with the roles swapped: `dst` is inside the mapped
        // registered range, `src` is engine memory.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        true
    }

    /// The 8-byte aligned word at `off`, as an atomic; None when out of bounds or
    /// misaligned.
    fn word(&self, off: usize) -> Option<&AtomicU64> {
        if self.pid.is_some() {
            return None;
        }
        let p = self.range(off, 8)?;
        if p as usize % 8 != 0 {
            return None;
        }
        // SAFETY: `p` is 8-byte aligned and its 8 bytes are inside the mapped range;
        // AtomicU64 has the layout of u64, and only atomic operations use the reference,
        // so concurrent accesses by the application are data-race free on our side.
        Some(unsafe { AtomicU64::from_ptr(p as *mut u64) })
    }

    /// Compare-and-swap on the word at `off` (IBTA vol. 1 §9.4.5): returns the original
    /// value; the swap happens when it equals `compare`.
    pub fn compare_swap(&self, off: usize, compare: u64, swap: u64) -> Option<u64> {
        if self.pid.is_some() {
            return self.remote_rmw(off, |v| if v == compare { swap } else { v });
        }
        let w = self.word(off)?;
        Some(
            match w.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// Fetch-and-add on the word at `off`: returns the original value.
    pub fn fetch_add(&self, off: usize, add: u64) -> Option<u64> {
        if self.pid.is_some() {
            return self.remote_rmw(off, |v| v.wrapping_add(add));
        }
        Some(self.word(off)?.fetch_add(add, Ordering::SeqCst))
    }
}

impl UserMem {
    /// Read-modify-write of the aligned word at `off` of a remote region (the caller holds
    /// the engine, so no other device operation runs in between): the original value.
    fn remote_rmw(&self, off: usize, f: impl FnOnce(u64) -> u64) -> Option<u64> {
        if (self.ptr.as_ptr() as usize).wrapping_add(off) % 8 != 0 {
            return None;
        }
        let mut b = [0u8; 8];
        if !self.read(off, &mut b) {
            return None;
        }
        let orig = u64::from_ne_bytes(b);
        self.write(off, &f(orig).to_ne_bytes()).then_some(orig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_atomics_stay_inside_the_range() {
        let mut buf = vec![0u64; 4]; // 32 bytes, 8-byte aligned
        // SAFETY: `buf` outlives `m` and is not otherwise used while `m` lives, except
        // through `m`.
        let m = unsafe { UserMem::new(buf.as_mut_ptr() as *mut u8, 32) }.unwrap();
        assert!(m.write(3, b"abc"));
        let mut got = [0u8; 3];
        assert!(m.read(3, &mut got));
        assert_eq!(&got, b"abc");
        assert!(!m.write(30, b"abc"), "past the end");
        assert!(!m.read(usize::MAX, &mut got), "overflowing offset");
        assert_eq!(m.fetch_add(8, 5), Some(0));
        assert_eq!(m.compare_swap(8, 5, 9), Some(5));
        assert_eq!(m.compare_swap(8, 5, 1), Some(9), "no swap when unequal");
        assert_eq!(m.fetch_add(4, 1), None, "misaligned");
        assert_eq!(m.fetch_add(32, 1), None, "out of bounds");
        let _ = m;
        assert_eq!(buf[1], 9);
        // SAFETY: NULL with a length is refused, not kept.
        assert!(unsafe { UserMem::new(core::ptr::null_mut(), 8) }.is_none());
    }

    /// The remote kind through our own pid (process_vm_* on oneself is allowed): the
    /// same bounds and atomics, and an unmapped page is a failed copy, not a crash.
    #[test]
    fn remote_copies_and_atomics_go_through_the_kernel() {
        let buf = vec![0u64; 4];
        let pid = std::process::id() as i32;
        let m = UserMem::remote(pid, buf.as_ptr() as u64, 32).unwrap();
        assert_eq!(m.pid(), Some(pid));
        assert!(m.write(3, b"abc"));
        let mut got = [0u8; 3];
        assert!(m.read(3, &mut got));
        assert_eq!(&got, b"abc");
        assert!(!m.write(30, b"abc"), "past the end");
        assert!(!m.read(usize::MAX, &mut got), "overflowing offset");
        assert_eq!(m.fetch_add(8, 5), Some(0));
        assert_eq!(m.compare_swap(8, 5, 9), Some(5));
        assert_eq!(m.compare_swap(8, 5, 1), Some(9), "no swap when unequal");
        assert_eq!(m.fetch_add(4, 1), None, "misaligned");
        assert_eq!(std::hint::black_box(&buf)[1], 9);
        // Page 0 is never mapped: the kernel refuses, nothing faults.
        let bad = UserMem::remote(pid, 4096, 64).unwrap();
        assert!(!bad.read(0, &mut got));
        assert!(!bad.write(0, b"x"));
        assert!(
            !bad.owner_gone(),
            "an unmapped page is a fault, not a dead process"
        );
        assert!(UserMem::remote(0, 4096, 8).is_none());
        assert!(UserMem::remote(pid, 0, 8).is_none());
    }
}
