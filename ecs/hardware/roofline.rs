//! The roofline step time: each layer group (attention over full context,
//! attention over a sliding window, dense MLP, experts, LM head) takes the
//! longer of its FLOPs at `mfu` × peak and its bytes at `mbu` × memory
//! bandwidth; tensor parallelism adds two all-reduces per layer over the
//! GPU interconnect; a fixed overhead is added per step.
//!
//! Everything is per rank: the ranks of a pod run in lock-step on their
//! shares of the heads and matrices (docs/hardware.md).

use serde::{Deserialize, Serialize};

use crate::hardware::{Pod, Quantization, StepShape};

/// The roofline's efficiency factors.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// Fraction of the dense tensor-core peak a GEMM reaches.
    pub mfu: f64,
    /// Fraction of the memory bandwidth a memory-bound kernel reaches.
    pub mbu: f64,
    /// Seconds per step outside the kernels (scheduling, sampling, launch gaps).
    pub step_overhead: f64,
    /// Seconds of latency per all-reduce (tensor parallelism only).
    pub allreduce_latency: f64,
}

impl Default for Efficiency {
    /// Round a-priori figures, not fitted (docs/hardware.md compares them
    /// with published measurements).
    fn default() -> Self {
        Efficiency {
            mfu: 0.5,
            mbu: 0.8,
            step_overhead: 1e-3,
            allreduce_latency: 1e-5,
        }
    }
}

/// The per-rank coefficients of one pod's roofline, computed once.
#[derive(Clone, Debug, PartialEq)]
pub struct Roofline {
    pub eff: Efficiency,
    full_layers: f64,
    sliding_layers: f64,
    window: Option<u32>,
    attn_params: f64,
    attn_bytes: f64,
    pair_flops: f64,
    kv_bytes_layer: f64,
    dense_layers: f64,
    dense_params: f64,
    dense_bytes: f64,
    moe_layers: f64,
    experts: f64,
    active: f64,
    shared: f64,
    expert_params: f64,
    expert_bytes: f64,
    router_params: f64,
    router_bytes: f64,
    lm_head_params: f64,
    lm_head_bytes: f64,
    layers: f64,
    allreduce_bytes_per_token: f64,
    tp: f64,
    linear_flops: f64,
    attention_flops: f64,
    memory_bw: f64,
    link_bw: f64,
}

/// A step's time, term by term (for `pdsim check`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Breakdown {
    pub attention: f64,
    pub mlp: f64,
    pub lm_head: f64,
    pub allreduce: f64,
    pub overhead: f64,
    /// Whether the larger part of the layers' time was bound by memory.
    pub memory_bound: bool,
}

impl Breakdown {
    pub fn total(&self) -> f64 {
        self.overhead + self.attention + self.mlp + self.lm_head + self.allreduce
    }
}

impl Roofline {
    pub fn new(pod: &Pod, eff: Efficiency) -> Roofline {
        let m = &pod.model;
        let tp = pod.tp;
        let (dense, moe) = m.dense_and_moe_layers();
        let (lw, ew) = m.layer_weight_bytes();
        let (experts, active, shared) = match &m.moe {
            Some(e) => (
                f64::from(e.experts),
                f64::from(e.active),
                f64::from(e.shared),
            ),
            None => (0.0, 0.0, 0.0),
        };
        let lm_head_params = f64::from(m.vocab) * f64::from(m.hidden) / f64::from(tp);
        let linear_peak = match m.quantization {
            Quantization::Fp8 => pod.gpu.fp8_flops(),
            _ => pod.gpu.bf16_flops(),
        };
        Roofline {
            eff,
            full_layers: f64::from(m.full_attention_layers()),
            sliding_layers: f64::from(m.sliding_layers),
            window: m.sliding_window,
            attn_params: m.attention_params(tp),
            attn_bytes: m.attention_params(tp) * lw,
            pair_flops: m.attention_flops_per_pair(tp),
            kv_bytes_layer: pod.kv_bytes_per_token_layer(),
            dense_layers: f64::from(dense),
            dense_params: m.dense_mlp_params(tp),
            dense_bytes: m.dense_mlp_params(tp) * lw,
            moe_layers: f64::from(moe),
            experts,
            active,
            shared,
            expert_params: m.expert_params(tp),
            expert_bytes: m.expert_params(tp) * ew,
            router_params: m.router_params(),
            router_bytes: m.router_params() * m.dtype_bytes,
            lm_head_params,
            lm_head_bytes: lm_head_params * m.dtype_bytes,
            layers: f64::from(m.layers),
            allreduce_bytes_per_token: f64::from(m.hidden) * m.dtype_bytes,
            tp: f64::from(tp),
            linear_flops: linear_peak * eff.mfu,
            attention_flops: pod.gpu.bf16_flops() * eff.mfu,
            memory_bw: pod.gpu.memory_bytes_per_s() * eff.mbu,
            link_bw: pod.gpu.interconnect_bytes_per_s(),
        }
    }

    /// The model's sliding window, which a step's shape must be built with.
    pub fn window(&self) -> Option<u32> {
        self.window
    }

    pub fn step_time(&self, s: &StepShape) -> f64 {
        self.breakdown(s).total()
    }

    pub fn breakdown(&self, s: &StepShape) -> Breakdown {
        let t = s.tokens as f64;
        let mut compute_bound = 0.0;
        let mut memory_bound = 0.0;
        let mut group = |flops_time: f64, bytes: f64| {
            let mem = bytes / self.memory_bw;
            if flops_time > mem {
                compute_bound += flops_time;
            } else {
                memory_bound += mem;
            }
            flops_time.max(mem)
        };
        let projections = 2.0 * t * self.attn_params / self.linear_flops;
        let mut attention = 0.0;
        if self.full_layers > 0.0 {
            let flops = projections + self.pair_flops * s.attended / self.attention_flops;
            let bytes = self.attn_bytes + self.kv_bytes_layer * (s.kv_tokens as f64 + t);
            attention += self.full_layers * group(flops, bytes);
        }
        if self.sliding_layers > 0.0 {
            let flops = projections + self.pair_flops * s.window_attended / self.attention_flops;
            let bytes = self.attn_bytes + self.kv_bytes_layer * (s.window_kv + t);
            attention += self.sliding_layers * group(flops, bytes);
        }
        let mut mlp = 0.0;
        if self.dense_layers > 0.0 {
            let flops = 2.0 * t * self.dense_params / self.linear_flops;
            mlp += self.dense_layers * group(flops, self.dense_bytes);
        }
        if self.moe_layers > 0.0 {
            // Distinct experts the step's tokens touch, routing uniform:
            // E · (1 − (1 − k/E)^T).
            let touched = self.experts * (1.0 - (1.0 - self.active / self.experts).powf(t));
            let flops =
                2.0 * t * ((self.active + self.shared) * self.expert_params + self.router_params)
                    / self.linear_flops;
            let bytes = (touched + self.shared) * self.expert_bytes + self.router_bytes;
            mlp += self.moe_layers * group(flops, bytes);
        }
        // Logits at each request's last scheduled position.
        let lm_flops = 2.0 * f64::from(s.requests) * self.lm_head_params / self.linear_flops;
        let lm_head = if s.requests > 0 {
            group(lm_flops, self.lm_head_bytes)
        } else {
            0.0
        };
        // Ring all-reduce of the step's hidden states, after attention and
        // after the MLP of every layer: 2(tp − 1)/tp of the data each way.
        let allreduce = if self.tp > 1.0 {
            let bytes = t * self.allreduce_bytes_per_token;
            self.layers
                * 2.0
                * (self.eff.allreduce_latency
                    + 2.0 * (self.tp - 1.0) / self.tp * bytes / self.link_bw)
        } else {
            0.0
        };
        Breakdown {
            attention,
            mlp,
            lm_head,
            allreduce,
            overhead: self.eff.step_overhead,
            memory_bound: memory_bound >= compute_bound,
        }
    }
}
