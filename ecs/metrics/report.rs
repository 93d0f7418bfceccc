//! The report of a run: printed for people, and as JSON (`--json`) with the
//! same numbers. The JSON holds only what the scenario and seed determine
//! (no wall time), so two runs give byte-identical files.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use bevy_ecs::prelude::*;

use crate::engine::Engine;
use crate::engine::{Request, Role};
use crate::error::{Error, Result};
use crate::metrics::backlog::{self, Backlog};
use crate::metrics::counters::Counters;
use crate::metrics::gauges::{GAUGES, Gauges};
use crate::metrics::observations::{Metrics, Obs, PhaseObservations, Summary};
use crate::router::Router;
use crate::shared::{Clock, CurrentScenario, RunStatus};
use crate::transfer::Flows;

/// What a trace workload read (the report's `trace` section).
#[derive(Resource, Debug, Clone, Serialize, PartialEq)]
pub struct TraceSummary {
    pub file: String,
    pub format: String,
    /// Requests and sessions kept (after the window and the cut).
    pub requests: u64,
    pub sessions: u64,
    /// Records of the file left out by the window.
    pub left_out: u64,
    /// Whether reading stopped at `max_requests`.
    pub cut: bool,
    /// Seconds from the first to the last timestamped arrival (scaled).
    pub span: f64,
    pub mean_input: f64,
    pub mean_output: f64,
    /// Share of prompt tokens in blocks that an earlier request of the trace
    /// already had (an upper bound on what prefix caching can save).
    pub seen_before: f64,
}

impl TraceSummary {
    /// One paragraph for people.
    pub fn to_text(&self) -> String {
        format!(
            "trace {} ({}): {} requests{} in {} sessions over {:.1} s ({} left out by the window); \
             mean input {:.0}, output {:.0} tokens; {:.1} % of prompt tokens in blocks seen before\n",
            self.file,
            self.format,
            self.requests,
            if self.cut { " (the first)" } else { "" },
            self.sessions,
            self.span,
            self.left_out,
            self.mean_input,
            self.mean_output,
            100.0 * self.seen_before
        )
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PhaseReport {
    /// When the phase started (0 for the first).
    pub start: f64,
    pub observations: BTreeMap<String, Summary>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub scenario: String,
    pub seed: u64,
    pub horizon: f64,
    pub warmup: f64,
    pub observations: BTreeMap<String, Summary>,
    /// Finished requests and tokens per second over [warm-up, horizon], and
    /// goodput when the scenario gives SLOs.
    pub throughput: Throughput,
    pub gauges: BTreeMap<String, f64>,
    /// Whole-run counts (from t = 0): requests, tokens, the prefix caches,
    /// KV transfers ([`Counters`] and the engines' and transfers' own).
    pub counters: BTreeMap<String, u64>,
    /// What the scenario's own systems reported ([`crate::metrics::CustomMetrics`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub custom: BTreeMap<String, f64>,
    /// What the router sent to each pod (`prefill-0`, `decode-1`, …) over
    /// the whole run: requests (legs), of those prefilled remotely (on a
    /// decoder), prompt tokens.
    pub pods: BTreeMap<String, crate::router::book::Routed>,
    /// What is still in flight at the horizon, and whether the deployment
    /// kept up ([`crate::metrics::backlog`]).
    pub backlog: Backlog,
    /// What a trace workload read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceSummary>,
    /// Per hot-swap phase, when the scenario has phases.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<PhaseReport>,
    /// Ticks and engine steps simulated.
    pub ticks: u64,
    pub steps: u64,
    /// Wall-clock seconds (not in the JSON: it differs run to run).
    #[serde(skip)]
    pub wall_seconds: f64,
    /// Requests routed and the wall seconds the router spent on them.
    #[serde(skip)]
    pub routing_decisions: u64,
    #[serde(skip)]
    pub routing_seconds: f64,
    /// The observations themselves, all phases together (for the output
    /// formats; not in the JSON).
    #[serde(skip)]
    pub overall: PhaseObservations,
}

/// Rates over [warm-up, horizon] of the requests counted by the
/// observations (reached the gateway after the warm-up, finished by the
/// horizon), as `vllm bench serve` reports them.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Throughput {
    /// Seconds: horizon − warm-up.
    pub duration: f64,
    pub completed: u64,
    pub requests_per_s: f64,
    pub input_tokens_per_s: f64,
    pub output_tokens_per_s: f64,
    pub total_tokens_per_s: f64,
    /// Completed requests within every SLO, and their rate (None: no SLO).
    pub good_requests: Option<u64>,
    pub goodput_per_s: Option<f64>,
}

impl Throughput {
    fn of(o: &PhaseObservations, duration: f64, slo: bool) -> Throughput {
        let rate = |n: u64| n as f64 / duration;
        Throughput {
            duration,
            completed: o.finished,
            requests_per_s: rate(o.finished),
            input_tokens_per_s: rate(o.input_tokens),
            output_tokens_per_s: rate(o.output_tokens),
            total_tokens_per_s: rate(o.input_tokens + o.output_tokens),
            good_requests: slo.then_some(o.good),
            goodput_per_s: slo.then(|| rate(o.good)),
        }
    }
}

/// Every observation's summary by name, and `response` (an alias of `e2e`).
fn summaries(obs: &PhaseObservations) -> BTreeMap<String, Summary> {
    let mut out: BTreeMap<String, Summary> = Obs::ALL
        .iter()
        .map(|&o| (o.name().to_string(), Summary::of(obs.get(o))))
        .collect();
    out.insert("response".into(), Summary::of(obs.get(Obs::E2e)));
    out
}

/// Counters that only faults, leases or retries move: the text report
/// leaves them out while they are 0.
const FAULT_COUNTERS: [&str; 8] = [
    "requests_failed_",
    "requests_stuck",
    "prefill_retries",
    "client_retries",
    "sessions_ended_by_failure",
    "leases_expired",
    "reads_of_freed_blocks",
    "stranded_kv_token_seconds",
];

/// Every counter of the run, by name.
fn counters(world: &mut World) -> BTreeMap<String, u64> {
    let c = world.resource::<Counters>().clone();
    // A request dispatched in parallel is its decode leg; its prefill leg
    // is not a request of its own.
    let (mut in_flight, mut stuck) = (0, 0);
    for r in world.query::<&Request>().iter(world) {
        if !r.is_prefill_twin() {
            in_flight += 1;
            stuck += r.stuck as u64;
        }
    }
    let mut out = BTreeMap::new();
    let mut put = |name: &str, v: u64| {
        out.insert(name.to_string(), v);
    };
    put("requests_arrived", c.requests_arrived);
    put("requests_finished", c.requests_finished);
    put("requests_too_long", c.requests_too_long);
    put("requests_in_flight", in_flight);
    put("requests_failed", c.requests_failed);
    for reason in crate::shared::FailReason::ALL {
        let n = c.failed_by_reason.get(reason.name()).copied().unwrap_or(0);
        put(&format!("requests_failed_{}", reason.name()), n);
    }
    put("requests_stuck", stuck);
    put("prefill_retries", c.prefill_retries);
    put("client_retries", c.client_retries);
    put("sessions_ended_by_failure", c.sessions_ended_by_failure);
    put("prompt_tokens", c.prompt_tokens);
    put("generated_tokens", c.generated_tokens);
    let mut cache = [[0u64; 2]; 2];
    for e in world.query::<&Engine>().iter(world) {
        cache[e.role as usize][0] += e.prefix_queries;
        cache[e.role as usize][1] += e.prefix_hits;
    }
    for role in [Role::Prefill, Role::Decode] {
        let [queries, hits] = cache[role as usize];
        put(&format!("{}_prefix_cache_queries", role.name()), queries);
        put(&format!("{}_prefix_cache_hits", role.name()), hits);
    }
    let flows = world.resource::<Flows>();
    put("kv_transfers", flows.completed);
    put("kv_transfer_tokens", flows.completed_tokens);
    put("leases_expired", flows.leases_expired);
    put("reads_of_freed_blocks", flows.reads_of_freed_blocks);
    put(
        "stranded_kv_token_seconds",
        flows.stranded_token_seconds.round() as u64,
    );
    out
}

impl Report {
    /// The report of the run `world` holds (after its last tick).
    pub fn collect(world: &mut World, wall_seconds: f64) -> Report {
        let raw = &world.resource::<CurrentScenario>().0;
        let (scenario, seed, warmup, horizon) =
            (raw.name.clone(), raw.seed, raw.warmup, raw.horizon);
        let phase_starts: Vec<f64> = std::iter::once(0.0)
            .chain(raw.phases.iter().map(|p| p.at))
            .collect();
        let metrics = world.resource::<Metrics>();
        let slo = metrics.slo != Default::default();
        let mut per_phase = metrics.phases.clone();
        // The engines observed every token gap.
        for e in world.query::<&Engine>().iter(world) {
            for (p, h) in e.itl.iter().enumerate() {
                per_phase[p].hists[Obs::Itl as usize].merge(h);
            }
        }
        let mut overall = PhaseObservations::default();
        for p in &per_phase {
            overall.merge(p);
        }
        let mut observations = summaries(&overall);
        let custom = world
            .get_resource::<crate::metrics::CustomMetrics>()
            .cloned()
            .unwrap_or_default();
        for (name, h) in &custom.observations {
            observations
                .entry(name.clone())
                .or_insert_with(|| Summary::of(h));
        }
        let custom = custom.values;
        let throughput = Throughput::of(&overall, horizon - warmup, slo);
        let phases = if per_phase.len() > 1 {
            per_phase
                .iter()
                .zip(phase_starts)
                .map(|(p, start)| PhaseReport {
                    start,
                    observations: summaries(p),
                })
                .collect()
        } else {
            Vec::new()
        };
        let averages = world.resource::<Gauges>().averages();
        let gauges = GAUGES
            .iter()
            .zip(averages)
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        let ticks = world.resource::<Clock>().ticks;
        let steps = world.query::<&Engine>().iter(world).map(|e| e.steps).sum();
        let counters = counters(world);
        let trace = world.get_resource::<TraceSummary>().cloned();
        let stopped_early = world
            .get_resource::<RunStatus>()
            .and_then(|s| s.stopped_early.clone());
        let backlog = backlog::collect(world, horizon, (warmup, horizon), stopped_early);
        let router = world.non_send::<Router>();
        let (routing_decisions, routing_seconds) = (router.decisions, router.seconds);
        let mut pods = BTreeMap::new();
        for role in [Role::Prefill, Role::Decode] {
            for (i, r) in router.book.routed[role as usize].iter().enumerate() {
                pods.insert(format!("{}-{i}", role.name()), *r);
            }
        }
        Report {
            scenario,
            seed,
            horizon,
            warmup,
            observations,
            throughput,
            gauges,
            counters,
            custom,
            pods,
            backlog,
            trace,
            phases,
            ticks,
            steps,
            wall_seconds,
            routing_decisions,
            routing_seconds,
            overall,
        }
    }

    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a report serializes");
        s.push('\n');
        s
    }

    /// The mean of an observation (None when nothing was observed).
    pub fn mean(&self, name: &str) -> Option<f64> {
        self.observations.get(name).and_then(|s| s.mean)
    }

    /// The readable report.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "pdsim: {} (seed {}), horizon {} s, warm-up {} s",
            self.scenario, self.seed, self.horizon, self.warmup
        );
        if let Some(t) = &self.trace {
            out.push_str(&t.to_text());
        }
        write_table(&mut out, &self.observations);
        for (i, p) in self.phases.iter().enumerate() {
            let _ = writeln!(out, "\nphase {} (from t = {} s)", i + 1, p.start);
            write_table(&mut out, &p.observations);
        }
        let t = &self.throughput;
        let _ = writeln!(
            out,
            "\nthroughput over [warm-up, horizon] ({} s): {:.3} requests/s, {:.1} input + {:.1} output tokens/s",
            t.duration, t.requests_per_s, t.input_tokens_per_s, t.output_tokens_per_s
        );
        if let (Some(good), Some(rate)) = (t.good_requests, t.goodput_per_s) {
            let _ = writeln!(
                out,
                "goodput {rate:.3} requests/s ({good} of {} requests within every SLO)",
                t.completed
            );
        }
        out.push_str(&self.backlog.to_text());
        let _ = writeln!(out, "\ngauges (time averages over [warm-up, horizon])");
        for (name, v) in &self.gauges {
            let (unit, what) = crate::metrics::gauges::describe(name);
            let _ = writeln!(out, "  {name:<18}{v:>12.4}  {unit:<9} {what}");
        }
        if !self.custom.is_empty() {
            let _ = writeln!(out, "\ncustom (the scenario's own systems)");
            for (name, v) in &self.custom {
                let _ = writeln!(out, "  {name:<28}{v:>12.4}");
            }
        }
        let _ = writeln!(
            out,
            "\nrouted (whole run): requests, of which prefilled remotely, prompt tokens"
        );
        for (pod, r) in &self.pods {
            let remote = if pod.starts_with("decode") {
                format!("{:>10}", r.remote)
            } else {
                format!("{:>10}", "-")
            };
            let _ = writeln!(
                out,
                "  {pod:<12}{:>10}{remote}{:>14}",
                r.requests, r.prompt_tokens
            );
        }
        let _ = writeln!(
            out,
            "\ncounters (whole run, from t = 0; faults' counters when not 0)"
        );
        for (name, v) in &self.counters {
            if *v == 0 && FAULT_COUNTERS.iter().any(|c| name.starts_with(c)) {
                continue;
            }
            let _ = writeln!(out, "  {name:<28}{v:>12}");
        }
        let frac = |n: &str| {
            self.mean(n)
                .map(|m| format!("{m:.4}"))
                .unwrap_or_else(|| "-".into())
        };
        let _ = writeln!(
            out,
            "\nremote fraction {}   too-long fraction {}",
            frac("remote"),
            frac("too_long")
        );
        let simulated = self.horizon;
        let speed = if self.wall_seconds > 0.0 {
            simulated / self.wall_seconds
        } else {
            f64::INFINITY
        };
        let _ = writeln!(
            out,
            "wall {:.3} s, {:.0} simulated s per wall s ({} ticks, {} engine steps; routing {:.1}% of wall)",
            self.wall_seconds,
            speed,
            self.ticks,
            self.steps,
            self.routing_seconds / self.wall_seconds.max(1e-12) * 100.0
        );
        out
    }
}

fn write_table(out: &mut String, obs: &BTreeMap<String, Summary>) {
    let _ = writeln!(
        out,
        "{:<14}{:>9}{:>9}{:>12}{:>12}{:>12}{:>12}",
        "observation", "unit", "count", "mean", "p50", "p90", "p99"
    );
    let f = |v: Option<f64>| v.map(|x| format!("{x:.4}")).unwrap_or_else(|| "-".into());
    for o in Obs::ALL {
        let s = &obs[o.name()];
        if o.is_flag() {
            // A 0/1 observation: its mean is the fraction; no percentiles.
            let _ = writeln!(
                out,
                "{:<14}{:>9}{:>9}{:>12}",
                o.name(),
                o.unit(),
                s.count,
                f(s.mean)
            );
            continue;
        }
        let _ = writeln!(
            out,
            "{:<14}{:>9}{:>9}{:>12}{:>12}{:>12}{:>12}",
            o.name(),
            o.unit(),
            s.count,
            f(s.mean),
            f(s.p50),
            f(s.p90),
            f(s.p99)
        );
    }
    // The scenario's own systems' observations (no unit known).
    for (name, s) in obs {
        if Obs::ALL
            .iter()
            .any(|o| o.name() == name || name == "response")
        {
            continue;
        }
        let _ = writeln!(
            out,
            "{:<14}{:>9}{:>9}{:>12}{:>12}{:>12}{:>12}",
            name,
            "-",
            s.count,
            f(s.mean),
            f(s.p50),
            f(s.p90),
            f(s.p99)
        );
    }
}

/// Writes a file atomically: to a temporary file beside it, then renamed,
/// so a reader never sees half a file and an interrupted run loses nothing.
pub fn write_atomic(path: &Path, contents: &str) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::new(format!("cannot create {}: {e}", dir.display())))?;
    let name = path
        .file_name()
        .ok_or_else(|| Error::new(format!("{} is not a file path", path.display())))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, contents)
        .map_err(|e| Error::new(format!("cannot write {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| Error::new(format!("cannot write {}: {e}", path.display())))
}
