//! Scenarios: RON files → raw config (as written) → overrides (`--set`) →
//! validated [`Scenario`] the simulation uses.
//!
//! Every struct denies unknown fields, so a typo is an error naming the file,
//! line, column and field. `--set path=value` edits the raw config through a
//! JSON tree (which keeps enum names and exact f64s), then deserializes it
//! again, so an override is checked exactly like the file.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
pub use crate::sharing::SharingModel;

/// The whole scenario, as written in a `.ron` file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawScenario {
    pub name: String,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Simulated seconds; requests finishing later are not counted.
    #[serde(default = "default_horizon")]
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
    /// Whose scheduler semantics the engines follow: MODEL.md's (the
    /// reference) or vLLM 0.33's where they differ on purpose
    /// (docs/fidelity.md).
    #[serde(default)]
    pub engine_semantics: EngineSemantics,
}

/// The engines' scheduler semantics (docs/fidelity.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum EngineSemantics {
    /// MODEL.md as written.
    #[default]
    Reference,
    /// vLLM 0.33.0's scheduler where it differs from MODEL.md: the null
    /// block, unhashed blocks freed to the front of the free queue, duplicate
    /// cached blocks, promotion of read requests in parking order when the
    /// waiting loop reaches them, and news of finished transfers only with
    /// the next `update_from_output`.
    Vllm033,
}

fn default_seed() -> u64 {
    1
}
fn default_horizon() -> f64 {
    2000.0
}
fn default_warmup() -> f64 {
    200.0
}

/// The multi-turn session workload of MODEL.md §3.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Λ: sessions per second (Poisson).
    pub session_rate: f64,
    /// First turn's new prompt tokens: uniform over [min, max].
    pub first_turn_tokens: (f64, f64),
    /// Later turns' new prompt tokens: exponential with this mean.
    pub later_turn_tokens_mean: f64,
    /// Output tokens: exponential with this mean, plus one.
    pub output_tokens_mean: f64,
    /// p: probability that a session continues after a turn.
    pub continue_probability: f64,
    /// Z: mean tool-call time between turns, seconds (exponential).
    pub tool_time_mean: f64,
}

/// One role's instances (all prefillers, or all decoders).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pool {
    pub count: u32,
    pub engine: EngineConfig,
    pub cost: StepCost,
    pub nic: Nic,
}

/// vLLM engine arguments that matter to the scheduler.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    pub max_num_batched_tokens: u32,
    pub max_num_seqs: u32,
    pub num_gpu_blocks: u32,
    pub block_size: u32,
    pub max_model_len: u32,
}

/// Step cost `c0 + max(omega + beta × kv, tokens × a)` seconds (MODEL.md §5).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepCost {
    pub c0: f64,
    pub a: f64,
    pub omega: f64,
    pub beta: f64,
}

/// NIC capacity: in tokens/s, or in bytes/s with the KV bytes per token.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nic {
    #[serde(default)]
    pub tokens_per_s: Option<f64>,
    #[serde(default)]
    pub bytes_per_s: Option<f64>,
    #[serde(default)]
    pub kv_bytes_per_token: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TransferMode {
    /// The decoder READs the prefiller's blocks; the prefiller holds them
    /// leased until the read completes (MODEL.md §6–§8).
    NixlPull,
    /// The prefiller copies its KV out, releases it, and only then does the
    /// request queue for the decoder (MODEL.md §11).
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
}

fn default_mode() -> TransferMode {
    TransferMode::NixlPull
}
fn default_sharing() -> SharingModel {
    SharingModel::MaxMin
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

/// A script parameter. Integers stay integers; `inf` (a RON float, or the
/// string "inf" on the command line) is an infinite float.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    List(Vec<ParamValue>),
    Map(BTreeMap<String, ParamValue>),
}

impl Serialize for ParamValue {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            ParamValue::Int(v) => s.serialize_i64(*v),
            // JSON (used for overrides) has no infinity: spell it.
            ParamValue::Float(v) if v.is_infinite() => {
                s.serialize_str(if *v > 0.0 { "inf" } else { "-inf" })
            }
            ParamValue::Float(v) => s.serialize_f64(*v),
            ParamValue::Bool(v) => s.serialize_bool(*v),
            ParamValue::Str(v) => s.serialize_str(v),
            ParamValue::List(v) => v.serialize(s),
            ParamValue::Map(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ParamValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ParamValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number, inf, a bool, a string, a list or a map")
            }
            fn visit_i64<E>(self, v: i64) -> std::result::Result<ParamValue, E> {
                Ok(ParamValue::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<ParamValue, E> {
                i64::try_from(v)
                    .map(ParamValue::Int)
                    .map_err(|_| E::custom("integer too large"))
            }
            fn visit_f64<E>(self, v: f64) -> std::result::Result<ParamValue, E> {
                Ok(ParamValue::Float(v))
            }
            fn visit_f32<E>(self, v: f32) -> std::result::Result<ParamValue, E> {
                // RON hands out f32 only when the value is exactly an f32.
                Ok(ParamValue::Float(v as f64))
            }
            fn visit_bool<E>(self, v: bool) -> std::result::Result<ParamValue, E> {
                Ok(ParamValue::Bool(v))
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<ParamValue, E> {
                Ok(match v {
                    "inf" | "+inf" | "infinity" => ParamValue::Float(f64::INFINITY),
                    "-inf" | "-infinity" => ParamValue::Float(f64::NEG_INFINITY),
                    _ => ParamValue::Str(v.to_string()),
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<ParamValue, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = a.next_element()? {
                    out.push(v);
                }
                Ok(ParamValue::List(out))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<ParamValue, A::Error> {
                let mut out = BTreeMap::new();
                while let Some((k, v)) = a.next_entry::<String, ParamValue>()? {
                    out.insert(k, v);
                }
                Ok(ParamValue::Map(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A validated scenario, with script paths resolved and NIC rates in tokens/s.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub raw: RawScenario,
    /// Where the file was read from (for messages).
    pub source: PathBuf,
    /// Shared rhai modules (`lib/` beside the scenario's folder), if any.
    pub lib_dir: Option<PathBuf>,
    pub prefill_nic_tokens_per_s: f64,
    pub decode_nic_tokens_per_s: f64,
}

fn ron_options() -> ron::Options {
    ron::Options::default().with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME)
}

/// Parses RON text into a raw scenario; errors name file, line, column and field.
pub fn parse(text: &str, file: &Path) -> Result<RawScenario> {
    let mut de = ron::Deserializer::from_str_with_options(text, &ron_options())
        .map_err(|e| Error::new(format!("{}:{e}", file.display())))?;
    let raw: RawScenario = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let spanned = de.span_error(e.into_inner());
        let pos = spanned.span.start;
        Error::new(format!(
            "{}:{}:{}: in field `{}`: {}",
            file.display(),
            pos.line,
            pos.col,
            path,
            spanned.code
        ))
    })?;
    de.end()
        .map_err(|e| Error::new(format!("{}: {}", file.display(), de.span_error(e))))?;
    Ok(raw)
}

/// Reads, overrides, resolves and validates a scenario file.
pub fn load(path: &Path, overrides: &[String]) -> Result<Scenario> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::new(format!("cannot read scenario {}: {e}", path.display())))?;
    let mut raw = parse(&text, path)?;
    resolve_script_paths(&mut raw, path.parent().unwrap_or(Path::new(".")));
    for o in overrides {
        raw = apply_override(&raw, o)?;
    }
    resolve(raw, path)
}

/// Script paths written in a file are relative to that file's folder.
fn resolve_script_paths(raw: &mut RawScenario, dir: &Path) {
    let fix = |s: &mut String| {
        let p = Path::new(s.as_str());
        if !s.is_empty() && p.is_relative() {
            *s = dir.join(p).to_string_lossy().into_owned();
        }
    };
    let r = &mut raw.router;
    r.plugins.values_mut().for_each(|p| fix(&mut p.script));
    fix(&mut r.decider.script);
    for profile in [&mut r.decode, &mut r.prefill] {
        profile.filters.iter_mut().for_each(|f| fix(&mut f.script));
        profile.scorers.iter_mut().for_each(|f| fix(&mut f.script));
        fix(&mut profile.picker.script);
    }
    // A phase that swaps a script names it relative to this file too.
    for phase in &mut raw.phases {
        for (path, value) in phase.set.iter_mut() {
            if path.ends_with("script") {
                fix(value);
            }
        }
    }
}

/// The router with every plugin reference replaced by its script and
/// parameters (entry parameters merged over the named plugin's).
pub fn expand_plugins(router: &Router) -> Result<Router> {
    let mut out = router.clone();
    let expand = |what: &str,
                  plugin: &Option<String>,
                  script: &mut String,
                  params: &mut BTreeMap<String, ParamValue>|
     -> Result<()> {
        if let Some(name) = plugin {
            let named = router.plugins.get(name).ok_or_else(|| {
                let known: Vec<String> = router.plugins.keys().map(|k| format!("`{k}`")).collect();
                Error::new(format!(
                    "{what} refers to plugin `{name}`, which router.plugins does not define (it defines {})",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ))
            })?;
            if script.is_empty() {
                *script = named.script.clone();
            }
            let mut merged = named.params.clone();
            merged.extend(std::mem::take(params));
            *params = merged;
        }
        if script.is_empty() {
            return Err(Error::new(format!(
                "{what} names neither a `script` nor a `plugin`"
            )));
        }
        Ok(())
    };
    let d = &mut out.decider;
    expand("router.decider", &d.plugin, &mut d.script, &mut d.params)?;
    for (role, profile) in [("decode", &mut out.decode), ("prefill", &mut out.prefill)] {
        for (i, f) in profile.filters.iter_mut().enumerate() {
            expand(
                &format!("router.{role}.filters.{i}"),
                &f.plugin,
                &mut f.script,
                &mut f.params,
            )?;
        }
        for (i, s) in profile.scorers.iter_mut().enumerate() {
            expand(
                &format!("router.{role}.scorers.{i}"),
                &s.plugin,
                &mut s.script,
                &mut s.params,
            )?;
        }
        let p = &mut profile.picker;
        expand(
            &format!("router.{role}.picker"),
            &p.plugin,
            &mut p.script,
            &mut p.params,
        )?;
    }
    Ok(out)
}

/// Applies one `path=value` override. The value is read as JSON when it
/// parses as JSON (numbers, booleans, quoted strings, lists), as ±infinity
/// when it says `inf`, and as a bare string otherwise (script paths, enum
/// variant names). A `script` value is a path relative to the current
/// directory.
pub fn apply_override(raw: &RawScenario, assignment: &str) -> Result<RawScenario> {
    let (path, value) = assignment.split_once('=').ok_or_else(|| {
        Error::new(format!(
            "--set {assignment}: expected PATH=VALUE, e.g. decode.engine.num_gpu_blocks=2000"
        ))
    })?;
    let mut tree = serde_json::to_value(raw).expect("a scenario always serializes");
    let new_value = parse_override_value(path, value);
    set_path(&mut tree, path, new_value)
        .map_err(|m| Error::new(format!("--set {assignment}: {m}")))?;
    serde_path_to_error::deserialize(tree).map_err(|e| {
        let path = e.path().to_string();
        Error::new(format!(
            "--set {assignment}: in field `{path}`: {}",
            e.into_inner()
        ))
    })
}

fn parse_override_value(path: &str, value: &str) -> serde_json::Value {
    let v = value.trim();
    if path == "script" || path.ends_with(".script") {
        let p = Path::new(v);
        let abs = if p.is_relative() {
            std::env::current_dir()
                .map(|d| d.join(p))
                .unwrap_or(p.to_path_buf())
        } else {
            p.to_path_buf()
        };
        return serde_json::Value::String(abs.to_string_lossy().into_owned());
    }
    match v {
        "inf" | "+inf" | "infinity" => return serde_json::Value::String("inf".into()),
        "-inf" | "-infinity" => return serde_json::Value::String("-inf".into()),
        _ => {}
    }
    serde_json::from_str(v).unwrap_or_else(|_| serde_json::Value::String(v.to_string()))
}

/// Walks `tree` along a dotted path (list items by index) and replaces the
/// value there. Only script parameter maps may gain new keys.
fn set_path(
    tree: &mut serde_json::Value,
    path: &str,
    value: serde_json::Value,
) -> std::result::Result<(), String> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut node = tree;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let in_params = i > 0 && parts[i - 1] == "params";
        node = match node {
            serde_json::Value::Object(map) => {
                if !map.contains_key(*part) {
                    if !(in_params || is_params_map(&parts[..i])) {
                        let known: Vec<&String> = map.keys().collect();
                        return Err(format!(
                            "no field `{part}` {}; the fields there are {}",
                            if i == 0 {
                                "at the top level".to_string()
                            } else {
                                format!("in `{}`", parts[..i].join("."))
                            },
                            known
                                .iter()
                                .map(|k| format!("`{k}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    }
                    if !last {
                        map.insert(
                            part.to_string(),
                            serde_json::Value::Object(Default::default()),
                        );
                    }
                }
                if last {
                    map.insert(part.to_string(), value);
                    return Ok(());
                }
                map.get_mut(*part).expect("inserted above")
            }
            serde_json::Value::Array(items) => {
                let idx: usize = part.parse().map_err(|_| {
                    format!(
                        "`{}` is a list: expected an index, found `{part}`",
                        parts[..i].join(".")
                    )
                })?;
                let len = items.len();
                let item = items.get_mut(idx).ok_or_else(|| {
                    format!("`{}` has {len} items: no index {idx}", parts[..i].join("."))
                })?;
                if last {
                    *item = value;
                    return Ok(());
                }
                item
            }
            _ => {
                return Err(format!(
                    "`{}` is a value, not a section",
                    parts[..i].join(".")
                ));
            }
        };
    }
    Err("empty path".into())
}

fn is_params_map(parts_before: &[&str]) -> bool {
    parts_before.last() == Some(&"params")
}

/// Checks every number a run depends on; refuses impossible scenarios with
/// a sentence saying why.
pub fn resolve(raw: RawScenario, source: &Path) -> Result<Scenario> {
    let mut problems = Vec::new();
    let mut need = |ok: bool, msg: String| {
        if !ok {
            problems.push(msg);
        }
    };
    let finite_pos = |x: f64| x.is_finite() && x > 0.0;
    let finite_nonneg = |x: f64| x.is_finite() && x >= 0.0;

    need(
        finite_pos(raw.horizon),
        format!(
            "horizon must be a positive number of seconds, got {}",
            raw.horizon
        ),
    );
    need(
        finite_nonneg(raw.warmup) && raw.warmup < raw.horizon,
        format!(
            "warmup must be at least 0 and below the horizon ({}), got {}",
            raw.horizon, raw.warmup
        ),
    );
    let w = &raw.workload;
    need(
        finite_pos(w.session_rate),
        format!(
            "workload.session_rate must be positive, got {}",
            w.session_rate
        ),
    );
    let (lo, hi) = w.first_turn_tokens;
    need(
        lo.is_finite() && hi.is_finite() && lo >= 0.0 && lo <= hi,
        format!(
            "workload.first_turn_tokens must be (min, max) with 0 <= min <= max, got ({lo}, {hi})"
        ),
    );
    need(
        finite_pos(w.later_turn_tokens_mean),
        format!(
            "workload.later_turn_tokens_mean must be positive, got {}",
            w.later_turn_tokens_mean
        ),
    );
    need(
        finite_pos(w.output_tokens_mean),
        format!(
            "workload.output_tokens_mean must be positive, got {}",
            w.output_tokens_mean
        ),
    );
    need(
        (0.0..=1.0).contains(&w.continue_probability),
        format!(
            "workload.continue_probability must be within [0, 1], got {}",
            w.continue_probability
        ),
    );
    need(
        finite_pos(w.tool_time_mean),
        format!(
            "workload.tool_time_mean must be positive, got {}",
            w.tool_time_mean
        ),
    );
    let mut nic_rates = [0.0; 2];
    for (k, (role, pool)) in [("prefill", &raw.prefill), ("decode", &raw.decode)]
        .into_iter()
        .enumerate()
    {
        let e = &pool.engine;
        need(pool.count > 0, format!("{role}.count must be at least 1"));
        need(
            e.block_size > 0,
            format!("{role}.engine.block_size must be at least 1"),
        );
        need(
            e.max_num_seqs > 0,
            format!("{role}.engine.max_num_seqs must be at least 1"),
        );
        need(
            e.max_num_batched_tokens > 0,
            format!("{role}.engine.max_num_batched_tokens must be at least 1"),
        );
        need(
            e.max_model_len > 1,
            format!("{role}.engine.max_model_len must be at least 2"),
        );
        let capacity = e.num_gpu_blocks as u64 * e.block_size as u64;
        need(
            capacity >= e.max_model_len as u64,
            format!(
                "{role}.engine: the KV pool ({} blocks × {} tokens = {capacity} tokens) is smaller than \
                 max_model_len ({}); vLLM refuses to start such an engine",
                e.num_gpu_blocks, e.block_size, e.max_model_len
            ),
        );
        let c = &pool.cost;
        for (name, v) in [
            ("c0", c.c0),
            ("a", c.a),
            ("omega", c.omega),
            ("beta", c.beta),
        ] {
            need(
                finite_nonneg(v),
                format!("{role}.cost.{name} must be a finite number >= 0, got {v}"),
            );
        }
        need(
            c.c0 > 0.0 || c.a > 0.0 || c.omega > 0.0,
            format!("{role}.cost: a step must take time (c0, a or omega above 0)"),
        );
        match (
            pool.nic.tokens_per_s,
            pool.nic.bytes_per_s,
            pool.nic.kv_bytes_per_token,
        ) {
            (Some(t), None, None) => {
                need(
                    finite_pos(t),
                    format!("{role}.nic.tokens_per_s must be positive, got {t}"),
                );
                nic_rates[k] = t;
            }
            (None, Some(b), Some(per)) => {
                need(
                    finite_pos(b),
                    format!("{role}.nic.bytes_per_s must be positive, got {b}"),
                );
                need(
                    finite_pos(per),
                    format!("{role}.nic.kv_bytes_per_token must be positive, got {per}"),
                );
                nic_rates[k] = b / per;
            }
            _ => need(
                false,
                format!(
                    "{role}.nic: give either tokens_per_s, or bytes_per_s together with kv_bytes_per_token"
                ),
            ),
        }
    }
    need(
        raw.prefill.engine.max_model_len == raw.decode.engine.max_model_len,
        format!(
            "prefill and decode must serve the same max_model_len (got {} and {})",
            raw.prefill.engine.max_model_len, raw.decode.engine.max_model_len
        ),
    );
    need(
        finite_nonneg(raw.transfer.latency),
        format!(
            "transfer.latency must be a finite number >= 0, got {}",
            raw.transfer.latency
        ),
    );
    for (name, profile) in [
        ("decode", &raw.router.decode),
        ("prefill", &raw.router.prefill),
    ] {
        for (i, s) in profile.scorers.iter().enumerate() {
            need(
                s.weight.is_finite(),
                format!(
                    "router.{name}.scorers.{i}.weight must be finite, got {}",
                    s.weight
                ),
            );
        }
    }
    if let Err(e) = expand_plugins(&raw.router) {
        need(false, e.to_string());
    }
    let mut last_at = 0.0;
    for (i, p) in raw.phases.iter().enumerate() {
        need(
            p.at.is_finite() && p.at >= last_at,
            format!(
                "phases.{i}.at must be finite and not before the previous phase, got {}",
                p.at
            ),
        );
        last_at = p.at;
        for (path, value) in &p.set {
            if !(path.starts_with("router.") || path.starts_with("workload.")) {
                need(
                    false,
                    format!(
                        "phases.{i}: `{path}` cannot change during a run (a phase may change router.* and workload.*)"
                    ),
                );
                continue;
            }
            if let Err(e) = apply_override(&raw, &format!("{path}={value}")) {
                need(false, format!("phases.{i}: {e}"));
            }
        }
    }
    if !problems.is_empty() {
        return Err(Error::new(format!(
            "{}: scenario refused:\n  - {}",
            source.display(),
            problems.join("\n  - ")
        )));
    }
    // Shared script modules: `lib/` beside the scenario's folder, else beside
    // the folder of the scripts it uses, else in the current directory.
    let scenario_dir = source.parent().unwrap_or(Path::new("."));
    let script_dir = Path::new(&raw.router.decider.script)
        .parent()
        .map(Path::to_path_buf);
    let lib_dir = [
        Some(scenario_dir.join("../lib")),
        script_dir.map(|d| d.join("../lib")),
        Some("lib".into()),
    ]
    .into_iter()
    .flatten()
    .find(|d| d.is_dir());
    Ok(Scenario {
        lib_dir,
        raw,
        source: source.to_path_buf(),
        prefill_nic_tokens_per_s: nic_rates[0],
        decode_nic_tokens_per_s: nic_rates[1],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> &'static str {
        include_str!("../scenarios/llmd_nixl_pull.ron")
    }

    #[test]
    fn the_reference_scenario_parses() {
        let raw = parse(sample(), Path::new("ref.ron")).unwrap();
        assert_eq!(raw.prefill.count, 2);
        assert_eq!(raw.decode.engine.max_num_seqs, 64);
    }

    #[test]
    fn a_typo_names_file_line_column_and_field() {
        let text = sample().replace("num_gpu_blocks", "num_gpu_block");
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
        let text = sample().replacen("max_num_seqs: 16", "max_num_seqs: \"many\"", 1);
        let err = parse(&text, Path::new("x.ron")).unwrap_err().to_string();
        assert!(err.contains("prefill.engine.max_num_seqs"), "{err}");
    }

    #[test]
    fn overrides_reach_nested_fields_params_and_infinity() {
        let raw = parse(sample(), Path::new("ref.ron")).unwrap();
        let raw = apply_override(&raw, "decode.engine.num_gpu_blocks=2000").unwrap();
        assert_eq!(raw.decode.engine.num_gpu_blocks, 2000);
        let raw = apply_override(&raw, "router.decider.params.non_cached_tokens=inf").unwrap();
        assert_eq!(
            raw.router.decider.params["non_cached_tokens"],
            ParamValue::Float(f64::INFINITY)
        );
        let raw = apply_override(&raw, "transfer.mode=StoreAndForward").unwrap();
        assert_eq!(raw.transfer.mode, TransferMode::StoreAndForward);
        let raw = apply_override(&raw, "workload.session_rate=1.2").unwrap();
        assert_eq!(raw.workload.session_rate, 1.2);
        let raw = apply_override(&raw, "router.decode.scorers.0.weight=2.5").unwrap();
        assert_eq!(raw.router.decode.scorers[0].weight, 2.5);
    }

    #[test]
    fn a_bad_override_says_what_is_wrong() {
        let raw = parse(sample(), Path::new("ref.ron")).unwrap();
        let err = apply_override(&raw, "decode.engine.num_gpu_blokcs=5")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no field `num_gpu_blokcs`") && err.contains("num_gpu_blocks"),
            "{err}"
        );
        let err = apply_override(&raw, "decode.engine.num_gpu_blocks=lots")
            .unwrap_err()
            .to_string();
        assert!(err.contains("decode.engine.num_gpu_blocks"), "{err}");
        let err = apply_override(&raw, "seed").unwrap_err().to_string();
        assert!(err.contains("PATH=VALUE"), "{err}");
    }

    #[test]
    fn impossible_scenarios_are_refused_with_a_reason() {
        let raw = parse(sample(), Path::new("ref.ron")).unwrap();
        let small = apply_override(&raw, "decode.engine.num_gpu_blocks=100").unwrap();
        let err = resolve(small, Path::new("s.ron")).unwrap_err().to_string();
        assert!(err.contains("smaller than max_model_len"), "{err}");
        let neg = apply_override(&raw, "workload.session_rate=-1").unwrap();
        let err = resolve(neg, Path::new("s.ron")).unwrap_err().to_string();
        assert!(err.contains("session_rate must be positive"), "{err}");
        let zero = apply_override(&raw, "prefill.count=0").unwrap();
        let err = resolve(zero, Path::new("s.ron")).unwrap_err().to_string();
        assert!(err.contains("prefill.count must be at least 1"), "{err}");
        let err = apply_override(&raw, "decode.count=-2")
            .unwrap_err()
            .to_string();
        assert!(err.contains("decode.count"), "{err}");
    }
}
