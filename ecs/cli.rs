//! The command line: `pdsim run`, `check`, `sweep`, `merge`, `replay`.

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::metrics::figures::{LogHistogram, cdf_svg, write_series};
use crate::metrics::{Metrics, Report, write_atomic};
use crate::scenario::{self, Scenario};
use crate::sim::{SIM_TIME, Sim};

#[derive(Parser, Debug)]
#[command(
    name = "pdsim",
    version,
    about = "Simulate llm-d prefill/decode disaggregation on vLLM with NIXL"
)]
pub struct Cli {
    /// More log output (-v: info, -vv: debug, -vvv: trace); RUST_LOG also works.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// Options shared by commands that run a scenario.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RunOptions {
    /// Seed of the run (overrides the scenario's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Simulated seconds to run.
    #[arg(long)]
    pub horizon: Option<f64>,
    /// Requests reaching the gateway before this are not counted.
    #[arg(long)]
    pub warmup: Option<f64>,
    /// Override any scenario field by dotted path, e.g.
    /// --set decode.engine.num_gpu_blocks=2000
    /// --set router.decider.params.non_cached_tokens=inf
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
    #[command(flatten)]
    pub trace: scenario::TraceOptions,
}

impl RunOptions {
    /// All overrides: the trace first, then `--set`, the explicit flags last
    /// so they win.
    pub fn overrides(&self) -> Vec<String> {
        let mut o: Vec<String> = self.trace.override_().into_iter().collect();
        o.extend(self.set.iter().cloned());
        if let Some(s) = self.seed {
            o.push(format!("seed={s}"));
        }
        if let Some(h) = self.horizon {
            o.push(format!("horizon={h}"));
        }
        if let Some(w) = self.warmup {
            o.push(format!("warmup={w}"));
        }
        o
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a scenario and print its report.
    Run {
        scenario: PathBuf,
        #[command(flatten)]
        opts: RunOptions,
        /// Also write the report as JSON to this file (atomically).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also draw SVG figures into this folder: time series and CDFs.
        #[arg(long, value_name = "DIR")]
        plots: Option<PathBuf>,
        /// Time-series sampling interval, simulated seconds (with --plots).
        #[arg(long, value_name = "S", default_value_t = 1.0)]
        sample_interval: f64,
    },
    /// Validate a scenario and compile its scripts without running it.
    Check {
        scenario: PathBuf,
        #[command(flatten)]
        opts: RunOptions,
    },
    /// Run a scenario over a grid of parameters × seeds, in parallel;
    /// summarise each point (median over seeds and range). Resumable.
    Sweep(crate::experiment::SweepArgs),
    /// Combine the out dirs of a sharded sweep into one, with its summary.
    Merge(crate::experiment::MergeArgs),
    /// Replay a request trace (the vLLM oracle's format, docs/oracle.md) on
    /// one engine or one prefiller + one decoder, without a router, and write
    /// the oracle's per-request and per-step report (docs/fidelity.md).
    Replay {
        trace: PathBuf,
        /// Write the report here (atomically) instead of to stdout.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Override a field of the scenario built from the trace, e.g.
        /// --set engine_semantics=Reference
        #[arg(long = "set", value_name = "PATH=VALUE")]
        set: Vec<String>,
    },
}

struct SimTimer;

impl tracing_subscriber::fmt::time::FormatTime for SimTimer {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(
            w,
            "t={:.6}",
            f64::from_bits(SIM_TIME.load(Ordering::Relaxed))
        )
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_timer(SimTimer)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    match execute(cli.command) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn execute(command: Command) -> Result<()> {
    match command {
        Command::Run {
            scenario,
            opts,
            json,
            plots,
            sample_interval,
        } => {
            let sc = scenario::load(&scenario, &opts.overrides())?;
            let report = match &plots {
                Some(dir) => run_with_plots(&sc, dir, sample_interval)?,
                None => Sim::new(&sc)?.run()?,
            };
            print!("{}", report.to_text());
            if let Some(path) = json {
                write_atomic(&path, &report.to_json())?;
            }
            Ok(())
        }
        Command::Check { scenario, opts } => {
            let sc = scenario::load(&scenario, &opts.overrides())?;
            Sim::new(&sc)?;
            let r = &sc.raw;
            println!(
                "{}: ok ({} prefill × {} decode, {} scripts compiled, {} phases)",
                scenario.display(),
                r.prefill.count,
                r.decode.count,
                1 + [&r.router.decode, &r.router.prefill]
                    .iter()
                    .map(|p| p.filters.len() + p.scorers.len() + 1)
                    .sum::<usize>(),
                r.phases.len()
            );
            Ok(())
        }
        Command::Sweep(args) => {
            use std::io::IsTerminal as _;
            let wall = std::time::Instant::now();
            let done = crate::experiment::sweep(&args, std::io::stderr().is_terminal())?;
            print!("{}", done.to_text());
            println!(
                "{} runs, {} already done; wall {:.1} s; written to {}",
                done.ran,
                done.skipped,
                wall.elapsed().as_secs_f64(),
                done.out.display()
            );
            Ok(())
        }
        Command::Replay { trace, json, set } => {
            let text = crate::replay::replay_file(&trace, &set)?.to_json_text();
            match json {
                Some(path) => write_atomic(&path, &text)?,
                None => print!("{text}"),
            }
            Ok(())
        }
        Command::Merge(args) => {
            let done = crate::experiment::merge(&args)?;
            print!("{}", done.to_text());
            println!(
                "merged {} runs ({} copied) into {}",
                done.total,
                done.ran,
                done.out.display()
            );
            Ok(())
        }
    }
}

/// `pdsim run --plots DIR`: the run, with its time series and CDFs in `dir`.
pub fn run_with_plots(scenario: &Scenario, dir: &Path, interval: f64) -> Result<Report> {
    if !(interval.is_finite() && interval > 0.0) {
        return Err(Error::new(format!(
            "--sample-interval must be a positive number of seconds, got {interval}"
        )));
    }
    let mut sim = Sim::new(scenario)?;
    sim.record_series(interval);
    let report = sim.run()?;
    if let Some(series) = sim.take_series() {
        write_series(&series, dir)?;
    }
    let overall = sim.world.resource::<Metrics>().overall();
    let name = format!("{} seed {}", report.scenario, report.seed);
    for (obs, title) in [("ttft", "TTFT"), ("response", "response time")] {
        let curve = LogHistogram::of(overall.get(obs)).cdf();
        cdf_svg(
            &dir.join(format!("cdf_{obs}.svg")),
            &format!("{title} CDF"),
            &[(name.clone(), curve)],
        )?;
    }
    Ok(report)
}
