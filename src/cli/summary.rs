//! `xrnic bench-summary`: the summary table of docs/performance.md (figure, command,
//! latest value, goal, state), regenerated from the benchmark sections of
//! docs/results.md, which each bench target rewrites (scripts/results.sh) before it calls
//! this. A figure is read from its section's JSON line (the last line that starts with
//! `{`) or, for the benchmarks that print none, from a text line. A figure its section
//! does not have (the benchmark never ran, or a run with only some sections) shows as
//! "not measured", never as a value.

use std::path::PathBuf;

/// Arguments of `xrnic bench-summary`.
#[derive(clap::Args, Debug)]
pub struct SummaryArgs {
    /// The results file the benchmarks write.
    #[arg(long, default_value = "docs/results.md")]
    pub results: PathBuf,
    /// The file whose `<!-- summary -->` … `<!-- /summary -->` block is replaced.
    #[arg(long, default_value = "docs/performance.md")]
    pub doc: PathBuf,
}

/// Where a figure is read.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// A key of the section's JSON line.
    Json(&'static str),
    /// The first number after `after` on the first line containing `line`.
    Text {
        line: &'static str,
        after: &'static str,
    },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Goal {
    AtLeast(f64),
    AtMost(f64),
    /// Reported, no goal.
    None,
}

/// One row of the table.
struct Row {
    figure: &'static str,
    /// The `<!-- results: SECTION -->` block of docs/results.md.
    section: &'static str,
    source: Source,
    goal: Goal,
    /// Where docs/performance.md says why, shown when the goal is missed.
    why: &'static str,
}

const ROWS: &[Row] = &[
    Row {
        figure: "transport per packet / floor, MTU 1024",
        section: "bench-transport",
        source: Source::Text {
            line: "MTU 1024:",
            after: "ratio ",
        },
        goal: Goal::AtMost(2.0),
        why: "#why-the-goals-are-not-reached-and-what-was-tried",
    },
    Row {
        figure: "transport per packet / floor, MTU 4096",
        section: "bench-transport",
        source: Source::Text {
            line: "MTU 4096:",
            after: "ratio ",
        },
        goal: Goal::AtMost(2.0),
        why: "#why-the-goals-are-not-reached-and-what-was-tried",
    },
    Row {
        figure: "idle RC QP, bytes",
        section: "bench-transport",
        source: Source::Text {
            line: "memory per idle RC QP",
            after: ": ",
        },
        goal: Goal::AtMost(16384.0),
        why: "#cpu-the-transport-and-wire-hot-paths",
    },
    Row {
        figure: "parse + ICRC verify / bare CRC, IPv4 (goal withdrawn, #22)",
        section: "bench-wire",
        source: Source::Text {
            line: "wire_ipv4: parse_verify/bare",
            after: "= ",
        },
        goal: Goal::None,
        why: "",
    },
    Row {
        figure: "build + ICRC generate / bare CRC, IPv4 (goal withdrawn, #22)",
        section: "bench-wire",
        source: Source::Text {
            line: "wire_ipv4: build_generate/bare",
            after: "= ",
        },
        goal: Goal::None,
        why: "",
    },
    Row {
        figure: "WRITE / raw AF_XDP, 1082 B frames",
        section: "bench-net",
        source: Source::Json("write_ratio_1024"),
        goal: Goal::AtLeast(0.7),
        why: "#network",
    },
    Row {
        figure: "WRITE / raw AF_XDP, 4154 B frames",
        section: "bench-net",
        source: Source::Json("write_ratio_4096"),
        goal: Goal::AtLeast(0.7),
        why: "#network",
    },
    Row {
        figure: "rc-pingpong / raw AF_XDP 2-frame round trip",
        section: "bench-net",
        source: Source::Json("rtt_over_raw2"),
        goal: Goal::AtMost(1.2),
        why: "#the-round-trip-against-its-floor",
    },
    Row {
        figure: "the same, median of back-to-back pairs",
        section: "bench-net",
        source: Source::Json("rtt_over_raw2_paired"),
        goal: Goal::None,
        why: "",
    },
    Row {
        figure: "WRITE goodput, 10 000 QPs / 1 QP",
        section: "bench-net",
        source: Source::Json("qps_10000_ratio"),
        goal: Goal::AtLeast(0.9),
        why: "#many-qps",
    },
    Row {
        figure: "memory per connected RC QP, bytes (RSS)",
        section: "bench-net",
        source: Source::Json("mem_per_qp_bytes"),
        goal: Goal::None,
        why: "",
    },
    Row {
        figure: "one TCP stream, Gbit/s",
        section: "bench-net",
        source: Source::Json("tcp_gbps"),
        goal: Goal::None,
        why: "",
    },
    Row {
        figure: "one QP's WRITE, Gbit/s (beside TCP)",
        section: "bench-net",
        source: Source::Json("tcp_write_gbps"),
        goal: Goal::None,
        why: "",
    },
    Row {
        figure: "CPU s per GB, WRITE / TCP",
        section: "bench-net",
        source: Source::Json("cpu_per_gb_ratio"),
        goal: Goal::None,
        why: "#against-kernel-tcp",
    },
    Row {
        figure: "stock ib_write_bw (drop-in library) / perf write",
        section: "bench-net",
        source: Source::Json("abi_write_ratio"),
        goal: Goal::AtLeast(0.95),
        why: "#network",
    },
    Row {
        figure: "through the device service / in process, ib_write_bw",
        section: "bench-net",
        source: Source::Json("service_write_ratio"),
        goal: Goal::AtLeast(0.8),
        why: "#network",
    },
    Row {
        figure: "ib_write_bw xrnic / rxe, same guests",
        section: "bench-rxe",
        source: Source::Json("bw_ratio"),
        goal: Goal::AtLeast(3.0),
        why: "#rxe-and-xrnic-in-the-same-guests",
    },
    Row {
        figure: "ib_write_lat xrnic / rxe, same guests",
        section: "bench-rxe",
        source: Source::Json("lat_ratio"),
        goal: Goal::AtMost(0.5),
        why: "#rxe-and-xrnic-in-the-same-guests",
    },
    Row {
        figure: "DCQCN lab: goodput of the bottleneck, %",
        section: "dcqcn-lab",
        // The table's row (`  of the bottleneck    88.3 %`), not the ceiling line before
        // it (`(96.6 % of the bottleneck)`): the first QP count's DCQCN run.
        source: Source::Text {
            line: "of the bottleneck ",
            after: "",
        },
        // docs/congestion.md: the flows together take >= 0.9 of the bottleneck.
        goal: Goal::AtLeast(90.0),
        why: "congestion.md#lab",
    },
];

/// The command that makes each section (the Makefile target).
fn command_of(section: &str) -> String {
    format!("`make {section}`")
}

/// The body of `<!-- results: SECTION -->` … `<!-- /results: SECTION -->`, if present.
fn section<'a>(results: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<!-- results: {name} -->");
    let close = format!("<!-- /results: {name} -->");
    let start = results.find(&open)? + open.len();
    let len = results[start..].find(&close)?;
    Some(&results[start..start + len])
}

/// The leading number of `s` (after spaces), if any.
fn leading_number(s: &str) -> Option<f64> {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(s.len());
    s[..end].parse().ok()
}

/// The figure `src` in a section's text; None when it is not there or not a number.
fn read(body: &str, src: Source) -> Option<f64> {
    match src {
        Source::Json(key) => {
            let line = body
                .lines()
                .rev()
                .find(|l| l.trim_start().starts_with('{'))?;
            let v: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
            v.get(key)?.as_f64()
        }
        Source::Text { line, after } => {
            let l = body.lines().find(|l| l.contains(line))?;
            let at = l.find(line)? + line.len();
            let rest = &l[at..];
            let i = rest.find(after)? + after.len();
            leading_number(&rest[i..])
        }
    }
}

/// The "when" of a section: its header line (`make ... on commit ..., DATE, N CPUs:`).
fn when(body: &str) -> Option<String> {
    let l = body.lines().find(|l| l.contains(" on commit "))?;
    let date = l.split(", ").find(|p| p.contains(" UTC"))?;
    let commit = l.split(" on commit ").nth(1)?.split(',').next()?;
    Some(format!("{date}, {commit}"))
}

fn fmt_value(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

/// The summary table from the text of docs/results.md.
pub fn table(results: &str) -> String {
    let mut out = String::from(
        "| figure | command | latest value | goal | state | measured |\n|---|---|---|---|---|---|\n",
    );
    for r in ROWS {
        let body = section(results, r.section);
        let v = body.and_then(|b| read(b, r.source));
        let goal = match r.goal {
            Goal::AtLeast(g) => format!("≥ {g}"),
            Goal::AtMost(g) => format!("≤ {g}"),
            Goal::None => "—".to_string(),
        };
        let met = |v: f64| match r.goal {
            Goal::AtLeast(g) => Some(v >= g),
            Goal::AtMost(g) => Some(v <= g),
            Goal::None => None,
        };
        let why = if r.why.is_empty() {
            String::new()
        } else {
            format!(": [why]({})", r.why)
        };
        let state = match v.map(met) {
            None => "not measured".to_string(),
            Some(Some(true)) => "met".to_string(),
            Some(Some(false)) => format!("**missed**{why}"),
            Some(None) => "reported".to_string(),
        };
        let value = v.map_or("—".to_string(), fmt_value);
        let measured = body.and_then(when).unwrap_or_else(|| "—".to_string());
        out.push_str(&format!(
            "| {} | {} | {value} | {goal} | {state} | {measured} |\n",
            r.figure,
            command_of(r.section)
        ));
    }
    out
}

/// `doc` with its summary block replaced by `table`; None without the markers.
pub fn replace_block(doc: &str, table: &str) -> Option<String> {
    const OPEN: &str = "<!-- summary -->";
    const CLOSE: &str = "<!-- /summary -->";
    let a = doc.find(OPEN)? + OPEN.len();
    let b = a + doc[a..].find(CLOSE)?;
    Some(format!("{}\n{}{}", &doc[..a], table, &doc[b..]))
}

/// Run `xrnic bench-summary`.
pub fn run(args: &SummaryArgs) -> std::process::ExitCode {
    let read_file = |p: &PathBuf| {
        std::fs::read_to_string(p).map_err(|e| format!("bench-summary: {}: {e}", p.display()))
    };
    let result = (|| -> Result<(), String> {
        let results = read_file(&args.results)?;
        let doc = read_file(&args.doc)?;
        let new = replace_block(&doc, &table(&results)).ok_or_else(|| {
            format!(
                "bench-summary: {} has no <!-- summary --> … <!-- /summary --> block",
                args.doc.display()
            )
        })?;
        std::fs::write(&args.doc, new)
            .map_err(|e| format!("bench-summary: {}: {e}", args.doc.display()))
    })();
    match result {
        Ok(()) => {
            eprintln!("bench-summary: {} updated", args.doc.display());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESULTS: &str = "\
# Results
<!-- results: bench-transport -->
`make bench-transport` on commit af91837, 2026-12-01 09:49 UTC, 2 CPUs:

```text
transport: 64 KiB WRITE, MTU 1024: engine 199 ns/packet (5.04 Mpps), floor 109 ns/packet (ICRC x2 + 1 copy), ratio 1.82 (goal <= 2); vs floor 1.41
transport: 64 KiB WRITE, MTU 4096: engine 480 ns/packet (2.08 Mpps), floor 251 ns/packet, ratio 2.31 (goal <= 2)
transport: memory per idle RC QP: 664 bytes (goal <= 16384)
```
<!-- /results: bench-transport -->
<!-- results: bench-net -->
`make bench-net` on commit 74ceb73, 2026-12-01 09:54 UTC, 2 CPUs:

```text
best of 3 rounds:
{\"qps_10000_ratio\":0.95,\"rtt_over_raw2\":1.48,\"write_ratio_1024\":0.99,\"tcp_gbps\":null}
```
<!-- /results: bench-net -->
";

    fn row<'a>(t: &'a str, figure: &str) -> &'a str {
        t.lines()
            .find(|l| l.starts_with(&format!("| {figure} |")))
            .unwrap_or_else(|| panic!("no row {figure} in\n{t}"))
    }

    #[test]
    fn values_come_from_the_json_line_and_the_text_lines() {
        let t = table(RESULTS);
        let r = row(&t, "WRITE goodput, 10 000 QPs / 1 QP");
        assert!(r.contains("| 0.950 | ≥ 0.9 | met |"), "{r}");
        assert!(r.contains("2026-12-01 09:54 UTC, 74ceb73"), "{r}");
        let r = row(&t, "rc-pingpong / raw AF_XDP 2-frame round trip");
        assert!(
            r.contains("| 1.480 | ≤ 1.2 | **missed**: [why](#the-round-trip-against-its-floor) |"),
            "{r}"
        );
        let r = row(&t, "transport per packet / floor, MTU 1024");
        assert!(r.contains("| 1.820 | ≤ 2 | met |"), "{r}");
        let r = row(&t, "transport per packet / floor, MTU 4096");
        assert!(r.contains("| 2.310 | ≤ 2 | **missed**"), "{r}");
        let r = row(&t, "idle RC QP, bytes");
        assert!(r.contains("| 664 | ≤ 16384 | met |"), "{r}");
    }

    #[test]
    fn absent_figures_are_not_measured_never_a_value() {
        let t = table(RESULTS);
        // null in the JSON, a key missing, a section missing.
        for f in [
            "one TCP stream, Gbit/s",
            "WRITE / raw AF_XDP, 4154 B frames",
            "ib_write_bw xrnic / rxe, same guests",
        ] {
            let r = row(&t, f);
            assert!(r.contains("| — |") && r.contains("not measured"), "{r}");
        }
        // Every row is there, once.
        assert_eq!(t.lines().count(), ROWS.len() + 2);
    }

    /// The lab's summary starts with the ceiling run, whose line also says "of the
    /// bottleneck": the figure is the DCQCN column of the first QP count.
    #[test]
    fn the_dcqcn_lab_figure_is_the_dcqcn_run_not_the_ceiling() {
        let results = "\
<!-- results: dcqcn-lab -->
`make dcqcn-lab` on commit 0e435a3, 2026-12-01 19:57 UTC, 2 CPUs:

```text
Ceiling: 1 QP(s) without congestion control through a FIFO of the same rate
  goodput 40.2 Mb/s (80.4 % of the bottleneck), retransmitted 0, FIFO drops 0

2 QPs                             with DCQCN   without DCQCN
goodput, all QPs (Mb/s)                 38.9            15.4
  of the bottleneck                   77.7 %          30.8 %
  of the ceiling                      96.7 %          38.3 %
```
<!-- /results: dcqcn-lab -->
";
        let t = table(results);
        let r = row(&t, "DCQCN lab: goodput of the bottleneck, %");
        assert!(r.contains("| 77.700 | ≥ 90 | **missed**"), "{r}");
    }

    #[test]
    fn the_block_is_replaced_and_the_rest_kept() {
        let doc = "a\n<!-- summary -->\nold\n<!-- /summary -->\nb\n";
        let new = replace_block(doc, "T\n").unwrap();
        assert_eq!(new, "a\n<!-- summary -->\nT\n<!-- /summary -->\nb\n");
        // Idempotent on its own output.
        assert_eq!(replace_block(&new, "T\n").unwrap(), new);
        assert_eq!(replace_block("no markers", "T\n"), None);
    }
}
