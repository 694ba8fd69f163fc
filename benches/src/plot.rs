//! `bcl-bench plot a.json b.txt ... -o busbw.svg`: bus bandwidth and latency against message
//! size, one line per series, log-scaled sizes, as a standalone SVG.
//!
//! Inputs: `bcl-bench --json` files (one series per file and placement: out-of-place, and
//! in-place when present), and the baseline harnesses' text output
//! (`../shared/tools/baselines/`: a `# label=NAME ranks=N ...` header, then rows
//! `size_B count iters median_us min_us mean_us p90_us algbw busbw ok`), so BCL, OpenMPI and
//! Gloo can share a chart.

use serde::Deserialize;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// One line of the chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    /// (bytes, time µs, busbw GB/s), sorted by size.
    pub points: Vec<(f64, f64, f64)>,
}

#[derive(Deserialize)]
struct JsonRow {
    collective: String,
    nranks: usize,
    size_bytes: usize,
    in_place: bool,
    time_us: f64,
    busbw_gbs: f64,
    /// Rows of `bcl-sim`.
    #[serde(default)]
    simulated: bool,
}

/// Read one input file into its series (a file may hold several).
pub fn read(path: &Path) -> Result<Vec<Series>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let stem = path
        .file_stem()
        .map_or_else(|| "series".into(), |s| s.to_string_lossy().into_owned());
    let series = if text.trim_start().starts_with('{') {
        from_json(&text, &stem).map_err(|e| format!("{}: {e}", path.display()))?
    } else {
        from_harness(&text, &stem)
    };
    if series.iter().all(|s| s.points.is_empty()) {
        return Err(format!("{}: no measurements found", path.display()));
    }
    Ok(series)
}

fn from_json(text: &str, stem: &str) -> Result<Vec<Series>, String> {
    let mut out: Vec<Series> = Vec::new();
    for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let row: JsonRow =
            serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        let label = format!(
            "{stem} ({} {} ranks{}{})",
            row.collective,
            row.nranks,
            if row.in_place { ", in place" } else { "" },
            if row.simulated { ", simulated" } else { "" }
        );
        let point = (row.size_bytes as f64, row.time_us, row.busbw_gbs);
        match out.iter_mut().find(|s| s.label == label) {
            Some(s) => s.points.push(point),
            None => out.push(Series {
                label,
                points: vec![point],
            }),
        }
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Ok(out)
}

fn from_harness(text: &str, stem: &str) -> Vec<Series> {
    let mut label = stem.to_string();
    let mut points = Vec::new();
    for line in text.lines() {
        if let Some(header) = line.strip_prefix("# label=") {
            let mut words = header.split_whitespace();
            let name = words.next().unwrap_or(stem);
            let ranks = words.find_map(|w| w.strip_prefix("ranks=")).unwrap_or("?");
            label = format!("{name} ({ranks} ranks)");
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 9 {
            continue;
        }
        if let (Ok(size), Ok(median), Ok(busbw)) = (
            f[0].parse::<f64>(),
            f[3].parse::<f64>(),
            f[8].parse::<f64>(),
        ) {
            points.push((size, median, busbw));
        }
    }
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    vec![Series { label, points }]
}

const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn size_label(bytes: f64) -> String {
    let b = bytes as u64;
    match b {
        b if b >= 1 << 30 => format!("{}G", b >> 30),
        b if b >= 1 << 20 => format!("{}M", b >> 20),
        b if b >= 1 << 10 => format!("{}K", b >> 10),
        b => format!("{b}"),
    }
}

/// One panel: y against log2(size); `log_y` for latency.
fn panel(
    svg: &mut String,
    series: &[Series],
    x0: f64,
    title: &str,
    y_of: fn(&(f64, f64, f64)) -> f64,
    log_y: bool,
) {
    let (w, h, left, top) = (460.0, 300.0, x0 + 60.0, 50.0);
    let pts = series.iter().flat_map(|s| s.points.iter());
    let xs: Vec<f64> = pts.clone().map(|p| p.0.max(1.0).log2()).collect();
    let ys: Vec<f64> = pts
        .map(y_of)
        .filter(|y| y.is_finite() && *y > 0.0)
        .collect();
    let (xmin, xmax) = (
        xs.iter().copied().fold(f64::MAX, f64::min),
        xs.iter().copied().fold(f64::MIN, f64::max),
    );
    let tf = |y: f64| if log_y { y.max(1e-9).log10() } else { y };
    let ymax_raw = ys.iter().copied().fold(0.0, f64::max);
    let (ymin, ymax) = if log_y {
        let lo = ys
            .iter()
            .copied()
            .fold(f64::MAX, f64::min)
            .max(1e-3)
            .log10()
            .floor();
        (lo, ymax_raw.max(1e-3).log10().ceil().max(lo + 1.0))
    } else {
        (0.0, (ymax_raw * 1.1).max(1e-3))
    };
    let xspan = (xmax - xmin).max(1.0);
    let px = |x: f64| left + (x - xmin) / xspan * w;
    let py = |y: f64| top + h - (tf(y) - ymin) / (ymax - ymin) * h;
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="30" font-size="15" font-weight="bold">{title}</text>"#,
        left
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#444"/>"##
    );
    // x ticks at powers of 4
    let mut t = xmin.ceil();
    while t <= xmax {
        if (t as i64) % 2 == 0 {
            let x = px(t);
            let _ = writeln!(
                svg,
                r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" font-size="10" text-anchor="middle">{}</text>"##,
                top + h,
                top + h + 14.0,
                size_label(2f64.powf(t))
            );
        }
        t += 1.0;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">message size (bytes)</text>"#,
        left + w / 2.0,
        top + h + 32.0
    );
    for i in 0..=5 {
        let v = ymin + (ymax - ymin) * f64::from(i) / 5.0;
        let value = if log_y { 10f64.powf(v) } else { v };
        let y = top + h - h * f64::from(i) / 5.0;
        let text = if log_y {
            format!("{value:.0}")
        } else {
            format!("{value:.2}")
        };
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" font-size="10" text-anchor="end">{text}</text>"##,
            left + w,
            left - 5.0,
            y + 3.0
        );
    }
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = s
            .points
            .iter()
            .filter(|p| y_of(p) > 0.0 || !log_y)
            .map(|p| format!("{:.1},{:.1}", px(p.0.max(1.0).log2()), py(y_of(p))))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for p in &path {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                svg,
                r#"<circle cx="{x}" cy="{y}" r="2.5" fill="{colour}"/>"#
            );
        }
    }
}

/// The chart of `series` as an SVG document.
pub fn svg(series: &[Series], title: &str) -> String {
    let legend_h = 18.0 * series.len() as f64;
    let height = 420.0 + legend_h;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="1100" height="{height}" font-family="sans-serif">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    panel(
        &mut svg,
        series,
        0.0,
        &format!("{title}: bus bandwidth (GB/s)"),
        |p| p.2,
        false,
    );
    panel(
        &mut svg,
        series,
        550.0,
        &format!("{title}: time (µs, log)"),
        |p| p.1,
        true,
    );
    for (i, s) in series.iter().enumerate() {
        let y = 410.0 + 18.0 * i as f64;
        let colour = COLOURS[i % COLOURS.len()];
        let label = s.label.replace('&', "&amp;").replace('<', "&lt;");
        let _ = writeln!(
            svg,
            r#"<line x1="60" y1="{y}" x2="90" y2="{y}" stroke="{colour}" stroke-width="3"/><text x="96" y="{}" font-size="12">{label}</text>"#,
            y + 4.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// `bcl-bench plot FILES... -o OUT [--title T]`.
pub fn main(args: &[String]) -> Result<(), String> {
    let mut files: Vec<PathBuf> = Vec::new();
    let mut out: Option<PathBuf> = None;
    let mut title = "allreduce".to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" | "--output" => out = it.next().map(PathBuf::from),
            "--title" => title = it.next().cloned().unwrap_or(title),
            "-h" | "--help" => {
                return Err("usage: bcl-bench plot FILE... -o OUT.svg [--title TEXT]\n  FILE: bcl-bench --json output, or a baseline harness's text output".into());
            }
            f => files.push(f.into()),
        }
    }
    let out = out.ok_or("plot: -o OUT.svg is required")?;
    if files.is_empty() {
        return Err("plot: give at least one input file".into());
    }
    let mut series = Vec::new();
    for f in &files {
        series.extend(read(f)?);
    }
    std::fs::write(&out, svg(&series, &title)).map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!("wrote {} ({} series)", out.display(), series.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_rows_and_harness_text_become_series() {
        let json = r#"{"collective":"allreduce","nranks":2,"devices":"cpu","transport":"auto","size_bytes":1024,"count":256,"dtype":"float","redop":"sum","root":-1,"in_place":false,"time_us":20.0,"algbw_gbs":0.05,"busbw_gbs":0.05,"wrong":0}
{"collective":"allreduce","nranks":2,"devices":"cpu","transport":"auto","size_bytes":8,"count":2,"dtype":"float","redop":"sum","root":-1,"in_place":false,"time_us":15.0,"algbw_gbs":0.0,"busbw_gbs":0.0,"wrong":0}
{"collective":"allreduce","nranks":2,"devices":"cpu","transport":"auto","size_bytes":8,"count":2,"dtype":"float","redop":"sum","root":-1,"in_place":true,"time_us":14.0,"algbw_gbs":0.0,"busbw_gbs":0.0,"wrong":0}"#;
        let s = from_json(json, "bcl").expect("json");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].label, "bcl (allreduce 2 ranks)");
        assert_eq!(s[0].points, vec![(8.0, 15.0, 0.0), (1024.0, 20.0, 0.05)]);
        let text = "# label=mpi-tcp ranks=2 iters=auto\n# size_B count iters median_us ...\n8 2 1000 10.5 9.0 11.0 12.0 0.00 0.00 ok\n1048576 262144 100 900.0 850.0 910.0 990.0 1.16 1.16 ok\n";
        let h = from_harness(text, "file");
        assert_eq!(h[0].label, "mpi-tcp (2 ranks)");
        assert_eq!(h[0].points[1], (1048576.0, 900.0, 1.16));
        let doc = svg(&[s[0].clone(), h[0].clone()], "allreduce");
        assert!(
            doc.starts_with("<svg")
                && doc.contains("mpi-tcp (2 ranks)")
                && doc.contains("<polyline")
        );
    }
}
