//! A replay trace (docs/oracle.md, "Trace format"): `config` (the engines,
//! the NICs, the read latency) and `requests`.

use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::scenario::{self, Scenario};
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
