//! AF_XDP end to end over a veth pair between two network namespaces: RoCE frames from
//! `wire::FrameRepr::emit` cross intact (ICRC verified), UMEM chunks are recycled without
//! leaks, and the host's other traffic keeps flowing through the kernel while the XDP
//! filter is attached. The root tests are `#[ignore = "needs root"]`
//! (docs/testing.md).

mod common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::*;
use xrnic::io::afxdp::{FrameCounts, PortOptions, XskPort};
use xrnic::wire::FrameRepr;
use xrnic_netns::{Side, VethPair};

/// A guard against hanging, not a performance threshold: frames on a veth arrive within
/// microseconds; the deadline only turns a lost frame into a failure instead of a hang.
const PATIENCE: Duration = Duration::from_secs(5);

fn open(pair: &VethPair, side: Side, opts: PortOptions) -> XskPort {
    pair.run_in(side, || XskPort::open(&pair.end(side).ifname, 0, opts))
        .expect("enter netns")
        .unwrap_or_else(|e| panic!("open AF_XDP port on side {side:?}: {e}"))
}

fn addr(pair: &VethPair, ipv6: bool) -> Addr {
    Addr {
        src_mac: pair.end(Side::A).mac,
        dst_mac: pair.end(Side::B).mac,
        ipv6,
        vlan: None,
    }
}

/// Receive on `port` until `n` frames came or PATIENCE ran out.
fn recv_n(port: &mut XskPort, n: usize, out: &mut Vec<Vec<u8>>) {
    let deadline = Instant::now() + PATIENCE;
    let goal = out.len() + n;
    while out.len() < goal && Instant::now() < deadline {
        port.wait(Duration::from_millis(50)).expect("wait");
        port.recv_batch(|f| out.push(f.to_vec())).expect("recv");
    }
}

/// Send all `frames` from `tx` in batches of `step`, receiving each batch on `rx` before
/// the next, so that the receiver's fill ring never runs dry.
fn lockstep(tx: &mut XskPort, rx: &mut XskPort, frames: &[Vec<u8>], step: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::with_capacity(frames.len());
    for batch in frames.chunks(step) {
        let refs: Vec<&[u8]> = batch.iter().map(|f| f.as_slice()).collect();
        let mut sent = 0;
        let deadline = Instant::now() + PATIENCE;
        while sent < refs.len() {
            sent += tx.send_batch(&refs[sent..]).expect("send");
            if sent < refs.len() {
                assert!(
                    Instant::now() < deadline,
                    "tx stuck at {sent}/{}",
                    refs.len()
                );
                tx.wait(Duration::from_millis(1)).expect("wait");
            }
        }
        recv_n(rx, batch.len(), &mut got);
    }
    got
}

/// Chunks back where they started: everything sent has completed.
fn settle(port: &mut XskPort) -> FrameCounts {
    let deadline = Instant::now() + PATIENCE;
    while port.flush().expect("flush") > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    port.frame_counts()
}

fn check_roce_roundtrip(mtu: u32, payload_len: usize, ipv6: bool) {
    let pair = VethPair::new(mtu).expect("veth pair");
    let mut a = open(&pair, Side::A, PortOptions::default());
    let mut b = open(&pair, Side::B, PortOptions::default());
    let frames: Vec<Vec<u8>> = (0..64)
        .map(|i| roce_frame(addr(&pair, ipv6), i, &payload(i, payload_len)))
        .collect();
    let got = lockstep(&mut a, &mut b, &frames, 16);
    assert_eq!(
        got.len(),
        frames.len(),
        "mtu {mtu} payload {payload_len} ipv6 {ipv6}: frames lost; kernel stats {:?}",
        b.kernel_stats()
    );
    for (i, (sent, recv)) in frames.iter().zip(&got).enumerate() {
        assert_eq!(recv, sent, "frame {i} changed on the way");
        let repr = FrameRepr::parse(recv).unwrap_or_else(|e| panic!("frame {i}: {e}"));
        assert_eq!(repr.roce.payload, payload(i as u32, payload_len).as_slice());
        assert_eq!(repr.roce.bth.psn.value(), i as u32);
    }
    let fs = b.filter_stats().expect("filter attached").expect("stats");
    assert_eq!(fs.redirected, frames.len() as u64);
    assert_eq!(b.stats().rx_frames, frames.len() as u64);
    assert_eq!(a.stats().tx_frames, frames.len() as u64);
}

#[test]
#[ignore = "needs root"]
fn roce_ipv4_pmtu1024_crosses_a_1500_veth_intact() {
    check_roce_roundtrip(1500, 1024, false);
}

#[test]
#[ignore = "needs root"]
fn roce_ipv4_and_ipv6_pmtu1024_and_4096_cross_a_9000_veth_intact() {
    for ipv6 in [false, true] {
        for len in [1024, 4096] {
            check_roce_roundtrip(9000, len, ipv6);
        }
    }
}

#[test]
#[ignore = "needs root"]
fn vlan_tagged_roce_frames_cross_intact() {
    let pair = VethPair::new(1500).expect("veth pair");
    let mut a = open(&pair, Side::A, PortOptions::default());
    let mut b = open(&pair, Side::B, PortOptions::default());
    let frames: Vec<Vec<u8>> = (0..8)
        .map(|i| {
            let mut ad = addr(&pair, i % 2 == 0);
            ad.vlan = Some(0x6000 | 100); // PCP 3, VID 100
            roce_frame(ad, i, &payload(i, 512))
        })
        .collect();
    let got = lockstep(&mut a, &mut b, &frames, 8);
    assert_eq!(got, frames);
    for f in &got {
        let r = FrameRepr::parse(f).expect("parses with ICRC");
        assert_eq!(r.eth.vlan_tci, Some(0x6000 | 100));
    }
}

#[test]
#[ignore = "needs root"]
fn umem_chunks_are_recycled_without_leaks() {
    let pair = VethPair::new(9000).expect("veth pair");
    // 64 chunks each: 32 on the fill ring, 32 to send with. Thousands of frames must go
    // through them. An odd batch size makes two-chunk frames straddle ring reads.
    let small = PortOptions {
        frame_count: 64,
        ring_size: 64,
        batch_size: 7,
        ..Default::default()
    };
    let mut a = open(&pair, Side::A, small);
    let mut b = open(&pair, Side::B, small);
    let start_a = a.frame_counts();
    let start_b = b.frame_counts();
    assert_eq!(start_a.free + start_a.in_fill, 64);

    let mut frames: Vec<Vec<u8>> = (0..2000)
        .map(|i| roce_frame(addr(&pair, i % 2 == 1), i, &payload(i, 1024)))
        .collect();
    // Two-chunk frames too: 4096-byte payloads (multi-buffer).
    frames.extend((2000..2300).map(|i| roce_frame(addr(&pair, false), i, &payload(i, 4096))));
    let got = lockstep(&mut a, &mut b, &frames, 16);
    assert_eq!(
        got.len(),
        frames.len(),
        "kernel stats {:?}",
        b.kernel_stats()
    );
    assert!(got.iter().zip(&frames).all(|(g, s)| g == s));

    assert_eq!(settle(&mut a), start_a, "sender's chunks");
    assert_eq!(settle(&mut b), start_b, "receiver's chunks");
    let ks = b.kernel_stats().unwrap();
    assert_eq!(ks.rx_dropped, 0, "{ks:?}");
}

#[test]
#[ignore = "needs root"]
fn ping_works_while_the_filter_is_attached() {
    let pair = VethPair::new(1500).expect("veth pair");
    let _a = open(&pair, Side::A, PortOptions::default());
    let b = open(&pair, Side::B, PortOptions::default());
    for target in ["192.0.2.2", "fd00::2"] {
        let out = pair
            .exec(
                Side::A,
                &["ping", "-c", "3", "-i", "0.2", "-W", "2", target],
            )
            .expect("run ping");
        assert!(
            out.status.success(),
            "ping {target}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let fs = b.filter_stats().unwrap().unwrap();
    // ARP, ND and the echo requests went through the filter to the kernel.
    assert!(fs.not_roce >= 6, "{fs:?}");
    assert_eq!(fs.redirected, 0, "{fs:?}");
}

#[test]
#[ignore = "needs root"]
fn foreign_udp_reaches_the_kernel_not_the_socket() {
    let pair = VethPair::new(1500).expect("veth pair");
    let mut a = open(&pair, Side::A, PortOptions::default());
    let mut b = open(&pair, Side::B, PortOptions::default());
    let listeners: Vec<UdpSocket> = pair
        .run_in(Side::B, || {
            ["0.0.0.0:4790", "[::]:4792"]
                .iter()
                .map(|a| UdpSocket::bind(a).expect("bind in ns B"))
                .collect()
        })
        .unwrap();
    pair.run_in(Side::A, || {
        let s4 = UdpSocket::bind("0.0.0.0:0").unwrap();
        let s6 = UdpSocket::bind("[::]:0").unwrap();
        for i in 0..5u8 {
            s4.send_to(&[i; 32], "192.0.2.2:4790").unwrap();
            s6.send_to(&[i; 32], "[fd00::2]:4792").unwrap();
        }
    })
    .unwrap();
    for l in &listeners {
        l.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut buf = [0u8; 64];
        for i in 0..5u8 {
            let (n, _) = l
                .recv_from(&mut buf)
                .expect("the kernel socket gets the datagram");
            assert_eq!(&buf[..n], &[i; 32]);
        }
    }
    // A RoCE frame after them: once it is in, anything redirected before it is too.
    let marker = roce_frame(addr(&pair, false), 77, &payload(77, 64));
    assert!(a.tx(&marker).unwrap());
    let mut got = Vec::new();
    recv_n(&mut b, 1, &mut got);
    assert_eq!(got, vec![marker]);
    b.recv_batch(|f| got.push(f.to_vec())).unwrap();
    assert_eq!(
        got.len(),
        1,
        "only the RoCE frame reached the AF_XDP socket"
    );
    let fs = b.filter_stats().unwrap().unwrap();
    assert_eq!(fs.redirected, 1, "{fs:?}");
    assert!(fs.not_roce >= 10, "{fs:?}");
}

#[test]
#[ignore = "needs root"]
fn frames_emitted_straight_into_the_umem_arrive_intact() {
    let pair = VethPair::new(1500).expect("veth pair");
    let mut a = open(&pair, Side::A, PortOptions::default());
    let mut b = open(&pair, Side::B, PortOptions::default());
    let start = a.frame_counts();
    let body = payload(3, 1024);
    for ipv6 in [false, true] {
        let repr = roce_repr(addr(&pair, ipv6), 3, &body);
        assert!(a.tx_with(|buf| repr.emit(buf).ok()).expect("tx_with"));
        let mut got = Vec::new();
        recv_n(&mut b, 1, &mut got);
        assert_eq!(got, vec![roce_frame(addr(&pair, ipv6), 3, &body)]);
    }
    // A builder that declines, or claims more than the chunk holds, sends nothing and
    // keeps the chunk.
    assert!(!a.tx_with(|_| None).unwrap());
    let err = a.tx_with(|buf| Some(buf.len() + 1)).unwrap_err();
    assert!(
        matches!(err, xrnic::io::afxdp::Error::FrameTooLarge { .. }),
        "{err}"
    );
    assert_eq!(settle(&mut a), start);
    assert_eq!(a.stats().tx_frames, 2);
}

/// `queue_batch` leaves frames on the tx ring without the `sendto` (copy mode transmits
/// only inside it); the next `send_batch` pushes them out in the same kick, in order, and
/// `flush` pushes them alone.
#[test]
#[ignore = "needs root"]
fn queued_frames_leave_with_the_next_kick_in_order() {
    let pair = VethPair::new(1500).expect("veth pair");
    let opts = PortOptions {
        bind_mode: xrnic::io::afxdp::BindMode::Copy,
        ..PortOptions::default()
    };
    let mut a = open(&pair, Side::A, opts);
    let mut b = open(&pair, Side::B, PortOptions::default());
    let start = a.frame_counts();
    let frames: Vec<Vec<u8>> = (0..5)
        .map(|i| roce_frame(addr(&pair, false), i, &payload(i, 64 + i as usize)))
        .collect();
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();

    let kicks = a.stats().tx_kicks;
    assert_eq!(a.queue_batch(&refs[..3]).expect("queue"), 3);
    assert_eq!(a.unkicked(), 3);
    assert_eq!(
        a.frame_counts().in_tx,
        3,
        "queued frames are on the tx ring"
    );
    assert_eq!(a.stats().tx_kicks, kicks, "queue_batch made a system call");
    // Nothing was transmitted: the receiver's ring is empty (it is read without
    // waiting, so this cannot pass by impatience; a kick would have delivered them
    // synchronously inside the sendto).
    let mut early = 0;
    b.recv_batch(|_| early += 1).expect("recv");
    assert_eq!(early, 0, "queued frames left without a kick");

    assert_eq!(a.send_batch(&refs[3..4]).expect("send"), 1);
    assert_eq!(a.unkicked(), 0);
    assert_eq!(
        a.stats().tx_kicks,
        kicks + 1,
        "one kick for all four frames"
    );
    let mut got = Vec::new();
    recv_n(&mut b, 4, &mut got);
    assert_eq!(
        got,
        frames[..4].to_vec(),
        "queued frames first, then the sent one"
    );

    assert_eq!(a.queue_batch(&refs[4..]).expect("queue"), 1);
    assert_eq!(a.unkicked(), 1);
    settle(&mut a);
    assert_eq!(a.unkicked(), 0);
    recv_n(&mut b, 1, &mut got);
    assert_eq!(got, frames, "flush pushed the last queued frame");
    assert_eq!(settle(&mut a), start);
}

/// The path of a kernel without `XDP_USE_NEED_WAKEUP` (before 5.4), forced: bound
/// without the flag, a port kicks the tx ring with a `sendto` after every batch it sends,
/// never wakes the kernel for the fill ring, and single- and multi-chunk frames cross
/// intact with every chunk back in place.
#[test]
#[ignore = "needs root"]
fn without_need_wakeup_every_batch_is_kicked_and_frames_cross_intact() {
    let pair = VethPair::new(9000).expect("veth pair");
    let opts = PortOptions {
        need_wakeup: false,
        frame_count: 64,
        ring_size: 64,
        batch_size: 8,
        ..PortOptions::default()
    };
    let mut a = open(&pair, Side::A, opts);
    let mut b = open(&pair, Side::B, opts);
    assert!(!a.options().need_wakeup && !b.options().need_wakeup);
    let (start_a, start_b) = (a.frame_counts(), b.frame_counts());
    let frames: Vec<Vec<u8>> = (0..600)
        .map(|i| {
            roce_frame(
                addr(&pair, i % 3 == 0),
                i,
                &payload(i, [64, 1024, 4096][i as usize % 3]),
            )
        })
        .collect();
    let mut got = Vec::new();
    let mut batches = 0;
    for batch in frames.chunks(8) {
        let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
        let mut sent = 0;
        let deadline = Instant::now() + PATIENCE;
        while sent < refs.len() {
            let kicks = a.stats().tx_kicks;
            let n = a.send_batch(&refs[sent..]).expect("send");
            if n > 0 {
                // Without need_wakeup nothing tells the port the kernel is awake: each
                // batch it puts on the ring ends with its own kick.
                assert!(a.stats().tx_kicks > kicks, "batch {batches} not kicked");
                batches += 1;
            }
            sent += n;
            if sent < refs.len() {
                assert!(
                    Instant::now() < deadline,
                    "tx stuck at {sent}/{}",
                    refs.len()
                );
                a.wait(Duration::from_millis(1)).expect("wait");
            }
        }
        recv_n(&mut b, batch.len(), &mut got);
    }
    assert_eq!(
        got.len(),
        frames.len(),
        "kernel stats {:?}",
        b.kernel_stats()
    );
    assert!(
        got.iter().zip(&frames).all(|(g, s)| g == s),
        "a frame changed"
    );
    assert!(a.stats().tx_kicks >= batches, "{:?}", a.stats());
    assert_eq!(b.stats().fill_wakeups, 0, "{:?}", b.stats());
    assert_eq!(settle(&mut a), start_a, "sender's chunks");
    assert_eq!(settle(&mut b), start_b, "receiver's chunks");
}

/// Zero-copy asked of a driver without it (veth) fails naming the feature and the first
/// kernel with it; the default bind lets the kernel choose, and the port says it chose
/// copy mode (`XDP_OPTIONS`).
#[test]
#[ignore = "needs root"]
fn zero_copy_on_veth_is_refused_by_name_and_auto_reports_copy_mode() {
    let pair = VethPair::new(1500).expect("veth pair");
    let zc = PortOptions {
        bind_mode: xrnic::io::afxdp::BindMode::ZeroCopy,
        ..PortOptions::default()
    };
    let e = pair
        .run_in(Side::A, || XskPort::open(&pair.end(Side::A).ifname, 0, zc))
        .expect("enter netns")
        .expect_err("veth has no AF_XDP zero-copy");
    let msg = e.to_string();
    let (maj, min) = xrnic::io::afxdp::ZERO_COPY_SINCE;
    assert!(
        msg.contains("XDP_ZEROCOPY") && msg.contains(&format!("Linux {maj}.{min}+")),
        "{msg}"
    );
    let a = open(&pair, Side::A, PortOptions::default());
    assert_eq!(a.zero_copy(), Some(false), "veth binds in copy mode");
}

#[test]
#[ignore = "needs root"]
fn open_reports_a_missing_interface_clearly() {
    let err = XskPort::open("xrnic-nope0", 0, PortOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("xrnic-nope0") && msg.contains("not found"),
        "{msg}"
    );
}

/// As a non-root user, opening a port fails with a message that says root is needed.
/// Run as root, the test re-runs itself under `setpriv` as user nobody.
#[test]
fn open_without_root_says_root_is_needed() {
    if !rustix::process::geteuid().is_root() {
        let err = XskPort::open("lo", 0, PortOptions::default()).unwrap_err();
        assert!(
            matches!(err, xrnic::io::afxdp::Error::NotRoot { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("needs root"), "{err}");
        let err = xrnic::io::afxdp::RoceFilter::load().unwrap_err();
        assert!(err.to_string().contains("needs root"), "{err}");
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .args([
            "--exact",
            "open_without_root_says_root_is_needed",
            "--nocapture",
        ])
        .env_remove("CI")
        .current_dir("/")
        .output()
        .expect("run setpriv (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "as nobody: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
