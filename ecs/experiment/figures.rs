//! A sweep's figures: TTFT and response-time CDFs per point, pooled over
//! its seeds from the histograms kept beside every run.

use std::fmt::Write as _;
use std::path::Path;

use crate::error::{Error, Result};
use crate::experiment::outdir::{RunDistributions, dist_path};
use crate::experiment::plan::{Manifest, short_names};
use crate::metrics::figures::cdf_svg;

/// A sweep's CDF figures: per point, pooled over its seeds.
pub fn sweep_plots(out: &Path, manifest: &Manifest) -> Result<()> {
    let points = manifest.points();
    let short = short_names(&manifest.grid);
    let mut ttft = Vec::new();
    let mut response = Vec::new();
    for p in &points {
        let mut pooled = RunDistributions::default();
        for &seed in &manifest.seeds {
            let path = dist_path(out, p, seed);
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let d: RunDistributions = serde_json::from_str(&text)
                .map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
            pooled.ttft.add(&d.ttft);
            pooled.response.add(&d.response);
        }
        let mut label = format!("p{:03}", p.index);
        for (s, v) in short.iter().zip(&p.values) {
            let _ = write!(label, " {s}={v}");
        }
        ttft.push((label.clone(), pooled.ttft.cdf()));
        response.push((label, pooled.response.cdf()));
    }
    let dir = out.join("plots");
    let seeds = manifest.seeds.len();
    cdf_svg(
        &dir.join("cdf_ttft.svg"),
        &format!(
            "{}: TTFT CDF per point ({seeds} seeds pooled)",
            manifest.name
        ),
        &ttft,
    )?;
    cdf_svg(
        &dir.join("cdf_response.svg"),
        &format!(
            "{}: response time CDF per point ({seeds} seeds pooled)",
            manifest.name
        ),
        &response,
    )
}
