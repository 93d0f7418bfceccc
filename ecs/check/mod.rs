//! `pdsim check`: everything a scenario derives before it runs — per pool
//! the model's and GPU's figures, KV bytes per token, weight bytes, the
//! memory profile behind `num_gpu_blocks`, NIC rates in KV tokens, and the
//! step time of a few probe batches — so a user can hold them against
//! their own measurements (docs/hardware.md).
//!
//! | file | what |
//! |---|---|
//! | [`latency`] | `vllm bench latency` on one simulated engine |

use serde::Serialize;
use std::fmt::Write as _;

use crate::engine::cost::StepTime;
use crate::hardware::memory::GIB;
use crate::hardware::{MemoryPlan, Pod, StepShape};
use crate::scenario::{CostPlan, Pool, PoolPlan, Scenario};

pub mod latency;

pub use latency::{Latency, LatencyArgs};

/// A probe batch: its name and shape.
fn probes(window: Option<u32>) -> Vec<(&'static str, StepShape)> {
    let decodes = |n: u32| {
        let mut s = StepShape::default();
        for _ in 0..n {
            s.add(4095, 1, 0, window);
        }
        s
    };
    let mut chunk = StepShape::default();
    chunk.add(0, 2048, 2048, window);
    vec![
        ("1 decode at 4096 tokens of context", decodes(1)),
        ("64 decodes at 4096 tokens of context", decodes(64)),
        ("one 2048-token prefill chunk", chunk),
    ]
}

#[derive(Debug, Serialize)]
pub struct Probe {
    pub batch: String,
    pub seconds: f64,
    /// The roofline's terms (physical pools).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roofline: Option<crate::hardware::roofline::Breakdown>,
}

#[derive(Debug, Serialize)]
pub struct ModelFigures {
    pub name: String,
    pub layers: u32,
    pub full_attention_layers: u32,
    pub sliding_window_layers: u32,
    pub sliding_window: Option<u32>,
    pub hidden_size: u32,
    pub attention_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub experts: Option<u32>,
    pub active_experts: Option<u32>,
    pub mla: bool,
    pub dtype: String,
    pub quantization: String,
    pub total_params: f64,
    pub active_params: f64,
}

/// A physical pool's derived figures, per GPU (one TP rank).
#[derive(Debug, Serialize)]
pub struct PodFigures {
    pub model: ModelFigures,
    pub gpu: crate::hardware::GpuSpec,
    pub tensor_parallel_size: u32,
    pub kv_cache_dtype: String,
    pub weight_bytes: f64,
    pub kv_layers: u32,
    pub kv_bytes_per_token: f64,
    pub block_bytes: f64,
    pub flops_per_token: f64,
    /// The memory profile (with `kv_cache_memory_bytes`, that figure is the
    /// KV memory).
    pub memory: MemoryPlan,
}

#[derive(Debug, Serialize)]
pub struct PoolFigures {
    pub role: &'static str,
    pub count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodFigures>,
    pub num_gpu_blocks: u32,
    /// Whether `num_gpu_blocks` was given rather than derived.
    pub num_gpu_blocks_given: bool,
    pub block_size: u32,
    pub kv_capacity_tokens: u64,
    pub nics: u32,
    pub nic_bytes_per_s: Option<f64>,
    pub read_bytes_per_token: Option<f64>,
    pub nic_tokens_per_s: f64,
    pub step_time: String,
    pub probes: Vec<Probe>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub latency: Vec<Latency>,
}

/// What `pdsim check` prints (and writes with `--json`).
#[derive(Debug, Serialize)]
pub struct Derived {
    pub scenario: String,
    pub pools: Vec<PoolFigures>,
}

fn model_figures(pod: &Pod) -> ModelFigures {
    let m = &pod.model;
    ModelFigures {
        name: m.name.clone(),
        layers: m.layers,
        full_attention_layers: m.full_attention_layers(),
        sliding_window_layers: m.sliding_layers,
        sliding_window: m.sliding_window,
        hidden_size: m.hidden,
        attention_heads: m.heads,
        kv_heads: m.kv_heads,
        head_dim: m.head_dim,
        experts: m.moe.as_ref().map(|e| e.experts),
        active_experts: m.moe.as_ref().map(|e| e.active),
        mla: m.mla.is_some(),
        dtype: m.dtype.clone(),
        quantization: format!("{:?}", m.quantization),
        total_params: m.total_params(),
        active_params: m.active_params(),
    }
}

fn step_time_name(plan: &PoolPlan) -> String {
    match &plan.cost {
        CostPlan::Linear(c) => format!(
            "Linear (c0 {} s, a {} s/token, omega {} s, beta {} s/KV token)",
            c.c0, c.a, c.omega, c.beta
        ),
        CostPlan::Roofline(e) => format!(
            "Roofline (mfu {}, mbu {}, step_overhead {} s, allreduce_latency {} s)",
            e.mfu, e.mbu, e.step_overhead, e.allreduce_latency
        ),
        CostPlan::Table { file, table } => {
            let range = |k: usize, name: &str| {
                let a = &table.axes[k];
                format!("{name} {}–{} ({} values)", a[0], a[a.len() - 1], a.len())
            };
            format!(
                "Table ({}: {}, {}, {})",
                file.display(),
                range(0, "prefill_tokens"),
                range(1, "decode_requests"),
                range(2, "kv_tokens")
            )
        }
    }
}

fn pool_figures(
    role: &'static str,
    pool: &Pool,
    plan: &PoolPlan,
    latency: &[LatencyArgs],
) -> PoolFigures {
    let step_time = StepTime::of_plan(plan);
    let roofline = match &step_time {
        StepTime::Roofline(r) => Some(r),
        _ => None,
    };
    let probes = probes(step_time.window())
        .into_iter()
        .map(|(name, shape)| Probe {
            batch: name.to_string(),
            seconds: step_time.of_shape(&shape),
            roofline: roofline.map(|r| r.breakdown(&shape)),
        })
        .collect();
    let e = &pool.engine;
    PoolFigures {
        role,
        count: pool.count,
        pod: plan.pod.as_ref().map(|pod| PodFigures {
            model: model_figures(pod),
            gpu: pod.gpu.clone(),
            tensor_parallel_size: pod.tp,
            kv_cache_dtype: pod.kv_cache_dtype.clone(),
            weight_bytes: pod.weight_bytes(),
            kv_layers: pod.pool_layers(),
            kv_bytes_per_token: pod.kv_bytes_per_token(),
            block_bytes: pod.block_bytes(e.block_size),
            flops_per_token: pod.model.flops_per_token(pod.tp),
            memory: *plan.memory.as_ref().expect("a pod has a memory plan"),
        }),
        num_gpu_blocks: plan.num_gpu_blocks,
        num_gpu_blocks_given: e.num_gpu_blocks.is_some(),
        block_size: e.block_size,
        kv_capacity_tokens: u64::from(plan.num_gpu_blocks) * u64::from(e.block_size),
        nics: plan.nics,
        nic_bytes_per_s: plan.nic_bytes_per_s,
        read_bytes_per_token: plan.read_bytes_per_token,
        nic_tokens_per_s: plan.nic_tokens_per_s,
        step_time: step_time_name(plan),
        probes,
        latency: latency
            .iter()
            .map(|a| latency::run(pool, plan, *a))
            .collect(),
    }
}

impl Derived {
    pub fn of(scenario: &Scenario, latency: &[LatencyArgs]) -> Derived {
        let raw = &scenario.raw;
        Derived {
            scenario: raw.name.clone(),
            pools: vec![
                pool_figures("prefill", &raw.prefill, scenario.prefill(), latency),
                pool_figures("decode", &raw.decode, scenario.decode(), latency),
            ],
        }
    }

    pub fn to_json_text(&self) -> String {
        serde_json::to_string_pretty(self).expect("serializes") + "\n"
    }

    pub fn to_text(&self) -> String {
        let mut o = String::new();
        for p in &self.pools {
            let _ = writeln!(o);
            match &p.pod {
                Some(pod) => {
                    let _ = writeln!(
                        o,
                        "{}: {} pods × {} on {} × {} (tensor_parallel_size {})",
                        p.role,
                        p.count,
                        pod.model.name,
                        pod.tensor_parallel_size,
                        pod.gpu.name,
                        pod.tensor_parallel_size
                    );
                    write_pod(&mut o, pod);
                }
                None => {
                    let _ = writeln!(o, "{}: {} pods (abstract units)", p.role, p.count);
                }
            }
            let how = if p.num_gpu_blocks_given {
                "given"
            } else {
                "derived"
            };
            let _ = writeln!(
                o,
                "  KV blocks      num_gpu_blocks {} ({how}) × {} tokens = {} tokens",
                group(p.num_gpu_blocks as f64),
                p.block_size,
                group(p.kv_capacity_tokens as f64)
            );
            let nic = match (p.nic_bytes_per_s, p.read_bytes_per_token) {
                (Some(b), Some(per)) => format!(
                    "{} × {:.0} Gb/s ({:.2} GB/s) each; a read moves {} per token → {} tokens/s per NIC",
                    p.nics,
                    b * 8.0 / 1e9,
                    b / 1e9,
                    bytes(per),
                    group(p.nic_tokens_per_s)
                ),
                _ => format!("{} × {} tokens/s", p.nics, group(p.nic_tokens_per_s)),
            };
            let _ = writeln!(o, "  NICs           {nic}");
            let _ = writeln!(o, "  step time      {}", p.step_time);
            for probe in &p.probes {
                let bound = match &probe.roofline {
                    Some(b) if b.memory_bound => "  (memory-bound)",
                    Some(_) => "  (compute-bound)",
                    None => "",
                };
                let _ = writeln!(o, "    {:<40} {:>9}{bound}", probe.batch, ms(probe.seconds));
            }
            for l in &p.latency {
                let _ = writeln!(
                    o,
                    "  latency        batch {} × {} in / {} out: {} end to end (first token {}, {} steps, mean step after it {})",
                    l.batch_size,
                    l.input_len,
                    l.output_len,
                    ms(l.e2e),
                    ms(l.first_token),
                    l.steps,
                    ms(l.mean_decode_step)
                );
            }
        }
        o
    }
}

fn write_pod(o: &mut String, pod: &PodFigures) {
    let m = &pod.model;
    let mut arch = format!(
        "{} layers, hidden {}, {} heads, {} KV heads × {}",
        m.layers, m.hidden_size, m.attention_heads, m.kv_heads, m.head_dim
    );
    if m.mla {
        arch.push_str(" (MLA latent cache)");
    }
    if let Some(w) = m.sliding_window {
        let _ = write!(
            arch,
            ", {} sliding-window layers (window {w})",
            m.sliding_window_layers
        );
    }
    if let (Some(e), Some(a)) = (m.experts, m.active_experts) {
        let _ = write!(arch, ", {e} experts ({a} active)");
    }
    let _ = writeln!(
        o,
        "  model          {arch}; {} weights, quantization {}",
        m.dtype, m.quantization
    );
    let _ = writeln!(
        o,
        "  parameters     {:.2} B in all, {:.2} B per token",
        m.total_params / 1e9,
        m.active_params / 1e9
    );
    let g = &pod.gpu;
    let _ = writeln!(
        o,
        "  GPU            {}: {:.2} GiB, {} TFLOP/s BF16{}, {} TB/s, interconnect {} GB/s",
        g.name,
        g.memory_mib / 1024.0,
        g.bf16_tflops,
        g.fp8_tflops
            .map(|f| format!(" / {f} FP8"))
            .unwrap_or_default(),
        g.memory_tb_per_s,
        g.interconnect_gb_per_s
    );
    let _ = writeln!(o, "  per GPU        weights {}", gib(pod.weight_bytes));
    let _ = writeln!(
        o,
        "                 KV {} per token ({} layers × {}, kv_cache_dtype {})",
        bytes(pod.kv_bytes_per_token),
        pod.kv_layers,
        bytes(pod.kv_bytes_per_token / f64::from(pod.kv_layers)),
        pod.kv_cache_dtype
    );
    let _ = writeln!(
        o,
        "                 {:.1} GFLOP per token (matrices)",
        pod.flops_per_token / 1e9
    );
    let mm = &pod.memory;
    let _ = writeln!(
        o,
        "  memory         {} × {} = {} − weights {} − activations {} − non-torch {} − CUDA graphs {} = {} for KV",
        gib(mm.total),
        mm.utilization,
        gib(mm.requested),
        gib(mm.weights),
        gib(mm.activations),
        gib(mm.non_torch),
        gib(mm.cuda_graphs),
        gib(mm.kv_memory)
    );
    let _ = writeln!(
        o,
        "                 ÷ {} per block = {} blocks",
        bytes(pod.block_bytes),
        group(mm.num_gpu_blocks as f64)
    );
}

fn gib(b: f64) -> String {
    format!("{:.2} GiB", b / GIB)
}

fn bytes(b: f64) -> String {
    if b >= 1024.0 * 1024.0 {
        format!("{:.2} MiB", b / 1024.0 / 1024.0)
    } else if b >= 1024.0 {
        format!("{:.2} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

fn ms(s: f64) -> String {
    format!("{:.3} ms", s * 1e3)
}

/// A whole number with thin spaces between thousands: 1 234 567.
fn group(x: f64) -> String {
    let s = format!("{:.0}", x);
    let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    format!("{sign}{out}")
}
