//! The device service against a hostile local user (docs/security.md, "The device
//! service"): shared descriptors, descriptor and connection exhaustion, who sees which
//! resources in `xrnic res`, and a listing of any size. Root tests (`#[ignore = "needs
//! root"]`, docs/testing.md); the library must be built (`cargo build --workspace`).
//!
//! The attacker is this test binary run again as nobody (setpriv) in the service's
//! network namespace, with `XRNIC_SECFD_ROLE` naming what it does and `XRNIC_SECFD_IF`
//! the interface (the `--exact` test it runs takes that branch); it speaks the service's
//! protocol itself (src/ipc/) where the library would not do the attack. It
//! prints `armed` once the attack is in place and holds it until its stdin closes.

mod common;
mod service_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::text;
use service_support::{Kid, RcPair, Svc, out};
use xrnic::io::shm::{self, Ring};
use xrnic::ipc::{self, Req, Resp};
use xrnic::verbs::{Access, Device, QpInitAttr, RecvWr, SendWr, WcStatus, WrOpcode};
use xrnic_netns::Side;

const ROLE: &str = "XRNIC_SECFD_ROLE";
const IFACE: &str = "XRNIC_SECFD_IF";

/// A connection to the service of `ifname`, answers waited for at most `patience`.
fn raw_connect(ifname: &str, patience: Duration) -> std::io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let sock = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::sockopt::set_socket_timeout(
        &sock,
        rustix::net::sockopt::Timeout::Recv,
        Some(patience),
    )?;
    let addr = SocketAddrUnix::new_abstract_name(&ipc::socket_name(ifname))?;
    rustix::net::connect(&sock, &addr)?;
    Ok(sock)
}

/// One request and its answer (an error when none came within the socket's patience).
fn raw_call(sock: &OwnedFd, req: &Req) -> std::io::Result<(Resp, Vec<OwnedFd>)> {
    let text = serde_json::to_vec(req).unwrap();
    let sent = shm::send_with_fds(sock.as_fd(), &text, &[]);
    let mut buf = vec![0u8; ipc::MAX_MSG];
    let flags = if sent.is_ok() {
        rustix::net::RecvFlags::empty()
    } else {
        rustix::net::RecvFlags::DONTWAIT
    };
    match shm::recv_with_fds(sock.as_fd(), &mut buf, flags) {
        Ok(Some((n, fds))) => Ok((serde_json::from_slice(&buf[..n]).unwrap(), fds)),
        Ok(None) => Err(sent
            .err()
            .unwrap_or_else(|| std::io::Error::other("closed"))),
        Err(e) => Err(sent.err().unwrap_or(e)),
    }
}

/// The errno of an answer (0: not an error).
fn errno_of(r: &Resp) -> i32 {
    match r {
        Resp::Err { errno, .. } => *errno,
        _ => 0,
    }
}

/// Clear O_NONBLOCK on `fd` (what the kernel lets any holder of a description do).
fn clear_nonblock(fd: &OwnedFd) {
    let fl = rustix::fs::fcntl_getfl(fd).unwrap();
    rustix::fs::fcntl_setfl(fd, fl - rustix::fs::OFlags::NONBLOCK).unwrap();
}

/// The attacker's side: `role` against the service of `$XRNIC_SECFD_IF`, as nobody.
/// Prints `armed` (and facts as `key=value` lines) and holds until stdin closes.
fn attacker(role: &str) {
    let root = rustix::process::geteuid().as_raw() == 0;
    assert_eq!(root, role == "victim", "only the victim runs as root");
    let ifname = std::env::var(IFACE).expect("XRNIC_SECFD_IF");
    // libtest wrote `test NAME ... ` without a newline: the facts start on their own.
    println!();
    let mut keep: Vec<OwnedFd> = Vec::new();
    let mut rings: Vec<Ring> = Vec::new();
    let mut devs = Vec::new();
    match role {
        "shared_fds" => {
            let sock = raw_connect(&ifname, Duration::from_secs(10)).unwrap();
            let (r, mut fds) = raw_call(&sock, &Req::Hello { comm: "att".into() }).unwrap();
            assert!(matches!(r, Resp::Hello { .. }), "{r:?}");
            let (events, notify, bell, ring) = (
                fds.pop().unwrap(),
                fds.pop().unwrap(),
                fds.pop().unwrap(),
                fds.pop().unwrap(),
            );
            // A CQ and a QP in RESET: every post is refused, an error completion each,
            // so the service writes this client's CQ event and notifier.
            let (r, mut cq_fds) = raw_call(&sock, &Req::CreateCq { cqe: 16 }).unwrap();
            let Resp::Cq { cq, .. } = r else {
                panic!("{r:?}")
            };
            let cq_event = cq_fds.pop().unwrap();
            let (r, _) = raw_call(&sock, &Req::AllocPd).unwrap();
            let Resp::Pd { pd } = r else { panic!("{r:?}") };
            let qp = Req::CreateQp {
                pd,
                send_cq: cq,
                recv_cq: cq,
                max_send_wr: 16,
                max_recv_wr: 16,
                sq_sig_all: true,
                qp_type: xrnic::proto::QpType::Rc,
                srq: None,
            };
            let (r, _) = raw_call(&sock, &qp).unwrap();
            let Resp::Qp { qpn } = r else { panic!("{r:?}") };
            // Every descriptor blocking; an eventfd-style counter at its maximum where
            // this end takes writes (an eventfd holds at most 2^64 - 2).
            for fd in [&events, &notify, &bell, &cq_event] {
                clear_nonblock(fd);
            }
            for fd in [&events, &notify, &cq_event] {
                let _ = rustix::io::write(fd, &(u64::MAX - 1).to_ne_bytes());
            }
            let sq = Ring::map(ring, ipc::SQ_SLOTS, ipc::SQ_SLOT_BYTES).unwrap();
            // More slots than one round takes, so the round after reads the doorbell
            // again with nothing rung; half of them real posts to the RESET QP.
            let mut wr = SendWr::new(1, WrOpcode::Send);
            wr.sg_list.clear();
            let post = ipc::encode_send(xrnic::wire::Qpn::new(qpn), &wr).unwrap();
            for i in 0..2000 {
                let slot = if i % 2 == 0 {
                    post
                } else {
                    [0xffu64; ipc::SQ_WORDS]
                };
                assert!(sq.push(&slot));
            }
            rustix::io::write(&bell, &1u64.to_ne_bytes()).unwrap();
            rings.push(sq);
            keep.extend([sock, events, notify, bell, cq_event]);
        }
        "many_fds" => {
            // Connections, each with CQs until the service refuses; then more
            // connections than anyone may hold, left waiting.
            let (mut cq_err, mut conn_err, mut made) = (0, 0, 0usize);
            for _ in 0..200 {
                let Ok(sock) = raw_connect(&ifname, Duration::from_secs(5)) else {
                    conn_err = libc::ECONNREFUSED;
                    break;
                };
                match raw_call(&sock, &Req::Hello { comm: "att".into() }) {
                    Ok((Resp::Hello { .. }, fds)) => keep.extend(fds),
                    Ok((r, _)) => {
                        conn_err = errno_of(&r);
                        break;
                    }
                    Err(e) => {
                        conn_err = e.raw_os_error().unwrap_or(-1);
                        break;
                    }
                }
                loop {
                    match raw_call(&sock, &Req::CreateCq { cqe: 16 }) {
                        Ok((Resp::Cq { .. }, fds)) => {
                            made += 1;
                            keep.extend(fds);
                        }
                        Ok((r, _)) => {
                            cq_err = errno_of(&r);
                            break;
                        }
                        Err(e) => {
                            cq_err = e.raw_os_error().unwrap_or(-1);
                            break;
                        }
                    }
                }
                keep.push(sock);
            }
            // Connections that never say anything (the listen backlog holds them on a
            // service that cannot accept).
            for _ in 0..32 {
                if let Ok(s) = raw_connect(&ifname, Duration::from_secs(5)) {
                    keep.push(s);
                }
            }
            println!("cqs={made}");
            println!("cq_errno={cq_err}");
            println!("conn_errno={conn_err}");
        }
        "own_objects" => {
            let d = Device::open(&ifname).unwrap();
            assert!(d.service_pid().is_some());
            let pd = d.alloc_pd().unwrap();
            let cq = d.create_cq(16).unwrap();
            let mr = pd.reg_mr(4096, Access::ALL).unwrap();
            let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 16)).unwrap();
            println!("rkey={}", mr.rkey().0);
            println!("qpn={}", qp.qp_num().value());
            devs.push((d, pd, cq, mr, qp));
        }
        "victim" => {
            // Root, another connection: served while the attacker holds.
            victim_round(&ifname).unwrap();
        }
        other => panic!("no role {other}"),
    }
    println!("pid={}", std::process::id());
    println!("armed");
    std::io::stdout().flush().unwrap();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop((keep, rings, devs));
}

/// The attacker process: this test binary as nobody in A running test `name` in `role`.
struct Attacker {
    kid: Kid,
    facts: Vec<String>,
}

impl Attacker {
    /// Start it and wait (bounded) until it says `armed`. The role `victim` runs as
    /// root.
    fn start(s: &Svc, name: &str, role: &str) -> Attacker {
        let exe = std::env::current_exe().unwrap();
        let exe = exe.to_str().unwrap();
        let args = [
            exe,
            "--exact",
            name,
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ];
        let mut cmd = if role == "victim" {
            let mut c = std::process::Command::new("ip");
            let ns = &s.pair.end(Side::A).netns;
            c.args(["netns", "exec", ns, "timeout", "120"]).args(args);
            c
        } else {
            s.as_nobody(&args)
        };
        cmd.env(ROLE, role)
            .env(IFACE, s.ifname())
            .env_remove("CI")
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut kid = Kid(Some(cmd.spawn().unwrap()));
        let stdout = kid.child().stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Read to the end even once nobody listens: the child must never meet a
            // closed pipe (libtest fails on one).
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut facts = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_secs(120)) {
                Ok(l) if l == "armed" => break,
                Ok(l) => facts.push(l),
                Err(e) => panic!("the attacker did not arm ({e}); it said {facts:?}"),
            }
        }
        Attacker { kid, facts }
    }

    fn fact(&self, key: &str) -> i64 {
        let p = format!("{key}=");
        self.facts
            .iter()
            .find_map(|l| l.strip_prefix(&p))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {:?}", self.facts))
    }

    fn child(&mut self) -> &mut Child {
        self.kid.child()
    }

    fn still_holds(&mut self) -> bool {
        matches!(self.child().try_wait(), Ok(None))
    }

    /// Close its stdin: it lets go and exits.
    fn stop(mut self) {
        drop(self.child().stdin.take());
        let o = self.kid.wait_with_output().unwrap();
        assert!(o.status.success(), "the attacker: {}", text(&o));
    }
}

/// The service's pid (asked through a connection of this process in A).
fn service_pid(s: &Svc) -> i32 {
    let ifname = s.ifname().to_string();
    s.pair
        .run_in(Side::A, move || {
            Device::open(&ifname).unwrap().service_pid().unwrap() as i32
        })
        .unwrap()
}

fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Wait (bounded) until the service holds `want` descriptors; the last count.
fn wait_fds(pid: i32, want: usize) -> usize {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let n = fd_count(pid);
        if n == want || Instant::now() > end {
            return n;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait (bounded by `limit`) for process `pid` to end.
fn wait_gone(pid: i32, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A victim's work: a root client with a connected RC pair, 20 SENDs and their
/// completions, and a verb per SEND; `Ok` when all of it was served.
fn victim_round(ifname: &str) -> Result<(), String> {
    let p = RcPair::connect(ifname);
    for i in 0..20u64 {
        p.qb.post_recv(RecvWr {
            wr_id: i,
            sg_list: vec![p.mb.sge(0, 64)],
        })
        .map_err(|e| e.to_string())?;
        let mut wr = SendWr::new(i, WrOpcode::Send);
        wr.sg_list = vec![p.ma.sge(0, 13)];
        p.qa.post_send(wr).map_err(|e| e.to_string())?;
        for cq in [&p.ca, &p.cb] {
            let wc = cq.wait(1, Duration::from_secs(10));
            if wc.len() != 1 || wc[0].status != WcStatus::Success {
                return Err(format!("SEND {i}: {wc:?}"));
            }
        }
        p.qa.query().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Item: the doorbell, notifiers and CQ events are the client's own ends. The attacker
/// (nobody) clears O_NONBLOCK on every descriptor the service gave it, puts an
/// eventfd-style counter at its maximum where its end takes writes, queues 2 000 slots
/// (half of them posts that fail into its CQ) and rings once, then holds. While it holds
/// (it only lets go when told), a root client's connected pair moves 20 SENDs and its
/// verbs are answered: a blocked service would answer only after the attacker let go, if
/// ever. Then the attacker goes, the service holds the descriptors it held before (none
/// leaked) and `xrnic down` stops it.
#[test]
#[ignore = "needs root"]
fn a_client_cannot_block_the_service_through_its_descriptors() {
    if let Ok(role) = std::env::var(ROLE) {
        return attacker(&role);
    }
    const NAME: &str = "a_client_cannot_block_the_service_through_its_descriptors";
    let s = Svc::start();
    let svc = service_pid(&s);
    // A first round, so that whatever the service opens once (on its first QP, its
    // first neighbour) is open before the count.
    let ifname = s.ifname().to_string();
    s.pair
        .run_in(Side::A, move || victim_round(&ifname))
        .unwrap()
        .unwrap();
    assert!(s.wait_empty(Duration::from_secs(10)).is_empty());
    let before = fd_count(svc);
    let mut att = Attacker::start(&s, NAME, "shared_fds");
    // The victim (root, its own process) says `armed` once its 20 SENDs and verbs were
    // served; the attacker holds until told, so a service stuck behind the attacker
    // leaves the victim waiting (and this start fails after its bound).
    let victim = Attacker::start(&s, NAME, "victim");
    assert!(
        att.still_holds(),
        "the attacker let go before the victim was done"
    );
    let o = s
        .root(&["res", "--netdev", s.ifname(), "--json"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "xrnic res during the attack: {}",
        text(&o)
    );
    victim.stop();
    att.stop();
    assert_eq!(
        wait_fds(svc, before),
        before,
        "the service's descriptors after the attacker and the victim left"
    );
    let o = s.root(&["down", s.ifname()]).output().unwrap();
    assert!(o.status.success(), "xrnic down: {}", text(&o));
    assert!(
        wait_gone(svc, Duration::from_secs(20)),
        "the service is still there"
    );
}

/// utime + stime of the service's loop thread (its main thread), in clock ticks.
fn loop_cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/stat")).unwrap();
    // Fields after the command's closing parenthesis start at field 3 (state).
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Item: descriptors and connections are bounded per client and per uid. The attacker
/// (nobody) opens connections, each making CQs (two descriptors each in the service)
/// until refused, up to 200 connections, then 32 more that never speak, and holds all
/// of it. It meets EMFILE or ENOMEM; a root client's hello is still answered; the
/// service's loop does not spin meanwhile
/// (its thread sleeps in poll(2): over 5 s it uses less than a tenth of that in CPU,
/// where a loop polling a listener it cannot accept from runs all the time), and SIGTERM
/// ends it.
#[test]
#[ignore = "needs root"]
fn descriptor_and_connection_floods_meet_bounds_and_others_go_on() {
    if let Ok(role) = std::env::var(ROLE) {
        return attacker(&role);
    }
    let s = Svc::start();
    let svc = service_pid(&s);
    let att = Attacker::start(
        &s,
        "descriptor_and_connection_floods_meet_bounds_and_others_go_on",
        "many_fds",
    );
    let refused = [libc::EMFILE, libc::ENOMEM];
    let (cq_err, conn_err) = (att.fact("cq_errno") as i32, att.fact("conn_errno") as i32);
    assert!(
        refused.contains(&cq_err),
        "CQs past the bound: errno {cq_err} ({:?})",
        att.facts
    );
    assert!(
        refused.contains(&conn_err),
        "connections past the bound: errno {conn_err} ({:?})",
        att.facts
    );
    // A root client's hello, answered within 10 s.
    let ifname = s.ifname().to_string();
    let hello = s
        .pair
        .run_in(Side::A, move || {
            let sock = raw_connect(&ifname, Duration::from_secs(10))?;
            let (r, fds) = raw_call(
                &sock,
                &Req::Hello {
                    comm: "victim".into(),
                },
            )?;
            Ok::<_, std::io::Error>((r, fds.len()))
        })
        .unwrap();
    assert!(
        matches!(hello, Ok((Resp::Hello { .. }, 4))),
        "the victim's hello: {hello:?}"
    );
    // SAFETY: sysconf takes no pointer.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    let (t0, c0) = (Instant::now(), loop_cpu_ticks(svc));
    std::thread::sleep(Duration::from_secs(5));
    let (wall, cpu) = (
        t0.elapsed().as_secs_f64(),
        (loop_cpu_ticks(svc) - c0) as f64 / ticks as f64,
    );
    assert!(
        cpu < wall / 10.0,
        "the service's loop used {cpu:.2} s of CPU in {wall:.2} s with nothing to do"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(svc).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(
        wait_gone(svc, Duration::from_secs(20)),
        "SIGTERM did not end the service"
    );
    att.stop();
}

/// `xrnic res --netdev IF --json` run by `who` (root or nobody).
fn res_json(s: &Svc, root: bool, object: Option<&str>) -> Vec<serde_json::Value> {
    let mut args = vec!["res"];
    args.extend(object);
    args.extend(["--netdev", s.ifname(), "--json"]);
    let o = if root {
        s.root(&args).output().unwrap()
    } else {
        let mut v = vec![common::xrnic_bin()];
        v.extend(&args);
        s.as_nobody(&v).output().unwrap()
    };
    assert!(o.status.success(), "xrnic res: {}", text(&o));
    serde_json::from_slice::<serde_json::Value>(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
        .as_array()
        .cloned()
        .unwrap()
}

/// Item: who sees what in `xrnic res`, as the kernel's `rdma resource show`. A root
/// client and an unprivileged one (nobody) each hold a PD, a CQ, an MR and a QP. Nobody's
/// `xrnic res` lists its own objects (its MR's R_Key among them) and nothing of root's
/// client (no entry of another pid or uid); root's lists both, each object with its
/// owner's pid and comm (the text listing too).
#[test]
#[ignore = "needs root"]
fn res_shows_an_unprivileged_user_only_its_own_objects_and_root_all_with_owners() {
    if let Ok(role) = std::env::var(ROLE) {
        return attacker(&role);
    }
    let s = Svc::start();
    let ifname = s.ifname().to_string();
    let (tx, rx) = mpsc::channel::<()>();
    let (rtx, rrx) = mpsc::channel();
    let pair = &s.pair;
    std::thread::scope(|sc| {
        // Dropped when this closure ends, even by a failed assertion: the client's
        // thread then lets go and the scope ends.
        let tx = tx;
        sc.spawn(move || {
            pair.run_in(Side::A, move || {
                let d = Device::open(&ifname).unwrap();
                let pd = d.alloc_pd().unwrap();
                let cq = d.create_cq(16).unwrap();
                let mr = pd.reg_mr(4096, Access::ALL).unwrap();
                let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 16)).unwrap();
                rtx.send((mr.rkey().0, qp.qp_num().value())).unwrap();
                let _ = rx.recv();
                drop((qp, mr, cq, pd, d));
            })
            .unwrap();
        });
        let (root_rkey, root_qpn) = rrx.recv_timeout(Duration::from_secs(60)).unwrap();
        let att = Attacker::start(
            &s,
            "res_shows_an_unprivileged_user_only_its_own_objects_and_root_all_with_owners",
            "own_objects",
        );
        let (npid, nrkey, nqpn) = (att.fact("pid"), att.fact("rkey"), att.fact("qpn"));
        let me = i64::from(std::process::id());
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        let comm = comm.trim_end();

        let theirs = res_json(&s, false, None);
        assert!(!theirs.is_empty(), "nobody sees nothing of its own");
        for e in &theirs {
            assert_eq!(e["uid"], 65534, "nobody sees another user's object: {e}");
            assert_eq!(e["pid"], npid, "nobody sees another process's object: {e}");
            assert_ne!(e["rkey"], root_rkey, "nobody sees root's R_Key: {e}");
        }
        let kinds = |v: &[serde_json::Value], pid: i64| {
            let mut k: Vec<String> = v
                .iter()
                .filter(|e| e["pid"] == pid)
                .map(|e| e["kind"].as_str().unwrap().to_string())
                .collect();
            k.sort();
            k
        };
        assert_eq!(kinds(&theirs, npid), ["cq", "mr", "pd", "qp"]);
        assert!(
            theirs
                .iter()
                .any(|e| e["kind"] == "mr" && e["rkey"] == nrkey),
            "nobody's own MR: {theirs:?}"
        );

        let all = res_json(&s, true, None);
        assert_eq!(kinds(&all, npid), ["cq", "mr", "pd", "qp"], "{all:?}");
        assert_eq!(kinds(&all, me), ["cq", "mr", "pd", "qp"], "{all:?}");
        for e in &all {
            assert_eq!(e["comm"], comm, "each object names its owner's comm: {e}");
        }
        // The text listing, of this device and of every device (the service's device
        // then comes from the service, not from its snapshot): each QP with its
        // owner's pid and comm.
        for netdev in [vec!["--netdev", s.ifname()], vec![]] {
            let mut args = vec!["res", "qp"];
            args.extend(&netdev);
            let o = s.root(&args).output().unwrap();
            assert!(o.status.success(), "{args:?}: {}", text(&o));
            let t = out(&o);
            for (pid, qpn) in [(me, i64::from(root_qpn)), (npid, nqpn)] {
                assert!(
                    t.lines().any(|l| l.contains(&format!("lqpn {qpn} "))
                        && l.contains(&format!("pid {pid} comm {comm}"))),
                    "{args:?}: QP {qpn} of pid {pid}: {t}"
                );
            }
            let mut v = vec![common::xrnic_bin()];
            v.extend(&args);
            let o = s.as_nobody(&v).output().unwrap();
            assert!(o.status.success(), "{args:?} as nobody: {}", text(&o));
            let t = out(&o);
            assert!(
                !t.contains(&format!("pid {me} ")) && t.contains(&format!("pid {npid} ")),
                "{args:?}: nobody's text listing: {t}"
            );
        }
        att.stop();
        tx.send(()).unwrap();
    });
}

/// Item: `xrnic res` lists any number of objects: a client with 4 100 MRs (more than one
/// message of the service's socket holds) is listed whole, as JSON and as text.
#[test]
#[ignore = "needs root"]
fn res_lists_a_client_with_thousands_of_mrs() {
    const N: usize = 4100;
    let s = Svc::start();
    let ifname = s.ifname().to_string();
    let (tx, rx) = mpsc::channel::<()>();
    let (rtx, rrx) = mpsc::channel();
    let pair = &s.pair;
    std::thread::scope(|sc| {
        // Dropped when this closure ends, even by a failed assertion: the client's
        // thread then lets go and the scope ends.
        let tx = tx;
        sc.spawn(move || {
            pair.run_in(Side::A, move || {
                let d = Device::open(&ifname).unwrap();
                let pd = d.alloc_pd().unwrap();
                let mrs: Vec<_> = (0..N)
                    .map(|_| pd.reg_mr(64, Access::ALL).unwrap())
                    .collect();
                rtx.send(()).unwrap();
                let _ = rx.recv();
                drop((mrs, pd, d));
            })
            .unwrap();
        });
        rrx.recv_timeout(Duration::from_secs(300)).unwrap();
        let me = i64::from(std::process::id());
        let v = res_json(&s, true, Some("mr"));
        let mine = v.iter().filter(|e| e["pid"] == me && e["kind"] == "mr");
        assert_eq!(mine.count(), N);
        let o = s
            .root(&["res", "mr", "--netdev", s.ifname()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(
            out(&o)
                .lines()
                .filter(|l| l.contains(&format!("pid {me} ")))
                .count(),
            N
        );
        tx.send(()).unwrap();
    });
}
