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

impl super::Device {
    /// For a program exiting with this device open: write the last snapshot
    /// [`super::DeviceOptions::final_stat`] asks for now, as closing it would
    /// ([`crate::driver::Shared::write_final_snapshot_now`]: each lock tried for at most
    /// `patience`). False when nothing was written: no such file asked for, written
    /// already, the engine kept locked, or not a device in this process.
    pub fn write_final_stat_now(&self, patience: std::time::Duration) -> bool {
        self.inner
            .soft()
            .is_some_and(|s| s.write_final_snapshot_now(patience))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Access, Device, DeviceOptions, QpInitAttr};
    use crate::driver::Snapshot;

    fn read(path: &std::path::Path) -> Snapshot {
        let t = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_slice(&t).unwrap()
    }

    /// What the libibverbs library's exit handler does for a program exiting with its
    /// devices open (src/abi/device.rs `write_final_stats_at_exit`): the last snapshot,
    /// written now and once (the close after writes no second one); with the engine
    /// locked by another holder, nothing, and the close writes it.
    #[test]
    fn the_final_snapshot_at_exit_is_written_once_and_not_under_a_held_engine() {
        let dir = std::env::temp_dir().join(format!("xrnic-final-now-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (fa, fb) = (dir.join("a.json"), dir.join("b.json"));
        let opts = |f: &std::path::Path| DeviceOptions {
            final_stat: Some(f.to_path_buf()),
            ..DeviceOptions::default()
        };
        let (a, b) = Device::open_sim_pair_with(&opts(&fa), &opts(&fb)).unwrap();
        let pd = a.alloc_pd().unwrap();
        let cq = a.create_cq(16).unwrap();
        let _mr = pd.reg_mr(4096, Access::ALL).unwrap();
        let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 4)).unwrap();
        let patience = Duration::from_millis(100);

        assert!(a.write_final_stat_now(patience));
        let s = read(&fa);
        assert!(!s.running);
        assert_eq!(s.netdev, "sim0");
        assert_eq!(s.pid, std::process::id());
        assert_eq!(s.qps.len(), 1);
        assert_eq!(s.qps[0].qpn, qp.qp_num().value());
        assert_eq!(s.qps[0].state, "RESET");
        assert_eq!(s.resources.as_ref().map(|r| r.mrs.len()), Some(1));
        assert!(!a.write_final_stat_now(patience), "written once");
        std::fs::remove_file(&fa).unwrap();

        let held = b.inner.soft().unwrap().lock();
        assert!(!b.write_final_stat_now(Duration::from_millis(5)));
        drop(held);
        assert!(!fb.exists());

        drop((qp, _mr, cq, pd, a, b));
        assert!(!fa.exists(), "the close writes no second snapshot");
        assert!(
            !read(&fb).running,
            "the close writes the one the exit could not"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
