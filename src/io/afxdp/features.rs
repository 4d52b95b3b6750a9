//! What the running kernel's AF_XDP supports, probed once per process.
//!
//! The probe binds a throw-away AF_XDP socket (a two-chunk UMEM, two-entry rings) in copy
//! mode to queue 0 of the loopback interface of a fresh network namespace (made for the
//! probe on a thread of its own with unshare(2), gone when that thread ends: no other
//! process's socket can hold that queue, and the kernel's deferred release of one probe
//! socket cannot make the next one busy), once with each bind flag in question. A kernel that does not know a flag refuses the bind with EINVAL (`xsk_bind`
//! in net/xdp/xsk.c checks the flags against the ones it knows), so the answer does not
//! depend on the kernel version string, on backports, or on the interface xrnic will use.
//! Nothing is attached and no frame moves: the socket is closed at once.
//!
//! | feature | bind flag | first kernel | without it |
//! |---|---|---|---|
//! | multi-buffer | `XDP_USE_SG` | 6.6 | single-buffer sockets: frames up to [`CHUNK_DATA`] bytes, the port's MTU capped so a frame always fits (docs/rnic.md) |
//! | need_wakeup | `XDP_USE_NEED_WAKEUP` | 5.4 | a `sendto` kick after every transmit batch; no fill-ring wake-up (without the flag the kernel takes fill-ring chunks as frames arrive, and a zero-copy driver keeps polling the ring) |
//!
//! Without root (no AF_XDP socket can be made) the answer falls back to the kernel's
//! version (`uname -r`), and says so.
//!
//! [`CHUNK_DATA`]: super::CHUNK_DATA

use std::sync::OnceLock;

use rustix::io::Errno;
use rustix::net::xdp::{SocketAddrXdp, SocketAddrXdpFlags, XdpUmemReg, XdpUmemRegFlags};
use rustix::net::{AddressFamily, SocketType, bind, socket, sockopt};

/// Whether the kernel has a feature, and how that was learnt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Support {
    /// A probe socket bound with the flag.
    Yes,
    /// A probe socket was refused with EINVAL with the flag and bound without it.
    No,
    /// No probe could run (not root, no AF_XDP): guessed from the kernel version.
    Guessed { yes: bool, why: String },
}

impl Support {
    pub fn available(&self) -> bool {
        match self {
            Support::Yes => true,
            Support::No => false,
            Support::Guessed { yes, .. } => *yes,
        }
    }
}

/// The AF_XDP features xrnic uses and whether this kernel has them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelFeatures {
    /// The kernel release (`uname -r`).
    pub release: String,
    /// `XDP_USE_SG`: frames of several chunks (Linux 6.6).
    pub multi_buffer: Support,
    /// `XDP_USE_NEED_WAKEUP` (Linux 5.4).
    pub need_wakeup: Support,
}

/// The first kernel with AF_XDP multi-buffer (`XDP_USE_SG`).
pub const MULTI_BUFFER_SINCE: (u32, u32) = (6, 6);
/// The first kernel with `XDP_USE_NEED_WAKEUP`.
pub const NEED_WAKEUP_SINCE: (u32, u32) = (5, 4);

/// The running kernel's release string.
pub fn kernel_release() -> String {
    rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned()
}

/// `major.minor` of a release string like `6.1.0-13-amd64`.
pub fn parse_release(r: &str) -> Option<(u32, u32)> {
    let mut it = r.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// The kernel's features, probed on the first call (see the module doc).
pub fn kernel_features() -> &'static KernelFeatures {
    static F: OnceLock<KernelFeatures> = OnceLock::new();
    F.get_or_init(|| {
        let release = kernel_release();
        let version = parse_release(&release);
        let guess = |since: (u32, u32), why: &str| Support::Guessed {
            yes: version.is_some_and(|v| v >= since),
            why: format!("{why}; guessed from kernel {release}"),
        };
        let (multi_buffer, need_wakeup) = match probe(SocketAddrXdpFlags::empty()) {
            Ok(()) => (
                flag_support(SocketAddrXdpFlags::XDP_USE_SG),
                flag_support(SocketAddrXdpFlags::XDP_USE_NEED_WAKEUP),
            ),
            Err(e) => {
                let why = format!("no AF_XDP probe socket ({e})");
                (
                    guess(MULTI_BUFFER_SINCE, &why),
                    guess(NEED_WAKEUP_SINCE, &why),
                )
            }
        };
        KernelFeatures {
            release,
            multi_buffer,
            need_wakeup,
        }
    })
}

fn flag_support(flag: SocketAddrXdpFlags) -> Support {
    match probe(flag) {
        Ok(()) => Support::Yes,
        Err(Errno::INVAL) | Err(Errno::OPNOTSUPP) => Support::No,
        // The plain bind worked, so something else went wrong: say so, assume no.
        Err(e) => Support::Guessed {
            yes: false,
            why: format!("probe bind with {flag:?} failed: {e}"),
        },
    }
}

/// The probe socket's UMEM: two page-aligned 4 KiB chunks.
#[repr(C, align(4096))]
struct ProbeUmem([u8; 8192]);

/// Bind a throw-away AF_XDP socket to `lo` queue 0 in copy mode with `flags`, in a
/// network namespace of its own.
fn probe(flags: SocketAddrXdpFlags) -> Result<(), Errno> {
    super::sys::in_private_netns(|| probe_here(flags))?
}

fn probe_here(flags: SocketAddrXdpFlags) -> Result<(), Errno> {
    let umem = Box::new(ProbeUmem([0; 8192]));
    let fd = socket(AddressFamily::XDP, SocketType::RAW, None)?;
    sockopt::set_xdp_umem_reg(
        &fd,
        XdpUmemReg {
            addr: umem.0.as_ptr() as u64,
            len: umem.0.len() as u64,
            chunk_size: 4096,
            headroom: 0,
            flags: XdpUmemRegFlags::empty(),
            tx_metadata_len: 0,
        },
    )?;
    sockopt::set_xdp_umem_fill_ring_size(&fd, 2)?;
    sockopt::set_xdp_umem_completion_ring_size(&fd, 2)?;
    sockopt::set_xdp_rx_ring_size(&fd, 2)?;
    sockopt::set_xdp_tx_ring_size(&fd, 2)?;
    // The loopback interface is index 1 in every network namespace.
    let addr = SocketAddrXdp::new(flags | SocketAddrXdpFlags::XDP_COPY, 1, 0);
    let r = bind(&fd, &addr);
    // The socket closes (and unpins the UMEM) before the memory is freed.
    drop(fd);
    drop(umem);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_strings_of_distribution_kernels_parse() {
        assert_eq!(parse_release("6.1.0-13-amd64"), Some((6, 1)));
        assert_eq!(parse_release("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(parse_release("5.14.0-362.8.1.el9_3.x86_64"), Some((5, 14)));
        assert_eq!(parse_release("6.18.44-fc-v1045"), Some((6, 18)));
        assert_eq!(parse_release("garbage"), None);
    }

    #[test]
    #[ignore = "needs root"]
    fn a_bind_flag_the_kernel_does_not_know_is_found_missing() {
        assert!(
            rustix::process::geteuid().is_root(),
            "the AF_XDP probe needs root (make test runs this as root)"
        );
        // Bit 15 is no XDP bind flag (if_xdp.h defines bits 0-4): the kernel refuses
        // it with EINVAL exactly as a 6.1 kernel refuses XDP_USE_SG.
        assert_eq!(
            flag_support(SocketAddrXdpFlags::from_bits_retain(1 << 15)),
            Support::No
        );
        assert_eq!(flag_support(SocketAddrXdpFlags::empty()), Support::Yes);
    }

    #[test]
    fn the_probe_answers_consistently_with_the_running_kernel() {
        let f = kernel_features();
        let v = parse_release(&f.release).expect("release parses");
        let root = rustix::process::geteuid().is_root();
        match &f.multi_buffer {
            // Root can always run the probe, and on a mainline kernel it agrees with the
            // version (a distribution backport could only turn a "no" into a "yes").
            Support::Yes | Support::No => {
                assert!(root, "{f:?}");
                if v < MULTI_BUFFER_SINCE {
                    assert_eq!(f.multi_buffer, Support::No, "{f:?}");
                }
            }
            Support::Guessed { yes, why } => {
                assert!(!root, "root can probe: {f:?}");
                assert_eq!(*yes, v >= MULTI_BUFFER_SINCE, "{why}");
            }
        }
        if root && v >= MULTI_BUFFER_SINCE {
            assert_eq!(f.multi_buffer, Support::Yes, "{f:?}");
        }
        assert!(f.need_wakeup.available(), "{f:?}");
    }
}
