//! The device service's addresses as a privilege boundary (docs/rnic.md "One device,
//! many processes", docs/security.md): a client running as nobody, through the Rust API
//! connected to `xrnic up IF`,
//! - asks for address handles and QP paths to on-link addresses nobody answers, from
//!   several connections at once: only its own calls wait (and then fail with
//!   ETIMEDOUT); another user's verbs are served meanwhile, the service lives on;
//! - puts a destination MAC and a VLAN tag of its choosing in an AH and in a QP's
//!   address vector: no frame with that MAC or any tag leaves (a capture on the bridge
//!   port towards the service's interface), the frames go to the MAC the service
//!   resolved, and the tag is refused with EPERM.
//!
//! Root tests (`#[ignore = "needs root"]`, docs/testing.md); the attacker is this test
//! binary run again as nobody in the service's namespace (`SECNET_ROLE` names its part).

mod common;
mod service_support;

use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use common::{text, xrnic_bin};
use service_support::RcPair;
use xrnic_netns::{Side, VethPair};

/// The MAC the attacker asks for.
const EVIL_MAC: [u8; 6] = [0x02, 0xde, 0xad, 0xbe, 0xef, 0x01];
/// The VLAN it asks for.
const EVIL_VID: u16 = 100;

/// The service up on A's interface of `pair`; `xrnic down` on drop.
struct Up<'a> {
    pair: &'a VethPair,
}

impl<'a> Up<'a> {
    fn start(pair: &'a VethPair) -> Up<'a> {
        let o = Command::new("ip")
            .args(["netns", "exec", &pair.end(Side::A).netns, xrnic_bin()])
            .args(["up", &pair.end(Side::A).ifname])
            .output()
            .unwrap();
        assert!(o.status.success(), "xrnic up: {}", text(&o));
        Up { pair }
    }

    fn ifname(&self) -> &str {
        &self.pair.end(Side::A).ifname
    }

    /// `xrnic res --json` as root: the service answers.
    fn res(&self) -> serde_json::Value {
        let o = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.pair.end(Side::A).netns,
                "timeout",
                "20",
            ])
            .args([xrnic_bin(), "res", "--netdev", self.ifname(), "--json"])
            .output()
            .unwrap();
        assert!(o.status.success(), "xrnic res: {}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    /// This test binary, running test `name`, as nobody in A with `env`; its stdout piped.
    fn attacker(&self, name: &str, env: &[(&str, String)]) -> Child {
        let exe = std::env::current_exe().unwrap();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.pair.end(Side::A).netns])
            .args([
                "setpriv",
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
            ])
            .args(["timeout", "300"])
            .arg(exe)
            .args(["--exact", name, "--include-ignored", "--nocapture"])
            .env("SECNET_IF", self.ifname())
            .env_remove("CI")
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        c.spawn().unwrap()
    }
}

impl Drop for Up<'_> {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.pair.end(Side::A).netns,
                "timeout",
                "30",
            ])
            .args([xrnic_bin(), "down", self.ifname()])
            .output();
    }
}

/// Everything else the attacker printed, for failure messages.
type Rest = Arc<Mutex<String>>;

/// The attacker's lines (`SECNET ...`) as they come, with when they came; the rest of its
/// output kept aside.
fn lines_of(child: &mut Child) -> (mpsc::Receiver<(Instant, String)>, Rest) {
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let rest = Rest::default();
    let (tx, rx) = mpsc::channel();
    let r = rest.clone();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            match l.strip_prefix("SECNET ") {
                Some(l) => {
                    let _ = tx.send((Instant::now(), l.to_string()));
                }
                None => r.lock().unwrap().push_str(&format!("{l}\n")),
            }
        }
    });
    let r = rest.clone();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            r.lock().unwrap().push_str(&format!("{l}\n"));
        }
    });
    (rx, rest)
}

fn say(what: &str) {
    println!("SECNET {what}");
}

/// The errno of a refused verb.
fn errno(e: &xrnic::verbs::Error) -> i32 {
    match e {
        xrnic::verbs::Error::Io(io) => io.raw_os_error().unwrap_or(-1),
        _ => -1,
    }
}

/// A's IPv4 and IPv6 (fd00::) GID indices.
fn gid_indices(d: &xrnic::verbs::Device) -> (u8, u8) {
    let mut v4 = None;
    let mut v6 = None;
    for i in 0..d.gid_table().len() as u8 {
        let g = d.query_gid(i.into()).unwrap();
        if g[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
            v4.get_or_insert(i);
        } else if g[0] == 0xfd {
            v6.get_or_insert(i);
        }
    }
    (v4.unwrap(), v6.unwrap())
}

/// Connections of the attacker, and calls each makes one after the other: a service that
/// waited for each in its one thread would stall everyone for 8 × 10 × 3 s.
const CONNS: usize = 8;
const CALLS: usize = 10;
/// CM REQs one more connection sends through the GSI relay, each to an address nobody
/// answers: QP1 holds them while their paths resolve.
const GSI_SENDS: usize = 20;

/// Requests one more connection, speaking the service's protocol itself, sends without
/// waiting for answers.
const PIPELINED: usize = 64;

/// The pipelined part of the attack: hello, a PD, then PIPELINED CreateAh to unanswered
/// IPv6 addresses sent back to back; the first two answers read (each said), then the
/// connection closed with the rest pending.
fn attack_pipelined(ifname: &str, sgid_index: u8, barrier: &std::sync::Barrier) {
    use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketType};
    use xrnic::ipc::{Req, Resp, socket_name};
    use xrnic::proto::AddressVector;
    let sock = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
    let addr = SocketAddrUnix::new_abstract_name(&socket_name(ifname)).unwrap();
    rustix::net::connect(&sock, &addr).unwrap();
    let send = |r: &Req| {
        let text = serde_json::to_vec(r).unwrap();
        rustix::net::send(&sock, &text, SendFlags::empty()).unwrap();
    };
    let recv = || -> Resp {
        // The hello's descriptors are not taken (the kernel closes them).
        let mut b = vec![0u8; 65536];
        let n = rustix::net::recv(&sock, &mut b, RecvFlags::empty())
            .unwrap()
            .0;
        serde_json::from_slice(&b[..n]).unwrap()
    };
    send(&Req::Hello { comm: "raw".into() });
    assert!(matches!(recv(), Resp::Hello { .. }));
    send(&Req::AllocPd);
    let Resp::Pd { pd } = recv() else {
        panic!("alloc_pd")
    };
    barrier.wait();
    for n in 0..PIPELINED as u16 {
        let ip = std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x9900 + n);
        let av = AddressVector {
            dgid: ip.octets(),
            sgid_index,
            ..AddressVector::default()
        };
        send(&Req::CreateAh { pd, av });
    }
    for i in 0..2 {
        match recv() {
            Resp::Err { errno, .. } => say(&format!("raw {i} errno {errno}")),
            r => say(&format!("raw {i} {r:?}")),
        }
    }
}

/// The GSI part of the attack: REQs of a CM in this client's comm-ID block, each to
/// another unanswered address; each send said with its answer.
fn attack_gsi(ifname: &str, barrier: &std::sync::Barrier) {
    use xrnic::cm::{Cm, CmConfig, ConnParam, Path};
    let d = xrnic::verbs::Device::open(ifname).unwrap();
    let relay = d.gsi_relay().unwrap().expect("the service's relay");
    let (v4, _) = gid_indices(&d);
    let local = d.query_gid(v4.into()).unwrap();
    let mut cm = Cm::new(CmConfig {
        comm_ids: Some(relay.comm_ids()),
        ..CmConfig::default()
    });
    barrier.wait();
    for j in 0..GSI_SENDS {
        let path = Path {
            local_gid: local,
            remote_gid: xrnic::wire::ipv4_gid([192, 0, 2, 200 + j as u8]),
            mtu: 3,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        };
        let p = ConnParam {
            qpn: 0x99,
            ..ConnParam::default()
        };
        cm.connect(xrnic::proto::Instant::ZERO, 0x1234, path, p);
        while let Some(t) = cm.poll_transmit() {
            match relay.send(&t.to, &t.mad) {
                Ok(()) => say(&format!("gsi {j} ok")),
                Err(e) => say(&format!("gsi {j} errno {}", errno(&e))),
            }
        }
    }
}

/// The attacker of `unanswered_neighbours_stall_only_the_client_that_asked`: CONNS
/// connections, each on a thread of its own, each making CALLS address handles (half
/// of them) or QP paths (the others) to on-link addresses nobody answers, IPv4 and IPv6.
fn attack_unanswered(ifname: &str) {
    use xrnic::verbs::{AddressVector, ConnectOpts, Device, QpInitAttr, Remote};
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(CONNS + 2));
    let gsi = {
        let (ifname, barrier) = (ifname.to_string(), barrier.clone());
        std::thread::spawn(move || attack_gsi(&ifname, &barrier))
    };
    let raw = {
        let (ifname, barrier) = (ifname.to_string(), barrier.clone());
        let (_, v6) = gid_indices(&Device::open(&ifname).unwrap());
        std::thread::spawn(move || attack_pipelined(&ifname, v6, &barrier))
    };
    let threads: Vec<_> = (0..CONNS)
        .map(|k| {
            let (ifname, barrier) = (ifname.to_string(), barrier.clone());
            std::thread::spawn(move || {
                let d = Device::open(&ifname).unwrap();
                assert!(d.service_pid().is_some(), "through the service");
                let (v4, v6) = gid_indices(&d);
                let pd = d.alloc_pd().unwrap();
                let cq = d.create_cq(4).unwrap();
                let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 4)).unwrap();
                barrier.wait();
                for j in 0..CALLS {
                    let n = (k * CALLS + j) as u16 + 100;
                    let (gid, sgid) = if (k + j) % 2 == 0 {
                        (xrnic::wire::ipv4_gid([192, 0, 2, n as u8]), v4)
                    } else {
                        let ip = std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x7700 + n);
                        (ip.octets(), v6)
                    };
                    say(&format!("sent {k} {j}"));
                    let r = if k % 2 == 0 {
                        pd.create_ah(&AddressVector {
                            dgid: gid,
                            sgid_index: sgid,
                            ..AddressVector::default()
                        })
                        .map(|_| ())
                    } else {
                        let to = Remote {
                            qpn: xrnic::verbs::Qpn::new(0x77),
                            psn: 0,
                            gid,
                        };
                        qp.connect(&to, 0, sgid, &ConnectOpts::default())
                    };
                    match r {
                        Ok(()) => say(&format!("answer {k} {j} ok")),
                        Err(e) => say(&format!("answer {k} {j} errno {}", errno(&e))),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    gsi.join().unwrap();
    raw.join().unwrap();
    say("done");
}

/// The victim: two connections of root's to the service, an RC pair between them and a
/// SEND whose bytes arrive. Each step said on `tx`.
fn victim(netns: &str, ifname: &str, tx: mpsc::Sender<String>) {
    use xrnic::verbs::{RecvWr, SendWr, WcStatus, WrOpcode};
    let f = std::fs::File::open(format!("/run/netns/{netns}")).unwrap();
    // SAFETY: setns(2) on this thread with a namespace file it holds open.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns");
    let _ = tx.send("opening".into());
    let p = RcPair::connect(ifname);
    assert!(p.a.service_pid().is_some() && p.b.service_pid().is_some());
    let _ = tx.send("connected".into());
    p.ma.write(0, b"the victim's bytes").unwrap();
    p.qb.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![p.mb.sge(0, 64)],
    })
    .unwrap();
    let mut wr = SendWr::new(2, WrOpcode::Send);
    wr.sg_list = vec![p.ma.sge(0, 18)];
    p.qa.post_send(wr).unwrap();
    for cq in [&p.ca, &p.cb] {
        let wc = cq.wait(1, Duration::from_secs(10));
        assert_eq!(wc.len(), 1);
        assert_eq!(wc[0].status, WcStatus::Success);
    }
    let mut got = [0u8; 18];
    p.mb.read(0, &mut got).unwrap();
    assert_eq!(&got, b"the victim's bytes");
    let _ = tx.send("done".into());
}

/// Issue: CreateAh / ModifyQp to an on-link address nobody answers held the service's
/// one thread for the whole neighbour resolution (3 s each), so every other client
/// waited. Now the attacker's calls wait for their own resolution only: root's victim
/// opens the device, connects an RC pair and moves a SEND while the attacker's
/// resolutions are still pending; each of the attacker's calls then fails with
/// ETIMEDOUT; the service still answers.
#[test]
#[ignore = "needs root"]
fn unanswered_neighbours_stall_only_the_client_that_asked() {
    if std::env::var("SECNET_ROLE").as_deref() == Ok("unanswered") {
        return attack_unanswered(&std::env::var("SECNET_IF").unwrap());
    }
    let pair = VethPair::new(1500).expect("veth pair (root)");
    let up = Up::start(&pair);
    let mut attacker = service_support::Kid(Some(up.attacker(
        "unanswered_neighbours_stall_only_the_client_that_asked",
        &[("SECNET_ROLE", "unanswered".into())],
    )));
    let (lines, rest) = lines_of(attacker.child());
    // Every connection made its first call.
    let mut seen = Vec::new();
    while seen
        .iter()
        .filter(|l: &&String| l.starts_with("sent "))
        .count()
        < CONNS
    {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok((_, l)) => seen.push(l),
            Err(_) => panic!(
                "the attacker did not start: {seen:?} {}",
                rest.lock().unwrap()
            ),
        }
    }
    let (tx, steps) = mpsc::channel();
    let (netns, ifname) = (pair.end(Side::A).netns.clone(), up.ifname().to_string());
    std::thread::spawn(move || victim(&netns, &ifname, tx));
    // Bounded liveness: the victim is served while the attack goes on (a service that
    // waited for each of the attacker's resolutions in its thread would take minutes).
    let limit = Instant::now() + Duration::from_secs(20);
    let mut done = Vec::new();
    while done.last().map(String::as_str) != Some("done") {
        let left = limit.saturating_duration_since(Instant::now());
        match steps.recv_timeout(left) {
            Ok(s) => done.push(s),
            Err(_) => panic!("the victim was not served within 20 s: its steps {done:?}"),
        }
    }
    let victim_done = Instant::now();
    // The attacker's answers so far: its calls are still pending.
    let mut answers: Vec<(Instant, String)> = Vec::new();
    // Lines the start-up wait above took (under load the GSI sends can begin before every
    // connection made its first call) count with the rest.
    let from_seen =
        |p: &str| -> Vec<String> { seen.iter().filter(|l| l.starts_with(p)).cloned().collect() };
    let (mut gsi, mut raw) = (from_seen("gsi "), from_seen("raw "));
    assert!(
        !seen.iter().any(|l| l.starts_with("answer ")),
        "an answer before the victim started: {seen:?}"
    );
    while let Ok((t, l)) = lines.try_recv() {
        if l.starts_with("answer ") {
            answers.push((t, l));
        } else if l.starts_with("gsi ") {
            gsi.push(l);
        } else if l.starts_with("raw ") {
            raw.push(l);
        }
    }
    assert!(
        answers.len() < CONNS * CALLS,
        "the victim finished while the attacker still waits: {answers:?}"
    );
    // All of the attacker's calls end, each in ETIMEDOUT (the kernel's address
    // resolution's end, drivers/infiniband/core/addr.c).
    let mut last = None;
    loop {
        match lines.recv_timeout(Duration::from_secs(120)) {
            Ok((_, l)) if l == "done" => break,
            Ok((t, l)) if l.starts_with("answer ") => {
                last = Some(t);
                answers.push((t, l));
            }
            Ok((_, l)) if l.starts_with("gsi ") => gsi.push(l),
            Ok((_, l)) if l.starts_with("raw ") => raw.push(l),
            Ok(_) => {}
            Err(_) => panic!(
                "the attacker did not finish: {answers:?} {}",
                rest.lock().unwrap()
            ),
        }
    }
    let status = attacker.child().wait().unwrap();
    assert!(status.success(), "attacker: {}", rest.lock().unwrap());
    assert_eq!(answers.len(), CONNS * CALLS, "{answers:?}");
    let timedout = format!("errno {}", libc::ETIMEDOUT);
    for (_, l) in &answers {
        assert!(l.ends_with(&timedout), "{l}");
    }
    assert!(
        victim_done < last.unwrap(),
        "the victim before the attacker's last answer"
    );
    // QP1 took each REQ (held until its path resolves, then dropped: no one answers).
    assert_eq!(gsi.len(), GSI_SENDS, "{gsi:?}");
    assert!(gsi.iter().all(|l| l.ends_with(" ok")), "{gsi:?}");
    // The pipelining connection's answers come in order, one resolution after the
    // other, each ETIMEDOUT; it left with the rest pending.
    let want: Vec<String> = (0..2)
        .map(|i| format!("raw {i} errno {}", libc::ETIMEDOUT))
        .collect();
    assert_eq!(raw, want);
    // The service lives and holds nothing of the attacker's.
    let res = up.res();
    assert_eq!(res.as_array().map(Vec::len), Some(0), "{res}");
}

/// The attacker of `client_macs_and_vlan_tags_never_leave_the_service`: an AH and an RC
/// QP path with EVIL_MAC, then both with VLAN EVIL_VID, each used to send a marked
/// payload (`M1`…`M4`, a UD `END` last).
fn attack_addresses(ifname: &str, peer: [u8; 16]) {
    use xrnic::verbs::{
        Access, AddressVector, AttrMask, Device, Mtu, Psn, QpAttr, QpInitAttr, QpState, Qpn,
        SendWr, WcStatus, WrOpcode,
    };
    let d = Device::open(ifname).unwrap();
    assert!(d.service_pid().is_some(), "through the service");
    let (v4, _) = gid_indices(&d);
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(64).unwrap();
    let mr = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let ud = pd.create_ud_qp(&QpInitAttr::new(&cq, &cq, 16)).unwrap();
    ud.ud_ready(0x1111, 1).unwrap();
    let evil = AddressVector {
        dgid: peer,
        sgid_index: v4,
        dmac: EVIL_MAC,
        ..AddressVector::default()
    };
    let tagged = AddressVector {
        vlan_tci: Some(EVIL_VID),
        ..evil
    };
    // Each payload at its own place (the service reads it when the engine sends).
    let at = |mark: &[u8]| 64 * usize::from(mark[mark.len() - 1] % 32);
    let send_ud = |ah: &xrnic::verbs::Ah, mark: &[u8]| {
        mr.write(at(mark), mark).unwrap();
        let mut wr = SendWr::new(9, WrOpcode::Send);
        wr.sg_list = vec![mr.sge(at(mark), mark.len() as u32)];
        ud.post_send_ud(wr, ah, Qpn::new(0x55), 0x1111).unwrap();
        let wc = cq.wait(1, Duration::from_secs(10));
        assert_eq!(wc.len(), 1);
        assert_eq!(wc[0].status, WcStatus::Success);
    };
    let ah = pd.create_ah(&evil).unwrap();
    say(&format!("ah dmac {:02x?}", ah.attr().dmac));
    send_ud(&ah, b"SECNET-MARK-M1");
    match pd.create_ah(&tagged) {
        Ok(t) => {
            say("ah vlan accepted");
            send_ud(&t, b"SECNET-MARK-M2");
        }
        Err(e) => say(&format!("ah vlan errno {}", errno(&e))),
    }
    // RC QPs whose paths carry EVIL_MAC, and EVIL_MAC with the tag.
    let rc = |av: AddressVector, mark: &[u8]| -> Result<xrnic::verbs::Qp, xrnic::verbs::Error> {
        let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 4)).unwrap();
        qp.modify(&QpAttr::rc_init(Access::ALL), AttrMask::RC_INIT)?;
        let mut a = QpAttr::rc_init(Access::ALL);
        a.qp_state = QpState::Rtr;
        a.path_mtu = Mtu::Mtu1024;
        a.dest_qp_num = Qpn::new(0x66);
        a.rq_psn = Psn::new(0);
        a.ah_attr = av;
        qp.modify(&a, AttrMask::RC_RTR)?;
        a.qp_state = QpState::Rts;
        a.timeout = 14;
        a.retry_cnt = 1;
        a.rnr_retry = 1;
        a.sq_psn = Psn::new(0);
        qp.modify(&a, AttrMask::RC_RTS)?;
        mr.write(at(mark), mark).unwrap();
        let mut wr = SendWr::new(3, WrOpcode::Send);
        wr.sg_list = vec![mr.sge(at(mark), mark.len() as u32)];
        qp.post_send(wr)?;
        Ok(qp)
    };
    let _rc1 = rc(evil, b"SECNET-MARK-M3").unwrap();
    let _rc2 = match rc(tagged, b"SECNET-MARK-M4") {
        Ok(q) => {
            say("qp vlan accepted");
            Some(q)
        }
        Err(e) => {
            say(&format!("qp vlan errno {}", errno(&e)));
            None
        }
    };
    send_ud(&ah, b"SECNET-MARK-END");
    say("done");
    // Stay until the capture has seen END (the RC QPs keep their frames going).
    let mut l = String::new();
    let _ = std::io::stdin().read_line(&mut l);
}

/// One frame seen on the bridge port: destination MAC, VLAN tag (in the frame or
/// taken off by the kernel, PACKET_AUXDATA) and the marker it carries, if any.
#[derive(Debug)]
struct Seen {
    dst: [u8; 6],
    src: [u8; 6],
    vlan: Option<u16>,
    mark: Option<String>,
}

/// Capture every frame on `port` of namespace `netns` (AF_PACKET, ETH_P_ALL) until a
/// frame carrying `SECNET-MARK-END` and the marks in `need` have been seen; each frame
/// sent on `tx`. `ready` is said once the socket is bound.
fn capture(
    netns: &str,
    port: &str,
    need: &[&str],
    ready: mpsc::Sender<()>,
) -> Result<Vec<Seen>, String> {
    let f = std::fs::File::open(format!("/run/netns/{netns}")).unwrap();
    // SAFETY: setns(2) on this thread with a namespace file it holds open.
    assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
    assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
    // SAFETY: fd was just returned by socket(2) and is owned here only.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let name = std::ffi::CString::new(port).unwrap();
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert!(ifindex > 0, "{port}");
    // SAFETY: sockaddr_ll is plain data; zero is a valid value.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = proto;
    sa.sll_ifindex = ifindex as i32;
    // SAFETY: sa is a sockaddr_ll of the size given.
    let r = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&raw const sa).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
    let on: libc::c_int = 1;
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 200_000,
    };
    // SAFETY: setsockopt(2) with values of the sizes given.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_AUXDATA,
            (&raw const on).cast(),
            4,
        );
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
    }
    ready.send(()).unwrap();
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(60);
    let mut buf = vec![0u8; 16384];
    let mut cbuf = [0u64; 16];
    loop {
        let have = |m: &str| seen.iter().any(|s: &Seen| s.mark.as_deref() == Some(m));
        if have("END") && need.iter().all(|m| have(m)) {
            return Ok(seen);
        }
        if Instant::now() > end {
            return Err(format!(
                "the capture did not see END and {need:?}: {seen:?}"
            ));
        }
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is plain data; zero is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        // SAFETY: msg points at buffers that live across the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &raw mut msg, 0) };
        if n < 14 {
            continue;
        }
        let frame = &buf[..n as usize];
        let mut vlan =
            (frame[12..14] == [0x81, 0x00]).then(|| u16::from_be_bytes([frame[14], frame[15]]));
        // SAFETY: CMSG_* walk the control buffer recvmsg filled, within msg_controllen.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_PACKET && (*c).cmsg_type == libc::PACKET_AUXDATA {
                    let aux = libc::CMSG_DATA(c)
                        .cast::<libc::tpacket_auxdata>()
                        .read_unaligned();
                    if aux.tp_status & libc::TP_STATUS_VLAN_VALID != 0 {
                        vlan = Some(aux.tp_vlan_tci);
                    }
                }
                c = libc::CMSG_NXTHDR(&raw const msg, c);
            }
        }
        let pat = b"SECNET-MARK-";
        let mark = frame.windows(pat.len()).position(|w| w == pat).map(|i| {
            let rest = &frame[i + pat.len()..];
            let len = rest
                .iter()
                .take_while(|b| b.is_ascii_alphanumeric())
                .count();
            String::from_utf8_lossy(&rest[..len]).into_owned()
        });
        seen.push(Seen {
            dst: frame[..6].try_into().unwrap(),
            src: frame[6..12].try_into().unwrap(),
            vlan,
            mark,
        });
    }
}

/// Issue: the service kept the `dmac` and `vlan_tci` a client put in an AH or a QP's
/// address vector: a frame to 02:de:ad:be:ef:01 tagged VID 100 with nobody's payload
/// left the interface. Now every frame goes to the MAC the service resolved (B's), none
/// carries a tag, and asking for one is EPERM.
#[test]
#[ignore = "needs root"]
fn client_macs_and_vlan_tags_never_leave_the_service() {
    if std::env::var("SECNET_ROLE").as_deref() == Ok("addresses") {
        let peer: std::net::Ipv4Addr = std::env::var("SECNET_PEER").unwrap().parse().unwrap();
        return attack_addresses(
            &std::env::var("SECNET_IF").unwrap(),
            xrnic::wire::ipv4_gid(peer.octets()),
        );
    }
    let pair = VethPair::observed(1500).expect("bridged veth pair (root)");
    let (mid, port) = pair.observer().unwrap();
    let (mid, port) = (mid.to_string(), port.to_string());
    let up = Up::start(&pair);
    let (ready_tx, ready) = mpsc::channel();
    let cap = std::thread::spawn(move || capture(&mid, &port, &["M1", "M3"], ready_tx));
    ready.recv().unwrap();
    let b = pair.end(Side::B).clone();
    let mut attacker = service_support::Kid(Some(up.attacker(
        "client_macs_and_vlan_tags_never_leave_the_service",
        &[
            ("SECNET_ROLE", "addresses".into()),
            ("SECNET_PEER", b.ipv4.to_string()),
        ],
    )));
    let (lines, rest) = lines_of(attacker.child());
    let seen = match cap.join().unwrap() {
        Ok(s) => s,
        Err(e) => {
            drop(attacker);
            let said: Vec<String> = lines.try_iter().map(|l| l.1).collect();
            panic!("{e}; the attacker said {said:?} {}", rest.lock().unwrap());
        }
    };
    let mut said = Vec::new();
    while let Ok((_, l)) = lines.recv_timeout(Duration::from_secs(10)) {
        let last = l == "done";
        said.push(l);
        if last {
            break;
        }
    }
    drop(attacker);
    let evil: Vec<&Seen> = seen.iter().filter(|s| s.dst == EVIL_MAC).collect();
    assert!(evil.is_empty(), "frames to the client's MAC left: {evil:?}");
    let tagged: Vec<&Seen> = seen.iter().filter(|s| s.vlan.is_some()).collect();
    assert!(tagged.is_empty(), "tagged frames left: {tagged:?}");
    // What A sent with the attacker's payloads (B's ICMP errors quote them back).
    let a_mac = pair.end(Side::A).mac;
    for s in seen.iter().filter(|s| s.mark.is_some() && s.src == a_mac) {
        assert_eq!(s.dst, b.mac, "to the resolved MAC (B's): {s:?}");
    }
    let eperm = |what: &str| format!("{what} vlan errno {}", libc::EPERM);
    assert!(said.contains(&eperm("ah")), "{said:?}");
    assert!(said.contains(&eperm("qp")), "{said:?}");
    assert!(
        said.contains(&format!("ah dmac {:02x?}", b.mac)),
        "{said:?}"
    );
    let res = up.res();
    assert!(res.is_array(), "the service answers: {res}");
}
