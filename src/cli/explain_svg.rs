//! `xrnic explain --svg`: the ladders of [`super::explain`] as an SVG sequence diagram.
//!
//! Contract: [`render`] returns a standalone SVG 1.1 document (hand-written text, no
//! dependency: the drawing is two lifelines per QP pair and one arrow per ladder step).
//! Request arrows are blue, responses and ACKs green, NAKs and RNR NAKs orange,
//! retransmissions red, CNPs purple, collapsed runs grey and dashed (SVG 1.1 only, so the
//! arrow heads are grey for all). All text is XML-escaped.

use std::fmt::Write as _;

use super::explain::{Ladder, StepKind};

const W: f64 = 900.0;
const LEFT_X: f64 = 250.0;
const RIGHT_X: f64 = 650.0;
const ROW: f64 = 22.0;

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            c => o.push(c),
        }
    }
    o
}

fn colour(k: StepKind) -> &'static str {
    match k {
        StepKind::Request => "#1f5fbf",
        StepKind::Response | StepKind::Ack => "#2e8b3e",
        StepKind::Nak | StepKind::RnrNak => "#d9822b",
        StepKind::Retransmission => "#c62828",
        StepKind::Cnp => "#7b3fa0",
        StepKind::Cm => "#00838f",
        StepKind::Collapsed | StepKind::Other => "#777777",
    }
}

/// The SVG document.
pub fn render(ladders: &[Ladder]) -> String {
    let rows: usize = ladders.iter().map(|l| l.steps.len() + 4).sum();
    let h = 20.0 + rows as f64 * ROW;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(
        o,
        r##"<defs><marker id="arr" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#444"/></marker></defs>"##
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let mut y = 20.0;
    for l in ladders {
        let top = y;
        let _ = writeln!(
            o,
            r#"<text x="{LEFT_X}" y="{y}" text-anchor="middle" font-weight="bold">{}</text><text x="{RIGHT_X}" y="{y}" text-anchor="middle" font-weight="bold">{}</text>"#,
            esc(&l.left),
            esc(&l.right)
        );
        y += ROW;
        let bottom = y + l.steps.len() as f64 * ROW;
        for x in [LEFT_X, RIGHT_X] {
            let _ = writeln!(
                o,
                r##"<line x1="{x}" y1="{}" x2="{x}" y2="{bottom}" stroke="#444" stroke-width="1"/>"##,
                top + 6.0
            );
        }
        for s in &l.steps {
            let (x1, x2) = if s.from_left {
                (LEFT_X, RIGHT_X)
            } else {
                (RIGHT_X, LEFT_X)
            };
            let c = colour(s.kind);
            let dash = if s.kind == StepKind::Collapsed {
                r#" stroke-dasharray="4 3""#
            } else {
                ""
            };
            let _ = writeln!(
                o,
                r#"<line x1="{x1}" y1="{y}" x2="{x2}" y2="{}" stroke="{c}" stroke-width="1.5"{dash} marker-end="url(#arr)"/>"#,
                y + ROW * 0.6
            );
            let _ = writeln!(
                o,
                r#"<text x="{}" y="{}" text-anchor="middle" fill="{c}">{}</text>"#,
                (LEFT_X + RIGHT_X) / 2.0,
                y - 2.0,
                esc(&s.label)
            );
            let _ = writeln!(
                o,
                r##"<text x="{}" y="{}" text-anchor="end" fill="#555">{:.3} µs</text>"##,
                LEFT_X - 8.0,
                y + 4.0,
                s.time_us
            );
            if !s.notes.is_empty() {
                let _ = writeln!(
                    o,
                    r#"<text x="{}" y="{}" fill="{c}">{}</text>"#,
                    RIGHT_X + 8.0,
                    y + 4.0,
                    esc(&s.notes.join("; "))
                );
            }
            y += ROW;
        }
        let m = &l.summary;
        y += ROW;
        let _ = writeln!(
            o,
            r#"<text x="10" y="{y}">{} packets, {} messages, {} retransmitted, {} NAKs, {} RNR NAKs, {} CNPs</text>"#,
            m.roce_packets, m.messages, m.retransmitted_packets, m.naks, m.rnr_naks, m.cnps
        );
        y += ROW * 2.0;
    }
    o.push_str("</svg>\n");
    o
}
