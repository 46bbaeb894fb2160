//! A small line-chart helper for the HTML report: linear axes with round ticks, one
//! polyline with dots per series, optional categorical x labels, highlighted points (the
//! knee) and horizontal reference lines (targets). Output is inline SVG for HTML5 (no
//! `xmlns`, no scripts, no external references); each dot has a `<title>` tooltip.

use std::fmt::Write as _;

const W: f64 = 640.0;
const H: f64 = 300.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 46.0;

/// Series colours, in order (colour-blind-safe Okabe–Ito).
pub const PALETTE: [&str; 6] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9",
];

#[derive(Debug, Clone, Default)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Shown beside each point when given (same order as `points`).
    pub labels: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Mark {
    pub x: f64,
    pub y: f64,
    pub label: String,
}

#[derive(Debug, Clone, Default)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub marks: Vec<Mark>,
    /// Horizontal reference lines: (y, label).
    pub hlines: Vec<(f64, String)>,
    /// When set, x values are indices into these labels.
    pub x_categories: Option<Vec<String>>,
}

/// Text for HTML and SVG. Slashes become `&#47;` too: a URL shown as text (the target)
/// then never reads as a link or a fetchable reference to tools that scan the page.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('/', "&#47;")
}

/// Round tick positions covering `[lo, hi]`, about five of them.
pub fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).abs().max(1e-9);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    (0..=12)
        .map(|k| first + k as f64 * step)
        .take_while(|t| *t <= hi + step * 1e-6)
        .collect()
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

impl Chart {
    fn bounds(&self) -> Option<(f64, f64, f64, f64)> {
        let pts = self.series.iter().flat_map(|s| s.points.iter().copied());
        let pts = pts.chain(self.marks.iter().map(|m| (m.x, m.y)));
        let pts: Vec<(f64, f64)> = pts
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        if pts.is_empty() {
            return None;
        }
        let fold = |f: fn(f64, f64) -> f64, init: f64, sel: fn(&(f64, f64)) -> f64| {
            pts.iter().map(sel).fold(init, f)
        };
        let (mut x0, mut x1) = (
            fold(f64::min, f64::INFINITY, |p| p.0),
            fold(f64::max, f64::NEG_INFINITY, |p| p.0),
        );
        let mut y1 = fold(f64::max, f64::NEG_INFINITY, |p| p.1);
        for (y, _) in &self.hlines {
            y1 = y1.max(*y);
        }
        if let Some(c) = &self.x_categories {
            (x0, x1) = (-0.5, c.len() as f64 - 0.5);
        } else if x1 - x0 < 1e-9 {
            (x0, x1) = (x0 - 1.0, x1 + 1.0);
        } else {
            x0 = x0.min(0.0);
        }
        let y1 = if y1 <= 0.0 { 1.0 } else { y1 * 1.1 };
        Some((x0, x1, 0.0, y1))
    }

    /// The chart as an `<svg>` element.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = write!(
            o,
            r#"<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{}">"#,
            escape(&self.title)
        );
        let _ = write!(
            o,
            r#"<text x="{}" y="18" class="title">{}</text>"#,
            W / 2.0,
            escape(&self.title)
        );
        let Some((x0, x1, y0, y1)) = self.bounds() else {
            let _ = write!(
                o,
                r#"<text x="{}" y="{}" class="empty">no data</text></svg>"#,
                W / 2.0,
                H / 2.0
            );
            return o;
        };
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let sx = |x: f64| LEFT + (x - x0) / (x1 - x0) * pw;
        let sy = |y: f64| TOP + ph - (y - y0) / (y1 - y0) * ph;
        let _ = write!(
            o,
            r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" class="plot"/>"#
        );
        for t in ticks(y0, y1) {
            let y = sy(t);
            let _ = write!(
                o,
                r#"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" class="grid"/><text x="{}" y="{:.1}" class="ytick">{}</text>"#,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                fmt_tick(t)
            );
        }
        let xt: Vec<(f64, String)> = match &self.x_categories {
            Some(c) => c
                .iter()
                .enumerate()
                .map(|(i, l)| (i as f64, l.clone()))
                .collect(),
            None => ticks(x0, x1)
                .into_iter()
                .map(|t| (t, fmt_tick(t)))
                .collect(),
        };
        for (t, label) in xt {
            let _ = write!(
                o,
                r#"<text x="{:.1}" y="{}" class="xtick">{}</text>"#,
                sx(t),
                TOP + ph + 16.0,
                escape(&label)
            );
        }
        let _ = write!(
            o,
            r#"<text x="{}" y="{}" class="xlabel">{}</text>"#,
            LEFT + pw / 2.0,
            H - 8.0,
            escape(&self.x_label)
        );
        let _ = write!(
            o,
            r#"<text x="14" y="{0}" class="ylabel" transform="rotate(-90 14 {0})">{1}</text>"#,
            TOP + ph / 2.0,
            escape(&self.y_label)
        );
        for (y, label) in &self.hlines {
            let (x2, yy, label) = (LEFT + pw, sy(*y), escape(label));
            let _ = write!(
                o,
                r#"<line x1="{LEFT}" x2="{x2}" y1="{yy:.1}" y2="{yy:.1}" class="target"/><text x="{:.1}" y="{:.1}" class="tlabel">{label}</text>"#,
                x2 - 4.0,
                yy - 4.0,
            );
        }
        for (k, s) in self.series.iter().enumerate() {
            let color = PALETTE[k % PALETTE.len()];
            let pts: Vec<String> = s
                .points
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
                .collect();
            let _ = write!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
                pts.join(" ")
            );
            for (i, (x, y)) in s.points.iter().enumerate() {
                if !(x.is_finite() && y.is_finite()) {
                    continue;
                }
                let label = s.labels.get(i).map(|l| escape(l));
                let _ = write!(
                    o,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"><title>{}{}: {}, {}</title></circle>"#,
                    sx(*x),
                    sy(*y),
                    escape(&s.name),
                    label
                        .as_deref()
                        .map(|l| format!(" {l}"))
                        .unwrap_or_default(),
                    fmt_tick(*x),
                    fmt_tick(*y)
                );
                if let Some(l) = label {
                    // Below the point; near the right edge, below and to its left.
                    let (px, anchor) = if sx(*x) > LEFT + 0.85 * pw {
                        (sx(*x) - 5.0, "end")
                    } else {
                        (sx(*x) + 5.0, "start")
                    };
                    let py = sy(*y) + 14.0;
                    let _ = write!(
                        o,
                        r#"<text x="{px:.1}" y="{py:.1}" class="plabel" text-anchor="{anchor}">{l}</text>"#
                    );
                }
            }
            let (lx, ly) = (
                LEFT + 8.0 + 130.0 * (k % 4) as f64,
                TOP + 14.0 + 14.0 * (k / 4) as f64,
            );
            let _ = write!(
                o,
                r#"<rect x="{lx}" y="{}" width="10" height="10" fill="{color}"/><text x="{}" y="{ly}" class="legend">{}</text>"#,
                ly - 9.0,
                lx + 14.0,
                escape(&s.name)
            );
        }
        for m in &self.marks {
            let (x, y) = (sx(m.x), sy(m.y));
            // Near the right edge the label goes to the left of the point.
            let (lx, anchor) = if x > LEFT + 0.75 * pw {
                (x - 10.0, "end")
            } else {
                (x + 10.0, "start")
            };
            let _ = write!(
                o,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="8" class="mark"/><text x="{lx:.1}" y="{:.1}" class="mlabel" text-anchor="{anchor}">{}</text>"#,
                y - 10.0,
                escape(&m.label)
            );
        }
        o.push_str("</svg>");
        o
    }
}

/// The CSS the charts use (inlined once per page).
pub const STYLE: &str = ".chart{font:11px sans-serif;background:#fff;margin:4px}\
.chart .title{font-size:13px;font-weight:bold;text-anchor:middle}\
.chart .plot{fill:#fafafa;stroke:#999}.chart .grid{stroke:#e3e3e3}\
.chart .ytick{text-anchor:end}.chart .xtick,.chart .xlabel,.chart .ylabel,.chart .empty{text-anchor:middle}\
.chart .target{stroke:#c00;stroke-dasharray:5 4}.chart .tlabel{fill:#c00;text-anchor:end}\
.chart .mark{fill:none;stroke:#c00;stroke-width:2.5}.chart .mlabel{fill:#c00;font-weight:bold;font-size:13px}.chart .plabel{fill:#555;font-size:10px}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(ticks(0.0, 10.0), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(0.0, 1.0).len(), 6);
        assert_eq!(ticks(0.0, 730.0), [0.0, 200.0, 400.0, 600.0]);
    }

    #[test]
    fn renders_self_contained_svg() {
        let chart = Chart {
            title: "a <b>".into(),
            series: vec![Series {
                name: "p95".into(),
                points: vec![(1.0, 2.0), (2.0, 4.0), (3.0, f64::NAN)],
                labels: vec!["c=1".into()],
            }],
            marks: vec![Mark {
                x: 2.0,
                y: 4.0,
                label: "knee".into(),
            }],
            hlines: vec![(3.0, "target".into())],
            ..Chart::default()
        };
        let svg = chart.render();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(
            svg.contains("a &lt;b&gt;") && svg.contains("knee") && svg.contains("class=\"target\"")
        );
        assert!(!svg.contains("http") && !svg.contains("NaN"));
        assert!(Chart::default().render().contains("no data"));
    }
}
