//! The floor of a round trip over copy-mode AF_XDP on a veth pair: a minimal ping-pong of
//! RoCE v2 frames between two `XskPort`s (the same ports, XDP filter and frames as
//! `benches/afxdp_raw.rs`, whose helpers it uses), with no transport engine, no driver
//! thread, no locks: each end polls its receive ring and answers at once.
//!
//! Two shapes, each measured the same way:
//! - 1 frame each way per round trip (a 64-byte-payload SEND ONLY): what a kernel UDP
//!   ping-pong moves;
//! - 2 frames each way, put on the tx ring together and sent by ONE kick (the 64-byte
//!   SEND and a 62-byte frame the size of an ACK): what an RC ping-pong moves, where each
//!   side's answer SEND leaves in the same `sendto` as its ACK of the SEND it received.
//!
//! Both ends poll their rx ring and yield the CPU after each empty poll, like
//! `rc-pingpong`'s polling loop and the polled kernel UDP ping-pong of `benches/net.rs`
//! (2 cores: a pure spin could starve the other end's thread). Prints µs per round trip.
//! Run as root: `cargo bench --bench afxdp_rtt`; `make bench-net` runs it in every round
//! (`raw_rtt_us`, `raw_rtt2_us`).

#[allow(dead_code)]
#[path = "afxdp_raw.rs"]
pub(crate) mod raw;

use std::time::{Duration, Instant};

use raw::common::{self, payload, roce_frame};
use xrnic::io::afxdp::XskPort;
use xrnic_netns::{Side, VethPair};

/// Round trips before the clock starts (rings, caches, branch predictors).
const WARMUP: u32 = 1000;
/// A round trip that has not come back after this long is lost: the run fails.
const LOST: Duration = Duration::from_secs(2);

fn main() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("afxdp_rtt: skipped: needs root (AF_XDP, XDP, network namespaces)");
        if common::under_ci() {
            std::process::exit(1);
        }
        return;
    }
    let pair = match VethPair::new(9000) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("afxdp_rtt: cannot create the veth pair: {e}");
            std::process::exit(1);
        }
    };
    println!("afxdp_rtt: veth mtu 9000, copy mode, 64-byte payload, 20000 round trips");
    for frames in [1, 2] {
        match run(&pair, frames, 20_000) {
            Ok(us) => println!("  {frames} frame(s) each way per round trip: {us:.2} us"),
            Err(e) => {
                eprintln!("afxdp_rtt: {frames} frame(s): {e}");
                std::process::exit(1);
            }
        }
    }
}

/// The frames one side sends per round trip: the 64-byte SEND ONLY, and with
/// `frames == 2` an ACK-sized frame after it (a SEND ONLY without payload, 62 bytes like
/// an RC ACK: 14 Ethernet + 20 IPv4 + 8 UDP + 12 BTH + 4 AETH/payload + 4 ICRC).
fn frames_from(pair: &VethPair, from: Side, frames: usize) -> Vec<Vec<u8>> {
    let a = raw::addr(pair, from);
    let mut v = vec![roce_frame(a, 1, &payload(1, 64))];
    if frames == 2 {
        v.push(roce_frame(a, 2, &[0; 4]));
    }
    v
}

/// Poll `port` (yielding after each empty poll) until frames with the lengths of `expect`
/// arrived, in order.
fn receive(port: &mut XskPort, expect: &[Vec<u8>]) -> Result<(), String> {
    let mut got = 0usize;
    let mut bad = None;
    let mut since: Option<Instant> = None;
    while got < expect.len() {
        let n = port
            .recv_batch(|f| {
                if expect.get(got).is_none_or(|e| e.len() != f.len()) {
                    bad.get_or_insert(f.len());
                }
                got += 1;
            })
            .map_err(|e| e.to_string())?;
        if let Some(len) = bad {
            return Err(format!("unexpected frame of {len} bytes"));
        }
        if n == 0 {
            // Reading the clock on every empty poll would add to the figure; only check
            // the timeout once the ring has been empty for a while.
            match since {
                None => since = Some(Instant::now()),
                Some(t) if t.elapsed() > LOST => {
                    return Err(format!(
                        "round trip lost ({got} of {} frames)",
                        expect.len()
                    ));
                }
                Some(_) => {}
            }
            std::thread::yield_now();
        }
    }
    Ok(())
}

/// `iters` round trips of `frames` frames each way between A (the pinger, on this
/// thread) and B (the echo, on another); microseconds per round trip.
pub fn run(pair: &VethPair, frames: usize, iters: u32) -> Result<f64, String> {
    let mut a = raw::open_port(pair, Side::A)?;
    let mut b = raw::open_port(pair, Side::B)?;
    let a_out = frames_from(pair, Side::A, frames);
    let b_out = frames_from(pair, Side::B, frames);
    let total = WARMUP + iters;
    std::thread::scope(|sc| {
        let echo = sc.spawn(|| -> Result<(), String> {
            let out: Vec<&[u8]> = b_out.iter().map(Vec::as_slice).collect();
            for _ in 0..total {
                receive(&mut b, &a_out)?;
                if b.send_batch(&out).map_err(|e| e.to_string())? != out.len() {
                    return Err("echo: tx ring full".into());
                }
            }
            Ok(())
        });
        let out: Vec<&[u8]> = a_out.iter().map(Vec::as_slice).collect();
        let mut one = || -> Result<(), String> {
            if a.send_batch(&out).map_err(|e| e.to_string())? != out.len() {
                return Err("ping: tx ring full".into());
            }
            receive(&mut a, &b_out)
        };
        let mut r = (0..WARMUP).try_for_each(|_| one());
        let t = Instant::now();
        if r.is_ok() {
            r = (0..iters).try_for_each(|_| one());
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(iters);
        let e = echo
            .join()
            .map_err(|_| "echo thread panicked".to_string())?;
        r.and(e).map(|()| us)
    })
}
