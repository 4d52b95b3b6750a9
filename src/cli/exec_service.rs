//! `xrnic exec` as root on interfaces it was named (`--netdev`, `XRNIC_NETDEV`) that no
//! device service serves: it starts one for each (`xrnic up IF`, src/cli/service.rs), so
//! that every process the program starts, and any other, shares the one device
//! (docs/verbs-abi.md "Several processes"); it runs the program as its child, and when
//! the program exits, the services it started stop once their last client has gone.
//! `--in-process` starts none: the library then opens the device in the program's own
//! process (one process per interface, the fastest path).
//!
//! How a started service learns that the program exited: a pipe (the lifeline). Each
//! service holds its read end (`xrnic up --lifeline-fd`) and this process the only write
//! end, not inherited by the program; the service stops when the write end is closed
//! (this process is gone, by exit or by a kill) and no client is connected
//! ([`crate::service::server::Service::run_while`]). A child of the program that outlives
//! it keeps the device while it is connected. Why not `exec` the program as a plain
//! `xrnic exec` does: something must close the lifeline when the program ends, and wait
//! for the service to go, so that the interface is free when `xrnic exec` returns (a
//! following `xrnic up` or `xrnic exec --in-process` finds it unused).

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

/// The services this `xrnic exec` started: their pids, and the write end of their
/// lifeline (closed when dropped).
pub struct Started {
    pids: Vec<(String, u32)>,
    _lifeline: OwnedFd,
}

/// How long, after the program exited, `xrnic exec` waits for the services it started to
/// go: their last client may still be connected (a child of the program), and then
/// `xrnic exec` returns without them; each one stops when that client leaves.
const STOP_PATIENCE: Duration = Duration::from_secs(10);

/// Start a service for each of `netdevs` that has none (as root only: `xrnic up` needs
/// root). `None` when none was started. A failure is said on stderr and the program
/// runs on: the library then opens the device in process.
pub fn start(netdevs: &[String]) -> Option<Started> {
    if !rustix::process::geteuid().is_root() {
        return None;
    }
    let idle: Vec<&String> = netdevs
        .iter()
        .filter(|n| matches!(xrnic::ipc::connect_any(n), Ok(None)))
        .collect();
    if idle.is_empty() {
        return None;
    }
    let exe = std::env::current_exe().ok()?;
    // Both ends close on exec: the read end passes only to `xrnic up` (below).
    let (reader, writer) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("xrnic exec: no pipe for the device service: {e}");
            return None;
        }
    };
    let fd = reader.as_raw_fd();
    let mut pids = Vec::new();
    for n in idle {
        let mut up = Command::new(&exe);
        up.args(["up", n, "--lifeline-fd", &fd.to_string()]);
        // SAFETY: the closure runs in the child between fork and exec and makes one
        // async-signal-safe system call (fcntl) on the pipe's read end, open there as
        // here (fork copies every descriptor).
        unsafe {
            up.pre_exec(move || {
                // The read end passes to `xrnic up` (and from it to the service).
                rustix::io::fcntl_setfd(
                    std::os::fd::BorrowedFd::borrow_raw(fd),
                    rustix::io::FdFlags::empty(),
                )?;
                Ok(())
            })
        };
        let out = up.output();
        match out {
            Ok(o) if o.status.success() => {
                let said = String::from_utf8_lossy(&o.stdout);
                if let Some(pid) = served_pid(&said) {
                    pids.push((n.clone(), pid));
                }
            }
            Ok(o) => {
                // Another `xrnic exec` may have started one meanwhile: as good as ours.
                if !matches!(xrnic::ipc::connect_any(n), Ok(Some(_))) {
                    eprintln!(
                        "xrnic exec: no device service for {n}: {}",
                        String::from_utf8_lossy(&o.stderr).trim_end()
                    );
                }
            }
            Err(e) => eprintln!("xrnic exec: cannot start a device service for {n}: {e}"),
        }
    }
    drop(reader);
    (!pids.is_empty()).then_some(Started {
        pids,
        _lifeline: writer,
    })
}

/// The pid in `xrnic up`'s "xrnic_IF served by pid N (log ...)".
fn served_pid(said: &str) -> Option<u32> {
    said.split("served by pid ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The program's pid, for [`forward`].
static CHILD: AtomicI32 = AtomicI32::new(0);

/// A signal to this process goes on to the program. One the kernel sent to the whole
/// foreground process group (the terminal's SIGINT, SIGQUIT: `si_code` SI_KERNEL) reached
/// the program already and is not sent twice.
extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel hands the handler of an SA_SIGINFO action a valid siginfo_t.
    if !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL {
        return;
    }
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe and takes no memory.
        unsafe { libc::kill(pid, sig) };
    }
}

fn forward_signals() {
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ] {
        // SAFETY: sigaction is plain data; all-zero is a valid start (empty mask).
        let mut sa: libc::sigaction = unsafe { core::mem::zeroed() };
        sa.sa_sigaction = forward as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        // SAFETY: installs a handler that only reads an atomic and calls kill(2).
        unsafe { libc::sigaction(sig, &sa, core::ptr::null_mut()) };
    }
}

/// Run `cmd` as a child, signals forwarded to it; when it has exited, close the lifeline
/// of the services in `started` and wait (up to `STOP_PATIENCE`) for them to go. The
/// exit code is the program's (128 + N for a program killed by signal N, as a shell).
pub fn run(mut cmd: Command, prog: &str, started: Started) -> ExitCode {
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("xrnic exec: cannot run {prog}: {e}");
            return ExitCode::from(127);
        }
    };
    CHILD.store(child.id() as i32, Ordering::Relaxed);
    forward_signals();
    let status = child.wait();
    let Started { pids, _lifeline } = started;
    drop(_lifeline);
    for (n, pid) in pids {
        if !gone_within(pid, STOP_PATIENCE) {
            eprintln!(
                "xrnic exec: the device service of {n} (pid {pid}) still has clients: it \
                 stops when they are gone"
            );
        }
    }
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => ExitCode::from(c as u8),
            (None, Some(sig)) => ExitCode::from(128u8.wrapping_add(sig as u8)),
            _ => ExitCode::from(1),
        },
        Err(e) => {
            eprintln!("xrnic exec: waiting for {prog}: {e}");
            ExitCode::from(1)
        }
    }
}

/// Whether process `pid` exits within `limit` (a pidfd readable at its end; gone
/// already counts).
fn gone_within(pid: u32, limit: Duration) -> bool {
    let Some(pid) = rustix::process::Pid::from_raw(pid as i32) else {
        return true;
    };
    let Ok(fd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
        return true;
    };
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let ts = rustix::time::Timespec {
        tv_sec: limit.as_secs() as i64,
        tv_nsec: i64::from(limit.subsec_nanos()),
    };
    loop {
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(n) => return n > 0,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_of_up_s_message() {
        assert_eq!(
            served_pid("xrnic up: xrnic_veth0 served by pid 4321 (log /run/x.log)\n"),
            Some(4321)
        );
        assert_eq!(served_pid("something else"), None);
    }
}
