//! The scenario as written: every section of a `.ron` file, parsed with
//! unknown fields denied, so a typo is an error naming the file, line,
//! column and field.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

use crate::error::Result;
use crate::files::parse_ron;
use crate::scenario::ParamValue;
pub use crate::scenario::faults::{Client, Fault};

/// The whole scenario, as written in a `.ron` file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawScenario {
    pub name: String,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Simulated seconds; requests finishing later are not counted. `inf`
    /// with a trace workload: until the trace is served.
    #[serde(
        default = "default_horizon",
        deserialize_with = "number_or_inf",
        serialize_with = "number_or_inf_out"
    )]
    pub horizon: f64,
    /// Requests reaching the gateway earlier are not counted.
    #[serde(default = "default_warmup")]
    pub warmup: f64,
    pub workload: Workload,
    pub prefill: Pool,
    pub decode: Pool,
    pub transfer: Transfer,
    pub router: Router,
    /// Policy changes at given simulated times (hot swap); the report gives
    /// observations per phase.
    #[serde(default)]
    pub phases: Vec<Phase>,
    /// Whose scheduler semantics the engines follow: docs/model.md's (the
    /// reference) or vLLM 0.33's where they differ on purpose
    /// (docs/fidelity.md).
    #[serde(default)]
    pub engine_semantics: EngineSemantics,
    /// Service-level objectives for goodput (seconds; `--slo`).
    #[serde(default)]
    pub slo: Slo,
    /// Faults at given simulated times (docs/faults.md).
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// The client's retries of a failed request.
    #[serde(default)]
    pub client: Client,
}

/// Service-level objectives: a finished request is *good* when it meets
/// every one given (`≤`, as `vllm bench serve --goodput` and DistServe
/// count); its TPOT is 0 when it produced one token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    #[serde(default)]
    pub ttft: Option<f64>,
    #[serde(default)]
    pub tpot: Option<f64>,
    #[serde(default)]
    pub e2e: Option<f64>,
}

/// The engines' scheduler semantics (docs/fidelity.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum EngineSemantics {
    /// docs/model.md as written.
    #[default]
    Reference,
    /// vLLM 0.33.0's scheduler where it differs from docs/model.md: the null
    /// block, unhashed blocks freed to the front of the free queue, duplicate
    /// cached blocks, promotion of read requests in parking order when the
    /// waiting loop reaches them, and news of finished transfers only with
    /// the next `update_from_output`.
    Vllm033,
}

fn default_seed() -> u64 {
    1
}
/// A number, or `inf` (which a `--set` tree carries as a string: JSON has
/// no infinity).
fn number_or_inf<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = f64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a number of seconds, or inf")
        }
        fn visit_f64<E>(self, x: f64) -> std::result::Result<f64, E> {
            Ok(x)
        }
        fn visit_i64<E>(self, x: i64) -> std::result::Result<f64, E> {
            Ok(x as f64)
        }
        fn visit_u64<E>(self, x: u64) -> std::result::Result<f64, E> {
            Ok(x as f64)
        }
        fn visit_str<E: serde::de::Error>(self, w: &str) -> std::result::Result<f64, E> {
            match w {
                "inf" | "+inf" | "infinity" => Ok(f64::INFINITY),
                _ => Err(E::invalid_value(serde::de::Unexpected::Str(w), &self)),
            }
        }
    }
    d.deserialize_any(V)
}

fn number_or_inf_out<S: serde::Serializer>(x: &f64, s: S) -> std::result::Result<S::Ok, S::Error> {
    if x.is_infinite() && *x > 0.0 {
        s.serialize_str("inf")
    } else {
        s.serialize_f64(*x)
    }
}

fn default_horizon() -> f64 {
    2000.0
}
fn default_warmup() -> f64 {
    200.0
}

/// The workload: synthetic multi-turn sessions (docs/model.md §3; every field
/// defaults to its reference value), or a trace to replay (`trace`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Λ: sessions per second (Poisson). Default 0.6.
    #[serde(default)]
    pub session_rate: Option<f64>,
    /// First turn's new prompt tokens: uniform over [min, max]. Default (1000, 3000).
    #[serde(default)]
    pub first_turn_tokens: Option<(f64, f64)>,
    /// Later turns' new prompt tokens: exponential with this mean. Default 500.
    #[serde(default)]
    pub later_turn_tokens_mean: Option<f64>,
    /// Output tokens: exponential with this mean, plus one. Default 200.
    #[serde(default)]
    pub output_tokens_mean: Option<f64>,
    /// p: probability that a session continues after a turn. Default 0.9.
    #[serde(default)]
    pub continue_probability: Option<f64>,
    /// Z: mean tool-call time between turns, seconds (exponential). Default 3.
    #[serde(default)]
    pub tool_time_mean: Option<f64>,
    /// Shared system prompts: each session's context starts with one of
    /// `count` prompts of `tokens` tokens, drawn by a Zipf law.
    #[serde(default)]
    pub system_prompts: Option<SystemPrompts>,
    /// Replay a trace instead of synthetic sessions.
    #[serde(default)]
    pub trace: Option<TraceSource>,
}

/// `count` distinct system prompts of `tokens` tokens; a session takes
/// prompt `k` (from 1) with probability ∝ `k^−zipf` (0: uniform).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemPrompts {
    pub count: u32,
    pub tokens: u32,
    #[serde(default = "default_zipf")]
    pub zipf: f64,
}

fn default_zipf() -> f64 {
    1.0
}

/// The formats a trace may be in (`docs/traces.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TraceFormat {
    /// Mooncake JSONL: one request per line, `hash_ids` per `block_tokens`
    /// tokens; multi-turn sessions with `session_id` and `delay`.
    Mooncake,
    /// Azure LLM inference trace CSV (2023, 2024): `TIMESTAMP`,
    /// `ContextTokens`, `GeneratedTokens`.
    Azure,
    /// pdsim's replay trace (docs/oracle.md): `requests` with `session`s.
    Pdsim,
}

/// A trace to replay, and how.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceSource {
    /// The trace file (relative to the scenario file).
    pub file: String,
    /// Its format; guessed from the content when not given.
    #[serde(default)]
    pub format: Option<TraceFormat>,
    /// Prompt tokens per hash id (Mooncake). Default 512, as in the release.
    #[serde(default = "default_block_tokens")]
    pub block_tokens: u32,
    /// Replay k× faster: arrival times and think times divided by k.
    #[serde(default = "default_one")]
    pub speedup: f64,
    /// k× the arrival rate: arrival times (first turns) divided by k, think
    /// times kept.
    #[serde(default = "default_one")]
    pub rate_scale: f64,
    /// Keep only the requests (sessions, by their first turn) that arrive
    /// within [start, end) seconds of the trace's own clock; times then
    /// count from `start`.
    #[serde(default)]
    pub window: Option<(f64, f64)>,
    /// Keep only the first N requests of the file (after the window).
    #[serde(default)]
    pub max_requests: Option<u64>,
}

impl TraceSource {
    /// `file`, read with the default options.
    pub fn file(file: impl Into<String>) -> TraceSource {
        TraceSource {
            file: file.into(),
            format: None,
            block_tokens: default_block_tokens(),
            speedup: 1.0,
            rate_scale: 1.0,
            window: None,
            max_requests: None,
        }
    }
}

fn default_block_tokens() -> u32 {
    512
}
fn default_one() -> f64 {
    1.0
}

/// One role's instances (all prefillers, or all decoders): abstract
/// (blocks, tokens per second, a linear step cost) or physical (a model on
/// GPUs, NICs in Gb/s, a roofline), or a mix (docs/hardware.md).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pool {
    pub count: u32,
    /// A model preset (`lib/models/`: `Qwen3-8B`, `Llama-3.1-8B`,
    /// `Llama-3.1-70B`, `gpt-oss-120b`, `DeepSeek-V3`) or the path of a
    /// Hugging Face `config.json`.
    #[serde(default)]
    pub model: Option<String>,
    /// A GPU preset (`lib/gpus/`: `A100-80GB`, `H100-SXM`, `H200`, `B200`,
    /// `L40S`, `MI300X`) or the path of a RON file like them.
    #[serde(default)]
    pub gpu: Option<String>,
    pub engine: EngineConfig,
    pub cost: StepCost,
    pub nic: Nic,
}

/// vLLM engine arguments, named as vLLM names them.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    pub max_num_batched_tokens: u32,
    pub max_num_seqs: u32,
    /// KV blocks (vLLM's `num_gpu_blocks_override`); derived from the model
    /// and GPU memory when not given.
    #[serde(default)]
    pub num_gpu_blocks: Option<u32>,
    pub block_size: u32,
    pub max_model_len: u32,
    #[serde(default = "default_tp")]
    pub tensor_parallel_size: u32,
    /// Default 0.92 (vLLM 0.33).
    #[serde(default)]
    pub gpu_memory_utilization: Option<f64>,
    /// `auto` (the model's dtype, the default), `bfloat16`, `fp8`, …
    #[serde(default)]
    pub kv_cache_dtype: Option<String>,
    /// `fp8`: weights quantized to 8 bits at load (vLLM's `--quantization fp8`).
    #[serde(default)]
    pub quantization: Option<String>,
    /// KV memory per GPU, bytes: skips the memory profile (as in vLLM).
    #[serde(default)]
    pub kv_cache_memory_bytes: Option<f64>,
    /// Sliding-window layers cache every token, as full attention does.
    #[serde(default)]
    pub disable_hybrid_kv_cache_manager: bool,
}

fn default_tp() -> u32 {
    1
}

/// The step-time model (docs/hardware.md): `Linear` (the default),
/// `Roofline` (needs the pool's model and GPU) or `Table` (measured).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CostKind {
    /// `c0 + max(omega + beta × kv, tokens × a)` seconds (docs/model.md §5).
    #[default]
    Linear,
    /// Per layer group, the longer of FLOPs ÷ (peak × mfu) and bytes ÷
    /// (bandwidth × mbu); all-reduces over the interconnect; an overhead.
    Roofline,
    /// The user's measured step times (`file`), interpolated.
    Table,
}

/// How long a step takes. The fields of every kind may be present (a sweep
/// may switch `kind`); only those of `kind` are used.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepCost {
    #[serde(default)]
    pub kind: CostKind,
    /// Linear: seconds per step, per scheduled token, per step for the
    /// weights, per KV token.
    #[serde(default)]
    pub c0: Option<f64>,
    #[serde(default)]
    pub a: Option<f64>,
    #[serde(default)]
    pub omega: Option<f64>,
    #[serde(default)]
    pub beta: Option<f64>,
    /// Roofline: efficiency factors (defaults in docs/hardware.md).
    #[serde(default)]
    pub mfu: Option<f64>,
    #[serde(default)]
    pub mbu: Option<f64>,
    #[serde(default)]
    pub step_overhead: Option<f64>,
    #[serde(default)]
    pub allreduce_latency: Option<f64>,
    /// Table: a CSV of `prefill_tokens,decode_requests,kv_tokens,seconds`
    /// (relative to the scenario file).
    #[serde(default)]
    pub file: Option<String>,
}

/// NIC capacity per NIC: `tokens_per_s`; or `bytes_per_s` or `gbps`, with
/// `kv_bytes_per_token` (derived from the model when the pool has one).
/// `count` NICs per pod (default one per GPU: `tensor_parallel_size`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nic {
    #[serde(default)]
    pub tokens_per_s: Option<f64>,
    #[serde(default)]
    pub bytes_per_s: Option<f64>,
    #[serde(default)]
    pub gbps: Option<f64>,
    #[serde(default)]
    pub kv_bytes_per_token: Option<f64>,
    #[serde(default)]
    pub count: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TransferMode {
    /// The decoder READs the prefiller's blocks; the prefiller holds them
    /// leased until the read completes (docs/model.md §6–§8).
    NixlPull,
    /// vLLM's `NixlPushConnector`: the decoder, at admission, registers the
    /// blocks it allocated with the prefiller (one notification); the
    /// prefiller WRITEs once it has both its finished prefill and the
    /// registration; the write done frees the lease and promotes the
    /// decoder's request.
    NixlPush,
    /// The prefiller copies its KV out, releases it, and only then does the
    /// request queue for the decoder (docs/model.md §11).
    StoreAndForward,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transfer {
    #[serde(default = "default_mode")]
    pub mode: TransferMode,
    /// x0: fixed latency before a read's flow starts, seconds.
    pub latency: f64,
    #[serde(default = "default_sharing")]
    pub sharing: SharingModel,
    /// Push mode: seconds for the decoder's registration to reach the
    /// prefiller's writer (which polls every 1 ms while it holds blocks
    /// nobody registered for).
    #[serde(default = "default_notify_latency")]
    pub notify_latency: f64,
    /// The prefiller's lease on a finished prefill's blocks.
    #[serde(default)]
    pub lease: LeaseConfig,
}

fn default_notify_latency() -> f64 {
    0.001
}

/// vLLM 0.33's KV lease (`kv_connector_extra_config["kv_lease_duration"]`):
/// granted at the prefill's finish for `duration`; the decoder heartbeats
/// every `duration / 6` from the moment the decode request reaches it, each
/// heartbeat extending the lease to at least then + `2/3 · duration`; an
/// expired lease frees the prefiller's blocks (they stay cached). vLLM
/// 0.19, the version llm-d's guide runs: `(duration: 480, heartbeats:
/// false)`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseConfig {
    #[serde(default = "default_lease_duration")]
    pub duration: f64,
    #[serde(default = "default_true")]
    pub heartbeats: bool,
    /// With push's parallel dispatch, vLLM 0.33's heartbeats name the
    /// router's request id, which the prefiller does not know, so they
    /// renew nothing (vLLM issue 53095); `true` models the fix (PR 53244).
    #[serde(default)]
    pub renew_in_parallel_dispatch: bool,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            duration: default_lease_duration(),
            heartbeats: true,
            renew_in_parallel_dispatch: false,
        }
    }
}

fn default_lease_duration() -> f64 {
    30.0
}
fn default_true() -> bool {
    true
}

fn default_mode() -> TransferMode {
    TransferMode::NixlPull
}
fn default_sharing() -> SharingModel {
    SharingModel::MaxMin
}

/// How concurrent flows divide the NICs (docs/model.md §8; computed in
/// [`crate::transfer::sharing`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SharingModel {
    /// Max-min fair (progressive filling) over both links of every flow. The default.
    #[default]
    MaxMin,
    /// Only the decoder's NIC (a flow's second link) is shared, max-min; the prefiller's NIC is ignored.
    DecoderNicOnly,
    /// Each link splits its capacity equally among its flows; a flow gets the minimum over its links; leftovers are not redistributed.
    EqualSplit,
}

/// The llm-d router, shaped like an EPP configuration: named plugins with
/// parameters, a decider, and two scheduling profiles whose entries name a
/// plugin (`plugin: "..."`) or give a script directly (`script: "..."`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Router {
    /// Named plugins the decider and profiles may refer to.
    #[serde(default)]
    pub plugins: BTreeMap<String, NamedPlugin>,
    /// Blocks per pod in the router's approximate prefix index (llm-d's
    /// approx-prefix-cache-producer); 0 turns it off.
    #[serde(default)]
    pub prefix_index_blocks: u32,
    pub decider: Plugin,
    pub decode: Profile,
    pub prefill: Profile,
    /// How a disaggregated request's two legs are sent.
    #[serde(default)]
    pub dispatch: Dispatch,
    /// The llm-d sidecar's retries of a prefill leg that failed (5xx):
    /// `--prefill-max-retries` (default 0), on the same prefiller, after
    /// `--prefill-retry-backoff` (default 0.2 s) each.
    #[serde(default)]
    pub prefill_max_retries: u32,
    #[serde(default = "default_prefill_retry_backoff")]
    pub prefill_retry_backoff: f64,
    /// Seconds until the router learns that a pod went down or came back
    /// (its readiness probe), routing to it meanwhile.
    #[serde(default = "default_detection_delay")]
    pub detection_delay: f64,
    /// What one hook call of a script may use before it is stopped with
    /// an error (docs/policies.md#limits).
    #[serde(default)]
    pub script_limits: ScriptLimits,
}

/// Bounds on one hook call of a routing script: a runaway loop or a value
/// that doubles every iteration stops with the script's error instead of
/// exhausting the machine.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScriptLimits {
    /// Operations (rhai's count: roughly one per expression evaluated).
    pub operations: u64,
    /// Bytes of any string, and of all strings within one array or map.
    pub string_bytes: usize,
    /// Items of any array or blob, nested arrays counted in.
    pub array_items: usize,
    /// Entries of any map (`state` included), nested maps counted in.
    pub map_entries: usize,
}

impl Default for ScriptLimits {
    /// Far above what a policy needs (the catalogue's largest call takes a
    /// few hundred operations and a handful of values), far below what
    /// exhausts a machine: about 2 MB per value. rhai checks a value's size
    /// each time it changes, walking it, so a value kept near its limit
    /// costs time in every call that changes it; these keep that small.
    fn default() -> ScriptLimits {
        ScriptLimits {
            operations: 1_000_000,
            string_bytes: 1 << 20,
            array_items: 1 << 16,
            map_entries: 1 << 14,
        }
    }
}

impl Router {
    /// A router of these profiles, every other setting at its default.
    pub fn with_profiles(decider: Plugin, decode: Profile, prefill: Profile) -> Router {
        Router {
            plugins: BTreeMap::new(),
            prefix_index_blocks: 0,
            decider,
            decode,
            prefill,
            dispatch: Dispatch::Serial,
            prefill_max_retries: 0,
            prefill_retry_backoff: default_prefill_retry_backoff(),
            detection_delay: default_detection_delay(),
            script_limits: ScriptLimits::default(),
        }
    }
}

fn default_prefill_retry_backoff() -> f64 {
    0.2
}
fn default_detection_delay() -> f64 {
    10.0
}

/// How a disaggregated request's prefill and decode legs are sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dispatch {
    /// The llm-d sidecar: the prefill leg, its answer, then the decode leg.
    #[default]
    Serial,
    /// vLLM's push proxy: both legs at the request's arrival, so the
    /// decoder books the prompt's blocks while the prefill is queued or
    /// running (push mode only).
    Parallel,
}

/// filters → weighted scorers → picker.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    #[serde(default)]
    pub filters: Vec<Plugin>,
    #[serde(default)]
    pub scorers: Vec<Scorer>,
    pub picker: Plugin,
}

/// A plugin defined once under `router.plugins`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedPlugin {
    pub script: String,
    #[serde(default)]
    pub params: BTreeMap<String, ParamValue>,
}

/// A use of a plugin: a named one (`plugin`), a script (`script`), or a
/// named one with its script or some parameters replaced. Parameters given
/// here are merged over the named plugin's.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plugin {
    #[serde(default)]
    pub plugin: Option<String>,
    #[serde(default)]
    pub script: String,
    #[serde(default)]
    pub params: BTreeMap<String, ParamValue>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scorer {
    #[serde(default)]
    pub plugin: Option<String>,
    #[serde(default)]
    pub script: String,
    #[serde(default = "default_weight")]
    pub weight: f64,
    #[serde(default)]
    pub params: BTreeMap<String, ParamValue>,
}

fn default_weight() -> f64 {
    1.0
}

/// At simulated time `at`, apply `set` (dotted path → value, as `--set`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    pub at: f64,
    pub set: BTreeMap<String, String>,
}

/// Parses RON text into a raw scenario; errors name file, line, column and field.
pub fn parse(text: &str, file: &Path) -> Result<RawScenario> {
    parse_ron(text, file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::REFERENCE;
    use std::path::Path;

    #[test]
    fn the_reference_scenario_parses() {
        let raw = parse(REFERENCE, Path::new("ref.ron")).unwrap();
        assert_eq!(raw.prefill.count, 2);
        assert_eq!(raw.decode.engine.max_num_seqs, 64);
    }

    #[test]
    fn a_typo_names_file_line_column_and_field() {
        let text = REFERENCE.replace("num_gpu_blocks", "num_gpu_block");
        let err = parse(&text, Path::new("x.ron")).unwrap_err().to_string();
        assert!(err.starts_with("x.ron:"), "{err}");
        assert!(err.contains("num_gpu_block"), "{err}");
        assert!(err.contains("prefill.engine"), "{err}");
        let line = text
            .lines()
            .position(|l| l.contains("num_gpu_block"))
            .unwrap()
            + 1;
        assert!(
            err.contains(&format!("x.ron:{line}:")),
            "{err} (expected line {line})"
        );
    }

    #[test]
    fn a_wrong_type_names_the_field() {
        let text = REFERENCE.replacen("max_num_seqs: 16", "max_num_seqs: \"many\"", 1);
        let err = parse(&text, Path::new("x.ron")).unwrap_err().to_string();
        assert!(err.contains("prefill.engine.max_num_seqs"), "{err}");
    }
}
