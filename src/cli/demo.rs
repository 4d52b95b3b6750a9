//! `xrnic demo`: two software RNICs talking RoCE v2 over a veth pair, every byte checked,
//! the traffic captured and its ICRCs verified with our own decoder.
//!
//! Contract:
//! - Needs root and `ip` (iproute2), `ss` and `dumpcap` (Debian: tshark); says which is
//!   missing and exits 1 before creating anything.
//! - Builds an observed veth pair ([`VethPair::observed`], MTU 9000, 192.0.2.0/24 and
//!   fd00::/64): namespaces A and B, with a bridge in a third namespace where `dumpcap`
//!   captures both directions (a capture on an AF_XDP end sees nothing: the
//!   `xrnic_netns` crate's doc, src/netns/lib.rs, says why).
//! - Steps, one report line each: `rc-pingpong --verify` as two child processes of this
//!   binary (`ip netns exec NS xrnic rc-pingpong ...`, what a user would type) for several
//!   sizes with IPv4 and IPv6 GIDs; `xrnic perf write|read|send|atomic --verify` the same
//!   way (the side holding the data checks every byte, or every atomic counter); then a
//!   verbs step in this process (one device per
//!   namespace on its own thread) that runs SEND, RDMA WRITE, RDMA READ, FETCH_ADD and
//!   CMP_SWAP, checking every byte.
//! - The capture starts and ends with a marker datagram (A to B's discard port) that must
//!   reach the file, so no step's frames are lost to dumpcap's start-up or its last ring
//!   block.
//! - The capture (default `target/demo-wire.pcapng`, `--pcap`) is decoded with
//!   [`crate::cli::decode`]: it must hold RoCE packets, all parsed, all with valid ICRCs.
//! - Beside it, each device's own capture ([`crate::driver::tap`], with the comments saying
//!   why a frame was sent or dropped): `<FILE>.rnic-a.pcapng` (side A, the clients) and
//!   `.rnic-b.pcapng` (side B, the servers), `.pcapng` of FILE replaced. Each step writes
//!   its own pair of files (`--pcap` of the tools, `DeviceOptions::pcap` in the verbs step)
//!   into `<FILE>.rnic-steps/`; at the end they are merged, one pcapng interface per step,
//!   checked like the wire capture, and the directory is removed (an interrupted demo
//!   leaves it, with the steps so far).
//! - The last line is `demo: all data verified (N bytes over M RDMA operations)` and the
//!   exit status 0, or an error on stderr and exit status 1.
//! - The namespaces are removed on success, on failure, and on SIGINT/SIGTERM/SIGHUP: a
//!   handler (the `ctrlc` crate, which runs it on its own thread, so it may take locks,
//!   kill the children and run `ip netns del`) waits for any namespace creation in
//!   progress, stops the child processes, deletes the namespaces and exits with 130.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::verbs::{
    Access, ConnectOpts, Cq, Device, Mr, Mtu, QpInitAttr, RecvWr, Remote, SendWr, WcStatus,
    WrOpcode,
};
use xrnic_netns::{Side, VethPair};

/// `xrnic demo` options.
#[derive(Clone, Debug, clap::Args)]
pub struct DemoArgs {
    /// Where the capture of the traffic is written.
    #[arg(long, value_name = "FILE", default_value = "target/demo-wire.pcapng")]
    pub pcap: PathBuf,
    /// rc-pingpong exchanges per step (the 64 KiB steps run a tenth of it).
    #[arg(short = 'n', long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(10..=100_000))]
    pub iters: u32,
}

/// What the signal handler must undo: the namespaces (names known before they are
/// created) and the child processes still running.
#[derive(Default)]
struct Cleanup {
    netns: Vec<String>,
    children: Vec<u32>,
}

static CLEANUP: Mutex<Cleanup> = Mutex::new(Cleanup {
    netns: Vec::new(),
    children: Vec::new(),
});

fn cleanup_lock() -> std::sync::MutexGuard<'static, Cleanup> {
    CLEANUP.lock().unwrap_or_else(|p| p.into_inner())
}

/// The TCP port the rc-pingpong steps use (in the demo's own namespaces: no collision).
const PORT: u16 = 18515;
/// GID indices of an xrnic device (docs/rnic.md): 0 link-local, 1 the IPv4 address, 2 the
/// first IPv6 address (fd00::x here).
const GID_IPV4: u8 = 1;
const GID_IPV6: u8 = 2;

/// The devices' own captures, one pair per step, merged at the end.
struct RnicCaps {
    dir: PathBuf,
    steps: Vec<(String, [PathBuf; 2])>,
}

impl RnicCaps {
    /// The per-step files go to `<wire>.rnic-steps/` (emptied first).
    fn new(wire: &Path) -> Result<Self, String> {
        let mut d = wire.as_os_str().to_owned();
        d.push(".rnic-steps");
        let dir = PathBuf::from(d);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(RnicCaps {
            dir,
            steps: Vec::new(),
        })
    }

    /// The files of the next step: `[A, B]`.
    fn next(&mut self, what: &str) -> [PathBuf; 2] {
        let n = self.steps.len() + 1;
        let files = ["a", "b"].map(|s| self.dir.join(format!("{n:02}-{s}.pcapng")));
        self.steps
            .push((format!("step {n}: {what}"), files.clone()));
        files
    }

    /// Merge each side's step files into `<wire stem>.rnic-a.pcapng` / `.rnic-b.pcapng`,
    /// decode them like the wire capture, remove the step files; one report line each.
    fn finish(self, wire: &Path) -> Result<(), String> {
        for (i, side) in ["a", "b"].into_iter().enumerate() {
            let out = rnic_capture(wire, side);
            let parts: Vec<(String, PathBuf)> = self
                .steps
                .iter()
                .map(|(what, f)| (what.clone(), f[i].clone()))
                .collect();
            let n = crate::io::pcap_out::merge(&out, &parts)?;
            let frames = crate::io::capture::read_file(&out)
                .map_err(|e| format!("{}: {e}", out.display()))?;
            let sum = crate::cli::decode::decode_frames(
                &frames,
                crate::cli::decode::Format::Text,
                &mut std::io::sink(),
            )
            .map_err(|e| e.to_string())?;
            if sum.roce == 0 || !sum.all_good() {
                return Err(format!(
                    "{}: {} RoCE packets, {} with a bad ICRC, {} malformed",
                    out.display(),
                    sum.roce,
                    sum.bad_icrc,
                    sum.malformed
                ));
            }
            let comments = crate::io::pcap_out::packet_comments(
                &std::fs::read(&out).map_err(|e| format!("{}: {e}", out.display()))?,
            );
            println!(
                "demo: device {} capture {}: {n} packets sent and received over {} steps, \
                 all ICRCs valid, {} with a comment (xrnic explain {} draws them)",
                side.to_uppercase(),
                out.display(),
                self.steps.len(),
                comments.iter().flatten().count(),
                out.display()
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

/// `<wire>` with `.pcapng` replaced by `.rnic-<side>.pcapng`.
pub fn rnic_capture(wire: &Path, side: &str) -> PathBuf {
    let name = wire
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".pcapng").unwrap_or(&name);
    wire.with_file_name(format!("{stem}.rnic-{side}.pcapng"))
}

/// One line of the report.
struct Step {
    what: String,
    bytes: u64,
    ops: u64,
    figure: String,
}

/// `xrnic demo`.
pub fn run(args: &DemoArgs) -> ExitCode {
    if let Err(e) = preflight() {
        eprintln!("xrnic demo: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = ctrlc::set_handler(on_signal) {
        eprintln!("xrnic demo: cannot install the signal handler: {e}");
        return ExitCode::FAILURE;
    }
    let r = demo(args);
    // Normal path (success or failure): the pair's Drop removes the namespaces; make sure
    // no child outlives us either.
    kill_children();
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xrnic demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn on_signal() {
    let mut c = cleanup_lock();
    for pid in c.children.drain(..) {
        kill(pid);
    }
    // This process's own devices (the verbs step): their captures up to now, and no
    // snapshot left behind.
    crate::driver::tap::flush_all(Duration::from_secs(5));
    crate::driver::remove_live_snapshots();
    for ns in c.netns.drain(..) {
        let _ = Command::new("ip")
            .args(["netns", "del", &ns])
            .stderr(Stdio::null())
            .status();
    }
    eprintln!("xrnic demo: interrupted; namespaces removed");
    std::process::exit(130);
}

fn kill(pid: u32) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
    }
}

fn kill_children() {
    for pid in cleanup_lock().children.drain(..) {
        kill(pid);
    }
}

fn have(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(tool).is_file()))
}

fn preflight() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("needs root (network namespaces, AF_XDP, XDP): run it with sudo".into());
    }
    let missing: Vec<&str> = [
        ("ip", "iproute2"),
        ("ss", "iproute2"),
        ("dumpcap", "tshark"),
    ]
    .into_iter()
    .filter(|(t, _)| !have(t))
    .map(|(_, pkg)| pkg)
    .collect();
    if !missing.is_empty() {
        return Err(format!(
            "missing tools: install the Debian package(s) {} (apt-get install {})",
            missing.join(", "),
            missing.join(" ")
        ));
    }
    Ok(())
}

/// A child registered with the signal handler; killed and reaped on drop.
struct Managed(Option<Child>);

impl Managed {
    fn spawn(cmd: &mut Command) -> Result<Self, String> {
        // Under the lock: the handler either sees this child or runs before it exists.
        let mut c = cleanup_lock();
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
        c.children.push(child.id());
        Ok(Managed(Some(child)))
    }

    fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    fn child(&mut self) -> Result<&mut Child, String> {
        // Only `output` takes the child out, and it consumes self.
        self.0
            .as_mut()
            .ok_or_else(|| "the child was already waited for".to_string())
    }

    /// Wait for the exit, collecting stdout and stderr.
    fn output(mut self) -> Result<std::process::Output, String> {
        let child = self.0.take().ok_or("no child")?;
        let id = child.id();
        let out = child.wait_with_output().map_err(|e| e.to_string());
        cleanup_lock().children.retain(|&p| p != id);
        out
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            if let Ok(None) = child.try_wait() {
                kill(child.id());
                let _ = child.wait();
            }
            let id = child.id();
            cleanup_lock().children.retain(|&p| p != id);
        }
    }
}

fn demo(args: &DemoArgs) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own binary: {e}"))?;
    let pcap = std::path::absolute(&args.pcap).map_err(|e| format!("--pcap: {e}"))?;
    if let Some(dir) = pcap.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let _ = std::fs::remove_file(&pcap);

    // Under the lock: a signal arriving now waits until the names are registered.
    let pair = {
        let mut c = cleanup_lock();
        let pid = std::process::id();
        // The names VethPair gives, registered before they exist (deleting a namespace
        // that was never created fails harmlessly).
        let pair = VethPair::observed(9000);
        if let Ok(p) = &pair {
            c.netns.extend(p.netns_names());
        } else {
            c.netns.extend(
                list_netns()
                    .into_iter()
                    .filter(|n| n.starts_with(&format!("xrnic-{pid}-"))),
            );
        }
        pair.map_err(|e| format!("cannot create the veth pair: {e}"))?
    };
    let (a, b) = (pair.end(Side::A), pair.end(Side::B));
    println!(
        "demo: namespaces {} ({} {} {}) and {} ({} {} {}), veth MTU {}, capture on {}",
        a.netns,
        a.ifname,
        a.ipv4,
        a.ipv6,
        b.netns,
        b.ifname,
        b.ipv4,
        b.ipv6,
        pair.mtu(),
        pair.observer().map(|(_, i)| i).unwrap_or("-")
    );

    let capture = start_capture(&pair, &pcap)?;
    sync_capture(&pair, &pcap, "start")?;
    let mut caps = RnicCaps::new(&pcap)?;
    let mut steps = Vec::new();
    let n = args.iters;
    for (size, iters, mtu, gid) in [
        (64u32, n, 1024u32, GID_IPV4),
        (4096, n, 1024, GID_IPV4),
        (65536, (n / 10).max(1), 1024, GID_IPV4),
        (4096, n, 4096, GID_IPV6),
        (65536, (n / 10).max(1), 4096, GID_IPV6),
    ] {
        let s = pingpong_step(&pair, &exe, &mut caps, size, iters, mtu, gid)?;
        println!(
            "demo: {:<46} {:>10} bytes  {}  verified yes",
            s.what, s.bytes, s.figure
        );
        steps.push(s);
    }
    for (test, size, iters) in [
        ("write", 65536u32, n),
        ("read", 65536, n),
        ("send", 65536, n),
        ("atomic", 8, n * 5),
    ] {
        let s = perf_step(&pair, &exe, &mut caps, test, size, iters)?;
        println!(
            "demo: {:<46} {:>10} bytes  {}  verified yes",
            s.what, s.bytes, s.figure
        );
        steps.push(s);
    }
    for s in verbs_steps(&pair, &mut caps)? {
        println!(
            "demo: {:<46} {:>10} bytes  {}  verified yes",
            s.what, s.bytes, s.figure
        );
        steps.push(s);
    }
    sync_capture(&pair, &pcap, "end")?;
    let (roce, dropped) = stop_capture(capture)?;
    check_capture(&pcap, roce, dropped)?;
    caps.finish(&pcap)?;
    drop(pair);
    cleanup_lock().netns.clear();
    let bytes: u64 = steps.iter().map(|s| s.bytes).sum();
    let ops: u64 = steps.iter().map(|s| s.ops).sum();
    println!("demo: all data verified ({bytes} bytes over {ops} RDMA operations)");
    Ok(())
}

fn list_netns() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

struct Capture {
    child: Managed,
    stderr: std::thread::JoinHandle<Vec<String>>,
}

/// Start `dumpcap` on the observer port and wait until it captures.
fn start_capture(pair: &VethPair, pcap: &Path) -> Result<Capture, String> {
    let (ns, port) = pair.observer().ok_or("the pair has no observer port")?;
    // -B 64: a 64 MiB kernel buffer, so that fewer frames of a burst at veth speed are
    // dropped (the default 2 MiB loses a few hundred in the 64 KiB steps).
    let mut child = Managed::spawn(
        Command::new("ip")
            .args([
                "netns", "exec", ns, "dumpcap", "-q", "-B", "64", "-i", port, "-w",
            ])
            .arg(pcap)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )?;
    let err = child.child()?.stderr.take().ok_or("dumpcap: no stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if l.starts_with("Capturing on") {
                let _ = tx.send(());
            }
            lines.push(l);
        }
        lines
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(()) => Ok(Capture { child, stderr }),
        Err(_) => {
            drop(child);
            let lines = stderr.join().unwrap_or_default();
            Err(format!("dumpcap did not start: {}", lines.join(" / ")))
        }
    }
}

/// Send a marker datagram from A to B's discard port and wait (bounded) until dumpcap has
/// written it to `pcap`.
///
/// dumpcap prints "Capturing on" before libpcap opens the interface, and libpcap hands a
/// TPACKET_V3 ring block over only when it is full or its timer retires it; so neither
/// that line nor a fixed sleep before the stop proves a frame is in the file (a CI run
/// lost the whole first step). The ring is read in order: once the marker is in the file,
/// the capture is live (at the start) and every frame sent before it is there (at the
/// end). Costs 0.5 to 1.5 s each time (dumpcap flushes its file every 500 ms).
fn sync_capture(pair: &VethPair, pcap: &Path, when: &str) -> Result<(), String> {
    let marker = format!("xrnic demo capture {when} {}", std::process::id());
    let to = std::net::SocketAddr::from((pair.end(Side::B).ipv4, 9));
    let sock = pair
        .run_in(Side::A, || std::net::UdpSocket::bind("0.0.0.0:0"))
        .and_then(|r| r)
        .map_err(|e| format!("capture marker socket in {}: {e}", pair.end(Side::A).netns))?;
    // The file only grows: the marker lands after what is there now (tens of MB at the
    // end of a demo, not worth reading again on every look).
    let before = std::fs::metadata(pcap).map_or(0, |m| m.len());
    let written_since = || -> std::io::Result<Vec<u8>> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(pcap)?;
        f.seek(SeekFrom::Start(before))?;
        let mut tail = Vec::new();
        f.read_to_end(&mut tail)?;
        Ok(tail)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        sock.send_to(marker.as_bytes(), to)
            .map_err(|e| format!("capture marker to {to}: {e}"))?;
        std::thread::sleep(Duration::from_millis(250));
        let written = written_since().unwrap_or_default();
        if written
            .windows(marker.len())
            .any(|w| w == marker.as_bytes())
        {
            return Ok(());
        }
    }
    Err(format!(
        "dumpcap did not write the {when} marker to {} within 10 s",
        pcap.display()
    ))
}

/// Stop dumpcap (SIGINT: it finishes the file) and return what it reports: packets
/// captured and dropped.
fn stop_capture(cap: Capture) -> Result<(u64, u64), String> {
    if let Some(p) = rustix::process::Pid::from_raw(cap.child.pid() as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::INT);
    }
    let out = cap.child.output()?;
    let lines = cap.stderr.join().unwrap_or_default();
    if !out.status.success() {
        return Err(format!("dumpcap failed: {}", lines.join(" / ")));
    }
    // "Packets received/dropped on interface 'to-a': 1234/0 (...)"
    let counts = lines
        .iter()
        .find_map(|l| {
            let rest = l.split("': ").nth(1)?;
            let nums = rest.split_whitespace().next()?;
            let (r, d) = nums.split_once('/')?;
            Some((r.parse().ok()?, d.parse().ok()?))
        })
        .unwrap_or((0, 0));
    Ok(counts)
}

fn check_capture(pcap: &Path, captured: u64, dropped: u64) -> Result<(), String> {
    let frames =
        crate::io::capture::read_file(pcap).map_err(|e| format!("{}: {e}", pcap.display()))?;
    let sum = crate::cli::decode::decode_frames(
        &frames,
        crate::cli::decode::Format::Text,
        &mut std::io::sink(),
    )
    .map_err(|e| e.to_string())?;
    if sum.roce == 0 {
        return Err(format!("{}: no RoCE packet captured", pcap.display()));
    }
    if !sum.all_good() {
        return Err(format!(
            "{}: {} RoCE packets, {} with a bad ICRC, {} malformed (see xrnic decode {})",
            pcap.display(),
            sum.roce,
            sum.bad_icrc,
            sum.malformed,
            pcap.display()
        ));
    }
    println!(
        "demo: capture {}: {} packets ({captured} captured, {dropped} dropped by dumpcap), \
         {} RoCE, all ICRCs valid (xrnic decode {} lists them)",
        pcap.display(),
        sum.packets,
        sum.roce,
        pcap.display()
    );
    Ok(())
}

/// Wait (bounded) until the server listens on [`PORT`] in `side`'s namespace.
fn wait_listening(pair: &VethPair, server: &mut Managed) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let out = pair
            .exec(Side::B, &["ss", "-Hltn", &format!("sport = :{PORT}")])
            .map_err(|e| format!("ss: {e}"))?;
        if !out.stdout.is_empty() {
            return Ok(());
        }
        if let Ok(Some(st)) = server.child()?.try_wait() {
            return Err(format!("the rc-pingpong server exited early ({st})"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!("the rc-pingpong server does not listen on {PORT}"))
}

/// Run `args` (a subcommand of this binary with its options) as a server in B and a client
/// in A connecting to `peer`; both outputs, or an error naming the failed side.
fn client_server(
    pair: &VethPair,
    exe: &Path,
    caps: &mut RnicCaps,
    args: &[String],
    peer: &str,
    what: &str,
) -> Result<[std::process::Output; 2], String> {
    let files = caps.next(what);
    let cmd = |side: Side| {
        let mut c = Command::new("ip");
        let file = &files[if side == Side::A { 0 } else { 1 }];
        c.args(["netns", "exec", &pair.end(side).netns])
            .arg(exe)
            .args(args)
            .arg(format!("--netdev={}", pair.end(side).ifname))
            .arg("--pcap")
            .arg(file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let mut server = Managed::spawn(&mut cmd(Side::B))?;
    wait_listening(pair, &mut server)?;
    let client = Managed::spawn(cmd(Side::A).arg(peer))?;
    let c_out = client.output()?;
    let s_out = server.output()?;
    for (who, o) in [("client", &c_out), ("server", &s_out)] {
        if !o.status.success() {
            return Err(format!(
                "{what} {who} failed: {}{}",
                String::from_utf8_lossy(&o.stdout).trim(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
    }
    Ok([c_out, s_out])
}

/// `xrnic perf TEST --verify --json` between the namespaces (IPv4 GID, path MTU 4096).
fn perf_step(
    pair: &VethPair,
    exe: &Path,
    caps: &mut RnicCaps,
    test: &str,
    size: u32,
    iters: u32,
) -> Result<Step, String> {
    let args = [
        "perf".to_string(),
        test.into(),
        "--no-stat".into(),
        "--verify".into(),
        "--json".into(),
        "--report_gbits".into(),
        format!("--size={size}"),
        format!("--iters={iters}"),
        "--mtu=4096".into(),
        format!("--gid-index={GID_IPV4}"),
        format!("--port={PORT}"),
    ];
    let peer = pair.end(Side::B).ipv4.to_string();
    let what = format!("perf {test}");
    let outs = client_server(pair, exe, caps, &args, &peer, &what)?;
    let texts: Vec<String> = outs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .collect();
    // --verify: the side that holds the data checks it (the server for write, send and
    // atomic, the client for read) and says so; with a mismatch it exits 1 (above).
    if !texts
        .iter()
        .any(|t| t.lines().any(|l| l == "verify: every byte as expected"))
    {
        return Err(format!("{what}: no side reported its verification"));
    }
    // The report: the client's JSON line (the send server measures on its own: take the
    // client's too, it is what was sent).
    let json: serde_json::Value = texts[0]
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| format!("{what} client: no JSON report"))?;
    let gbps = json["bw_avg_gbps"].as_f64().unwrap_or(0.0);
    let mpps = json["msg_rate_mpps"].as_f64().unwrap_or(0.0);
    Ok(Step {
        what: format!("perf {test} {size} B x {iters}, IPv4, mtu 4096"),
        bytes: u64::from(size) * u64::from(iters),
        ops: u64::from(iters),
        figure: format!("{gbps:>8.3} Gbit/s {mpps:>7.4} Mmsg/s"),
    })
}

fn pingpong_step(
    pair: &VethPair,
    exe: &Path,
    caps: &mut RnicCaps,
    size: u32,
    iters: u32,
    mtu: u32,
    gid: u8,
) -> Result<Step, String> {
    let common = [
        "rc-pingpong".to_string(),
        "--no-stat".into(),
        "--verify".into(),
        format!("--size={size}"),
        format!("--iters={iters}"),
        format!("--mtu={mtu}"),
        format!("--gid-idx={gid}"),
        format!("--port={PORT}"),
    ];
    let peer = if gid == GID_IPV6 {
        pair.end(Side::B).ipv6.to_string()
    } else {
        pair.end(Side::B).ipv4.to_string()
    };
    let what = format!(
        "rc-pingpong {size} B, IPv{}, mtu {mtu}",
        if gid == GID_IPV6 { 6 } else { 4 }
    );
    let [c_out, s_out] = client_server(pair, exe, caps, &common, &peer, &what)?;
    let mut verified = 0;
    let mut usec = None;
    for (who, o) in [("client", &c_out), ("server", &s_out)] {
        let text = String::from_utf8_lossy(&o.stdout);
        // "verify: N messages received, every byte as sent"
        verified += text
            .lines()
            .find_map(|l| {
                l.strip_prefix("verify: ")?
                    .split(' ')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .ok_or_else(|| format!("rc-pingpong {who}: no verify line in its output"))?;
        if who == "client" {
            // "N iters in S seconds = U usec/iter"
            usec = text.lines().find_map(|l| {
                l.strip_suffix(" usec/iter")?
                    .rsplit(' ')
                    .next()?
                    .parse::<f64>()
                    .ok()
            });
        }
    }
    if verified != 2 * u64::from(iters) {
        return Err(format!(
            "rc-pingpong size {size}: {verified} messages verified, expected {}",
            2 * u64::from(iters)
        ));
    }
    let bytes = 2 * u64::from(size) * u64::from(iters);
    let usec = usec.ok_or("rc-pingpong client: no usec/iter line")?;
    let mbps = bytes as f64 * 8.0 / (usec * f64::from(iters));
    Ok(Step {
        what: format!(
            "rc-pingpong {} B x {iters} x2, IPv{}, mtu {mtu}",
            size,
            if gid == GID_IPV6 { 6 } else { 4 }
        ),
        bytes,
        ops: 2 * u64::from(iters),
        figure: format!("{usec:>8.1} us/iter {mbps:>8.1} Mbit/s"),
    })
}

/// The verbs step: devices in this process, one per namespace.
fn verbs_steps(pair: &VethPair, caps: &mut RnicCaps) -> Result<Vec<Step>, String> {
    let files = caps.next("verbs SEND, WRITE, READ, atomics");
    let v = VerbsPair::connect(pair, &files)?;
    let mut steps = vec![v.send()?];
    steps.extend(v.write_then_read()?);
    steps.extend(v.atomics()?);
    Ok(steps)
}

/// Bytes of the verbs step's MRs.
const VERBS_MR_LEN: usize = 4 << 20;

/// A device in each namespace with one RC QP each, connected over IPv6 with a 4096-byte
/// path MTU, and a [`VERBS_MR_LEN`] MR each. Fields drop in this order: QPs, MRs, CQs,
/// PDs, devices (B before A in each).
struct VerbsPair {
    qp_b: crate::verbs::Qp,
    qp_a: crate::verbs::Qp,
    mr_b: Mr,
    mr_a: Mr,
    cq_b: Cq,
    cq_a: Cq,
    _pd_b: crate::verbs::Pd,
    _pd_a: crate::verbs::Pd,
    _db: Device,
    _da: Device,
}

/// A verbs error as "what: error".
fn verbs_err(what: &'static str) -> impl Fn(crate::verbs::Error) -> String {
    move |err| format!("{what}: {err}")
}

/// One completion on `cq` within 10 s, successful.
fn wait_success(cq: &Cq, what: &str) -> Result<(), String> {
    match cq.wait(1, Duration::from_secs(10)).first() {
        Some(w) if w.status == WcStatus::Success => Ok(()),
        Some(w) => Err(format!("{what}: completion {w:?}")),
        None => Err(format!("{what}: no completion within 10 s")),
    }
}

/// `n` bytes that differ with `seed` and along the buffer.
fn verbs_pattern(seed: u32, n: usize) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(seed) ^ (i >> 9)) as u8)
        .collect()
}

/// `n` bytes of `mr` from `off`.
fn read_mr(mr: &Mr, off: usize, n: usize) -> Result<Vec<u8>, String> {
    let mut v = vec![0u8; n];
    mr.read(off, &mut v).map_err(|e| e.to_string())?;
    Ok(v)
}

/// The first 8 bytes of `mr` as a host-order word.
fn mr_word(mr: &Mr) -> Result<u64, String> {
    let v = read_mr(mr, 0, 8)?;
    Ok(u64::from_ne_bytes(v.try_into().unwrap_or_default()))
}

/// Seconds `f` took.
fn timed(f: &dyn Fn() -> Result<(), String>) -> Result<f64, String> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64())
}

/// `n` bytes in `s` seconds, as the step's figure.
fn gbps(n: usize, s: f64) -> String {
    format!("{:>8.3} Gbit/s          ", n as f64 * 8.0 / s / 1e9)
}

impl VerbsPair {
    /// Open the devices (each capturing into its file of `files`), create the objects and
    /// connect the QPs.
    fn connect(pair: &VethPair, files: &[PathBuf; 2]) -> Result<Self, String> {
        let open = |side: Side| -> Result<Device, String> {
            let opts = crate::verbs::DeviceOptions {
                pcap: Some(files[if side == Side::A { 0 } else { 1 }].clone()),
                ..crate::verbs::DeviceOptions::default()
            };
            pair.run_in(side, || Device::open_with(&pair.end(side).ifname, &opts))
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("device on {}: {e}", pair.end(side).ifname))
        };
        let (da, db) = (open(Side::A)?, open(Side::B)?);
        let e = verbs_err;
        let (pd_a, pd_b) = (
            da.alloc_pd().map_err(e("alloc_pd"))?,
            db.alloc_pd().map_err(e("alloc_pd"))?,
        );
        let (cq_a, cq_b) = (
            da.create_cq(64).map_err(e("create_cq"))?,
            db.create_cq(64).map_err(e("create_cq"))?,
        );
        let mr_a = pd_a
            .reg_mr(VERBS_MR_LEN, Access::ALL)
            .map_err(e("reg_mr"))?;
        let mr_b = pd_b
            .reg_mr(VERBS_MR_LEN, Access::ALL)
            .map_err(e("reg_mr"))?;
        let qp_a = pd_a
            .create_qp(&QpInitAttr::new(&cq_a, &cq_a, 64))
            .map_err(e("create_qp"))?;
        let qp_b = pd_b
            .create_qp(&QpInitAttr::new(&cq_b, &cq_b, 64))
            .map_err(e("create_qp"))?;
        let opts = ConnectOpts {
            access: Access::ALL,
            path_mtu: Mtu::Mtu4096,
            ..ConnectOpts::default()
        };
        let gid = |d: &Device| d.query_gid(GID_IPV6.into()).ok_or("no IPv6 GID");
        qp_a.connect(
            &Remote {
                qpn: qp_b.qp_num(),
                psn: 0x100,
                gid: gid(&db)?,
            },
            0x200,
            GID_IPV6,
            &opts,
        )
        .map_err(e("connect"))?;
        qp_b.connect(
            &Remote {
                qpn: qp_a.qp_num(),
                psn: 0x200,
                gid: gid(&da)?,
            },
            0x100,
            GID_IPV6,
            &opts,
        )
        .map_err(e("connect"))?;
        Ok(VerbsPair {
            qp_b,
            qp_a,
            mr_b,
            mr_a,
            cq_b,
            cq_a,
            _pd_b: pd_b,
            _pd_a: pd_a,
            _db: db,
            _da: da,
        })
    }

    /// SEND 64 KiB into a posted receive.
    fn send(&self) -> Result<Step, String> {
        let e = verbs_err;
        let data = verbs_pattern(7, 65536);
        self.mr_a.write(0, &data).map_err(|e| e.to_string())?;
        self.mr_b
            .with_mut(|b| b.fill(0))
            .map_err(|e| e.to_string())?;
        self.qp_b
            .post_recv(RecvWr {
                wr_id: 1,
                sg_list: vec![self.mr_b.sge(0, data.len() as u32)],
            })
            .map_err(e("post_recv"))?;
        let s = timed(&|| {
            let mut wr = SendWr::new(2, WrOpcode::Send);
            wr.sg_list = vec![self.mr_a.sge(0, data.len() as u32)];
            self.qp_a.post_send(wr).map_err(e("post_send"))?;
            wait_success(&self.cq_a, "SEND")?;
            wait_success(&self.cq_b, "RECV")
        })?;
        if read_mr(&self.mr_b, 0, data.len())? != data {
            return Err("SEND: the receive buffer differs from what was sent".into());
        }
        Ok(Step {
            what: "verbs SEND 64 KiB, IPv6, mtu 4096".into(),
            bytes: data.len() as u64,
            ops: 1,
            figure: gbps(data.len(), s),
        })
    }

    /// RDMA WRITE 2 MiB into B (B's application makes no call), READ it back into A.
    fn write_then_read(&self) -> Result<[Step; 2], String> {
        let e = verbs_err;
        let half = VERBS_MR_LEN / 2;
        let big = verbs_pattern(13, half);
        self.mr_a.write(0, &big).map_err(|e| e.to_string())?;
        let s = timed(&|| {
            let mut wr = SendWr::new(3, WrOpcode::RdmaWrite);
            wr.sg_list = vec![self.mr_a.sge(0, half as u32)];
            wr.rdma.remote_addr = self.mr_b.addr() + half as u64;
            wr.rdma.rkey = self.mr_b.rkey();
            self.qp_a.post_send(wr).map_err(e("post_send"))?;
            wait_success(&self.cq_a, "RDMA WRITE")
        })?;
        if read_mr(&self.mr_b, half, half)? != big {
            return Err("RDMA WRITE: B's memory differs from what A wrote".into());
        }
        let write = Step {
            what: "verbs RDMA WRITE 2 MiB, IPv6, mtu 4096".into(),
            bytes: half as u64,
            ops: 1,
            figure: gbps(half, s),
        };
        let s = timed(&|| {
            let mut wr = SendWr::new(4, WrOpcode::RdmaRead);
            wr.sg_list = vec![self.mr_a.sge(half, half as u32)];
            wr.rdma.remote_addr = self.mr_b.addr() + half as u64;
            wr.rdma.rkey = self.mr_b.rkey();
            self.qp_a.post_send(wr).map_err(e("post_send"))?;
            wait_success(&self.cq_a, "RDMA READ")
        })?;
        if read_mr(&self.mr_a, half, half)? != big {
            return Err("RDMA READ: what A read differs from B's memory".into());
        }
        let read = Step {
            what: "verbs RDMA READ 2 MiB, IPv6, mtu 4096".into(),
            bytes: half as u64,
            ops: 1,
            figure: gbps(half, s),
        };
        Ok([write, read])
    }

    /// One atomic on B's first word into A's first 8 bytes; seconds it took.
    fn atomic(&self, wr_id: u64, op: WrOpcode, compare_add: u64, swap: u64) -> Result<f64, String> {
        timed(&|| {
            let mut wr = SendWr::new(wr_id, op);
            wr.sg_list = vec![self.mr_a.sge(0, 8)];
            wr.atomic.remote_addr = self.mr_b.addr();
            wr.atomic.rkey = self.mr_b.rkey();
            wr.atomic.compare_add = compare_add;
            wr.atomic.swap = swap;
            self.qp_a.post_send(wr).map_err(verbs_err("post_send"))?;
            wait_success(&self.cq_a, "ATOMIC")
        })
    }

    /// FETCH_ADD then CMP_SWAP on one word of B.
    fn atomics(&self) -> Result<[Step; 2], String> {
        self.mr_b
            .write(0, &41u64.to_ne_bytes())
            .map_err(|e| e.to_string())?;
        let s = self.atomic(5, WrOpcode::AtomicFetchAndAdd, 1, 0)?;
        let (old, new) = (mr_word(&self.mr_a)?, mr_word(&self.mr_b)?);
        if (old, new) != (41, 42) {
            return Err(format!(
                "FETCH_ADD: returned {old}, memory {new}; expected 41, 42"
            ));
        }
        let fetch_add = Step {
            what: "verbs FETCH_ADD 41 + 1 -> 42".into(),
            bytes: 8,
            ops: 1,
            figure: format!("{:>8.1} us               ", s * 1e6),
        };
        let s = self.atomic(6, WrOpcode::AtomicCmpAndSwp, 42, 0xfeed)?;
        let (old, new) = (mr_word(&self.mr_a)?, mr_word(&self.mr_b)?);
        if (old, new) != (42, 0xfeed) {
            return Err(format!(
                "CMP_SWAP: returned {old}, memory {new:#x}; expected 42, 0xfeed"
            ));
        }
        let cmp_swap = Step {
            what: "verbs CMP_SWAP 42 -> 0xfeed".into(),
            bytes: 8,
            ops: 1,
            figure: format!("{:>8.1} us               ", s * 1e6),
        };
        Ok([fetch_add, cmp_swap])
    }
}
