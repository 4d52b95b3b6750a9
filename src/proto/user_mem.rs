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
//! A region may also be memory of *another* address space, reached through the kernel:
//! - [`UserMem::in_space`]: through an [`AddressSpace`], a `/proc/PID/mem` descriptor
//!   (proc(5)) bound to one address space for good. The device service (`xrnic up`,
//!   src/service) registers its clients' buffers that way: src/service/client_mem.rs
//!   opens the descriptor when the client says hello and checks it with the client's own
//!   credentials, so every copy is one the client itself could make.
//! - [`UserMem::remote`]: by pid, with `process_vm_readv` / `process_vm_writev` (the
//!   kernel checks PTRACE_MODE_ATTACH_REALCREDS at each copy, against whatever process
//!   has that pid then). A client of the service uses it on its own pid only.
//!
//! Nothing is pinned or mapped; a page the owner unmapped makes the copy fail, which the
//! engine sees as any bounds failure. Atomics on such a region are a read and a write
//! under the engine's lock: atomic with respect to every operation of the device
//! (`IBV_ATOMIC_HCA`, what rxe promises too), not with respect to the owner's CPU.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// One address space of another process, through a descriptor of its `/proc/PID/mem`.
///
/// Opening that file takes a reference to the process's memory (`mm`) as it is then, and
/// every `pread` / `pwrite` on the descriptor goes to that memory, whatever the process
/// does afterwards (proc(5), "/proc/pid/mem"; fs/proc/base.c `mem_open`, `mem_rw`): after
/// an `execve` the old memory has no user left and the descriptor reaches nothing, and a
/// process that later gets the same pid is never reached. Whoever opens it decides what it
/// reaches; the kernel checked PTRACE_MODE_ATTACH_FSCREDS then, not at each copy.
#[derive(Debug)]
pub struct AddressSpace {
    mem: OwnedFd,
    /// A copy found the memory without users (the process exited, or exec'd). Sticky.
    gone: AtomicBool,
}

impl AddressSpace {
    /// `mem`: an open `/proc/PID/mem` (read and write). Not checked here: the opener
    /// vouches for it.
    pub fn new(mem: OwnedFd) -> AddressSpace {
        AddressSpace {
            mem,
            gone: AtomicBool::new(false),
        }
    }

    /// True once a copy found the address space without users (see [`UserMem::owner_gone`]).
    pub fn gone(&self) -> bool {
        self.gone.load(Ordering::Relaxed)
    }

    /// Copy `dst.len()` bytes at `addr` out of the address space (`pread`).
    fn read(&self, addr: u64, dst: &mut [u8]) -> bool {
        self.transfer(addr, dst.len(), |done, at| {
            rustix::io::pread(&self.mem, &mut dst[done..], at)
        })
    }

    /// Copy `src` into the address space at `addr` (`pwrite`).
    fn write(&self, addr: u64, src: &[u8]) -> bool {
        self.transfer(addr, src.len(), |done, at| {
            rustix::io::pwrite(&self.mem, &src[done..], at)
        })
    }

    /// `step(done, addr + done)` until `n` bytes moved (a transfer may be short: the
    /// kernel moves a page at a time); true when every byte did. The kernel answers 0
    /// for a transfer of more than 0 bytes only when the memory has no user left
    /// (`mem_rw`: `mmget_not_zero` fails), and EIO for an address not mapped there.
    fn transfer(
        &self,
        addr: u64,
        n: usize,
        mut step: impl FnMut(usize, u64) -> rustix::io::Result<usize>,
    ) -> bool {
        let mut done = 0usize;
        while done < n {
            let Some(at) = addr.checked_add(done as u64) else {
                return false;
            };
            match step(done, at) {
                Ok(0) => {
                    self.gone.store(true, Ordering::Relaxed);
                    return false;
                }
                Ok(k) => done += k,
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return false,
            }
        }
        true
    }
}

/// Where a region's bytes are.
#[derive(Debug)]
enum Owner {
    /// This process ([`UserMem::new`]).
    Here,
    /// Process `pid`, by `process_vm_*` ([`UserMem::remote`]).
    Pid(i32),
    /// The address space behind a `/proc/PID/mem` descriptor ([`UserMem::in_space`]).
    Space(Arc<AddressSpace>),
}

/// `len` bytes at `ptr` in this process, which the registrant keeps mapped and valid
/// until the region is deregistered (see [`UserMem::new`]).
#[derive(Debug)]
pub struct UserMem {
    ptr: NonNull<u8>,
    len: usize,
    /// Unless `Here`, `ptr` is an address in another address space, never dereferenced
    /// here.
    owner: Owner,
    /// A copy found process `pid` of `Owner::Pid` gone (ESRCH: it exited, or was killed
    /// and its memory is already released while its sockets are not yet closed). Sticky.
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
            owner: Owner::Here,
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
        UserMem::elsewhere(addr, len, Owner::Pid(pid))
    }

    /// `len` bytes at `addr` of the address space `space` (see the module
    /// documentation). Safe for the same reason as [`UserMem::remote`]. `None` for a NULL
    /// or wrapping range.
    pub fn in_space(space: Arc<AddressSpace>, addr: u64, len: usize) -> Option<UserMem> {
        UserMem::elsewhere(addr, len, Owner::Space(space))
    }

    fn elsewhere(addr: u64, len: usize, owner: Owner) -> Option<UserMem> {
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
            owner,
            gone: AtomicBool::new(false),
        })
    }

    /// The process whose memory this is, when named by pid ([`UserMem::remote`]).
    pub fn pid(&self) -> Option<i32> {
        match self.owner {
            Owner::Pid(p) => Some(p),
            _ => None,
        }
    }

    /// The memory is not this process's: copies go through the kernel.
    fn is_elsewhere(&self) -> bool {
        !matches!(self.owner, Owner::Here)
    }

    /// True once a copy found the owning process gone (its memory no longer exists).
    /// The engine then treats the region's QP as destroyed, not as an access error: a
    /// dead process's QP must not NAK its peer (the peer of a real NIC whose process
    /// died sees its requests go unanswered: IBTA vol. 1 §9.7.6.1.3, retries).
    /// For a region of an [`AddressSpace`], that address space is gone: its process
    /// exited or exec'd (a new program is not the memory that was registered).
    pub fn owner_gone(&self) -> bool {
        match &self.owner {
            Owner::Space(s) => s.gone(),
            _ => self.gone.load(Ordering::Relaxed),
        }
    }

    /// The offset of `n` bytes at `off` in the owner's address space, when inside the
    /// region.
    fn remote_addr(&self, off: usize, n: usize) -> Option<u64> {
        (off.checked_add(n)? <= self.len).then(|| (self.ptr.as_ptr() as usize + off) as u64)
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
        match &self.owner {
            Owner::Here => {}
            &Owner::Pid(pid) => {
                return self.remote_copy(pid, off, dst.as_mut_ptr(), dst.len(), false);
            }
            Owner::Space(s) => {
                return self
                    .remote_addr(off, dst.len())
                    .is_some_and(|a| s.read(a, dst));
            }
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
        match &self.owner {
            Owner::Here => {}
            &Owner::Pid(pid) => {
                // The kernel only reads `src` for a write (the pointer is not written).
                return self.remote_copy(pid, off, src.as_ptr().cast_mut(), src.len(), true);
            }
            Owner::Space(s) => {
                return self
                    .remote_addr(off, src.len())
                    .is_some_and(|a| s.write(a, src));
            }
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
        if self.is_elsewhere() {
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
        if self.is_elsewhere() {
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
        if self.is_elsewhere() {
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

    /// `/proc/PID/mem` of a spawned child: `sh` waits for a line, then exec's `sleep`.
    fn child_space() -> (std::process::Child, Arc<AddressSpace>) {
        use std::process::{Command, Stdio};
        let child = Command::new("sh")
            .args(["-c", "read x; exec sleep 30"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let path = format!("/proc/{}/mem", child.id());
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        (child, Arc::new(AddressSpace::new(f.into())))
    }

    /// The first mapping of process `pid` (/proc/PID/maps): its start address.
    fn first_mapping(pid: u32) -> u64 {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let start = maps.split('-').next().unwrap();
        u64::from_str_radix(start, 16).unwrap()
    }

    /// Through `/proc/self/mem`: the same copies and atomics as in place; an unmapped page
    /// is a failed copy, not a dead owner.
    #[test]
    fn copies_and_atomics_through_an_address_space() {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/proc/self/mem")
            .unwrap();
        let space = Arc::new(AddressSpace::new(f.into()));
        let buf = vec![0u64; 4];
        let m = UserMem::in_space(space.clone(), buf.as_ptr() as u64, 32).unwrap();
        assert_eq!(m.pid(), None);
        assert!(m.write(3, b"abc"));
        let mut got = [0u8; 3];
        assert!(m.read(3, &mut got));
        assert_eq!(&got, b"abc");
        assert!(!m.write(30, b"abc"), "past the end");
        assert!(!m.read(usize::MAX, &mut got), "overflowing offset");
        assert_eq!(m.fetch_add(8, 5), Some(0));
        assert_eq!(m.compare_swap(8, 5, 9), Some(5));
        assert_eq!(m.fetch_add(4, 1), None, "misaligned");
        assert_eq!(std::hint::black_box(&buf)[1], 9);
        // A copy across pages (the kernel moves one page per step).
        let big = vec![0x5au8; 3 * 4096 + 5];
        let mb = UserMem::in_space(space.clone(), big.as_ptr() as u64, big.len()).unwrap();
        let mut back = vec![0u8; big.len()];
        assert!(mb.read(0, &mut back));
        assert_eq!(back, big);
        let bad = UserMem::in_space(space, 4096, 64).unwrap();
        assert!(!bad.read(0, &mut got));
        assert!(!bad.write(0, b"x"));
        assert!(
            !bad.owner_gone(),
            "an unmapped page is a fault, not a gone owner"
        );
    }

    /// The descriptor is bound to the address space it was opened on: once its process
    /// exec's another program, the regions reach nothing (not the new program's memory
    /// at the same address) and report their owner gone; so when it exits.
    #[test]
    fn an_exec_or_an_exit_ends_the_address_space() {
        use std::io::Write;
        for exec in [true, false] {
            let (mut child, space) = child_space();
            let pid = child.id();
            let at = first_mapping(pid);
            let m = UserMem::in_space(space.clone(), at, 16).unwrap();
            let mut got = [0u8; 16];
            assert!(m.read(0, &mut got), "the child's first mapping reads");
            assert!(!m.owner_gone());
            if exec {
                child.stdin.take().unwrap().write_all(b"go\n").unwrap();
                // Bounded wait for the exec: the comm becomes the new program's.
                let comm = format!("/proc/{pid}/comm");
                let seen = (0..500).find_map(|_| {
                    let c = std::fs::read_to_string(&comm).unwrap_or_default();
                    if c.trim() == "sleep" {
                        return Some(c);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    None
                });
                assert!(seen.is_some(), "the child never exec'd sleep");
                // The new image has its own mapping at some address: reachable by pid
                // (the old way), not through the old address space.
                let now = UserMem::remote(pid as i32, first_mapping(pid), 16).unwrap();
                assert!(now.read(0, &mut got), "the new image is there, by pid");
                let again = UserMem::in_space(space.clone(), first_mapping(pid), 16).unwrap();
                assert!(!again.read(0, &mut got));
                assert!(again.owner_gone());
            } else {
                child.kill().unwrap();
                child.wait().unwrap();
            }
            assert!(!m.read(0, &mut got));
            assert!(!m.write(0, b"x"));
            assert!(m.owner_gone(), "exec {exec}");
            assert!(space.gone());
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
