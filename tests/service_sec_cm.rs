//! The GSI relay delivers a MAD to a client only for a connection that client owns
//! (src/service/gsi.rs, docs/security.md, the local half): root's stock rping server
//! through A's service, its client on B's in-process device, pinging; user nobody, a
//! client of the same service, learns both comm IDs of that connection (here from a
//! capture on the bridge, as a sweep of DREQs once did through the relay's answers) and
//! sends through the relay DREQs, REPs and REJs (LocalCommID 0 too) naming the live ID
//! and its neighbours. Each is refused alike, nothing comes back, and rping goes on.
//! Root test (`#[ignore = "needs root"]`, docs/testing.md); the library must be built
//! (`cargo build --workspace`). This binary runs again as the attacker (its role given by
//! an environment variable).

mod common;

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{text, xrnic_bin};
use xrnic::wire::mad::{CmMsg, Dreq, Mad, MsgRef, Rej, Rep};
use xrnic_netns::{Side, VethPair};

const ROLE: &str = "XRNIC_SEC_CM_ATTACKER";
const NAME: &str = "a_nobody_client_cannot_end_or_probe_roots_rping_through_the_relay";
const PORT: &str = "7410";

/// A child killed (with its children: `timeout` runs the tool) when dropped.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .args(["-KILL", "-P", &self.0.id().to_string()])
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `xrnic down` when dropped.
struct Up<'a>(&'a VethPair);

impl Drop for Up<'_> {
    fn drop(&mut self) {
        let a = self.0.end(Side::A);
        let _ = Command::new("ip")
            .args(["netns", "exec", &a.netns, xrnic_bin(), "down", &a.ifname])
            .output();
        let _ = std::fs::remove_file(format!("/run/xrnic/service.{}.log", a.ifname));
    }
}

fn ipv4_gid(a: std::net::Ipv4Addr) -> [u8; 16] {
    a.to_ipv6_mapped().octets()
}

/// The first REP that A sends (seen on the bridge port towards A): its LocalCommID (A's
/// side of the connection) and RemoteCommID (B's). Waits up to 60 s.
fn sniff_rep(mid_ns: String, port: String) -> Option<(u32, u32)> {
    let ns = std::fs::File::open(format!("/run/netns/{mid_ns}")).unwrap();
    rustix::thread::move_into_link_name_space(
        ns.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .unwrap();
    let name = std::ffi::CString::new(port).unwrap();
    // SAFETY: socket(2), if_nametoindex(3), bind(2), setsockopt(2) with valid arguments;
    // the descriptor is owned by the OwnedFd.
    let fd = unsafe {
        let fd = libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW,
            (libc::ETH_P_ALL as u16).to_be() as i32,
        );
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        let fd = OwnedFd::from_raw_fd(fd);
        let mut sa: libc::sockaddr_ll = std::mem::zeroed();
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sa.sll_ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
        let r = libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        );
        assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 200_000,
        };
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
        fd
    };
    let end = Instant::now() + Duration::from_secs(60);
    let mut b = vec![0u8; 2048];
    while Instant::now() < end {
        // SAFETY: `b` is writable for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), 0) };
        if n <= 0 {
            continue;
        }
        let f = &b[..n as usize];
        // Ethernet, IPv4, UDP to 4791, BTH (12) and DETH (8) to QP1, the MAD.
        if f.len() < 14 + 20 + 8 + 20 + 256 || f[12..14] != [0x08, 0x00] || f[23] != 17 {
            continue;
        }
        let udp = 14 + usize::from(f[14] & 0x0f) * 4;
        let bth = udp + 8;
        if f[udp + 2..udp + 4] != [0x12, 0xb7] || f.len() < bth + 20 + 256 {
            continue;
        }
        if f[bth + 5..bth + 8] != [0, 0, 1] {
            continue;
        }
        if let Ok(Mad {
            msg: CmMsg::Rep(r), ..
        }) = Mad::parse(&f[bth + 20..bth + 20 + 256])
        {
            return Some((r.local_comm_id, r.remote_comm_id));
        }
    }
    None
}

fn mad(msg: CmMsg) -> Vec<u8> {
    Mad { tid: 0x5a5a, msg }.emit().to_vec()
}

fn dreq(local: u32, remote: u32) -> Vec<u8> {
    mad(CmMsg::Dreq(Box::new(Dreq {
        local_comm_id: local,
        remote_comm_id: remote,
        remote_qpn: 0x11,
        private_data: [0; 220],
    })))
}

fn rep(local: u32, remote: u32) -> Vec<u8> {
    mad(CmMsg::Rep(Box::new(Rep {
        local_comm_id: local,
        remote_comm_id: remote,
        local_qkey: 0,
        local_qpn: 0x12,
        local_eecn: 0,
        starting_psn: 1,
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 0,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 1,
        private_data: [0; 196],
    })))
}

fn rej(local: u32, remote: u32, of: MsgRef) -> Vec<u8> {
    mad(CmMsg::Rej(Box::new(Rej {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected: of,
        reject_info_length: 0,
        reason: 28,
        ari: [0; 72],
        private_data: [0; 148],
    })))
}

/// The attacker (as nobody, a client of A's service): `IF,V,P,GID` from [`ROLE`], V the
/// victim's comm ID, P its peer's, GID A's (hex). Prints what the relay did.
fn attack(arg: &str) {
    let f: Vec<&str> = arg.split(',').collect();
    let (ifname, v, p) = (
        f[0],
        f[1].parse::<u32>().unwrap(),
        f[2].parse::<u32>().unwrap(),
    );
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = u8::from_str_radix(&f[3][2 * i..2 * i + 2], 16).unwrap();
    }
    let dev = xrnic::verbs::Device::open(ifname).unwrap();
    assert!(dev.service_pid().is_some(), "not through the service");
    let relay = dev.gsi_relay().unwrap().expect("the GSI relay");
    let mine = relay.comm_ids().0 + 1;
    let (mut ok, mut refused, mut other) = (0, 0, Vec::new());
    for id in v.saturating_sub(16)..=v.saturating_add(16) {
        let mads = [
            dreq(mine, id),
            dreq(p, id),
            rep(mine, id),
            rej(0, id, MsgRef::Req),
            rej(mine, id, MsgRef::Rep),
        ];
        for m in &mads {
            match relay.send(&gid, m) {
                Ok(()) => ok += 1,
                Err(xrnic::verbs::Error::Io(e)) if e.raw_os_error() == Some(libc::EPERM) => {
                    refused += 1
                }
                Err(e) => other.push(e.to_string()),
            }
        }
    }
    let mut back = 0;
    for _ in 0..3 {
        back += relay.recv(Duration::from_millis(500)).unwrap().len();
    }
    println!(
        "\nCM ok={ok} refused={refused} back={back} other={}",
        other.join("|")
    );
}

/// rping's client output so far: the pings it printed.
fn pings(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("ping data: "))
        .count()
}

#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn a_nobody_client_cannot_end_or_probe_roots_rping_through_the_relay() {
    // This binary run again as the attacker (see the module comment): its role only.
    if let Ok(arg) = std::env::var(ROLE) {
        attack(&arg);
        return;
    }
    let rping = "/usr/bin/rping";
    assert!(std::path::Path::new(rping).exists(), "needs {rping}");
    let pair = VethPair::observed(1500).expect("bridged veth pair (root)");
    let (a, b) = (pair.end(Side::A), pair.end(Side::B));
    let (mid, port) = pair.observer().unwrap();
    let (mid, port) = (mid.to_string(), port.to_string());
    let in_ns = |ns: &str, args: &[&str]| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).args(args);
        c
    };
    let o = in_ns(&a.netns, &["ip", "link", "set", "lo", "up"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // As root once: `xrnic exec` makes its libibverbs.so.1 link next to the binary.
    let o = in_ns(&a.netns, &[xrnic_bin(), "exec", "--", "true"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = in_ns(&a.netns, &[xrnic_bin(), "up", &a.ifname])
        .output()
        .unwrap();
    assert!(o.status.success(), "xrnic up: {}", text(&o));
    let _up = Up(&pair);

    let sniffer = std::thread::spawn(move || sniff_rep(mid, port));
    let dir = std::env::temp_dir().join(format!("xrnic-sec-cm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (sout, cout) = (dir.join("server.out"), dir.join("client.out"));
    let addr = a.ipv4.to_string();
    // Root's server through A's service, and its client on B's in-process device.
    let tool = |ns: &str, ifname: &str, role: &str, out: &std::path::Path| {
        in_ns(
            ns,
            &[
                "timeout",
                "300",
                xrnic_bin(),
                "exec",
                "--netdev",
                ifname,
                "--",
                rping,
                role,
                "-a",
                &addr,
                "-p",
                PORT,
                "-S",
                "64",
                "-v",
            ],
        )
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
    };
    let mut server = Kid(tool(&a.netns, &a.ifname, "-s", &sout));
    // The client until it pings (the server's listen may not be up yet).
    let end = Instant::now() + Duration::from_secs(60);
    let mut client = loop {
        let mut c = Kid(tool(&b.netns, &b.ifname, "-c", &cout));
        let seen = Instant::now() + Duration::from_secs(10);
        while Instant::now() < seen && pings(&cout) < 5 && c.0.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
        if pings(&cout) >= 5 {
            break c;
        }
        drop(c);
        assert!(Instant::now() < end, "rping never connected");
        assert!(server.0.try_wait().unwrap().is_none(), "the server exited");
        std::thread::sleep(Duration::from_millis(200));
    };
    let (v, p) = sniffer
        .join()
        .unwrap()
        .expect("no REP from A seen on the bridge");

    // The attacker, as nobody in A.
    let gid: String = ipv4_gid(a.ipv4)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect();
    let me = std::env::current_exe().unwrap();
    let o = in_ns(
        &a.netns,
        &[
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "timeout",
            "120",
            me.to_str().unwrap(),
            "--exact",
            NAME,
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ],
    )
    .env(ROLE, format!("{},{v},{p},{gid}", a.ifname))
    .output()
    .unwrap();
    assert!(o.status.success(), "the attacker: {}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    let line = t.lines().find(|l| l.starts_with("CM ")).unwrap_or_default();

    // rping goes on: 20 more pings, both ends still running.
    let n0 = pings(&cout);
    let end = Instant::now() + Duration::from_secs(30);
    while pings(&cout) < n0 + 20 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let alive = (
        server.0.try_wait().unwrap().is_none(),
        client.0.try_wait().unwrap().is_none(),
    );
    let tail = std::fs::read_to_string(&cout).unwrap_or_default();
    let tail: String = tail.lines().rev().take(3).collect::<Vec<_>>().join("\n");
    assert!(
        pings(&cout) >= n0 + 20 && alive == (true, true),
        "rping after the attack: {} pings after {n0}, (server, client) running {alive:?}; \
         the attacker: {line}; the client's last lines:\n{tail}",
        pings(&cout)
    );
    // Every MAD refused alike (the live ID's as its neighbours'), nothing came back.
    assert_eq!(
        line,
        format!("CM ok=0 refused={} back=0 other=", 33 * 5),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
