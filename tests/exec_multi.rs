//! One `xrnic exec` for several processes (docs/verbs-abi.md "Several processes",
//! src/cli/exec_service.rs): as root on an interface no device service serves, `xrnic
//! exec` starts one, every process the program starts shares its one device, and the
//! service stops once the program has exited (a following `xrnic down` finds none). A
//! service already running is used and left running. `--in-process` starts none: the
//! program's library then holds the interface in its own process, and a second process
//! gets no context.
//!
//! Root tests (`#[ignore = "needs root"]`, docs/testing.md); the library must be built
//! (`cargo build --workspace`); ibverbs-utils (ibv_rc_pingpong) and rdmacm-utils (rping)
//! installed (build.rs ignores the tests without them, except under CI=true).

mod common;

use std::process::{Command, Output};

use common::{text, xrnic_bin};
use xrnic_netns::{Side, VethPair};

/// A veth pair with `lo` up on A (ibv_rc_pingpong's peers meet over TCP on localhost).
fn pair() -> VethPair {
    let lib = std::path::Path::new(xrnic_bin()).with_file_name("libibverbs.so");
    assert!(
        lib.exists(),
        "{} missing: cargo build --workspace",
        lib.display()
    );
    let pair = VethPair::new(1500).expect("veth pair (root)");
    pair.exec(Side::A, &["ip", "link", "set", "lo", "up"])
        .unwrap();
    pair
}

/// `xrnic ARGS` as root in A's namespace, bounded by timeout(1).
fn xrnic(pair: &VethPair, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", &pair.end(Side::A).netns])
        .args(["timeout", "120", xrnic_bin()])
        .args(args)
        .output()
        .unwrap()
}

/// `sh -c SCRIPT` under one `xrnic exec --netdev A [extra]`.
fn exec_sh(pair: &VethPair, extra: &[&str], script: &str) -> Output {
    let ifname = pair.end(Side::A).ifname.clone();
    let mut args = vec!["exec", "--netdev", &ifname];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    xrnic(pair, &args)
}

/// A server and a client of ibv_rc_pingpong (GID index 1, the IPv4 one, as the stock
/// tests use), started by one shell: the client once the server listens on its TCP port
/// (a client that failed ends the server). Prints "server N" and "client M", the exit
/// status of each.
const PINGPONG_PAIR: &str = r#"
ibv_rc_pingpong -g 1 -n 100 -s 4096 -p 18620 & s=$!
until ss -Hltn 'sport = :18620' | grep -q .; do
    kill -0 $s 2>/dev/null || break
    sleep 0.05
done
ibv_rc_pingpong -g 1 -n 100 -s 4096 -p 18620 localhost; c=$?
[ $c -eq 0 ] || kill $s
wait $s; echo "server $?"; echo "client $c"
"#;

/// Whether a device service serves A's interface: `xrnic down` stops it (exit 0), or
/// finds none (exit 1).
fn down(pair: &VethPair) -> bool {
    let ifname = pair.end(Side::A).ifname.clone();
    xrnic(pair, &["down", &ifname]).status.success()
}

#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn two_stock_programs_on_one_interface_under_one_exec() {
    let pair = pair();
    let o = exec_sh(&pair, &[], PINGPONG_PAIR);
    let t = text(&o);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{t}");
    assert!(s.contains("server 0") && s.contains("client 0"), "{t}");
    assert_eq!(s.matches("100 iters in").count(), 2, "{t}");
    assert!(
        !down(&pair),
        "the service xrnic exec started is gone with it"
    );
}

#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn in_process_the_second_program_gets_no_context() {
    let pair = pair();
    let o = exec_sh(&pair, &["--in-process"], PINGPONG_PAIR);
    let t = text(&o);
    let s = String::from_utf8_lossy(&o.stdout);
    // The first holds the interface (its XDP program); the second's open is EBUSY and
    // ibv_rc_pingpong says so; the server then waits for a client that never comes.
    assert!(s.contains("client 1"), "{t}");
    assert!(t.contains("Couldn't get context"), "{t}");
    assert!(!down(&pair), "no service was started");
}

#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn a_running_service_is_used_and_left_running() {
    let pair = pair();
    let ifname = pair.end(Side::A).ifname.clone();
    let o = xrnic(&pair, &["up", &ifname]);
    assert!(o.status.success(), "{}", text(&o));
    let o = exec_sh(&pair, &[], PINGPONG_PAIR);
    let t = text(&o);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("client 0"),
        "{t}"
    );
    assert!(down(&pair), "the service xrnic up started still runs");
}

/// rping's server and client (rdma_cm: connection management through the service's
/// QP1 relay, then RDMA READs and WRITEs), under one `xrnic exec`; the client tries
/// again while the server is not yet listening (bounded).
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn rping_server_and_client_under_one_exec() {
    let pair = pair();
    let ip = pair.end(Side::A).ipv4.to_string();
    let script = format!(
        r#"
rping -s -a {ip} -p 7471 -C 10 & s=$!
i=0
until rping -c -a {ip} -p 7471 -C 10 -v > client.out 2>&1; do
    i=$((i + 1)); [ $i -lt 100 ] || break
    kill -0 $s 2>/dev/null || break
    sleep 0.1
done
cat client.out; wait $s; echo "server $?"
"#
    );
    let dir = std::env::temp_dir().join(format!("xrnic-exec-rping-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new("ip")
        .args(["netns", "exec", &pair.end(Side::A).netns])
        .args(["timeout", "120", xrnic_bin()])
        .args(["exec", "--netdev", &pair.end(Side::A).ifname, "--"])
        .args(["sh", "-c", &script])
        .current_dir(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let t = text(&o);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{t}");
    assert!(s.contains("server 0"), "{t}");
    assert_eq!(s.matches("ping data: rdma-ping-").count(), 10, "{t}");
    assert!(
        !down(&pair),
        "the service xrnic exec started is gone with it"
    );
}
