//! `xrnic up IF`, `xrnic down IF` and the device service's part of `xrnic res`
//! (src/service, docs/rnic.md "One device, many processes").
//!
//! Contract:
//! - `xrnic up IF` starts the service for IF in the caller's network namespace and
//!   returns once it accepts clients (exit 0), or with the service's own message and exit
//!   1 when it could not start (not root, no such interface, a service already there).
//!   Without `--foreground` the service is a new process of this binary in its own
//!   session (`xrnic up IF --foreground`), its stderr in `--log` (default
//!   `/run/xrnic/service.<IF>.log`). `--foreground` serves in this process until `xrnic
//!   down`, SIGINT or SIGTERM. `--max-qps` and its kind set the per-client caps
//!   ([`Limits`]).
//! - `xrnic down IF` asks the service to stop (root or the service's user) and returns
//!   once its socket is gone; exit 1 when no service runs on IF.
//! - `xrnic res` asks the service of each interface it lists first ([`res_of`]).

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rustix::net::RecvFlags;

use crate::io::shm;
use crate::ipc::{self, Req, ResDoc, Resp};
use crate::service::server::{Limits, Service};

#[derive(Clone, Debug, clap::Args)]
pub struct UpArgs {
    /// The network interface the device runs on.
    pub netdev: String,
    /// Serve in this process (for systemd and tests) instead of starting a daemon.
    #[arg(long)]
    pub foreground: bool,
    /// The daemon's log (its stderr).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Write stat snapshots for `xrnic stat` to this directory.
    #[arg(long, value_name = "DIR", default_value = crate::verbs::STAT_DIR)]
    pub stat_dir: PathBuf,
    /// Most PDs one client may hold (past it: ENOMEM).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_pds)]
    pub max_pds: usize,
    /// Most QPs one client may hold.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_qps)]
    pub max_qps: usize,
    /// Most CQs one client may hold.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_cqs)]
    pub max_cqs: usize,
    /// Most completion ring slots (48 bytes of shared memory each) of all one client's CQs.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_cq_slots)]
    pub max_cq_slots: u64,
    /// Most MRs one client may hold.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_mrs)]
    pub max_mrs: usize,
    /// Most bytes of all one client's MRs.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_mr_bytes)]
    pub max_mr_bytes: u64,
    /// Most address handles one client may hold.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_ahs)]
    pub max_ahs: usize,
    /// Most shared receive queues one client may hold.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_srqs)]
    pub max_srqs: usize,
    /// Submission slots taken from one client in each round of the service loop.
    #[arg(long, value_name = "N", default_value_t = Limits::default().slots_per_round)]
    pub slots_per_round: usize,
    /// Control messages answered for one client in each round.
    #[arg(long, value_name = "N", default_value_t = Limits::default().msgs_per_round)]
    pub msgs_per_round: usize,
    /// Most connections the service holds, every user but root together (past it the
    /// connection is answered EMFILE and closed).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_clients)]
    pub max_clients: usize,
    /// Most connections of one user (root: no bound).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_clients_per_uid)]
    pub max_clients_per_uid: usize,
    /// Most descriptors the service holds for one client (past it: EMFILE).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_fds)]
    pub max_fds: usize,
    /// Most descriptors the service holds for all the clients of one user.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_fds_per_uid)]
    pub max_fds_per_uid: usize,
    /// Most bytes of shared-memory rings the service makes for one client (ENOMEM).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_shm_bytes)]
    pub max_shm_bytes: u64,
    /// Most bytes of shared-memory rings of all the clients of one user.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_shm_bytes_per_uid)]
    pub max_shm_bytes_per_uid: u64,
    /// Most PDs, MRs, CQs, QPs, AHs and SRQs of all the clients of one user (ENOMEM).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_objects_per_uid)]
    pub max_objects_per_uid: usize,
    /// The read end of a pipe (a descriptor this process inherited): once every write
    /// end is closed and no client is connected, the service stops. `xrnic exec` starts
    /// its service so (src/cli/exec.rs).
    #[arg(long, value_name = "FD", hide = true)]
    pub lifeline_fd: Option<i32>,
}

impl UpArgs {
    fn limits(&self) -> Limits {
        Limits {
            max_pds: self.max_pds,
            max_qps: self.max_qps,
            max_cqs: self.max_cqs,
            max_cq_slots: self.max_cq_slots,
            max_mrs: self.max_mrs,
            max_mr_bytes: self.max_mr_bytes,
            max_ahs: self.max_ahs,
            max_srqs: self.max_srqs,
            slots_per_round: self.slots_per_round,
            msgs_per_round: self.msgs_per_round,
            max_clients: self.max_clients,
            max_clients_per_uid: self.max_clients_per_uid,
            max_fds: self.max_fds,
            max_fds_per_uid: self.max_fds_per_uid,
            max_shm_bytes: self.max_shm_bytes,
            max_shm_bytes_per_uid: self.max_shm_bytes_per_uid,
            max_objects_per_uid: self.max_objects_per_uid,
        }
    }

    /// The caps as options again, for the daemon's command line.
    fn limit_args(&self) -> Vec<String> {
        [
            ("--max-pds", self.max_pds.to_string()),
            ("--max-qps", self.max_qps.to_string()),
            ("--max-cqs", self.max_cqs.to_string()),
            ("--max-cq-slots", self.max_cq_slots.to_string()),
            ("--max-mrs", self.max_mrs.to_string()),
            ("--max-mr-bytes", self.max_mr_bytes.to_string()),
            ("--max-ahs", self.max_ahs.to_string()),
            ("--max-srqs", self.max_srqs.to_string()),
            ("--slots-per-round", self.slots_per_round.to_string()),
            ("--msgs-per-round", self.msgs_per_round.to_string()),
            ("--max-clients", self.max_clients.to_string()),
            (
                "--max-clients-per-uid",
                self.max_clients_per_uid.to_string(),
            ),
            ("--max-fds", self.max_fds.to_string()),
            ("--max-fds-per-uid", self.max_fds_per_uid.to_string()),
            ("--max-shm-bytes", self.max_shm_bytes.to_string()),
            (
                "--max-shm-bytes-per-uid",
                self.max_shm_bytes_per_uid.to_string(),
            ),
            (
                "--max-objects-per-uid",
                self.max_objects_per_uid.to_string(),
            ),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_string(), v])
        .collect()
    }
}

#[derive(Clone, Debug, clap::Args)]
pub struct DownArgs {
    /// The network interface whose service stops.
    pub netdev: String,
}

/// How long `up` waits for the daemon to accept clients, and `down` for it to go.
const PATIENCE: Duration = Duration::from_secs(20);

/// A connection to the service of `ifname`, `None` when none listens; an error naming
/// the listener when it is neither root's nor this user's (ipc::connect_service).
pub fn connect(ifname: &str) -> std::io::Result<Option<OwnedFd>> {
    ipc::connect_service(ifname)
}

/// Who holds the name `@xrnic/<IF>` of this network namespace: the listener's pid and
/// uid from SO_PEERCRED of a connection (which sends nothing), or, for a socket bound
/// without listening (a connect is refused), the process holding the socket whose
/// inode /proc/net/unix lists under that name (proc(5)). `None`: nobody found.
fn holder(ifname: &str) -> Option<ipc::Listener> {
    if let Ok(Some((_, who))) = ipc::connect_any(ifname) {
        return Some(who);
    }
    let want = format!("@{}", String::from_utf8_lossy(&ipc::socket_name(ifname)));
    let table = std::fs::read_to_string("/proc/net/unix").ok()?;
    // "Num RefCount Protocol Flags Type St Inode Path"
    let inode = table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 8 && f[7] == want).then(|| f[6].to_string())
    })?;
    let link = format!("socket:[{inode}]");
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let holds = fds
            .flatten()
            .any(|f| std::fs::read_link(f.path()).is_ok_and(|l| l.as_os_str() == link.as_str()));
        if holds {
            // The effective uid (status's "Uid:" line: real, effective, saved, fs); the
            // owner of /proc/PID is root's for a process that changed uid (not dumpable).
            let status = std::fs::read_to_string(p.path().join("status")).ok()?;
            let uid = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|u| u.split_whitespace().nth(1))
                .and_then(|u| u.parse().ok())?;
            return Some(ipc::Listener { pid, uid });
        }
    }
    None
}

/// Why `up` cannot serve `ifname`: the name is taken, by a service or by whom.
fn taken(ifname: &str) -> String {
    let name = String::from_utf8_lossy(&ipc::socket_name(ifname)).into_owned();
    match holder(ifname) {
        Some(w) if ipc::trusted(w.uid, rustix::process::geteuid().as_raw()) => format!(
            "a device service already serves it (@{name}: pid {}, uid {})",
            w.pid, w.uid
        ),
        Some(w) => format!(
            "@{name} is taken by pid {} (uid {}), which is not a device service of root \
             or of this user: stop that process (its clients would talk to it)",
            w.pid, w.uid
        ),
        None => format!("@{name} is taken (by a process not found in /proc)"),
    }
}

/// One request on a fresh connection (no hello: `res` and `down` create nothing).
fn ask(ifname: &str, req: &Req) -> Result<Option<Resp>, String> {
    let Some(sock) = connect(ifname).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    ask_on(&sock, req).map(Some)
}

/// One request on `sock` and its answer.
fn ask_on(sock: &OwnedFd, req: &Req) -> Result<Resp, String> {
    let text = serde_json::to_vec(req).map_err(|e| e.to_string())?;
    use std::os::fd::AsFd;
    let mut buf = vec![0u8; ipc::MAX_MSG];
    if let Err(e) = shm::send_with_fds(sock.as_fd(), &text, &[]) {
        // A connection the service refused (its bounds, src/service/limits.rs) was told
        // why before it was closed.
        return match shm::recv_with_fds(sock.as_fd(), &mut buf, RecvFlags::DONTWAIT) {
            Ok(Some((n, _))) => {
                serde_json::from_slice(&buf[..n]).map_err(|e| format!("the service's answer: {e}"))
            }
            _ => Err(e.to_string()),
        };
    }
    match shm::recv_with_fds(sock.as_fd(), &mut buf, RecvFlags::empty()) {
        Ok(Some((n, _))) => {
            serde_json::from_slice(&buf[..n]).map_err(|e| format!("the service's answer: {e}"))
        }
        Ok(None) => Err("the service closed the connection".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The resources of the service of `ifname` the caller may see (all to root or
/// CAP_NET_ADMIN, its own uid's otherwise: src/service/res.rs), asked page by page on
/// one connection so that any number of them is listed; `None` when no service runs
/// there.
pub fn res_of(ifname: &str) -> Result<Option<ResDoc>, String> {
    let Some(sock) = connect(ifname).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let mut doc = ResDoc::default();
    let mut skip = 0;
    loop {
        match ask_on(&sock, &Req::ResPage { skip })? {
            Resp::ResPage { doc: page, next } => {
                doc.merge(page);
                match next {
                    // A service that does not move on would loop here for ever.
                    Some(n) if n > skip => skip = n,
                    Some(_) => return Err("the service's pages do not advance".into()),
                    None => return Ok(Some(doc)),
                }
            }
            Resp::Err { msg, .. } => return Err(msg),
            _ => return Err("unexpected answer".into()),
        }
    }
}

/// `xrnic up`.
pub fn up(args: &UpArgs) -> ExitCode {
    if args.foreground {
        return match serve(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("xrnic up: {}: {e}", args.netdev);
                ExitCode::from(1)
            }
        };
    }
    match ipc::connect_any(&args.netdev) {
        Ok(Some(_)) => {
            eprintln!("xrnic up: {}: {}", args.netdev, taken(&args.netdev));
            return ExitCode::from(1);
        }
        Ok(None) => {}
        Err(e) => {
            eprintln!("xrnic up: {}: {e}", args.netdev);
            return ExitCode::from(1);
        }
    }
    let log = args.log.clone().unwrap_or_else(|| {
        PathBuf::from(crate::verbs::STAT_DIR).join(format!("service.{}.log", args.netdev))
    });
    if let Some(d) = log.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    let file = match std::fs::File::create(&log) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("xrnic up: {}: {e}", log.display());
            return ExitCode::from(1);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("xrnic up: cannot find this binary: {e}");
            return ExitCode::from(1);
        }
    };
    use std::os::unix::process::CommandExt;
    let mut child = match std::process::Command::new(exe)
        .args(["up", &args.netdev, "--foreground", "--stat-dir"])
        .arg(&args.stat_dir)
        .args(args.limit_args())
        .args(
            args.lifeline_fd
                .iter()
                .flat_map(|fd| ["--lifeline-fd".to_string(), fd.to_string()]),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(file)
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("xrnic up: cannot start the service: {e}");
            return ExitCode::from(1);
        }
    };
    let end = Instant::now() + PATIENCE;
    while Instant::now() < end {
        if let Ok(Some(st)) = child.try_wait() {
            let msg = std::fs::read_to_string(&log).unwrap_or_default();
            eprintln!(
                "xrnic up: the service exited ({st}) before serving: {}",
                msg.trim_end()
            );
            return ExitCode::from(1);
        }
        if let Ok(Some(_)) = connect(&args.netdev) {
            println!(
                "xrnic up: xrnic_{} served by pid {} (log {})",
                args.netdev,
                child.id(),
                log.display()
            );
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("xrnic up: the service did not start serving within {PATIENCE:?}");
    ExitCode::from(1)
}

fn serve(args: &UpArgs) -> Result<(), String> {
    let opts = crate::verbs::DeviceOptions {
        stat_dir: Some(args.stat_dir.clone()),
        ..Default::default()
    };
    if let Ok(Some(_)) = ipc::connect_any(&args.netdev) {
        return Err(taken(&args.netdev));
    }
    let _ = std::fs::create_dir_all(&args.stat_dir);
    // The device's stat snapshots list every client's objects, keys and addresses:
    // readable by root only (0600). Others ask the service, which shows each asker what
    // it may see (src/service/res.rs).
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let dev =
        crate::verbs::Device::open_in_process(&args.netdev, &opts).map_err(|e| e.to_string())?;
    let svc =
        Service::with_limits(dev, &args.netdev, args.limits()).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => taken(&args.netdev),
            _ => e.to_string(),
        })?;
    let stop = svc.stop_flag();
    let _ = ctrlc::set_handler(move || stop.store(true, std::sync::atomic::Ordering::SeqCst));
    eprintln!(
        "xrnic: serving xrnic_{} on @{} (pid {})",
        args.netdev,
        String::from_utf8_lossy(&ipc::socket_name(&args.netdev)),
        std::process::id()
    );
    match lifeline(args.lifeline_fd)? {
        Some(mut l) => svc.run_while(|clients| clients > 0 || l.alive()),
        None => svc.run(),
    }
    .map_err(|e| e.to_string())?;
    eprintln!("xrnic: service of xrnic_{} stopped", args.netdev);
    Ok(())
}

/// The read end of the pipe of `--lifeline-fd`: alive while a write end is open.
struct Lifeline {
    fd: OwnedFd,
    closed: bool,
}

impl Lifeline {
    /// Whether a write end is still open (a poll that does not wait; once it is seen
    /// closed it stays so).
    fn alive(&mut self) -> bool {
        if !self.closed {
            let mut fds = [rustix::event::PollFd::new(
                &self.fd,
                rustix::event::PollFlags::IN,
            )];
            let ts = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // Nothing is ever written: readable or hung up means every writer is gone.
            if rustix::event::poll(&mut fds, Some(&ts)).is_ok_and(|n| n > 0) {
                self.closed = true;
            }
        }
        !self.closed
    }
}

/// The lifeline of `--lifeline-fd FD`: the descriptor must be open and a pipe's read end.
fn lifeline(fd: Option<i32>) -> Result<Option<Lifeline>, String> {
    let Some(fd) = fd else {
        return Ok(None);
    };
    // Open, and a pipe (the link of /proc/self/fd/FD leads to the pipe itself).
    let is_pipe = std::fs::metadata(format!("/proc/self/fd/{fd}"))
        .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()));
    if !is_pipe {
        return Err(format!("--lifeline-fd {fd}: not an open pipe"));
    }
    // SAFETY: `fd` is open (checked above) and was handed to this process for this use
    // alone by the one that started it (src/cli/exec.rs); nothing else here owns it.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // Not passed on to anything this process starts.
    let _ = rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC);
    Ok(Some(Lifeline { fd, closed: false }))
}

/// `xrnic down`.
pub fn down(args: &DownArgs) -> ExitCode {
    match ask(&args.netdev, &Req::Shutdown) {
        Ok(None) => {
            eprintln!("xrnic down: no device service serves {}", args.netdev);
            return ExitCode::from(1);
        }
        Ok(Some(Resp::Ok)) => {}
        Ok(Some(Resp::Err { msg, .. })) => {
            eprintln!("xrnic down: {}: {msg}", args.netdev);
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("xrnic down: {}: {e}", args.netdev);
            return ExitCode::from(1);
        }
        Ok(Some(_)) => {
            eprintln!(
                "xrnic down: {}: unexpected answer from the service",
                args.netdev
            );
            return ExitCode::from(1);
        }
    }
    let end = Instant::now() + PATIENCE;
    while Instant::now() < end {
        if let Ok(None) = connect(&args.netdev) {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "xrnic down: the service of {} is still there after {PATIENCE:?}",
        args.netdev
    );
    ExitCode::from(1)
}

/// The text `xrnic res [qp|mr|cq|pd]` prints for a service: one line per resource, each
/// with the owner's pid and comm.
pub fn render(d: &ResDoc, object: Option<&str>) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let dev = format!("xrnic_{}", d.netdev);
    match object {
        None => {
            let n = |f: fn(&ipc::ClientRes) -> usize| d.clients.iter().map(f).sum::<usize>();
            let _ = writeln!(
                t,
                "{dev} netdev {} service pid {}: clients {} pd {} qp {} cq {} mr {} ah {} srq {}",
                d.netdev,
                d.service_pid,
                d.clients.len(),
                n(|c| c.pds.len()),
                n(|c| c.qps.len()),
                n(|c| c.cqs.len()),
                n(|c| c.mrs.len()),
                n(|c| c.ahs.len()),
                n(|c| c.srqs.len()),
            );
        }
        Some(o) => {
            for c in &d.clients {
                let who = format!("pid {} comm {}", c.pid, c.comm);
                match o {
                    "qp" => c.qps.iter().for_each(|q| {
                        let _ = writeln!(
                            t,
                            "{dev} lqpn {} rqpn {} type {} state {} pdn {} {who}",
                            q.lqpn,
                            q.rqpn,
                            qp_type(q),
                            q.state,
                            q.pd
                        );
                    }),
                    "mr" => c.mrs.iter().for_each(|m| {
                        let _ = writeln!(
                            t,
                            "{dev} lkey 0x{:x} rkey 0x{:x} iova 0x{:x} length {} pdn {} {who}",
                            m.lkey, m.rkey, m.addr, m.length, m.pd
                        );
                    }),
                    "cq" => c.cqs.iter().for_each(|q| {
                        let _ = writeln!(t, "{dev} cqn {} cqe {} {who}", q.cq, q.cqe);
                    }),
                    _ => c.pds.iter().for_each(|p| {
                        let _ = writeln!(t, "{dev} pdn {p} {who}");
                    }),
                }
            }
        }
    }
    t
}

/// A QP's type as `xrnic res` prints it (an older service sends none: RC).
fn qp_type(q: &ipc::QpRes) -> &str {
    if q.qp_type.is_empty() {
        "RC"
    } else {
        &q.qp_type
    }
}

/// `--json`: one object per resource with `pid`, `comm` and its key fields.
pub fn to_json(d: &ResDoc, object: Option<&str>) -> Vec<serde_json::Value> {
    use serde_json::json;
    let mut v = Vec::new();
    let dev = format!("xrnic_{}", d.netdev);
    for c in &d.clients {
        let base = |kind: &str| json!({"dev": dev, "kind": kind, "pid": c.pid, "uid": c.uid, "comm": c.comm});
        let want = |k: &str| object.is_none_or(|o| o == k);
        let merge = |mut b: serde_json::Value, x: serde_json::Value| {
            if let (Some(b), Some(x)) = (b.as_object_mut(), x.as_object()) {
                b.extend(x.clone());
            }
            b
        };
        if want("qp") {
            for q in &c.qps {
                v.push(merge(
                    base("qp"),
                    json!({"lqpn": q.lqpn, "rqpn": q.rqpn, "state": q.state, "pdn": q.pd, "type": qp_type(q)}),
                ));
            }
        }
        // No `xrnic res` object names these: listed with everything only.
        if object.is_none() {
            for a in &c.ahs {
                v.push(merge(
                    base("ah"),
                    json!({"ah": a.ah, "pdn": a.pd, "dgid": a.dgid}),
                ));
            }
            for q in &c.srqs {
                v.push(merge(
                    base("srq"),
                    json!({"srqn": q.srq, "pdn": q.pd, "max_wr": q.max_wr, "srq_limit": q.srq_limit}),
                ));
            }
        }
        if want("mr") {
            for m in &c.mrs {
                v.push(merge(base("mr"), json!({"lkey": m.lkey, "rkey": m.rkey, "iova": m.addr, "length": m.length, "pdn": m.pd})));
            }
        }
        if want("cq") {
            for q in &c.cqs {
                v.push(merge(base("cq"), json!({"cqn": q.cq, "cqe": q.cqe})));
            }
        }
        if want("pd") {
            for p in &c.pds {
                v.push(merge(base("pd"), json!({"pdn": p})));
            }
        }
    }
    v
}

/// `xrnic res --netdev IF` when a service serves IF: `None` when none does (the caller
/// reads snapshots then).
pub fn res_run(
    ifname: &str,
    object: Option<crate::cli::res::Object>,
    json: bool,
) -> Option<ExitCode> {
    let doc = match res_of(ifname) {
        Ok(Some(d)) => d,
        Ok(None) => return None,
        Err(e) => {
            eprintln!("xrnic res: the device service of {ifname}: {e}");
            return Some(ExitCode::FAILURE);
        }
    };
    let o = object.map(crate::cli::res::service_object);
    if json {
        let v = serde_json::Value::Array(to_json(&doc, o));
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        print!("{}", render(&doc, o));
    }
    Some(ExitCode::SUCCESS)
}

/// `xrnic devinfo --netdev IF`'s last line: whether programs opening `xrnic_IF` get the
/// device service's device or one of their own.
pub fn devinfo_line(ifname: &str) -> String {
    match res_of(ifname) {
        Ok(Some(d)) => format!(
            "\t\t\tservice:\t\tpid {} (xrnic up {ifname}), {} client(s)\n",
            d.service_pid,
            d.clients.len()
        ),
        Ok(None) => {
            "\t\t\tservice:\t\tnone (each program opens the device in its own process, as root)\n"
                .into()
        }
        Err(e) => format!("\t\t\tservice:\t\tunreadable ({e})\n"),
    }
}
