//! `xrnic plot CSV -o OUT.svg`: an SVG chart of a `xrnic perf --cc-log` time series (the
//! DCQCN lab's plots, docs/congestion.md), drawn with plotters' SVG backend.
//!
//! Contract:
//! - Input: the CSV of [`super::cclog`] (its exact header; rows in time order). Anything
//!   else is a clear error naming the line, exit status 1; nothing panics on bad input.
//! - Output: three panels over time: each QP's DCQCN current rate (solid) and target rate
//!   (dashed) on a log scale in Mb/s, with the bottleneck (`--bottleneck-mbps`) as a grey
//!   line; each QP's goodput and their sum (delivered bytes over `--window-ms` windows);
//!   each QP's α. With DCQCN off (empty rate columns) the first and last panels say so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use plotters::prelude::*;

use super::cclog::HEADER;

#[derive(Clone, Debug, clap::Args)]
pub struct PlotArgs {
    /// The CSV written by `xrnic perf --cc-log`.
    pub csv: PathBuf,
    /// The SVG to write.
    #[arg(short, long, value_name = "OUT.svg")]
    pub output: PathBuf,
    /// Title of the chart.
    #[arg(long, default_value = "DCQCN lab")]
    pub title: String,
    /// Draw the bottleneck rate (Mb/s) as a reference line.
    #[arg(long, value_name = "MBPS")]
    pub bottleneck_mbps: Option<f64>,
    /// Goodput averaging window, milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub window_ms: u64,
}

/// One CSV row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub t: f64,
    pub qp: usize,
    pub rate_mbps: Option<f64>,
    pub target_mbps: Option<f64>,
    pub alpha: Option<f64>,
    pub delivered_bytes: u64,
}

/// Parse a `--cc-log` CSV.
pub fn parse_csv(text: &str) -> Result<Vec<Sample>, String> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, h)) if h.trim() == HEADER => {}
        Some((_, h)) => {
            return Err(format!(
                "line 1 is not the header of xrnic perf --cc-log ('{h}', expected '{HEADER}')"
            ));
        }
        None => return Err("empty file".into()),
    }
    let mut out = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let n = i + 1;
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != 9 {
            return Err(format!("line {n}: {} fields, expected 9", f.len()));
        }
        let num = |k: usize, what: &str| -> Result<f64, String> {
            f[k].parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| format!("line {n}: {what} '{}' is not a number", f[k]))
        };
        let opt = |k: usize, what: &str| -> Result<Option<f64>, String> {
            if f[k].is_empty() {
                Ok(None)
            } else {
                num(k, what).map(Some)
            }
        };
        out.push(Sample {
            t: num(0, "t_s")?,
            qp: f[1]
                .parse()
                .map_err(|_| format!("line {n}: qp '{}' is not an index", f[1]))?,
            rate_mbps: opt(3, "rate_mbps")?,
            target_mbps: opt(4, "target_mbps")?,
            alpha: opt(5, "alpha")?,
            delivered_bytes: f[6]
                .parse()
                .map_err(|_| format!("line {n}: delivered_bytes '{}' is not a count", f[6]))?,
        });
    }
    if out.is_empty() {
        return Err("no samples".into());
    }
    Ok(out)
}

/// Goodput in Mb/s of one QP's samples over windows of `window` seconds: one point per
/// window end, `(t, Mb/s)`.
pub fn goodput(samples: &[&Sample], window: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let Some(first) = samples.first() else {
        return out;
    };
    let (mut t0, mut b0) = (first.t, first.delivered_bytes);
    for s in samples.iter().skip(1) {
        let dt = s.t - t0;
        // A nanosecond of slack: times are decimal seconds from the CSV.
        if dt + 1e-9 >= window {
            let bytes = s.delivered_bytes.saturating_sub(b0);
            out.push((s.t, bytes as f64 * 8.0 / dt / 1e6));
            (t0, b0) = (s.t, s.delivered_bytes);
        }
    }
    out
}

fn colour(i: usize) -> RGBColor {
    const C: [RGBColor; 6] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(23, 190, 207),
    ];
    C[i % C.len()]
}

/// Draw `samples` into an SVG at `out`.
pub fn draw(samples: &[Sample], args: &PlotArgs, out: &Path) -> Result<(), String> {
    let s = Series::new(samples, args.window_ms);
    let root = SVGBackend::new(out, (1000, 960)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let root = root
        .titled(&args.title, ("sans-serif", 22))
        .map_err(draw_err)?;
    let panels = root.split_evenly((3, 1));
    draw_rates(&panels[0], samples, &s, args)?;
    draw_goodput(&panels[1], &s, args)?;
    draw_alpha(&panels[2], &s)?;
    root.present().map_err(draw_err)?;
    Ok(())
}

/// A drawing error as the message `xrnic plot` prints.
fn draw_err(x: impl std::fmt::Display) -> String {
    x.to_string()
}

/// One panel of the chart.
type Panel<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// What the panels draw, from the samples.
struct Series<'s> {
    /// Each QP's samples, in time order.
    by_qp: BTreeMap<usize, Vec<&'s Sample>>,
    /// Each QP's goodput per window, `(t, Mb/s)`.
    goodputs: Vec<(usize, Vec<(f64, f64)>)>,
    /// The sum over QPs, on the first QP's window ends (samples are taken together).
    total: Vec<(f64, f64)>,
    /// The last sample's time (at least 1 ms): the x axis's end.
    tmax: f64,
    /// Whether any sample has a DCQCN rate.
    has_cc: bool,
}

impl<'s> Series<'s> {
    fn new(samples: &'s [Sample], window_ms: u64) -> Self {
        let mut by_qp: BTreeMap<usize, Vec<&Sample>> = BTreeMap::new();
        for s in samples {
            by_qp.entry(s.qp).or_default().push(s);
        }
        let tmax = samples.iter().map(|s| s.t).fold(0.0, f64::max).max(1e-3);
        let window = window_ms as f64 / 1e3;
        let goodputs: Vec<(usize, Vec<(f64, f64)>)> = by_qp
            .iter()
            .map(|(&q, v)| (q, goodput(v, window)))
            .collect();
        let mut total: Vec<(f64, f64)> = Vec::new();
        if let Some((_, g0)) = goodputs.first() {
            for (k, &(t, _)) in g0.iter().enumerate() {
                let sum: f64 = goodputs
                    .iter()
                    .filter_map(|(_, g)| g.get(k))
                    .map(|p| p.1)
                    .sum();
                total.push((t, sum));
            }
        }
        let has_cc = samples.iter().any(|s| s.rate_mbps.is_some());
        Series {
            by_qp,
            goodputs,
            total,
            tmax,
            has_cc,
        }
    }
}

/// 1. Rates (log scale: they span the line rate down to the bottleneck share).
fn draw_rates(
    area: &Panel<'_>,
    samples: &[Sample],
    s: &Series<'_>,
    args: &PlotArgs,
) -> Result<(), String> {
    let rmax = samples
        .iter()
        .flat_map(|s| [s.rate_mbps, s.target_mbps])
        .flatten()
        .fold(args.bottleneck_mbps.unwrap_or(1.0), f64::max)
        * 1.5;
    let rmin = samples
        .iter()
        .flat_map(|s| [s.rate_mbps, s.target_mbps])
        .flatten()
        .fold(args.bottleneck_mbps.unwrap_or(rmax), f64::min)
        .max(0.1)
        / 1.5;
    let mut c = ChartBuilder::on(area)
        .caption(
            if s.has_cc {
                "DCQCN current rate (solid) and target rate (dashed) per QP"
            } else {
                "DCQCN off: QPs send at line rate, no rate state"
            },
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..s.tmax, (rmin..rmax).log_scale())
        .map_err(draw_err)?;
    c.configure_mesh()
        .x_desc("time (s)")
        .y_desc("Mb/s (log)")
        .draw()
        .map_err(draw_err)?;
    if let Some(b) = args.bottleneck_mbps {
        c.draw_series(LineSeries::new(
            [(0.0, b), (s.tmax, b)],
            RGBColor(150, 150, 150).stroke_width(1),
        ))
        .map_err(draw_err)?
        .label(format!("bottleneck {b} Mb/s"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RGBColor(150, 150, 150)));
    }
    for (&q, v) in s.by_qp.iter().filter(|_| s.has_cc) {
        let col = colour(q);
        let rate: Vec<(f64, f64)> = v
            .iter()
            .filter_map(|s| Some((s.t, s.rate_mbps?.max(rmin))))
            .collect();
        let target: Vec<(f64, f64)> = v
            .iter()
            .filter_map(|s| Some((s.t, s.target_mbps?.max(rmin))))
            .collect();
        c.draw_series(LineSeries::new(rate, col.stroke_width(2)))
            .map_err(draw_err)?
            .label(format!("qp {q} rate"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
        c.draw_series(DashedLineSeries::new(target, 6, 4, col.stroke_width(1)))
            .map_err(draw_err)?;
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// 2. Goodput.
fn draw_goodput(area: &Panel<'_>, s: &Series<'_>, args: &PlotArgs) -> Result<(), String> {
    let gmax = s
        .total
        .iter()
        .map(|p| p.1)
        .fold(args.bottleneck_mbps.unwrap_or(1.0), f64::max)
        * 1.15;
    let mut c = ChartBuilder::on(area)
        .caption(
            format!(
                "goodput per QP and total (delivered bytes, {} ms windows)",
                args.window_ms
            ),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..s.tmax, 0.0..gmax)
        .map_err(draw_err)?;
    c.configure_mesh()
        .x_desc("time (s)")
        .y_desc("Mb/s")
        .draw()
        .map_err(draw_err)?;
    if let Some(b) = args.bottleneck_mbps {
        c.draw_series(LineSeries::new(
            [(0.0, b), (s.tmax, b)],
            RGBColor(150, 150, 150).stroke_width(1),
        ))
        .map_err(draw_err)?;
    }
    c.draw_series(LineSeries::new(
        s.total.iter().copied(),
        BLACK.stroke_width(2),
    ))
    .map_err(draw_err)?
    .label("total")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    for (q, g) in &s.goodputs {
        let col = colour(*q);
        c.draw_series(LineSeries::new(g.iter().copied(), col.stroke_width(2)))
            .map_err(draw_err)?
            .label(format!("qp {q}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// 3. α.
fn draw_alpha(area: &Panel<'_>, s: &Series<'_>) -> Result<(), String> {
    let mut c = ChartBuilder::on(area)
        .caption(
            if s.has_cc {
                "DCQCN α per QP"
            } else {
                "DCQCN off: no α"
            },
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..s.tmax, 0.0..1.05)
        .map_err(draw_err)?;
    c.configure_mesh()
        .x_desc("time (s)")
        .y_desc("α")
        .draw()
        .map_err(draw_err)?;
    for (&q, v) in &s.by_qp {
        let col = colour(q);
        let a: Vec<(f64, f64)> = v.iter().filter_map(|s| Some((s.t, s.alpha?))).collect();
        c.draw_series(LineSeries::new(a, col.stroke_width(2)))
            .map_err(draw_err)?;
    }
    Ok(())
}

/// `xrnic plot`.
pub fn run(args: &PlotArgs) -> ExitCode {
    let go = || -> Result<(), String> {
        let text = std::fs::read_to_string(&args.csv)
            .map_err(|e| format!("cannot read {}: {e}", args.csv.display()))?;
        let samples = parse_csv(&text).map_err(|e| format!("{}: {e}", args.csv.display()))?;
        draw(&samples, args, &args.output)
    };
    match go() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xrnic plot: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv(rows: &[&str]) -> String {
        let mut s = format!("{HEADER}\n");
        for r in rows {
            s.push_str(r);
            s.push('\n');
        }
        s
    }

    #[test]
    fn parses_rows_and_empty_dcqcn_columns() {
        let s = parse_csv(&csv(&[
            "0.0000,0,17,10000.000,10000.000,1.00000,0,0,0",
            "0.0500,1,18,,,,65536,3,0",
        ]))
        .unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].rate_mbps, Some(10000.0));
        assert_eq!(s[0].alpha, Some(1.0));
        assert_eq!(
            (s[1].qp, s[1].rate_mbps, s[1].delivered_bytes),
            (1, None, 65536)
        );
    }

    #[test]
    fn bad_csv_is_an_error_naming_the_line() {
        assert!(parse_csv("").unwrap_err().contains("empty"));
        assert!(parse_csv("a,b\n").unwrap_err().contains("line 1"));
        assert!(parse_csv(&csv(&[])).unwrap_err().contains("no samples"));
        let e = parse_csv(&csv(&["0.1,0,17,x,1,1,0,0,0"])).unwrap_err();
        assert!(e.contains("line 2") && e.contains("rate_mbps 'x'"), "{e}");
        let e = parse_csv(&csv(&["0.1,0,17"])).unwrap_err();
        assert!(e.contains("3 fields"), "{e}");
        let e = parse_csv(&csv(&["NaN,0,17,1,1,1,0,0,0"])).unwrap_err();
        assert!(e.contains("t_s"), "{e}");
        let e = parse_csv(&csv(&["0.1,-1,17,1,1,1,0,0,0"])).unwrap_err();
        assert!(e.contains("qp '-1'"), "{e}");
    }

    #[test]
    fn goodput_over_windows() {
        // 1 MB every 100 ms = 80 Mb/s; windows of 200 ms.
        let rows: Vec<Sample> = (0..=10)
            .map(|k| Sample {
                t: k as f64 * 0.1,
                qp: 0,
                rate_mbps: None,
                target_mbps: None,
                alpha: None,
                delivered_bytes: k * 1_000_000,
            })
            .collect();
        let refs: Vec<&Sample> = rows.iter().collect();
        let g = goodput(&refs, 0.2);
        assert_eq!(g.len(), 5);
        for (t, v) in g {
            assert!((v - 80.0).abs() < 1e-6, "{t}: {v}");
        }
    }

    #[test]
    fn draws_an_svg_with_every_qp() {
        let mut rows = vec![];
        for k in 0..40 {
            let t = k as f64 * 0.05;
            for q in 0..2 {
                rows.push(format!(
                    "{t:.4},{q},{},{:.3},{:.3},{:.5},{},0,{k}",
                    17 + q,
                    25.0 + q as f64,
                    30.0,
                    0.5,
                    k * 300_000
                ));
            }
        }
        let refs: Vec<&str> = rows.iter().map(String::as_str).collect();
        let samples = parse_csv(&csv(&refs)).unwrap();
        let dir = std::env::temp_dir().join(format!("xrnic-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("p.svg");
        let args = PlotArgs {
            csv: "unused".into(),
            output: out.clone(),
            title: "lab test".into(),
            bottleneck_mbps: Some(50.0),
            window_ms: 200,
        };
        draw(&samples, &args, &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..50.min(svg.len())]);
        for text in [
            "lab test",
            "qp 0 rate",
            "qp 1 rate",
            "bottleneck 50 Mb/s",
            "total",
        ] {
            assert!(svg.contains(text), "missing '{text}'");
        }
    }
}
