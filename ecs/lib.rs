//! pdsim: a simulator of prefill/decode disaggregated LLM serving as llm-d
//! runs it on vLLM — the llm-d router in front of prefill and decode vLLM
//! instances that hand the KV cache over with NIXL.
//!
//! The modules follow `MODEL.md`:
//!
//! | MODEL.md | module |
//! |---|---|
//! | §2 time, ticks, system order | [`sim`] (the ordering contract), [`agenda`] |
//! | §3 workload | [`workload`] |
//! | §4 gateway: router + sidecar | [`gateway`], [`policy`] (rhai scripts), [`router_book`] |
//! | §5 scheduler, §6 prefill, §7 decode | [`engine`], [`request`] |
//! | §5 KV pool, prefix cache | [`kv`] |
//! | §6–§8 leases, NIXL flows, NICs | [`transfer`], [`sharing`] (max-min) |
//! | §9 observations and gauges | [`metrics`], [`report`] |
//! | §10 scenarios | [`scenario`] |

pub mod agenda;
pub mod cli;
pub mod engine;
pub mod error;
pub mod gateway;
pub mod kv;
pub mod metrics;
pub mod plots;
pub mod policy;
pub mod replay;
pub mod report;
pub mod request;
pub mod router_book;
pub mod scenario;
pub mod sharing;
pub mod sim;
pub mod sweep;
pub mod transfer;
pub mod workload;

pub use error::{Error, Result};
pub use report::Report;
pub use scenario::Scenario;
pub use sim::{Sim, SimSystems};

/// Loads a scenario (with `--set` overrides) and runs it.
pub fn run_scenario(path: &std::path::Path, overrides: &[String]) -> Result<Report> {
    let scenario = scenario::load(path, overrides)?;
    Sim::new(&scenario)?.run()
}
