//! Small system look-ups the port needs before it touches AF_XDP: privileges, the
//! interface index, and a mounted bpffs.

use std::io;
use std::path::Path;

use rustix::fs::statfs;
use rustix::mount::{MountFlags, mount};
use rustix::net::{AddressFamily, SocketType, netdevice, socket};

use super::Error;

/// `BPF_FS_MAGIC` from <linux/magic.h>.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const BPFFS: &str = "/sys/fs/bpf";

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

/// Is a bpffs mounted on /sys/fs/bpf?
// `f_type` is i64 on x86_64 but narrower on some other architectures.
#[allow(clippy::unnecessary_cast)]
pub fn bpffs_mounted() -> bool {
    statfs(BPFFS).is_ok_and(|s| s.f_type as i64 == BPF_FS_MAGIC)
}

/// Mount bpffs on /sys/fs/bpf unless it already is. libxdp keeps its dispatcher state
/// there and falls back to single-program mode without it (REFERENCE §7).
pub fn ensure_bpffs() -> Result<(), Error> {
    if bpffs_mounted() {
        return Ok(());
    }
    if !Path::new(BPFFS).is_dir() {
        std::fs::create_dir_all(BPFFS).map_err(Error::BpffsMount)?;
    }
    match mount("bpf", BPFFS, "bpf", MountFlags::empty(), None) {
        Ok(()) => Ok(()),
        // Another thread or process mounted it in between.
        Err(_) if bpffs_mounted() => Ok(()),
        Err(e) => Err(Error::BpffsMount(e.into())),
    }
}
