//! `--html FILE`: one self-contained page (no network: inline CSS and SVG)
//! with a run's tables — observations with units, throughput, gauges,
//! counters, per-pod routing — and its figures (CDFs of TTFT, TPOT and ITL;
//! the time series); or a sweep's summary table and, per headline metric,
//! its median against the grid axis with the seed range as a band.

use std::fmt::Write as _;

use crate::metrics::{Obs, Report};

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}\
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.2em .7em;text-align:right;border-bottom:1px solid #eee}\
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}.fig{display:inline-block;width:49%;vertical-align:top}.fig svg{width:100%;height:auto}\
.note{color:#666;font-size:.9em}";

/// Escapes text for HTML.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Four significant digits, in plain notation.
fn fmt(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(x) if x == 0.0 || !x.is_finite() => format!("{x}"),
        Some(x) => {
            let mag = x.abs().log10().floor() as i32;
            let decimals = (3 - mag).clamp(0, 12) as usize;
            format!("{x:.decimals$}")
        }
    }
}

/// A page: head, the sections, figures as inline SVG.
pub fn page(title: &str, sections: &[String]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body>\n<h1>{}</h1>\n",
        escape(title),
        escape(title)
    );
    for s in sections {
        out.push_str(s);
        out.push('\n');
    }
    out.push_str("</body></html>\n");
    out
}

/// A table from a header and rows of cells (already escaped).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::from("<table><tr>");
    for h in header {
        let _ = write!(out, "<th>{}</th>", escape(h));
    }
    out.push_str("</tr>");
    for row in rows {
        out.push_str("<tr>");
        for c in row {
            let _ = write!(out, "<td>{c}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

/// A figure: its SVG inline.
pub fn figure(svg: &str) -> String {
    // Drop the XML declaration, if any: the SVG is inline.
    let svg = svg.trim_start();
    let svg = match svg.strip_prefix("<?xml") {
        Some(rest) => rest.split_once("?>").map_or(svg, |(_, r)| r),
        None => svg,
    };
    format!("<div class=\"fig\">{svg}</div>")
}

/// The sections of one run's page (before its figures).
pub fn run_sections(report: &Report) -> Vec<String> {
    let mut out = Vec::new();
    out.push(format!(
        "<p>Scenario <b>{}</b>, seed {}, horizon {} s, warm-up {} s; {} ticks, {} engine steps.</p>",
        escape(&report.scenario),
        report.seed,
        report.horizon,
        report.warmup,
        report.ticks,
        report.steps
    ));
    if let Some(t) = &report.trace {
        out.push(format!(
            "<p class=\"note\">{}</p>",
            escape(t.to_text().trim())
        ));
    }
    let rows: Vec<Vec<String>> = Obs::ALL
        .iter()
        .map(|&o| {
            let s = &report.observations[o.name()];
            let flag = o.is_flag();
            let p = |v: Option<f64>| if flag { "".to_string() } else { fmt(v) };
            vec![
                o.name().to_string(),
                o.unit().to_string(),
                s.count.to_string(),
                fmt(s.mean),
                p(s.p50),
                p(s.p90),
                p(s.p99),
                p(s.p999),
            ]
        })
        .collect();
    out.push("<h2>Observations</h2>".into());
    out.push(table(
        &[
            "observation",
            "unit",
            "count",
            "mean",
            "p50",
            "p90",
            "p99",
            "p99.9",
        ],
        &rows,
    ));
    out.push(
        "<p class=\"note\">Requests that reached the gateway after the warm-up and finished by the horizon \
         (docs/model.md). Percentiles are within 0.05 % of the exact ones.</p>"
            .into(),
    );
    let t = &report.throughput;
    let mut rows = vec![
        vec!["duration".into(), format!("{} s", t.duration)],
        vec!["completed requests".into(), t.completed.to_string()],
        vec!["requests / s".into(), fmt(Some(t.requests_per_s))],
        vec!["input tokens / s".into(), fmt(Some(t.input_tokens_per_s))],
        vec!["output tokens / s".into(), fmt(Some(t.output_tokens_per_s))],
    ];
    if let (Some(g), Some(r)) = (t.good_requests, t.goodput_per_s) {
        rows.push(vec!["requests within every SLO".into(), g.to_string()]);
        rows.push(vec!["goodput (requests / s)".into(), fmt(Some(r))]);
    }
    out.push("<h2>Throughput over [warm-up, horizon]</h2>".into());
    out.push(table(&["", "value"], &rows));
    let rows: Vec<Vec<String>> = report
        .gauges
        .iter()
        .map(|(k, v)| vec![escape(k), fmt(Some(*v))])
        .collect();
    out.push("<h2>Gauges (time averages over [warm-up, horizon])</h2>".into());
    out.push(table(&["gauge", "value"], &rows));
    let rows: Vec<Vec<String>> = report
        .counters
        .iter()
        .map(|(k, v)| vec![escape(k), v.to_string()])
        .collect();
    out.push("<h2>Counters (whole run)</h2>".into());
    out.push(table(&["counter", "value"], &rows));
    out
}
