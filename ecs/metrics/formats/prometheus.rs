//! `--prometheus FILE`: the Prometheus text exposition at the end of the
//! run, as each vLLM engine's `/metrics` would show it (vLLM 0.33 names,
//! help texts and bucket bounds), one series per engine — labels `engine`
//! (its index in its role), `role` (prefill, decode) and `model_name` —
//! plus the router's own counters per pod. Histograms are measured on each
//! engine, from a request's arrival there (on a decoder, a remote request's
//! TTFT includes its KV read).

use bevy_ecs::prelude::*;
use std::fmt::Write as _;

use crate::engine::exported::Exported;
use crate::engine::{Engine, KvPool, Role};
use crate::router::Router;
use crate::stats::Buckets;

/// A number as Prometheus clients print it (`1.0`, `0.025`, `+Inf`).
fn num(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

struct Writer {
    out: String,
    model: String,
}

impl Writer {
    /// `{engine="0",…,model_name="m",role="decode"}` with `extra` labels,
    /// sorted by name as prometheus_client writes them.
    fn labels(&self, role: Role, index: u32, extra: &[(&str, String)]) -> String {
        let mut all: Vec<(&str, String)> = vec![
            ("engine", index.to_string()),
            ("model_name", self.model.clone()),
            ("role", role.name().to_string()),
        ];
        all.extend(extra.iter().cloned());
        all.sort_by(|a, b| a.0.cmp(b.0));
        let inner: Vec<String> = all.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        format!("{{{}}}", inner.join(","))
    }

    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn histogram(&mut self, name: &str, help: &str, engines: &[(Role, u32, &Buckets)]) {
        self.head(name, "histogram", help);
        for &(role, index, b) in engines {
            for (bound, count) in b.cumulative() {
                let l = self.labels(role, index, &[("le", num(bound))]);
                let _ = writeln!(self.out, "{name}_bucket{l} {}", num(count as f64));
            }
            let l = self.labels(role, index, &[]);
            let _ = writeln!(self.out, "{name}_count{l} {}", num(b.count as f64));
            let _ = writeln!(self.out, "{name}_sum{l} {}", num(b.sum));
        }
    }

    fn scalar(&mut self, name: &str, kind: &str, help: &str, values: &[(Role, u32, f64)]) {
        self.head(name, kind, help);
        for &(role, index, v) in values {
            // Every request stops at its max_tokens.
            let extra = if name == "vllm:request_success_total" {
                vec![("finished_reason", "length".to_string())]
            } else {
                vec![]
            };
            let l = self.labels(role, index, &extra);
            let _ = writeln!(self.out, "{name}{l} {}", num(v));
        }
    }
}

/// What the exposition shows of one engine.
struct EngineRow {
    role: Role,
    index: u32,
    x: Exported,
    running: f64,
    waiting: f64,
    kv_usage: f64,
    prefix_queries: u64,
    prefix_hits: u64,
}

/// The exposition text of every engine and the router.
pub fn exposition(world: &mut World, model: &str) -> String {
    let mut engines: Vec<EngineRow> = world
        .query::<(&Engine, &KvPool)>()
        .iter(world)
        .map(|(e, kv)| EngineRow {
            role: e.role,
            index: e.index,
            x: e.exported.as_deref().cloned().unwrap_or_default(),
            running: e.running.len() as f64,
            waiting: e.waiting.len() as f64,
            kv_usage: kv.0.num_held() as f64 / kv.0.num_blocks().max(1) as f64,
            prefix_queries: e.prefix_queries,
            prefix_hits: e.prefix_hits,
        })
        .collect();
    engines.sort_by_key(|e| (e.role as u8, e.index));
    let mut w = Writer {
        out: String::new(),
        model: model.to_string(),
    };
    type Pick = fn(&Exported) -> &Buckets;
    let histograms: [(&str, &str, Pick); 7] = [
        (
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            |x| &x.ttft,
        ),
        (
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            |x| &x.itl,
        ),
        (
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            |x| &x.tpot,
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            |x| &x.e2e,
        ),
        (
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            |x| &x.queue,
        ),
        (
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            |x| &x.prefill,
        ),
        (
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            |x| &x.decode,
        ),
    ];
    for (name, help, pick) in histograms {
        let rows: Vec<(Role, u32, &Buckets)> = engines
            .iter()
            .map(|e| (e.role, e.index, pick(&e.x)))
            .collect();
        w.histogram(name, help, &rows);
    }
    type Value = fn(&EngineRow) -> f64;
    let scalars: [(&str, &str, &str, Value); 9] = [
        (
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            |e| e.running,
        ),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            |e| e.waiting,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            |e| e.kv_usage,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            |e| e.prefix_queries as f64,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            |e| e.prefix_hits as f64,
        ),
        (
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            |e| e.x.prompt_tokens as f64,
        ),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            |e| e.x.generation_tokens as f64,
        ),
        (
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
            |e| e.x.success as f64,
        ),
        (
            "vllm:num_preemptions_total",
            "counter",
            "Cumulative number of preemption from the engine.",
            |e| e.x.preemptions as f64,
        ),
    ];
    for (name, kind, help, pick) in scalars {
        let rows: Vec<(Role, u32, f64)> =
            engines.iter().map(|e| (e.role, e.index, pick(e))).collect();
        w.scalar(name, kind, help, &rows);
    }
    // The router's own counters (llm-d's EPP has its own names; these are
    // pdsim's, per pod).
    let book = &world.non_send::<Router>().book;
    for (name, help, pick) in [
        (
            "pdsim:router_requests_total",
            "Requests the router sent to the pod.",
            (|c: &crate::router::book::Routed| c.requests) as fn(&_) -> u64,
        ),
        (
            "pdsim:router_remote_requests_total",
            "Of those, prefilled remotely.",
            |c| c.remote,
        ),
        (
            "pdsim:router_prompt_tokens_total",
            "Prompt tokens of the requests the router sent to the pod.",
            |c| c.prompt_tokens,
        ),
    ] {
        w.head(name, "counter", help);
        for role in [Role::Prefill, Role::Decode] {
            for (i, c) in book.routed[role as usize].iter().enumerate() {
                let _ = writeln!(
                    w.out,
                    "{name}{{model_name=\"{}\",pod=\"{i}\",role=\"{}\"}} {}",
                    w.model,
                    role.name(),
                    num(pick(c) as f64)
                );
            }
        }
    }
    w.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_print_as_prometheus_clients_print_them() {
        assert_eq!(num(1.0), "1.0");
        assert_eq!(num(0.025), "0.025");
        assert_eq!(num(2560.0), "2560.0");
        assert_eq!(num(f64::INFINITY), "+Inf");
    }
}
