//! A client's memory as the service reaches it: the one [`AddressSpace`] of a client,
//! opened when it says hello and shared by all its memory regions
//! (docs/rnic.md, "How the service touches a client's memory").
//!
//! Contract: every copy into or out of a client's memory is one the client itself could
//! make.
//! - The service (root) opens `/proc/PID/mem` of the process that connected (the pid
//!   SO_PEERCRED gave, unix(7)). The descriptor is bound to that process's address space
//!   as it is at that moment, for good (proc(5); fs/proc/base.c `mem_open`): after an
//!   `execve` (of a set-uid program or any other) it reaches nothing, and a process that
//!   later gets the same pid is never reached.
//! - Then, *after* opening, a short-lived thread that has taken the client's uid and gid
//!   (SO_PEERCRED's, no supplementary groups) as its own per-thread credentials
//!   (setresuid(2), setresgid(2), setgroups(2) are per thread in the kernel: see their
//!   "C library/kernel differences" notes; the thread thereby loses every capability,
//!   capabilities(7) "Effect of user ID changes on capabilities") opens `/proc/PID/maps`:
//!   the kernel's ptrace access check (ptrace(2), "Ptrace access mode checking") with
//!   those credentials decides. It refuses a process whose real, effective or saved uid
//!   or gid is not the client's (a set-uid program), one that is not dumpable, one with
//!   capabilities the client has not. Refused: the hello fails (EPERM).
//! - Why root opens and the client's credentials only check: the thread itself cannot
//!   open `mem` on a system with Yama's `ptrace_scope` = 1 (Ubuntu's and others' default):
//!   opening `mem` asks PTRACE_MODE_ATTACH, which Yama grants only to an ancestor of the
//!   target or a holder of CAP_SYS_PTRACE, and the service is neither to its clients
//!   (Documentation/admin-guide/LSM/Yama.rst). `maps` asks PTRACE_MODE_READ, which Yama
//!   leaves alone and which makes the same uid, gid, dumpable and capability checks.
//! - Why the order: the check is made against whatever the pid is when it runs; the
//!   descriptor is already bound. If the process exec'd a set-uid program before the
//!   service opened `mem`, the check (after) refuses; if it exec'd anything after the
//!   open, the bound address space has no user left and every copy fails (the client's
//!   objects then behave as a dead process's: [`crate::proto::UserMem::owner_gone`]).
//!   What this does not cover: a set-uid program that first shares its memory with a
//!   child (`clone(CLONE_VM)` without CLONE_VFORK, so the memory outlives the program's
//!   own `execve`), then drops all its privileges and exec's, all between the service's
//!   open and its check.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};
use rustix::process::{Gid, Uid};

use crate::proto::AddressSpace;

/// Who connected: the peer's credentials as SO_PEERCRED gave them at connect.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// The address space of `peer` (see the module documentation): `Err` with EPERM when
/// the client's credentials may not reach it, or the error of opening it (ESRCH, ENOENT:
/// the process is gone).
pub fn open(peer: Peer) -> io::Result<Arc<AddressSpace>> {
    let mem = rustix::fs::open(
        format!("/proc/{}/mem", peer.pid),
        OFlags::RDWR | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    as_client(peer, |pid| {
        rustix::fs::open(
            format!("/proc/{pid}/maps"),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    })
    .map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES) => io::Error::from_raw_os_error(libc::EPERM),
        _ => e,
    })?;
    Ok(Arc::new(AddressSpace::new(mem)))
}

/// `f(pid)` on a thread of its own that holds `peer`'s uid and gid (real, effective,
/// saved and filesystem; no supplementary group) and so no capability; the thread ends
/// with `f`, and its credentials with it. The service's other threads keep theirs.
fn as_client(
    peer: Peer,
    f: impl FnOnce(i32) -> rustix::io::Result<OwnedFd> + Send,
) -> io::Result<()> {
    std::thread::scope(|s| {
        let t = std::thread::Builder::new()
            .name("xrnic-peer-cred".into())
            .spawn_scoped(s, move || -> rustix::io::Result<()> {
                // Groups and gids first: after the uid change the thread may not.
                let gid = Gid::from_raw(peer.gid);
                rustix::thread::set_thread_groups(&[])?;
                rustix::thread::set_thread_res_gid(gid, gid, gid)?;
                let uid = Uid::from_raw(peer.uid);
                rustix::thread::set_thread_res_uid(uid, uid, uid)?;
                f(peer.pid).map(drop)
            })?;
        match t.join() {
            Ok(r) => r.map_err(io::Error::from),
            Err(_) => Err(io::Error::other("the credential thread panicked")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Peer {
        Peer {
            pid: std::process::id() as i32,
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
        }
    }

    /// A process may always reach itself: the space opens, and copies reach this
    /// process's bytes.
    #[test]
    fn a_client_reaches_its_own_memory() {
        let space = open(me()).unwrap();
        let buf = [7u8; 16];
        let m = crate::proto::UserMem::in_space(space.clone(), buf.as_ptr() as u64, 16).unwrap();
        let mut got = [0u8; 16];
        assert!(m.read(0, &mut got));
        assert_eq!(got, buf);
    }

    /// Another user's credentials cannot reach a process of ours (as root: the ptrace
    /// check refuses the uid; otherwise the thread may not even take them), while ours
    /// can; and the check changes only its own thread: this one's credentials are the
    /// same after it. (The target is a child: a thread of the target process itself
    /// passes every ptrace check.)
    #[test]
    fn another_user_is_refused_and_the_service_keeps_its_credentials() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let before = (rustix::process::getuid(), rustix::process::geteuid());
        let ours = Peer {
            pid: child.id() as i32,
            ..me()
        };
        let other = Peer {
            uid: 65534,
            gid: 65534,
            ..ours
        };
        let refused = open(other);
        let allowed = open(ours);
        let _ = child.kill();
        let _ = child.wait();
        let e = refused.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
        assert_eq!(
            (rustix::process::getuid(), rustix::process::geteuid()),
            before
        );
        allowed.unwrap();
    }
}
