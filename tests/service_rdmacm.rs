//! rdma_cm through the device service (`xrnic up IF`): stock rdmacm-utils as nobody
//! through `xrnic exec`, their CM MADs carried by the service's GSI relay (QP1 is the
//! service's; src/service/gsi.rs, docs/rnic.md "rdma_cm through the service"). Server
//! and client on A's device through the service (the frames loop back in its driver),
//! and across the veth pair with the client on B's in-process device. Root tests
//! (`#[ignore = "needs root"]`, docs/testing.md); the library must be built
//! (`cargo build --workspace`).

mod common;
mod service_support;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{all_output, retry_perftest, text, xrnic_bin};
use service_support::{Kid, Svc, tool};
use xrnic_netns::Side;

/// Run a client (as nobody through the service) until the server's listen is up: while
/// it is not, the service answers the REQ with REJ "invalid service ID" (rdma_cm's
/// RDMA_CM_EVENT_REJECTED, 8) or a SIDR_REQ with a reject (UNREACHABLE), as a CM with
/// no listener does. The client's and the server's outputs (the server's when it has
/// exited; it is killed if the client never got through).
fn until_listening(mut server: Kid, mut run: impl FnMut() -> Output) -> (Output, Output) {
    let mut last = None;
    for _ in 0..100 {
        let o = run();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let early = (all.contains("RDMA_CM_EVENT_REJECTED") && all.contains('8'))
            || all.contains("RDMA_CM_EVENT_UNREACHABLE")
            || all.contains("rdma_connect: Connection refused");
        if !early {
            return (o, server.wait_with_output().unwrap());
        }
        last = Some(o);
        if server.child().try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = server.child().kill();
    let s = server.wait_with_output().unwrap();
    panic!(
        "the server never listened; the last client: {}\nthe server: {}",
        last.map(|o| text(&o)).unwrap_or_default(),
        text(&s)
    );
}

fn spawn(s: &Svc, args: &[&str]) -> Kid {
    Kid(Some(s.tool(args).spawn().unwrap()))
}

/// The ServiceIDs the service's clients listen on through its GSI relay (its `Res`
/// answer, asked on its socket in A).
fn listens(s: &Svc) -> Vec<u64> {
    use std::os::fd::AsFd;
    use xrnic::ipc::{self, Req, Resp};
    let name = ipc::socket_name(s.ifname());
    s.pair
        .run_in(Side::A, move || {
            let sock = rustix::net::socket_with(
                rustix::net::AddressFamily::UNIX,
                rustix::net::SocketType::SEQPACKET,
                rustix::net::SocketFlags::CLOEXEC,
                None,
            )
            .unwrap();
            let addr = rustix::net::SocketAddrUnix::new_abstract_name(&name).unwrap();
            rustix::net::connect(&sock, &addr).unwrap();
            let req = serde_json::to_vec(&Req::Res).unwrap();
            xrnic::io::shm::send_with_fds(sock.as_fd(), &req, &[]).unwrap();
            let mut buf = vec![0u8; ipc::MAX_MSG];
            let (n, _) = xrnic::io::shm::recv_with_fds(
                sock.as_fd(),
                &mut buf,
                rustix::net::RecvFlags::empty(),
            )
            .unwrap()
            .unwrap();
            match serde_json::from_slice(&buf[..n]).unwrap() {
                Resp::Res(d) => d.clients.into_iter().flat_map(|c| c.gsi_listens).collect(),
                r => panic!("{r:?}"),
            }
        })
        .unwrap()
}

/// Wait until a client of the service listens on TCP (`udp`: UDP) port `port`: a
/// client started after that meets the listener (a client refused part-way, some of
/// its connections accepted, would spoil a server counting its connections).
fn wait_listen(s: &Svc, port: u16, udp: bool) {
    use xrnic::wire::mad::{RDMA_PS_TCP, RDMA_PS_UDP, service_id};
    let sid = service_id(if udp { RDMA_PS_UDP } else { RDMA_PS_TCP }, port);
    for _ in 0..600 {
        if listens(s).contains(&sid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing listens on port {port} through the service");
}

/// rping's pings as the client printed them: `count` of them, each with rping's pattern
/// and `size - 1` bytes, and the server saw each one.
fn check_rping(client: &Output, server: &Output, size: usize, count: usize) {
    for (who, o) in [("client", client), ("server", server)] {
        assert!(o.status.success(), "{who}: {}", text(o));
    }
    // Nothing of xrnic's own on the tools' stderr (an unprivileged client's ids are not
    // published for `xrnic res cm_id`, and it does not say so each time).
    for o in [client, server] {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("cannot publish"), "{}", text(o));
    }
    let out = String::from_utf8_lossy(&client.stdout);
    let pings: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("ping data: rdma-ping-"))
        .collect();
    assert_eq!(pings.len(), count, "{}", text(client));
    let srv = String::from_utf8_lossy(&server.stdout);
    for (i, l) in pings.iter().enumerate() {
        let data = &l["ping data: ".len()..];
        assert!(data.starts_with(&format!("rdma-ping-{i}: ")), "{l}");
        assert_eq!(data.len(), size - 1, "{l}");
        assert!(
            srv.contains(&format!("server ping data: {data}")),
            "the server did not see ping {i}"
        );
    }
}

/// Stock rping, server and client as nobody on one device through the service, over
/// the IPv4 and the IPv6 address: both exit 0 and every ping's data is what rping sent.
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_rping_as_nobody_through_the_service() {
    let rping = tool("rping");
    let s = Svc::start();
    let a = s.pair.end(Side::A).ipv4.to_string();
    let server = spawn(
        &s,
        &[
            &rping, "-s", "-a", &a, "-p", "7300", "-C", "10", "-S", "100", "-v",
        ],
    );
    wait_listen(&s, 7300, false);
    let (c, sv) = until_listening(server, || {
        s.tool(&[
            &rping, "-c", "-a", &a, "-p", "7300", "-C", "10", "-S", "100", "-v",
        ])
        .output()
        .unwrap()
    });
    check_rping(&c, &sv, 100, 10);
    // Over the IPv6 GID too (the MADs' GRH an IPv6 header).
    let a6 = s.pair.end(Side::A).ipv6.to_string();
    let server = spawn(
        &s,
        &[
            &rping, "-s", "-a", &a6, "-p", "7302", "-C", "5", "-S", "64", "-v",
        ],
    );
    wait_listen(&s, 7302, false);
    let (c, sv) = until_listening(server, || {
        s.tool(&[
            &rping, "-c", "-a", &a6, "-p", "7302", "-C", "5", "-S", "64", "-v",
        ])
        .output()
        .unwrap()
    });
    check_rping(&c, &sv, 64, 5);
    let left = s.wait_empty(Duration::from_secs(2));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Across the wire: rping's server as nobody through A's service, its client on B's
/// in-process device (root, `xrnic exec`): the REQ comes in on the service's QP1 and is
/// relayed to the server's CM; the REP, RTU, DREQ and DREP go out the same way.
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_rping_across_the_pair_server_through_the_service() {
    let rping = tool("rping");
    let s = Svc::start();
    let a = s.pair.end(Side::A).ipv4.to_string();
    let server = spawn(
        &s,
        &[
            &rping, "-s", "-a", &a, "-p", "7301", "-C", "10", "-S", "64", "-v",
        ],
    );
    let b = s.pair.end(Side::B);
    wait_listen(&s, 7301, false);
    let (c, sv) = until_listening(server, || {
        in_process(b)
            .args([
                &rping, "-c", "-a", &a, "-p", "7301", "-C", "10", "-S", "64", "-v",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap()
    });
    check_rping(&c, &sv, 64, 10);
}

/// `xrnic exec` on `end`'s in-process device (root, not through the service), bounded by
/// timeout(1); the program and its arguments follow.
fn in_process(end: &xrnic_netns::End) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &end.netns, "timeout", "60", xrnic_bin()])
        .args(["exec", "--in-process", "--netdev", &end.ifname, "--"]);
    c
}

/// The other way: rping's client as nobody through A's service, its server on B's
/// in-process device. The client resolves its route to B itself (the namespace's route
/// and neighbour tables, on its own thread: as nobody it may not setns(2), not even into
/// the namespace it is in; src/verbs/netdev.rs `NetNs::run`).
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_rping_across_the_pair_client_through_the_service() {
    let rping = tool("rping");
    let s = Svc::start();
    let b = s.pair.end(Side::B);
    let baddr = b.ipv4.to_string();
    let server = Kid(Some(
        in_process(b)
            .args([
                &rping, "-s", "-a", &baddr, "-p", "7302", "-C", "10", "-S", "64", "-v",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let (c, sv) = until_listening(server, || {
        s.tool(&[
            &rping, "-c", "-a", &baddr, "-p", "7302", "-C", "10", "-S", "64", "-v",
        ])
        .output()
        .unwrap()
    });
    check_rping(&c, &sv, 64, 10);
}

/// Two servers of two processes listening at once on two ports: each gets its own
/// clients. The same port a second time: that listen fails with EADDRINUSE, as
/// rdma_listen on a port another process holds does with the kernel's rdma_cm.
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn two_listeners_on_two_ports_and_the_same_port_twice_fails() {
    let rping = tool("rping");
    let s = Svc::start();
    let a = s.pair.end(Side::A).ipv4.to_string();
    let srv = |port: &str| {
        spawn(
            &s,
            &[
                &rping, "-s", "-a", &a, "-p", port, "-C", "3", "-S", "64", "-v",
            ],
        )
    };
    let cli = |server: Kid, port: &str| {
        wait_listen(&s, port.parse().unwrap(), false);
        until_listening(server, || {
            s.tool(&[
                &rping, "-c", "-a", &a, "-p", port, "-C", "3", "-S", "64", "-v",
            ])
            .output()
            .unwrap()
        })
    };
    let (s1, s2) = (srv("7310"), srv("7311"));
    // Both listen: a client of each is served (the first listener stays up until its
    // client ran, so the two overlap).
    let (c2, o2) = cli(s2, "7311");
    wait_listen(&s, 7310, false);
    let dup = s
        .tool(&[&rping, "-s", "-a", &a, "-p", "7310", "-C", "1"])
        .output()
        .unwrap();
    assert!(!dup.status.success(), "{}", text(&dup));
    assert!(
        String::from_utf8_lossy(&dup.stderr).contains("Address already in use"),
        "{}",
        text(&dup)
    );
    let (c1, o1) = cli(s1, "7310");
    check_rping(&c1, &o1, 64, 3);
    check_rping(&c2, &o2, 64, 3);
}

/// Stock udaddy (SIDR_REQ / SIDR_REP, UD QPs) and ucmatose (RC, several connections in
/// one process) as nobody through the service: both ends print "return status 0" after
/// their data transfers.
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_udaddy_and_ucmatose_as_nobody_through_the_service() {
    let (udaddy, ucmatose) = (tool("udaddy"), tool("ucmatose"));
    let s = Svc::start();
    let a = s.pair.end(Side::A).ipv4.to_string();
    for (prog, srv, cli, port, udp) in [
        (
            &udaddy,
            // udaddy has no port option: 7174, its own.
            vec!["-b", a.as_str(), "-c", "2"],
            vec!["-s", a.as_str(), "-c", "2"],
            7174,
            true,
        ),
        (
            &ucmatose,
            vec!["-b", a.as_str(), "-c", "3", "-C", "2", "-p", "7321"],
            vec!["-s", a.as_str(), "-c", "3", "-C", "2", "-p", "7321"],
            7321,
            false,
        ),
    ] {
        let mut v = vec![prog.as_str()];
        v.extend_from_slice(&srv);
        let server = spawn(&s, &v);
        let mut v = vec![prog.as_str()];
        v.extend_from_slice(&cli);
        wait_listen(&s, port, udp);
        let (c, sv) = until_listening(server, || s.tool(&v).output().unwrap());
        for (who, o) in [("client", &c), ("server", &sv)] {
            assert!(o.status.success(), "{prog} {who}: {}", text(o));
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(
                out.contains("data transfers complete"),
                "{prog} {who}: {}",
                text(o)
            );
            assert!(out.contains("return status 0"), "{prog} {who}: {}", text(o));
        }
    }
    let left = s.wait_empty(Duration::from_secs(2));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// librdmacm's synchronous API (rdma_server / rdma_client: rdma_getaddrinfo,
/// rdma_create_ep, rdma_listen on the wildcard address, blocking accept and connect) as
/// nobody through the service: one message each way, both "end 0".
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn stock_rdma_server_rdma_client_as_nobody_through_the_service() {
    let (srv, cli) = (tool("rdma_server"), tool("rdma_client"));
    let s = Svc::start();
    let a = s.pair.end(Side::A).ipv4.to_string();
    let server = spawn(&s, &[&srv, "-p", "7330"]);
    wait_listen(&s, 7330, false);
    let (c, sv) = until_listening(server, || {
        s.tool(&[&cli, "-s", &a, "-p", "7330"]).output().unwrap()
    });
    for (who, o, name) in [
        ("client", &c, "rdma_client"),
        ("server", &sv, "rdma_server"),
    ] {
        assert!(o.status.success(), "{who}: {}", text(o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(&format!("{name}: end 0")),
            "{who}: {}",
            text(o)
        );
    }
}

/// perftest's `-R` (its connections through librdmacm) as nobody through the service:
/// `ib_send_lat -R`, both ends exit 0 with their results row. A client quicker than the
/// server's second `rdma_listen` is refused (REJ 8, perftest's own race: see
/// tests/rdmacm_stock.rs `perftest_rdma_cm`); the pair then starts again.
#[test]
#[cfg_attr(not(xrnic_no_perftest), ignore = "needs root")]
#[cfg_attr(xrnic_no_perftest, ignore = "needs root and perftest")]
fn stock_ib_send_lat_rdma_cm_as_nobody_through_the_service() {
    let p = tool("ib_send_lat");
    let s = Svc::start();
    let a = s.pair.end(Side::A).ipv4.to_string();
    let mut tries = 0;
    // perftest's own refusal to measure on a busy machine: the pair again (bounded).
    let (c, sv) = retry_perftest(
        "ib_send_lat -R",
        || 'pair: loop {
            let server = spawn(&s, &[&p, "-R", "-n", "100", "-p", "18600"]);
            loop {
                tries += 1;
                assert!(tries <= 50, "the server never listened in time");
                let c = s
                    .tool(&[&p, "-R", "-n", "100", "-p", "18600", &a])
                    .output()
                    .unwrap();
                let all = format!(
                    "{}{}",
                    String::from_utf8_lossy(&c.stdout),
                    String::from_utf8_lossy(&c.stderr)
                );
                // The exchange's connection refused: perftest prints "Unexpected CM event"
                // with the status 8 and "Unable to init the socket connection".
                let refused = all.contains("RDMA_CM_EVENT_REJECTED; error: 8")
                    || (all.contains("Unexpected CM event") && all.contains(" 8"));
                if !refused {
                    break 'pair (c, server.wait_with_output().unwrap());
                }
                std::thread::sleep(Duration::from_millis(100));
                if all.contains("Failed to create RDMA CM connection") {
                    break; // the test's connection was refused: a fresh server
                }
            }
        },
        |(c, sv)| all_output(&[c, sv]),
    );
    for (who, o) in [("client", &c), ("server", &sv)] {
        assert!(o.status.success(), "{who}: {}", text(o));
        let row = String::from_utf8_lossy(&o.stdout).lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 2 && f[0] == "2" && f[1] == "100"
        });
        assert!(row, "{who}: no results row: {}", text(o));
    }
}

/// A listening server killed (`kill -9`): the service frees its listen with the rest
/// of its resources, and a new server on the same port serves a client.
#[test]
#[cfg_attr(not(xrnic_no_rdmacm_utils), ignore = "needs root")]
#[cfg_attr(xrnic_no_rdmacm_utils, ignore = "needs root and rdmacm-utils")]
fn a_killed_listeners_port_is_free_again() {
    use xrnic::wire::mad::{RDMA_PS_TCP, service_id};
    let rping = tool("rping");
    let s = Svc::start();
    let a = s.pair.end(Side::A).ipv4.to_string();
    let args = [
        rping.as_str(),
        "-s",
        "-a",
        &a,
        "-p",
        "7340",
        "-C",
        "2",
        "-S",
        "64",
        "-v",
    ];
    let first = spawn(&s, &args);
    wait_listen(&s, 7340, false);
    drop(first); // SIGKILL
    let sid = service_id(RDMA_PS_TCP, 7340);
    let freed = (0..600).any(|_| {
        let l = listens(&s);
        if l.contains(&sid) {
            std::thread::sleep(Duration::from_millis(50));
        }
        !l.contains(&sid)
    });
    assert!(freed, "the killed server's listen stayed");
    let second = spawn(&s, &args);
    wait_listen(&s, 7340, false);
    let (c, sv) = until_listening(second, || {
        s.tool(&[
            &rping, "-c", "-a", &a, "-p", "7340", "-C", "2", "-S", "64", "-v",
        ])
        .output()
        .unwrap()
    });
    check_rping(&c, &sv, 64, 2);
}
