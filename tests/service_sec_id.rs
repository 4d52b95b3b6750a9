//! Clients know the real service (docs/security.md, the local half): the service's name
//! `@xrnic/<IF>` is an abstract socket name, which any user of the network namespace can
//! bind first (unix(7)). Here user nobody does so in a fresh namespace; root's
//! `xrnic up IF` then refuses to start and names the squatter's pid and uid, and root's
//! clients (the Rust API, and a stock tool through the C library) refuse to talk to it,
//! naming it too, and send it nothing. Root tests (`#[ignore = "needs root"]`,
//! docs/testing.md); the library must be built (`cargo build --workspace`).

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use common::{text, xrnic_bin};
use xrnic_netns::{Side, VethPair};

const NOBODY: u32 = 65534;

/// A process of user nobody holding `@xrnic/<IF>` in A's namespace: a child forked in a
/// thread that entered the namespace, which makes only system calls (setresuid, socket,
/// bind, listen, accept, read, write: async-signal-safe, as a child of a threaded
/// process must). For each connection it writes to a pipe the size of the first message
/// it got (0: the client closed without sending), then closes it.
struct Squatter {
    pid: i32,
    records: OwnedFd,
}

impl Squatter {
    fn start(pair: &VethPair, ifname: &str, listen: bool) -> Squatter {
        let name = xrnic::ipc::socket_name(ifname);
        pair.run_in(Side::A, move || {
            // SAFETY: all-zero is a valid sockaddr_un.
            let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (d, s) in addr.sun_path[1..].iter_mut().zip(&name) {
                *d = *s as libc::c_char;
            }
            let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as u32;
            let mut p = [0i32; 2];
            // SAFETY: `p` has room for the two descriptors.
            assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            // SAFETY: the child below makes only async-signal-safe system calls on memory
            // prepared before the fork, then _exit()s.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork");
            if pid == 0 {
                // SAFETY: system calls on valid local memory; the child never returns.
                unsafe { squat(p[1], &addr, len, listen) }
            }
            // SAFETY: p[1] is this process's and open; p[0] is owned by the OwnedFd.
            unsafe { libc::close(p[1]) };
            let sq = Squatter {
                pid,
                // SAFETY: p[0] is a fresh descriptor this process owns.
                records: unsafe { OwnedFd::from_raw_fd(p[0]) },
            };
            // The name is held before any client or `xrnic up` runs (no race with them).
            assert_eq!(sq.wait_records(1), [READY], "the squatter bound the name");
            sq
        })
        .unwrap()
    }

    /// The sizes of the first messages of the connections it accepted, waiting (up to
    /// 20 s) until there are at least `n`.
    fn wait_records(&self, n: usize) -> Vec<u32> {
        let mut got = Vec::new();
        let end = Instant::now() + Duration::from_secs(20);
        while got.len() < n && Instant::now() < end {
            let mut pfd = libc::pollfd {
                fd: self.records.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
                continue;
            }
            let mut b = [0u8; 4];
            // SAFETY: `b` is 4 writable bytes; the child writes records of 4 bytes.
            let r = unsafe { libc::read(self.records.as_raw_fd(), b.as_mut_ptr().cast(), 4) };
            if r != 4 {
                break;
            }
            got.push(u32::from_ne_bytes(b));
        }
        got
    }
}

impl Drop for Squatter {
    fn drop(&mut self) {
        // SAFETY: the child this struct forked.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// The squatter's body (see [`Squatter`]).
///
/// # Safety
/// `addr`/`len` a valid abstract address, `rec` a pipe's write end; call only in a
/// freshly forked child.
/// The record a squatter writes once its socket is bound (and listening).
const READY: u32 = u32::MAX;

unsafe fn squat(rec: i32, addr: &libc::sockaddr_un, len: u32, listen: bool) -> ! {
    // SAFETY (the whole body): raw system calls on local memory, as the fn's contract says.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        let g = NOBODY;
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(g, g, g) != 0
            || libc::setresuid(NOBODY, NOBODY, NOBODY) != 0
        {
            libc::_exit(2);
        }
        let l = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
        if l < 0 || libc::bind(l, (addr as *const libc::sockaddr_un).cast(), len) != 0 {
            libc::_exit(3);
        }
        if listen && libc::listen(l, 16) != 0 {
            libc::_exit(4);
        }
        // Bound (and listening): the parent may go on.
        libc::write(rec, (&READY as *const u32).cast(), 4);
        let mut buf = [0u8; 4096];
        loop {
            if !listen {
                libc::pause();
                continue;
            }
            let c = libc::accept(l, std::ptr::null_mut(), std::ptr::null_mut());
            if c < 0 {
                continue;
            }
            let n = libc::read(c, buf.as_mut_ptr().cast(), buf.len()).max(0) as u32;
            libc::write(rec, (&n as *const u32).cast(), 4);
            libc::close(c);
        }
    }
}

/// `xrnic ARGS` as root in A.
fn root_xrnic(pair: &VethPair, args: &[&str]) -> std::process::Output {
    std::process::Command::new("ip")
        .args(["netns", "exec", &pair.end(Side::A).netns, xrnic_bin()])
        .args(args)
        .output()
        .unwrap()
}

fn names(squatter: &Squatter) -> [String; 2] {
    [format!("pid {}", squatter.pid), format!("uid {NOBODY}")]
}

#[test]
#[ignore = "needs root"]
fn up_names_the_squatter() {
    let pair = VethPair::new(1500).expect("veth pair (root)");
    let ifname = pair.end(Side::A).ifname.clone();
    let sq = Squatter::start(&pair, &ifname, true);
    // The squatter listens once it accepts a connection: until then `up` may see nothing.
    let o = root_xrnic(&pair, &["up", &ifname]);
    assert!(!o.status.success(), "xrnic up started: {}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for n in names(&sq) {
        assert!(err.contains(&n), "no {n:?} in: {}", text(&o));
    }
    assert!(err.contains("not a device service"), "{}", text(&o));
    // `up` sent it nothing either.
    let r = sq.wait_records(1);
    assert!(!r.is_empty() && r.iter().all(|&n| n == 0), "{r:?}");
}

#[test]
#[ignore = "needs root"]
fn up_names_a_squatter_that_binds_without_listening() {
    let pair = VethPair::new(1500).expect("veth pair (root)");
    let ifname = pair.end(Side::A).ifname.clone();
    let sq = Squatter::start(&pair, &ifname, false);
    // Bound: nothing listens, so `up` starts its daemon, whose bind fails.
    let name = format!("@xrnic/{ifname}");
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        let t = std::fs::read_to_string(format!("/proc/{}/net/unix", sq.pid)).unwrap_or_default();
        if t.contains(&name) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = root_xrnic(&pair, &["up", &ifname]);
    assert!(!o.status.success(), "xrnic up started: {}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for n in names(&sq) {
        assert!(err.contains(&n), "no {n:?} in: {}", text(&o));
    }
    let _ = std::fs::remove_file(format!("/run/xrnic/service.{ifname}.log"));
}

#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn root_clients_refuse_the_impostor_and_send_it_nothing() {
    let pair = VethPair::new(1500).expect("veth pair (root)");
    let ifname = pair.end(Side::A).ifname.clone();
    let sq = Squatter::start(&pair, &ifname, true);
    // The Rust API, as root.
    let name = ifname.clone();
    let r = pair
        .run_in(Side::A, move || {
            xrnic::verbs::Device::open(&name).map(|d| d.service_pid())
        })
        .unwrap();
    let e = match r {
        Ok(pid) => panic!("opened through {pid:?}"),
        Err(e) => e,
    };
    let msg = e.to_string();
    for n in names(&sq) {
        assert!(msg.contains(&n), "no {n:?} in: {msg}");
    }
    match &e {
        xrnic::verbs::Error::Io(io) => {
            assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied, "{msg}")
        }
        other => panic!("not an I/O error: {other:?}"),
    }
    // A stock tool through the C library, as root.
    let o = root_xrnic(
        &pair,
        &["exec", "--netdev", &ifname, "--", "/usr/bin/ibv_devinfo"],
    );
    assert!(!o.status.success(), "ibv_devinfo: {}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for n in names(&sq) {
        assert!(err.contains(&n), "no {n:?} in: {}", text(&o));
    }
    // Each connected and closed without sending a byte.
    let r = sq.wait_records(2);
    assert!(r.len() >= 2 && r.iter().all(|&n| n == 0), "{r:?}");
}
