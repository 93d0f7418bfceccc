//! `--bench-json FILE`: the run as `vllm bench serve --save-result` writes
//! a benchmark (vLLM 0.33, `benchmarks/serve.py`), so that a simulated and a
//! measured result can be laid side by side: the same keys, units (ms for
//! latencies, seconds for `duration`) and definitions — TPOT per request of
//! two or more tokens, ITL every token gap, goodput the rate of requests
//! within every SLO (`--slo`; null without one).
//!
//! The run's window is [warm-up, horizon]: `duration` is its length and the
//! requests are those the report counts. `date` is "simulated"; the
//! per-request lists (`latencies`, `queue_times`, …) are not written (the
//! AIPerf export has one record per request).

use serde_json::{Map, Value, json};

use crate::metrics::{Obs, Report};
use crate::stats::Histogram;

/// The JSON text, with `percentiles` (e.g. 99) as `p99_ttft_ms` and so on.
pub fn bench_json(report: &Report, percentiles: &[f64]) -> String {
    let o = &report.overall;
    let t = &report.throughput;
    let too_long = o.get(Obs::TooLong);
    let failed = too_long.sum().round() as u64;
    let prompts = t.completed + failed;
    let mut out = Map::new();
    let mut put = |k: &str, v: Value| {
        out.insert(k.to_string(), v);
    };
    put("date", json!("simulated"));
    put("endpoint_type", json!("pdsim"));
    put("backend", json!("pdsim"));
    put("label", json!(report.scenario));
    put("model_id", json!(report.scenario));
    put("tokenizer_id", Value::Null);
    put("num_prompts", json!(prompts));
    put("request_rate", json!(prompts as f64 / t.duration));
    put("burstiness", json!(1.0));
    put("max_concurrency", Value::Null);
    put("duration", json!(t.duration));
    put("completed", json!(t.completed));
    put("failed", json!(failed));
    put("total_input_tokens", json!(o.input_tokens));
    put("total_output_tokens", json!(o.output_tokens));
    put("request_throughput", json!(t.requests_per_s));
    put("request_goodput", json!(t.goodput_per_s));
    put("output_throughput", json!(t.output_tokens_per_s));
    put("total_token_throughput", json!(t.total_tokens_per_s));
    for (key, obs) in [
        ("ttft", Obs::Ttft),
        ("tpot", Obs::Tpot),
        ("itl", Obs::Itl),
        ("e2el", Obs::E2e),
    ] {
        let h: &Histogram = o.get(obs);
        // vLLM reports 0 for an empty list.
        let ms = |v: Option<f64>| json!(1000.0 * v.unwrap_or(0.0));
        put(&format!("mean_{key}_ms"), ms(h.mean()));
        put(&format!("median_{key}_ms"), ms(h.quantile(0.5)));
        put(&format!("std_{key}_ms"), ms(h.std()));
        for &p in percentiles {
            put(
                &format!("p{}_{key}_ms", percentile_word(p)),
                ms(h.quantile(p / 100.0)),
            );
        }
    }
    let mut text = serde_json::to_string_pretty(&Value::Object(out)).expect("serializes");
    text.push('\n');
    text
}

/// `99` → "99", `99.9` → "99.9" (vLLM's `p_word`).
fn percentile_word(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

/// Parses `--metric-percentiles 50,90,99` (empty: vLLM's default, 99).
pub fn parse_percentiles(text: &str) -> Result<Vec<f64>, String> {
    if text.trim().is_empty() {
        return Ok(vec![99.0]);
    }
    text.split(',')
        .map(|s| {
            let v: f64 = s
                .trim()
                .parse()
                .map_err(|_| format!("`{s}` is not a percentile"))?;
            if (0.0..=100.0).contains(&v) {
                Ok(v)
            } else {
                Err(format!("percentile {v} is not within 0..100"))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_words_are_vllms() {
        assert_eq!(percentile_word(99.0), "99");
        assert_eq!(percentile_word(99.9), "99.9");
        assert_eq!(parse_percentiles("50, 99.9").unwrap(), [50.0, 99.9]);
        assert!(parse_percentiles("101").is_err());
    }
}
