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

use bevy_ecs::prelude::*;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::gateway::RouterMode;
use crate::policy::Role;
use crate::request::{Request, Status};
use crate::scenario::{self, Scenario};
use crate::sim::{Clock, EngineIndex, FinishedRequests, Sim, SimSystems, StepRecorder};
use crate::workload::TraceRequest;

/// Engine keys of a trace's `config` (all required; `prefill` and `decode`
/// may override any of them in pd mode).
const ENGINE_KEYS: [&str; 9] = [
    "block_size",
    "num_gpu_blocks",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
    "c0",
    "a",
    "omega",
    "beta",
];

/// A trace: `config` and `requests` (docs/oracle.md, "Trace format").
#[derive(Debug, Clone, Deserialize)]
pub struct Trace {
    pub config: serde_json::Map<String, Value>,
    pub requests: Vec<TraceEntry>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TraceEntry {
    pub id: String,
    pub arrival_time: f64,
    pub prompt_len: u32,
    pub output_len: u32,
    #[serde(default)]
    pub session: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Single,
    Pd,
}

impl Trace {
    pub fn load(path: &Path) -> Result<Trace> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::new(format!("cannot read trace {}: {e}", path.display())))?;
        serde_json::from_str(&text)
            .map_err(|e| Error::new(format!("{}: not a trace: {e}", path.display())))
    }

    pub fn mode(&self) -> Result<Mode> {
        match self.config.get("mode").and_then(Value::as_str) {
            Some("single") => Ok(Mode::Single),
            Some("pd") => Ok(Mode::Pd),
            other => Err(Error::new(format!(
                "config.mode must be \"single\" or \"pd\", got {other:?}"
            ))),
        }
    }

    /// The engine keys for one role, overrides applied.
    fn engine(&self, role: Option<&str>) -> Result<serde_json::Map<String, Value>> {
        let mut cfg = serde_json::Map::new();
        for k in ENGINE_KEYS {
            let v = self
                .config
                .get(k)
                .ok_or_else(|| Error::new(format!("config.{k} is required")))?;
            cfg.insert(k.to_string(), v.clone());
        }
        if let Some(role) = role
            && let Some(over) = self.config.get(role)
        {
            let over = over
                .as_object()
                .ok_or_else(|| Error::new(format!("config.{role} must be an object")))?;
            for (k, v) in over {
                if !ENGINE_KEYS.contains(&k.as_str()) {
                    return Err(Error::new(format!(
                        "config.{role}.{k}: not an engine key ({})",
                        ENGINE_KEYS.join(", ")
                    )));
                }
                cfg.insert(k.clone(), v.clone());
            }
        }
        Ok(cfg)
    }

    fn number(&self, key: &str) -> Result<f64> {
        self.config
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| Error::new(format!("config.{key} (a number) is required in pd mode")))
    }

    /// The scenario this trace runs in, with `--set` overrides applied.
    pub fn scenario(&self, source: &Path, overrides: &[String]) -> Result<Scenario> {
        let mode = self.mode()?;
        let (p, d) = match mode {
            Mode::Single => (self.engine(None)?, self.engine(None)?),
            Mode::Pd => (self.engine(Some("prefill"))?, self.engine(Some("decode"))?),
        };
        let (x0, nic) = match mode {
            Mode::Single => (0.0, 1.0),
            Mode::Pd => (self.number("x0")?, self.number("nic_tokens_per_s")?),
        };
        let pool = |e: &serde_json::Map<String, Value>| {
            json!({
                "count": 1,
                "engine": {
                    "max_num_batched_tokens": e["max_num_batched_tokens"],
                    "max_num_seqs": e["max_num_seqs"],
                    "num_gpu_blocks": e["num_gpu_blocks"],
                    "block_size": e["block_size"],
                    "max_model_len": e["max_model_len"],
                },
                "cost": {"c0": e["c0"], "a": e["a"], "omega": e["omega"], "beta": e["beta"]},
                "nic": {"tokens_per_s": nic},
            })
        };
        // The router is never consulted (RouterMode::Direct).
        let unused = json!({"script": "unused-in-replay.rhai"});
        let tree = json!({
            "name": format!("replay of {}", source.display()),
            "seed": 1,
            "horizon": 1e12,
            "warmup": 0.0,
            "engine_semantics": "Vllm033",
            "workload": {
                "session_rate": 1.0,
                "first_turn_tokens": [1.0, 1.0],
                "later_turn_tokens_mean": 1.0,
                "output_tokens_mean": 1.0,
                "continue_probability": 0.0,
                "tool_time_mean": 1.0,
            },
            "prefill": pool(&p),
            "decode": pool(&d),
            "transfer": {"mode": "NixlPull", "latency": x0, "sharing": "MaxMin"},
            "router": {
                "decider": unused,
                "decode": {"picker": unused},
                "prefill": {"picker": unused},
            },
        });
        let mut raw: scenario::RawScenario = serde_path_to_error::deserialize(tree)
            .map_err(|e| Error::new(format!("{}: config.{e}", source.display())))?;
        for o in overrides {
            raw = scenario::apply_override(&raw, o)?;
        }
        scenario::resolve(raw, source)
    }

    /// The trace as pdsim requests: sessions become streams; in pd mode every
    /// request is prefilled remotely.
    pub fn requests(&self) -> Result<Vec<TraceRequest>> {
        let remote = self.mode()? == Mode::Pd;
        let mut streams: HashMap<&str, u64> = HashMap::new();
        let mut ids: HashMap<&str, ()> = HashMap::new();
        let mut out = Vec::with_capacity(self.requests.len());
        for r in &self.requests {
            if ids.insert(r.id.as_str(), ()).is_some() {
                return Err(Error::new(format!("request id {:?} appears twice", r.id)));
            }
            if !(r.arrival_time.is_finite() && r.arrival_time >= 0.0) {
                return Err(Error::new(format!(
                    "request {:?}: arrival_time must be a finite number >= 0",
                    r.id
                )));
            }
            if r.prompt_len == 0 || r.output_len == 0 {
                return Err(Error::new(format!(
                    "request {:?}: prompt_len and output_len must be at least 1",
                    r.id
                )));
            }
            let stream = r.session.as_deref().map(|s| {
                let n = streams.len() as u64;
                *streams.entry(s).or_insert(n)
            });
            out.push(TraceRequest {
                name: r.id.clone(),
                arrival: r.arrival_time,
                prompt: r.prompt_len,
                output: r.output_len,
                stream,
                remote,
            });
        }
        Ok(out)
    }
}

/// A step's entry: (request, tokens, tokens computed before the step).
type Scheduled = (u64, u32, u32);

/// What the replay observes beside the step recorder: per formed step, each
/// scheduled request's computed tokens before the step; when each remote
/// request was parked.
#[derive(Resource, Default)]
struct ReplayLog {
    generation: HashMap<Entity, u64>,
    /// Steps in formation order.
    formed: Vec<(Entity, Vec<Scheduled>)>,
    parked: HashMap<u64, f64>,
}

fn observe_replay(
    clock: Res<Clock>,
    index: Res<EngineIndex>,
    engines: Query<&Engine>,
    reqs: Query<&Request>,
    mut log: ResMut<ReplayLog>,
) {
    for &e in index.prefill.iter().chain(&index.decode) {
        let engine = engines.get(e).expect("engine");
        let seen = log.generation.insert(e, engine.generation);
        if seen.unwrap_or(0) == engine.generation || engine.is_idle() {
            continue;
        }
        let entries = engine
            .step
            .iter()
            .map(|&(id, n)| {
                let r = reqs.get(id).expect("scheduled request");
                (r.id, n, r.computed)
            })
            .collect();
        log.formed.push((e, entries));
    }
    for r in &reqs {
        if r.status == Status::Parked && !log.parked.contains_key(&r.id) {
            log.parked.insert(r.id, clock.now);
        }
    }
}

/// One engine's step, as the oracle reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    pub step: usize,
    pub start: f64,
    pub end: f64,
    pub scheduled: Vec<(String, u32)>,
    pub preempted: Vec<String>,
    pub kv_blocks_held: u32,
}

/// One request on one engine, as the oracle reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRow {
    pub id: String,
    pub arrival_time: f64,
    pub first_scheduled_step: Option<usize>,
    pub prefix_hit: Option<u32>,
    pub first_token_step: Option<usize>,
    pub first_token_time: Option<f64>,
    pub finish_step: Option<usize>,
    pub finish_time: Option<f64>,
    pub preemptions: u32,
    /// Decoder, pd mode.
    pub remote: Option<RemoteRow>,
}

/// A decode leg's read (pd mode): parked by the `schedule()` at
/// `parked_time`, `remote_tokens` read from `read_start = parked_time + x0`
/// until `read_done`.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteRow {
    pub parked_time: f64,
    pub remote_tokens: u32,
    pub read_start: f64,
    pub read_done: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EngineReport {
    pub requests: Vec<RequestRow>,
    pub steps: Vec<StepRow>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    pub mode: Mode,
    /// Single mode: the engine; pd mode: the decoder.
    pub decode: EngineReport,
    /// pd mode: the prefiller.
    pub prefill: Option<EngineReport>,
    /// The read latency (pd mode).
    pub x0: f64,
}

/// Replays a trace file (with `--set` overrides on the scenario it builds).
pub fn replay_file(path: &Path, overrides: &[String]) -> Result<ReplayReport> {
    let trace = Trace::load(path)?;
    replay(&trace, path, overrides)
}

pub fn replay(trace: &Trace, source: &Path, overrides: &[String]) -> Result<ReplayReport> {
    let mode = trace.mode()?;
    let sc = trace.scenario(source, overrides)?;
    let requests = trace.requests()?;
    let names: Vec<String> = requests.iter().map(|r| r.name.clone()).collect();
    let arrivals: Vec<f64> = requests.iter().map(|r| r.arrival).collect();
    let prompts: Vec<u32> = requests.iter().map(|r| r.prompt).collect();
    let mut sim = Sim::with_trace(&sc, RouterMode::Direct, requests)?;
    sim.record();
    sim.world.insert_resource(ReplayLog::default());
    sim.add_systems(observe_replay.after(SimSystems::Observe));
    sim.run()?;
    let index = sim.world.resource::<EngineIndex>().clone();
    let finished = sim
        .world
        .remove_resource::<FinishedRequests>()
        .expect("recording")
        .0;
    let recorded = sim
        .world
        .remove_resource::<StepRecorder>()
        .expect("recording")
        .steps;
    let log = sim
        .world
        .remove_resource::<ReplayLog>()
        .expect("replay log");
    if recorded.len() != log.formed.len() {
        return Err(Error::new(format!(
            "internal: {} steps recorded, {} observed",
            recorded.len(),
            log.formed.len()
        )));
    }
    let finished: HashMap<u64, Request> = finished.into_iter().map(|r| (r.id, r)).collect();
    let name = |id: u64| names[id as usize].clone();
    let by_name: HashMap<&str, u64> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i as u64))
        .collect();

    // Per engine: its steps, and per step the computed tokens before it.
    let mut per_engine: HashMap<Entity, Vec<(StepRow, Vec<u32>)>> = HashMap::new();
    for (rec, (e, entries)) in recorded.iter().zip(&log.formed) {
        debug_assert_eq!(rec.engine, *e);
        debug_assert!(
            rec.scheduled
                .iter()
                .zip(entries)
                .all(|(&(a, n), &(b, m, _))| a == b && n == m)
        );
        let steps = per_engine.entry(rec.engine).or_default();
        let row = StepRow {
            step: steps.len(),
            start: rec.start,
            end: rec.end,
            scheduled: rec.scheduled.iter().map(|&(id, n)| (name(id), n)).collect(),
            preempted: rec.preempted.iter().map(|&id| name(id)).collect(),
            kv_blocks_held: rec.kv_blocks_held,
        };
        steps.push((row, entries.iter().map(|e| e.2).collect()));
    }
    let x0 = sc.raw.transfer.latency;
    let empty = Vec::new();
    let engine_report = |e: Entity, role: Role| -> EngineReport {
        let steps = per_engine.get(&e).unwrap_or(&empty);
        let order: Vec<u64> = match (mode, role) {
            // Requests reach this engine at their trace arrival, in trace order.
            (Mode::Single, _) | (Mode::Pd, Role::Prefill) => (0..names.len() as u64).collect(),
            // The decoder gets a request when the prefiller answers: those
            // that finished, or that it scheduled or parked.
            (Mode::Pd, Role::Decode) => {
                let mut ids: Vec<u64> = finished.keys().copied().collect();
                ids.extend(log.parked.keys().copied());
                for (s, _) in steps {
                    ids.extend(s.scheduled.iter().map(|(n, _)| by_name[n.as_str()]));
                }
                ids.sort_unstable();
                ids.dedup();
                ids
            }
        };
        let prefiller = mode == Mode::Pd && role == Role::Prefill;
        let requests = request_rows(
            &order,
            &names,
            &prompts,
            &arrivals,
            steps,
            mode == Mode::Pd && role == Role::Decode,
            prefiller,
            &finished,
            &log,
            x0,
        );
        EngineReport {
            requests,
            steps: steps.iter().map(|(s, _)| s.clone()).collect(),
        }
    };
    let decode = engine_report(index.decode[0], Role::Decode);
    let prefill = (mode == Mode::Pd).then(|| engine_report(index.prefill[0], Role::Prefill));
    let mut report = ReplayReport {
        mode,
        decode,
        prefill,
        x0,
    };
    if let Some(p) = &report.prefill {
        // As the oracle submits decode legs: when their prefill finished, in
        // the order the prefiller's step listed them.
        let key = |id: &str| {
            p.requests
                .iter()
                .find(|r| r.id == id)
                .and_then(|r| {
                    let s = r.finish_step?;
                    let pos = p.steps[s].scheduled.iter().position(|x| x.0 == id)?;
                    Some((r.finish_time?, s, pos))
                })
                .unwrap_or((f64::INFINITY, usize::MAX, usize::MAX))
        };
        report.decode.requests.sort_by(|a, b| {
            let (ka, kb) = (key(&a.id), key(&b.id));
            ka.0.total_cmp(&kb.0)
                .then(ka.1.cmp(&kb.1))
                .then(ka.2.cmp(&kb.2))
        });
    }
    Ok(report)
}

/// The request rows of one engine, in `order`, from its steps (one pass).
#[allow(clippy::too_many_arguments)]
fn request_rows(
    order: &[u64],
    names: &[String],
    prompts: &[u32],
    arrivals: &[f64],
    steps: &[(StepRow, Vec<u32>)],
    decoder_of_pd: bool,
    prefiller: bool,
    finished: &HashMap<u64, Request>,
    log: &ReplayLog,
    x0: f64,
) -> Vec<RequestRow> {
    let mut rows: Vec<RequestRow> = order
        .iter()
        .map(|&id| RequestRow {
            id: names[id as usize].clone(),
            arrival_time: arrivals[id as usize],
            first_scheduled_step: None,
            prefix_hit: None,
            first_token_step: None,
            first_token_time: None,
            finish_step: None,
            finish_time: None,
            preemptions: 0,
            remote: None,
        })
        .collect();
    let at: HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(k, &id)| (names[id as usize].as_str(), k))
        .collect();
    for (i, (s, computed)) in steps.iter().enumerate() {
        for p in &s.preempted {
            if let Some(&k) = at.get(p.as_str()) {
                rows[k].preemptions += 1;
            }
        }
        for ((name, n), &before) in s.scheduled.iter().zip(computed) {
            let Some(&k) = at.get(name.as_str()) else {
                continue;
            };
            let prompt = prompts[order[k] as usize];
            let row = &mut rows[k];
            if row.first_scheduled_step.is_none() {
                row.first_scheduled_step = Some(i);
                row.prefix_hit = Some(before);
            }
            // Before its first token a request knows only its prompt: the
            // step that completes the prompt samples the first token.
            if row.first_token_step.is_none() && before + n >= prompt {
                row.first_token_step = Some(i);
                row.first_token_time = Some(s.end);
            }
            // Its last step is the one that sampled its last token (on a
            // prefiller, the first token is the last).
            row.finish_step = Some(i);
            row.finish_time = Some(s.end);
        }
    }
    for (row, &id) in rows.iter_mut().zip(order) {
        let done = finished.get(&id);
        if decoder_of_pd {
            // The decode leg arrives when the prefiller answers; its prefix
            // hit is the decoder's local hit at parking (its first scheduled
            // step starts from prompt − 1 computed tokens).
            row.arrival_time = done.and_then(|r| r.t1).unwrap_or(f64::NAN);
            row.prefix_hit = done.and_then(|r| r.prefix_hit);
            if let Some(&parked) = log.parked.get(&id) {
                row.remote = Some(RemoteRow {
                    parked_time: parked,
                    remote_tokens: done.map_or(0, |r| r.remote_tokens),
                    read_start: parked + x0,
                    read_done: done.and_then(|r| r.read_done_at),
                });
            }
        }
        // A prefill leg is done with its first token; other legs when the
        // request finished.
        let leg_done = match prefiller {
            true => row.first_token_step.is_some(),
            false => done.is_some(),
        };
        if !leg_done {
            // Never finished: no finish to report.
            row.finish_step = None;
            row.finish_time = None;
        }
    }
    rows
}

fn num(x: f64) -> String {
    // As the oracle: rounded to 1e-12 s.
    let r = (x * 1e12).round() / 1e12;
    let v = serde_json::Number::from_f64(r)
        .map(Value::Number)
        .unwrap_or(Value::Null);
    v.to_string()
}

fn opt<T: ToString>(x: Option<T>) -> String {
    x.map_or("null".to_string(), |v| v.to_string())
}

fn opt_num(x: Option<f64>) -> String {
    x.map_or("null".to_string(), num)
}

fn quoted(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

impl EngineReport {
    fn write(&self, out: &mut String, indent: usize) {
        let pad = " ".repeat(indent);
        let rows: Vec<String> = self
            .requests
            .iter()
            .map(|r| {
                let mut line = format!(
                    "{{\"id\": {}, \"arrival_time\": {}, \"first_scheduled_step\": {}, \"prefix_hit\": {}, \
                     \"first_token_step\": {}, \"first_token_time\": {}, \"finish_step\": {}, \
                     \"finish_time\": {}, \"preemptions\": {}",
                    quoted(&r.id),
                    num(r.arrival_time),
                    opt(r.first_scheduled_step),
                    opt(r.prefix_hit),
                    opt(r.first_token_step),
                    opt_num(r.first_token_time),
                    opt(r.finish_step),
                    opt_num(r.finish_time),
                    r.preemptions
                );
                if let Some(x) = &r.remote {
                    let _ = write!(
                        line,
                        ", \"parked_time\": {}, \"remote_tokens\": {}, \"read_start\": {}, \"read_done\": {}",
                        num(x.parked_time),
                        x.remote_tokens,
                        num(x.read_start),
                        opt_num(x.read_done)
                    );
                }
                line.push('}');
                line
            })
            .collect();
        let _ = write!(
            out,
            "{pad}\"requests\": [\n{pad}  {}\n{pad}],\n",
            rows.join(&format!(",\n{pad}  "))
        );
        let rows: Vec<String> = self
            .steps
            .iter()
            .map(|s| {
                let sched: Vec<String> = s
                    .scheduled
                    .iter()
                    .map(|(id, n)| format!("[{}, {n}]", quoted(id)))
                    .collect();
                let pre: Vec<String> = s.preempted.iter().map(|id| quoted(id)).collect();
                format!(
                    "{{\"step\": {}, \"start\": {}, \"end\": {}, \"scheduled\": [{}], \"preempted\": [{}], \"kv_blocks_held\": {}}}",
                    s.step,
                    num(s.start),
                    num(s.end),
                    sched.join(", "),
                    pre.join(", "),
                    s.kv_blocks_held
                )
            })
            .collect();
        let _ = write!(
            out,
            "{pad}\"steps\": [\n{pad}  {}\n{pad}]",
            rows.join(&format!(",\n{pad}  "))
        );
    }
}

impl ReplayReport {
    /// The report as the oracle writes it: one line per request and per step.
    pub fn to_json_text(&self) -> String {
        let mut out = String::new();
        match &self.prefill {
            None => {
                out.push_str("{\n \"mode\": \"single\",\n");
                self.decode.write(&mut out, 1);
                out.push_str("\n}\n");
            }
            Some(p) => {
                out.push_str("{\n \"mode\": \"pd\",\n \"prefill\": {\n");
                p.write(&mut out, 2);
                out.push_str("\n },\n \"decode\": {\n");
                self.decode.write(&mut out, 2);
                out.push_str("\n }\n}\n");
            }
        }
        out
    }
}

impl ReplayReport {
    /// The report as a JSON tree (the oracle's shape).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.to_json_text()).expect("the report is valid JSON")
    }
}

/// Differences between two reports of the oracle's shape (`ours`, `theirs`):
/// ids, counts, steps, schedules and preemptions exactly, times within `tol`
/// seconds. Requests are matched by id. Empty when they agree.
pub fn compare(ours: &Value, theirs: &Value, tol: f64) -> Vec<String> {
    let mut diffs = Vec::new();
    if ours["mode"] != theirs["mode"] {
        diffs.push(format!("mode: {} vs {}", ours["mode"], theirs["mode"]));
        return diffs;
    }
    let sections: Vec<(&str, &Value, &Value)> = if ours["mode"] == "pd" {
        vec![
            ("prefill", &ours["prefill"], &theirs["prefill"]),
            ("decode", &ours["decode"], &theirs["decode"]),
        ]
    } else {
        vec![("engine", ours, theirs)]
    };
    for (what, a, b) in sections {
        compare_section(what, a, b, tol, &mut diffs);
    }
    diffs
}

fn same(a: &Value, b: &Value, tol: f64) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() <= tol
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q, tol))
        }
        _ => a == b,
    }
}

fn compare_section(what: &str, a: &Value, b: &Value, tol: f64, diffs: &mut Vec<String>) {
    let empty = Vec::new();
    let (sa, sb) = (
        a["steps"].as_array().unwrap_or(&empty),
        b["steps"].as_array().unwrap_or(&empty),
    );
    for (i, (x, y)) in sa.iter().zip(sb).enumerate() {
        for key in ["start", "end", "scheduled", "preempted", "kv_blocks_held"] {
            if !same(&x[key], &y[key], tol) {
                diffs.push(format!(
                    "{what} step {i} {key}: ours {} vs theirs {}",
                    x[key], y[key]
                ));
            }
        }
    }
    if sa.len() != sb.len() {
        diffs.push(format!(
            "{what}: {} steps in ours vs {} in theirs",
            sa.len(),
            sb.len()
        ));
    }
    let (ra, rb) = (
        a["requests"].as_array().unwrap_or(&empty),
        b["requests"].as_array().unwrap_or(&empty),
    );
    for y in rb {
        let id = &y["id"];
        let Some(x) = ra.iter().find(|x| &x["id"] == id) else {
            diffs.push(format!("{what} request {id}: missing in ours"));
            continue;
        };
        let keys = y.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
        for key in keys.unwrap_or_default() {
            if !same(&x[&key], &y[&key], tol) {
                diffs.push(format!(
                    "{what} request {id} {key}: ours {} vs theirs {}",
                    x[&key], y[&key]
                ));
            }
        }
    }
    for x in ra {
        if !rb.iter().any(|y| y["id"] == x["id"]) {
            diffs.push(format!("{what} request {}: not in theirs", x["id"]));
        }
    }
}
