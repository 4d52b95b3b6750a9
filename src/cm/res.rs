//! The cm_ids of a process as `xrnic res cm_id` lists them (like `rdma resource show
//! cm_id`). The CM lives in each program's process (docs/rdmacm.md), so each process
//! running xrnic's librdmacm publishes its ids in a file of its own,
//! `<dir>/cm/<pid>.<netns inode>.json` (`dir` is [`crate::verbs::STAT_DIR`] by default),
//! rewritten when the list changes (the CM port's thread looks at least every 100 ms) and
//! removed when the last id is destroyed. A file whose writer is gone (killed) stays
//! behind: the reader skips it ([`CmFile::writer_alive`]).
//!
//! This module is plain data and file naming; the [`super::Cm`] state machine stays
//! sans-IO.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One cm_id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmIdRecord {
    /// The interface (xrnic device `xrnic_<if>`), empty before the id has a device.
    pub ifname: String,
    pub port: u8,
    /// The rdma_cm state, as kernel cma.c `enum rdma_cm_state` names it for
    /// `rdma resource show cm_id`: IDLE, ADDR_BOUND, ADDR_RESOLVED, ROUTE_RESOLVED,
    /// LISTEN, CONNECT, DISCONNECT.
    pub state: String,
    /// The IB CM's state of the id's connection (cm.c `enum ib_cm_state` names:
    /// REQ_SENT, ESTABLISHED, TIMEWAIT, ...), when it has one.
    pub cm_state: Option<String>,
    /// Port space: TCP, UDP, IB, IPOIB.
    pub ps: String,
    /// RC or UD.
    pub qp_type: String,
    /// The QP the connection carries (local QPN), when connected or connecting.
    pub lqpn: Option<u32>,
    pub src_addr: String,
    pub dst_addr: String,
}

/// A process's file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmFile {
    pub pid: u32,
    pub comm: String,
    /// The writer's start time (clock ticks since boot, /proc/PID/stat field 22): a
    /// reused pid is not the writer.
    pub start_time: u64,
    pub ids: Vec<CmIdRecord>,
}

impl CmFile {
    /// Whether the process that wrote the file still runs.
    pub fn writer_alive(&self) -> bool {
        start_time(self.pid) == Some(self.start_time)
    }
}

/// Field 22 of /proc/PID/stat (after the parenthesised comm, which may hold spaces).
pub fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    // Fields after comm start at field 3 (state): field 22 is the 20th of them.
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn netns_inode() -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/thread-self/ns/net")?.ino())
}

/// This process's file in `dir` (for the calling thread's network namespace).
pub fn cm_file(dir: &Path, pid: u32) -> std::io::Result<PathBuf> {
    Ok(dir
        .join("cm")
        .join(format!("{pid}.{}.json", netns_inode()?)))
}

/// Every process's file of the calling thread's network namespace, by pid. A missing
/// directory is none, not an error.
pub fn cm_files(dir: &Path) -> std::io::Result<Vec<(u32, PathBuf)>> {
    let suffix = format!(".{}.json", netns_inode()?);
    let entries = match std::fs::read_dir(dir.join("cm")) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_suffix(&suffix).and_then(|p| p.parse().ok()) {
            out.push((pid, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Write `f` as `path` (a temporary file renamed over it: a reader never sees half).
pub fn write(path: &Path, f: &CmFile) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string(f).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Read one file.
pub fn read(path: &Path) -> Result<CmFile, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: not a cm_id listing: {e}", path.display()))
}

impl CmIdRecord {
    /// One line in `rdma resource show cm_id`'s order, then the owner.
    pub fn line(&self, pid: u32, comm: &str) -> String {
        let mut l = format!(
            "link xrnic_{}/{} state {} ps {} qp-type {}",
            self.ifname, self.port, self.state, self.ps, self.qp_type
        );
        if let Some(q) = self.lqpn {
            l += &format!(" lqpn {q}");
        }
        if let Some(c) = &self.cm_state {
            l += &format!(" cm-state {c}");
        }
        l += &format!(
            " src-addr {} dst-addr {} pid {pid} comm {comm}",
            self.src_addr, self.dst_addr
        );
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> CmIdRecord {
        CmIdRecord {
            ifname: "veth0".into(),
            port: 1,
            state: "LISTEN".into(),
            cm_state: None,
            ps: "TCP".into(),
            qp_type: "RC".into(),
            lqpn: None,
            src_addr: "192.0.2.2:7174".into(),
            dst_addr: "0.0.0.0:0".into(),
        }
    }

    #[test]
    fn a_file_round_trips_and_names_its_writer() {
        let dir = std::env::temp_dir().join(format!("xrnic-cmres-{}", std::process::id()));
        let me = std::process::id();
        let f = CmFile {
            pid: me,
            comm: "t".into(),
            start_time: start_time(me).unwrap(),
            ids: vec![rec()],
        };
        let p = cm_file(&dir, me).unwrap();
        write(&p, &f).unwrap();
        assert_eq!(read(&p).unwrap(), f);
        assert!(f.writer_alive());
        let files = cm_files(&dir).unwrap();
        assert_eq!(files, vec![(me, p.clone())]);
        // Another start time: a reused pid, not the writer.
        let g = CmFile {
            start_time: f.start_time + 1,
            ..f.clone()
        };
        assert!(!g.writer_alive());
        std::fs::write(&p, "{").unwrap();
        assert!(read(&p).unwrap_err().contains("not a cm_id listing"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn line_reads_like_rdma_resource_show_cm_id() {
        assert_eq!(
            rec().line(42, "rping"),
            "link xrnic_veth0/1 state LISTEN ps TCP qp-type RC src-addr 192.0.2.2:7174 dst-addr 0.0.0.0:0 pid 42 comm rping"
        );
        let c = CmIdRecord {
            state: "CONNECT".into(),
            cm_state: Some("ESTABLISHED".into()),
            lqpn: Some(17),
            ..rec()
        };
        assert!(
            c.line(1, "x")
                .contains("state CONNECT ps TCP qp-type RC lqpn 17 cm-state ESTABLISHED"),
            "{}",
            c.line(1, "x")
        );
    }
}
