//! pdsim: a simulator of prefill/decode disaggregated LLM serving as llm-d
//! runs it on vLLM — the llm-d router in front of prefill and decode vLLM
//! instances that hand the KV cache over with NIXL.
//!
//! The modules follow `docs/model.md` (docs/architecture.md walks through them):
//!
//! | docs/model.md | module |
//! |---|---|
//! | §2 time, ticks, system order | [`sim`] (the ordering contract, the schedule), [`shared`] (clock, agenda, the tick's queues) |
//! | §3 workload | [`workload`] |
//! | §4 gateway: router + sidecar | [`router`] (profiles, decider, sidecar, bookkeeping, the rhai policy host) |
//! | §5 scheduler, §6 prefill, §7 decode | [`engine`] (scheduler, requests, step cost) |
//! | §5 KV pool, prefix cache | [`engine::kv`] |
//! | §6–§8 leases, NIXL flows, NICs | [`transfer`] (and [`transfer::sharing`]: max-min) |
//! | §9 observations and gauges | [`metrics`] (and the report, figures) |
//! | §10 scenarios | [`scenario`] |
//! | §11 experiments | [`experiment`] (sweeps) |
//! | fidelity to vLLM | [`replay`] (the oracle's trace format) |
//!
//! Dependencies go one way: `cli` → `experiment`, `replay` → `sim` →
//! `workload`, `metrics` → `router` → `transfer` → `engine` → `shared` →
//! `scenario`, `stats` → `error`.

pub mod check;
pub mod cli;
pub mod engine;
pub mod error;
pub mod experiment;
pub mod files;
pub mod hardware;
pub mod metrics;
pub mod replay;
pub mod router;
pub mod scenario;
pub mod shared;
pub mod sim;
pub mod stats;
pub mod transfer;
pub mod workload;

/// bevy_ecs, as pdsim uses it: an extension's systems and components use
/// this one, so its version always matches.
pub use bevy_ecs as ecs;
pub use error::{Error, Result};
pub use metrics::Report;
pub use scenario::Scenario;
pub use sim::{Sim, SimSystems};

/// Loads a scenario (with `--set` overrides) and runs it.
pub fn run_scenario(path: &std::path::Path, overrides: &[String]) -> Result<Report> {
    let scenario = scenario::load(path, overrides)?;
    Sim::new(&scenario)?.run()
}
