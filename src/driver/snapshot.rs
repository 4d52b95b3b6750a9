//! The stat snapshot format and its files: what a driver writes to
//! `/run/xrnic/<netdev>.<netns inode>.json` (or `DriverOptions::stat_path`) for
//! `xrnic stat` and `xrnic res` to read (docs/rnic.md, docs/observability.md), the list of
//! this process's live snapshot files, the atomic write (temporary file + rename), and the
//! last snapshot a device leaves (`DriverOptions::final_stat_path`), as it closes or as
//! the program exits with it open ([`Shared::write_final_snapshot_now`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;

use super::{DriverOptions, Engine, PortCounters, Shared, try_lock_for};
use crate::proto::resources::{Owner, Resources};
use crate::proto::{DeviceCounters, QpCounters, QpState};

/// Which interface a snapshot was written for: its index and MAC address in its network
/// namespace. A snapshot's file is named by the namespace's inode, and the kernel reuses
/// the inode of a deleted namespace; a reader compares these with the interface it sees
/// ([`crate::verbs::snapshot_is_here`]) so that a file left by a namespace that is gone is
/// not taken for a device of the new one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct LinkId {
    pub ifindex: u32,
    /// `aa:bb:cc:dd:ee:ff`, as `ip link` prints it.
    pub mac: String,
}

impl LinkId {
    pub fn new(ifindex: u32, mac: [u8; 6]) -> LinkId {
        LinkId {
            ifindex,
            mac: crate::wire::mac_text(&mac),
        }
    }
}

/// The stat snapshot `xrnic stat` reads (see docs/rnic.md).
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub netdev: String,
    /// The interface written for; absent for simulated devices (and in snapshots of older
    /// xrnic versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkId>,
    /// Written by a simulated device (no interface; [`crate::verbs::Device::open_sim_pair`]).
    #[serde(default)]
    pub simulated: bool,
    pub pid: u32,
    /// The writer's start time (`/proc/<pid>/stat` field 22, clock ticks since boot):
    /// with `pid`, it tells the writer from a later process given the same pid
    /// ([`Snapshot::writer_alive`]). Absent in snapshots of older xrnic versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<u64>,
    /// True while the device runs. A device that closes removes its snapshot; older
    /// xrnic versions wrote a last one with `running: false` instead.
    pub running: bool,
    /// Seconds since the Unix epoch when written.
    pub written_at: f64,
    pub device: serde_json::Value,
    pub driver: serde_json::Value,
    pub port: serde_json::Value,
    pub qps: Vec<QpSnapshot>,
    /// Every QP, MR and CQ (`Rnic::resources`), for `xrnic res`; absent in snapshots of
    /// older xrnic versions.
    #[serde(default)]
    pub resources: Option<Resources>,
}

/// One QP in the snapshot.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct QpSnapshot {
    pub qpn: u32,
    pub state: String,
    pub dest_qpn: u32,
    pub counters: serde_json::Value,
    /// DCQCN's current rate, target rate and α of the QP; absent while congestion control
    /// is off (and in snapshots of older xrnic versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<crate::proto::congestion::QpRateStatus>,
}

/// This process's name as `rdma resource show` prints it (`comm`).
fn process_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|c| c.trim_end().to_string())
        .unwrap_or_else(|_| "?".to_string())
}

pub(super) fn snapshot(
    e: &Engine,
    opts: &DriverOptions,
    start_time: Option<u64>,
    running: bool,
    comm: String,
) -> Snapshot {
    let dev: DeviceCounters = e.rnic.counters();
    let mut resources = e.rnic.resources();
    // Named as the verbs API names the device (`ibv_get_device_name`), not as the
    // engine's trace events do.
    resources.dev = format!("xrnic_{}", opts.netdev);
    resources.owner = Some(Owner {
        pid: std::process::id(),
        comm,
    });
    let qps = e
        .qps
        .keys()
        .filter_map(|&q| {
            let a = e.rnic.query_qp(q).ok()?;
            let c: QpCounters = e.rnic.qp_counters(q)?;
            Some(QpSnapshot {
                qpn: q.value(),
                state: state_name(a.qp_state).to_string(),
                dest_qpn: a.dest_qp_num.value(),
                counters: serde_json::to_value(c).unwrap_or_default(),
                rate: e.rnic.congestion().and_then(|cc| cc.qp_status(q)),
            })
        })
        .collect();
    Snapshot {
        netdev: opts.netdev.clone(),
        link: opts.link.clone(),
        simulated: opts.link.is_none(),
        pid: std::process::id(),
        start_time,
        running,
        written_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0),
        device: serde_json::to_value(dev).unwrap_or_default(),
        driver: serde_json::to_value(e.stats).unwrap_or_default(),
        port: serde_json::to_value(e.io).unwrap_or_default(),
        qps,
        resources: Some(resources),
    }
}

/// The libibverbs spelling of a QP state (`ibv_qp_state`, as `rdma resource show` prints).
pub fn state_name(s: QpState) -> &'static str {
    match s {
        QpState::Reset => "RESET",
        QpState::Init => "INIT",
        QpState::Rtr => "RTR",
        QpState::Rts => "RTS",
        QpState::Sqd => "SQD",
        QpState::Sqe => "SQE",
        QpState::Err => "ERR",
    }
}

/// The stat snapshot files of this process's live devices. A driver renames its snapshot
/// into place only while its path is listed, under this lock, so that once
/// [`remove_live_snapshots`] has run no snapshot of this process comes back.
static LIVE_SNAPSHOTS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

pub(super) fn live_snapshots() -> MutexGuard<'static, Vec<PathBuf>> {
    LIVE_SNAPSHOTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Remove the stat snapshots of every device of this process that is still open, for a
/// program about to exit without closing them (the CLI's SIGINT/SIGTERM handler); their
/// drivers write no snapshot afterwards. Returns how many files were removed.
pub fn remove_live_snapshots() -> usize {
    let mut live = live_snapshots();
    let mut n = 0;
    for p in live.drain(..) {
        if std::fs::remove_file(&p).is_ok() {
            n += 1;
        }
    }
    n
}

/// A device closed: its snapshot is removed (unless another device of this process
/// writes the same file, e.g. two simulated pairs given one directory).
pub(super) fn close_snapshot(path: &std::path::Path) {
    let mut live = live_snapshots();
    let Some(i) = live.iter().position(|p| p == path) else {
        // Removed already by `remove_live_snapshots`.
        return;
    };
    live.swap_remove(i);
    if !live.iter().any(|p| p == path) {
        let _ = std::fs::remove_file(path);
    }
}

/// The start time of process `pid`: field 22 of `/proc/<pid>/stat` (`starttime`, clock
/// ticks after boot; proc(5)). `None` when there is no such process.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// Field 22 of a `/proc/<pid>/stat` line. Field 2 is the command in parentheses and may
/// itself hold spaces and parentheses: fields are counted from the last `)`.
fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts with field 3 (the state).
    rest.split_ascii_whitespace().nth(22 - 3)?.parse().ok()
}

impl Snapshot {
    /// Whether the process that wrote this snapshot still runs: a process of its pid
    /// exists and, when the snapshot has one, with its start time (a pid the kernel gave
    /// to a later process does not count). Snapshots of older xrnic versions (no start
    /// time) go by the pid alone.
    pub fn writer_alive(&self) -> bool {
        match (process_start_time(self.pid), self.start_time) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(now), Some(then)) => now == then,
        }
    }
}

/// Write the snapshot atomically (a temporary file renamed over the old one), so that a
/// reader never sees half a file. Failures are ignored: stats are best effort.
pub(super) fn write_snapshot(
    shared: &Shared,
    opts: &DriverOptions,
    path: &std::path::Path,
    start_time: Option<u64>,
) {
    let Some(tmp) = write_temporary(shared, opts, path, start_time, true) else {
        return;
    };
    // Renamed into place only while listed: not after `remove_live_snapshots`.
    let live = live_snapshots();
    if !live.iter().any(|p| p == path) || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The last snapshot of a device ([`DriverOptions::final_stat_path`]), written once: by
/// whichever comes first, the driver thread as the device closes ([`write_final_snapshot`])
/// or [`Shared::write_final_snapshot_now`] for a program exiting with the device open.
#[derive(Debug)]
pub(super) struct FinalStat {
    /// The device's options (netdev and link for the snapshot; `final_stat_path` set).
    opts: DriverOptions,
    path: PathBuf,
    /// Claimed by the writer (given back by one that could not write).
    claimed: AtomicBool,
}

impl FinalStat {
    /// `None` unless `opts` asks for a last snapshot.
    pub(super) fn new(opts: &DriverOptions) -> Option<FinalStat> {
        Some(FinalStat {
            path: opts.final_stat_path.clone()?,
            opts: opts.clone(),
            claimed: AtomicBool::new(false),
        })
    }

    /// True for the first caller only: it writes.
    fn claim(&self) -> bool {
        !self.claimed.swap(true, Ordering::SeqCst)
    }
}

/// The last snapshot (`running: false`) into its file as the device closes, unless the
/// program's exit wrote it already ([`Shared::write_final_snapshot_now`]).
pub(super) fn write_final_snapshot(shared: &Shared, last: &FinalStat, start_time: Option<u64>) {
    if !last.claim() {
        return;
    }
    let comm = process_name();
    let snap = snapshot(&shared.lock(), &last.opts, start_time, false, comm);
    write_in_place(&snap, &last.path);
}

impl Shared {
    /// For a program exiting with the device open (exit(), a return from main: the
    /// libibverbs library's exit handler, src/abi/device.rs): write the last snapshot
    /// [`DriverOptions::final_stat_path`] asks for now, as a close would (the same file,
    /// `running: false`, the counters at this moment), unless it was written already.
    /// The driver thread and the application's threads still run and may hold the locks:
    /// each is tried for at most `patience` and, when the engine's stays held, nothing
    /// is written (false; a later close may still write it). The driver thread goes on
    /// and writes no second one: it writes the last snapshot only as the device closes.
    pub fn write_final_snapshot_now(&self, patience: Duration) -> bool {
        let Some(last) = &self.final_stat else {
            return false;
        };
        if !last.claim() {
            return false;
        }
        let start_time = process_start_time(std::process::id());
        let comm = process_name();
        // The port's counters, refreshed as the driver does before its last snapshot
        // (left as the last interval read them when the port stays locked).
        let io = try_lock_for(&self.port, patience).and_then(|p| p.as_ref().map(PortCounters::of));
        // The engine's own lock, without the guard's wake-ups and completion hook:
        // this only reads (and stores the port's counters).
        let Some(mut e) = try_lock_for(&self.engine, patience) else {
            last.claimed.store(false, Ordering::SeqCst);
            return false;
        };
        if let Some(io) = io {
            io.store(&mut e);
        }
        let snap = snapshot(&e, &last.opts, start_time, false, comm);
        drop(e);
        write_in_place(&snap, &last.path)
    }
}

/// A snapshot written to a temporary file beside `path`, to be renamed over it.
fn write_temporary(
    shared: &Shared,
    opts: &DriverOptions,
    path: &std::path::Path,
    start_time: Option<u64>,
    running: bool,
) -> Option<PathBuf> {
    // Read before taking the lock: the engine lock is held for bounded in-memory work only.
    let comm = process_name();
    let snap = snapshot(&shared.lock(), opts, start_time, running, comm);
    temporary_of(&snap, path)
}

/// `snap` written to a temporary file beside `path`, to be renamed over it.
fn temporary_of(snap: &Snapshot, path: &std::path::Path) -> Option<PathBuf> {
    let text = serde_json::to_vec_pretty(snap).ok()?;
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    if std::fs::write(&tmp, text).is_err() {
        let _ = std::fs::remove_file(&tmp);
        return None;
    }
    Some(tmp)
}

/// `snap` into `path` atomically (a temporary file renamed over it); whether it was.
fn write_in_place(snap: &Snapshot, path: &std::path::Path) -> bool {
    let Some(tmp) = temporary_of(snap, path) else {
        return false;
    };
    let ok = std::fs::rename(&tmp, path).is_ok();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_field_22_counted_from_the_last_parenthesis() {
        // proc(5): pid (comm) state ppid ... field 22 starttime. A comm with spaces and
        // parentheses must not shift the fields.
        let mut fields: Vec<String> = (3..=52).map(|i| format!("{}", i * 10)).collect();
        fields[0] = "S".into();
        let line = format!("4242 (a (b) c) {}\n", fields.join(" "));
        assert_eq!(parse_start_time(&line), Some(220));
        assert_eq!(parse_start_time("4242 (x"), None);
        let me = process_start_time(std::process::id()).expect("own start time");
        assert_eq!(process_start_time(std::process::id()), Some(me));
    }
}
