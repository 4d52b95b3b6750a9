//! A hostile-client fuzzer against one device service (docs/security.md, the local
//! half): several unprivileged clients (user nobody, each its own process: this test's
//! binary run again as nobody in A's namespace, the role given by an environment
//! variable) send random and mutated control messages (every `Req` variant with random
//! numbers, random bytes, truncated and oversized datagrams, random descriptors) and
//! random submission-ring slots for a bounded time, while an honest pair of clients (root,
//! this process) moves data over a loopback RC pair and checks every byte, and a newcomer
//! opens the device every 200 ms (each served within a bounded wait). Then: the
//! service is the same process and answers, the honest data stayed exact, and the
//! service holds as many descriptors as before the attackers came. Root test
//! (`#[ignore = "needs root"]`, docs/testing.md). The seed is printed; `XRNIC_FUZZ_SEED`
//! replays one.

mod common;
mod service_support;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::text;
use service_support::{Kid, RcPair, Svc};
use xrnic::io::shm::{self, Ring};
use xrnic::ipc::{self, Req};
use xrnic::proto::{AddressVector, AttrMask, QpAttr, QpType, SrqAttr, SrqAttrMask};
use xrnic::verbs::{RdmaInfo, SendWr, WcStatus, WrOpcode};
use xrnic_netns::Side;

/// Selects the attacker's role in a run of this binary (`IF,SEED,SECONDS`).
const ROLE: &str = "XRNIC_FUZZ_ATTACKER";
const ATTACKERS: u64 = 3;
const SECONDS: u64 = 20;

/// splitmix64: a small seeded generator (no dependency; replayable from the seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// A number as a fuzzer likes them: small, a boundary, or anything.
    fn number(&mut self) -> u64 {
        match self.below(6) {
            0 => self.below(4),
            1 => self.below(4096),
            2 => u64::from(u32::MAX) - self.below(2),
            3 => u64::MAX - self.below(2),
            4 => 1 << self.below(64),
            _ => self.next(),
        }
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// One request of each variant, with default fields (mutated before sending).
fn templates() -> Vec<serde_json::Value> {
    let reqs = vec![
        Req::Hello {
            comm: "fuzz".into(),
        },
        Req::AllocPd,
        Req::DeallocPd { pd: 1 },
        Req::RegMr {
            pd: 1,
            addr: 0x1000,
            len: 4096,
            iova: 0,
            access: 7,
        },
        Req::DeregMr { lkey: 1 },
        Req::CreateCq { cqe: 16 },
        Req::DestroyCq { cq: 1 },
        Req::CreateQp {
            pd: 1,
            send_cq: 1,
            recv_cq: 1,
            max_send_wr: 16,
            max_recv_wr: 16,
            sq_sig_all: true,
            qp_type: QpType::Ud,
            srq: None,
        },
        Req::ModifyQp {
            qpn: 1,
            attr: QpAttr::default(),
            mask: AttrMask::STATE,
        },
        Req::QueryQp { qpn: 1 },
        Req::DestroyQp { qpn: 1 },
        Req::CreateAh {
            pd: 1,
            av: AddressVector::default(),
        },
        Req::DestroyAh { ah: 1 },
        Req::AttachMcast {
            qpn: 1,
            gid: [0xff; 16],
            lid: 0,
        },
        Req::DetachMcast {
            qpn: 1,
            gid: [0xff; 16],
            lid: 0,
        },
        Req::McastGroups { qpn: 1 },
        Req::CreateSrq {
            pd: 1,
            attr: SrqAttr::default(),
        },
        Req::ModifySrq {
            srq: 1,
            attr: SrqAttr::default(),
            mask: SrqAttrMask::MAX_WR,
        },
        Req::QuerySrq { srq: 1 },
        Req::DestroySrq { srq: 1 },
        Req::AsyncEvents,
        Req::GsiOpen,
        Req::GsiListen { service_id: 1 },
        Req::GsiUnlisten { service_id: 1 },
        Req::GsiSend {
            to: [0; 16],
            mad: vec![0; 256],
        },
        Req::GsiRecv,
        Req::Res,
        Req::Shutdown,
    ];
    reqs.iter()
        .map(|r| serde_json::to_value(r).unwrap())
        .collect()
}

/// `v` with small numbers (handles a client may hold: valid requests more often than
/// not, so that objects get made and the paths past the decoder are taken).
fn mild(v: &serde_json::Value, rng: &mut Rng) -> serde_json::Value {
    use serde_json::Value as V;
    match v {
        V::Number(n) if rng.below(2) == 0 => V::Number(n.clone()),
        V::Number(_) => V::from(rng.below(8)),
        V::Array(a) => V::Array(a.iter().map(|x| mild(x, rng)).collect()),
        V::Object(o) => V::Object(o.iter().map(|(k, x)| (k.clone(), mild(x, rng))).collect()),
        x => x.clone(),
    }
}

/// `v` with its numbers random, now and then a string, a boolean or an array changed.
fn mutate(v: &serde_json::Value, rng: &mut Rng) -> serde_json::Value {
    use serde_json::Value as V;
    match v {
        V::Number(_) => match rng.below(8) {
            0 => V::from(-(rng.below(1 << 40) as i64)),
            1 => serde_json::json!(rng.next() as f64 / 3.0),
            _ => V::from(rng.number()),
        },
        V::Bool(_) => V::Bool(rng.below(2) == 0),
        V::String(_) => {
            let n = rng.below(40) as usize;
            V::String(String::from_utf8_lossy(&rng.bytes(n)).into())
        }
        V::Array(a) => {
            let mut out: Vec<V> = a.iter().map(|x| mutate(x, rng)).collect();
            match rng.below(6) {
                0 => out.truncate(rng.below(out.len() as u64 + 1) as usize),
                1 => out.extend((0..rng.below(300)).map(|_| V::from(rng.number() & 0xff))),
                _ => {}
            }
            V::Array(out)
        }
        V::Object(o) => {
            let mut out = serde_json::Map::new();
            for (k, x) in o {
                if rng.below(12) != 0 {
                    out.insert(k.clone(), mutate(x, rng));
                }
            }
            V::Object(out)
        }
        V::Null => match rng.below(3) {
            0 => V::from(rng.number()),
            _ => V::Null,
        },
    }
}

/// One attacker's connection: the socket, and what hello gave (the ring mapped).
struct Conn {
    sock: OwnedFd,
    ring: Option<Ring>,
    fds: Vec<OwnedFd>,
}

fn hello(ifname: &str) -> Option<Conn> {
    // A plain connect (an attacker trusts whatever listens).
    let sock = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .ok()?;
    let addr = rustix::net::SocketAddrUnix::new_abstract_name(&ipc::socket_name(ifname)).ok()?;
    rustix::net::connect(&sock, &addr).ok()?;
    let req = serde_json::to_vec(&Req::Hello {
        comm: "fuzz".into(),
    })
    .unwrap();
    shm::send_with_fds(sock.as_fd(), &req, &[]).ok()?;
    let (_, mut fds) = answer(&sock)?;
    let ring = (fds.len() == 4)
        .then(|| Ring::map(fds.remove(0), ipc::SQ_SLOTS, ipc::SQ_SLOT_BYTES).ok())
        .flatten();
    Some(Conn { sock, ring, fds })
}

/// The service's answer (bounded wait): its size and descriptors; `None` when the
/// service closed the connection, or did not answer within 10 s.
fn answer(sock: &OwnedFd) -> Option<(usize, Vec<OwnedFd>)> {
    let mut pfd = [rustix::event::PollFd::new(
        sock,
        rustix::event::PollFlags::IN,
    )];
    let ts = rustix::time::Timespec {
        tv_sec: 10,
        tv_nsec: 0,
    };
    match rustix::event::poll(&mut pfd, Some(&ts)) {
        Ok(n) if n > 0 => {}
        _ => return None,
    }
    let mut buf = vec![0u8; ipc::MAX_MSG];
    shm::recv_with_fds(sock.as_fd(), &mut buf, rustix::net::RecvFlags::DONTWAIT)
        .ok()
        .flatten()
}

/// The attacker's body: `IF,SEED,SECONDS` from [`ROLE`]. Prints what it did.
fn attack(arg: &str) {
    let mut it = arg.split(',');
    let (ifname, seed, secs) = (
        it.next().unwrap().to_string(),
        it.next().unwrap().parse::<u64>().unwrap(),
        it.next().unwrap().parse::<u64>().unwrap(),
    );
    let mut rng = Rng(seed);
    let tpl = templates();
    let own_efd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let null = std::fs::File::open("/dev/null").unwrap();
    let (pr, pw) = std::os::unix::net::UnixStream::pair().unwrap();
    let (mut sent, mut answered, mut dropped, mut slots) = (0u64, 0u64, 0u64, 0u64);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut conn: Option<Conn> = None;
    while Instant::now() < end {
        let Some(c) = conn.as_mut() else {
            conn = hello(&ifname);
            if conn.is_none() {
                dropped += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        };
        // Every other attacker stays well-formed (the service drops a client whose
        // datagram does not decode: the others start over often and build little).
        let kind = match rng.below(12) {
            6..=9 if seed % 2 == 0 => rng.below(6),
            k => k,
        };
        if kind >= 10 {
            // Random submission-ring slots, and the doorbell.
            if let Some(ring) = &c.ring {
                for _ in 0..=rng.below(64) {
                    let words: Vec<u64> = (0..ipc::SQ_WORDS).map(|_| rng.number()).collect();
                    let _ = ring.push(&words);
                    slots += 1;
                }
                if rng.below(8) == 0 {
                    ring.poke_producer(rng.next() as u32);
                }
            }
            if let Some(db) = c.fds.first() {
                let _ = rustix::io::write(db, &1u64.to_ne_bytes());
            }
            continue;
        }
        let data: Vec<u8> = match kind {
            0..=2 => {
                let t = &tpl[rng.below(tpl.len() as u64) as usize];
                serde_json::to_vec(&mild(t, &mut rng)).unwrap()
            }
            3..=5 => {
                let t = &tpl[rng.below(tpl.len() as u64) as usize];
                serde_json::to_vec(&mutate(t, &mut rng)).unwrap()
            }
            6 => {
                let n = rng.below(2048) as usize;
                rng.bytes(n)
            }
            7 => {
                let t = &tpl[rng.below(tpl.len() as u64) as usize];
                let mut v = serde_json::to_vec(t).unwrap();
                v.truncate(rng.below(v.len() as u64) as usize);
                v
            }
            8 => {
                // Oversized: as large as the socket takes (its send buffer bounds it).
                let n = 64 * 1024 + rng.below(200 * 1024) as usize;
                let mut v = b"{\"GsiSend\":{\"to\":[".to_vec();
                v.extend(std::iter::repeat_n(b'1', n));
                v
            }
            _ => {
                let t = &tpl[rng.below(tpl.len() as u64) as usize];
                serde_json::to_vec(t).unwrap()
            }
        };
        // Random descriptors with some messages.
        let pool: [BorrowedFd<'_>; 4] = [own_efd.as_fd(), null.as_fd(), pr.as_fd(), pw.as_fd()];
        let mut fds: Vec<BorrowedFd<'_>> = Vec::new();
        if kind == 9 || rng.below(8) == 0 {
            for _ in 0..=rng.below(3) {
                fds.push(pool[rng.below(4) as usize]);
            }
            if let Some(f) = c.fds.get(rng.below(4) as usize) {
                fds.push(f.as_fd());
            }
        }
        if shm::send_with_fds(c.sock.as_fd(), &data, &fds).is_err() {
            if kind != 8 {
                conn = None;
            }
            continue;
        }
        sent += 1;
        match answer(&c.sock) {
            Some((_, got)) => {
                answered += 1;
                // Keep a few of what the service handed over (ring memfds, eventfds):
                // descriptors to send back later, closed when the connection goes.
                if c.fds.len() < 16 {
                    c.fds.extend(got);
                }
            }
            None => {
                // Closed by the service (a client it drops), or no answer: start over.
                dropped += 1;
                conn = None;
            }
        }
    }
    println!("\nFUZZ sent={sent} answered={answered} dropped={dropped} slots={slots}");
}

/// How many descriptors process `pid` holds.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The honest pair: RDMA WRITEs then SENDs of a fresh pattern each round, every byte
/// checked, until `stop`; the rounds done. Each completion is waited for at most 20 s.
fn honest(ifname: String, stop: Arc<AtomicBool>, seed: u64) -> (u64, Option<u32>) {
    let p = RcPair::connect(&ifname);
    let pid = p.a.service_pid();
    let mut rng = Rng(seed ^ 0x5eed);
    let mut rounds = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let pattern = rng.bytes(4096);
        p.ma.write(0, &pattern).unwrap();
        let mut wr = SendWr::new(rounds, WrOpcode::RdmaWrite);
        wr.sg_list = vec![p.ma.sge(0, 4096)];
        wr.rdma = RdmaInfo {
            remote_addr: p.mb.addr(),
            rkey: p.mb.rkey(),
        };
        p.qa.post_send(wr).unwrap();
        let wc = p.ca.wait(1, Duration::from_secs(20));
        assert_eq!(
            wc.len(),
            1,
            "round {rounds}: no WRITE completion within 20 s"
        );
        assert_eq!(wc[0].status, WcStatus::Success, "round {rounds}");
        let mut got = vec![0u8; 4096];
        p.mb.read(0, &mut got).unwrap();
        assert!(got == pattern, "round {rounds}: the WRITE's bytes differ");
        // And back by SEND into A's region.
        p.ma.write(0, &[0u8; 4096]).unwrap();
        p.qa.post_recv(xrnic::verbs::RecvWr {
            wr_id: rounds,
            sg_list: vec![p.ma.sge(0, 4096)],
        })
        .unwrap();
        let mut wr = SendWr::new(rounds, WrOpcode::Send);
        wr.sg_list = vec![p.mb.sge(0, 4096)];
        p.qb.post_send(wr).unwrap();
        for cq in [&p.ca, &p.cb] {
            let wc = cq.wait(1, Duration::from_secs(20));
            assert_eq!(
                wc.len(),
                1,
                "round {rounds}: no SEND completion within 20 s"
            );
            assert_eq!(wc[0].status, WcStatus::Success, "round {rounds}");
        }
        p.ma.read(0, &mut got).unwrap();
        assert!(got == pattern, "round {rounds}: the SEND's bytes differ");
        rounds += 1;
    }
    (rounds, pid)
}

#[test]
#[ignore = "needs root"]
fn hostile_clients_neither_stop_the_service_nor_touch_an_honest_pair() {
    // This binary run again as an attacker (see the module comment): its role only.
    if let Ok(arg) = std::env::var(ROLE) {
        attack(&arg);
        return;
    }
    let seed = std::env::var("XRNIC_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("service_fuzz: seed {seed} (XRNIC_FUZZ_SEED={seed} replays it)");
    let s = Svc::start();
    let ifname = s.ifname().to_string();
    // The daemon `xrnic up` started (`xrnic up IF --foreground ...`), and its descriptors
    // with no client.
    let o = s
        .pair
        .exec(
            Side::A,
            &["pgrep", "-f", &format!("up {ifname} --foreground")],
        )
        .unwrap();
    let svc_pid: u32 = String::from_utf8_lossy(&o.stdout)
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no service process: {}", text(&o)));
    let baseline = fd_count(svc_pid);
    assert!(baseline > 0, "no /proc/{svc_pid}/fd");
    let stop = Arc::new(AtomicBool::new(false));
    let (st, name) = (stop.clone(), ifname.clone());
    let netns = s.pair.end(Side::A).netns.clone();
    let honest_pair = std::thread::spawn(move || {
        let ns = std::fs::File::open(format!("/run/netns/{netns}")).unwrap();
        rustix::thread::move_into_link_name_space(
            ns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .unwrap();
        honest(name, st, seed)
    });
    let me = std::env::current_exe().unwrap();
    let name = "hostile_clients_neither_stop_the_service_nor_touch_an_honest_pair";
    let kids: Vec<Kid> = (0..ATTACKERS)
        .map(|i| {
            let mut c = s.as_nobody(&[
                me.to_str().unwrap(),
                "--exact",
                name,
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ]);
            c.env(ROLE, format!("{ifname},{},{SECONDS}", seed.wrapping_add(i)))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            Kid(Some(c.spawn().unwrap()))
        })
        .collect();
    // Meanwhile a newcomer every 200 ms: a fresh client (root) opens the device, makes a
    // PD and a CQ and goes; each must be served (a bounded wait of 20 s, failing with
    // what was seen). The service's descriptors are watched too.
    let (mut newcomers, mut max_fds) = (0u64, baseline);
    let mut kids = kids;
    while kids
        .iter_mut()
        .any(|k| k.child().try_wait().unwrap().is_none())
    {
        let (tx, rx) = std::sync::mpsc::channel();
        let (pair_ns, n) = (s.pair.end(Side::A).netns.clone(), ifname.clone());
        std::thread::spawn(move || {
            let ns = std::fs::File::open(format!("/run/netns/{pair_ns}")).unwrap();
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap();
            let r = xrnic::verbs::Device::open(&n).and_then(|d| {
                let pd = d.alloc_pd()?;
                let cq = d.create_cq(4)?;
                drop((cq, pd));
                Ok(d.service_pid())
            });
            let _ = tx.send(r.map_err(|e| e.to_string()));
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(p)) => assert_eq!(p, Some(svc_pid), "newcomer {newcomers}"),
            Ok(Err(e)) => panic!("newcomer {newcomers} during the attack: {e}"),
            Err(_) => panic!("newcomer {newcomers}: not served within 20 s"),
        }
        newcomers += 1;
        max_fds = max_fds.max(fd_count(svc_pid));
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "newcomers served: {newcomers}; the service's descriptors: {baseline} before, at most {max_fds} during"
    );
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| k.wait_with_output().unwrap())
        .collect();
    stop.store(true, Ordering::SeqCst);
    let (rounds, pid) = honest_pair.join().expect("the honest pair failed");
    for o in &outs {
        assert!(o.status.success(), "an attacker: {}", text(o));
        let t = String::from_utf8_lossy(&o.stdout);
        let line = t
            .lines()
            .find(|l| l.starts_with("FUZZ "))
            .unwrap_or_default();
        eprintln!("attacker: {line}");
        assert!(line.contains("sent="), "{}", text(o));
    }
    assert!(rounds > 0, "the honest pair moved nothing");
    eprintln!("honest rounds: {rounds}");
    // The same service, still answering, with its descriptors back to the baseline.
    assert_eq!(pid, Some(svc_pid), "the honest pair's service");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let n = fd_count(svc_pid);
        if n == baseline {
            break;
        }
        assert!(
            Instant::now() < end,
            "the service holds {n} descriptors, {baseline} before the attackers"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = Command::new("ip")
        .args(["netns", "exec", &s.pair.end(Side::A).netns])
        .args(["kill", "-0", &svc_pid.to_string()])
        .output()
        .unwrap();
    assert!(o.status.success(), "the service is gone: {}", text(&o));
    let again = s.pair.run_in(Side::A, {
        let n = ifname.clone();
        move || xrnic::verbs::Device::open(&n).map(|d| d.service_pid())
    });
    assert_eq!(
        again.unwrap().unwrap(),
        Some(svc_pid),
        "a new client's service"
    );
}
