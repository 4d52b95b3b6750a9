//! `xrnic res [qp|mr|cq]`: the QPs, MRs and CQs of xrnic devices running in other
//! processes, like `rdma resource show [qp|mr|cq]`.
//!
//! Contract: the data comes from the stat snapshot each device's driver writes (see
//! [`crate::cli::stat`]): its `resources` field ([`Resources`]) is rewritten every stat
//! interval (500 ms) and removed when the device closes. With `--netdev IF` one device
//! is listed, otherwise every snapshot of the calling network namespace in `--dir`
//! ([`crate::verbs::stat_files`]), the way `rdma` lists every device. Each device starts
//! with a line saying whether its snapshot is from a running device, stale (the writer,
//! named by pid and start time, is gone without closing), or the last one an older xrnic
//! wrote on close, and how old it is.
//! A snapshot whose interface identity (index, MAC) does not match the interface of that
//! name here is not this namespace's ([`crate::verbs::snapshot_is_here`]): skipped in
//! the listing, an error with `--netdev`.
//! The object lines are [`Resources::qp_lines`] / [`mr_lines`](Resources::mr_lines) /
//! [`cq_lines`](Resources::cq_lines), the same as `xrnic sim --res`, ending in the owner's
//! `pid` and `comm`. Without an object: one summary line per device. `--json`: one JSON
//! array, an object per device. A missing or unreadable snapshot is a clear message on
//! stderr and exit 1 (the other devices are still listed).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::driver::Snapshot;
use crate::proto::resources::Resources;

/// What to list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Object {
    /// Queue pairs: state, PSNs, outstanding work requests.
    Qp,
    /// Memory regions: keys, length (pinned bytes), access.
    Mr,
    /// Completion queues: size, users, queued completions.
    Cq,
    /// Protection domains (device service only: a device in one process has its PDs in
    /// its own listing of MRs and QPs).
    Pd,
    /// RDMA CM ids of the librdmacm programs running on xrnic (state, port space,
    /// addresses, QPN, owner), like `rdma resource show cm_id`.
    #[value(name = "cm_id", alias = "cm-id")]
    CmId,
}

#[derive(Clone, Debug, clap::Args)]
pub struct ResArgs {
    /// qp, mr or cq; without it, one summary line per device.
    #[arg(value_enum)]
    pub object: Option<Object>,
    /// Only the device on this network interface (default: every xrnic device of this
    /// network namespace).
    #[arg(long, value_name = "IF")]
    pub netdev: Option<String>,
    /// Print a JSON array, one object per device.
    #[arg(long)]
    pub json: bool,
    /// Where the snapshots are.
    #[arg(long, value_name = "DIR", default_value = crate::verbs::STAT_DIR)]
    pub dir: PathBuf,
}

/// Where a snapshot comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Written by a device that is still open.
    Running,
    /// The last snapshot of an older xrnic, written when the device closed (a device now
    /// removes its snapshot when it closes).
    Closed,
    /// Says running, but its process is gone (killed before closing the device): no
    /// process has its pid and start time.
    Stale,
}

impl Status {
    pub fn of(s: &Snapshot, writer_alive: bool) -> Status {
        match (s.running, writer_alive) {
            (true, true) => Status::Running,
            (true, false) => Status::Stale,
            (false, _) => Status::Closed,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Closed => "closed",
            Status::Stale => "stale",
        }
    }
}

/// One device's snapshot, read and checked.
#[derive(Debug)]
pub struct DeviceRes {
    pub snap: Snapshot,
    pub res: Resources,
    pub status: Status,
}

/// Who a device is, and where its snapshot comes from. `now`: seconds since the Unix
/// epoch.
fn header(d: &DeviceRes, now: f64) -> (String, String) {
    let age = (now - d.snap.written_at).max(0.0);
    let what = match d.status {
        Status::Running => format!("running, snapshot of {age:.1} s ago"),
        Status::Closed => format!("closed, last snapshot written on close {age:.1} s ago"),
        Status::Stale => format!(
            "stale: pid {} is gone without closing the device, snapshot of {age:.1} s ago",
            d.snap.pid
        ),
    };
    let who = format!("{} netdev {} pid {}", d.res.dev, d.snap.netdev, d.snap.pid);
    (who, what)
}

/// The text `xrnic res` prints. `now`: seconds since the Unix epoch.
pub fn render(devs: &[DeviceRes], object: Option<Object>, now: f64) -> String {
    let mut t = String::new();
    for d in devs {
        let (who, what) = header(d, now);
        match object {
            // Like `rdma resource show`: the object counts of each device.
            None => {
                let _ = writeln!(
                    t,
                    "{who}: qp {} cq {} mr {} ({what})",
                    d.res.qps.len(),
                    d.res.cqs.len(),
                    d.res.mrs.len()
                );
            }
            Some(o) => {
                let _ = writeln!(t, "{who}: {what}");
                t += &match o {
                    Object::Qp => d.res.qp_lines(),
                    Object::Mr => d.res.mr_lines(),
                    Object::Cq => d.res.cq_lines(),
                    Object::Pd | Object::CmId => String::new(),
                };
            }
        }
    }
    t
}

/// The `--json` document: an array with one object per device.
pub fn to_json(devs: &[DeviceRes], object: Option<Object>) -> serde_json::Value {
    let arr = devs
        .iter()
        .map(|d| {
            let mut v = serde_json::json!({
                "dev": d.res.dev,
                "netdev": d.snap.netdev,
                "pid": d.snap.pid,
                "comm": d.res.owner.as_ref().map(|o| o.comm.as_str()),
                "status": d.status.name(),
                "written_at": d.snap.written_at,
            });
            let mut put = |k: &str, x: serde_json::Value| v[k] = x;
            let all = object.is_none();
            if all || object == Some(Object::Qp) {
                put("qp", serde_json::to_value(&d.res.qps).unwrap_or_default());
            }
            if all || object == Some(Object::Mr) {
                put("mr", serde_json::to_value(&d.res.mrs).unwrap_or_default());
            }
            if all || object == Some(Object::Cq) {
                put("cq", serde_json::to_value(&d.res.cqs).unwrap_or_default());
            }
            v
        })
        .collect();
    serde_json::Value::Array(arr)
}

/// The end of [`read_device`]'s message for a snapshot written by an older xrnic (no
/// resource listing): listing every device skips those with a note instead of failing.
const OLD_SNAPSHOT: &str = "this snapshot has no resource listing (written by an older xrnic)";

/// The end of [`read_device`]'s message for a snapshot of an interface this namespace
/// does not have ([`crate::verbs::snapshot_is_here`]): listing every device skips those.
const NOT_HERE: &str = "written for an interface this network namespace does not have (left by a deleted network namespace whose inode was reused, or the interface is gone)";

/// Read one snapshot file; the error is the message to print.
pub fn read_device(path: &Path) -> Result<DeviceRes, String> {
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let snap: Snapshot = serde_json::from_slice(&text)
        .map_err(|e| format!("{}: not a stat snapshot: {e}", path.display()))?;
    if !crate::verbs::snapshot_is_here(&snap) {
        return Err(format!("{}: {NOT_HERE}", path.display()));
    }
    let Some(res) = snap.resources.clone() else {
        return Err(format!("{}: {OLD_SNAPSHOT}", path.display()));
    };
    let alive = snap.writer_alive();
    let status = Status::of(&snap, alive);
    Ok(DeviceRes { snap, res, status })
}

/// `xrnic res`.
/// The cm_ids of every live process of this network namespace that publishes them
/// ([`crate::cm::res`]), as `(pid, comm, id)`, optionally only those on `netdev`. Files of
/// processes that are gone are skipped; an unreadable one is an error.
pub fn cm_ids(
    dir: &Path,
    netdev: Option<&str>,
) -> Result<Vec<(u32, String, crate::cm::res::CmIdRecord)>, String> {
    let files = crate::cm::res::cm_files(dir)
        .map_err(|e| format!("cannot list {}/cm: {e}", dir.display()))?;
    let mut out = Vec::new();
    for (_, path) in files {
        let f = match crate::cm::res::read(&path) {
            Ok(f) => f,
            // Removed between listing and reading: that process is done.
            Err(_) if !path.exists() => continue,
            Err(e) => return Err(e),
        };
        if !f.writer_alive() {
            continue;
        }
        for id in f.ids {
            if netdev.is_none_or(|n| n == id.ifname) {
                out.push((f.pid, f.comm.clone(), id));
            }
        }
    }
    Ok(out)
}

/// `xrnic res cm_id`: one line per id (or a JSON array); no id is an empty listing.
fn run_cm_id(args: &ResArgs) -> ExitCode {
    use std::io::Write;
    let ids = match cm_ids(&args.dir, args.netdev.as_deref()) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("xrnic res: {e}");
            return ExitCode::FAILURE;
        }
    };
    let out = if args.json {
        let v: Vec<serde_json::Value> = ids
            .iter()
            .map(|(pid, comm, id)| {
                let mut o = serde_json::to_value(id).unwrap_or_default();
                if let Some(m) = o.as_object_mut() {
                    m.insert("pid".into(), (*pid).into());
                    m.insert("comm".into(), comm.clone().into());
                }
                o
            })
            .collect();
        serde_json::Value::Array(v).to_string() + "\n"
    } else {
        ids.iter()
            .map(|(pid, comm, id)| id.line(*pid, comm) + "\n")
            .collect()
    };
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    ExitCode::SUCCESS
}

/// The service's name of an object (`xrnic res OBJECT` through the service).
pub fn service_object(o: Object) -> &'static str {
    match o {
        Object::Qp => "qp",
        Object::Mr => "mr",
        Object::Cq => "cq",
        Object::Pd => "pd",
        // Not the service's: each process publishes its own (run_cm_id).
        Object::CmId => "cm_id",
    }
}

pub fn run(args: &ResArgs) -> ExitCode {
    use std::io::Write;
    if args.object == Some(Object::CmId) {
        return run_cm_id(args);
    }
    let mut failed = false;
    let mut devs = Vec::new();
    // The listings of devices a service holds (taken from the service).
    let mut served = Vec::new();
    // A device service on the interface holds the live state of every process using it.
    if let Some(ifname) = &args.netdev {
        if let Some(code) = crate::cli::service::res_run(ifname, args.object, args.json) {
            return code;
        }
    }
    match &args.netdev {
        Some(ifname) => {
            let path = match crate::verbs::stat_file(&args.dir, ifname) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("xrnic res: cannot name this network namespace: {e}");
                    return ExitCode::FAILURE;
                }
            };
            if !path.exists() {
                eprintln!(
                    "xrnic res: no xrnic device on {ifname} in this network namespace (no {}); is an xrnic program running on it?",
                    path.display()
                );
                return ExitCode::FAILURE;
            }
            match read_device(&path) {
                Ok(d) => devs.push(d),
                Err(e) => {
                    eprintln!("xrnic res: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        None => {
            let files = match crate::verbs::stat_files(&args.dir) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!(
                        "xrnic res: cannot list the snapshots in {}: {e}",
                        args.dir.display()
                    );
                    return ExitCode::FAILURE;
                }
            };
            for (netdev, path) in files {
                // A device a service holds: its snapshot lists every client's objects
                // as the service's own (and only root may read it); the service's
                // answer names each object's owner (pid, comm) and shows the caller
                // what it may see (src/service/res.rs).
                if let Ok(Some(doc)) = crate::cli::service::res_of(&netdev) {
                    served.push(doc);
                    continue;
                }
                // Root's only (a service's, src/cli/service.rs `serve`): not this
                // user's to see, as other users' objects in `rdma resource show`.
                if std::fs::File::open(&path)
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
                {
                    continue;
                }
                match read_device(&path) {
                    Ok(d) => devs.push(d),
                    // Removed between listing and reading: that device is gone.
                    Err(_) if !path.exists() => {}
                    // Not a device of this namespace at all.
                    Err(e) if e.ends_with(NOT_HERE) => {}
                    // Another (older) xrnic's file says nothing about the devices asked
                    // for; one such leftover must not make the whole listing fail.
                    Err(e) if e.ends_with(OLD_SNAPSHOT) => {
                        eprintln!("xrnic res: note: skipped {e}");
                    }
                    Err(e) => {
                        eprintln!("xrnic res: {e}");
                        failed = true;
                    }
                }
            }
            if devs.is_empty() && served.is_empty() && !failed {
                eprintln!(
                    "xrnic res: no xrnic device in this network namespace (no snapshot of one in {}); is an xrnic program running?",
                    args.dir.display()
                );
                return ExitCode::FAILURE;
            }
        }
    }
    let o = args.object.map(service_object);
    let out = if args.json {
        let mut v = to_json(&devs, args.object);
        if let Some(arr) = v.as_array_mut() {
            for doc in &served {
                let objs = crate::cli::service::to_json(doc, o);
                let mut dev = serde_json::json!({
                    "dev": format!("xrnic_{}", doc.netdev),
                    "netdev": doc.netdev,
                    "pid": doc.service_pid,
                    "service": true,
                    "status": Status::Running.name(),
                });
                for k in ["qp", "mr", "cq", "pd"] {
                    if o.is_none_or(|o| o == k) {
                        let of: Vec<_> = objs.iter().filter(|e| e["kind"] == k).cloned().collect();
                        dev[k] = serde_json::Value::Array(of);
                    }
                }
                arr.push(dev);
            }
        }
        v.to_string() + "\n"
    } else {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let mut t = render(&devs, args.object, now);
        for doc in &served {
            t += &crate::cli::service::render(doc, o);
        }
        t
    };
    // A closed pipe (`| head`) is not a reason to panic.
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::QpState;
    use crate::proto::resources::{CqResource, MrResource, Owner, QpResource};

    fn device(running: bool, state: QpState) -> DeviceRes {
        let res = Resources {
            dev: "xrnic_eth0".into(),
            qps: vec![QpResource {
                qpn: 17,
                qp_type: "RC".into(),
                srq: None,
                pd: 1,
                state,
                dest_qpn: 18,
                path_mtu: 1024,
                sq_psn: 100,
                una_psn: 98,
                rq_psn: 7,
                sq_wrs: 2,
                sq_started: 1,
                rq_wrs: 3,
                retry_left: 7,
                rnr_left: 7,
                rnr_wait_until_ns: None,
                ack_deadline_ns: None,
                packets_sent: 5,
                retransmitted_packets: 0,
            }],
            mrs: vec![MrResource {
                lkey: 0x100,
                rkey: 0x100,
                pd: 1,
                addr: 0x1000,
                pinned_bytes: 4096,
                access: 0xf,
            }],
            cqs: vec![CqResource {
                cqn: 0,
                cqe: 64,
                users: 2,
                queued: 1,
                overruns: 0,
            }],
            owner: Some(Owner {
                pid: 42,
                comm: "app".into(),
            }),
        };
        let snap = Snapshot {
            netdev: "eth0".into(),
            link: None,
            simulated: true,
            pid: 42,
            start_time: None,
            running,
            written_at: 100.0,
            device: serde_json::json!({}),
            driver: serde_json::json!({}),
            port: serde_json::json!({}),
            qps: vec![],
            resources: Some(res.clone()),
        };
        let status = Status::of(&snap, true);
        DeviceRes { snap, res, status }
    }

    #[test]
    fn qp_mr_cq_lines_name_the_device_state_and_owner() {
        let d = [device(true, QpState::Err)];
        let t = render(&d, Some(Object::Qp), 100.5);
        let mut lines = t.lines();
        assert_eq!(
            lines.next(),
            Some("xrnic_eth0 netdev eth0 pid 42: running, snapshot of 0.5 s ago")
        );
        let qp = lines.next().unwrap();
        assert!(
            qp.starts_with("link xrnic_eth0/1 lqpn 17 rqpn 18 type RC state ERR "),
            "{qp}"
        );
        assert!(
            qp.contains(" sq-psn 100 una-psn 98 rq-psn 7 sq-wrs 2 "),
            "{qp}"
        );
        assert!(qp.ends_with(" pid 42 comm app"), "{qp}");
        assert_eq!(lines.next(), None);
        let t = render(&d, Some(Object::Mr), 100.0);
        assert!(
            t.contains("dev xrnic_eth0 mrlen 4096 lkey 0x100 rkey 0x100 "),
            "{t}"
        );
        let t = render(&d, Some(Object::Cq), 100.0);
        assert!(
            t.contains("dev xrnic_eth0 cqn 0 cqe 64 users 2 queued 1 overruns 0 pid 42"),
            "{t}"
        );
        let t = render(&d, None, 100.0);
        assert_eq!(
            t,
            "xrnic_eth0 netdev eth0 pid 42: qp 1 cq 1 mr 1 (running, snapshot of 0.0 s ago)\n"
        );
    }

    #[test]
    fn closed_and_stale_snapshots_say_so() {
        let d = [device(false, QpState::Rts)];
        let t = render(&d, Some(Object::Qp), 103.0);
        assert!(
            t.starts_with(
                "xrnic_eth0 netdev eth0 pid 42: closed, last snapshot written on close 3.0 s ago\n"
            ),
            "{t}"
        );
        let mut d = device(true, QpState::Rts);
        d.status = Status::of(&d.snap, false);
        let t = render(&[d], Some(Object::Qp), 100.0);
        assert!(t.contains(": stale: pid 42 is gone"), "{t}");
    }

    #[test]
    fn json_has_one_object_per_device_with_the_chosen_list() {
        let d = [device(true, QpState::Rts)];
        let v = to_json(&d, Some(Object::Qp));
        assert_eq!(v[0]["status"], "running");
        assert_eq!(v[0]["comm"], "app");
        assert_eq!(v[0]["qp"][0]["state"], "RTS");
        assert!(v[0].get("mr").is_none());
        let v = to_json(&d, None);
        assert_eq!(v[0]["mr"][0]["pinned_bytes"], 4096);
        assert_eq!(v[0]["cq"][0]["users"], 2);
    }

    #[test]
    fn listing_skips_an_older_xrnics_snapshot_but_fails_on_a_broken_one() {
        let dir = std::env::temp_dir().join(format!("xrnic-res-old-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ino = crate::verbs::stat_file(&dir, "x").unwrap();
        let suffix = ino
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replacen('x', "", 1);
        let d = device(false, QpState::Err);
        std::fs::write(
            dir.join(format!("good{suffix}")),
            serde_json::to_vec(&d.snap).unwrap(),
        )
        .unwrap();
        let mut old = serde_json::to_value(&d.snap).unwrap();
        old.as_object_mut().unwrap().remove("resources");
        std::fs::write(dir.join(format!("old{suffix}")), old.to_string()).unwrap();
        let args = ResArgs {
            object: None,
            netdev: None,
            json: true,
            dir: dir.clone(),
        };
        assert_eq!(run(&args), ExitCode::SUCCESS);
        // A file that is not a snapshot at all is still an error.
        std::fs::write(dir.join(format!("bad{suffix}")), b"{").unwrap();
        assert_eq!(run(&args), ExitCode::FAILURE);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn snapshot_round_trips_resources_and_bad_files_are_clear_errors() {
        let dir = std::env::temp_dir().join(format!("xrnic-res-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = device(false, QpState::Err);
        let ok = dir.join("ok.json");
        std::fs::write(&ok, serde_json::to_vec(&d.snap).unwrap()).unwrap();
        let back = read_device(&ok).unwrap();
        assert_eq!(back.status, Status::Closed);
        assert_eq!(back.res.qps[0].state, QpState::Err);
        assert_eq!(back.res.mrs[0].pinned_bytes, 4096);
        let bad = dir.join("bad.json");
        std::fs::write(&bad, b"{\"netdev\":").unwrap();
        assert!(
            read_device(&bad)
                .unwrap_err()
                .contains("not a stat snapshot")
        );
        let mut old = serde_json::to_value(&d.snap).unwrap();
        old.as_object_mut().unwrap().remove("resources");
        let old_f = dir.join("old.json");
        std::fs::write(&old_f, old.to_string()).unwrap();
        assert!(
            read_device(&old_f)
                .unwrap_err()
                .contains("no resource listing")
        );
        assert!(read_device(&dir.join("none.json")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_snapshot_for_another_interface_of_the_same_name_is_not_this_namespaces() {
        // Every network namespace has `lo`, index 1, MAC 00:00:00:00:00:00.
        let dir = std::env::temp_dir().join(format!("xrnic-res-here-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut d = device(true, QpState::Rts);
        d.snap.netdev = "lo".into();
        d.snap.simulated = false;
        for (name, ifindex, mac, here) in [
            ("same", 1, [0u8; 6], true),
            ("other-mac", 1, [2, 0, 0, 0, 0, 1], false),
            ("other-index", 7, [0; 6], false),
        ] {
            d.snap.link = Some(crate::driver::LinkId::new(ifindex, mac));
            let f = dir.join(format!("{name}.json"));
            std::fs::write(&f, serde_json::to_vec(&d.snap).unwrap()).unwrap();
            let r = read_device(&f);
            assert_eq!(r.is_ok(), here, "{name}: {r:?}");
            if !here {
                assert!(r.unwrap_err().ends_with(NOT_HERE), "{name}");
            }
        }
        // An interface this namespace does not have at all, with an identity or without
        // (an older xrnic's snapshot); a simulated device's has no interface to check.
        d.snap.netdev = "xrnic-gone0".into();
        let f = dir.join("gone.json");
        for link in [Some(crate::driver::LinkId::new(1, [0; 6])), None] {
            d.snap.link = link;
            std::fs::write(&f, serde_json::to_vec(&d.snap).unwrap()).unwrap();
            assert!(read_device(&f).unwrap_err().ends_with(NOT_HERE));
        }
        d.snap.simulated = true;
        std::fs::write(&f, serde_json::to_vec(&d.snap).unwrap()).unwrap();
        assert!(read_device(&f).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
