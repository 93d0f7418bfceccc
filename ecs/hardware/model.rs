//! A model's architecture as its Hugging Face `config.json` states it, and
//! what follows from it on one tensor-parallel rank: KV bytes per token,
//! weight bytes, FLOPs per token (docs/hardware.md has the formulas).
//!
//! Parameter counts cover the matrices (attention projections, MLP or
//! experts, the MoE router, embeddings and the LM head); norms and biases
//! (under 0.1 % of any preset) are left out.

use serde_json::Value;
use std::path::Path;

use crate::error::{Error, Result};

/// How the weights are stored (`quantization_config.quant_method`, or
/// vLLM's `--quantization fp8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantization {
    /// Every matrix in the model's dtype.
    None,
    /// The layers' matrices in 8 bits (block scales not counted);
    /// embeddings and the LM head in the model's dtype.
    Fp8,
    /// MoE experts in MXFP4 (4 bits + one 8-bit scale per 32: 4.25 bits);
    /// the rest in the model's dtype (gpt-oss).
    Mxfp4,
}

/// Mixture of experts (every layer from `dense_layers` on).
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    pub experts: u32,
    /// Experts each token is routed to.
    pub active: u32,
    /// Intermediate size of one expert.
    pub intermediate: u32,
    /// Shared experts every token goes through (DeepSeek).
    pub shared: u32,
    /// The first layers keep a dense MLP (`first_k_dense_replace`).
    pub dense_layers: u32,
}

/// Multi-head latent attention (DeepSeek-V2/V3): one latent of
/// `kv_lora_rank + qk_rope_head_dim` per token and layer is cached.
#[derive(Clone, Debug, PartialEq)]
pub struct Mla {
    pub q_lora_rank: Option<u32>,
    pub kv_lora_rank: u32,
    pub qk_nope_head_dim: u32,
    pub qk_rope_head_dim: u32,
    pub v_head_dim: u32,
}

/// A model, from its `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    /// The preset's name or the file it was read from.
    pub name: String,
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Intermediate size of the dense MLP layers.
    pub intermediate: u32,
    pub vocab: u32,
    pub tied_embeddings: bool,
    /// Bytes per weight and activation element (`torch_dtype`).
    pub dtype_bytes: f64,
    pub dtype: String,
    pub quantization: Quantization,
    pub moe: Option<Moe>,
    pub mla: Option<Mla>,
    /// Sliding-window attention: the window, and how many layers use it.
    pub sliding_window: Option<u32>,
    pub sliding_layers: u32,
    pub max_position_embeddings: Option<u32>,
}

/// Bytes of one element of a dtype as config.json or vLLM name it.
pub fn dtype_bytes(name: &str) -> Option<f64> {
    match name {
        "bfloat16" | "float16" | "half" | "bf16" | "fp16" => Some(2.0),
        "float32" | "float" | "fp32" => Some(4.0),
        "fp8" | "fp8_e4m3" | "fp8_e5m2" | "float8_e4m3fn" | "int8" => Some(1.0),
        _ => None,
    }
}

impl ModelSpec {
    /// Reads a `config.json` (text `text`, from `file`).
    pub fn from_config_json(text: &str, file: &Path, name: &str) -> Result<ModelSpec> {
        let v: Value = serde_json::from_str(text).map_err(|e| {
            Error::new(format!(
                "{}:{}:{}: not a valid config.json: {e}",
                file.display(),
                e.line(),
                e.column()
            ))
        })?;
        // Multimodal configs keep the language model under `text_config`.
        let v = v.get("text_config").unwrap_or(&v);
        let at = |what: &str| format!("{}: {what}", file.display());
        let get_u32 = |key: &str| -> Result<Option<u32>> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| {
                        Error::new(at(&format!(
                            "field `{key}` must be a whole number, got {x}"
                        )))
                    }),
            }
        };
        let need = |key: &str| -> Result<u32> {
            get_u32(key)?.ok_or_else(|| {
                Error::new(at(&format!(
                    "field `{key}` is missing; pdsim needs it to size the model"
                )))
            })
        };
        let first = |keys: &[&str]| -> Result<Option<u32>> {
            for k in keys {
                if let Some(x) = get_u32(k)? {
                    return Ok(Some(x));
                }
            }
            Ok(None)
        };
        let layers = need("num_hidden_layers")?;
        let hidden = need("hidden_size")?;
        let heads = need("num_attention_heads")?;
        let vocab = need("vocab_size")?;
        let intermediate = need("intermediate_size")?;
        let kv_heads = get_u32("num_key_value_heads")?.unwrap_or(heads);
        let head_dim = match get_u32("head_dim")? {
            Some(h) => h,
            None => {
                if heads == 0 || hidden % heads != 0 {
                    return Err(Error::new(at(&format!(
                        "field `head_dim` is missing and hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads})"
                    ))));
                }
                hidden / heads
            }
        };
        for (key, x) in [
            ("num_hidden_layers", layers),
            ("hidden_size", hidden),
            ("num_attention_heads", heads),
            ("num_key_value_heads", kv_heads),
            ("vocab_size", vocab),
            ("head_dim", head_dim),
        ] {
            if x == 0 {
                return Err(Error::new(at(&format!("field `{key}` must be above 0"))));
            }
        }
        // `torch_dtype` (renamed `dtype` in recent transformers); vLLM's
        // `--dtype auto` runs float32 checkpoints in bfloat16.
        let dtype = v
            .get("torch_dtype")
            .or_else(|| v.get("dtype"))
            .and_then(Value::as_str)
            .unwrap_or("bfloat16");
        let dtype = if dtype == "float32" {
            "bfloat16"
        } else {
            dtype
        };
        let dtype_bytes = dtype_bytes(dtype).ok_or_else(|| {
            Error::new(at(&format!(
                "`torch_dtype` {dtype:?} is not one pdsim knows (bfloat16, float16, float32)"
            )))
        })?;
        let quantization = match v
            .get("quantization_config")
            .and_then(|q| q.get("quant_method"))
            .and_then(Value::as_str)
        {
            None => Quantization::None,
            Some("fp8") => Quantization::Fp8,
            Some("mxfp4") => Quantization::Mxfp4,
            Some(other) => {
                return Err(Error::new(at(&format!(
                    "quant_method {other:?} is not one pdsim sizes (fp8, mxfp4)"
                ))));
            }
        };
        let experts = first(&["num_local_experts", "n_routed_experts", "num_experts"])?;
        let moe = match experts {
            Some(e) if e > 1 => {
                let active =
                    first(&["num_experts_per_tok", "experts_per_token"])?.ok_or_else(|| {
                        Error::new(at(
                            "field `num_experts_per_tok` is missing for a mixture-of-experts model",
                        ))
                    })?;
                Some(Moe {
                    experts: e,
                    active,
                    intermediate: get_u32("moe_intermediate_size")?.unwrap_or(intermediate),
                    shared: get_u32("n_shared_experts")?.unwrap_or(0),
                    dense_layers: get_u32("first_k_dense_replace")?.unwrap_or(0).min(layers),
                })
            }
            _ => None,
        };
        let mla = match get_u32("kv_lora_rank")? {
            Some(kv_lora_rank) => Some(Mla {
                q_lora_rank: get_u32("q_lora_rank")?,
                kv_lora_rank,
                qk_nope_head_dim: need("qk_nope_head_dim")?,
                qk_rope_head_dim: need("qk_rope_head_dim")?,
                v_head_dim: need("v_head_dim")?,
            }),
            None => None,
        };
        let window = get_u32("sliding_window")?;
        let sliding_layers = match (window, v.get("layer_types").and_then(Value::as_array)) {
            (Some(_), Some(types)) => types
                .iter()
                .filter(|t| t.as_str() == Some("sliding_attention"))
                .count() as u32,
            (Some(_), None) if v.get("use_sliding_window") != Some(&Value::Bool(false)) => layers,
            _ => 0,
        };
        Ok(ModelSpec {
            name: name.to_string(),
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab,
            tied_embeddings: v.get("tie_word_embeddings") == Some(&Value::Bool(true)),
            dtype_bytes,
            dtype: dtype.to_string(),
            quantization,
            moe,
            mla,
            sliding_window: window.filter(|_| sliding_layers > 0),
            sliding_layers,
            max_position_embeddings: get_u32("max_position_embeddings")?,
        })
    }

    /// Why this model cannot be split over `tp` ranks, if it cannot (vLLM's
    /// own checks: query heads divide evenly; KV heads divide evenly or are
    /// replicated evenly).
    pub fn tp_problem(&self, tp: u32) -> Option<String> {
        if tp == 0 {
            return Some("tensor_parallel_size must be at least 1".into());
        }
        if !self.heads.is_multiple_of(tp) {
            return Some(format!(
                "{} has {} attention heads, which tensor_parallel_size {tp} does not divide",
                self.name, self.heads
            ));
        }
        if self.mla.is_none()
            && !self.kv_heads.is_multiple_of(tp)
            && !tp.is_multiple_of(self.kv_heads)
        {
            return Some(format!(
                "{} has {} KV heads: tensor_parallel_size {tp} neither divides them nor is a multiple of them",
                self.name, self.kv_heads
            ));
        }
        None
    }

    /// Layers with a dense MLP, and with experts.
    pub fn dense_and_moe_layers(&self) -> (u32, u32) {
        match &self.moe {
            None => (self.layers, 0),
            Some(m) => (m.dense_layers, self.layers - m.dense_layers),
        }
    }

    pub fn full_attention_layers(&self) -> u32 {
        self.layers - self.sliding_layers
    }

    /// Query heads on one rank.
    pub fn heads_per_rank(&self, tp: u32) -> f64 {
        f64::from(self.heads) / f64::from(tp)
    }

    /// KV heads on one rank: split, or replicated when TP exceeds them
    /// (vLLM: `max(1, kv_heads / tp)`).
    pub fn kv_heads_per_rank(&self, tp: u32) -> f64 {
        (f64::from(self.kv_heads) / f64::from(tp)).max(1.0)
    }

    /// KV bytes one rank caches per token and layer: K and V of its KV
    /// heads, or MLA's latent (the same on every rank).
    pub fn kv_bytes_per_token_layer(&self, tp: u32, kv_dtype_bytes: f64) -> f64 {
        match &self.mla {
            Some(m) => f64::from(m.kv_lora_rank + m.qk_rope_head_dim) * kv_dtype_bytes,
            None => 2.0 * self.kv_heads_per_rank(tp) * f64::from(self.head_dim) * kv_dtype_bytes,
        }
    }

    /// Attention-projection parameters of one layer on one rank.
    pub fn attention_params(&self, tp: u32) -> f64 {
        let h = f64::from(self.hidden);
        let heads = self.heads_per_rank(tp);
        match &self.mla {
            // q_a and kv_a are replicated on every rank (vLLM's
            // ReplicatedLinear); q_b, kv_b and o are split.
            Some(m) => {
                let qk = f64::from(m.qk_nope_head_dim + m.qk_rope_head_dim);
                let q = match m.q_lora_rank {
                    Some(r) => h * f64::from(r) + f64::from(r) * heads * qk,
                    None => h * heads * qk,
                };
                let kv_a = h * f64::from(m.kv_lora_rank + m.qk_rope_head_dim);
                let kv_b = f64::from(m.kv_lora_rank)
                    * heads
                    * f64::from(m.qk_nope_head_dim + m.v_head_dim);
                let o = heads * f64::from(m.v_head_dim) * h;
                q + kv_a + kv_b + o
            }
            None => {
                let d = f64::from(self.head_dim);
                let kv = self.kv_heads_per_rank(tp);
                h * d * (heads + 2.0 * kv) + heads * d * h
            }
        }
    }

    /// Dense-MLP parameters of one layer on one rank (gate, up, down).
    pub fn dense_mlp_params(&self, tp: u32) -> f64 {
        3.0 * f64::from(self.hidden) * f64::from(self.intermediate) / f64::from(tp)
    }

    /// One expert's parameters on one rank (experts are split by TP).
    pub fn expert_params(&self, tp: u32) -> f64 {
        match &self.moe {
            Some(m) => 3.0 * f64::from(self.hidden) * f64::from(m.intermediate) / f64::from(tp),
            None => 0.0,
        }
    }

    /// The MoE router of one layer (replicated).
    pub fn router_params(&self) -> f64 {
        match &self.moe {
            Some(m) => f64::from(self.hidden) * f64::from(m.experts),
            None => 0.0,
        }
    }

    /// The input embedding and the LM head on one rank (both split by
    /// vocabulary); one matrix when they are tied.
    pub fn embedding_params(&self, tp: u32) -> f64 {
        let one = f64::from(self.vocab) * f64::from(self.hidden) / f64::from(tp);
        if self.tied_embeddings { one } else { 2.0 * one }
    }

    /// Bytes per parameter of the layers' matrices, and of the experts.
    pub fn layer_weight_bytes(&self) -> (f64, f64) {
        match self.quantization {
            Quantization::None => (self.dtype_bytes, self.dtype_bytes),
            Quantization::Fp8 => (1.0, 1.0),
            Quantization::Mxfp4 => (self.dtype_bytes, 4.25 / 8.0),
        }
    }

    /// Parameters of the whole model (every expert, TP 1).
    pub fn total_params(&self) -> f64 {
        let (dense, moe) = self.dense_and_moe_layers();
        let per_moe = match &self.moe {
            Some(m) => {
                f64::from(m.experts + m.shared) * self.expert_params(1) + self.router_params()
            }
            None => 0.0,
        };
        f64::from(self.layers) * self.attention_params(1)
            + f64::from(dense) * self.dense_mlp_params(1)
            + f64::from(moe) * per_moe
            + self.embedding_params(1)
    }

    /// Parameters one token goes through (its routed and shared experts),
    /// excluding the input embedding (a lookup), TP 1.
    pub fn active_params(&self) -> f64 {
        let (dense, moe) = self.dense_and_moe_layers();
        let per_moe = match &self.moe {
            Some(m) => {
                f64::from(m.active + m.shared) * self.expert_params(1) + self.router_params()
            }
            None => 0.0,
        };
        let lm_head = f64::from(self.vocab) * f64::from(self.hidden);
        f64::from(self.layers) * self.attention_params(1)
            + f64::from(dense) * self.dense_mlp_params(1)
            + f64::from(moe) * per_moe
            + lm_head
    }

    /// Weight bytes one rank holds.
    pub fn weight_bytes(&self, tp: u32) -> f64 {
        let (dense, moe) = self.dense_and_moe_layers();
        let (lw, ew) = self.layer_weight_bytes();
        let per_moe = match &self.moe {
            Some(m) => {
                f64::from(m.experts) * self.expert_params(tp) * ew
                    + f64::from(m.shared) * self.expert_params(tp) * lw
                    + self.router_params() * self.dtype_bytes
            }
            None => 0.0,
        };
        f64::from(self.layers) * self.attention_params(tp) * lw
            + f64::from(dense) * self.dense_mlp_params(tp) * lw
            + f64::from(moe) * per_moe
            + self.embedding_params(tp) * self.dtype_bytes
    }

    /// Matrix FLOPs per token on one rank (2 per active parameter, the LM
    /// head included); attention over the context comes on top.
    pub fn flops_per_token(&self, tp: u32) -> f64 {
        let (dense, moe) = self.dense_and_moe_layers();
        let per_moe = match &self.moe {
            Some(m) => {
                f64::from(m.active + m.shared) * self.expert_params(tp) + self.router_params()
            }
            None => 0.0,
        };
        2.0 * (f64::from(self.layers) * self.attention_params(tp)
            + f64::from(dense) * self.dense_mlp_params(tp)
            + f64::from(moe) * per_moe
            + f64::from(self.vocab) * f64::from(self.hidden) / f64::from(tp))
    }

    /// Attention FLOPs per (query token, cached token) pair in one layer on
    /// one rank: `Q·Kᵀ` and `P·V`, 2 FLOPs per multiply-add.
    pub fn attention_flops_per_pair(&self, tp: u32) -> f64 {
        let heads = self.heads_per_rank(tp);
        match &self.mla {
            // Counted as vLLM's prefill path runs it (keys and values
            // expanded per head).
            Some(m) => {
                2.0 * heads * f64::from(m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
            }
            None => 4.0 * heads * f64::from(self.head_dim),
        }
    }
}
