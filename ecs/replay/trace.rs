//! A replay trace (docs/oracle.md, "Trace format"): `config` (the engines,
//! the NICs, the read latency) and `requests`.

use serde::Deserialize;
use serde_json::{Value, json};
use std::path::Path;

use crate::error::{Error, Result};
use crate::scenario::{self, Scenario, TraceFormat, TraceSource};
use crate::workload::trace::{self, TraceRequest, pdsim};

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

/// The other keys of `config`: the mode, the P/D link, the roles' overrides.
const CONFIG_KEYS: [&str; 8] = [
    "mode",
    "x0",
    "nic_tokens_per_s",
    "transfer",
    "dispatch",
    "notify_latency",
    "prefill",
    "decode",
];

/// A trace: `config` and `requests` (docs/oracle.md, "Trace format").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trace {
    pub config: serde_json::Map<String, Value>,
    pub requests: Vec<pdsim::Entry>,
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
        let trace: Trace = serde_json::from_str(&text)
            .map_err(|e| Error::new(format!("{}: not a trace: {e}", path.display())))?;
        // A misspelt key would silently leave its default in force.
        let known = ENGINE_KEYS.iter().chain(&CONFIG_KEYS);
        for k in trace.config.keys() {
            if !known.clone().any(|n| n == k) {
                let hint = crate::error::suggest(k, known.clone().copied())
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                return Err(Error::new(format!(
                    "{}: config.{k} is not a trace setting{hint}; they are {}",
                    path.display(),
                    known.clone().copied().collect::<Vec<_>>().join(", ")
                )));
            }
        }
        Ok(trace)
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
        // NIXL pull (default) or push, serial (default) or parallel dispatch.
        let word = |key: &str, default: &str, allowed: [&str; 2]| -> Result<String> {
            let v = self
                .config
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or(default);
            if allowed.contains(&v) {
                Ok(v.to_string())
            } else {
                Err(Error::new(format!(
                    "config.{key} must be \"{}\" or \"{}\", got {v:?}",
                    allowed[0], allowed[1]
                )))
            }
        };
        let transfer_mode = match word("transfer", "pull", ["pull", "push"])?.as_str() {
            "push" => "NixlPush",
            _ => "NixlPull",
        };
        let dispatch = match word("dispatch", "serial", ["serial", "parallel"])?.as_str() {
            "parallel" => "Parallel",
            _ => "Serial",
        };
        let notify = self
            .config
            .get("notify_latency")
            .and_then(Value::as_f64)
            .unwrap_or(0.001);
        let file = std::path::absolute(source).unwrap_or_else(|_| source.to_path_buf());
        // The router is never consulted (RouterMode::Direct).
        let unused = json!({"script": "unused-in-replay.rhai"});
        let tree = json!({
            "name": format!("replay of {}", source.display()),
            "seed": 1,
            "horizon": crate::scenario::validate::MAX_HORIZON,
            "warmup": 0.0,
            "engine_semantics": "Vllm033",
            // The workload is this trace (its requests are given to the
            // simulation directly: `Trace::requests`).
            "workload": {
                "trace": {"file": file.to_string_lossy(), "format": "Pdsim"},
            },
            "prefill": pool(&p),
            "decode": pool(&d),
            "transfer": {"mode": transfer_mode, "latency": x0, "sharing": "MaxMin",
                         "notify_latency": notify},
            "router": {
                "decider": unused,
                "decode": {"picker": unused},
                "prefill": {"picker": unused},
                "dispatch": dispatch,
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
    pub fn requests(&self, source: &Path) -> Result<Vec<TraceRequest>> {
        let remote = self.mode()? == Mode::Pd;
        pdsim::check(&self.requests)
            .map_err(|e| Error::new(format!("{}: {e}", source.display())))?;
        let options = TraceSource::file(source.to_string_lossy());
        let mut prep = trace::Preparer::new(TraceFormat::Pdsim, &options, source);
        for r in pdsim::records(self.requests.clone()) {
            prep.push(r)?;
        }
        let mut trace = prep.finish();
        for r in &mut trace.requests {
            r.remote = remote;
        }
        Ok(trace.requests)
    }
}
