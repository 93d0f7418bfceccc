//! A sweep's figures: CDFs of TTFT, TPOT, ITL and end-to-end latency per point, pooled over
//! its seeds from the histograms kept beside every run.

use std::fmt::Write as _;
use std::path::Path;

use crate::error::{Error, Result};
use crate::experiment::outdir::{RunDistributions, dist_path};
use crate::experiment::plan::{Manifest, short_names};
use crate::experiment::summary::{METRICS, PointSummary, sig};
use crate::metrics::figures::{Curve, band_svg_text, cdf_svg, cdf_svg_text};
use crate::metrics::formats::html;
use crate::metrics::write_atomic;

/// The pooled CDF curves of every point: one list per distribution of
/// [`RunDistributions::named`], one curve per point.
fn pooled_curves(out: &Path, manifest: &Manifest) -> Result<[Vec<Curve>; 4]> {
    let short = short_names(&manifest.grid);
    let mut curves: [Vec<Curve>; 4] = Default::default();
    for p in &manifest.points() {
        let mut pooled = RunDistributions::default();
        for &seed in &manifest.seeds {
            let path = dist_path(out, p, seed);
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let d: RunDistributions = serde_json::from_str(&text)
                .map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
            pooled.add(&d);
        }
        let mut label = format!("p{:03}", p.index);
        for (s, v) in short.iter().zip(&p.values) {
            let _ = write!(label, " {s}={v}");
        }
        for (c, (_, _, h)) in curves.iter_mut().zip(pooled.named()) {
            c.push((label.clone(), h.cdf()));
        }
    }
    Ok(curves)
}

fn cdf_title(manifest: &Manifest, title: &str) -> String {
    format!(
        "{}: {title} CDF per point ({} seeds pooled)",
        manifest.name,
        manifest.seeds.len()
    )
}

/// A sweep's CDF figures (`cdf_ttft.svg`, `cdf_tpot.svg`, `cdf_itl.svg`,
/// `cdf_e2e.svg`): per point, pooled over its seeds.
pub fn sweep_plots(out: &Path, manifest: &Manifest) -> Result<()> {
    let curves = pooled_curves(out, manifest)?;
    let dir = out.join("plots");
    for (c, (name, title, _)) in curves.iter().zip(RunDistributions::default().named()) {
        cdf_svg(
            &dir.join(format!("cdf_{name}.svg")),
            &cdf_title(manifest, title),
            c,
        )?;
    }
    Ok(())
}

/// `pdsim sweep --html`: OUT/summary.html — the summary table, each
/// headline metric's median against the points with its seed range as a
/// band, and the pooled CDFs.
pub fn sweep_page(out: &Path, manifest: &Manifest, points: &[PointSummary]) -> Result<()> {
    let short = short_names(&manifest.grid);
    let label = |p: &PointSummary| {
        let v: Vec<String> = manifest
            .grid
            .iter()
            .zip(&short)
            .map(|(a, s)| format!("{s}={}", p.values[&a.path]))
            .collect();
        if v.is_empty() {
            format!("p{:03}", p.index)
        } else {
            v.join(" ")
        }
    };
    let mut sections = vec![format!(
        "<p>Scenario <b>{}</b>: {} points × {} seeds, horizon {} s, warm-up {} s. Each cell: median over seeds (min–max).</p>",
        html::escape(&manifest.scenario),
        points.len(),
        manifest.seeds.len(),
        manifest.horizon,
        manifest.warmup
    )];
    let mut header = vec!["point"];
    header.extend(METRICS.iter().map(|m| m.header));
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            let mut row = vec![html::escape(&label(p))];
            for m in METRICS {
                let st = &p.metrics[m.key];
                row.push(match (st.median, st.min, st.max) {
                    (Some(md), Some(lo), Some(hi)) => {
                        format!("{} ({}–{})", sig(md), sig(lo), sig(hi))
                    }
                    _ => "–".into(),
                });
            }
            row
        })
        .collect();
    sections.push("<h2>Summary</h2>".into());
    sections.push(html::table(&header, &rows));
    sections
        .push("<h2>Each metric against the grid (median, and the range over seeds)</h2>".into());
    let axis = short.join(", ");
    for m in METRICS {
        let pts: Vec<(String, f64, f64, f64)> = points
            .iter()
            .filter_map(|p| {
                let st = &p.metrics[m.key];
                Some((label(p), st.median?, st.min?, st.max?))
            })
            .collect();
        if pts.is_empty() {
            continue;
        }
        sections.push(html::figure(&band_svg_text(
            m.header, &axis, m.header, &pts,
        )?));
    }
    sections.push("<h2>Distributions, pooled over seeds</h2>".into());
    let curves = pooled_curves(out, manifest)?;
    for (c, (_, title, _)) in curves.iter().zip(RunDistributions::default().named()) {
        sections.push(html::figure(&cdf_svg_text(&cdf_title(manifest, title), c)?));
    }
    write_atomic(
        &out.join("summary.html"),
        &html::page(&format!("pdsim sweep: {}", manifest.name), &sections),
    )
}
