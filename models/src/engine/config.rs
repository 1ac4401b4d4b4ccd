//! Engine settings: KV block size and pool size (from a memory budget or a block count), the
//! batching limits and the rollout weight precision. Plain data with defaults and validation;
//! the pool itself lives in `block_pool.rs`.

use crate::config::model_config::ModelConfig;
use crate::engine::error::{EngineError, EngineResult};

/// Precision of the engine's linear-layer weights (embedding and norms stay f32). In a
/// recipe (`engine.quant`) it is spelled `none`, `bf16`, `int8` or `q4`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuantMode {
    /// f32, the trainer's precision: log-probs match the trainer's within 1e-5.
    #[default]
    None,
    /// bf16 weights (round to nearest even), f32 activations and sums on the CPU (half the
    /// weight bytes of f32); bf16 matmuls on other devices.
    Bf16,
    /// W8A8 int8: per-output-channel int8 weights, per-row int8 activations, exact integer
    /// products (AVX-512 VNNI where the CPU has it) on the CPU; ggml `Q8_0` on other devices.
    Int8,
    /// 4-bit blocks of 32 (ggml `Q4_0`) through candle's quantized matmul.
    Q4,
}

impl std::str::FromStr for QuantMode {
    type Err = crate::error::UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" | "f32" => Ok(QuantMode::None),
            "bf16" => Ok(QuantMode::Bf16),
            "int8" | "q8" | "q8_0" => Ok(QuantMode::Int8),
            "q4" | "int4" | "q4_0" => Ok(QuantMode::Q4),
            _ => Err(crate::error::UnknownName {
                what: "quant mode",
                got: s.to_string(),
                expected: "none, bf16, int8 or q4".into(),
            }),
        }
    }
}

/// Settings of one [`crate::engine::Engine`].
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Tokens per KV block (default 16).
    pub block_size: usize,
    /// Number of KV blocks in the pool; when `None` it is derived from `kv_memory_bytes`.
    pub num_blocks: Option<usize>,
    /// KV pool budget in bytes (K and V of every layer, f32), used when `num_blocks` is
    /// `None` (default 512 MiB). Pages are touched only when used.
    pub kv_memory_bytes: usize,
    /// Most tokens (prefill chunks + decode tokens) in one forward step (default 2048).
    pub max_batched_tokens: usize,
    /// Most sequences in the running batch (default 256). A group of samples of one prompt
    /// is admitted together, so an otherwise idle engine may exceed it by that group.
    pub max_running: usize,
    /// Share the prompt's KV blocks between requests with identical prompts (default true).
    pub prefix_sharing: bool,
    /// Keep the full KV blocks of finished sequences, at the served weights, for later
    /// requests that start with the same tokens: the next turn of an episode prefills only
    /// the reply and its own turn (default true; cleared by every refit).
    pub prefix_cache: bool,
    /// Linear-layer weight precision (default f32).
    pub quant: QuantMode,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            block_size: 16,
            num_blocks: None,
            kv_memory_bytes: 512 << 20,
            max_batched_tokens: 2048,
            max_running: 256,
            prefix_sharing: true,
            prefix_cache: true,
            quant: QuantMode::None,
        }
    }
}

impl EngineConfig {
    /// Bytes one KV block takes for `model` (K and V, all layers, f32).
    pub fn block_bytes(&self, model: &ModelConfig) -> usize {
        2 * model.num_hidden_layers
            * model.num_key_value_heads
            * model.head_dim
            * self.block_size
            * std::mem::size_of::<f32>()
    }

    /// The pool size in blocks for `model`, checking the settings.
    pub fn resolve_num_blocks(&self, model: &ModelConfig) -> EngineResult<usize> {
        if self.block_size == 0 {
            return Err(EngineError::Config {
                key: "block_size",
                message: "must be at least 1".into(),
            });
        }
        if self.max_batched_tokens == 0 {
            return Err(EngineError::Config {
                key: "max_batched_tokens",
                message: "must be at least 1".into(),
            });
        }
        if self.max_running == 0 {
            return Err(EngineError::Config {
                key: "max_running",
                message: "must be at least 1".into(),
            });
        }
        let n = match self.num_blocks {
            Some(n) => n,
            None => self.kv_memory_bytes / self.block_bytes(model).max(1),
        };
        if n == 0 {
            return Err(EngineError::Config {
                key: "kv_memory_bytes",
                message: format!(
                    "{} bytes hold no KV block (one block takes {} bytes)",
                    self.kv_memory_bytes,
                    self.block_bytes(model)
                ),
            });
        }
        Ok(n)
    }
}
