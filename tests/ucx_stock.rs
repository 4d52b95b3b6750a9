//! UCX, a large libibverbs program written by others, on xrnic: Debian's stock
//! `ucx_perftest` (ucx-utils, UCX 1.13) on both ends of a veth pair, each through
//! `xrnic exec`, with UCX limited to its verbs transports (`UCX_TLS=ud_verbs` and
//! `rc_verbs,ud_verbs`: nothing else, so no TCP), and each end's final stat snapshot
//! (`XRNIC_FINAL_STAT_DIR`) showing the RoCE packets xrnic moved.
//!
//! Two things UCX needs that simple programs do not: the RoCE v2 packet type in a UD
//! receive's `wc.sl` (src/proto/cq.rs `WorkCompletion::sl`; without it UCX 1.13 drops
//! every UD datagram and its wire-up times out), and address handles with a flow label
//! past 20 bits (src/abi/ah.rs `av_of`). UCX also lists an RDMA device only when
//! `/dev/infiniband/<uverbsN>` is a character device, which xrnic has none of (it has no
//! kernel driver): plain `xrnic exec` shows it one in the program's own mount namespace
//! (src/cli/devview.rs, docs/verbs-abi.md "Where programs look for a device"). Root:
//! AF_XDP, XDP.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{stock_tool, text, xrnic_bin};
use xrnic_netns::{Side, VethPair};

const PERFTEST: &str = "/usr/bin/ucx_perftest";

fn library_built() {
    let lib = Path::new(xrnic_bin()).with_file_name("libibverbs.so");
    assert!(
        lib.exists(),
        "{} missing: cargo build --workspace",
        lib.display()
    );
}

/// `ucx_perftest ARGS` on `side` through `xrnic exec`.
fn ucx(
    pair: &VethPair,
    side: Side,
    ifname: &str,
    tls: &str,
    stat_dir: &Path,
    args: &[&str],
) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &pair.end(side).netns])
        .args(["timeout", "90"])
        .args([
            xrnic_bin(),
            "exec",
            "--in-process",
            "--netdev",
            ifname,
            "--",
        ])
        .arg(PERFTEST)
        .args(args)
        .env("UCX_TLS", format!("{tls},self"))
        .env("XRNIC_FINAL_STAT_DIR", stat_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The packets one end's device sent and received, from its final snapshot.
fn packets(stat_dir: &Path) -> (u64, u64) {
    let mut sent = 0;
    let mut received = 0;
    for e in std::fs::read_dir(stat_dir).expect("stat dir").flatten() {
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap();
        sent += v["device"]["qp"]["packets_sent"].as_u64().unwrap_or(0);
        received += v["device"]["qp"]["packets_received"].as_u64().unwrap_or(0);
    }
    (sent, received)
}

/// Server on B, client on A (retried while the server is not yet listening); both exit
/// 0, the client prints perftest's final line, and the devices moved at least
/// `min_packets` RoCE packets from A to B and some back.
fn perftest(tls: &str, port: &str, test: &[&str], min_packets: u64) {
    library_built();
    stock_tool("ucx_perftest", "ucx-utils");
    let pair = VethPair::new(9000).expect("veth pair");
    // UCX keeps 15 characters of a device's name (UCT_MD_NAME_MAX 16) and then finds no
    // device by the cut name, so each end gets a short interface name (xrnic_<IF>).
    let names = [
        (Side::A, format!("u{port}a")),
        (Side::B, format!("u{port}b")),
    ];
    for (side, name) in &names {
        let old = pair.end(*side).ifname.clone();
        for cmd in [
            vec!["ip", "link", "set", "dev", &old, "down"],
            vec!["ip", "link", "set", "dev", &old, "name", name],
            vec!["ip", "link", "set", "dev", name, "up"],
        ] {
            let o = pair.exec(*side, &cmd).unwrap();
            assert!(o.status.success(), "{cmd:?}: {o:?}");
        }
    }
    for (side, name) in &names {
        let carrier = format!("/sys/class/net/{name}/carrier");
        let up = (0..200).any(|_| {
            let o = pair.exec(*side, &["cat", &carrier]).unwrap();
            let ok = String::from_utf8_lossy(&o.stdout).trim() == "1";
            if !ok {
                std::thread::sleep(Duration::from_millis(50));
            }
            ok
        });
        assert!(up, "{name} has no carrier");
    }
    let dir = std::env::temp_dir().join(format!("xrnic-ucx-{}-{port}", std::process::id()));
    let (sa, sb) = (dir.join("a"), dir.join("b"));
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::create_dir_all(&sb).unwrap();
    let mut args = vec!["-p", port];
    args.extend_from_slice(test);
    let server = ucx(&pair, Side::B, &names[1].1, tls, &sb, &args)
        .spawn()
        .unwrap();
    let peer = pair.end(Side::B).ipv4.to_string();
    let mut client_args = vec![peer.as_str()];
    client_args.extend_from_slice(&args);
    let mut client = None;
    for _ in 0..60 {
        std::thread::sleep(Duration::from_millis(250));
        let o = ucx(&pair, Side::A, &names[0].1, tls, &sa, &client_args)
            .output()
            .unwrap();
        let refused = String::from_utf8_lossy(&o.stderr).contains("Connection refused");
        if !refused {
            client = Some(o);
            break;
        }
    }
    let client = client.expect("the server never listened");
    let server = server.wait_with_output().unwrap();
    assert!(client.status.success(), "client: {}", text(&client));
    assert!(server.status.success(), "server: {}", text(&server));
    assert!(
        String::from_utf8_lossy(&client.stdout).contains("Final:"),
        "client: {}",
        text(&client)
    );
    // The data goes from A to B: A sent and B received at least one packet per
    // message; the other way at least the acknowledgements.
    let (a_sent, a_received) = packets(&sa);
    let (b_sent, b_received) = packets(&sb);
    assert!(
        a_sent >= min_packets && b_received >= min_packets && a_received > 0 && b_sent > 0,
        "RoCE packets: client sent {a_sent} received {a_received}, server sent {b_sent} \
         received {b_received} (at least {min_packets} from the client expected)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// UD alone: UCX's wire-up and its data both over UD datagrams (65 536-byte messages
/// cut into MTU-sized datagrams by UCX).
#[test]
#[cfg_attr(not(xrnic_no_ucx_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ucx_utils, ignore = "needs root and ucx-utils")]
fn ucx_perftest_tag_bandwidth_over_ud_verbs() {
    perftest(
        "ud_verbs",
        "13401",
        &["-t", "tag_bw", "-s", "65536", "-n", "500"],
        500,
    );
}

/// RC for the data, UD for the wire-up (UCX's auxiliary transport).
#[test]
#[cfg_attr(not(xrnic_no_ucx_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ucx_utils, ignore = "needs root and ucx-utils")]
fn ucx_perftest_tag_latency_over_rc_verbs() {
    perftest(
        "rc_verbs,ud_verbs",
        "13402",
        &["-t", "tag_lat", "-s", "8", "-n", "2000"],
        2000,
    );
}
