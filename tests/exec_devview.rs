//! Where programs look for a device (docs/verbs-abi.md "Where programs look for a
//! device", src/cli/devview.rs): plain `xrnic exec` shows the program
//! `/sys/class/infiniband/xrnic_IF/`, `/sys/class/infiniband_verbs/uverbsN/` and
//! `/dev/infiniband/uverbsN`, so that infiniband-diags' `ibstat` and `ibstatus`,
//! `ibv_devinfo -v` and UCX's `ucx_info -d` find the device unchanged; every sysfs value
//! equals what `ibv_query_port` / `ibv_query_gid` answer in the same program's namespace
//! (as `ibv_devinfo -v` prints them); the real sysfs stays visible beside the view. As
//! root and as user nobody (a user namespace of its own), through the device service on
//! one end of a veth pair, and as root in process. Inside nobody's user namespace root's
//! service shows as the overflow uid, as a squatter of another uid does: the squatter is
//! still refused and sent nothing.
//!
//! Root tests (`#[ignore = "needs root"]`, docs/testing.md); the library must be built
//! (`cargo build --workspace`); infiniband-diags, ibverbs-utils and ucx-utils installed
//! (build.rs ignores the tests without them, except under CI=true).

mod common;
mod service_support;

use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{text, xrnic_bin};
use service_support::Svc;
use xrnic_cli::cli::devview::rate_text;
use xrnic_netns::{Side, VethPair};

const IBSTAT: &str = "/usr/sbin/ibstat";
const IBSTATUS: &str = "/usr/sbin/ibstatus";
const DEVINFO: &str = "/usr/bin/ibv_devinfo";
const UCX_INFO: &str = "/usr/bin/ucx_info";
/// The section separator of [`SCRIPT`]'s output.
const SEP: &str = "@@@@";

/// What one program started by `xrnic exec` prints, `DEV` its device and `IF` its
/// interface, sections separated by [`SEP`]: `ibv_devinfo -v`; every file of the
/// device's sysfs directory as `path=content`; `ls /sys/class/net`; `ibstat`; `ibstatus`;
/// the view's other entries; `ucx_info -d`.
const SCRIPT: &str = r#"
set -e
dev=$1; if=$2; sep=$3
/usr/bin/ibv_devinfo -v -d "$dev"
echo "$sep"
cd "/sys/class/infiniband/$dev"
for f in $(find . -type f | sort); do printf '%s=%s\n' "$f" "$(cat "$f")"; done
echo "$sep"
ls /sys/class/net
echo "$sep"
/usr/sbin/ibstat "$dev"
echo "$sep"
/usr/sbin/ibstatus "$dev"
echo "$sep"
ls "/sys/class/infiniband/$dev/device/net"
cat /sys/class/infiniband_verbs/uverbs0/ibdev
test -c /dev/infiniband/uverbs0 && test -c /dev/infiniband/rdma_cm
cat /dev/infiniband/uverbs0 && echo uverbs0 reads
echo "$sep"
/usr/bin/ucx_info -d
"#;

fn prerequisites() {
    for p in [IBSTAT, IBSTATUS, DEVINFO, UCX_INFO] {
        assert!(
            std::path::Path::new(p).exists(),
            "{p} is missing: install infiniband-diags, ibverbs-utils and ucx-utils (make deps)"
        );
    }
}

/// `xrnic exec --netdev IF -- sh -c SCRIPT` in `netns`, as nobody or as root.
fn view_run(netns: &str, ifname: &str, nobody: bool) -> Output {
    let dev = format!("xrnic_{ifname}");
    let mut c = Command::new("ip");
    c.args(["netns", "exec", netns]);
    if nobody {
        c.args([
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
        ]);
    }
    c.args([
        "timeout",
        "120",
        xrnic_bin(),
        "exec",
        "--in-process",
        "--netdev",
        ifname,
        "--",
    ])
    .args(["sh", "-c", SCRIPT, "sh", &dev, ifname, SEP]);
    let o = c.output().unwrap();
    assert!(o.status.success(), "nobody {nobody}: {}", text(&o));
    o
}

/// `key: value` lines of `ibv_devinfo -v` (the first of each key) and its GID lines
/// (`GID[  i]: text, type`) in order.
fn devinfo_fields(s: &str) -> (HashMap<String, String>, Vec<(Ipv6Addr, String)>) {
    let mut kv = HashMap::new();
    let mut gids = Vec::new();
    for line in s.lines() {
        let Some((k, v)) = line.trim().split_once(':') else {
            continue;
        };
        let v = v.trim().to_string();
        if k.starts_with("GID[") {
            let (addr, kind) = v.split_once(", ").expect("GID line: text, type");
            gids.push((addr.parse().expect("a GID"), kind.to_string()));
        } else {
            kv.entry(k.trim().to_string()).or_insert(v);
        }
    }
    (kv, gids)
}

/// The number in parentheses at the end of an `ibv_devinfo` value: `PORT_ACTIVE (4)`.
fn paren_num(v: &str) -> u32 {
    let inner = v.rsplit_once('(').and_then(|(_, r)| r.strip_suffix(')'));
    inner
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no (N) in {v:?}"))
}

fn hex(v: &str) -> u32 {
    u32::from_str_radix(v.trim_start_matches("0x"), 16).unwrap_or_else(|e| panic!("{v}: {e}"))
}

/// Check everything [`SCRIPT`] printed for `ifname`, whose interface speed is `mbps`.
fn check_view(o: &Output, ifname: &str, mbps: u64) {
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let parts: Vec<&str> = out.split(SEP).collect();
    assert_eq!(parts.len(), 7, "{}", text(o));
    let dev = format!("xrnic_{ifname}");
    let (devinfo, gids) = devinfo_fields(parts[0]);
    assert!(
        parts[0].contains(&format!("hca_id:\t{dev}")),
        "{}",
        parts[0]
    );
    let sys: HashMap<&str, &str> = parts[1]
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim_start_matches("./"), v))
        .collect();
    let f = |k: &str| *sys.get(k).unwrap_or_else(|| panic!("no {k} in {sys:?}"));
    let d = |k: &str| {
        devinfo
            .get(k)
            .unwrap_or_else(|| panic!("no {k} in {}", parts[0]))
            .as_str()
    };

    // File by file: the sysfs values are what the device answers.
    assert_eq!(f("node_guid"), d("node_guid"));
    assert_eq!(f("sys_image_guid"), d("sys_image_guid"));
    assert_eq!(f("fw_ver"), d("fw_ver"));
    assert_eq!(f("node_type"), "1: CA");
    let port = |k: &str| f(&format!("ports/1/{k}"));
    assert_eq!(port("state"), "4: ACTIVE");
    assert_eq!(paren_num(d("state")), 4, "ibv_query_port: active");
    assert_eq!(port("phys_state"), "5: LinkUp");
    assert_eq!(paren_num(d("phys_state")), 5);
    assert_eq!(hex(port("lid")), d("port_lid").parse::<u32>().unwrap());
    assert_eq!(hex(port("sm_lid")), d("sm_lid").parse::<u32>().unwrap());
    assert_eq!(hex(port("cap_mask")), hex(d("port_cap_flags")));
    assert_eq!(port("link_layer"), d("link_layer"));
    assert_eq!(port("pkeys/0"), "0xffff");
    let (width, speed) = (paren_num(d("active_width")), paren_num(d("active_speed")));
    let rate = rate_text(width as u8, speed as u8);
    assert_eq!(port("rate"), rate, "ibv_query_port's width and speed");
    let (w, s) = xrnic::verbs::netdev::ib_width_speed(mbps);
    assert_eq!(rate, rate_text(w, s), "the interface's {mbps} Mb/s");
    assert!(!gids.is_empty(), "{}", parts[0]);
    for (i, (gid, kind)) in gids.iter().enumerate() {
        let g: Ipv6Addr = port(&format!("gids/{i}")).parse().expect("a GID");
        assert_eq!(&g, gid, "GID {i}");
        assert_eq!(
            port(&format!("gid_attrs/types/{i}")),
            kind,
            "GID {i}'s type"
        );
        assert_eq!(port(&format!("gid_attrs/ndevs/{i}")), ifname);
    }
    assert!(
        !sys.contains_key(format!("ports/1/gids/{}", gids.len()).as_str()),
        "as many GID files as ibv_query_port's gid_tbl_len"
    );

    // The real sysfs beside the view.
    let net: Vec<&str> = parts[2].split_whitespace().collect();
    assert!(
        net.contains(&ifname) && net.contains(&"lo"),
        "ls /sys/class/net: {net:?}"
    );

    // ibstat and ibstatus.
    let ibstat = parts[3];
    assert!(ibstat.contains(&format!("CA '{dev}'")), "{ibstat}");
    assert!(ibstat.contains("State: Active"), "{ibstat}");
    assert!(ibstat.contains("Physical state: LinkUp"), "{ibstat}");
    assert!(ibstat.contains("Link layer: Ethernet"), "{ibstat}");
    let gbps = rate.split(' ').next().unwrap();
    assert!(ibstat.contains(&format!("Rate: {gbps} ")), "{ibstat}");
    let ibstatus = parts[4];
    assert!(
        ibstatus.contains(&format!("Infiniband device '{dev}' port 1 status")),
        "{ibstatus}"
    );
    assert!(ibstatus.contains("state:\t\t 4: ACTIVE"), "{ibstatus}");
    assert!(
        ibstatus.contains(&format!("rate:\t\t {rate}")),
        "{ibstatus}"
    );

    // device/net/IF (rdma-core's suite), uverbs0, /dev/infiniband.
    let rest: Vec<&str> = parts[5].lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(
        rest,
        [ifname, dev.as_str(), "uverbs0 reads"],
        "{}",
        parts[5]
    );

    // UCX lists it.
    let ucx = parts[6];
    assert!(
        ucx.contains(&format!("Memory domain: {dev}")) && ucx.contains(&format!("Device: {dev}:1")),
        "ucx_info -d: {ucx}"
    );
}

/// A's interface speed (Mb/s) as its sysfs gives it.
fn speed(pair: &VethPair, ifname: &str) -> u64 {
    let o = pair
        .exec(Side::A, &["cat", &format!("/sys/class/net/{ifname}/speed")])
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

#[test]
#[cfg_attr(
    any(xrnic_no_infiniband_diags, xrnic_no_ibverbs_utils, xrnic_no_ucx_utils),
    ignore = "needs root, infiniband-diags, ibverbs-utils and ucx-utils"
)]
#[cfg_attr(
    not(any(xrnic_no_infiniband_diags, xrnic_no_ibverbs_utils, xrnic_no_ucx_utils)),
    ignore = "needs root"
)]
fn the_view_through_the_service_as_nobody_and_as_root() {
    prerequisites();
    // UCX keeps 15 characters of a device name (tests/ucx_stock.rs): a short one.
    let svc = Svc::start_renamed("dv0");
    let mbps = speed(&svc.pair, svc.ifname());
    let ns = svc.pair.end(Side::A).netns.clone();
    for nobody in [true, false] {
        let o = view_run(&ns, svc.ifname(), nobody);
        check_view(&o, svc.ifname(), mbps);
        assert!(
            !String::from_utf8_lossy(&o.stderr).contains("no device view"),
            "{}",
            text(&o)
        );
    }
    // nobody has no capability for the in-process path (AF_XDP, XDP): its ibv_devinfo
    // and ucx_info opened the device through root's service, which the user namespace
    // shows as the overflow uid (src/ipc/connect.rs `verified_outside`).
}

#[test]
#[cfg_attr(
    any(xrnic_no_infiniband_diags, xrnic_no_ibverbs_utils, xrnic_no_ucx_utils),
    ignore = "needs root, infiniband-diags, ibverbs-utils and ucx-utils"
)]
#[cfg_attr(
    not(any(xrnic_no_infiniband_diags, xrnic_no_ibverbs_utils, xrnic_no_ucx_utils)),
    ignore = "needs root"
)]
fn the_view_in_process_as_root() {
    prerequisites();
    let pair = VethPair::new(9000).expect("veth pair (root)");
    let name = "dv1";
    service_support::rename_end(&pair, name);
    let o = view_run(&pair.end(Side::A).netns, name, false);
    check_view(&o, name, speed(&pair, name));
}

/// A process of uid [`SQUATTER_UID`] holding `@xrnic/<IF>` in A's namespace (a child
/// forked in a thread that entered it, making only system calls); once it listens, and
/// then for each connection, it writes to a pipe: [`LISTENING`], then the size of the
/// first message each connection sent (0: nothing).
struct Squatter {
    pid: i32,
    records: OwnedFd,
}

/// The squatter's first record: it listens.
const LISTENING: u32 = u32::MAX;

/// Neither root nor nobody: inside nobody's user namespace it shows as the overflow uid,
/// as root's service does.
const SQUATTER_UID: u32 = 4242;

impl Squatter {
    fn start(pair: &VethPair, ifname: &str) -> Squatter {
        let name = xrnic::ipc::socket_name(ifname);
        pair.run_in(Side::A, move || {
            // SAFETY: all-zero is a valid sockaddr_un.
            let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (d, s) in addr.sun_path[1..].iter_mut().zip(&name) {
                *d = *s as libc::c_char;
            }
            let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as u32;
            let mut p = [0i32; 2];
            // SAFETY: `p` has room for the two descriptors.
            assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            // SAFETY: the child makes only async-signal-safe system calls on memory
            // prepared before the fork, then never returns.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork");
            if pid == 0 {
                // SAFETY: in the freshly forked child, valid address and pipe end.
                unsafe { squat(p[1], &addr, len) }
            }
            // SAFETY: p[1] is this process's and open; p[0] becomes the OwnedFd's.
            unsafe { libc::close(p[1]) };
            let sq = Squatter {
                pid,
                // SAFETY: p[0] is a fresh descriptor this process owns.
                records: unsafe { OwnedFd::from_raw_fd(p[0]) },
            };
            // Its first record says it listens ([`LISTENING`]), so no client runs before.
            let mut b = [0u8; 4];
            // SAFETY: `b` is 4 writable bytes; a blocking read of the child's record.
            let r = unsafe { libc::read(sq.records.as_raw_fd(), b.as_mut_ptr().cast(), 4) };
            assert!(
                r == 4 && u32::from_ne_bytes(b) == LISTENING,
                "the squatter failed"
            );
            sq
        })
        .unwrap()
    }

    /// The sizes recorded so far (waiting up to 2 s after the last one).
    fn records(&self) -> Vec<u32> {
        let mut got = Vec::new();
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end {
            let mut pfd = libc::pollfd {
                fd: self.records.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
                continue;
            }
            let mut b = [0u8; 4];
            // SAFETY: `b` is 4 writable bytes; the child writes records of 4 bytes.
            let r = unsafe { libc::read(self.records.as_raw_fd(), b.as_mut_ptr().cast(), 4) };
            if r != 4 {
                break;
            }
            got.push(u32::from_ne_bytes(b));
        }
        got
    }
}

impl Drop for Squatter {
    fn drop(&mut self) {
        // SAFETY: the child this struct forked.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// The squatter's body (see [`Squatter`]).
///
/// # Safety
/// `addr`/`len` a valid abstract address, `rec` a pipe's write end; call only in a
/// freshly forked child.
unsafe fn squat(rec: i32, addr: &libc::sockaddr_un, len: u32) -> ! {
    // SAFETY (the whole body): raw system calls on local memory, as the fn's contract says.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        let u = SQUATTER_UID;
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(u, u, u) != 0
            || libc::setresuid(u, u, u) != 0
        {
            libc::_exit(2);
        }
        let l = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
        if l < 0
            || libc::bind(l, (addr as *const libc::sockaddr_un).cast(), len) != 0
            || libc::listen(l, 16) != 0
        {
            libc::_exit(3);
        }
        libc::write(rec, (&LISTENING as *const u32).cast(), 4);
        let mut buf = [0u8; 4096];
        loop {
            let c = libc::accept(l, std::ptr::null_mut(), std::ptr::null_mut());
            if c < 0 {
                continue;
            }
            let n = libc::read(c, buf.as_mut_ptr().cast(), buf.len()).max(0) as u32;
            libc::write(rec, (&n as *const u32).cast(), 4);
            libc::close(c);
        }
    }
}

#[test]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
fn a_squatter_is_refused_inside_the_user_namespace() {
    let svc = Svc::start_renamed("dv2");
    // A second interface in A with no service: the squatter holds its name.
    let sq = "dvsq";
    for cmd in [
        vec![
            "ip", "link", "add", sq, "type", "veth", "peer", "name", "dvsqp",
        ],
        vec!["ip", "link", "set", sq, "up"],
    ] {
        let o = svc.pair.exec(Side::A, &cmd).unwrap();
        assert!(o.status.success(), "{cmd:?}: {o:?}");
    }
    let squatter = Squatter::start(&svc.pair, sq);
    let both = format!("{},{sq}", svc.ifname());
    let script = "/usr/bin/ibv_devinfo -d xrnic_$1 >/dev/null && echo served; \
                  /usr/bin/ibv_devinfo -d xrnic_$2; echo status $?";
    let o = svc
        .as_nobody(&[
            xrnic_bin(),
            "exec",
            "--netdev",
            &both,
            "--",
            "sh",
            "-c",
            script,
            "sh",
            svc.ifname(),
            sq,
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    // The real service (root, shown as the overflow uid) serves the same program ...
    assert!(out.contains("served"), "{}", text(&o));
    // ... the squatter, shown as the same uid, is refused by its pid.
    assert!(!out.contains("status 0"), "{}", text(&o));
    assert!(
        err.contains(&format!("is held by pid {}", squatter.pid)),
        "{}",
        text(&o)
    );
    let records = squatter.records();
    assert!(!records.is_empty(), "nobody connected to the squatter");
    assert!(
        records.iter().all(|&n| n == 0),
        "the squatter was sent something: {records:?}"
    );
}

/// Where the kernel refuses the user a user namespace (here: a chroot, in which
/// unshare(CLONE_NEWUSER) is EPERM, user_namespaces(7)), `xrnic exec` says so in one line
/// and runs the program without the view.
#[test]
#[ignore = "needs root"]
fn without_a_user_namespace_one_line_and_the_program_runs_without_the_view() {
    let root = std::env::temp_dir().join(format!("xrnic-devview-chroot-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let inner = "mount --make-rprivate / && mount --rbind / \"$1\" && shift && exec chroot \"$@\"";
    let o = Command::new("unshare")
        .args(["-m", "sh", "-c", inner, "sh"])
        .arg(&root)
        .arg(&root)
        .args([
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            xrnic_bin(),
            "exec",
            "--netdev",
            "lo",
            "--",
            "sh",
            "-c",
            "test ! -e /sys/class/infiniband/xrnic_lo && echo ran without",
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&root);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ran without\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{}", text(&o));
    assert!(err.contains("no device view"), "{}", text(&o));
}
