//! The command line: `pdsim run`, `check`, `sweep`, `merge`, `replay`.

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::metrics::Report;
use crate::metrics::formats::{bench_json, timeline};
use crate::metrics::write_atomic;
use crate::scenario::{self, Scenario};
use crate::sim::{Outputs, Sim, sim_time};

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

/// The files `pdsim run` writes besides what it prints (each atomically).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OutputArgs {
    /// The report as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// The run as `vllm bench serve --save-result` writes a benchmark.
    #[arg(long, value_name = "FILE")]
    pub bench_json: Option<PathBuf>,
    /// Percentiles of --bench-json (vLLM's --metric-percentiles).
    #[arg(long, value_name = "P,P,...", default_value = "99")]
    pub metric_percentiles: String,
    /// NVIDIA AIPerf's profile_export_aiperf.json and profile_export.jsonl.
    #[arg(long, value_name = "DIR")]
    pub aiperf: Option<PathBuf>,
    /// The vLLM engines' Prometheus metrics at the end of the run.
    #[arg(long, value_name = "FILE")]
    pub prometheus: Option<PathBuf>,
    /// A Chrome trace-event timeline (Perfetto, chrome://tracing).
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
    /// Keep in the timeline what overlaps [A, B] simulated seconds.
    #[arg(long, value_name = "A..B", requires = "timeline")]
    pub timeline_window: Option<String>,
    /// One self-contained HTML page: tables and figures.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// SVG figures into this folder: time series and CDFs.
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    /// Time-series sampling interval, simulated seconds (with --plots).
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    pub sample_interval: f64,
}

impl OutputArgs {
    pub fn outputs(&self) -> Result<Outputs> {
        let percentiles = bench_json::parse_percentiles(&self.metric_percentiles).map_err(|e| {
            Error::new(format!(
                "--metric-percentiles {}: {e}",
                self.metric_percentiles
            ))
        })?;
        let timeline_window = match &self.timeline_window {
            Some(w) => timeline::parse_window(w)
                .map_err(|e| Error::new(format!("--timeline-window {w}: {e}")))?,
            None => (0.0, f64::INFINITY),
        };
        Ok(Outputs {
            json: self.json.clone(),
            bench_json: self.bench_json.clone(),
            percentiles,
            aiperf: self.aiperf.clone(),
            prometheus: self.prometheus.clone(),
            timeline: self.timeline.clone(),
            timeline_window,
            html: self.html.clone(),
            plots: self.plots.clone(),
            sample_interval: self.sample_interval,
        })
    }
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
    /// Service-level objectives for goodput, seconds, e.g. ttft=0.2,tpot=0.05,e2e=2
    /// (the same as --set slo.ttft=0.2 ...).
    #[arg(long, value_name = "NAME=S,...")]
    pub slo: Option<String>,
}

impl RunOptions {
    /// All overrides: the trace first, then `--set`, the explicit flags last
    /// so they win.
    pub fn overrides(&self) -> Vec<String> {
        let mut o: Vec<String> = self.trace.override_().into_iter().collect();
        o.extend(self.set.iter().cloned());
        if let Some(slo) = &self.slo {
            o.extend(slo.split(',').map(|kv| format!("slo.{}", kv.trim())));
        }
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
        #[command(flatten)]
        files: OutputArgs,
    },
    /// Validate a scenario and compile its scripts without running it; print
    /// what it derives (hardware, KV blocks, NICs, probe step times).
    Check {
        scenario: PathBuf,
        #[command(flatten)]
        opts: RunOptions,
        /// Everything derived, as JSON.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Simulate `vllm bench latency --batch-size B --input-len I
        /// --output-len O` on one pod of each pool (repeatable).
        #[arg(long, value_name = "B:I:O")]
        latency: Vec<crate::check::LatencyArgs>,
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
        write!(w, "t={:.6}", sim_time())
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

/// The command line with the user's own systems in every simulation it
/// builds: an extension's `main` calls this (docs/extending.md).
///
/// ```no_run
/// // An extension's main: the ordinary command line, with its systems.
/// std::process::exit(pdsim::cli::main_with(|sim| {
///     // sim.add_systems(my_system.in_set(pdsim::SimSystems::Observe));
///     let _ = sim;
/// }));
/// ```
pub fn main_with(extend: impl Fn(&mut Sim) + Send + Sync + 'static) -> i32 {
    if let Err(e) = crate::sim::set_extension(Box::new(extend)) {
        eprintln!("error: {e}");
        return 1;
    }
    main()
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
            files,
        } => {
            let sc = scenario::load(&scenario, &opts.overrides())?;
            let report = files.outputs()?.run(&sc)?;
            print!("{}", report.to_text());
            if !report.backlog.kept_up {
                eprintln!(
                    "warning: {}: the deployment did not keep up ({} requests in flight at the horizon); see the report's backlog",
                    scenario.display(),
                    report.backlog.in_flight
                );
            }
            Ok(())
        }
        Command::Check {
            scenario,
            opts,
            json,
            latency,
        } => {
            let sc = scenario::load(&scenario, &opts.overrides())?;
            let mut sim = Sim::new(&sc)?;
            // Every hook once on made-up situations: runtime mistakes now,
            // not at the first request that takes that branch.
            if let crate::router::RouterMode::Scripts(p) =
                &mut sim.world.non_send_mut::<crate::router::Router>().mode
            {
                p.rehearse()
                    .map_err(|e| Error::new(format!("{}: {e}", scenario.display())))?;
            }
            let derived = crate::check::Derived::of(&sc, &latency);
            if let Some(path) = json {
                write_atomic(&path, &derived.to_json_text())?;
            }
            print!("{}", derived.to_text());
            let r = &sc.raw;
            println!(
                "{}: ok ({} prefill × {} decode, {} scripts compiled and every hook called, {} phases)",
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
    Outputs {
        plots: Some(dir.to_path_buf()),
        sample_interval: interval,
        ..Outputs::default()
    }
    .run(scenario)
}
