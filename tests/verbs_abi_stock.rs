//! The stock tools docs/verbs-abi.md lists as running unmodified: Debian's stock, unmodified
//! rdma-core and perftest binaries on both ends of a veth pair in two namespaces, each
//! end on xrnic through `xrnic exec` (root: AF_XDP, XDP). Every run must exit 0 on both
//! ends and print the tool's own result lines (perftest's table, ibv_rc_pingpong's
//! "iters in"); data is checked where the tool checks it (`ibv_rc_pingpong -c`).
//! The library must be built (`cargo build --workspace`, as `make test` does).

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{
    all_output, assert_refused, perftest_refused_to_measure, retry_perftest, stock_tool, text,
    xrnic_bin, xrnic_exec,
};
use xrnic_netns::{Side, VethPair};

fn library_built() {
    let lib = std::path::Path::new(xrnic_bin()).with_file_name("libibverbs.so");
    assert!(
        lib.exists(),
        "{} missing: build the workspace first (cargo build --workspace)",
        lib.display()
    );
}

/// `PROGRAM ARGS` on `side` through `xrnic exec` (`common::xrnic_exec`: bounded).
fn exec(pair: &VethPair, side: Side, args: &[&str]) -> Command {
    xrnic_exec(pair, side, args)
}

/// Wait until something listens on TCP `port` in `side`'s namespace (bounded).
fn wait_listening(pair: &VethPair, side: Side, port: u16) {
    for _ in 0..400 {
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

/// The server on B, then the client on A (`args` + B's address); both outputs, each
/// asserted to have exited 0.
fn run_both(pair: &VethPair, program: &str, args: &[&str]) -> (Output, Output) {
    let (client, server) = exchange(pair, program, args);
    assert_both_exited_0(program, args, &client, &server);
    (client, server)
}

fn assert_both_exited_0(program: &str, args: &[&str], client: &Output, server: &Output) {
    for (who, o) in [("client", client), ("server", server)] {
        assert!(
            o.status.success(),
            "{who} of {program} {args:?}: {}",
            text(o)
        );
    }
}

/// The server on B, then the client on A (`args` + B's address): (client, server).
fn exchange(pair: &VethPair, program: &str, args: &[&str]) -> (Output, Output) {
    let mut cmd: Vec<&str> = vec![program];
    cmd.extend_from_slice(args);
    let server = exec(pair, Side::B, &cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // ibv_rc_pingpong and perftest both exchange their QP numbers on TCP port 18515.
    wait_listening(pair, Side::B, 18515);
    let b = pair.end(Side::B).ipv4.to_string();
    cmd.push(&b);
    let client = exec(pair, Side::A, &cmd).output().unwrap();
    let server = server.wait_with_output().unwrap();
    (client, server)
}

/// perftest's result table: the `#bytes` header, then at least one row whose first
/// column is a message size and whose second is the iteration count. Returns the rows.
fn perftest_rows(o: &Output, what: &str) -> Vec<Vec<String>> {
    let s = String::from_utf8_lossy(&o.stdout);
    let t = text(o);
    let mut lines = s
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    assert!(lines.next().is_some(), "{what}: no perftest table: {t}");
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .take_while(|c| c.len() >= 2 && c[0].parse::<u64>().is_ok())
        .collect();
    assert!(!rows.is_empty(), "{what}: an empty perftest table: {t}");
    for r in &rows {
        assert!(r[1].parse::<u64>().unwrap() > 0, "{what}: {r:?}: {t}");
    }
    rows
}

/// A perftest tool between the two ends: the client's table (the passive side of the
/// READ, atomic and RDMA WRITE bandwidth tests prints none).
fn perftest(pair: &VethPair, program: &str, args: &[&str]) -> Vec<Vec<String>> {
    let what = format!("{program} {args:?}");
    let (client, server) = retry_perftest(
        &what,
        || exchange(pair, program, args),
        |(c, s)| all_output(&[c, s]),
    );
    assert_both_exited_0(program, args, &client, &server);
    let name = program.rsplit('/').next().unwrap_or(program);
    if ["ib_write_lat", "ib_send_lat", "ib_send_bw"].contains(&name) {
        perftest_rows(&server, &format!("{what} server"));
    }
    perftest_rows(&client, &format!("{what} client"))
}

/// perftest's refusal to measure (its clock calibration on a busy machine) is recognised
/// by its exact two lines and nothing else: only that case is run again
/// (`common::retry_perftest`); any other failure of a perftest run fails its test.
#[test]
fn perftest_refusal_is_recognised_by_its_own_message_only() {
    let refusal = " Correlation coefficient r^2: 0.869657 < 0.9\n Can't produce a report\n";
    assert!(perftest_refused_to_measure(refusal));
    assert!(perftest_refused_to_measure(&format!(
        "#bytes #iterations\n{refusal}"
    )));
    for other in [
        // Only one of the two lines.
        " Correlation coefficient r^2: 0.869657 < 0.9\n",
        " Can't produce a report\n",
        // perftest's other "no report" (event mode) and an ordinary failure.
        " Due to this issue, Perftest cannot produce a report when in event mode.\n",
        "Couldn't connect to 192.0.2.2:18515\n Unable to init the socket connection\n",
    ] {
        assert!(!perftest_refused_to_measure(other), "{other:?}");
    }
}

/// ib_write_lat: each side spins on the last byte of its buffer for the peer's RDMA
/// WRITE and calls no verb meanwhile, so the device must receive on its own thread
/// (src/driver/poll.rs, the lease shortened after a poll that found completions).
#[test]
#[cfg_attr(not(xrnic_no_perftest), ignore = "needs root")]
#[cfg_attr(xrnic_no_perftest, ignore = "needs root and perftest")]
fn stock_ib_write_lat_both_ends() {
    library_built();
    let p = stock_tool("ib_write_lat", "perftest");
    let pair = VethPair::new(1500).expect("veth pair");
    let rows = perftest(&pair, &p, &["-n", "200", "-x", "1"]);
    assert_eq!(rows[0][0], "2", "{rows:?}");
    assert_eq!(rows[0][1], "200", "{rows:?}");
}

#[test]
#[cfg_attr(not(xrnic_no_perftest), ignore = "needs root")]
#[cfg_attr(xrnic_no_perftest, ignore = "needs root and perftest")]
fn stock_latency_tools_both_ends() {
    library_built();
    let pair = VethPair::new(1500).expect("veth pair");
    for (name, size) in [
        ("ib_read_lat", "2"),
        ("ib_send_lat", "2"),
        ("ib_atomic_lat", "8"),
        ("ib_write_lat", "2"),
    ] {
        let p = stock_tool(name, "perftest");
        // GID 0 (fe80:: from the MAC) for one, the IPv4-mapped GID for the others.
        let gid = if name == "ib_send_lat" { "0" } else { "1" };
        let rows = perftest(&pair, &p, &["-n", "100", "-x", gid]);
        assert_eq!((rows[0][0].as_str(), rows[0][1].as_str()), (size, "100"));
    }
}

#[test]
#[cfg_attr(not(xrnic_no_perftest), ignore = "needs root")]
#[cfg_attr(xrnic_no_perftest, ignore = "needs root and perftest")]
fn stock_bandwidth_tools_all_sizes_queues_duration_bidirectional() {
    library_built();
    let pair = VethPair::new(1500).expect("veth pair");
    for name in ["ib_write_bw", "ib_read_bw", "ib_send_bw"] {
        let p = stock_tool(name, "perftest");
        // -a: every size from 2 bytes to 8 MiB, one table row each.
        let rows = perftest(&pair, &p, &["-a", "-n", "5", "-x", "1"]);
        assert_eq!(rows.len(), 23, "{name} -a: {rows:?}");
        assert_eq!(rows[0][0], "2");
        assert_eq!(rows[22][0], "8388608");
        let rows = perftest(&pair, &p, &["-q", "4", "-n", "20", "-x", "1"]);
        assert_eq!(rows[0][1], "80", "{name} -q 4: 4 QPs x 20: {rows:?}");
        perftest(&pair, &p, &["-D", "2", "-x", "1"]);
        perftest(&pair, &p, &["-b", "-n", "20", "-x", "1"]);
    }
    let p = stock_tool("ib_atomic_bw", "perftest");
    // perftest refuses -a for atomics ("Message size cannot be changed"): both
    // atomic operations instead.
    for op in ["FETCH_AND_ADD", "CMP_AND_SWAP"] {
        let rows = perftest(&pair, &p, &["-A", op, "-n", "50", "-x", "1"]);
        assert_eq!((rows[0][0].as_str(), rows[0][1].as_str()), ("8", "50"));
    }
    let rows = perftest(&pair, &p, &["-q", "4", "-n", "20", "-x", "1"]);
    assert_eq!(rows[0][1], "80", "ib_atomic_bw -q 4: {rows:?}");
    perftest(&pair, &p, &["-D", "2", "-x", "1"]);
    perftest(&pair, &p, &["-b", "-n", "20", "-x", "1"]);
}

/// ibv_rc_pingpong with `-c` (each side checks the bytes it received): message sizes,
/// path MTUs 1024 and 4096 on a 9000-byte link, completion events (`-e`), GIDs 0 and 1.
#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn stock_ibv_rc_pingpong_sizes_mtus_events_gids_checked() {
    library_built();
    let pp = stock_tool("ibv_rc_pingpong", "ibverbs-utils");
    let pair = VethPair::new(9000).expect("veth pair");
    let runs: &[&[&str]] = &[
        &["-s", "1", "-g", "1"],
        &["-s", "1000", "-g", "0"],
        &["-s", "4096", "-g", "1", "-e"],
        &["-s", "65536", "-g", "0", "-e"],
        &["-s", "65536", "-g", "1", "-m", "1024"],
        &["-s", "20000", "-g", "1", "-m", "4096"],
        &["-s", "8192", "-g", "0", "-m", "4096", "-e"],
    ];
    for args in runs {
        let mut a = args.to_vec();
        a.extend_from_slice(&["-n", "50", "-c"]);
        let (client, server) = run_both(&pair, &pp, &a);
        let size = args[1];
        for (who, o) in [("client", &client), ("server", &server)] {
            let s = String::from_utf8_lossy(&o.stdout);
            let t = text(o);
            assert!(s.contains("remote address: LID 0x0000"), "{who} {a:?}: {t}");
            let bytes = u64::from(50u32) * size.parse::<u64>().unwrap() * 2;
            assert!(
                s.contains(&format!("{bytes} bytes in ")) && s.contains("50 iters in "),
                "{who} {a:?}: {t}"
            );
        }
    }
}

/// ibv_rc_pingpong with `-N` ("use new post send WR API": `ibv_create_qp_ex` with
/// SEND_OPS_FLAGS, then `ibv_wr_start` / `ibv_wr_send` / `ibv_wr_set_sge` /
/// `ibv_wr_complete` for every send) and `-t` (an `ibv_create_cq_ex` CQ with completion
/// timestamps, polled with `ibv_start_poll`), each alone and together, data checked
/// (`-c`), with and without completion events.
#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn stock_ibv_rc_pingpong_new_post_send_api_and_timestamps_checked() {
    library_built();
    let pp = stock_tool("ibv_rc_pingpong", "ibverbs-utils");
    let pair = VethPair::new(1500).expect("veth pair");
    for args in [
        &["-s", "4096", "-g", "1", "-N"][..],
        &["-s", "1", "-g", "0", "-e", "-N"],
        &["-s", "4096", "-g", "1", "-t"],
        &["-s", "64", "-g", "1", "-t", "-N", "-e"],
    ] {
        let mut a = args.to_vec();
        a.extend_from_slice(&["-n", "50", "-c"]);
        let (client, server) = run_both(&pair, &pp, &a);
        let bytes = 50 * args[1].parse::<u64>().unwrap() * 2;
        for (who, o) in [("client", &client), ("server", &server)] {
            let s = String::from_utf8_lossy(&o.stdout);
            assert!(
                s.contains(&format!("{bytes} bytes in ")) && s.contains("50 iters in "),
                "{who} {a:?}: {}",
                text(o)
            );
            // With -t it reports the spread of the receive completions' timestamps.
            if a.contains(&"-t") {
                assert!(
                    s.contains("Max receive completion clock cycles"),
                    "{who} {a:?}: {s}"
                );
            }
        }
    }
}

/// ibv_ud_pingpong: UD QPs, address handles from the peer's GID, the GRH
/// in front of every receive; both GID kinds (0: fe80:: from the MAC, 1: IPv4-mapped),
/// `-c` checks the bytes, `-e` sleeps on completion events. The link's 1500 bytes give
/// an active MTU of 1024, the largest datagram the tool accepts.
#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn stock_ibv_ud_pingpong_gids_checked() {
    library_built();
    let pp = stock_tool("ibv_ud_pingpong", "ibverbs-utils");
    let pair = VethPair::new(1500).expect("veth pair");
    for args in [
        &["-g", "0", "-s", "1024"][..],
        &["-g", "1", "-s", "1024"],
        &["-g", "1", "-s", "16", "-e"],
    ] {
        let mut a = args.to_vec();
        a.extend_from_slice(&["-n", "50", "-c"]);
        let (client, server) = run_both(&pair, &pp, &a);
        let size: u64 = args[3].parse().unwrap();
        for (who, o) in [("client", &client), ("server", &server)] {
            let s = String::from_utf8_lossy(&o.stdout);
            let t = text(o);
            assert!(
                s.contains(&format!("{} bytes in ", 50 * size * 2)) && s.contains("50 iters in "),
                "{who} {a:?}: {t}"
            );
        }
    }
}

/// ibv_uc_pingpong and ibv_srq_pingpong (16 QPs on one SRQ), data checked.
#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn stock_ibv_uc_and_srq_pingpong_checked() {
    library_built();
    let pair = VethPair::new(1500).expect("veth pair");
    for (name, args) in [
        ("ibv_uc_pingpong", &["-g", "1", "-s", "4096"][..]),
        ("ibv_uc_pingpong", &["-g", "0", "-s", "1", "-e"]),
        ("ibv_srq_pingpong", &["-g", "1", "-q", "16", "-s", "4096"]),
        (
            "ibv_srq_pingpong",
            &["-g", "0", "-q", "16", "-s", "100", "-e"],
        ),
    ] {
        let pp = stock_tool(name, "ibverbs-utils");
        let mut a = args.to_vec();
        a.extend_from_slice(&["-n", "50", "-c"]);
        let (client, server) = run_both(&pair, &pp, &a);
        for (who, o) in [("client", &client), ("server", &server)] {
            let s = String::from_utf8_lossy(&o.stdout);
            assert!(
                s.contains("50 iters in "),
                "{name} {who} {a:?}: {}",
                text(o)
            );
        }
    }
}

/// perftest over UD and UC, and RC with an SRQ: send bandwidth and latency over UD,
/// send and RDMA WRITE bandwidth over UC, send bandwidth with `--use-srq`.
#[test]
#[cfg_attr(not(xrnic_no_perftest), ignore = "needs root")]
#[cfg_attr(xrnic_no_perftest, ignore = "needs root and perftest")]
fn stock_perftest_ud_uc_srq() {
    library_built();
    let pair = VethPair::new(1500).expect("veth pair");
    for (name, args, size) in [
        (
            "ib_send_bw",
            &["-c", "UD", "-n", "200", "-x", "1"][..],
            "1024",
        ),
        (
            "ib_send_bw",
            &["-c", "UD", "-n", "200", "-x", "0", "-s", "64"],
            "64",
        ),
        ("ib_send_lat", &["-c", "UD", "-n", "100", "-x", "1"], "2"),
        // UC has no flow control: a lost packet is a lost message, and the server waits
        // for all 200. 64 KiB messages put up to 128 x 64 frames in flight, more than the
        // receiver's AF_XDP ring holds while its thread waits for a core (it failed so
        // under load); one packet per message (path MTU 1024) keeps the burst within it.
        (
            "ib_send_bw",
            &["-c", "UC", "-n", "200", "-x", "1", "-s", "1024"],
            "1024",
        ),
        (
            "ib_write_bw",
            &["-c", "UC", "-n", "200", "-x", "1", "-s", "1024"],
            "1024",
        ),
        (
            "ib_send_bw",
            &["--use-srq", "-n", "200", "-x", "1"],
            "65536",
        ),
        (
            "ib_send_bw",
            &["--use-srq", "-q", "4", "-n", "50", "-x", "1"],
            "65536",
        ),
    ] {
        let p = stock_tool(name, "perftest");
        let rows = perftest(&pair, &p, args);
        assert_eq!(rows[0][0], size, "{name} {args:?}: {rows:?}");
    }
}

/// What xrnic does not have fails at once with the tool's own message and exit status 1,
/// never a hang or an abort (docs/verbs-abi.md "Known limits"): on-demand paging
/// (`ibv_rc_pingpong -o`: the ODP caps are zero), device memory (`-j`: `ibv_alloc_dm` EOPNOTSUPP), XRC
/// (`ibv_xsrq_pingpong`: `ibv_open_xrcd` EOPNOTSUPP, errno 95). Each checks before it
/// waits for a peer, so one end suffices.
#[test]
#[cfg_attr(not(xrnic_no_ibverbs_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_ibverbs_utils, ignore = "needs root and ibverbs-utils")]
fn stock_unsupported_features_fail_cleanly() {
    library_built();
    let pair = VethPair::new(1500).expect("veth pair");
    for (name, args, says) in [
        (
            "ibv_rc_pingpong",
            &["-g", "1", "-o"][..],
            "The device isn't ODP capable",
        ),
        (
            "ibv_rc_pingpong",
            &["-g", "1", "-j"],
            "Device doesn't support dm allocation",
        ),
        (
            "ibv_xsrq_pingpong",
            &["-g", "1"],
            "Couldn't Open the XRC Domain 95",
        ),
    ] {
        let p = stock_tool(name, "ibverbs-utils");
        let mut a = vec![p.as_str()];
        a.extend_from_slice(args);
        let o = exec(&pair, Side::B, &a).output().unwrap();
        assert_refused(&o, &format!("{name} {args:?}"), 1, says);
    }
}
