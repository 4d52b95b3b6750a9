//! Helpers shared by the privileged AF_XDP tests (each marked `#[ignore = "needs root"]`,
//! docs/testing.md): the vector folder, the tshark check and frame builders (RoCE frames through `wire::FrameRepr::emit`, other traffic through
//! etherparse).
#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;
use std::process::{Child, Command, Output};
use std::time::Duration;

use etherparse::PacketBuilder;
use xrnic::wire::{
    BthRepr, EthRepr, ExtHeaders, FrameRepr, IpRepr, Opcode, Psn, Qpn, RoceRepr, UdpRepr,
};
use xrnic_netns::{Side, VethPair};

mod bin_path;
pub mod rc;
/// The `xrnic` binary (target/<profile>/xrnic, built by the `xrnic-cli` package).
pub use bin_path::xrnic_bin;

/// `xrnic ARGS` run in the network namespace of `side` of `pair`.
pub fn netns_cmd(pair: &VethPair, side: Side, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &pair.end(side).netns, xrnic_bin()])
        .args(args);
    c
}

/// `PROGRAM ARGS` on `side` through `xrnic exec`, bounded by timeout(1) (120 s) so that a
/// hung program or peer cannot hang the test: a program it kills exits 124.
pub fn xrnic_exec(pair: &VethPair, side: Side, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        &pair.end(side).netns,
        "timeout",
        "120",
        xrnic_bin(),
    ])
    .args([
        "exec",
        "--in-process",
        "--netdev",
        &pair.end(side).ifname,
        "--",
    ])
    .args(args);
    c
}

/// A stock tool that asks for a feature xrnic does not have fails the way the tool fails on
/// any device without it: its own exit `code` (not timeout(1)'s 124 of a hang, not a
/// signal of an abort) and its own message `says` on either output.
pub fn assert_refused(o: &Output, what: &str, code: i32, says: &str) {
    assert_eq!(o.status.code(), Some(code), "{what}: {}", text(o));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(all.contains(says), "{what}: expected {says:?}: {}", text(o));
}

/// A finished command's status and both outputs, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// True under `CI=true`. The root benchmarks (benches/afxdp_raw.rs, ...), which are
/// programs and not tests, exit 1 there when not root instead of skipping.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// ../shared/vectors (data the tests read). Tests calling this carry
/// `#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]`, or are root tests
/// (`make test` as root runs them where the folder is; docs/testing.md).
pub fn vectors_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/vectors");
    assert!(
        d.is_dir(),
        "{} is missing: this test reads the captures there",
        d.display()
    );
    d
}

/// Fails unless `tshark` runs (`make test` installs the Debian package tshark).
pub fn require_tshark() {
    let ok = Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "tshark does not run: install the Debian package tshark (make deps)"
    );
}

/// Every byte the processes of `outs` printed, stdout and stderr, as text.
pub fn all_output(outs: &[&Output]) -> String {
    outs.iter()
        .map(|o| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .collect()
}

/// How many times a stock perftest exchange runs at most while perftest itself refuses to
/// measure ([`perftest_refused_to_measure`]).
pub const PERFTEST_ATTEMPTS: usize = 3;

/// True when `output` (a perftest tool's stdout and stderr) shows perftest's own refusal
/// to measure: its clock calibration (`get_cpu_mhz`) fits a line through timed loops and
/// gives up on a fit worse than r² 0.9, printing "Correlation coefficient r^2: X < 0.9"
/// and then "Can't produce a report". A loaded machine's preemptions make such fits;
/// nothing xrnic does enters that calibration.
pub fn perftest_refused_to_measure(output: &str) -> bool {
    output.lines().any(|l| {
        let l = l.trim();
        l.starts_with("Correlation coefficient r^2: ") && l.ends_with(" < 0.9")
    }) && output.contains("Can't produce a report")
}

/// Runs `run` (one exchange of stock perftest tools) up to [`PERFTEST_ATTEMPTS`] times:
/// again only while `texts` of its result (every output of the exchange) shows
/// [`perftest_refused_to_measure`]. Returns the last result, which the caller asserts on
/// as usual (so a refusal on every attempt still fails, with perftest's message).
pub fn retry_perftest<T>(
    what: &str,
    mut run: impl FnMut() -> T,
    texts: impl Fn(&T) -> String,
) -> T {
    let mut attempt = 1;
    loop {
        let r = run();
        if attempt == PERFTEST_ATTEMPTS || !perftest_refused_to_measure(&texts(&r)) {
            return r;
        }
        eprintln!(
            "{what}: perftest could not calibrate its clock on this busy machine \
             (attempt {attempt} of {PERFTEST_ATTEMPTS}): running it again"
        );
        attempt += 1;
    }
}

/// `/usr/bin/NAME`, the stock tool of the Debian package `package`; fails naming the
/// package when it is not there. A test that calls this carries
/// `#[cfg_attr(xrnic_no_<package>, ignore = ...)]` (build.rs; docs/testing.md).
pub fn stock_tool(name: &str, package: &str) -> String {
    let p = format!("/usr/bin/{name}");
    assert!(
        std::path::Path::new(&p).exists(),
        "{p} is missing: install the Debian package {package} (make deps)"
    );
    p
}

/// Fails unless `cc` runs and `header` exists (the Debian package `package`), as a test
/// that compiles tests/c/*.c needs.
pub fn require_c_headers(header: &str, package: &str) {
    let cc = Command::new("cc").arg("--version").output();
    assert!(
        cc.is_ok_and(|o| o.status.success()),
        "cc does not run: install the Debian package gcc (make deps)"
    );
    assert!(
        std::path::Path::new(header).exists(),
        "{header} is missing: install the Debian package {package} (make deps)"
    );
}

/// Every frame of every capture in the vector folder, with its file name.
pub fn vector_frames() -> Vec<(String, Vec<u8>)> {
    let d = vectors_dir();
    let mut files = Vec::new();
    for sub in std::fs::read_dir(&d).expect("read vectors") {
        let sub = sub.expect("dir entry").path();
        if sub.is_dir() {
            for f in std::fs::read_dir(&sub).expect("read vector subdir") {
                files.push(f.expect("dir entry").path());
            }
        }
    }
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let frames =
            xrnic::io::capture::read_file(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for fr in frames {
            out.push((format!("{} #{}", f.display(), fr.number), fr.data));
        }
    }
    out
}

pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
pub const IP4_A: [u8; 4] = [192, 0, 2, 1];
pub const IP4_B: [u8; 4] = [192, 0, 2, 2];
pub const IP6_A: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
pub const IP6_B: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

/// Addressing of a test RoCE frame.
#[derive(Clone, Copy, Debug)]
pub struct Addr {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub ipv6: bool,
    pub vlan: Option<u16>,
}

impl Addr {
    pub fn a_to_b(ipv6: bool) -> Self {
        Addr {
            src_mac: MAC_A,
            dst_mac: MAC_B,
            ipv6,
            vlan: None,
        }
    }
}

/// An RC SEND ONLY frame carrying `payload`, emitted by `wire::FrameRepr::emit`.
pub fn roce_frame(addr: Addr, psn: u32, payload: &[u8]) -> Vec<u8> {
    let repr = roce_repr(addr, psn, payload);
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut buf).expect("emit test frame");
    buf.truncate(n);
    buf
}

/// The [`FrameRepr`] behind [`roce_frame`].
pub fn roce_repr(addr: Addr, psn: u32, payload: &[u8]) -> FrameRepr<'_> {
    let ip = if addr.ipv6 {
        IpRepr::V6 {
            src: IP6_A,
            dst: IP6_B,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        }
    } else {
        IpRepr::V4 {
            src: IP4_A,
            dst: IP4_B,
            tos: 0,
            identification: 0,
            dont_fragment: true,
            ttl: 64,
        }
    };
    FrameRepr {
        eth: EthRepr {
            dst: addr.dst_mac,
            src: addr.src_mac,
            vlan_tci: addr.vlan,
        },
        ip,
        udp: UdpRepr {
            src_port: 0xc000 | (psn as u16 & 0x3fff),
            checksum: 0,
        },
        roce: RoceRepr {
            bth: BthRepr {
                mig_req: true,
                ack_req: true,
                ..BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::new(0x11), Psn::new(psn))
            },
            ext: ExtHeaders::default(),
            payload,
        },
    }
}

/// A recognisable payload: byte i of frame `seq` is `seq * 31 + i`.
pub fn payload(seq: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seq.wrapping_mul(31) as usize + i) as u8)
        .collect()
}

/// UDP to `dst_port` (not RoCE unless 4791).
pub fn udp_frame(ipv6: bool, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(MAC_A, MAC_B);
    let b = if ipv6 {
        b.ipv6(IP6_A, IP6_B, 64).udp(5000, dst_port)
    } else {
        b.ipv4(IP4_A, IP4_B, 64).udp(5000, dst_port)
    };
    let mut v = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut v, payload).expect("write udp");
    v
}

pub fn tcp_frame(dst_port: u16) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(MAC_A, MAC_B)
        .ipv4(IP4_A, IP4_B, 64)
        .tcp(40000, dst_port, 1, 65535);
    let mut v = Vec::with_capacity(b.size(0));
    b.write(&mut v, &[]).expect("write tcp");
    v
}

pub fn icmp_echo_frame() -> Vec<u8> {
    let b = PacketBuilder::ethernet2(MAC_A, MAC_B)
        .ipv4(IP4_A, IP4_B, 64)
        .icmpv4_echo_request(1, 1);
    let mut v = Vec::with_capacity(b.size(8));
    b.write(&mut v, &[0u8; 8]).expect("write icmp");
    v
}

/// IPv6 neighbour solicitation for fd00::2 (ICMPv6 type 135, RFC 4861 4.3).
pub fn nd_solicit_frame() -> Vec<u8> {
    // Solicited-node multicast fd00::2 -> ff02::1:ff00:2, MAC 33:33:ff:00:00:02.
    let dst_ip = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 2];
    let b = PacketBuilder::ethernet2(MAC_A, [0x33, 0x33, 0xff, 0, 0, 2])
        .ipv6(IP6_A, dst_ip, 255)
        .icmpv6_raw(135, 0, [0; 4]);
    // Target address, then the source link-layer address option.
    let mut body = IP6_B.to_vec();
    body.extend_from_slice(&[1, 1]);
    body.extend_from_slice(&MAC_A);
    let mut v = Vec::with_capacity(b.size(body.len()));
    b.write(&mut v, &body).expect("write nd");
    v
}

/// ARP request "who has 192.0.2.2, tell 192.0.2.1" (RFC 826).
pub fn arp_request_frame() -> Vec<u8> {
    let mut v = Vec::with_capacity(42);
    v.extend_from_slice(&[0xff; 6]);
    v.extend_from_slice(&MAC_A);
    v.extend_from_slice(&[0x08, 0x06]); // ARP
    v.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]); // Ethernet/IPv4, request
    v.extend_from_slice(&MAC_A);
    v.extend_from_slice(&IP4_A);
    v.extend_from_slice(&[0; 6]);
    v.extend_from_slice(&IP4_B);
    v
}

/// Removes the stat snapshots the tools wrote for the pair's interfaces (also when the
/// test fails), so that /run/xrnic does not collect files of deleted interfaces.
pub struct StatFiles(Vec<String>);

impl StatFiles {
    pub fn of(pair: &VethPair) -> Self {
        StatFiles(vec![
            pair.end(Side::A).ifname.clone(),
            pair.end(Side::B).ifname.clone(),
        ])
    }
}

impl Drop for StatFiles {
    fn drop(&mut self) {
        let Ok(dir) = std::fs::read_dir(xrnic::verbs::STAT_DIR) else {
            return;
        };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if self.0.iter().any(|i| name.starts_with(&format!("{i}."))) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Wait (bounded) until something listens on TCP `port` in `side`'s namespace; panics if
/// `server` exits first or nothing listens after ~10 s.
pub fn wait_listening(pair: &VethPair, side: Side, port: u16, server: &mut Child) {
    for _ in 0..1000 {
        let out = pair
            .exec(side, &["ss", "-Hltn", &format!("sport = :{port}")])
            .expect("ss");
        if !out.stdout.is_empty() {
            return;
        }
        if let Ok(Some(st)) = server.try_wait() {
            panic!("the server exited early: {st}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("nothing listens on port {port}");
}

/// tests/c/NAME.c built with cc into a fresh directory of its own (tests of one program
/// run in parallel), linked with `libs` (e.g. `-libverbs`): (the directory, the
/// program). Fails without cc or libibverbs-dev's headers.
pub fn build_c(name: &str, libs: &[&str]) -> (PathBuf, PathBuf) {
    require_c_headers("/usr/include/infiniband/verbs.h", "libibverbs-dev");
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("xrnic-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(name);
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let o = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(libs)
        .output()
        .unwrap();
    assert!(o.status.success(), "cc: {}", text(&o));
    (dir, exe)
}
