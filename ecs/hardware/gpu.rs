//! A GPU's datasheet figures (presets in `lib/gpus/`, one RON file each;
//! a user adds their own the same way).

use serde::{Deserialize, Serialize};

/// What the roofline and the memory profile need of a GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    pub name: String,
    /// Total memory as CUDA (or ROCm) reports it to a process, which is what
    /// vLLM multiplies by `gpu_memory_utilization`; MiB.
    pub memory_mib: f64,
    /// Dense (not 2:4 sparse) tensor-core peak, TFLOP/s.
    pub bf16_tflops: f64,
    #[serde(default)]
    pub fp8_tflops: Option<f64>,
    /// HBM (or GDDR) bandwidth, TB/s.
    pub memory_tb_per_s: f64,
    /// GPU-to-GPU bandwidth within a node (NVLink, Infinity Fabric, or
    /// PCIe), both directions together as vendors quote it, GB/s.
    pub interconnect_gb_per_s: f64,
}

impl GpuSpec {
    pub fn memory_bytes(&self) -> f64 {
        self.memory_mib * 1024.0 * 1024.0
    }
    pub fn bf16_flops(&self) -> f64 {
        self.bf16_tflops * 1e12
    }
    /// FP8 peak; GPUs without FP8 tensor cores run FP8 weights at BF16 speed.
    pub fn fp8_flops(&self) -> f64 {
        self.fp8_tflops.unwrap_or(self.bf16_tflops) * 1e12
    }
    pub fn memory_bytes_per_s(&self) -> f64 {
        self.memory_tb_per_s * 1e12
    }
    /// One direction of the interconnect (what a ring all-reduce uses), B/s.
    pub fn interconnect_bytes_per_s(&self) -> f64 {
        self.interconnect_gb_per_s * 1e9 / 2.0
    }

    /// Why these figures cannot describe a GPU, if they cannot.
    pub fn problem(&self) -> Option<String> {
        let fields = [
            ("memory_mib", self.memory_mib),
            ("bf16_tflops", self.bf16_tflops),
            ("memory_tb_per_s", self.memory_tb_per_s),
            ("interconnect_gb_per_s", self.interconnect_gb_per_s),
            ("fp8_tflops", self.fp8_tflops.unwrap_or(1.0)),
        ];
        fields
            .iter()
            .find(|(_, v)| !(v.is_finite() && *v > 0.0))
            .map(|(k, v)| format!("GPU {}: {k} must be a positive number, got {v}", self.name))
    }
}
