//! Raw AF_XDP goodput between two network namespaces over a 9000-MTU veth pair: one
//! thread sends RoCE v2 SEND ONLY frames (IPv4, 1024- and 4096-byte payloads plus headers
//! and ICRC) through an `XskPort` as fast as the rings take them, another receives and
//! counts. No transport engine is involved: this is the ceiling xrnic's own throughput
//! (`make bench-net`) is compared with.
//!
//! Prints frames sent/received, Mpps, Gbit/s of whole Ethernet frames and of RoCE payload.
//! Run as root: `cargo bench --bench afxdp_raw`; `XRNIC_BENCH_SECS` sets the seconds per
//! size (default 3). Compare with
//! `GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1000000` (glibc's tunables manual).

#[path = "../tests/common/mod.rs"]
pub(crate) mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Addr, payload, roce_frame};
use xrnic::io::afxdp::{PortOptions, XskPort};
use xrnic_netns::{Side, VethPair};

/// What one size measured.
pub struct RawResult {
    /// Frame length on the wire (Ethernet header to ICRC).
    pub frame_len: usize,
    /// RoCE payload received per second, in Gbit/s.
    pub payload_gbps: f64,
}

struct RxResult {
    frames: u64,
    bytes: u64,
    elapsed: Duration,
}

/// The table header of [`run_one`]'s rows.
pub fn header() {
    println!(
        "{:>8} {:>6} {:>10} {:>10} {:>7} {:>8} {:>10} {:>10}",
        "payload", "frame", "sent", "received", "loss%", "Mpps", "Gbit/s", "payload"
    );
}

fn main() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("afxdp_raw: skipped: needs root (AF_XDP, XDP, network namespaces)");
        if common::under_ci() {
            std::process::exit(1);
        }
        return;
    }
    // `cargo bench` passes `--bench`; ignore arguments.
    let secs: f64 = std::env::var("XRNIC_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let pair = match VethPair::new(9000) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("afxdp_raw: cannot create the veth pair: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "afxdp_raw: veth mtu 9000, copy mode, {secs} s per size, GLIBC_TUNABLES={}",
        std::env::var("GLIBC_TUNABLES").unwrap_or_else(|_| "(unset)".into())
    );
    header();
    for payload_len in [1024usize, 4096] {
        if let Err(e) = run_one(&pair, payload_len, Duration::from_secs_f64(secs)) {
            eprintln!("afxdp_raw: payload {payload_len}: {e}");
            std::process::exit(1);
        }
    }
}

/// An `XskPort` on queue 0 of `side`'s end, opened in its namespace, with xrnic's XDP
/// filter attached (as xrnic's driver opens it). `benches/afxdp_rtt.rs` uses it too.
pub fn open_port(pair: &VethPair, side: Side) -> Result<XskPort, String> {
    pair.run_in(side, || {
        XskPort::open(&pair.end(side).ifname, 0, PortOptions::default())
    })
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())
}

/// Ethernet addressing of frames sent from `from` to the other end.
pub fn addr(pair: &VethPair, from: Side) -> Addr {
    let to = match from {
        Side::A => Side::B,
        Side::B => Side::A,
    };
    Addr {
        src_mac: pair.end(from).mac,
        dst_mac: pair.end(to).mac,
        ipv6: false,
        vlan: None,
    }
}

/// Send SEND ONLY frames of `payload_len` from A to B for `dur`; print one table row
/// (see [`header`]) and return the figures. `benches/net.rs` runs this too.
pub fn run_one(pair: &VethPair, payload_len: usize, dur: Duration) -> Result<RawResult, String> {
    let mut tx = open_port(pair, Side::A)?;
    let mut rx = open_port(pair, Side::B)?;
    let addr = addr(pair, Side::A);
    let frame = roce_frame(addr, 1, &payload(1, payload_len));
    let frame_len = frame.len();
    let batch: Vec<&[u8]> = vec![frame.as_slice(); 64];

    let stop = Arc::new(AtomicBool::new(false));
    let rx_stop = stop.clone();
    let receiver = std::thread::spawn(move || -> Result<(RxResult, XskPort), String> {
        let (mut frames, mut bytes) = (0u64, 0u64);
        let mut first: Option<Instant> = None;
        let mut last = Instant::now();
        loop {
            let ready = rx
                .wait(Duration::from_millis(10))
                .map_err(|e| e.to_string())?;
            if ready {
                let n = rx
                    .recv_batch(|f| bytes += f.len() as u64)
                    .map_err(|e| e.to_string())?;
                if n > 0 {
                    frames += n as u64;
                    last = Instant::now();
                    first.get_or_insert(last);
                }
            } else if rx_stop.load(Ordering::Relaxed) && last.elapsed() > Duration::from_millis(100)
            {
                break;
            }
        }
        let elapsed = first.map_or(Duration::ZERO, |f| last - f);
        Ok((
            RxResult {
                frames,
                bytes,
                elapsed,
            },
            rx,
        ))
    });

    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < dur {
        let n = tx.send_batch(&batch).map_err(|e| e.to_string())?;
        sent += n as u64;
        if n < batch.len() {
            tx.reap_completions();
        }
    }
    let _ = tx.flush();
    stop.store(true, Ordering::Relaxed);
    let (r, rx) = receiver
        .join()
        .map_err(|_| "receiver thread panicked".to_string())??;
    let secs = r.elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
    let loss = if sent > 0 {
        100.0 * (sent.saturating_sub(r.frames)) as f64 / sent as f64
    } else {
        0.0
    };
    println!(
        "{:>8} {:>6} {:>10} {:>10} {:>7.2} {:>8.3} {:>10.3} {:>10.3}",
        payload_len,
        frame_len,
        sent,
        r.frames,
        loss,
        r.frames as f64 / secs / 1e6,
        r.bytes as f64 * 8.0 / secs / 1e9,
        (r.frames * payload_len as u64) as f64 * 8.0 / secs / 1e9,
    );
    if let Ok(ks) = rx.kernel_stats() {
        println!(
            "{:>8} receiver kernel stats: rx_dropped {} rx_ring_full {} fill_ring_empty {}",
            "", ks.rx_dropped, ks.rx_ring_full, ks.rx_fill_ring_empty_descs
        );
    }
    Ok(RawResult {
        frame_len,
        payload_gbps: (r.frames * payload_len as u64) as f64 * 8.0 / secs / 1e9,
    })
}
