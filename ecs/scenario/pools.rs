//! From a pool as written to what a run uses: its pods' hardware (model,
//! GPU, tensor parallelism), KV blocks, NICs in KV tokens per second and
//! step-time model. Every derived number is kept, for `pdsim check`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::hardware::{
    Efficiency, MemoryPlan, Pod, Quantization, StepTable, memory::GIB, model::dtype_bytes, nic,
    presets,
};
use crate::scenario::{CostKind, Pool};

/// A pool as the run uses it.
#[derive(Clone, Debug)]
pub struct PoolPlan {
    /// The pods' hardware, when the pool names a model and a GPU.
    pub pod: Option<Pod>,
    /// How `num_gpu_blocks` was derived (physical pools).
    pub memory: Option<MemoryPlan>,
    pub num_gpu_blocks: u32,
    pub tp: u32,
    /// NICs per pod and the capacity of each, in KV tokens per second.
    pub nics: u32,
    pub nic_tokens_per_s: f64,
    /// The same in bytes per second, and the bytes of one token's KV that
    /// a read moves (when the NIC was given in bytes or Gb/s).
    pub nic_bytes_per_s: Option<f64>,
    pub read_bytes_per_token: Option<f64>,
    pub cost: CostPlan,
}

/// The step-time model with its parameters resolved.
#[derive(Clone, Debug)]
pub enum CostPlan {
    Linear(LinearCost),
    Roofline(Efficiency),
    Table {
        file: PathBuf,
        table: Arc<StepTable>,
    },
}

/// `c0 + max(omega + beta × kv, tokens × a)` seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearCost {
    pub c0: f64,
    pub a: f64,
    pub omega: f64,
    pub beta: f64,
}

/// vLLM 0.33's default `gpu_memory_utilization`.
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.92;

/// The first half of a pool's resolution: everything but the NIC rate,
/// which needs both pools (a flow's two NICs count the same tokens).
pub(crate) struct Partial {
    pod: Option<Pod>,
    memory: Option<MemoryPlan>,
    num_gpu_blocks: u32,
    tp: u32,
    cost: Option<CostPlan>,
}

fn finite_pos(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

/// The pod of a physical pool (None: abstract, or refused with a problem).
fn pod_of(role: &str, pool: &Pool, lib: Option<&Path>, problems: &mut Vec<String>) -> Option<Pod> {
    let e = &pool.engine;
    let (model, gpu) = match (&pool.model, &pool.gpu) {
        (None, None) => return None,
        (Some(m), Some(g)) => (m, g),
        (Some(_), None) | (None, Some(_)) => {
            problems.push(format!(
                "{role}: a physical pool names both its `model` and its `gpu` (one is missing)"
            ));
            return None;
        }
    };
    let mut model = presets::model(model, lib)
        .map_err(|err| problems.push(format!("{role}.model: {err}")))
        .ok()?;
    let gpu = presets::gpu(gpu, lib)
        .map_err(|err| problems.push(format!("{role}.gpu: {err}")))
        .ok()?;
    match e.quantization.as_deref() {
        None => {}
        Some("fp8") if model.quantization == Quantization::None => {
            model.quantization = Quantization::Fp8
        }
        Some("fp8") => problems.push(format!(
            "{role}.engine.quantization: {} is already quantized ({:?}); fp8 applies to unquantized models",
            model.name, model.quantization
        )),
        Some(other) => problems.push(format!(
            "{role}.engine.quantization: pdsim sizes `fp8` (weights in 8 bits), not `{other}`"
        )),
    }
    if let Some(p) = model.tp_problem(e.tensor_parallel_size) {
        problems.push(format!("{role}.engine.tensor_parallel_size: {p}"));
        return None;
    }
    let kv_cache_dtype = e.kv_cache_dtype.clone().unwrap_or_else(|| "auto".into());
    let kv_dtype_bytes = if kv_cache_dtype == "auto" {
        model.dtype_bytes
    } else {
        match dtype_bytes(&kv_cache_dtype) {
            Some(b) => b,
            None => {
                problems.push(format!(
                    "{role}.engine.kv_cache_dtype: `{kv_cache_dtype}` is not one pdsim knows (auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2)"
                ));
                return None;
            }
        }
    };
    if let Some(max) = model.max_position_embeddings
        && e.max_model_len > max
    {
        problems.push(format!(
            "{role}.engine.max_model_len ({}) exceeds {}'s max_position_embeddings ({max}); vLLM refuses it",
            e.max_model_len, model.name
        ));
    }
    Some(Pod {
        model,
        gpu,
        tp: e.tensor_parallel_size,
        kv_cache_dtype,
        kv_dtype_bytes,
        hybrid_kv_cache: !e.disable_hybrid_kv_cache_manager,
    })
}

/// Resolves everything of a pool but its NIC rate.
pub(crate) fn resolve_pool(
    role: &str,
    pool: &Pool,
    lib: Option<&Path>,
    problems: &mut Vec<String>,
) -> Partial {
    let e = &pool.engine;
    let tp = e.tensor_parallel_size;
    if tp == 0 {
        problems.push(format!(
            "{role}.engine.tensor_parallel_size must be at least 1"
        ));
    }
    let pod = pod_of(role, pool, lib, problems);
    let utilization = e
        .gpu_memory_utilization
        .unwrap_or(DEFAULT_GPU_MEMORY_UTILIZATION);
    if !(utilization > 0.0 && utilization <= 1.0) {
        problems.push(format!(
            "{role}.engine.gpu_memory_utilization must be in (0, 1], got {utilization}"
        ));
    }
    if let Some(b) = e.kv_cache_memory_bytes
        && !finite_pos(b)
    {
        problems.push(format!(
            "{role}.engine.kv_cache_memory_bytes must be positive, got {b}"
        ));
    }
    let memory = pod.as_ref().filter(|_| e.block_size > 0).map(|pod| {
        MemoryPlan::derive(
            pod,
            utilization,
            e.block_size,
            e.max_num_batched_tokens,
            e.max_num_seqs,
            e.kv_cache_memory_bytes,
        )
    });
    let num_gpu_blocks = match (e.num_gpu_blocks, &memory, &pod) {
        (Some(n), _, _) => n,
        (None, Some(m), Some(pod)) => {
            if m.kv_memory <= 0.0 || m.num_gpu_blocks == 0 {
                problems.push(format!(
                    "{role}: {} does not fit on {} at tensor_parallel_size {tp}: each GPU has {:.2} GiB × {utilization} = {:.2} GiB, \
                     and weights ({:.2} GiB), activations ({:.2} GiB), non-torch memory and CUDA graphs ({:.2} GiB) leave {:.2} GiB for the KV cache",
                    pod.model.name,
                    pod.gpu.name,
                    m.total / GIB,
                    m.requested / GIB,
                    m.weights / GIB,
                    m.activations / GIB,
                    (m.non_torch + m.cuda_graphs) / GIB,
                    m.kv_memory / GIB
                ));
                0
            } else {
                u32::try_from(m.num_gpu_blocks).unwrap_or(u32::MAX)
            }
        }
        _ => {
            problems.push(format!(
                "{role}.engine.num_gpu_blocks is missing: give it, or name the pool's `model` and `gpu` to derive it"
            ));
            0
        }
    };
    let capacity = u64::from(num_gpu_blocks) * u64::from(e.block_size);
    if num_gpu_blocks > 0
        && e.block_size > 0
        && e.max_model_len > 1
        && capacity < u64::from(e.max_model_len)
    {
        let how = if e.num_gpu_blocks.is_none() {
            " (derived from the GPU memory)"
        } else {
            ""
        };
        problems.push(format!(
            "{role}.engine: the KV pool ({num_gpu_blocks} blocks{how} × {} tokens = {capacity} tokens) is smaller than \
             max_model_len ({}); vLLM refuses to start such an engine",
            e.block_size, e.max_model_len
        ));
    }
    let cost = cost_of(role, pool, pod.as_ref(), problems);
    Partial {
        pod,
        memory,
        num_gpu_blocks,
        tp,
        cost,
    }
}

fn cost_of(
    role: &str,
    pool: &Pool,
    pod: Option<&Pod>,
    problems: &mut Vec<String>,
) -> Option<CostPlan> {
    let c = &pool.cost;
    match c.kind {
        CostKind::Linear => {
            // A real step takes milliseconds; a minute per token (or per
            // step) is already absurd, and a larger one would have a run
            // tick through heartbeats for ages.
            let mut get = |name: &str, v: Option<f64>| match v {
                Some(v) if v.is_finite() && (0.0..=60.0).contains(&v) => Some(v),
                Some(v) => {
                    problems.push(format!(
                        "{role}.cost.{name} must be from 0 to 60 (seconds, per step or per token), got {}",
                        crate::error::num(v)
                    ));
                    None
                }
                None => {
                    problems.push(format!(
                        "{role}.cost.{name} is missing: the Linear step cost needs c0, a, omega and beta (or choose kind: Roofline or Table)"
                    ));
                    None
                }
            };
            let (c0, a, omega, beta) = (
                get("c0", c.c0),
                get("a", c.a),
                get("omega", c.omega),
                get("beta", c.beta),
            );
            let l = LinearCost {
                c0: c0?,
                a: a?,
                omega: omega?,
                beta: beta?,
            };
            if !(l.c0 > 0.0 || l.a > 0.0 || l.omega > 0.0) {
                problems.push(format!(
                    "{role}.cost: a step must take time (c0, a or omega above 0)"
                ));
            }
            Some(CostPlan::Linear(l))
        }
        CostKind::Roofline => {
            if pod.is_none() {
                problems.push(format!(
                    "{role}.cost: the Roofline step time needs the pool's `model` and `gpu`"
                ));
            }
            let d = Efficiency::default();
            let eff = Efficiency {
                mfu: c.mfu.unwrap_or(d.mfu),
                mbu: c.mbu.unwrap_or(d.mbu),
                step_overhead: c.step_overhead.unwrap_or(d.step_overhead),
                allreduce_latency: c.allreduce_latency.unwrap_or(d.allreduce_latency),
            };
            for (name, v) in [("mfu", eff.mfu), ("mbu", eff.mbu)] {
                if !(v > 0.0 && v <= 1.0) {
                    problems.push(format!("{role}.cost.{name} must be in (0, 1], got {v}"));
                }
            }
            for (name, v) in [
                ("step_overhead", eff.step_overhead),
                ("allreduce_latency", eff.allreduce_latency),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    problems.push(format!(
                        "{role}.cost.{name} must be a finite number >= 0, got {v}"
                    ));
                }
            }
            Some(CostPlan::Roofline(eff))
        }
        CostKind::Table => match &c.file {
            None => {
                problems.push(format!(
                    "{role}.cost: the Table step time needs `file` (a CSV of measured steps)"
                ));
                None
            }
            Some(f) => match StepTable::read(Path::new(f)) {
                Ok(t) => Some(CostPlan::Table {
                    file: f.into(),
                    table: Arc::new(t),
                }),
                Err(err) => {
                    problems.push(format!("{role}.cost.file: {err}"));
                    None
                }
            },
        },
    }
}

/// Finishes both pools: NIC counts and rates, in KV tokens per second of
/// the same token (the KV of one token as a read into a decoder moves it).
pub(crate) fn finish(
    pools: [(&str, &Pool, Partial); 2],
    problems: &mut Vec<String>,
) -> Option<[PoolPlan; 2]> {
    if let (Some(p), Some(d)) = (&pools[0].2.pod, &pools[1].2.pod)
        && (p.model != d.model || p.kv_dtype_bytes != d.kv_dtype_bytes)
    {
        problems.push(format!(
            "prefill and decode must serve the same model with the same KV dtype (got {} with {} and {} with {})",
            p.model.name, p.kv_cache_dtype, d.model.name, d.kv_cache_dtype
        ));
    }
    // A read moves what the decoder's ranks cache; an abstract decoder
    // pool takes the prefiller's figure.
    let read_bytes = pools[1]
        .2
        .pod
        .as_ref()
        .or(pools[0].2.pod.as_ref())
        .map(Pod::read_bytes_per_token);
    let mut out = Vec::new();
    for (role, pool, partial) in pools {
        let n = &pool.nic;
        let nics = n.count.unwrap_or(partial.tp.max(1));
        if nics == 0 || nics > partial.tp.max(1) {
            problems.push(format!(
                "{role}.nic.count must be between 1 and the pod's GPUs ({}), got {nics}: each GPU uses one NIC",
                partial.tp
            ));
        }
        let per_token = match (n.kv_bytes_per_token, read_bytes, &partial.pod) {
            (Some(_), _, Some(_)) => {
                problems.push(format!(
                    "{role}.nic.kv_bytes_per_token is derived from the model ({:.0} B per token a read moves); remove it",
                    read_bytes.unwrap_or(0.0)
                ));
                None
            }
            (Some(b), _, None) => {
                if !finite_pos(b) {
                    problems.push(format!(
                        "{role}.nic.kv_bytes_per_token must be positive, got {b}"
                    ));
                }
                Some(b)
            }
            (None, r, _) => r,
        };
        let (tokens, bytes) = match (n.tokens_per_s, n.bytes_per_s, n.gbps) {
            (Some(t), None, None) => {
                if !finite_pos(t) {
                    problems.push(format!("{role}.nic.tokens_per_s must be positive, got {t}"));
                }
                if n.kv_bytes_per_token.is_some() {
                    problems.push(format!(
                        "{role}.nic: kv_bytes_per_token goes with bytes_per_s or gbps, not tokens_per_s"
                    ));
                }
                (t, None)
            }
            (None, Some(b), None) | (None, None, Some(b)) => {
                let (name, bytes) = if n.gbps.is_some() {
                    ("gbps", nic::gbps_to_bytes_per_s(b))
                } else {
                    ("bytes_per_s", b)
                };
                if !finite_pos(b) {
                    problems.push(format!("{role}.nic.{name} must be positive, got {b}"));
                }
                match per_token {
                    Some(per) => (bytes / per, Some(bytes)),
                    None => {
                        problems.push(format!(
                            "{role}.nic.{name} needs kv_bytes_per_token, or a `model` to derive it from"
                        ));
                        (0.0, None)
                    }
                }
            }
            _ => {
                problems.push(format!(
                    "{role}.nic: give one of tokens_per_s, bytes_per_s or gbps (with kv_bytes_per_token when the pool has no model)"
                ));
                (0.0, None)
            }
        };
        out.push(PoolPlan {
            pod: partial.pod,
            memory: partial.memory,
            num_gpu_blocks: partial.num_gpu_blocks,
            tp: partial.tp,
            nics,
            nic_tokens_per_s: tokens,
            nic_bytes_per_s: bytes,
            read_bytes_per_token: bytes.and(per_token),
            cost: partial.cost?,
        });
    }
    let [p, d]: [PoolPlan; 2] = out.try_into().ok()?;
    Some([p, d])
}
