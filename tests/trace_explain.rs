//! Tracing and teaching on the simulator: `xrnic sim --pcap` captures that
//! decode cleanly and name every retransmission, `xrnic explain` on them and on real
//! captures, the per-QP event trace, and resource listings with a QP in ERR.

use xrnic::proto::Instant;
mod cli_support;

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use cli_support::*;
use serde_json::Value;
use xrnic::proto::trace::Event;
use xrnic::proto::{Mtu, QpState, RdmaInfo, SendWr, Sge, WcStatus, WrOpcode};
use xrnic::sim::{ConnectOpts, LinkConfig, Pair};
use xrnic::trace_out::event_of;
use xrnic::wire::Rkey;
use xrnic_cli::cli::sim::{Ops, SimOptions, SimParams, SimSummary, SizeSpec, simulate_with};

fn lossy() -> SimParams {
    SimParams {
        ops: Ops::Mixed,
        messages: 150,
        size: SizeSpec::Mix,
        mtu: Mtu::Mtu1024,
        link: LinkConfig {
            loss: 0.02,
            reorder: 0.01,
            dup: 0.01,
            corrupt: 0.01,
            ..LinkConfig::default()
        },
        seed: 11,
        ipv6: false,
        depth: 8,
    }
}

/// An in-memory JSON-lines trace of one run.
fn traced<T>(f: impl FnOnce() -> T) -> (T, Vec<Value>) {
    #[derive(Clone)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf(Arc::new(Mutex::new(Vec::new())));
    let b2 = buf.clone();
    let sub = xrnic::trace_out::json_lines_to(move || b2.clone());
    let r = tracing::subscriber::with_default(sub, f);
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let events = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}")))
        .collect();
    (r, events)
}

/// The kinds of event in a trace; every line names one.
fn kinds(events: &[Value]) -> HashSet<Event> {
    events
        .iter()
        .map(|e| event_of(e).unwrap_or_else(|| panic!("no event kind in {e}")))
        .collect()
}

fn explain_json(file: &Path) -> (Vec<Value>, Value) {
    let o = xrnic(&["explain", "--json", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut v: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sum = v.pop().expect("a summary line");
    (v, sum)
}

#[test]
#[cfg_attr(xrnic_no_tshark, ignore = "needs tshark")]
fn lossy_sim_pcap_decodes_and_names_every_retransmission() {
    let path = scratch("lossy.pcapng");
    let opts = SimOptions {
        pcap: Some(path.clone()),
        ..SimOptions::default()
    };
    let ((s, out), events): ((SimSummary, _), _) = traced(|| simulate_with(&lossy(), &opts));
    assert!(s.ok, "{s:#?}");
    assert!(
        s.retransmitted_packets > 0 && s.link.corrupted > 0,
        "{s:#?}"
    );
    assert_eq!(out.pcap_packets, s.packets_sent);

    // Recorded as each device sent it (before the link): every ICRC is valid.
    let frames = xrnic::io::capture::read_file(&path).unwrap();
    assert_eq!(frames.len() as u64, s.packets_sent);
    let mut sink = Vec::new();
    let d = xrnic_cli::cli::decode::decode_frames(
        &frames,
        xrnic_cli::cli::decode::Format::Text,
        &mut sink,
    )
    .unwrap();
    assert_eq!(d.roce as u64, s.packets_sent);
    assert!(d.all_good(), "{d:?}");
    // Virtual time, nanoseconds: the last frame is within the run's virtual time.
    let last = frames.last().unwrap().timestamp.as_micros() as u64;
    assert!(last <= s.virtual_time_us && last > 0);

    // The comments name every retransmission, and the link's doings.
    let bytes = std::fs::read(&path).unwrap();
    let comments = xrnic::io::pcap_out::packet_comments(&bytes);
    assert_eq!(comments.len(), frames.len());
    let retrans = comments
        .iter()
        .flatten()
        .filter(|c| c.starts_with("retransmission"))
        .count() as u64;
    assert_eq!(retrans, s.retransmitted_packets);
    let dropped = comments
        .iter()
        .flatten()
        .filter(|c| c.contains("the link drops this frame"))
        .count() as u64;
    assert_eq!(dropped, s.link.lost);

    // explain, from the capture alone, counts the same.
    let (ladders, sum) = explain_json(&path);
    assert_eq!(ladders.len(), 1);
    assert_eq!(sum["qps"], 1);
    assert_eq!(
        sum["retransmitted_packets"].as_u64(),
        Some(s.retransmitted_packets)
    );
    assert_eq!(sum["naks"].as_u64(), Some(s.naks_sent));
    assert_eq!(sum["messages"].as_u64(), Some(s.messages));
    assert_eq!(sum["packets"].as_u64(), Some(s.packets_sent));

    // Wireshark's reading: every frame is RoCE with a good ICRC... (tshark checks the
    // ICRC only with an option, so the comments are what is checked there).
    {
        require_tshark();
        let o = std::process::Command::new("tshark")
            .args(["-r", path.to_str().unwrap(), "-Y"])
            .arg("frame.comment contains \"retransmission\"")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let n = String::from_utf8_lossy(&o.stdout).lines().count() as u64;
        assert_eq!(n, s.retransmitted_packets);
        let o = std::process::Command::new("tshark")
            .args(["-r", path.to_str().unwrap(), "-Y", "infiniband"])
            .output()
            .unwrap();
        let n = String::from_utf8_lossy(&o.stdout).lines().count() as u64;
        assert_eq!(n, s.packets_sent, "tshark sees every frame as RoCE");
    }

    // The trace has every kind of event a lossy run produces, each with time, device, QPN.
    let k = kinds(&events);
    for want in [
        Event::State,
        Event::WqePosted,
        Event::WqeStarted,
        Event::WqeCompleted,
        Event::PsnWindow,
        Event::AckQueued,
        Event::NakQueued,
        Event::NakReceived,
        Event::GoBackN,
        Event::TimerArmed,
        Event::DuplicateRequest,
    ] {
        assert!(k.contains(&want), "no {want} event in {k:?}");
    }
    for e in &events {
        assert!(e["now_ns"].is_u64() && e["qpn"].is_u64(), "{e}");
        assert!(matches!(e["dev"].as_str(), Some("A" | "B")), "{e}");
    }
    // ACK coalescing is visible: some queued ACK replaced an older one.
    assert!(
        events
            .iter()
            .any(|e| event_of(e) == Some(Event::AckQueued) && e["replaces_psn"].is_u64())
    );
    // NAKs carry their syndrome.
    assert!(
        events
            .iter()
            .any(|e| event_of(e) == Some(Event::NakReceived) && e["syndrome"] == "PsnSequenceError")
    );
}

#[test]
fn timeouts_fire_and_are_traced() {
    // Heavy loss: some losses are only repaired by the local ACK timeout.
    let mut p = lossy();
    p.link.loss = 0.2;
    p.link.corrupt = 0.0;
    p.messages = 40;
    let ((s, _), events) = traced(|| simulate_with(&p, &SimOptions::default()));
    assert!(s.ok, "{s:#?}");
    assert!(s.local_ack_timeouts > 0);
    let fired = events
        .iter()
        .filter(|e| event_of(e) == Some(Event::TimerFired) && e["timer"] == "ack")
        .count() as u64;
    assert_eq!(fired, s.local_ack_timeouts);
    assert!(
        events
            .iter()
            .any(|e| event_of(e) == Some(Event::GoBackN) && e["cause"] == "Timeout")
    );
}

#[test]
fn rnr_run_traces_waits_and_comments_rnr_retries() {
    let path = scratch("rnr.pcapng");
    let p = SimParams {
        ops: Ops::Send,
        messages: 40,
        size: SizeSpec::Fixed(2000),
        link: LinkConfig::default(),
        ..lossy()
    };
    let opts = SimOptions {
        recv_depth: Some(2),
        recv_delay_ns: 20_000,
        pcap: Some(path.clone()),
        ..SimOptions::default()
    };
    let ((s, _), events) = traced(|| simulate_with(&p, &opts));
    assert!(s.ok, "{s:#?}");
    assert!(s.rnr_naks_sent > 0, "{s:#?}");
    let k = kinds(&events);
    for want in [
        Event::RnrNakQueued,
        Event::RnrNakReceived,
        Event::RnrWait,
        Event::TimerFired,
    ] {
        assert!(k.contains(&want), "no {want} event in {k:?}");
    }
    let waits = events
        .iter()
        .filter(|e| event_of(e) == Some(Event::RnrWait))
        .count() as u64;
    assert_eq!(waits, s.rnr_naks_sent);
    let bytes = std::fs::read(&path).unwrap();
    let comments = xrnic::io::pcap_out::packet_comments(&bytes);
    let rnr_naks = comments
        .iter()
        .flatten()
        .filter(|c| c.starts_with("RNR NAK"))
        .count() as u64;
    assert_eq!(rnr_naks, s.rnr_naks_sent);
    assert!(
        comments
            .iter()
            .flatten()
            .any(|c| c.contains("RNR retry after the RNR NAK timer"))
    );
    let (_, sum) = explain_json(&path);
    assert_eq!(sum["rnr_naks"].as_u64(), Some(s.rnr_naks_sent));
    assert_eq!(
        sum["retransmitted_packets"].as_u64(),
        Some(s.retransmitted_packets)
    );
    let text = stdout(&xrnic(&["explain", path.to_str().unwrap()]));
    assert!(text.contains("RNR NAK psn"), "{text}");
}

#[test]
fn dcqcn_run_traces_rate_updates_and_cnps() {
    let path = scratch("dcqcn.pcapng");
    let mut p = lossy();
    p.link = LinkConfig {
        ce_mark: 0.05,
        ..LinkConfig::default()
    };
    p.ops = Ops::Write;
    p.size = SizeSpec::Fixed(16384);
    p.messages = 60;
    let opts = SimOptions {
        dcqcn: Some(xrnic::proto::congestion::DcqcnParams::connectx()),
        pcap: Some(path.clone()),
        ..SimOptions::default()
    };
    let ((s, out), events) = traced(|| simulate_with(&p, &opts));
    assert!(s.ok, "{s:#?}");
    assert!(s.link.ce_marked > 0 && out.cnps_sent > 0, "{s:#?} {out:?}");
    let k = kinds(&events);
    for want in [Event::CnpSent, Event::CnpReceived, Event::RateUpdate] {
        assert!(k.contains(&want), "no {want} event in {k:?}");
    }
    let cut = events
        .iter()
        .find(|e| event_of(e) == Some(Event::RateUpdate))
        .expect("a rate update");
    assert_eq!(cut["dev"], "A", "the requester's rate is cut");
    let rate = cut["rate_bps"].as_u64().unwrap();
    assert!(rate < 25_000_000_000, "{cut}");
    assert!(cut["target_bps"].is_u64() && cut["alpha"].as_f64().unwrap() > 0.0);
    let sent = events
        .iter()
        .filter(|e| event_of(e) == Some(Event::CnpSent))
        .count() as u64;
    assert_eq!(sent, out.cnps_sent);
    let bytes = std::fs::read(&path).unwrap();
    let cnp_comments = xrnic::io::pcap_out::packet_comments(&bytes)
        .into_iter()
        .flatten()
        .filter(|c| c.starts_with("CNP"))
        .count() as u64;
    assert_eq!(cnp_comments, out.cnps_sent);
    let (_, sum) = explain_json(&path);
    assert_eq!(sum["cnps"].as_u64(), Some(out.cnps_sent));
}

#[test]
fn resources_show_a_qp_driven_into_err() {
    let mut pair = Pair::new(LinkConfig::default(), 5);
    pair.a.set_name("A");
    let c = pair.connect(&ConnectOpts::default()).unwrap();
    let src = pair
        .a
        .reg_mr(c.pd_a, 4096, xrnic::proto::Access::LOCAL_WRITE)
        .unwrap();
    let mut w = SendWr::new(1, WrOpcode::RdmaWrite);
    w.sg_list = vec![Sge {
        addr: src.addr,
        length: 100,
        lkey: src.lkey,
    }];
    // No region has this R_Key: the responder NAKs remote access error, A's QP goes to ERR.
    w.rdma = RdmaInfo {
        remote_addr: 0x1000,
        rkey: Rkey(0xdead_be00),
    };
    pair.a.post_send(c.qp_a, w).unwrap();
    let mut wcs = Vec::new();
    let (_, events) = traced(|| {
        pair.run_until(Instant::from_nanos(1_000_000_000), |p| {
            p.a.poll_cq(c.cq_a, 16, &mut wcs);
            !wcs.is_empty()
        })
    });
    assert_eq!(wcs[0].status, WcStatus::RemAccessErr);
    let r = pair.a.resources();
    let q = r.qps.iter().find(|q| q.qpn == c.qp_a.value()).unwrap();
    assert_eq!(q.state, QpState::Err);
    let lines = r.qp_lines();
    assert!(lines.contains("state ERR"), "{lines}");
    assert!(r.mr_lines().contains("pinned 4096"), "{}", r.mr_lines());
    assert!(
        events
            .iter()
            .any(|e| event_of(e) == Some(Event::State) && e["to"] == "Err" && e["dev"] == "A"),
        "{events:?}"
    );
    assert!(
        events.iter().any(
            |e| event_of(e) == Some(Event::NakReceived) && e["syndrome"] == "RemoteAccessError"
        )
    );
}

#[test]
fn sim_cli_writes_pcap_trace_and_resources() {
    let pcap = scratch("cli.pcapng");
    let trace = scratch("cli.jsonl");
    let o = xrnic(&[
        "sim",
        "--messages",
        "30",
        "--loss",
        "0.05",
        "--seed",
        "2",
        "--pcap",
        pcap.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--res",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("link A/1 lqpn 17 rqpn 17 type RC state RTS"),
        "{text}"
    );
    assert!(text.contains("dev B cqn 0"), "{text}");
    let t = std::fs::read_to_string(&trace).unwrap();
    assert!(t.lines().count() > 30);
    for l in t.lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        assert!(event_of(&v).is_some() && v["now_ns"].is_u64(), "{v}");
    }
    let sim_retx: u64 = text
        .lines()
        .find_map(|l| l.split("retransmitted ").nth(1))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .expect("retransmitted count in the summary");
    let (_, sum) = explain_json(&pcap);
    assert_eq!(sum["retransmitted_packets"].as_u64(), Some(sim_retx));
    // A file that cannot be created is a clear error.
    let o = xrnic(&[
        "sim",
        "--messages",
        "1",
        "--pcap",
        "/nonexistent/dir/x.pcapng",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("cannot create"), "{}", stdout(&o));
}

#[test]
#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]
fn explain_rxe_read_vector_shows_one_request_and_four_responses() {
    let f = vector("rxe/monty_roce_capture_read-write-ecn.pcap");
    let (ladders, _) = explain_json(&f);
    let rc: Vec<&Value> = ladders
        .iter()
        .filter(|l| {
            l["steps"].as_array().unwrap().iter().any(|s| {
                s["label"]
                    .as_str()
                    .unwrap()
                    .starts_with("RDMA_READ_REQUEST")
            })
        })
        .collect();
    assert_eq!(rc.len(), 1, "one QP pair does the READ");
    let steps = rc[0]["steps"].as_array().unwrap();
    let req = steps
        .iter()
        .filter(|s| {
            s["label"]
                .as_str()
                .unwrap()
                .starts_with("RDMA_READ_REQUEST")
        })
        .count();
    let resp: Vec<&Value> = steps
        .iter()
        .filter(|s| {
            s["label"]
                .as_str()
                .unwrap()
                .starts_with("RDMA_READ_RESPONSE")
        })
        .collect();
    assert_eq!((req, resp.len()), (1, 4));
    assert!(resp.iter().all(|s| s["from_left"] == false));
    assert_eq!(rc[0]["summary"]["retransmitted_packets"], 0);
}

#[test]
#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]
fn explain_huawei_capture_shows_send_first_last_with_imm() {
    let f = vector("huawei_hiroce/oferby_proxy_roce.pcap");
    let text = stdout(&xrnic(&["explain", "--full", f.to_str().unwrap()]));
    assert!(text.contains("SEND_FIRST psn 0 1024 B"), "{text}");
    assert!(
        text.contains("SEND_LAST_WITH_IMMEDIATE psn 1 1024 B imm 0x00000001"),
        "{text}"
    );
    let (_, sum) = explain_json(&f);
    assert_eq!(sum["retransmitted_packets"], 0);
    assert!(sum["messages"].as_u64().unwrap() > 10);
}

#[test]
fn explain_loss_capture_shows_the_nak_and_the_resend() {
    let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("interop/captures/write_bw_loss_v4.pcapng");
    let text = stdout(&xrnic(&["explain", f.to_str().unwrap()]));
    let nak = text
        .find("NAK PSN sequence error psn 7710184")
        .expect(&text);
    let resend = text
        .find("RDMA_WRITE_MIDDLE psn 7710184 1024 B  [retransmission")
        .expect(&text);
    assert!(nak < resend, "{text}");
    assert!(
        text.contains("gap: psn 7710184 not in the capture"),
        "{text}"
    );
    // Collapsed, and not with --full.
    assert!(
        text.contains("… 22 more RDMA_WRITE_MIDDLE psn 7710202..7710223"),
        "{text}"
    );
    let full = stdout(&xrnic(&["explain", "--full", f.to_str().unwrap()]));
    assert!(!full.contains("more RDMA_WRITE_MIDDLE") && full.lines().count() > 70);
    let (_, sum) = explain_json(&f);
    assert_eq!(sum["naks"], 1);
    assert_eq!(sum["retransmitted_packets"], 17);
}

#[test]
#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]
fn explain_every_capture_gives_sensible_ladders_and_svg() {
    let mut files = vector_files();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("interop/captures");
    for f in std::fs::read_dir(&dir).unwrap() {
        let f = f.unwrap().path();
        if f.extension().is_some_and(|e| e == "pcapng" || e == "pcap") {
            files.push(f);
        }
    }
    assert!(files.len() >= 9);
    for f in files {
        let svg = scratch("x.svg");
        let o = xrnic(&[
            "explain",
            f.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}: {}", f.display(), stderr(&o));
        let text = stdout(&o);
        assert!(text.contains("QP pair: "), "{}: {text}", f.display());
        let s = std::fs::read_to_string(&svg).unwrap();
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        let (ladders, sum) = explain_json(&f);
        assert!(sum["roce_packets"].as_u64().unwrap() > 0, "{}", f.display());
        assert_eq!(sum["qps"].as_u64(), Some(ladders.len() as u64));
        let steps: u64 = ladders
            .iter()
            .map(|l| {
                l["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s["count"].as_u64().unwrap())
                    .sum::<u64>()
            })
            .sum();
        assert_eq!(Some(steps), sum["roce_packets"].as_u64(), "{}", f.display());
        for k in [
            "packets",
            "messages",
            "retransmitted_packets",
            "naks",
            "rnr_naks",
            "cnps",
        ] {
            assert!(sum[k].is_u64(), "{k} missing");
        }
    }
    // Not a capture: a clear error, exit 1.
    let o = xrnic(&["explain", "Cargo.toml"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cannot read"));
}

#[test]
#[cfg_attr(xrnic_no_vectors, ignore = "needs ../shared/vectors")]
fn cnp_vector_is_a_cnp() {
    let f = vector("single/scapy_cx4lx_cnp.pcap");
    let (_, sum) = explain_json(&f);
    assert_eq!(sum["cnps"], 1);
}

#[test]
fn failed_sim_exit_code_is_not_success_on_bad_pcap_path() {
    let (s, _) = simulate_with(
        &lossy(),
        &SimOptions {
            pcap: Some("/nonexistent/dir/y.pcapng".into()),
            ..SimOptions::default()
        },
    );
    assert!(!s.ok && s.stalled.unwrap().contains("cannot create"));
}

#[test]
fn ce_marks_on_ipv6_frames_reach_the_notification_point() {
    let mut p = lossy();
    p.ipv6 = true;
    p.link = LinkConfig {
        ce_mark: 0.1,
        ..LinkConfig::default()
    };
    p.ops = Ops::Write;
    p.size = SizeSpec::Fixed(8192);
    p.messages = 30;
    let opts = SimOptions {
        dcqcn: Some(xrnic::proto::congestion::DcqcnParams::connectx()),
        ..SimOptions::default()
    };
    let (s, out) = simulate_with(&p, &opts);
    assert!(s.ok, "{s:#?}");
    // Marked frames still pass the ICRC (ECN is masked) and are answered with CNPs.
    assert_eq!(s.malformed_frames_dropped, 0);
    assert!(s.link.ce_marked > 0 && out.cnps_sent > 0, "{s:#?} {out:?}");
    // Without DCQCN nothing is ECN-capable: nothing gets marked.
    let (s, out) = simulate_with(&p, &SimOptions::default());
    assert_eq!((s.link.ce_marked, out.cnps_sent), (0, 0));
}
