//! Running a sweep: the runs of this slice that are missing, in parallel,
//! each written atomically; the summary once every run is present.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::experiment::args::{SweepArgs, parse_shard};
use crate::experiment::figures::{sweep_page, sweep_plots};
use crate::experiment::outdir::{RunDistributions, claim, dist_path, run_path};
use crate::experiment::plan::{Manifest, Point, plan, sanitize};
use crate::experiment::summary::write_summary;
use crate::metrics::figures::write_series;
use crate::metrics::formats::{bench_json, timeline};
use crate::metrics::write_atomic;
use crate::scenario;
use crate::sim::{Outputs, Sim};
use crate::workload::trace::TraceReads;

/// What a sweep did.
#[derive(Debug, Clone)]
pub struct SweepOutcome {
    pub out: PathBuf,
    pub manifest: Manifest,
    /// Runs of this invocation's slice run now, and skipped (already done).
    pub ran: usize,
    pub skipped: usize,
    /// Runs of the whole sweep present in the out dir, and in all.
    pub present: usize,
    pub total: usize,
    /// The summary table (when every run of the sweep is present).
    pub table: Option<String>,
}

impl SweepOutcome {
    /// What `pdsim sweep` prints.
    pub fn to_text(&self) -> String {
        match &self.table {
            Some(t) => t.clone(),
            None => format!(
                "{} holds {} of the sweep's {} runs: run the other shards (same --out, or their own \
                 dirs and then `pdsim merge`) to get the summary\n",
                self.out.display(),
                self.present,
                self.total
            ),
        }
    }
}

/// The output files of one run of a sweep (beside its report).
fn run_outputs(args: &SweepArgs, out: &Path, point: &Point, seed: u64) -> Result<Outputs> {
    let report = run_path(out, point, seed);
    let beside = |ext: &str| report.with_extension(ext);
    let percentiles = bench_json::parse_percentiles(&args.metric_percentiles).map_err(|e| {
        Error::new(format!(
            "--metric-percentiles {}: {e}",
            args.metric_percentiles
        ))
    })?;
    let timeline_window = match &args.timeline {
        Some(w) => Some(
            timeline::parse_window(w).map_err(|e| Error::new(format!("--timeline {w}: {e}")))?,
        ),
        None => None,
    };
    Ok(Outputs {
        bench_json: args.bench_json.then(|| beside("bench.json")),
        percentiles,
        aiperf: args.aiperf.then(|| beside("aiperf")),
        prometheus: args.prometheus.then(|| beside("prom")),
        timeline: timeline_window.map(|_| beside("timeline.json")),
        timeline_window: timeline_window.unwrap_or((0.0, f64::INFINITY)),
        ..Outputs::default()
    })
}

/// Runs one simulation of the plan; writes its output files and
/// distributions, then its report (which marks the run done).
fn run_one(
    manifest: &Manifest,
    args: &SweepArgs,
    out: &Path,
    point: &Point,
    seed: u64,
    series: Option<(f64, &Path)>,
    reads: &TraceReads,
) -> Result<()> {
    let scenario_path = Path::new(&manifest.scenario);
    let sc = scenario::load(scenario_path, &manifest.overrides(point, seed))?;
    let outputs = run_outputs(args, out, point, seed)?;
    let mut sim = Sim::new_sharing(&sc, reads)?;
    outputs.prepare(&mut sim)?;
    if let Some((interval, _)) = series {
        sim.record_series(interval);
    }
    let report = sim.run()?;
    outputs.write(&mut sim, &report)?;
    if let Some((_, dir)) = series
        && let Some(rec) = sim.take_series()
    {
        write_series(&rec, dir)?;
    }
    let dists = RunDistributions::of(&report.overall);
    let mut text = serde_json::to_string(&dists).expect("serializes");
    text.push('\n');
    write_atomic(&dist_path(out, point, seed), &text)?;
    write_atomic(&run_path(out, point, seed), &report.to_json())
}

/// `pdsim sweep`: plans, claims the out dir, runs what is missing of this
/// slice, and summarises when the sweep is complete.
pub fn sweep(args: &SweepArgs, progress: bool) -> Result<SweepOutcome> {
    let shard = args.shard.as_deref().map(parse_shard).transpose()?;
    let jobs = match args.jobs {
        Some(0) => return Err(Error::new("--jobs must be at least 1")),
        Some(j) => j,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    if args.plots && !(args.sample_interval.is_finite() && args.sample_interval > 0.0) {
        return Err(Error::new(format!(
            "--sample-interval must be a positive number of seconds, got {}",
            args.sample_interval
        )));
    }
    // Each trace is read once for the checks of the plan and every run.
    let reads = TraceReads::default();
    let manifest = plan(args, &reads)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("out").join(sanitize(&manifest.name)));
    claim(&out, &manifest)?;

    let runs = manifest.runs();
    let total = runs.len();
    let plots_dir = out.join("plots");
    let want_series = args.plots
        && !plots_dir.join("timeseries.csv").exists()
        && shard.is_none_or(|(k, _)| k == 1);
    let mine: Vec<(usize, &(Point, u64))> = runs
        .iter()
        .enumerate()
        .filter(|(i, _)| shard.is_none_or(|(k, n)| i % n == k - 1))
        .collect();
    let todo: Vec<(usize, &(Point, u64))> = mine
        .iter()
        .copied()
        .filter(|(i, (p, s))| !run_path(&out, p, *s).exists() || (*i == 0 && want_series))
        .collect();
    let skipped = mine.len() - todo.len();

    let bar = if progress && !todo.is_empty() {
        let bar =
            ProgressBar::with_draw_target(Some(todo.len() as u64), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {pos}/{len} runs, ETA {eta_precise}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        .build()
        .map_err(|e| Error::new(format!("cannot start {jobs} threads: {e}")))?;
    pool.install(|| {
        todo.par_iter()
            .with_max_len(1)
            .try_for_each(|&(i, (p, s))| {
                let series =
                    (i == 0 && want_series).then_some((args.sample_interval, plots_dir.as_path()));
                run_one(&manifest, args, &out, p, *s, series, &reads)
                    .map_err(|e| Error::new(format!("run {} seed {s}: {e}", p.label)))?;
                bar.inc(1);
                Ok(())
            })
    })?;
    bar.finish_and_clear();

    let present = runs
        .iter()
        .filter(|(p, s)| run_path(&out, p, *s).exists())
        .count();
    let table = if present == total {
        let (table, points) = write_summary(&out, &manifest)?;
        if args.plots {
            sweep_plots(&out, &manifest)?;
        }
        if args.html {
            sweep_page(&out, &manifest, &points)?;
        }
        Some(table)
    } else {
        None
    };
    Ok(SweepOutcome {
        out,
        manifest,
        ran: todo.len(),
        skipped,
        present,
        total,
        table,
    })
}
