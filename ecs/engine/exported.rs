//! What one vLLM engine would export on its `/metrics` endpoint (vLLM 0.33,
//! `v1/metrics/loggers.py`): histograms of the requests it served, measured
//! on the engine (from a leg's arrival there), with vLLM's bucket bounds
//! (`v1/metrics/buckets.py`), and its counters. Kept only when asked for
//! (`--prometheus`): [`crate::Sim::export_engine_metrics`].

use crate::engine::Request;
use crate::stats::Buckets;

/// `time_to_first_token` buckets.
pub const TTFT_BOUNDS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// `inter_token_latency` buckets (ITL and per-request TPOT).
pub const ITL_BOUNDS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// `request_latency` buckets (e2e, queue, prefill, decode times).
pub const LATENCY_BOUNDS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// One engine's exported histograms and counters.
#[derive(Clone, Debug)]
pub struct Exported {
    /// `vllm:time_to_first_token_seconds`: the leg's first token − its
    /// arrival at this engine (on a prefiller: its one sampled token).
    pub ttft: Buckets,
    /// `vllm:inter_token_latency_seconds`: every token gap.
    pub itl: Buckets,
    /// `vllm:request_time_per_output_token_seconds` (0 for one token).
    pub tpot: Buckets,
    /// `vllm:e2e_request_latency_seconds`: finish − arrival at this engine.
    pub e2e: Buckets,
    /// `vllm:request_queue_time_seconds`: first scheduled − arrival.
    pub queue: Buckets,
    /// `vllm:request_prefill_time_seconds`, `_decode_time_seconds`.
    pub prefill: Buckets,
    pub decode: Buckets,
    /// `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`.
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    /// `vllm:request_success_total` (finished_reason="length": every request
    /// stops at its `max_tokens`).
    pub success: u64,
    /// `vllm:num_preemptions_total`.
    pub preemptions: u64,
}

impl Default for Exported {
    fn default() -> Self {
        Exported {
            ttft: Buckets::new(&TTFT_BOUNDS),
            itl: Buckets::new(&ITL_BOUNDS),
            tpot: Buckets::new(&ITL_BOUNDS),
            e2e: Buckets::new(&LATENCY_BOUNDS),
            queue: Buckets::new(&LATENCY_BOUNDS),
            prefill: Buckets::new(&LATENCY_BOUNDS),
            decode: Buckets::new(&LATENCY_BOUNDS),
            prompt_tokens: 0,
            generation_tokens: 0,
            success: 0,
            preemptions: 0,
        }
    }
}

impl Exported {
    /// A leg produced its first token on this engine at `now`.
    pub fn first_token(&mut self, r: &Request, now: f64) {
        self.ttft.record(now - r.leg_arrived_at);
        self.prompt_tokens += r.prompt as u64;
    }

    /// A leg finished on this engine at `now`, with its first token at
    /// `first` (its sampled tokens on this engine: `generated`).
    pub fn finished(&mut self, r: &Request, first: f64, generated: u32, now: f64) {
        let scheduled = r.leg_scheduled_at.unwrap_or(now);
        self.e2e.record(now - r.leg_arrived_at);
        self.queue.record(scheduled - r.leg_arrived_at);
        self.prefill.record(first - scheduled);
        self.decode.record(now - first);
        self.tpot.record(if generated > 1 {
            (now - first) / (generated - 1) as f64
        } else {
            0.0
        });
        self.success += 1;
    }
}
