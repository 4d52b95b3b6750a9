//! librdmacm on a veth pair (docs/rdmacm.md): Debian's stock rdmacm-utils binaries (rping)
//! on both ends, each on xrnic through `xrnic exec` (which puts xrnic's librdmacm.so.1,
//! the same library as its libibverbs.so.1, first on the library path). The CM is
//! xrnic's own (src/cm) on each end's QP1. Root: AF_XDP, XDP.
//! The library must be built (`cargo build --workspace`, as `make test` does).

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{all_output, assert_refused, retry_perftest, stock_tool, xrnic_bin, xrnic_exec};
use xrnic_netns::{Side, VethPair};

/// `/usr/bin/NAME` of rdmacm-utils (fails without it: [`stock_tool`]).
fn tool(name: &str) -> String {
    stock_tool(name, "rdmacm-utils")
}

/// Exit status and the ends of both streams (rping -v prints every byte it moves).
fn text(o: &Output) -> String {
    let tail = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        let n = s.len().saturating_sub(1500);
        let i = (n..s.len())
            .find(|i| s.is_char_boundary(*i))
            .unwrap_or(s.len());
        s[i..].to_string()
    };
    format!(
        "{}\nstdout: ...{}\nstderr: ...{}",
        o.status,
        tail(&o.stdout),
        tail(&o.stderr)
    )
}

fn library_built() {
    let lib = std::path::Path::new(xrnic_bin()).with_file_name("libibverbs.so");
    assert!(
        lib.exists(),
        "{} missing: cargo build --workspace",
        lib.display()
    );
}

fn exec(pair: &VethPair, side: Side, args: &[&str]) -> Command {
    xrnic_exec(pair, side, args)
}

/// Wait until a program has xrnic's XDP program on `side`'s interface (its device is
/// open; the CM listens right after).
fn wait_xdp(pair: &VethPair, side: Side) {
    for _ in 0..400 {
        let o = pair
            .exec(
                side,
                &["ip", "-d", "link", "show", "dev", &pair.end(side).ifname],
            )
            .unwrap();
        if String::from_utf8_lossy(&o.stdout).contains("xdp") {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no XDP program on {}", pair.end(side).ifname);
}

/// The client on A, again while B's listener is not up yet (its CM answers REJ
/// "invalid service ID" until rdma_listen, which follows the device open at once).
fn client(pair: &VethPair, args: &[&str]) -> Output {
    for _ in 0..50 {
        let o = exec(pair, Side::A, args).output().unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        // A UD id's SIDR_REQ before the listener: SIDR_REP "not supported", UNREACHABLE.
        let early = (all.contains("RDMA_CM_EVENT_REJECTED") && all.contains('8'))
            || all.contains("RDMA_CM_EVENT_UNREACHABLE, error: 1")
            // The synchronous API: rdma_connect fails with ECONNREFUSED on that REJ.
            || all.contains("rdma_connect: Connection refused");
        if !early {
            return o;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("B never listened");
}

/// `rping -s` on B, `rping -c -v` on A: both exit 0, the client prints each of the
/// `count` pings with rping's pattern and the server sees the same data.
fn rping(size: usize, count: usize) {
    library_built();
    let p = tool("rping");
    let pair = VethPair::new(1500).expect("veth pair");
    let b = pair.end(Side::B).ipv4.to_string();
    let (c, s) = (count.to_string(), size.to_string());
    let server = exec(
        &pair,
        Side::B,
        &[&p, "-s", "-a", &b, "-C", &c, "-S", &s, "-v"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // The server's output is read while the client runs: with -v a 16 KiB ping is a
    // 16 KiB line, and a pipe nobody drains would stop rping in write(2).
    let server = std::thread::spawn(move || server.wait_with_output().unwrap());
    wait_xdp(&pair, Side::B);
    let client = client(&pair, &[&p, "-c", "-a", &b, "-C", &c, "-S", &s, "-v"]);
    let server = server.join().unwrap();
    for (who, o) in [("client", &client), ("server", &server)] {
        assert!(o.status.success(), "{who}: {}", text(o));
    }
    let out = String::from_utf8_lossy(&client.stdout);
    let pings: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("ping data: rdma-ping-"))
        .collect();
    assert_eq!(pings.len(), count, "{}", text(&client));
    for (i, l) in pings.iter().enumerate() {
        // rping's pattern: "rdma-ping-N: " then the alphabet rotated by N, size - 1 bytes
        // in all (the last is the NUL).
        let data = &l["ping data: ".len()..];
        assert!(data.starts_with(&format!("rdma-ping-{i}: ")), "{l}");
        assert_eq!(data.len(), size - 1, "{l}");
        let srv = String::from_utf8_lossy(&server.stdout);
        assert!(
            srv.contains(&format!("server ping data: {data}")),
            "server did not see ping {i}"
        );
    }
}

#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_rping_64_bytes_20_rounds() {
    rping(64, 20);
}

#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_rping_4096_bytes() {
    rping(4096, 10);
}

#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_rping_16384_bytes_multi_packet() {
    rping(16384, 10);
}

/// A port nobody listens on, with a CM on the peer: REJ "invalid service ID", which
/// rping reports as the kernel's rdma_cm would (`RDMA_CM_EVENT_REJECTED, error 8`).
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_rping_to_a_port_nobody_listens_on_is_rejected_8() {
    library_built();
    let p = tool("rping");
    let pair = VethPair::new(1500).expect("veth pair");
    let b = pair.end(Side::B).ipv4.to_string();
    // B's CM listens on rping's default port 7174; A asks for 7175.
    let server = exec(&pair, Side::B, &[&p, "-s", "-a", &b, "-C", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_xdp(&pair, Side::B);
    let o = exec(
        &pair,
        Side::A,
        &[&p, "-c", "-a", &b, "-p", "7175", "-C", "1"],
    )
    .output()
    .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("RDMA_CM_EVENT_REJECTED, error 8"),
        "{}",
        text(&o)
    );
    // The server still serves a good client afterwards.
    let good = client(&pair, &[&p, "-c", "-a", &b, "-C", "1"]);
    assert!(good.status.success(), "{}", text(&good));
    let s = server.wait_with_output().unwrap();
    assert!(s.status.success(), "{}", text(&s));
}

/// ucmatose: 4 connections from one client process to one server process, one message
/// each way on each (`-C 1`), both exit 0 ("return status 0").
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_ucmatose_four_connections() {
    library_built();
    let p = tool("ucmatose");
    let pair = VethPair::new(1500).expect("veth pair");
    let b = pair.end(Side::B).ipv4.to_string();
    let server = exec(&pair, Side::B, &[&p, "-c", "4", "-C", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_xdp(&pair, Side::B);
    let c = client(&pair, &[&p, "-s", &b, "-c", "4", "-C", "1"]);
    let s = server.wait_with_output().unwrap();
    for (who, o) in [("client", &c), ("server", &s)] {
        assert!(o.status.success(), "{who}: {}", text(o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("return status 0"),
            "{who}: {}",
            text(o)
        );
    }
    assert!(
        String::from_utf8_lossy(&c.stdout).contains("data transfers complete"),
        "{}",
        text(&c)
    );
}

/// udaddy (RDMA_PS_UDP ids, SIDR_REQ / SIDR_REP, UD QPs from `rdma_create_qp`): the
/// client's messages reach the server, which answers through an AH made from the
/// completion (`ibv_create_ah_from_wc`), on `connections` ids; both print "return status 0".
fn udaddy(connections: usize) {
    library_built();
    let p = tool("udaddy");
    let pair = VethPair::new(1500).expect("veth pair");
    let b = pair.end(Side::B).ipv4.to_string();
    let n = connections.to_string();
    let server = exec(&pair, Side::B, &[&p, "-c", &n])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_xdp(&pair, Side::B);
    let c = client(&pair, &[&p, "-s", &b, "-c", &n]);
    let s = server.wait_with_output().unwrap();
    for (who, o) in [("client", &c), ("server", &s)] {
        assert!(o.status.success(), "{who}: {}", text(o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains("data transfers complete"),
            "{who}: {}",
            text(o)
        );
        assert!(out.contains("return status 0"), "{who}: {}", text(o));
    }
    // The server only replies after receiving each node's messages.
    assert!(
        String::from_utf8_lossy(&s.stdout).contains("sending replies"),
        "{}",
        text(&s)
    );
}

#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_udaddy_one_id() {
    udaddy(1);
}

#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_udaddy_three_ids() {
    udaddy(3);
}

/// A perftest tool with `-R` (its connection through librdmacm, RC QPs): perftest opens
/// its own device context first, and the CM shares it (a second open of the device
/// would find the interface's XDP program taken). Both ends exit 0 and print the
/// results row for `bytes` × `iters`.
///
/// perftest's `-R` connects through the CM twice: first its own channel for the exchange
/// of parameters, then the test's QPs. The server calls `rdma_listen` for the second only
/// after the exchange (perftest_communication.c `create_rdma_cm_connection`), while the
/// client connects as soon as its side of the exchange is done, so a client that is quicker
/// than the server meets no listener: REJ "invalid service ID", as from the kernel's CM
/// (cm.c `cm_match_req`). perftest 4.5-0.17 then retries on the `rdma_cm_id` it has just
/// destroyed (our library answers EINVAL: "Failed to destroy RDMA CM ID number 0") and
/// exits. That race is perftest's own, on any stack. Running only the client again would
/// connect its exchange channel to the server's second listener (seen here: both ends then
/// wait for each other's SENDs, RNR-retried for ever), so such a run starts again from a
/// fresh server. A REJ of the first connection (the server's device is open, its first
/// listener not yet) only needs the client again.
///
/// The client must be done well within its DREQ's retries (about 80 s): a server that
/// exits with its connection up (perftest's latency servers return from main without
/// rdma_disconnect) must still answer or send the DREQ, as the kernel's CM does when the
/// process's rdma_cm file is released.
fn perftest_rdma_cm(name: &str, iters: usize, bytes: usize) {
    library_built();
    let p = stock_tool(name, "perftest");
    let pair = VethPair::new(1500).expect("veth pair");
    let b = pair.end(Side::B).ipv4.to_string();
    let n = iters.to_string();
    let mut tries = 0;
    // perftest's own refusal to measure on a busy machine: the exchange again (bounded).
    let (c, s) = retry_perftest(
        name,
        || loop {
            let server = exec(&pair, Side::B, &[&p, "-R", "-n", &n])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            wait_xdp(&pair, Side::B);
            let started = std::time::Instant::now();
            let (c, fresh_pair) =
                perftest_client(&pair, name, &[&p, "-R", "-n", &n, &b], &mut tries);
            if !fresh_pair {
                let took = started.elapsed();
                assert!(
                    took < Duration::from_secs(30),
                    "{name}: the client took {took:?}: {}",
                    text(&c)
                );
                break (c, server.wait_with_output().unwrap());
            }
            // The test's connection was refused: this server is past its exchange.
            eprintln!("{name}: the test's REQ came before the listener: a fresh pair");
            let _ = Command::new("kill").arg(server.id().to_string()).status();
            let _ = server.wait_with_output();
        },
        |(c, s)| all_output(&[c, s]),
    );
    // The passive side of a READ or atomic latency test prints no table.
    let passive = ["ib_read_lat", "ib_atomic_lat"].contains(&name);
    for (who, o) in [("client", &c), ("server", &s)] {
        assert!(o.status.success(), "{who}: {}", text(o));
        if who == "server" && passive {
            continue;
        }
        let out = String::from_utf8_lossy(&o.stdout);
        let row = out.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 2 && f[0] == bytes.to_string() && f[1] == n
        });
        assert!(row, "{who}: no results row: {}", text(o));
    }
}

/// Run the perftest client until it is not refused for want of a listener, or until the
/// refusal was of the test's connection (then true: the server must start again).
fn perftest_client(pair: &VethPair, name: &str, args: &[&str], tries: &mut u32) -> (Output, bool) {
    loop {
        *tries += 1;
        assert!(*tries <= 50, "{name}: the server never listened in time");
        let c = exec(pair, Side::A, args).output().unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&c.stdout),
            String::from_utf8_lossy(&c.stderr)
        );
        if !all.contains("RDMA_CM_EVENT_REJECTED; error: 8") {
            return (c, false);
        }
        eprintln!("{name}: REJ \"invalid service ID\", try {tries}");
        std::thread::sleep(Duration::from_millis(100));
        if all.contains("Failed to create RDMA CM connection") {
            return (c, true);
        }
    }
}

#[test]
#[cfg_attr(not(xrnic_no_perftest), ignore = "needs root")]
#[cfg_attr(xrnic_no_perftest, ignore = "needs root and perftest")]
fn stock_ib_send_lat_rdma_cm() {
    perftest_rdma_cm("ib_send_lat", 100, 2);
}

/// ib_atomic_lat's server returns from main with its connection up: the DREQ of its
/// exit lets the client's rdma_disconnect finish at once (it waited out its DREQ retries).
#[test]
#[cfg_attr(not(xrnic_no_perftest), ignore = "needs root")]
#[cfg_attr(xrnic_no_perftest, ignore = "needs root and perftest")]
fn stock_ib_atomic_lat_rdma_cm() {
    perftest_rdma_cm("ib_atomic_lat", 100, 8);
}

#[test]
#[cfg_attr(not(xrnic_no_perftest), ignore = "needs root")]
#[cfg_attr(xrnic_no_perftest, ignore = "needs root and perftest")]
fn stock_ib_write_bw_rdma_cm() {
    perftest_rdma_cm("ib_write_bw", 200, 65536);
}

#[test]
#[cfg_attr(not(xrnic_no_perftest), ignore = "needs root")]
#[cfg_attr(xrnic_no_perftest, ignore = "needs root and perftest")]
fn stock_ib_read_bw_rdma_cm() {
    perftest_rdma_cm("ib_read_bw", 200, 65536);
}

/// librdmacm's synchronous API: rdma_server / rdma_client (rdma_getaddrinfo,
/// rdma_create_ep with a NULL channel, rdma_listen, rdma_get_request, blocking
/// rdma_accept / rdma_connect, the CQs and completion channels rdma_create_qp makes,
/// rdma_get_recv_comp, rdma_destroy_ep): one message each way, both "end 0".
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_rdma_server_rdma_client_sync_api() {
    sync_pair("rdma_server", "rdma_client", &[]);
}

/// rdma_xserver / rdma_xclient over RC (their default): the synchronous API again, the
/// client's 16-byte SEND posted with IBV_SEND_INLINE on a QP created with
/// `max_inline_data` 0 (rxe's provider takes it: its inline room is at least one SGE).
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_rdma_xserver_rdma_xclient_rc() {
    sync_pair("rdma_xserver", "rdma_xclient", &["-c", "r"]);
}

/// A server and a client of rdma-core's synchronous examples (`args` on both): each
/// exits 0 and prints "NAME: end 0".
fn sync_pair(server_name: &str, client_name: &str, args: &[&str]) {
    library_built();
    let (srv, cli) = (tool(server_name), tool(client_name));
    let pair = VethPair::new(1500).expect("veth pair");
    let b = pair.end(Side::B).ipv4.to_string();
    let mut sa = vec![srv.as_str()];
    sa.extend_from_slice(args);
    let server = exec(&pair, Side::B, &sa)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_xdp(&pair, Side::B);
    let mut ca = vec![cli.as_str(), "-s", &b];
    ca.extend_from_slice(args);
    let c = client(&pair, &ca);
    let s = server.wait_with_output().unwrap();
    for (who, o, name) in [("client", &c, client_name), ("server", &s, server_name)] {
        assert!(o.status.success(), "{who}: {}", text(o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(&format!("{name}: end 0")),
            "{who}: {}",
            text(o)
        );
    }
}

/// ucmatose with its default message count (10 each way on each connection), 2
/// connections: both exit 0 after the server's DREQs are answered.
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_ucmatose_default_message_count() {
    library_built();
    let p = tool("ucmatose");
    let pair = VethPair::new(1500).expect("veth pair");
    let b = pair.end(Side::B).ipv4.to_string();
    let server = exec(&pair, Side::B, &[&p, "-c", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_xdp(&pair, Side::B);
    let c = client(&pair, &[&p, "-s", &b, "-c", "2"]);
    let s = server.wait_with_output().unwrap();
    for (who, o) in [("client", &c), ("server", &s)] {
        assert!(o.status.success(), "{who}: {}", text(o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("return status 0"),
            "{who}: {}",
            text(o)
        );
    }
    assert!(
        String::from_utf8_lossy(&s.stdout).contains("disconnected"),
        "{}",
        text(&s)
    );
}

/// `xrnic res cm_id [--json]` in each namespace.
fn res_cm_id(pair: &VethPair, side: Side, json: bool) -> String {
    let mut args = vec![xrnic_bin(), "res", "cm_id"];
    if json {
        args.push("--json");
    }
    let o = pair.exec(side, &args).unwrap();
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `xrnic res cm_id` while rping runs (no `-C`: until killed): B lists its listener
/// (LISTEN on 7174) and the connected id (CONNECT, cm-state ESTABLISHED, B:7174 to A's
/// address, a QPN), A its connected id towards B:7174; each names the rping process
/// (pid, comm), like `rdma resource show cm_id`.
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn res_cm_id_lists_a_live_rpings_ids() {
    use serde_json::Value;
    library_built();
    let p = tool("rping");
    let pair = VethPair::new(1500).expect("veth pair");
    let (a, b) = (
        pair.end(Side::A).ipv4.to_string(),
        pair.end(Side::B).ipv4.to_string(),
    );
    let mut server = exec(&pair, Side::B, &[&p, "-s", "-a", &b])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_xdp(&pair, Side::B);
    let state = |v: &Value| v["state"].as_str().unwrap_or("").to_string();
    let mut client: Option<std::process::Child> = None;
    let mut found = None;
    for _ in 0..300 {
        // Again while B's listener is not up yet (REJ 8: the client exits).
        let exited = client
            .as_mut()
            .is_none_or(|c| c.try_wait().unwrap().is_some());
        if exited {
            client = Some(
                exec(&pair, Side::A, &[&p, "-c", "-a", &b])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
        std::thread::sleep(Duration::from_millis(100));
        let vb: Value = serde_json::from_str(&res_cm_id(&pair, Side::B, true)).unwrap();
        let va: Value = serde_json::from_str(&res_cm_id(&pair, Side::A, true)).unwrap();
        let (lb, la) = (
            vb.as_array().unwrap().clone(),
            va.as_array().unwrap().clone(),
        );
        let est = |v: &Value| v["cm_state"] == "ESTABLISHED";
        if lb.iter().any(est) && la.iter().any(est) {
            found = Some((lb, la));
            break;
        }
    }
    let (lb, la) = found.expect("rping's ids never listed as ESTABLISHED on both sides");
    let listen: Vec<&Value> = lb.iter().filter(|v| state(v) == "LISTEN").collect();
    assert_eq!(listen.len(), 1, "{lb:?}");
    let l = listen[0];
    assert_eq!(l["src_addr"], format!("{b}:7174"), "{l}");
    assert_eq!(
        (&l["ps"], &l["qp_type"]),
        (&"TCP".into(), &"RC".into()),
        "{l}"
    );
    assert_eq!(l["comm"], "rping", "{l}");
    let conn_b = lb
        .iter()
        .find(|v| state(v) == "CONNECT")
        .expect("B's connection");
    assert_eq!(conn_b["src_addr"], format!("{b}:7174"), "{conn_b}");
    assert!(
        conn_b["dst_addr"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{a}:")),
        "{conn_b}"
    );
    let conn_a = la
        .iter()
        .find(|v| state(v) == "CONNECT")
        .expect("A's connection");
    assert_eq!(conn_a["dst_addr"], format!("{b}:7174"), "{conn_a}");
    // Each side's id names its end of the pair: A's source is B's destination.
    assert_eq!(conn_a["src_addr"], conn_b["dst_addr"], "{conn_a} {conn_b}");
    for v in [conn_a, conn_b] {
        assert!(v["lqpn"].as_u64().is_some_and(|q| q > 1), "{v}");
        assert_eq!(v["cm_state"], "ESTABLISHED", "{v}");
    }
    // The owners are the live rping processes.
    let mut pids = Vec::new();
    for v in [l, conn_a, conn_b] {
        let pid = v["pid"].as_u64().unwrap();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        assert_eq!(comm.trim_end(), "rping", "{v}");
        pids.push(pid);
    }
    assert_eq!(l["pid"], conn_b["pid"], "B's two ids are one process's");
    assert_ne!(conn_a["pid"], conn_b["pid"]);
    // The text form, one line per id.
    let t = res_cm_id(&pair, Side::B, false);
    assert!(
        t.lines()
            .any(|x| x.contains("state LISTEN ps TCP qp-type RC")
                && x.contains(&format!("src-addr {b}:7174"))
                && x.ends_with("comm rping")),
        "{t}"
    );
    for pid in [
        conn_a["pid"].as_u64().unwrap(),
        conn_b["pid"].as_u64().unwrap(),
    ] {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    let _ = server.wait();
    if let Some(mut c) = client {
        let _ = c.wait();
    }
}

/// The groups of `side`'s interface in its kernel's /proc/net/igmp (IPv4 groups are in
/// hex in host order: 239.1.2.3 is 030201EF).
fn igmp_groups(pair: &VethPair, side: Side) -> String {
    let o = pair.exec(side, &["cat", "/proc/net/igmp"]).unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// mckey (rdmacm-utils): UD ids joined to a group with `rdma_join_multicast_ex`, an
/// address handle from the MULTICAST_JOIN event, sends to QPN 0xFFFFFF with the event's
/// Q_Key. The receiver on B joins first (its ids' QPs attached by the library, so B's
/// kernel holds the IGMP membership), then the sender on A (`-s`) joins and sends its 10
/// messages from each of its `connections` ids; both exit 0, the receiver having polled
/// at least 10 messages on each of its ids' QPs (each of its QPs is in the group, so each
/// gets every sender's messages).
fn mckey_ipv4(connections: usize) {
    library_built();
    let p = tool("mckey");
    let pair = VethPair::new(1500).expect("veth pair");
    let (a, b) = (
        pair.end(Side::A).ipv4.to_string(),
        pair.end(Side::B).ipv4.to_string(),
    );
    let c = connections.to_string();
    let group = "239.1.2.3";
    let receiver = exec(&pair, Side::B, &[&p, "-m", group, "-b", &b, "-c", &c])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let receiver = std::thread::spawn(move || receiver.wait_with_output().unwrap());
    // The receiver posts its receives before it joins: once B's kernel has the group
    // (the library attached the QP), datagrams to it are received.
    let mut joined = false;
    for _ in 0..600 {
        if igmp_groups(&pair, Side::B).contains("030201EF") {
            joined = true;
            break;
        }
        if receiver.is_finished() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !joined {
        let r = receiver.join().unwrap();
        panic!("the receiver never joined 239.1.2.3: {}", text(&r));
    }
    let sender = exec(&pair, Side::A, &[&p, "-m", group, "-b", &a, "-s", "-c", &c])
        .output()
        .unwrap();
    let receiver = receiver.join().unwrap();
    for (who, o) in [("sender", &sender), ("receiver", &receiver)] {
        eprintln!("mckey {who}: {}", text(o));
        assert!(o.status.success(), "{who}: {}", text(o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains("joined dgid: ::ffff:239.1.2.3"),
            "{who}: {}",
            text(o)
        );
        assert!(
            out.contains("data transfers complete"),
            "{who}: {}",
            text(o)
        );
    }
    assert!(
        String::from_utf8_lossy(&receiver.stdout).contains("receiving data transfers"),
        "{}",
        text(&receiver)
    );
    // Both left: no membership is left behind.
    assert!(!igmp_groups(&pair, Side::B).contains("030201EF"));
    assert!(!igmp_groups(&pair, Side::A).contains("030201EF"));
}

#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_mckey_ipv4_group() {
    mckey_ipv4(1);
}

/// Two ids (two UD QPs) on each end in the one group.
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_mckey_ipv4_group_two_ids_each_end() {
    mckey_ipv4(2);
}

/// mckey with an IPv6 group: the kernel's cma refuses IPv6 groups on RoCE v2
/// (`cma_iboe_join_multicast`: ENOTSUPP, errno 524 in the program), and so does xrnic;
/// mckey reports the failed join and exits non-zero, as on rxe.
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_mckey_ipv6_group_is_refused_as_by_the_kernel() {
    library_built();
    let p = tool("mckey");
    let pair = VethPair::new(1500).expect("veth pair");
    let b = pair.end(Side::B).ipv6.to_string();
    let o = exec(&pair, Side::B, &[&p, "-m", "ff0e::1:2", "-b", &b])
        .output()
        .unwrap();
    eprintln!("mckey, IPv6 group: {}", text(&o));
    assert!(!o.status.success(), "{}", text(&o));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(all.contains("failure joining"), "{}", text(&o));
    assert!(all.contains("524"), "{}", text(&o));
}

/// What xrnic's librdmacm does not have fails at once with the documented errno and the
/// tool's own message, never a hang or an abort (docs/rdmacm.md "Not there yet"): XRC
/// ids (`rdma_xserver -c x`: EOPNOTSUPP from rdma_create_ep) and rsockets (rstream,
/// udpong, rcopy: ENOSYS from rsocket).
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_unsupported_xrc_and_rsockets_fail_cleanly() {
    library_built();
    let pair = VethPair::new(1500).expect("veth pair");
    let b = pair.end(Side::B).ipv4.to_string();
    for (name, args, says) in [
        (
            "rdma_xserver",
            &["-c", "x"][..],
            "rdma_create_ep: Operation not supported",
        ),
        (
            "rstream",
            &["-b", &b][..],
            "rsocket failed: Function not implemented",
        ),
        (
            "udpong",
            &["-b", &b][..],
            "rsocket failed: Function not implemented",
        ),
        ("rcopy", &[][..], "rsocket failed: Function not implemented"),
    ] {
        let p = tool(name);
        let mut a = vec![p.as_str()];
        a.extend_from_slice(args);
        let o = xrnic_exec(&pair, Side::B, &a).output().unwrap();
        // The tools exit -1 (255) on the error.
        assert_refused(&o, &format!("{name} {args:?}"), 255, says);
    }
}
