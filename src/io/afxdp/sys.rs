//! Small system look-ups the port needs before it touches AF_XDP: privileges and the
//! interface index.
//!
//! No bpffs is needed (none is mounted): the filter is loaded and attached through a
//! `bpf_link` by libbpf, nothing is pinned, and the AF_XDP sockets are made with
//! `XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD`, so libxdp never loads its dispatcher nor takes
//! its bpffs lock (xdp-tools `lib/libxdp/xsk.c`: `__xsk_setup_xdp_prog` and the
//! refcount lock run only without that flag).

use std::io;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::{AddressFamily, SocketType, netdevice, socket};

use super::Error;

/// Fails with [`Error::NotRoot`] unless the effective user is root.
pub fn require_root(what: &'static str) -> Result<(), Error> {
    if rustix::process::geteuid().is_root() {
        Ok(())
    } else {
        Err(Error::NotRoot { what })
    }
}

/// The index of `ifname` in the calling thread's network namespace.
pub fn ifindex(ifname: &str) -> Result<u32, Error> {
    let missing = |source: io::Error| Error::InterfaceMissing {
        ifname: ifname.to_string(),
        source,
    };
    if ifname.is_empty() || ifname.len() >= 16 || ifname.contains(['/', '\0', ' ']) {
        return Err(missing(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a valid interface name",
        )));
    }
    // SIOCGIFINDEX needs some socket of the namespace; a UDP one is always allowed.
    let fd = socket(AddressFamily::INET, SocketType::DGRAM, None).map_err(io::Error::from)?;
    netdevice::name_to_index(&fd, ifname).map_err(|e| missing(e.into()))
}

/// Run `f` on a thread of its own in a fresh, empty network namespace (unshare(2)
/// `CLONE_NEWNET`: only `lo` in it, down; it is gone when the thread ends). The kernel
/// feature probes use it: no other process's socket or XDP program can be on its `lo`,
/// and nothing they do there touches the caller's interfaces. `Err` with the errno when
/// the namespace cannot be made.
pub fn in_private_netns<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T, Errno> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: only the network namespace is unshared (not CLONE_FILES), on a thread
            // that exists for this call and shares no descriptors it creates.
            unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }?;
            Ok(f())
        })
        .join()
        .unwrap_or(Err(Errno::FAULT))
    })
}

/// How long [`retry_busy`] keeps trying.
const BUSY_PATIENCE: Duration = Duration::from_secs(1);

/// Does `e` or any error beneath it say EBUSY?
pub fn is_busy(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if io.raw_os_error() == Some(Errno::BUSY.raw_os_error()) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// Does a libbpf-rs error say EBUSY? Its chain keeps the `io::Error` behind a private
/// type, and its `ErrorKind` has no "busy", so compare with the text an `io::Error` for
/// EBUSY renders, which libbpf-rs prints as the innermost cause.
pub fn is_busy_libbpf(e: &libbpf_rs::Error) -> bool {
    let busy = io::Error::from_raw_os_error(Errno::BUSY.raw_os_error()).to_string();
    format!("{e:#}").contains(&busy)
}

/// Run `op` again while it fails with EBUSY, for up to a second.
///
/// Closing an AF_XDP socket or an XDP link does not free the device queue at once: the
/// kernel releases the socket's buffer pool from a workqueue (`xp_put_pool`), and a
/// child being spawned by another thread holds copies of our descriptors until its
/// exec. So a port re-opened right after the previous one closed can briefly see EBUSY
/// where a moment later it succeeds.
pub fn retry_busy<T, E>(
    mut op: impl FnMut() -> Result<T, E>,
    busy: impl Fn(&E) -> bool,
) -> Result<T, E> {
    let deadline = Instant::now() + BUSY_PATIENCE;
    loop {
        match op() {
            Err(e) if busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

/// Close the open file behind `fd` while keeping its number valid: the number is made
/// to refer to a fresh eventfd that is never readable (`dup2` replaces the file behind
/// a number atomically). For a duplicate of a port's socket that other threads may be
/// polling at that moment (`crate::driver::Shared::release_port`): the socket itself
/// goes, the pollers see nothing to read instead of a closed (or reused) number.
pub fn retire_fd(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let quiet = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)?;
    // SAFETY: the OwnedFd made from `fd`'s number is never dropped (ManuallyDrop): the
    // number stays owned by `fd`'s owner; dup2 only replaces the file behind it, which
    // is the operation wanted (the old file's reference from this number goes).
    let mut target = std::mem::ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(fd.as_raw_fd()) });
    rustix::io::dup2(&quiet, &mut target)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy() -> io::Error {
        io::Error::from_raw_os_error(Errno::BUSY.raw_os_error())
    }

    #[test]
    fn retry_busy_retries_only_ebusy() {
        let mut calls = 0;
        let r: Result<u32, io::Error> = retry_busy(
            || {
                calls += 1;
                if calls < 3 { Err(busy()) } else { Ok(7) }
            },
            |e| is_busy(e),
        );
        assert_eq!(r.unwrap(), 7);
        assert_eq!(calls, 3);

        let mut calls = 0;
        let r: Result<u32, io::Error> = retry_busy(
            || {
                calls += 1;
                Err(io::Error::from_raw_os_error(Errno::NODEV.raw_os_error()))
            },
            |e| is_busy(e),
        );
        assert!(r.is_err());
        assert_eq!(calls, 1);
    }

    #[test]
    fn is_busy_sees_ebusy_in_libbpf_errors() {
        let e = libbpf_rs::Error::from(busy());
        assert!(is_busy_libbpf(&e));
        let e = libbpf_rs::Error::from(io::Error::from_raw_os_error(Errno::PERM.raw_os_error()));
        assert!(!is_busy_libbpf(&e));
    }

    #[test]
    fn bad_interface_names_are_refused_before_any_syscall() {
        for name in ["", "a/b", "sixteen-chars-xx", "a b"] {
            match ifindex(name) {
                Err(Error::InterfaceMissing { ifname, .. }) => assert_eq!(ifname, name),
                other => panic!("{name:?}: {other:?}"),
            }
        }
    }
}
