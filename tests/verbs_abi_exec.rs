//! `xrnic exec` runs Debian's stock, unmodified rdma-core tools on xrnic through the
//! C-ABI library (src/abi): `ibv_devinfo`, and `ibv_rc_pingpong` on both ends of a veth
//! pair in two namespaces (root: AF_XDP, XDP). The library must be built
//! (`cargo build --workspace`, as `make test` does).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{stock_tool, text, xrnic_bin};
use xrnic_netns::{Side, VethPair};

fn library_built() {
    let lib = std::path::Path::new(xrnic_bin()).with_file_name("libibverbs.so");
    assert!(
        lib.exists(),
        "{} missing: build the workspace first (cargo build --workspace)",
        lib.display()
    );
}

fn exec(pair: &VethPair, side: Side, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        &pair.end(side).netns,
        xrnic_bin(),
        "exec",
        "--in-process",
        "--netdev",
    ])
    .arg(&pair.end(side).ifname)
    .arg("--")
    .args(args);
    c
}

#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn stock_ibv_devinfo_through_xrnic_exec() {
    library_built();
    let devinfo = stock_tool("ibv_devinfo", "ibverbs-utils");
    let pair = VethPair::new(1500).expect("veth pair");
    let out = exec(&pair, Side::A, &[&devinfo]).output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains(&format!("hca_id:\txrnic_{}", pair.end(Side::A).ifname)),
        "{t}"
    );
    assert!(s.contains("PORT_ACTIVE (4)"), "{t}");
    assert!(s.contains("Ethernet"), "{t}");
}

/// Wait until something listens on TCP `port` in `side`'s namespace (bounded).
fn wait_listening(pair: &VethPair, side: Side, port: u16) {
    for _ in 0..200 {
        let o = pair
            .exec(side, &["ss", "-Hltn", &format!("sport = :{port}")])
            .unwrap();
        if !String::from_utf8_lossy(&o.stdout).trim().is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing listens on port {port}");
}

#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn stock_ibv_rc_pingpong_both_ends_through_xrnic_exec() {
    library_built();
    let pp = stock_tool("ibv_rc_pingpong", "ibverbs-utils");
    let pair = VethPair::new(1500).expect("veth pair");
    for args in [
        &["-g", "1", "-n", "50", "-c"][..],
        &["-g", "1", "-n", "20", "-e", "-c"],
        &["-g", "0", "-n", "20", "-s", "65536", "-e", "-c"],
    ] {
        let mut cmd: Vec<&str> = vec![&pp];
        cmd.extend_from_slice(args);
        let server = exec(&pair, Side::B, &cmd)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_listening(&pair, Side::B, 18515);
        let b = pair.end(Side::B).ipv4.to_string();
        cmd.push(&b);
        let client = exec(&pair, Side::A, &cmd).output().unwrap();
        let server = server.wait_with_output().unwrap();
        for (who, o) in [("client", &client), ("server", &server)] {
            let t = text(o);
            assert!(o.status.success(), "{who} {args:?}: {t}");
            let s = String::from_utf8_lossy(&o.stdout);
            assert!(s.contains("remote address: LID 0x0000"), "{who}: {t}");
            assert!(s.contains(" iters in "), "{who}: {t}");
        }
    }
}

/// The offload backend never takes xrnic's own library for rdma-core's (it would be xrnic
/// driving itself): the library exports a marker and the loader refuses it, by name.
#[test]
fn the_offload_backend_refuses_xrnics_own_libibverbs() {
    library_built();
    let lib = std::path::Path::new(xrnic_bin()).with_file_name("libibverbs.so");
    let out = Command::new(xrnic_bin())
        .args(["devinfo", "-d", "rxe0"])
        .env("XRNIC_LIBIBVERBS", &lib)
        .output()
        .unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("is xrnic's own libibverbs"), "{t}");
}
