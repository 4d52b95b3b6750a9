//! Where stat snapshots live: one file per interface and network namespace (read by
//! `xrnic stat` and `xrnic res`; the format is `crate::driver::Snapshot`).

use std::path::PathBuf;

/// The directory `xrnic` tools write stat snapshots to.
pub const STAT_DIR: &str = "/run/xrnic";

/// The stat snapshot file of `netdev` in the calling thread's network namespace:
/// `<dir>/<netdev>.<netns inode>.json`. The inode keeps two namespaces' `eth0` apart;
/// `xrnic stat` run in the same namespace finds the same file.
pub fn stat_file(dir: &std::path::Path, netdev: &str) -> std::io::Result<PathBuf> {
    let ino = netns_inode()?;
    Ok(dir.join(format!("{netdev}.{ino}.json")))
}

/// The inode of the calling thread's network namespace.
fn netns_inode() -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/thread-self/ns/net")?.ino())
}

/// Every stat snapshot of the calling thread's network namespace in `dir`, as
/// `(netdev, path)` sorted by netdev: the devices `xrnic res` lists without `--netdev`.
/// A missing `dir` is no snapshot, not an error.
pub fn stat_files(dir: &std::path::Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let suffix = format!(".{}.json", netns_inode()?);
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        // Interface names may hold dots (`eth0.100`): strip the suffix, not split.
        if let Some(netdev) = name.strip_suffix(&suffix).filter(|n| !n.is_empty()) {
            out.push((netdev.to_string(), e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Whether `snap` was written for the interface of its name in the calling thread's
/// network namespace: the same index and MAC address ([`crate::driver::LinkId`]). False
/// for a file a deleted namespace left behind under an inode the kernel has since given to
/// this one, or written for an interface since deleted. A simulated device's snapshot is
/// taken as it is; one of an older xrnic (no identity) needs an interface of its name.
pub fn snapshot_is_here(snap: &crate::driver::Snapshot) -> bool {
    if snap.simulated {
        return true;
    }
    match (crate::io::link::link_info(None, &snap.netdev), &snap.link) {
        (Err(_), _) => false,
        (Ok(_), None) => true,
        (Ok(l), Some(id)) => crate::driver::LinkId::new(l.ifindex, l.mac) == *id,
    }
}
