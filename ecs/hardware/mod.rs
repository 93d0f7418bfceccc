//! Physical deployments: models (from a Hugging Face `config.json`), GPUs,
//! tensor parallelism, KV memory as vLLM sizes it, NICs in Gb/s, and the
//! physical step-time models (docs/hardware.md has every formula).
//!
//! | file | what |
//! |---|---|
//! | [`model`] | a model's architecture; KV bytes, weight bytes and FLOPs per rank |
//! | [`gpu`] | a GPU's datasheet figures |
//! | [`presets`] | the model and GPU presets of `lib/` |
//! | [`memory`] | `num_gpu_blocks` as vLLM's memory profiling derives it |
//! | [`nic`] | NIC rates in KV tokens, and the fan-out of a read over TP ranks |
//! | [`shape`] | a step's composition |
//! | [`roofline`] | a step's time from FLOPs and bytes |
//! | [`table`] | a step's time from the user's measurements |

pub mod gpu;
pub mod memory;
pub mod model;
pub mod nic;
pub mod presets;
pub mod roofline;
pub mod shape;
pub mod table;

pub use gpu::GpuSpec;
pub use memory::MemoryPlan;
pub use model::{ModelSpec, Quantization};
pub use roofline::{Efficiency, Roofline};
pub use shape::StepShape;
pub use table::StepTable;

/// One pod (a vLLM instance): a model on `tp` GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct Pod {
    pub model: ModelSpec,
    pub gpu: GpuSpec,
    pub tp: u32,
    /// `--kv-cache-dtype` (`auto`: the model's dtype).
    pub kv_cache_dtype: String,
    pub kv_dtype_bytes: f64,
    /// vLLM's hybrid KV-cache manager (on unless
    /// `--disable-hybrid-kv-cache-manager`): sliding-window layers keep only
    /// their window.
    pub hybrid_kv_cache: bool,
}

impl Pod {
    /// Layers whose KV a pool block holds for every token. Without sliding
    /// windows (or with the hybrid manager off) every layer; with the
    /// hybrid manager vLLM puts layers in groups of equal size (the smaller
    /// of the full and sliding counts, or the larger when it is under 1.5×
    /// the smaller) and a block holds one group: the full-attention groups
    /// are what grows with the context.
    pub fn pool_layers(&self) -> u32 {
        let (full, sliding) = (
            self.model.full_attention_layers(),
            self.model.sliding_layers,
        );
        if !self.hybrid_kv_cache || sliding == 0 || full == 0 {
            return self.model.layers;
        }
        let (small, large) = (full.min(sliding), full.max(sliding));
        let group = if f64::from(large) < 1.5 * f64::from(small) {
            large
        } else {
            small
        };
        full.div_ceil(group) * group
    }

    /// Layers whose KV a read moves for every token (the sliding layers'
    /// windows, a few blocks per read, are not counted).
    pub fn transfer_layers(&self) -> u32 {
        if self.hybrid_kv_cache {
            self.model.full_attention_layers()
        } else {
            self.model.layers
        }
    }

    /// KV bytes one rank caches per token, over the pool's layers.
    pub fn kv_bytes_per_token(&self) -> f64 {
        f64::from(self.pool_layers()) * self.kv_bytes_per_token_layer()
    }

    pub fn kv_bytes_per_token_layer(&self) -> f64 {
        self.model
            .kv_bytes_per_token_layer(self.tp, self.kv_dtype_bytes)
    }

    /// Bytes of one KV block over all the pool's layers, on one rank.
    pub fn block_bytes(&self, block_size: u32) -> f64 {
        f64::from(block_size) * self.kv_bytes_per_token()
    }

    /// KV bytes a read into this pod moves per token, over all its ranks
    /// (each rank receives what it caches; MLA's latent goes to every rank).
    pub fn read_bytes_per_token(&self) -> f64 {
        f64::from(self.tp) * f64::from(self.transfer_layers()) * self.kv_bytes_per_token_layer()
    }

    pub fn weight_bytes(&self) -> f64 {
        self.model.weight_bytes(self.tp)
    }
}
