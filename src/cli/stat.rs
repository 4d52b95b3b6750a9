//! `xrnic stat`: device and per-QP counters of an xrnic device running in another process.
//!
//! Contract: the device's driver thread writes a JSON snapshot
//! ([`crate::driver::Snapshot`]) to `<dir>/<netdev>.<netns inode>.json`
//! ([`crate::verbs::stat_file`]: run `xrnic stat` in the device's namespace) every stat
//! interval (500 ms) and removes it when the device closes (the CLI's SIGINT/SIGTERM
//! handler too: [`crate::driver::remove_live_snapshots`]); the file is replaced
//! atomically (write + rename), so a reader never sees half of one. `xrnic stat` reads it
//! and prints it in the spirit of `rdma statistic show` (one `name value` list per
//! object), or the raw JSON with `--json`. The default directory is
//! [`crate::verbs::STAT_DIR`] (`/run/xrnic`). No snapshot, or an unreadable one, is a
//! clear message and exit 1. A snapshot whose writer is gone (no process with its pid
//! and start time, [`crate::driver::Snapshot::writer_alive`]: a killed program) is
//! reported as stale; one of an older xrnic that wrote `running: false` on close, as
//! closed.
//!
//! With the device service up on the interface (`xrnic up IF`: the snapshot is the
//! service's), the counters are also shown per client ([`per_client`]): a `client` line
//! for each connected process (pid, comm, uid, its QPs, the sum of their counters), and
//! each `qp` line names its owner; with `--json`, a `clients` array of the same. The
//! `device:` line stays the device's totals (every QP the device ever had, every client).
//!
//! `--device NAME` (an RDMA device, the offload backend) prints the kernel's counters of
//! its port 1 instead ([`crate::verbs::hw_counters`]: sysfs `hw_counters/` and
//! `counters/`, what `rdma statistic show` reads) in the same layout: a `link` line and
//! one `port:` line of `name value` pairs (with `--json`, one object). Per-QP counters
//! and the driver's exist only on the software backend; a device without counters in
//! sysfs is a clear message and exit 1.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::driver::Snapshot;
use crate::ipc::ResDoc;

#[derive(Clone, Debug, clap::Args)]
pub struct StatArgs {
    /// The network interface the software device runs on.
    #[arg(long, value_name = "IF", required_unless_present = "device")]
    pub netdev: Option<String>,
    /// An RDMA device (offload backend): print the kernel's counters of its port 1.
    #[arg(short = 'd', long, value_name = "NAME", conflicts_with = "netdev")]
    pub device: Option<String>,
    /// Print the snapshot as JSON.
    #[arg(long)]
    pub json: bool,
    /// Where the snapshots are.
    #[arg(long, value_name = "DIR", default_value = crate::verbs::STAT_DIR)]
    pub dir: PathBuf,
}

fn fields(v: &serde_json::Value) -> String {
    let mut s = String::new();
    if let Some(o) = v.as_object() {
        for (k, x) in o {
            if x.is_object() {
                continue;
            }
            let _ = write!(s, " {k} {x}");
        }
    }
    s
}

/// One client of the device service in `xrnic stat`: its QPs (those the snapshot holds)
/// and the sum of their counters.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ClientStat {
    pub pid: i32,
    pub comm: String,
    pub uid: u32,
    pub qps: Vec<u32>,
    pub counters: serde_json::Map<String, serde_json::Value>,
}

/// The service's clients with their QPs' counters summed (numbers only; a QP the
/// snapshot, written every 500 ms, does not hold yet counts nothing).
pub fn per_client(s: &Snapshot, d: &ResDoc) -> Vec<ClientStat> {
    d.clients
        .iter()
        .map(|c| {
            let mine: Vec<u32> = c.qps.iter().map(|q| q.lqpn).collect();
            let mut counters = serde_json::Map::new();
            let mut qps = Vec::new();
            for q in s.qps.iter().filter(|q| mine.contains(&q.qpn)) {
                qps.push(q.qpn);
                for (k, v) in q.counters.as_object().into_iter().flatten() {
                    if let Some(n) = v.as_u64() {
                        let e = counters.entry(k.clone()).or_insert(serde_json::json!(0u64));
                        *e = serde_json::json!(e.as_u64().unwrap_or(0) + n);
                    }
                }
            }
            ClientStat {
                pid: c.pid,
                comm: c.comm.clone(),
                uid: c.uid,
                qps,
                counters,
            }
        })
        .collect()
}

/// [`render`] of the service's snapshot: the client lines after the device's, each QP
/// line with its owner.
pub fn render_service(s: &Snapshot, alive: bool, clients: &[ClientStat]) -> String {
    let mut t = String::new();
    let owner = |qpn: u32| {
        clients
            .iter()
            .find(|c| c.qps.contains(&qpn))
            .map(|c| format!(" pid {} comm {}", c.pid, c.comm))
            .unwrap_or_default()
    };
    for line in render(s, alive).lines() {
        t.push_str(line);
        if let Some(rest) = line.strip_prefix("qp ") {
            if let Some(qpn) = rest.split(' ').next().and_then(|n| n.parse().ok()) {
                t.push_str(&owner(qpn));
            }
        }
        t.push('\n');
        if line.starts_with("  port:") {
            let _ = writeln!(t, "  service: pid {} clients {}", s.pid, clients.len());
            for c in clients {
                let qps: Vec<String> = c.qps.iter().map(u32::to_string).collect();
                let _ = writeln!(
                    t,
                    "client pid {} comm {} uid {} qps [{}]\n {}",
                    c.pid,
                    c.comm,
                    c.uid,
                    qps.join(","),
                    fields(&serde_json::Value::Object(c.counters.clone()))
                );
            }
        }
    }
    t
}

/// The text `xrnic stat` prints for a snapshot. `alive`: whether the writer still runs.
pub fn render(s: &Snapshot, alive: bool) -> String {
    let mut t = String::new();
    let status = match (s.running, alive) {
        (true, true) => "running".to_string(),
        (true, false) => "stale: the process is gone without closing the device".to_string(),
        (false, _) => "closed".to_string(),
    };
    let _ = writeln!(
        t,
        "link xrnic_{}/1 netdev {} pid {} ({status})",
        s.netdev, s.netdev, s.pid
    );
    let _ = writeln!(t, "  device:{}", fields(&s.device));
    if let Some(qp) = s.device.get("qp") {
        let _ = writeln!(t, "  all qps:{}", fields(qp));
    }
    let _ = writeln!(t, "  driver:{}", fields(&s.driver));
    let _ = writeln!(t, "  port:{}", fields(&s.port));
    for q in &s.qps {
        let _ = writeln!(
            t,
            "qp {} state {} dest_qpn {}\n {}",
            q.qpn,
            q.state,
            q.dest_qpn,
            fields(&q.counters)
        );
        if let Some(r) = &q.rate {
            let alpha = r.alpha.map_or("-".to_string(), |a| format!("{a:.4}"));
            let _ = writeln!(
                t,
                "  dcqcn: rate_mbps {:.3} target_mbps {:.3} alpha {alpha} rp_cnp_handled {} \
                 rp_cnp_ignored {}",
                r.rate_bps as f64 / 1e6,
                r.target_bps as f64 / 1e6,
                r.rp_cnp_handled,
                r.rp_cnp_ignored
            );
        }
    }
    t
}

/// The text `xrnic stat --device NAME` prints for an RDMA device's counters.
pub fn render_hw(device: &str, netdev: Option<&str>, counters: &[(String, u64)]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "link {device}/1 netdev {} (kernel counters)",
        netdev.unwrap_or("-")
    );
    let _ = write!(t, "  port:");
    for (k, v) in counters {
        let _ = write!(t, " {k} {v}");
    }
    t.push('\n');
    t
}

fn run_hw(args: &StatArgs, device: &str) -> ExitCode {
    use std::io::Write;
    let counters = match crate::verbs::hw_counters(device) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("xrnic stat: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ndev = std::fs::read_to_string(format!(
        "/sys/class/infiniband/{device}/ports/1/gid_attrs/ndevs/0"
    ))
    .ok()
    .map(|s| s.trim().to_string());
    let out = if args.json {
        let map: serde_json::Map<String, serde_json::Value> = counters
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::json!(v)))
            .collect();
        serde_json::json!({"device": device, "netdev": ndev, "port": map}).to_string() + "\n"
    } else {
        render_hw(device, ndev.as_deref(), &counters)
    };
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    ExitCode::SUCCESS
}

/// `xrnic stat`.
pub fn run(args: &StatArgs) -> ExitCode {
    use std::io::Write;
    let netdev = match (&args.netdev, &args.device) {
        (Some(n), _) => n.as_str(),
        (None, Some(d)) => return run_hw(args, d),
        (None, None) => {
            eprintln!("xrnic stat: give --netdev IF or --device NAME");
            return ExitCode::FAILURE;
        }
    };
    let path = match crate::verbs::stat_file(&args.dir, netdev) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("xrnic stat: cannot name this network namespace: {e}");
            return ExitCode::FAILURE;
        }
    };
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!(
                "xrnic stat: no counters for {} ({}: {e}); is an xrnic program running on it?",
                netdev,
                path.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let snap: Snapshot = match serde_json::from_slice(&text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("xrnic stat: {}: not a stat snapshot: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    if !crate::verbs::snapshot_is_here(&snap) {
        eprintln!(
            "xrnic stat: no counters for {netdev}: {} was written for another interface of that name (left by a deleted network namespace whose inode was reused, or the interface is gone); is an xrnic program running on it?",
            path.display()
        );
        return ExitCode::FAILURE;
    }
    let alive = snap.writer_alive();
    // The service's own snapshot: its clients too.
    let clients = match crate::cli::service::res_of(netdev) {
        Ok(Some(d)) if d.service_pid == snap.pid => Some(per_client(&snap, &d)),
        _ => None,
    };
    let out = match (args.json, &clients) {
        (true, None) => String::from_utf8_lossy(&text).into_owned() + "\n",
        (true, Some(c)) => {
            let mut v: serde_json::Value = serde_json::from_slice(&text).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("clients".into(), serde_json::json!(c));
            }
            v.to_string() + "\n"
        }
        (false, None) => render(&snap, alive),
        (false, Some(c)) => render_service(&snap, alive, c),
    };
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::QpSnapshot;

    #[test]
    fn render_lists_device_driver_and_qps() {
        let s = Snapshot {
            link: None,
            simulated: true,
            netdev: "eth0".into(),
            pid: 42,
            start_time: None,
            running: true,
            written_at: 0.0,
            device: serde_json::json!({"malformed_frames_dropped": 3, "qp": {"packets_sent": 9}}),
            driver: serde_json::json!({"iterations": 5}),
            port: serde_json::json!({"rx_frames": 7}),
            qps: vec![QpSnapshot {
                qpn: 17,
                state: "RTS".into(),
                dest_qpn: 18,
                counters: serde_json::json!({"packets_sent": 9}),
                rate: None,
            }],
            resources: None,
        };
        let t = render(&s, true);
        assert!(
            t.starts_with("link xrnic_eth0/1 netdev eth0 pid 42 (running)\n"),
            "{t}"
        );
        assert!(t.contains("  device: malformed_frames_dropped 3\n"), "{t}");
        assert!(t.contains("  all qps: packets_sent 9\n"), "{t}");
        assert!(
            t.contains("qp 17 state RTS dest_qpn 18\n  packets_sent 9\n"),
            "{t}"
        );
        assert!(render(&s, false).contains("(stale"));
    }

    #[test]
    fn service_clients_get_their_qps_counters_summed() {
        use crate::ipc::{ClientRes, QpRes};
        let qp = |qpn, sent, rx| QpSnapshot {
            qpn,
            state: "RTS".into(),
            dest_qpn: 1,
            counters: serde_json::json!({"packets_sent": sent, "packets_received": rx}),
            rate: None,
        };
        let s = Snapshot {
            link: None,
            simulated: false,
            netdev: "eth0".into(),
            pid: 7,
            start_time: None,
            running: true,
            written_at: 0.0,
            device: serde_json::json!({"qp": {"packets_sent": 16}}),
            driver: serde_json::json!({}),
            port: serde_json::json!({"rx_frames": 1}),
            qps: vec![qp(17, 1, 2), qp(18, 4, 8), qp(19, 10, 20)],
            resources: None,
        };
        let client = |pid, comm: &str, qpns: &[u32]| ClientRes {
            pid,
            uid: 65534,
            comm: comm.into(),
            qps: qpns
                .iter()
                .map(|&lqpn| QpRes {
                    lqpn,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        // Client 100's QP 40 is not in the snapshot yet: it counts nothing.
        let d = ResDoc {
            service_pid: 7,
            netdev: "eth0".into(),
            clients: vec![
                client(100, "ib_send_bw", &[17, 19, 40]),
                client(200, "ibv_rc_pingpong", &[18]),
            ],
            ..Default::default()
        };
        let c = per_client(&s, &d);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].pid, c[0].qps.as_slice()), (100, &[17, 19][..]));
        assert_eq!(c[0].counters["packets_sent"], 11);
        assert_eq!(c[0].counters["packets_received"], 22);
        assert_eq!((c[1].pid, c[1].qps.as_slice()), (200, &[18][..]));
        assert_eq!(c[1].counters["packets_sent"], 4);
        let t = render_service(&s, true, &c);
        assert!(t.contains("  service: pid 7 clients 2\n"), "{t}");
        assert!(
            t.contains("client pid 100 comm ib_send_bw uid 65534 qps [17,19]\n  packets_received 22 packets_sent 11\n"),
            "{t}"
        );
        assert!(
            t.contains("qp 18 state RTS dest_qpn 1 pid 200 comm ibv_rc_pingpong\n"),
            "{t}"
        );
        assert!(
            t.contains("  device: qp") || t.contains("  all qps: packets_sent 16"),
            "{t}"
        );
    }

    #[test]
    fn hw_counters_render_like_a_port_line() {
        let c = vec![("rcvd_pkts".to_string(), 12), ("sent_pkts".to_string(), 10)];
        assert_eq!(
            render_hw("rxe0", Some("eth0"), &c),
            "link rxe0/1 netdev eth0 (kernel counters)\n  port: rcvd_pkts 12 sent_pkts 10\n"
        );
    }
}
