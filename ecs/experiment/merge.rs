//! `pdsim merge`: the out dirs of a sharded sweep combined into one, which
//! is exactly what an unsharded sweep writes.

use std::path::Path;

use crate::error::{Error, Result};
use crate::experiment::args::MergeArgs;
use crate::experiment::figures::{sweep_page, sweep_plots};
use crate::experiment::outdir::{
    claim, dist_path, first_difference, read, read_manifest, run_path,
};
use crate::experiment::plan::{Manifest, sanitize};
use crate::experiment::run::SweepOutcome;
use crate::experiment::summary::write_summary;
use crate::metrics::write_atomic;

/// `pdsim merge`: the shards' out dirs, made by one sweep, into one.
pub fn merge(args: &MergeArgs) -> Result<SweepOutcome> {
    let mut manifest: Option<(Manifest, &Path)> = None;
    for dir in &args.dirs {
        let m = read_manifest(dir)?.ok_or_else(|| {
            Error::new(format!(
                "{}: no manifest.json: not the out dir of a sweep",
                dir.display()
            ))
        })?;
        match &manifest {
            None => manifest = Some((m, dir)),
            Some((first, first_dir)) => {
                if let Some(field) = first_difference(first, &m) {
                    return Err(Error::new(format!(
                        "{} and {} come from different sweeps (their `{field}` differs)",
                        first_dir.display(),
                        dir.display()
                    )));
                }
            }
        }
    }
    let (manifest, _) = manifest.expect("at least one dir");
    let out = match (&args.out, args.dirs.as_slice()) {
        (Some(o), _) => o.clone(),
        (None, [one]) => one.clone(),
        (None, _) => Path::new("out").join(sanitize(&manifest.name)),
    };
    claim(&out, &manifest)?;
    let runs = manifest.runs();
    let total = runs.len();
    let mut missing = Vec::new();
    let mut copied = 0;
    for (p, s) in &runs {
        let target = run_path(&out, p, *s);
        if target.exists() {
            continue;
        }
        let Some(dir) = args.dirs.iter().find(|d| run_path(d, p, *s).exists()) else {
            missing.push((p.label.clone(), *s));
            continue;
        };
        let dist = dist_path(dir, p, *s);
        if dist.exists() {
            write_atomic(&dist_path(&out, p, *s), &read(&dist)?)?;
        }
        write_atomic(&target, &read(&run_path(dir, p, *s))?)?;
        copied += 1;
    }
    if let Some((label, seed)) = missing.first() {
        return Err(Error::new(format!(
            "{} of the sweep's {total} runs are in none of the dirs (the first: {label} seed {seed}): run the shards that made them, then merge again",
            missing.len()
        )));
    }
    let (table, points) = write_summary(&out, &manifest)?;
    if args.html {
        sweep_page(&out, &manifest, &points)?;
    }
    if args.plots {
        sweep_plots(&out, &manifest)?;
        // The first run's time series, drawn by the shard that ran it.
        let series = Path::new("plots").join("timeseries.csv");
        if !out.join(&series).exists()
            && let Some(dir) = args.dirs.iter().find(|d| d.join(&series).exists())
        {
            let svg = Path::new("plots").join("timeseries.svg");
            if dir.join(&svg).exists() {
                write_atomic(&out.join(&svg), &read(&dir.join(&svg))?)?;
            }
            write_atomic(&out.join(&series), &read(&dir.join(&series))?)?;
        }
    }
    Ok(SweepOutcome {
        out,
        manifest,
        ran: copied,
        skipped: total - copied,
        present: total,
        total,
        table: Some(table),
    })
}
