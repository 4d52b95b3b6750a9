//! What the device service tests share (tests/service_stock.rs, tests/service_kill.rs,
//! tests/service_limits.rs):
//! a veth pair with the service up on side A (`Svc`), stock tools run as nobody through
//! `xrnic exec`, `xrnic res --json`, and children killed when a test ends early (`Kid`).
#![allow(dead_code)] // each test binary uses a different subset

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{all_output, retry_perftest, text, xrnic_bin};
use xrnic_netns::{Side, VethPair};

/// The stock tool's path; fails when it is not installed. A test that runs one carries
/// the cfg of its Debian package (build.rs; docs/testing.md).
pub fn tool(name: &str) -> String {
    let p = format!("/usr/bin/{name}");
    assert!(
        std::path::Path::new(&p).exists(),
        "{p} is missing: install rdma-core's tools and perftest (make deps)"
    );
    p
}

/// A veth pair with the service up on A's interface, `lo` up in A (the tools exchange
/// their QP numbers over TCP on 127.0.0.1).
pub struct Svc {
    pub pair: VethPair,
    /// A's interface renamed ([`Svc::start_renamed`]).
    renamed: Option<String>,
}

impl Svc {
    pub fn start() -> Svc {
        Svc::start_with(&[])
    }

    /// [`Svc::start`] with more options for `xrnic up` (`--max-qps N`, ...).
    pub fn start_with(up_args: &[&str]) -> Svc {
        Svc::start_full(up_args, None)
    }

    /// [`Svc::start`] with A's interface renamed to `name` first (UCX keeps 15
    /// characters of a device name, `xrnic_<IF>`, and finds no device by a cut one).
    pub fn start_renamed(name: &str) -> Svc {
        Svc::start_full(&[], Some(name))
    }

    fn start_full(up_args: &[&str], rename: Option<&str>) -> Svc {
        assert!(
            std::path::Path::new("/usr/bin/setpriv").exists(),
            "/usr/bin/setpriv is missing: install the Debian package util-linux"
        );
        let lib = std::path::Path::new(xrnic_bin()).with_file_name("libibverbs.so");
        assert!(
            lib.exists(),
            "{} missing: cargo build --workspace",
            lib.display()
        );
        let pair = VethPair::new(9000).expect("veth pair (root)");
        pair.exec(Side::A, &["ip", "link", "set", "lo", "up"])
            .unwrap();
        if let Some(name) = rename {
            rename_end(&pair, name);
        }
        let s = Svc {
            pair,
            renamed: rename.map(str::to_string),
        };
        // As root once: `xrnic exec` makes its libibverbs.so.1 link next to the binary.
        let o = s.root(&["exec", "--", "true"]).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let o = s
            .as_nobody(&["/usr/bin/test", "-r", lib.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "the unprivileged user cannot read {}: the tests need a path others can read",
            lib.display()
        );
        let mut up = vec!["up", s.ifname()];
        up.extend_from_slice(up_args);
        let o = s.root(&up).output().unwrap();
        assert!(o.status.success(), "xrnic up: {}", text(&o));
        s
    }

    pub fn ifname(&self) -> &str {
        self.renamed
            .as_deref()
            .unwrap_or(&self.pair.end(Side::A).ifname)
    }

    /// `xrnic ARGS` as root in A.
    pub fn root(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.pair.end(Side::A).netns, xrnic_bin()])
            .args(args);
        c
    }

    /// `CMD` as nobody in A, bounded by timeout(1).
    pub fn as_nobody(&self, cmd: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.pair.end(Side::A).netns])
            .args([
                "setpriv",
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
            ])
            .args(["timeout", "120"])
            .args(cmd);
        c
    }

    /// A stock tool as nobody through `xrnic exec`.
    pub fn tool(&self, args: &[&str]) -> Command {
        let mut v = vec![xrnic_bin(), "exec", "--netdev", self.ifname(), "--"];
        v.extend_from_slice(args);
        let mut c = self.as_nobody(&v);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }

    /// `xrnic res --netdev IF --json`: one object per resource.
    pub fn res(&self) -> Vec<serde_json::Value> {
        let o = self
            .root(&["res", "--netdev", self.ifname(), "--json"])
            .output()
            .unwrap();
        assert!(o.status.success(), "xrnic res: {}", text(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
            .as_array()
            .cloned()
            .unwrap()
    }

    /// Wait until something listens on TCP `port` in A.
    pub fn wait_listening(&self, port: u16) {
        for _ in 0..600 {
            let o = self
                .pair
                .exec(Side::A, &["ss", "-Hltn", &format!("sport = :{port}")])
                .unwrap();
            if !String::from_utf8_lossy(&o.stdout).trim().is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("nothing listens on port {port}");
    }

    /// Server then client of `prog args` on the same device; both outputs, both asserted
    /// to have exited 0. Run again (bounded) while perftest refuses to measure on a busy
    /// machine ([`retry_perftest`]).
    pub fn pair_run(&self, prog: &str, args: &[&str], port: u16) -> (Output, Output) {
        let (c, s) = retry_perftest(
            prog,
            || {
                let (s, c) = self.pair_spawn(prog, args, port);
                (c.wait_with_output().unwrap(), s.wait_with_output().unwrap())
            },
            |(c, s)| all_output(&[c, s]),
        );
        assert!(s.status.success(), "{prog} server: {}", text(&s));
        assert!(c.status.success(), "{prog} client: {}", text(&c));
        (s, c)
    }

    pub fn pair_spawn(&self, prog: &str, args: &[&str], port: u16) -> (Kid, Kid) {
        let p = port.to_string();
        let mut v = vec![prog];
        v.extend_from_slice(args);
        v.extend_from_slice(&["-p", &p]);
        let server = Kid(Some(self.tool(&v).spawn().unwrap()));
        self.wait_listening(port);
        v.push("127.0.0.1");
        let client = Kid(Some(self.tool(&v).spawn().unwrap()));
        (server, client)
    }

    /// Wait (bounded by `limit`) until the service holds no resource; the last listing.
    pub fn wait_empty(&self, limit: Duration) -> Vec<serde_json::Value> {
        let end = Instant::now() + limit;
        loop {
            let r = self.res();
            if r.is_empty() || Instant::now() > end {
                return r;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A child process killed if the test ends (or fails) before it was waited for.
pub struct Kid(pub Option<Child>);

impl Kid {
    pub fn wait_with_output(mut self) -> std::io::Result<Output> {
        self.0.take().unwrap().wait_with_output()
    }
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().unwrap()
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            // timeout(1) runs the tool as its child; kill both.
            let _ = Command::new("pkill")
                .args(["-KILL", "-P", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Svc {
    fn drop(&mut self) {
        let _ = self.root(&["down", self.ifname()]).output();
        // The daemon's log (`xrnic up`'s default place).
        let _ = std::fs::remove_file(format!("/run/xrnic/service.{}.log", self.ifname()));
    }
}

pub fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Two devices opened by this process on `ifname` (through the service when it is up),
/// each with a PD, a 16-entry CQ, a 4 KiB region and an RC QP, the two QPs connected to
/// each other (A sends from PSN 9, B from 7; all remote access).
pub struct RcPair {
    pub a: xrnic::verbs::Device,
    pub b: xrnic::verbs::Device,
    pub ca: xrnic::verbs::Cq,
    pub cb: xrnic::verbs::Cq,
    pub ma: xrnic::verbs::Mr,
    pub mb: xrnic::verbs::Mr,
    pub qa: xrnic::verbs::Qp,
    pub qb: xrnic::verbs::Qp,
}

impl RcPair {
    pub fn connect(ifname: &str) -> RcPair {
        use xrnic::verbs::{Access, ConnectOpts, Device, QpInitAttr, Remote};
        let (a, b) = (Device::open(ifname).unwrap(), Device::open(ifname).unwrap());
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
        let ma = pa.reg_mr(4096, Access::ALL).unwrap();
        let mb = pb.reg_mr(4096, Access::ALL).unwrap();
        let qa = pa.create_qp(&QpInitAttr::new(&ca, &ca, 16)).unwrap();
        let qb = pb.create_qp(&QpInitAttr::new(&cb, &cb, 16)).unwrap();
        let gid = a.query_gid(1).unwrap();
        let o = ConnectOpts {
            access: Access::ALL,
            ..Default::default()
        };
        let to = |q: &xrnic::verbs::Qp, psn| Remote {
            qpn: q.qp_num(),
            psn,
            gid,
        };
        qa.connect(&to(&qb, 7), 9, 1, &o).unwrap();
        qb.connect(&to(&qa, 9), 7, 1, &o).unwrap();
        RcPair {
            a,
            b,
            ca,
            cb,
            ma,
            mb,
            qa,
            qb,
        }
    }
}

/// Rename end A of `pair` to `name` (down, rename, up) and wait for its carrier.
pub fn rename_end(pair: &VethPair, name: &str) {
    let old = pair.end(Side::A).ifname.clone();
    for cmd in [
        vec!["ip", "link", "set", "dev", &old, "down"],
        vec!["ip", "link", "set", "dev", &old, "name", name],
        vec!["ip", "link", "set", "dev", name, "up"],
    ] {
        let o = pair.exec(Side::A, &cmd).unwrap();
        assert!(o.status.success(), "{cmd:?}: {o:?}");
    }
    let carrier = format!("/sys/class/net/{name}/carrier");
    let up = (0..200).any(|_| {
        let o = pair.exec(Side::A, &["cat", &carrier]).unwrap();
        let ok = String::from_utf8_lossy(&o.stdout).trim() == "1";
        if !ok {
            std::thread::sleep(Duration::from_millis(50));
        }
        ok
    });
    assert!(up, "{name} has no carrier");
}
