//! The XDP filter (`bpf/xrnic.bpf.c`) run on byte buffers with BPF_PROG_TEST_RUN: which
//! frames it hands to AF_XDP, which it passes to the kernel, and that no truncation of a
//! RoCE frame gets anything but PASS. The root tests are `#[ignore = "needs root"]`
//! (docs/testing.md).

mod common;

use common::*;
use xrnic::io::afxdp::{FilterStats, PortOptions, RoceFilter, XdpAction, XskPort};
use xrnic::wire::{Error as WireError, FrameView};
use xrnic_netns::{Side, VethPair};

fn load() -> RoceFilter {
    RoceFilter::load().expect("load the XDP filter")
}

fn run(f: &RoceFilter, frame: &[u8]) -> XdpAction {
    f.test_run(frame)
        .unwrap_or_else(|e| panic!("test_run on {} bytes: {e}", frame.len()))
}

fn delta(after: FilterStats, before: FilterStats) -> FilterStats {
    FilterStats {
        redirected: after.redirected - before.redirected,
        no_socket: after.no_socket - before.no_socket,
        not_roce: after.not_roce - before.not_roce,
        malformed: after.malformed - before.malformed,
    }
}

fn roce_frames() -> Vec<(&'static str, Vec<u8>)> {
    let p = payload(7, 100);
    let mut vlan = Addr::a_to_b(false);
    vlan.vlan = Some(0x2064); // PCP 1, VID 100
    let mut vlan6 = Addr::a_to_b(true);
    vlan6.vlan = Some(0x0005);
    vec![
        ("ipv4", roce_frame(Addr::a_to_b(false), 1, &p)),
        ("ipv6", roce_frame(Addr::a_to_b(true), 2, &p)),
        ("vlan ipv4", roce_frame(vlan, 3, &p)),
        ("vlan ipv6", roce_frame(vlan6, 4, &p)),
        // Longer than one page: the kernel builds a multi-buffer xdp_buff (xdp.frags).
        (
            "ipv4 4096",
            roce_frame(Addr::a_to_b(false), 5, &payload(5, 4096)),
        ),
    ]
}

/// Offset of the end of the UDP header: what the program must see to classify a frame.
fn udp_end(frame: &[u8]) -> usize {
    let v = FrameView::parse(frame).expect("test frame parses");
    v.bth_offset()
}

/// An AF_XDP socket to register: bound to one end of a veth pair, no filter attached.
fn with_socket<T>(body: impl FnOnce(&RoceFilter) -> T) -> T {
    let pair = VethPair::new(1500).expect("veth pair");
    let port = pair
        .run_in(Side::A, || {
            let opts = PortOptions {
                frame_count: 64,
                ring_size: 64,
                attach_filter: false,
                ..Default::default()
            };
            XskPort::open(&pair.end(Side::A).ifname, 0, opts)
        })
        .expect("enter netns")
        .expect("open AF_XDP socket");
    let f = load();
    f.register_socket(0, port.raw_fd())
        .expect("register socket");
    let r = body(&f);
    drop(port);
    r
}

#[test]
#[ignore = "needs root"]
fn roce_frames_pass_to_the_kernel_while_no_socket_is_registered() {
    let f = load();
    let frames = roce_frames();
    let before = f.stats().unwrap();
    for (name, fr) in &frames {
        // bpf_redirect_map() falls back to its flags argument, XDP_PASS, on an empty slot.
        assert_eq!(run(&f, fr), XdpAction::Pass, "{name}");
    }
    let d = delta(f.stats().unwrap(), before);
    assert_eq!(
        d,
        FilterStats {
            no_socket: frames.len() as u64,
            ..Default::default()
        }
    );
}

#[test]
#[ignore = "needs root"]
fn roce_frames_redirect_to_the_registered_socket() {
    with_socket(|f| {
        let frames = roce_frames();
        let before = f.stats().unwrap();
        for (name, fr) in &frames {
            assert_eq!(run(f, fr), XdpAction::Redirect, "{name}");
        }
        let d = delta(f.stats().unwrap(), before);
        assert_eq!(d.redirected, frames.len() as u64);
        assert_eq!(d.no_socket + d.not_roce + d.malformed, 0);

        // Unregistered again: back to the kernel.
        f.unregister_socket(0).unwrap();
        assert_eq!(run(f, &frames[0].1), XdpAction::Pass);
    });
}

#[test]
#[ignore = "needs root"]
fn other_traffic_passes_to_the_kernel() {
    with_socket(|f| {
        let others = [
            ("arp", arp_request_frame()),
            ("icmp echo", icmp_echo_frame()),
            ("tcp to 4791", tcp_frame(4791)),
            ("udp 4790", udp_frame(false, 4790, &[1; 40])),
            ("udp6 53", udp_frame(true, 53, &[1; 40])),
            ("ipv6 nd", nd_solicit_frame()),
        ];
        let before = f.stats().unwrap();
        for (name, fr) in &others {
            assert_eq!(run(f, fr), XdpAction::Pass, "{name}");
        }
        let d = delta(f.stats().unwrap(), before);
        assert_eq!(
            d,
            FilterStats {
                not_roce: others.len() as u64,
                ..Default::default()
            }
        );
        // The same port as UDP source only does not make a frame RoCE.
        let mut swapped = udp_frame(false, 5000, &[0; 40]);
        swapped[34..36].copy_from_slice(&4791u16.to_be_bytes());
        assert_eq!(run(f, &swapped), XdpAction::Pass);
    });
}

#[test]
#[ignore = "needs root"]
fn every_truncation_of_a_roce_frame_passes() {
    with_socket(|f| {
        for (name, fr) in roce_frames().iter().take(4) {
            let headers = udp_end(fr);
            for len in 0..fr.len() {
                let cut = &fr[..len];
                if len < 14 {
                    // The kernel itself refuses test input shorter than an Ethernet
                    // header (EINVAL), as no driver hands such a frame to XDP.
                    assert!(f.test_run(cut).is_err(), "{name} cut to {len}");
                    continue;
                }
                let before = f.stats().unwrap();
                let verdict = run(f, cut);
                let d = delta(f.stats().unwrap(), before);
                if len < headers {
                    assert_eq!(verdict, XdpAction::Pass, "{name} cut to {len}");
                    assert_eq!(d.malformed, 1, "{name} cut to {len}: {d:?}");
                } else {
                    // Ethernet, IP and UDP are whole: the frame is RoCE to the filter,
                    // and the transport's parser judges the rest (wire::FrameView).
                    assert_eq!(verdict, XdpAction::Redirect, "{name} cut to {len}");
                    assert_eq!(d.redirected, 1, "{name} cut to {len}");
                }
            }
        }
    });
}

#[test]
#[ignore = "needs root"]
fn ipv4_fragments_and_odd_headers_pass() {
    with_socket(|f| {
        let base = roce_frame(Addr::a_to_b(false), 9, &payload(9, 64));
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("more fragments", {
                let mut v = base.clone();
                v[20] |= 0x20;
                v
            }),
            ("fragment offset", {
                let mut v = base.clone();
                v[21] = 1;
                v
            }),
            ("ihl 4", {
                let mut v = base.clone();
                v[14] = 0x44;
                v
            }),
            ("version 6 in an IPv4 ethertype", {
                let mut v = base.clone();
                v[14] = 0x65;
                v
            }),
            ("ihl 15 past the end", {
                let mut v = base[..60].to_vec();
                v[14] = 0x4f;
                v
            }),
        ];
        for (name, fr) in &cases {
            let before = f.stats().unwrap();
            assert_eq!(run(f, fr), XdpAction::Pass, "{name}");
            let d = delta(f.stats().unwrap(), before);
            assert_eq!(d.malformed, 1, "{name}: {d:?}");
        }
    });
}

#[test]
#[ignore = "needs root"]
fn vector_frames_are_classified_like_the_wire_parser_does() {
    let frames = vector_frames();
    assert!(!frames.is_empty(), "no frame in the vector captures");
    with_socket(|f| {
        let (mut roce, mut other) = (0, 0);
        for (name, fr) in &frames {
            let is_roce = match FrameView::parse(fr) {
                Ok(_) => true,
                Err(WireError::NotRoce(_)) => false,
                Err(e) => panic!("{name}: vector does not parse: {e}"),
            };
            let want = if is_roce {
                roce += 1;
                XdpAction::Redirect
            } else {
                other += 1;
                XdpAction::Pass
            };
            assert_eq!(run(f, fr), want, "{name}");
        }
        assert!(roce > 100, "expected the vectors' RoCE frames, got {roce}");
        assert!(other > 0, "expected the vectors' ARP frames, got {other}");
        let s = f.stats().unwrap();
        assert_eq!(s.redirected, roce);
        assert_eq!(s.not_roce, other);
    });
}

/// This kernel attaches XDP through a BPF link: the probe that tells a kernel without
/// them (before 5.9) from an interface that refuses attaches and detaches on a private
/// loopback, and leaves the caller's namespace untouched.
#[test]
#[ignore = "needs root"]
fn the_xdp_link_probe_attaches_on_a_private_loopback() {
    let f = load();
    assert_eq!(f.xdp_link_refusal().expect("probe"), None);
    assert!(!f.is_attached());
    // Run again: the first probe's link is gone (its namespace too), nothing is busy.
    assert_eq!(f.xdp_link_refusal().expect("probe"), None);
}
