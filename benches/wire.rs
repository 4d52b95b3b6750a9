//! The wire hot path against its floor: one RC RDMA WRITE ONLY frame with 1 KiB of
//! payload, over IPv4 and over IPv6.
//!
//! In each criterion group (`wire_ipv4`, `wire_ipv6`):
//! - `bare_crc32`: `crc32fast::hash` over the frame from the IP header to its end, the
//!   baseline: the ICRC alone hashes about as many bytes;
//! - `parse_verify`: `FrameView::parse` + `verify_icrc` + taking the payload slice, what the
//!   receive path does per packet;
//! - `build_generate`: `FrameRepr::emit` into a preallocated buffer, ICRC included, what the
//!   send path does per packet;
//! - `icrc_verify` (ratio report only, for diagnosis): `icrc::compute` over the same span
//!   and the comparison with the carried ICRC, without any parse: the ICRC's own cost.
//!
//! Throughput is in bytes of that IP-to-end span, the same for all three.
//!
//! Criterion does not relate functions to each other, so after it the bench measures the
//! three again, interleaved (one batch of each in turn, many rounds) and keeps each one's
//! fastest batch: on a machine shared with compilers the fastest batch is the one that ran
//! undisturbed, and interleaving exposes all three to the same load. It prints
//! `parse_verify/bare` and `build_generate/bare` per group (goals: ≤ 1.3 and ≤ 1.5), then
//! a JSON object on the last line. Only with `--bench` (as `cargo bench` passes), so that
//! `cargo test --benches` stays quick.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use xrnic::wire::{
    BthFields, BthRepr, EthRepr, ExtHeaders, FrameRepr, FrameTemplate, FrameView, IpRepr, Opcode,
    Psn, Qpn, RethRepr, Rkey, RoceRepr, UdpRepr, icrc,
};

const PAYLOAD: usize = 1024;
const ETH_LEN: usize = 14;

fn write_only(payload: &[u8], ipv6: bool) -> FrameRepr<'_> {
    let ip = if ipv6 {
        IpRepr::V6 {
            src: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            dst: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        }
    } else {
        IpRepr::V4 {
            src: [192, 0, 2, 1],
            dst: [192, 0, 2, 2],
            tos: 0x02,
            identification: 0,
            dont_fragment: true,
            ttl: 64,
        }
    };
    FrameRepr {
        eth: EthRepr {
            dst: [0x02, 0, 0, 0, 0, 2],
            src: [0x02, 0, 0, 0, 0, 1],
            vlan_tci: None,
        },
        ip,
        udp: UdpRepr {
            src_port: 0xc011,
            checksum: 0,
        },
        roce: RoceRepr {
            bth: BthRepr {
                ack_req: true,
                ..BthRepr::new(Opcode::RC_WRITE_ONLY, Qpn::new(0x11), Psn::new(0x12_3456))
            },
            ext: ExtHeaders {
                reth: Some(RethRepr {
                    va: 0x7f00_dead_b000,
                    rkey: Rkey(0x1234),
                    dma_len: PAYLOAD as u32,
                }),
                ..ExtHeaders::default()
            },
            payload,
        },
    }
}

/// One benchmarked frame and the three operations on it.
struct Case<'a> {
    group: &'static str,
    ipv6: bool,
    repr: FrameRepr<'a>,
    frame: Vec<u8>,
}

impl<'a> Case<'a> {
    fn new(payload: &'a [u8], ipv6: bool) -> Self {
        let repr = write_only(payload, ipv6);
        let mut frame = vec![0u8; repr.buffer_len()];
        let n = repr.emit(&mut frame).expect("the bench frame emits");
        assert_eq!(n, frame.len());
        // The frame is what it claims to be, so the bench measures the success path.
        let v = FrameView::parse(&frame).expect("the bench frame parses");
        v.verify_icrc().expect("the bench frame has a valid ICRC");
        assert_eq!(v.payload(), payload);
        Case {
            group: if ipv6 { "wire_ipv6" } else { "wire_ipv4" },
            ipv6,
            repr,
            frame,
        }
    }

    /// Everything from the IP header on: what the ICRC covers, plus the ICRC itself.
    fn ip_span(&self) -> &[u8] {
        &self.frame[ETH_LEN..]
    }

    fn bare_crc32(&self) -> u32 {
        crc32fast::hash(black_box(self.ip_span()))
    }

    fn parse_verify(&self) -> usize {
        let v = FrameView::parse(black_box(&self.frame)).unwrap();
        v.verify_icrc().unwrap();
        black_box(v.payload()).len()
    }

    fn icrc_verify(&self) -> bool {
        let span = black_box(self.ip_span());
        let (data, carried) = span.split_at(span.len() - icrc::LEN);
        let hl = if self.ipv6 { 40 } else { 20 };
        icrc::compute(self.ipv6, hl, data).to_le_bytes() == carried
    }

    fn build_generate(&self, out: &mut [u8]) -> usize {
        black_box(&self.repr).emit(black_box(out)).unwrap()
    }

    /// The engine's send path: the same frame from the connection's prebuilt header
    /// (`FrameTemplate`, made once per QP) and the per-packet fields.
    fn template_generate(&self, t: &FrameTemplate, out: &mut [u8]) -> usize {
        let r = black_box(&self.repr);
        let bth = &r.roce.bth;
        let f = BthFields {
            opcode: bth.opcode,
            psn: bth.psn,
            ack_req: bth.ack_req,
            solicited: bth.solicited,
        };
        t.emit(f, &r.roce.ext, r.roce.payload, black_box(out))
            .unwrap()
    }

    fn template(&self) -> FrameTemplate {
        FrameTemplate::new(
            self.repr.eth,
            self.repr.ip,
            self.repr.udp,
            &self.repr.roce.bth,
        )
    }
}

fn payload() -> Vec<u8> {
    (0..PAYLOAD).map(|i| (i * 7 + 3) as u8).collect()
}

fn bench_wire(c: &mut Criterion) {
    let payload = payload();
    for ipv6 in [false, true] {
        let case = Case::new(&payload, ipv6);
        let mut g = c.benchmark_group(case.group);
        g.throughput(Throughput::Bytes(case.ip_span().len() as u64));
        g.bench_function("bare_crc32", |b| b.iter(|| case.bare_crc32()));
        g.bench_function("parse_verify", |b| b.iter(|| case.parse_verify()));
        let mut out = vec![0u8; case.frame.len()];
        g.bench_function("build_generate", |b| {
            b.iter(|| case.build_generate(&mut out))
        });
        g.finish();
    }
}

criterion_group!(benches, bench_wire);

/// Iterations per timed batch: long enough (~50 µs) for the clock, short enough that many
/// batches run without being preempted.
const BATCH: u32 = 1000;
/// Batches of each function.
const ROUNDS: u32 = 3000;

/// Fastest batch of each of `fs`, in ns per iteration, the functions taking turns.
fn interleaved_min_ns(fs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    let mut best = vec![Duration::MAX; fs.len()];
    for _ in 0..ROUNDS {
        for (f, best) in fs.iter_mut().zip(&mut best) {
            let t = Instant::now();
            for _ in 0..BATCH {
                f();
            }
            *best = (*best).min(t.elapsed());
        }
    }
    best.iter()
        .map(|d| d.as_nanos() as f64 / f64::from(BATCH))
        .collect()
}

fn print_ratios() {
    let payload = payload();
    let mut json = serde_json::Map::new();
    println!(
        "\nratios to bare_crc32 (fastest of {ROUNDS} interleaved batches of {BATCH} iterations):"
    );
    for ipv6 in [false, true] {
        let case = Case::new(&payload, ipv6);
        let mut out = vec![0u8; case.frame.len()];
        let mut out2 = vec![0u8; case.frame.len()];
        let tmpl = case.template();
        // The template path makes the same bytes (checked here so the bench measures them).
        let n = case.template_generate(&tmpl, &mut out2);
        assert_eq!(out2[..n], case.frame[..]);
        let t = interleaved_min_ns(&mut [
            &mut || {
                black_box(case.bare_crc32());
            },
            &mut || {
                black_box(case.parse_verify());
            },
            &mut || {
                black_box(case.build_generate(&mut out));
            },
            &mut || {
                assert!(black_box(case.icrc_verify()));
            },
            &mut || {
                black_box(case.template_generate(&tmpl, &mut out2));
            },
        ]);
        let (bare, parse, build, icrc, tgen) = (t[0], t[1], t[2], t[3], t[4]);
        let (rp, rb) = (parse / bare, build / bare);
        let verdict = |r: f64, goal: f64| if r <= goal { "meets" } else { "MISSES" };
        println!("{}: bare_crc32 {bare:.1} ns", case.group);
        println!(
            "{}: parse_verify/bare = {rp:.2} ({parse:.1} ns; goal <= 1.30: {})",
            case.group,
            verdict(rp, 1.3)
        );
        println!(
            "{}: build_generate/bare = {rb:.2} ({build:.1} ns; goal <= 1.50: {})",
            case.group,
            verdict(rb, 1.5)
        );
        println!(
            "{}: template_generate/bare = {:.2} ({tgen:.1} ns; the engine's send path: the same frame from the QP's prebuilt header)",
            case.group,
            tgen / bare
        );
        println!(
            "{}: icrc_verify/bare = {:.2} ({icrc:.1} ns; the ICRC alone, for diagnosis)",
            case.group,
            icrc / bare
        );
        let round = |x: f64, digits: i32| (x * 10f64.powi(digits)).round() / 10f64.powi(digits);
        json.insert(
            case.group.into(),
            serde_json::json!({
                "bare_crc32_ns": round(bare, 2),
                "parse_verify_ns": round(parse, 2),
                "build_generate_ns": round(build, 2),
                "parse_verify_ratio": round(rp, 3),
                "build_generate_ratio": round(rb, 3),
                "icrc_verify_ns": round(icrc, 2),
                "template_generate_ns": round(tgen, 2),
                "template_generate_ratio": round(tgen / bare, 3),
            }),
        );
    }
    println!("{}", serde_json::Value::Object(json));
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    if std::env::args().any(|a| a == "--bench") {
        print_ratios();
    }
}
