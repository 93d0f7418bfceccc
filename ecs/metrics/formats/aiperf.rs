//! `--aiperf DIR`: the run as NVIDIA AIPerf exports a profile —
//! `profile_export.jsonl`, one record per request (written as requests
//! finish, so memory stays flat), and `profile_export_aiperf.json`, the
//! summary per metric tag (unit, avg, min, max, p1 … p99, std, count, sum).
//!
//! AIPerf's names and units: latencies in ms, lengths in tokens; its
//! `inter_token_latency` is per request, (latency − TTFT) ÷ (output − 1),
//! which is vLLM's TPOT (pdsim's `tpot`), not the per-gap ITL. A turn
//! refused as too long is an error record. Times are simulated: a request
//! starts at `t0` seconds after the run's start (`request_start_ns`).

use bevy_ecs::prelude::*;
use serde_json::{Map, Value, json};
use std::path::{Path, PathBuf};

use crate::engine::Request;
use crate::error::Result;
use crate::metrics::formats::stream::StreamFile;
use crate::metrics::{Obs, Report};
use crate::stats::Histogram;

/// The per-request records being written, and the lengths they saw.
#[derive(Resource)]
pub struct AiperfLog {
    dir: PathBuf,
    records: StreamFile,
    warmup: f64,
    isl: Histogram,
    osl: Histogram,
    per_user: Histogram,
    errors: u64,
}

fn ns(t: f64) -> i64 {
    (t * 1e9).round() as i64
}

/// Who a record is about.
pub struct Turn {
    pub id: String,
    pub session: u64,
    pub turn: u32,
    /// When it reached the gateway.
    pub t0: f64,
}

fn metadata(t: &Turn, warmup: f64, end: f64) -> Value {
    json!({
        "session_num": t.session,
        "x_request_id": t.id,
        "x_correlation_id": Value::Null,
        "conversation_id": t.session.to_string(),
        "turn_index": t.turn,
        "request_start_ns": ns(t.t0),
        "request_ack_ns": Value::Null,
        "request_end_ns": ns(end),
        "worker_id": "pdsim",
        "record_processor_id": "pdsim",
        "benchmark_phase": if t.t0 < warmup { "warmup" } else { "profiling" },
        "was_cancelled": false,
        "cancellation_time_ns": Value::Null,
    })
}

fn metric(value: f64, unit: &str) -> Value {
    json!({"value": value, "unit": unit})
}

impl AiperfLog {
    pub fn create(dir: &Path, warmup: f64) -> Result<AiperfLog> {
        Ok(AiperfLog {
            dir: dir.to_path_buf(),
            records: StreamFile::create(&dir.join("profile_export.jsonl"))?,
            warmup,
            isl: Histogram::new(),
            osl: Histogram::new(),
            per_user: Histogram::new(),
            errors: 0,
        })
    }

    /// A request finished at `now`.
    pub fn finished(&mut self, r: &Request, now: f64) {
        let first = r.first_token_at.unwrap_or(now);
        let mut m = Map::new();
        m.insert(
            "input_sequence_length".into(),
            metric(r.prompt as f64, "tokens"),
        );
        m.insert(
            "time_to_first_token".into(),
            metric(1000.0 * (first - r.t0), "ms"),
        );
        m.insert(
            "request_latency".into(),
            metric(1000.0 * (now - r.t0), "ms"),
        );
        m.insert(
            "output_token_count".into(),
            metric(r.output as f64, "tokens"),
        );
        m.insert(
            "output_sequence_length".into(),
            metric(r.output as f64, "tokens"),
        );
        let itl = (r.output >= 2).then(|| (now - first) / (r.output - 1) as f64);
        if let Some(itl) = itl {
            m.insert("inter_token_latency".into(), metric(1000.0 * itl, "ms"));
            m.insert(
                "output_token_throughput_per_user".into(),
                metric(1.0 / itl, "tokens/sec/user"),
            );
        }
        let who = Turn {
            id: r.id.to_string(),
            session: r.session,
            turn: r.turn,
            t0: r.t0,
        };
        let record = json!({"metadata": metadata(&who, self.warmup, now), "metrics": m, "error": Value::Null});
        self.records.write(&format!("{record}\n"));
        if r.t0 >= self.warmup {
            self.isl.record(r.prompt as f64);
            self.osl.record(r.output as f64);
            if let Some(itl) = itl
                && itl > 0.0
            {
                self.per_user.record(1.0 / itl);
            }
        }
    }

    /// A turn was refused when it arrived: its prompt of `prompt` tokens
    /// reached `max_model_len`.
    pub fn refused(&mut self, turn: &Turn, prompt: u64) {
        let record = json!({
            "metadata": metadata(turn, self.warmup, turn.t0),
            "metrics": {"error_isl": metric(prompt as f64, "tokens")},
            "error": {"code": 400, "type": "PromptTooLong",
                      "message": format!("the prompt ({prompt} tokens) reaches max_model_len")},
        });
        self.records.write(&format!("{record}\n"));
        if turn.t0 >= self.warmup {
            self.errors += 1;
        }
    }

    /// Writes the summary beside the records and completes both files.
    pub fn finish(self, report: &Report) -> Result<()> {
        let o = &report.overall;
        let t = &report.throughput;
        let mut out = Map::new();
        out.insert("schema_version".into(), json!("1.1"));
        out.insert(
            "aiperf_version".into(),
            json!(format!("pdsim {}", env!("CARGO_PKG_VERSION"))),
        );
        out.insert("benchmark_id".into(), json!(report.scenario));
        for (tag, h, scale, unit) in [
            ("time_to_first_token", o.get(Obs::Ttft), 1000.0, "ms"),
            ("inter_token_latency", o.get(Obs::Tpot), 1000.0, "ms"),
            ("request_latency", o.get(Obs::E2e), 1000.0, "ms"),
            ("input_sequence_length", &self.isl, 1.0, "tokens"),
            ("output_sequence_length", &self.osl, 1.0, "tokens"),
            ("output_token_count", &self.osl, 1.0, "tokens"),
            (
                "output_token_throughput_per_user",
                &self.per_user,
                1.0,
                "tokens/sec/user",
            ),
        ] {
            out.insert(tag.into(), record_stats(h, scale, unit));
        }
        let avg = |v: f64, unit: &str| json!({"unit": unit, "avg": v});
        out.insert(
            "request_throughput".into(),
            avg(t.requests_per_s, "requests/sec"),
        );
        out.insert(
            "output_token_throughput".into(),
            avg(t.output_tokens_per_s, "tokens/sec"),
        );
        out.insert(
            "total_token_throughput".into(),
            avg(t.total_tokens_per_s, "tokens/sec"),
        );
        out.insert("request_count".into(), avg(t.completed as f64, "requests"));
        out.insert(
            "error_request_count".into(),
            avg(self.errors as f64, "requests"),
        );
        out.insert("benchmark_duration".into(), avg(t.duration, "sec"));
        out.insert("total_isl".into(), avg(o.input_tokens as f64, "tokens"));
        out.insert("total_osl".into(), avg(o.output_tokens as f64, "tokens"));
        if let (Some(good), Some(rate)) = (t.good_requests, t.goodput_per_s) {
            out.insert("good_request_count".into(), avg(good as f64, "requests"));
            out.insert("goodput".into(), avg(rate, "requests/sec"));
        }
        let mut text = serde_json::to_string_pretty(&Value::Object(out)).expect("serializes");
        text.push('\n');
        crate::metrics::write_atomic(&self.dir.join("profile_export_aiperf.json"), &text)?;
        self.records.finish()
    }
}

/// AIPerf's statistics of a record metric, in its unit (`scale` × seconds).
fn record_stats(h: &Histogram, scale: f64, unit: &str) -> Value {
    let mut m = Map::new();
    m.insert("unit".into(), json!(unit));
    if h.count() == 0 {
        return Value::Object(m);
    }
    let v = |x: Option<f64>| json!(scale * x.unwrap_or(0.0));
    m.insert("avg".into(), v(h.mean()));
    for (name, q) in [
        ("p1", 0.01),
        ("p5", 0.05),
        ("p10", 0.10),
        ("p25", 0.25),
        ("p50", 0.50),
        ("p75", 0.75),
        ("p90", 0.90),
        ("p95", 0.95),
        ("p99", 0.99),
    ] {
        m.insert(name.into(), v(h.quantile(q)));
    }
    m.insert("min".into(), v(h.min()));
    m.insert("max".into(), v(h.max()));
    m.insert("std".into(), v(h.std()));
    m.insert("count".into(), json!(h.count()));
    m.insert("sum".into(), json!(scale * h.sum()));
    Value::Object(m)
}
