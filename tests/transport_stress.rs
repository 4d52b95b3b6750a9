//! Acceptance: 10 000 mixed messages (SEND, SEND with immediate, WRITE, WRITE with
//! immediate, READ, compare-and-swap, fetch-and-add), sizes 0..=64 KiB, at every path MTU,
//! over a link with 0 %, 1 % and 5 % each of loss, reordering, duplication and corruption.
//! Every byte is verified at the destination (and at the requester for READ and atomics),
//! every WR completes exactly once, in order, with SUCCESS; atomics return the values a
//! sequential model predicts and B executes each exactly once (see `cli::sim::simulate`).
//!
//! Each impairment level runs 2 000 messages at each of the five MTUs (10 000 in all),
//! alternating IPv4 and IPv6 GIDs. Cargo.toml sets `[profile.test] opt-level = 1` so that
//! these runs take seconds, not minutes, in `cargo test`.

use xrnic::proto::Mtu;
use xrnic::sim::LinkConfig;
use xrnic_cli::cli::sim::{Ops, SimParams, SizeSpec, simulate};

const MTUS: [Mtu; 5] = [
    Mtu::Mtu256,
    Mtu::Mtu512,
    Mtu::Mtu1024,
    Mtu::Mtu2048,
    Mtu::Mtu4096,
];

fn run_level(p: f64, seed: u64) {
    let mut total = 0;
    for (i, mtu) in MTUS.into_iter().enumerate() {
        let params = SimParams {
            ops: Ops::Mixed,
            messages: 2000,
            size: SizeSpec::Mix,
            mtu,
            link: LinkConfig {
                loss: p,
                reorder: p,
                dup: p,
                corrupt: p,
                ..LinkConfig::default()
            },
            seed: seed + i as u64,
            ipv6: i % 2 == 1,
            depth: 16,
        };
        let s = simulate(&params);
        let what = format!("p={p} mtu={mtu:?}");
        assert!(s.ok, "{what}: {s:#?}");
        assert_eq!(s.messages_completed, 2000, "{what}");
        assert_eq!((s.errors, s.mismatches), (0, 0), "{what}");
        assert!(s.atomics_posted > 100, "{what}");
        assert_eq!(
            s.atomics_executed, s.atomics_posted,
            "{what}: no atomic twice"
        );
        assert!(
            s.bytes_verified > 10_000_000,
            "{what}: {}",
            s.bytes_verified
        );
        if p > 0.0 {
            assert!(s.retransmitted_packets > 0 && s.naks_sent > 0, "{what}");
            assert!(s.duplicates_received > 0, "{what}");
            assert!(
                s.malformed_frames_dropped > 0,
                "{what}: corrupted frames dropped"
            );
            assert!(
                s.link.lost > 0 && s.link.corrupted > 0 && s.link.reordered > 0,
                "{what}"
            );
        } else {
            assert_eq!(
                s.retransmitted_packets + s.naks_sent + s.duplicates_received,
                0,
                "{what}"
            );
        }
        total += s.messages_completed;
    }
    assert_eq!(total, 10_000);
}

#[test]
fn ten_thousand_messages_lossless() {
    run_level(0.0, 100);
}

#[test]
fn ten_thousand_messages_at_one_percent() {
    run_level(0.01, 200);
}

#[test]
fn ten_thousand_messages_at_five_percent() {
    run_level(0.05, 300);
}
