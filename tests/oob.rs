//! The out-of-band exchanges over real TCP on 127.0.0.1:
//! - our client against our server, for ibv_rc_pingpong and every perftest bw test, with
//!   one and two QPs, asserting that each side receives exactly what the other sent;
//! - our side against a scripted peer that reads and writes the exact byte sequence of the
//!   C tools (docs/oob.md), so a missing, extra or reordered message fails;
//! - peers that stall, close early or send garbage give errors, never hangs or panics.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use xrnic::oob::perftest::{
    self, BwReport, BwTest, Config, KeyFormat, PerftestDest, Role, VERSION_LEN,
};
use xrnic::oob::pingpong::{self, PingpongDest};
use xrnic::oob::{Error, MessageError};
use xrnic::wire::{Psn, Qpn, Rkey};

/// Long enough never to fire on a loaded machine when the peer is alive.
const ALIVE: Duration = Duration::from_secs(30);
/// Short deadline for the tests where the peer is meant to stall.
const STALL: Duration = Duration::from_millis(300);

fn pp_dest(seed: u32) -> PingpongDest {
    PingpongDest {
        lid: 0,
        qpn: Qpn::new(0x10 + seed),
        psn: Psn::new(0x00ab_cd00 + seed),
        gid: [
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, seed as u8,
        ],
    }
}

fn pf_dest(side: u32, round: u32, qp: u32) -> PerftestDest {
    PerftestDest {
        lid: 0,
        out_reads: 1 + side as u16,
        qpn: Qpn::new(0x100 * (side + 1) + qp),
        psn: Psn::new(0x0012_3400 + 16 * round + qp),
        rkey: Rkey(0x1000 * (side + 1) + 0x10 * round + qp),
        vaddr: 0x7f00_0000_0000 + u64::from(side) * 0x1_0000_0000 + u64::from(qp) * 0x10000,
        gid: [
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0xff,
            0xff,
            192,
            0,
            2,
            1 + side as u8,
        ],
        srqn: 0,
    }
}

fn dests(side: u32, round: u32, qps: u32) -> Vec<PerftestDest> {
    (0..qps).map(|qp| pf_dest(side, round, qp)).collect()
}

fn config(test: BwTest) -> Config {
    Config {
        io_timeout: ALIVE,
        test_timeout: ALIVE,
        ..Config::new(test)
    }
}

// ---------------------------------------------------------------- rc_pingpong

#[test]
fn pingpong_client_and_server_receive_what_the_other_sent() {
    let server = pingpong::Server::bind("127.0.0.1:0")
        .unwrap()
        .with_timeout(ALIVE);
    let addr = server.local_addr().unwrap();
    let srv = thread::spawn(move || {
        let pending = server.accept().unwrap();
        let got = *pending.remote();
        pending.reply(&pp_dest(2)).unwrap();
        got
    });
    let got_by_client = pingpong::client_exchange(addr, &pp_dest(1), ALIVE).unwrap();
    let got_by_server = srv.join().unwrap();
    assert_eq!(got_by_client, pp_dest(2));
    assert_eq!(got_by_server, pp_dest(1));
}

#[test]
fn pingpong_client_speaks_the_exact_rc_pingpong_sequence() {
    // The C server: read 52, write 52, read exactly sizeof "done".
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let srv = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut msg = [0u8; 52];
        s.read_exact(&mut msg).unwrap();
        assert_eq!(
            &msg[..],
            b"0000:000011:abcd01:00000000000000000000ffffc0000201\0"
        );
        s.write_all(b"0000:000012:abcd02:00000000000000000000ffffc0000202\0")
            .unwrap();
        let mut done = [0u8; 5];
        s.read_exact(&mut done).unwrap();
        assert_eq!(&done, b"done\0");
        assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0, "client must close");
    });
    let got = pingpong::client_exchange(addr, &pp_dest(1), ALIVE).unwrap();
    srv.join().unwrap();
    assert_eq!(got, pp_dest(2));
}

#[test]
fn pingpong_server_speaks_the_exact_rc_pingpong_sequence() {
    let server = pingpong::Server::bind("127.0.0.1:0")
        .unwrap()
        .with_timeout(ALIVE);
    let addr = server.local_addr().unwrap();
    let srv = thread::spawn(move || {
        let pending = server.accept().unwrap();
        let got = *pending.remote();
        pending.reply(&pp_dest(2)).unwrap();
        got
    });
    // The C client: write 52, read 52, write "done" with its NUL.
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"0000:000011:abcd01:00000000000000000000ffffc0000201\0")
        .unwrap();
    let mut msg = [0u8; 52];
    c.read_exact(&mut msg).unwrap();
    assert_eq!(
        &msg[..],
        b"0000:000012:abcd02:00000000000000000000ffffc0000202\0"
    );
    c.write_all(b"done\0").unwrap();
    assert_eq!(srv.join().unwrap(), pp_dest(1));
}

#[test]
fn pingpong_client_times_out_on_a_silent_server() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let e = pingpong::client_exchange(addr, &pp_dest(1), STALL).unwrap_err();
    // The listener keeps the connection open (in its backlog) and never answers.
    match e {
        Error::Timeout {
            step,
            waited,
            expected,
            received,
        } => {
            assert_eq!(step, "read remote address");
            assert_eq!(expected, 52);
            assert!(received.is_empty());
            assert!(waited >= STALL);
        }
        other => panic!("expected a timeout, got {other}"),
    }
    drop(listener);
}

#[test]
fn pingpong_server_reports_a_client_that_closes_mid_message() {
    let server = pingpong::Server::bind("127.0.0.1:0")
        .unwrap()
        .with_timeout(ALIVE);
    let addr = server.local_addr().unwrap();
    let srv = thread::spawn(move || server.accept().map(|p| *p.remote()));
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"0000:000011:ab").unwrap();
    drop(c);
    match srv.join().unwrap() {
        Err(Error::PeerClosed {
            step,
            expected,
            received,
        }) => {
            assert_eq!(step, "read remote address");
            assert_eq!(expected, 52);
            assert_eq!(received, b"0000:000011:ab");
        }
        other => panic!("expected PeerClosed, got {other:?}"),
    }
}

#[test]
fn pingpong_server_rejects_garbage_and_a_wrong_done() {
    let server = pingpong::Server::bind("127.0.0.1:0")
        .unwrap()
        .with_timeout(ALIVE);
    let addr = server.local_addr().unwrap();
    let srv = thread::spawn(move || {
        let first = server.accept().map(|p| *p.remote());
        let second = server.accept().and_then(|p| p.reply(&pp_dest(2)));
        (first, second)
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(&[b'z'; 52]).unwrap();
    let mut c2 = TcpStream::connect(addr).unwrap();
    c2.write_all(&pp_dest(1).encode()).unwrap();
    let mut msg = [0u8; 52];
    c2.read_exact(&mut msg).unwrap();
    c2.write_all(b"dome\0").unwrap();
    let (first, second) = srv.join().unwrap();
    match first {
        Err(Error::BadMessage {
            problem: MessageError::MissingNul,
            bytes,
            ..
        }) => assert_eq!(bytes, vec![b'z'; 52]),
        other => panic!("expected BadMessage, got {other:?}"),
    }
    match second {
        Err(Error::BadMessage { step, bytes, .. }) => {
            assert_eq!(step, "done");
            assert_eq!(bytes, b"dome\0");
        }
        other => panic!("expected BadMessage, got {other:?}"),
    }
}

#[test]
fn connection_refused_is_a_connect_error() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    match pingpong::client_exchange(addr, &pp_dest(1), ALIVE) {
        Err(Error::Connect { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::ConnectionRefused)
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
    match perftest::Client::connect(addr, config(BwTest::Write)) {
        Err(Error::Connect { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::ConnectionRefused)
        }
        Err(other) => panic!("expected a connect error, got {other}"),
        Ok(_) => panic!("connected to nobody"),
    }
}

// ---------------------------------------------------------------- perftest, ours vs ours

/// What one side saw during a whole bw test.
#[derive(Debug, PartialEq)]
struct Seen {
    keys: Vec<PerftestDest>,
    keys_again: Vec<PerftestDest>,
    report: Option<BwReport>,
    negotiated: perftest::Negotiated,
}

fn report(side: u32) -> BwReport {
    BwReport {
        size: 65536,
        iters: 5000 + u64::from(side),
        bw_peak: 1000.5 + f64::from(side),
        bw_avg: 990.25 + f64::from(side),
        msg_rate_avg: 0.015 + f64::from(side),
        bw_avg_p1: 1.0 + f64::from(side),
        msg_rate_avg_p1: 2.0,
        bw_avg_p2: 3.0,
        msg_rate_avg_p2: 4.0 + f64::from(side),
    }
}

/// Runs one side the way the CLI will: keys, (connect QPs), setup, runs, finish.
fn run_side(mut s: perftest::Session, side: u32, qps: u32, runs: u32) -> Seen {
    let keys = s.exchange_keys(&dests(side, 0, qps)).unwrap();
    // Here the CLI moves its QPs to RTR/RTS with `keys`.
    let keys_again = s.finish_setup(&dests(side, 1, qps)).unwrap();
    for _ in 0..runs {
        s.start_run().unwrap();
        s.end_run().unwrap();
    }
    let negotiated = s.negotiated().clone();
    let report = s.finish(&report(side)).unwrap();
    Seen {
        keys,
        keys_again,
        report,
        negotiated,
    }
}

fn ours_vs_ours(client_cfg: Config, server_cfg: Config, qps: u32, runs: u32) -> (Seen, Seen) {
    let server = perftest::Server::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let srv = thread::spawn(move || {
        let s = server.accept(server_cfg).unwrap();
        assert_eq!(s.role(), Role::Server);
        run_side(s, 1, qps, runs)
    });
    let c = perftest::Client::connect(addr, client_cfg).unwrap();
    assert_eq!(c.role(), Role::Client);
    let client = run_side(c, 0, qps, runs);
    (client, srv.join().unwrap())
}

fn check_bw(test: BwTest, qps: u32) {
    let (client, server) = ours_vs_ours(config(test), config(test), qps, 1);
    assert_eq!(client.keys, dests(1, 0, qps));
    assert_eq!(server.keys, dests(0, 0, qps));
    assert_eq!(client.keys_again, dests(1, 1, qps));
    assert_eq!(server.keys_again, dests(0, 1, qps));
    if test == BwTest::Send {
        // send_bw exchanges no report.
        assert_eq!((client.report, server.report), (None, None));
    } else {
        assert_eq!(client.report, Some(report_as_sent(1, false)));
        assert_eq!(server.report, Some(report_as_sent(0, false)));
    }
    assert_eq!(client.negotiated.peer_version, "6.06");
    assert_eq!(server.negotiated.peer_version, "6.06");
}

/// The report as the wire carries it: the per-port fields only with --report-per-port.
fn report_as_sent(side: u32, per_port: bool) -> BwReport {
    let r = report(side);
    if per_port {
        r
    } else {
        BwReport {
            bw_avg_p1: 0.0,
            msg_rate_avg_p1: 0.0,
            bw_avg_p2: 0.0,
            msg_rate_avg_p2: 0.0,
            ..r
        }
    }
}

#[test]
fn write_bw_one_and_two_qps() {
    check_bw(BwTest::Write, 1);
    check_bw(BwTest::Write, 2);
}

#[test]
fn read_bw_one_and_two_qps() {
    check_bw(BwTest::Read, 1);
    check_bw(BwTest::Read, 2);
}

#[test]
fn send_bw_one_and_two_qps() {
    check_bw(BwTest::Send, 1);
    check_bw(BwTest::Send, 2);
}

#[test]
fn atomic_bw_one_and_two_qps() {
    check_bw(BwTest::Atomic, 1);
    check_bw(BwTest::Atomic, 2);
}

#[test]
fn negotiation_takes_max_buffers_min_mtu_and_per_port_reports_travel() {
    let mut a = config(BwTest::Write);
    a.mtu = 4096;
    a.cycle_buffer = 4096;
    a.cache_line_size = 128;
    a.report_per_port = true;
    a.key_format = KeyFormat::WithoutGid;
    let mut b = config(BwTest::Write);
    b.mtu = 1024;
    b.cycle_buffer = 65536;
    b.cache_line_size = 64;
    b.report_per_port = true;
    b.key_format = KeyFormat::WithoutGid;
    let (client, server) = ours_vs_ours(a, b, 2, 0);
    for n in [&client.negotiated, &server.negotiated] {
        assert_eq!(
            (n.mtu, n.cycle_buffer, n.cache_line_size),
            (1024, 65536, 128)
        );
    }
    assert_eq!(client.negotiated.peer_mtu_code, 3);
    assert_eq!(server.negotiated.peer_mtu_code, 5);
    assert_eq!(client.report, Some(report(1)));
    assert_eq!(server.report, Some(report(0)));
    // Without GID in the message, no GID arrives.
    let no_gid = |mut d: PerftestDest| {
        d.gid = [0; 16];
        d
    };
    assert_eq!(
        client.keys,
        dests(1, 0, 2).into_iter().map(no_gid).collect::<Vec<_>>()
    );
}

#[test]
fn send_bw_all_sizes_syncs_around_every_size() {
    let mut cfg = config(BwTest::Send);
    cfg.all_sizes = true;
    let runs = perftest::ALL_SIZES_RC;
    let (client, server) = ours_vs_ours(cfg.clone(), cfg, 1, runs);
    assert_eq!(client.keys_again, dests(1, 1, 1));
    assert_eq!(server.keys_again, dests(0, 1, 1));
}

// ---------------------------------------------------------------- perftest vs a scripted C peer

enum Step {
    /// Read exactly these bytes from our side.
    Expect(Vec<u8>),
    /// Write these bytes.
    Send(Vec<u8>),
}
use Step::{Expect, Send};

/// One lock-step exchange as the C *server* does it: read ours, write its own.
fn srv_xchg(ours: Vec<u8>, theirs: Vec<u8>) -> [Step; 2] {
    [Expect(ours), Send(theirs)]
}

fn version_bytes() -> Vec<u8> {
    let mut v = b"6.06".to_vec();
    v.resize(VERSION_LEN, 0);
    v
}

fn key(side: u32, round: u32, qp: u32) -> Vec<u8> {
    pf_dest(side, round, qp).encode(KeyFormat::WithGid)
}

/// Plays `steps` on `s`, then requires our side to have closed the connection.
fn play(mut s: TcpStream, steps: Vec<Step>) {
    s.set_read_timeout(Some(ALIVE)).unwrap();
    for (i, step) in steps.into_iter().enumerate() {
        match step {
            Expect(want) => {
                let mut got = vec![0u8; want.len()];
                s.read_exact(&mut got)
                    .unwrap_or_else(|e| panic!("step {i}: reading {} bytes: {e}", want.len()));
                assert_eq!(
                    got.escape_ascii().to_string(),
                    want.escape_ascii().to_string(),
                    "step {i}"
                );
            }
            Send(bytes) => s.write_all(&bytes).unwrap(),
        }
    }
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "extra bytes: {}", rest.escape_ascii());
}

/// The bytes a perftest 4.5-0.17 server (ib_write_bw / ib_read_bw / ib_atomic_bw without
/// -b) reads and writes, for `qps` QPs, per docs/oob.md.
fn c_server_script_rdma(qps: u32) -> Vec<Step> {
    let mut v = Vec::new();
    v.extend(srv_xchg(version_bytes(), version_bytes()));
    v.extend(srv_xchg(vec![0, 0, 0x10, 0], vec![0, 0, 0x10, 0])); // cycle buffer 4096
    v.extend(srv_xchg(vec![0, 0, 0, 64], vec![0, 0, 0, 64])); // cache line 64
    v.extend(srv_xchg(b"3\0".to_vec(), b"3\0".to_vec())); // IBV_MTU_1024
    for qp in 0..qps {
        v.extend(srv_xchg(key(0, 0, qp), key(1, 0, qp)));
    }
    for qp in 0..qps {
        v.extend(srv_xchg(key(0, 1, qp), key(1, 1, qp)));
    }
    v.extend(srv_xchg(key(0, 1, 0), key(1, 1, 0))); // after RTR
    v.extend(srv_xchg(key(0, 1, 0), key(1, 1, 0))); // after the test
    let theirs = BwReport::default().encode_fields(false);
    for (ours, theirs) in report(0).encode_fields(false).into_iter().zip(theirs) {
        v.extend(srv_xchg(ours.to_vec(), theirs.to_vec()));
    }
    v.extend(srv_xchg(key(0, 1, 0), key(1, 1, 0))); // ctx_close_connection
    v.push(Send(b"done\0".to_vec()));
    v.push(Expect(b"done\0".to_vec()));
    v
}

#[test]
fn write_read_atomic_clients_speak_the_exact_perftest_sequence() {
    for test in [BwTest::Write, BwTest::Read, BwTest::Atomic] {
        for qps in [1, 2] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let peer = thread::spawn(move || {
                let (s, _) = listener.accept().unwrap();
                play(s, c_server_script_rdma(qps));
            });
            let c = perftest::Client::connect(addr, config(test)).unwrap();
            let seen = run_side(c, 0, qps, 1);
            peer.join().unwrap();
            assert_eq!(seen.keys, dests(1, 0, qps));
            assert_eq!(seen.keys_again, dests(1, 1, qps));
            assert_eq!(seen.report, Some(BwReport::default()));
        }
    }
}

/// The bytes a perftest 4.5-0.17 *client* of ib_send_bw (no -a, no -b) writes and reads.
fn c_client_script_send(qps: u32) -> Vec<Step> {
    // The C client writes first, then reads: the mirror of srv_xchg.
    let cli_xchg = |ours: Vec<u8>, theirs: Vec<u8>| [Send(theirs), Expect(ours)];
    let mut v = Vec::new();
    v.extend(cli_xchg(version_bytes(), version_bytes()));
    v.extend(cli_xchg(vec![0, 0, 0x10, 0], vec![0, 0, 0x10, 0]));
    v.extend(cli_xchg(vec![0, 0, 0, 64], vec![0, 0, 0, 64]));
    v.extend(cli_xchg(b"3\0".to_vec(), b"3\0".to_vec()));
    for qp in 0..qps {
        v.extend(cli_xchg(key(1, 0, qp), key(0, 0, qp)));
    }
    v.extend(cli_xchg(key(1, 1, 0), key(0, 1, 0))); // after ctx_connect
    for qp in 0..qps {
        v.extend(cli_xchg(key(1, 1, qp), key(0, 1, qp)));
    }
    v.extend(cli_xchg(key(1, 1, 0), key(0, 1, 0))); // receives posted, before the run
    v.extend(cli_xchg(key(1, 1, 0), key(0, 1, 0))); // ctx_close_connection
    v.push(Send(b"done\0".to_vec()));
    v.push(Expect(b"done\0".to_vec()));
    v
}

#[test]
fn send_server_speaks_the_exact_perftest_sequence() {
    for qps in [1, 2] {
        let server = perftest::Server::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let srv = thread::spawn(move || {
            let s = server.accept(config(BwTest::Send)).unwrap();
            run_side(s, 1, qps, 1)
        });
        let c = TcpStream::connect(addr).unwrap();
        play(c, c_client_script_send(qps));
        let seen = srv.join().unwrap();
        assert_eq!(seen.keys, dests(0, 0, qps));
        assert_eq!(seen.keys_again, dests(0, 1, qps));
        assert_eq!(seen.report, None);
    }
}

// ---------------------------------------------------------------- perftest failures

/// A server that accepts, reads our version message (a client always sends it first),
/// writes `bytes`, then closes or stays silent until we close.
fn fake_server(bytes: Vec<u8>, close: bool) -> (std::net::SocketAddr, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let h = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut version = [0u8; VERSION_LEN];
        s.read_exact(&mut version).unwrap();
        s.write_all(&bytes).unwrap();
        if !close {
            // Stay silent until the client gives up and closes.
            let _ = s.read_to_end(&mut Vec::new());
        }
    });
    (addr, h)
}

#[test]
fn perftest_client_times_out_on_a_stalled_peer() {
    let (addr, h) = fake_server(Vec::new(), false);
    let mut cfg = config(BwTest::Write);
    cfg.io_timeout = STALL;
    match perftest::Client::connect(addr, cfg) {
        Err(Error::Timeout {
            step,
            waited,
            expected,
            received,
        }) => {
            assert_eq!((step, expected), ("version", VERSION_LEN));
            assert!(received.is_empty());
            assert!(waited >= STALL);
        }
        Err(other) => panic!("expected a timeout, got {other}"),
        Ok(_) => panic!("a silent peer completed the version exchange"),
    }
    h.join().unwrap();
}

#[test]
fn perftest_client_reports_a_peer_that_closes_mid_message() {
    let (addr, h) = fake_server(b"6.0".to_vec(), true);
    match perftest::Client::connect(addr, config(BwTest::Write)) {
        Err(Error::PeerClosed {
            step,
            expected,
            received,
        }) => {
            assert_eq!((step, expected), ("version", VERSION_LEN));
            assert_eq!(received, b"6.0");
        }
        Err(other) => panic!("expected PeerClosed, got {other}"),
        Ok(_) => panic!("a closed peer completed the version exchange"),
    }
    h.join().unwrap();
}

#[test]
fn perftest_refuses_a_peer_older_than_5_70() {
    let mut old = b"5.60".to_vec();
    old.resize(VERSION_LEN, 0);
    let (addr, h) = fake_server(old, true);
    match perftest::Client::connect(addr, config(BwTest::Write)) {
        Err(Error::IncompatibleVersion { peer, .. }) => assert_eq!(peer, "5.60"),
        Err(other) => panic!("expected IncompatibleVersion, got {other}"),
        Ok(_) => panic!("accepted version 5.60"),
    }
    h.join().unwrap();
}

#[test]
fn perftest_bad_key_message_is_an_error_with_its_bytes() {
    let mut script = version_bytes();
    script.extend([0, 0, 0x10, 0, 0, 0, 0, 64]);
    script.extend(b"3\0");
    let mut bad = key(1, 0, 0);
    bad[5] = b'x';
    script.extend(&bad);
    let (addr, h) = fake_server(script, false);
    let mut s = perftest::Client::connect(addr, config(BwTest::Write)).unwrap();
    match s.exchange_keys(&dests(0, 0, 1)) {
        Err(Error::BadMessage {
            step,
            problem,
            bytes,
        }) => {
            assert_eq!(step, "keys");
            assert_eq!(
                problem,
                MessageError::NotHex {
                    field: "out_reads",
                    text: "x002".into()
                }
            );
            assert_eq!(bytes, bad);
        }
        other => panic!("expected BadMessage, got {other:?}"),
    }
    drop(s);
    h.join().unwrap();
}

#[test]
fn perftest_session_refuses_steps_out_of_order() {
    let server = perftest::Server::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let srv = thread::spawn(move || server.accept(config(BwTest::Send)).map(|_| ()));
    let mut s = perftest::Client::connect(addr, config(BwTest::Send)).unwrap();
    srv.join().unwrap().unwrap();
    assert!(matches!(
        s.finish_setup(&dests(0, 1, 1)),
        Err(Error::OutOfOrder {
            step: "finish_setup",
            ..
        })
    ));
    assert!(matches!(
        s.start_run(),
        Err(Error::OutOfOrder {
            step: "start_run",
            ..
        })
    ));
    assert!(matches!(s.exchange_keys(&[]), Err(Error::Usage(_))));
    assert!(matches!(
        s.finish(&BwReport::default()),
        Err(Error::OutOfOrder { step: "finish", .. })
    ));
}

#[test]
fn perftest_rejects_an_mtu_it_cannot_announce() {
    let mut cfg = config(BwTest::Write);
    cfg.mtu = 1500;
    assert!(matches!(
        perftest::Client::connect("127.0.0.1:9", cfg),
        Err(Error::Usage(_))
    ));
}

#[test]
fn perftest_server_times_out_on_a_silent_client() {
    let server = perftest::Server::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let mut cfg = config(BwTest::Read);
    cfg.io_timeout = STALL;
    let srv = thread::spawn(move || server.accept(cfg).map(|_| ()));
    let c = TcpStream::connect(addr).unwrap();
    match srv.join().unwrap() {
        Err(Error::Timeout {
            step,
            waited,
            expected,
            received,
        }) => {
            assert_eq!((step, expected), ("version", VERSION_LEN));
            assert!(received.is_empty());
            assert!(waited >= STALL);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    drop(c);
}
