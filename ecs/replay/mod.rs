//! `pdsim replay`: runs an explicit request trace — the vLLM oracle's trace
//! format (docs/oracle.md) — on one engine (`"mode": "single"`) or on one
//! prefiller and one decoder joined by NIXL pull (`"mode": "pd"`), with no
//! router, and reports it in the oracle's report format, so that the two can
//! be compared step by step (docs/fidelity.md, tests/golden/).
//!
//! * The scenario is built from the trace's `config`: both pools get the
//!   engine keys (in `pd` mode with the `prefill` / `decode` overrides), the
//!   NICs `nic_tokens_per_s`, the read latency `x0`, max-min sharing (with one
//!   P NIC and one D NIC of equal capacity every read gets `rate / reads`, the
//!   oracle's equal split). The engines follow vLLM 0.33's semantics
//!   (`engine_semantics: Vllm033`) unless `--set engine_semantics=Reference`.
//! * Requests of one `session` are prefixes of one token stream; requests
//!   without a session share nothing. In single mode every request is served
//!   locally by decoder 0 (the prefiller exists but gets nothing); in pd mode
//!   every request is prefilled on prefiller 0 and read by decoder 0.
//! * Steps are recorded one by one (`Sim::record`); a formation that only
//!   preempted is reported with the engine's next step, as the oracle does.
//!
//! | file | what |
//! |---|---|
//! | [`trace`] | the trace format and the scenario it runs in |
//! | [`run`] | the replay: the run, recorded step by step |
//! | [`report`] | the oracle's report format, and comparing two reports |

pub mod report;
pub mod run;
pub mod trace;

pub use report::{EngineReport, RemoteRow, ReplayReport, RequestRow, StepRow, compare};
pub use run::{replay, replay_file};
pub use trace::{Mode, Trace};
