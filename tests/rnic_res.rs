//! `xrnic res qp|mr|cq` on live devices: two xrnic devices on a veth pair in two network
//! namespaces (verbs API, this process) with a connected QP pair; `xrnic res` runs as
//! another process in each namespace (`ip netns exec`) and reads the driver's snapshots.
//! Both QPs RTS with their PSNs, MRs with their lengths, CQ users; a WRITE with a bad
//! R_Key drives the requester into ERR and `res` shows it; `--json` parses; the snapshot
//! is removed on close; a device killed without closing is stale; missing
//! devices are a clear error with exit 1. The root tests are `#[ignore = "needs root"]`
//! (docs/testing.md).

mod common;
use common::xrnic_bin;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::text;
use xrnic::verbs::{
    Access, ConnectOpts, Cq, Device, DeviceOptions, Mr, Mtu, Qp, QpInitAttr, QpState, Remote,
    SendWr, WcStatus, WorkCompletion, WrOpcode,
};
use xrnic::wire::Rkey;
use xrnic_netns::{Side, VethPair};

/// A guard against hanging, not a performance threshold.
const PATIENCE: Duration = Duration::from_secs(10);
const PSN_A: u32 = 0x123456;
const PSN_B: u32 = 0xfffff0;

/// A scratch snapshot directory, removed on drop (also when the test fails).
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "xrnic-res-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).expect("scratch dir");
        Scratch(d)
    }
    fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp dir")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `xrnic ARGS` in `side`'s namespace.
fn xrnic(pair: &VethPair, side: Side, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", &pair.end(side).netns, xrnic_bin()])
        .args(args)
        .output()
        .expect("run xrnic")
}

/// Run `xrnic ARGS` until its output satisfies `want` (the snapshot is rewritten every
/// stat interval); fails with the last output after [`PATIENCE`].
fn xrnic_until(pair: &VethPair, side: Side, args: &[&str], want: impl Fn(&str) -> bool) -> String {
    let mut waited = Duration::ZERO;
    loop {
        let o = xrnic(pair, side, args);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        if o.status.success() && want(&out) {
            return out;
        }
        assert!(waited < PATIENCE, "xrnic {args:?}: {}", text(&o));
        std::thread::sleep(Duration::from_millis(20));
        waited += Duration::from_millis(20);
    }
}

/// The line of QP `qpn` in `xrnic res qp` output.
fn qp_line(out: &str, qpn: u32) -> &str {
    out.lines()
        .find(|l| l.contains(&format!(" lqpn {qpn} ")))
        .unwrap_or_else(|| panic!("no line for QP {qpn} in:\n{out}"))
}

/// `ibv_qp_state` spelling, as `rdma resource show` prints it.
fn state_name(s: QpState) -> &'static str {
    xrnic::driver::state_name(s)
}

struct End {
    dev: Device,
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn open_end(pair: &VethPair, side: Side, opts: &DeviceOptions, mr_len: usize) -> End {
    let dev = pair
        .run_in(side, || Device::open_with(&pair.end(side).ifname, opts))
        .expect("enter netns")
        .unwrap_or_else(|e| panic!("open device on side {side:?}: {e}"));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256).unwrap();
    let mr = pd.reg_mr(mr_len, Access::ALL).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(&cq, &cq, 64)).unwrap();
    End { dev, cq, mr, qp }
}

fn connect(a: &End, b: &End) {
    let o = ConnectOpts {
        access: Access::ALL,
        path_mtu: Mtu::Mtu1024,
        ..ConnectOpts::default()
    };
    let gid = |d: &Device| d.query_gid(1).expect("gid 1");
    let remote = |e: &End, psn| Remote {
        qpn: e.qp.qp_num(),
        psn,
        gid: gid(&e.dev),
    };
    a.qp.connect(&remote(b, PSN_B), PSN_A, 1, &o)
        .expect("connect a");
    b.qp.connect(&remote(a, PSN_A), PSN_B, 1, &o)
        .expect("connect b");
}

fn wait_one(cq: &Cq) -> WorkCompletion {
    let wcs = cq.wait(1, PATIENCE);
    assert_eq!(wcs.len(), 1, "no completion within the patience guard");
    wcs[0]
}

fn write(a: &End, b: &End, len: u32, rkey: Rkey) -> WorkCompletion {
    let mut wr = SendWr::new(1, WrOpcode::RdmaWrite);
    wr.sg_list = vec![a.mr.sge(0, len)];
    wr.rdma.remote_addr = b.mr.addr();
    wr.rdma.rkey = rkey;
    a.qp.post_send(wr).unwrap();
    wait_one(&a.cq)
}

#[test]
#[ignore = "needs root"]
fn res_shows_a_connected_pair_an_err_qp_json_and_no_snapshot_after_close() {
    let pair = VethPair::new(1500).expect("veth pair");
    let dir = Scratch::new("pair");
    let d = dir.path();
    let opts = DeviceOptions {
        stat_dir: Some(dir.0.clone()),
        // Fresh snapshots sooner than the default 500 ms: a shorter test, no threshold.
        stat_interval: Duration::from_millis(50),
        ..DeviceOptions::default()
    };
    let (ifa, ifb) = (
        pair.end(Side::A).ifname.clone(),
        pair.end(Side::B).ifname.clone(),
    );
    let a = open_end(&pair, Side::A, &opts, 65536);
    let b = open_end(&pair, Side::B, &opts, 8192);
    connect(&a, &b);
    let (qa, qb) = (a.qp.qp_num().value(), b.qp.qp_num().value());

    // 4096 bytes at path MTU 1024: 4 request packets, so A's next PSN and B's expected
    // PSN both move from PSN_A to PSN_A + 4; B sent no request.
    let wc = write(&a, &b, 4096, b.mr.rkey());
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    let moved = PSN_A + 4;
    let out = xrnic_until(
        &pair,
        Side::A,
        &["res", "qp", "--netdev", &ifa, "--dir", d],
        |o| o.contains(&format!(" sq-psn {moved} ")),
    );
    assert!(
        out.starts_with(&format!(
            "xrnic_{ifa} netdev {ifa} pid {}: running, snapshot of ",
            std::process::id()
        )),
        "{out}"
    );
    let l = qp_line(&out, qa);
    assert!(
        l.starts_with(&format!(
            "link xrnic_{ifa}/1 lqpn {qa} rqpn {qb} type RC state RTS "
        )),
        "{l}"
    );
    assert!(
        l.contains(&format!(
            " sq-psn {moved} una-psn {moved} rq-psn {PSN_B} sq-wrs 0 "
        )),
        "{l}"
    );
    assert!(
        l.contains(&format!(" pid {} comm ", std::process::id())),
        "{l}"
    );
    let out = xrnic_until(&pair, Side::B, &["res", "qp", "--dir", d], |o| {
        o.contains(&format!(" rq-psn {moved} "))
    });
    let l = qp_line(&out, qb);
    assert!(
        l.starts_with(&format!(
            "link xrnic_{ifb}/1 lqpn {qb} rqpn {qa} type RC state RTS "
        )),
        "{l}"
    );
    assert!(
        l.contains(&format!(" sq-psn {PSN_B} una-psn {PSN_B} rq-psn {moved} ")),
        "{l}"
    );

    // MRs with their lengths; without --netdev only this namespace's device is listed.
    let o = xrnic(&pair, Side::A, &["res", "mr", "--dir", d]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("dev xrnic_{ifa} mrlen 65536 lkey 0x")),
        "{t}"
    );
    assert!(
        !out.contains(&ifb),
        "B's device is in another namespace: {t}"
    );
    let o = xrnic(&pair, Side::B, &["res", "mr", "--netdev", &ifb, "--dir", d]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("dev xrnic_{ifb} mrlen 8192 lkey 0x")),
        "{}",
        text(&o)
    );
    // One CQ for both queues of the one QP: two users, as ib_core counts them.
    let o = xrnic(&pair, Side::A, &["res", "cq", "--dir", d]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("dev xrnic_{ifa} cqn 0 cqe ")),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(" users 2 "),
        "{}",
        text(&o)
    );

    // A WRITE with a wrong R_Key: NAK remote access error, REM_ACCESS_ERR, A's QP in ERR.
    let bad = Rkey(b.mr.rkey().0 ^ 0x00ff_0000);
    let wc = write(&a, &b, 64, bad);
    assert_eq!(wc.status, WcStatus::RemAccessErr, "{wc:?}");
    assert_eq!(a.qp.query().unwrap().qp_state, QpState::Err);
    let out = xrnic_until(
        &pair,
        Side::A,
        &["res", "qp", "--netdev", &ifa, "--dir", d],
        |o| qp_line(o, qa).contains(" state ERR "),
    );
    assert!(out.contains(": running, "), "{out}");
    // The responder's state, whatever the engine made of the bad request, is what `res`
    // shows for B.
    let b_state = state_name(b.qp.query().unwrap().qp_state);
    xrnic_until(&pair, Side::B, &["res", "qp", "--dir", d], |o| {
        qp_line(o, qb).contains(&format!(" state {b_state} "))
    });

    // --json parses: one object per device, the QP in ERR, the MR's length.
    let o = xrnic(&pair, Side::A, &["res", "qp", "--json", "--dir", d]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("res --json");
    let devs = v.as_array().expect("an array");
    assert_eq!(devs.len(), 1, "{v}");
    assert_eq!(devs[0]["dev"], format!("xrnic_{ifa}"));
    assert_eq!(devs[0]["status"], "running");
    assert_eq!(devs[0]["pid"], std::process::id());
    let q = devs[0]["qp"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["qpn"] == qa)
        .expect("QP in json");
    assert_eq!(q["state"], "ERR", "{v}");
    assert_eq!(q["dest_qpn"], qb, "{v}");
    assert!(devs[0].get("mr").is_none(), "only the asked list: {v}");
    let o = xrnic(&pair, Side::A, &["res", "--json", "--dir", d]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("res --json");
    assert_eq!(v[0]["mr"][0]["pinned_bytes"], 65536, "{v}");
    assert_eq!(v[0]["cq"][0]["users"], 2, "{v}");

    // Missing devices: a clear message and exit 1.
    let o = xrnic(
        &pair,
        Side::A,
        &["res", "qp", "--netdev", "nosuch0", "--dir", d],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(o.stdout.is_empty(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("no xrnic device on nosuch0 in this network namespace"),
        "{}",
        text(&o)
    );
    let empty = Scratch::new("empty");
    let o = xrnic(&pair, Side::A, &["res", "qp", "--dir", empty.path()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no xrnic device in this network namespace"),
        "{}",
        text(&o)
    );

    // A snapshot a deleted namespace left under this namespace's inode (the kernel
    // reuses them): written for an interface this namespace does not have, it is not
    // listed, and asking for it by name says so.
    let mine = pair
        .run_in(Side::A, || {
            xrnic::verbs::stat_file(Path::new(d), &ifa).unwrap()
        })
        .unwrap();
    let mut left: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&mine).unwrap()).unwrap();
    assert!(left["link"]["ifindex"].as_u64().is_some(), "{left}");
    left["netdev"] = "gone0".into();
    let gone = mine.with_file_name(mine.file_name().unwrap().to_string_lossy().replacen(
        ifa.as_str(),
        "gone0",
        1,
    ));
    std::fs::write(&gone, left.to_string()).unwrap();
    let o = xrnic(&pair, Side::A, &["res", "--json", "--dir", d]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("res --json");
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{}", text(&o));
    assert_eq!(v[0]["dev"], format!("xrnic_{ifa}"));
    for cmd in ["res", "stat"] {
        let o = xrnic(&pair, Side::A, &[cmd, "--netdev", "gone0", "--dir", d]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("deleted network namespace"),
            "{}",
            text(&o)
        );
    }

    // Close: the verbs objects go first (each drop destroys its QP, MR, CQ), then the
    // driver removes its snapshot: `res` finds no device there.
    let live: serde_json::Value = serde_json::from_slice(&std::fs::read(&mine).unwrap()).unwrap();
    drop((a, b));
    assert!(!mine.exists(), "{} left after close", mine.display());
    let o = xrnic(&pair, Side::A, &["res", "qp", "--netdev", &ifa, "--dir", d]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    // The same file with another MAC is another interface's: not this namespace's device.
    let mut other = live;
    other["link"]["mac"] = "02:00:00:00:00:99".into();
    std::fs::write(&mine, other.to_string()).unwrap();
    std::fs::remove_file(&gone).unwrap();
    let o = xrnic(&pair, Side::A, &["res", "--dir", d]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no xrnic device in this network namespace"),
        "{}",
        text(&o)
    );
}

/// Removes the default-directory snapshot of an interface (also when the test fails).
struct DefaultSnapshot(PathBuf);

impl Drop for DefaultSnapshot {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
#[ignore = "needs root"]
fn res_of_another_xrnic_process_names_it_and_turns_stale_when_it_is_killed() {
    let pair = VethPair::new(1500).expect("veth pair");
    let ifb = pair.end(Side::B).ifname.clone();
    let file = pair
        .run_in(Side::B, || {
            xrnic::verbs::stat_file(Path::new(xrnic::verbs::STAT_DIR), &ifb).unwrap()
        })
        .unwrap();
    let _cleanup = DefaultSnapshot(file.clone());
    // A server waiting for a client: its device and its QP (INIT) stay up meanwhile.
    let mut server = Command::new("ip")
        .args(["netns", "exec", &pair.end(Side::B).netns, xrnic_bin()])
        .args(["rc-pingpong", "--netdev", &ifb, "-p", "18950"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start server");
    let pid = server.id();
    let out = xrnic_until(&pair, Side::B, &["res", "qp"], |o| {
        o.contains(" state INIT ")
    });
    let _ = server.kill();
    let _ = server.wait();
    // `ip netns exec` execs the program: the child's pid is xrnic's.
    assert!(
        out.starts_with(&format!("xrnic_{ifb} netdev {ifb} pid {pid}: running, ")),
        "{out}"
    );
    // The QPN is the device's random start (src/proto/device.rs `random_first_qpn`).
    assert!(
        out.lines().any(|l| {
            l.strip_prefix(&format!("link xrnic_{ifb}/1 lqpn "))
                .and_then(|r| r.split_once(' '))
                .is_some_and(|(n, r)| {
                    n.parse::<u32>()
                        .is_ok_and(|n| (0x11..=0xFF_FFFF).contains(&n))
                        && r.starts_with("rqpn 0 type RC state INIT ")
                })
        }),
        "{out}"
    );
    assert!(out.contains(&format!(" pid {pid} comm xrnic\n")), "{out}");
    // Killed without closing: the last snapshot still lists the QP, marked stale.
    let o = xrnic(&pair, Side::B, &["res", "qp", "--netdev", &ifb]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!(
            ": stale: pid {pid} is gone without closing the device"
        )),
        "{}",
        text(&o)
    );
    assert!(out.contains(" state INIT "), "{}", text(&o));
    assert!(file.exists(), "{}", file.display());
}
