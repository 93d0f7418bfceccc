//! `num_gpu_blocks` as vLLM's memory profiling derives it (vLLM 0.33,
//! `Worker.determine_available_memory`): the GPU's memory times
//! `gpu_memory_utilization`, less what the profile run saw besides the KV
//! cache (weights, the activation peak, non-torch allocations, CUDA
//! graphs), divided by the bytes of one block over all layers. The
//! activation peak and the other two are estimates; a user who has the
//! vLLM log gives `num_gpu_blocks` (its "GPU KV cache size" ÷ block size)
//! or `kv_cache_memory_bytes` instead.

use serde::Serialize;

use crate::hardware::Pod;

/// Memory outside torch's allocator that the profile run sees (CUDA
/// context extras, cuBLAS and, with TP, NCCL buffers): 0.13 GiB at TP 1,
/// 0.54–0.55 GiB at TP 2 in llm-d's memory study of vLLM on H100
/// (docs/hardware.md).
pub fn non_torch_bytes(tp: u32) -> f64 {
    if tp > 1 { 0.55 * GIB } else { 0.13 * GIB }
}

/// The CUDA-graph pool vLLM subtracts since 0.21 (logged estimates of
/// 0.36–0.52 GiB for 8B-class models).
pub const CUDA_GRAPH_BYTES: f64 = 0.5 * GIB;

/// The sampler's dummy run peaks at about 39 bytes per (request, vocabulary
/// entry): fp32 logits and the sort, probabilities and log-probabilities
/// made from them (38.5–38.9 in llm-d's logs for three vocabularies).
pub const SAMPLER_BYTES_PER_LOGIT: f64 = 39.0;

pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Every term of the derivation, per GPU (one TP rank), in bytes (as
/// `pdsim check --json` writes them).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MemoryPlan {
    pub total: f64,
    #[serde(rename = "gpu_memory_utilization")]
    pub utilization: f64,
    /// total × utilization
    pub requested: f64,
    pub weights: f64,
    /// The profile run's activation peak (estimated: see [`activation_peak`]).
    pub activations: f64,
    pub non_torch: f64,
    pub cuda_graphs: f64,
    /// What is left for the KV cache (given directly with
    /// `kv_cache_memory_bytes`).
    pub kv_memory: f64,
    /// (The pool's own `block_bytes` says it.)
    #[serde(skip)]
    pub block_bytes: f64,
    #[serde(rename = "derived_num_gpu_blocks")]
    pub num_gpu_blocks: u64,
}

impl MemoryPlan {
    /// The plan of `pod` with vLLM's `gpu_memory_utilization`, the
    /// scheduler limits the profile run uses, and optionally
    /// `kv_cache_memory_bytes` (which skips profiling).
    pub fn derive(
        pod: &Pod,
        utilization: f64,
        block_size: u32,
        max_num_batched_tokens: u32,
        max_num_seqs: u32,
        kv_cache_memory_bytes: Option<f64>,
    ) -> MemoryPlan {
        let total = pod.gpu.memory_bytes();
        let requested = (total * utilization).ceil();
        let weights = pod.weight_bytes();
        let activations = activation_peak(pod, max_num_batched_tokens, max_num_seqs);
        let non_torch = non_torch_bytes(pod.tp);
        let kv_memory = kv_cache_memory_bytes
            .unwrap_or(requested - weights - activations - non_torch - CUDA_GRAPH_BYTES);
        let block_bytes = pod.block_bytes(block_size);
        MemoryPlan {
            total,
            utilization,
            requested,
            weights,
            activations,
            non_torch,
            cuda_graphs: CUDA_GRAPH_BYTES,
            kv_memory,
            block_bytes,
            num_gpu_blocks: (kv_memory.max(0.0) / block_bytes).floor() as u64,
        }
    }
}

/// The activation peak of vLLM's profile run, estimated: a forward pass of
/// `max_num_batched_tokens` tokens holds a few hidden-state tensors and
/// the MLP's intermediate ones (gate+up, then the activation; for MoE, per
/// routed token, also its output); the sampler's dummy run, over
/// `max_num_seqs` requests' full-vocabulary logits, comes after it. The
/// larger of the two is the peak (for the presets with vLLM's default
/// `max_num_seqs` of 1024, the sampler).
pub fn activation_peak(pod: &Pod, max_num_batched_tokens: u32, max_num_seqs: u32) -> f64 {
    let m = &pod.model;
    let (t, tp, b) = (
        f64::from(max_num_batched_tokens),
        f64::from(pod.tp),
        m.dtype_bytes,
    );
    let hidden = 4.0 * f64::from(m.hidden) * b;
    let mlp = match &m.moe {
        Some(e) => {
            f64::from(e.active) * (3.0 * f64::from(e.intermediate) / tp + f64::from(m.hidden)) * b
        }
        None => 3.0 * f64::from(m.intermediate) / tp * b,
    };
    let forward = t * (hidden + mlp);
    let sampler = f64::from(max_num_seqs) * f64::from(m.vocab) * SAMPLER_BYTES_PER_LOGIT;
    forward.max(sampler)
}
