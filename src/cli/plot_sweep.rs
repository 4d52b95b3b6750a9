//! `xrnic plot-sweep CSV -o OUT.svg`: bandwidth against message size, one line per
//! (stack, test), as `make bench-rxe` measures it (stock perftest `-a` over rxe0 and over
//! xrnic in the same guests, docs/interop.md), drawn with plotters' SVG backend.
//!
//! Contract:
//! - Input: a CSV with the header `stack,test,bytes,gbps` (`interop/bench-rxe.sh` writes
//!   it: the best round per size). Anything else is a clear error naming the line, exit
//!   status 1; nothing panics on bad input.
//! - Output: Gb/s (linear) against message size in bytes (log 2), one coloured line per
//!   test, solid for the first stack named in the file and dashed for the others, with a
//!   legend.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use plotters::prelude::*;

pub const HEADER: &str = "stack,test,bytes,gbps";

#[derive(Clone, Debug, clap::Args)]
pub struct PlotSweepArgs {
    /// The CSV (header `stack,test,bytes,gbps`).
    pub csv: PathBuf,
    /// The SVG to write.
    #[arg(short, long, value_name = "OUT.svg")]
    pub output: PathBuf,
    /// Title of the chart.
    #[arg(long, default_value = "bandwidth against message size")]
    pub title: String,
}

/// One measured point.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub stack: String,
    pub test: String,
    pub bytes: u64,
    pub gbps: f64,
}

/// Parse the CSV.
pub fn parse_csv(text: &str) -> Result<Vec<Point>, String> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, h)) if h.trim() == HEADER => {}
        Some((_, h)) => {
            return Err(format!(
                "line 1 is not the header ('{h}', expected '{HEADER}')"
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
        if f.len() != 4 {
            return Err(format!("line {n}: {} fields, expected 4", f.len()));
        }
        if f[0].is_empty() || f[1].is_empty() {
            return Err(format!("line {n}: empty stack or test name"));
        }
        let bytes = f[2]
            .parse::<u64>()
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| format!("line {n}: bytes '{}' is not a positive count", f[2]))?;
        let gbps = f[3]
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("line {n}: gbps '{}' is not a number >= 0", f[3]))?;
        out.push(Point {
            stack: f[0].to_string(),
            test: f[1].to_string(),
            bytes,
            gbps,
        });
    }
    if out.is_empty() {
        return Err("no points".into());
    }
    Ok(out)
}

fn colour(i: usize) -> RGBColor {
    const C: [RGBColor; 4] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
    ];
    C[i % C.len()]
}

/// Draw `points` into an SVG at `out`.
pub fn draw(points: &[Point], title: &str, out: &Path) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    // Stacks and tests in the order of their first appearance.
    let mut stacks: Vec<&str> = Vec::new();
    let mut tests: Vec<&str> = Vec::new();
    let mut series: BTreeMap<(usize, usize), Vec<(f64, f64)>> = BTreeMap::new();
    for p in points {
        let s = match stacks.iter().position(|&x| x == p.stack) {
            Some(k) => k,
            None => {
                stacks.push(&p.stack);
                stacks.len() - 1
            }
        };
        let t = match tests.iter().position(|&x| x == p.test) {
            Some(k) => k,
            None => {
                tests.push(&p.test);
                tests.len() - 1
            }
        };
        series
            .entry((s, t))
            .or_default()
            .push((p.bytes as f64, p.gbps));
    }
    let xmin = points.iter().map(|p| p.bytes).min().unwrap_or(1) as f64;
    let xmax = (points.iter().map(|p| p.bytes).max().unwrap_or(2) as f64).max(xmin * 2.0);
    let ymax = points.iter().map(|p| p.gbps).fold(0.0, f64::max).max(1e-3) * 1.1;

    let root = SVGBackend::new(out, (1000, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut c = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((xmin..xmax).log_scale().base(2.0), 0.0..ymax)
        .map_err(|x| e(&x))?;
    c.configure_mesh()
        .x_desc("message size (bytes, log 2)")
        .y_desc("Gb/s")
        .x_label_formatter(&|v| {
            let b = v.round() as u64;
            match b {
                b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
                b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
                b => b.to_string(),
            }
        })
        .draw()
        .map_err(|x| e(&x))?;
    for ((s, t), mut v) in series {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        let col = colour(t);
        let label = format!("{} {}", stacks[s], tests[t]);
        let style = col.stroke_width(2);
        if s == 0 {
            c.draw_series(LineSeries::new(v.clone(), style))
                .map_err(|x| e(&x))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        } else {
            c.draw_series(DashedLineSeries::new(v.clone(), 8, 5, style))
                .map_err(|x| e(&x))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 8, y)], style));
        }
        c.draw_series(v.iter().map(|&p| Circle::new(p, 3, col.filled())))
            .map_err(|x| e(&x))?;
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// `xrnic plot-sweep`.
pub fn run(args: &PlotSweepArgs) -> ExitCode {
    let go = || -> Result<(), String> {
        let text = std::fs::read_to_string(&args.csv)
            .map_err(|e| format!("cannot read {}: {e}", args.csv.display()))?;
        let points = parse_csv(&text).map_err(|e| format!("{}: {e}", args.csv.display()))?;
        draw(&points, &args.title, &args.output)
    };
    match go() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xrnic plot-sweep: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_points() {
        let p = parse_csv(&format!(
            "{HEADER}\nrxe,write,2,0.01\n\nxrnic,write,65536,1.5\n"
        ))
        .unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(
            p[1],
            Point {
                stack: "xrnic".into(),
                test: "write".into(),
                bytes: 65536,
                gbps: 1.5
            }
        );
    }

    #[test]
    fn bad_csv_is_an_error_naming_the_line() {
        assert!(parse_csv("").unwrap_err().contains("empty"));
        assert!(parse_csv("a,b\n").unwrap_err().contains("line 1"));
        assert!(
            parse_csv(&format!("{HEADER}\n"))
                .unwrap_err()
                .contains("no points")
        );
        let e = parse_csv(&format!("{HEADER}\nrxe,write,0,1\n")).unwrap_err();
        assert!(e.contains("line 2") && e.contains("bytes '0'"), "{e}");
        let e = parse_csv(&format!("{HEADER}\nrxe,write,2,NaN\n")).unwrap_err();
        assert!(e.contains("gbps 'NaN'"), "{e}");
        let e = parse_csv(&format!("{HEADER}\nrxe,write,2\n")).unwrap_err();
        assert!(e.contains("3 fields"), "{e}");
        let e = parse_csv(&format!("{HEADER}\n,write,2,1\n")).unwrap_err();
        assert!(e.contains("empty stack"), "{e}");
    }

    #[test]
    fn draws_an_svg_with_a_line_per_stack_and_test() {
        let mut csv = format!("{HEADER}\n");
        for (s, f) in [("rxe", 1.0), ("xrnic", 2.5)] {
            for (t, g) in [("write", 1.0), ("read", 0.7)] {
                for k in 1..=16 {
                    csv.push_str(&format!("{s},{t},{},{:.3}\n", 1u64 << k, f * g * k as f64));
                }
            }
        }
        let points = parse_csv(&csv).unwrap();
        let dir = std::env::temp_dir().join(format!("xrnic-plot-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("s.svg");
        draw(&points, "sweep test", &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        for label in [
            "sweep test",
            "rxe write",
            "rxe read",
            "xrnic write",
            "xrnic read",
        ] {
            assert!(svg.contains(label), "no '{label}' in the SVG");
        }
        // 4 series x 16 points, each a marker.
        assert!(svg.matches("<circle").count() >= 64);
    }
}
