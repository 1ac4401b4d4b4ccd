//! `ModelConfig`: the decoder hyper-parameters of an HF `config.json` for the supported
//! families, as data. Reading and writing the file is `json.rs`'s, checking it
//! `validate.rs`'s, what its family implies (biases, parameters) `derived.rs`'s;
//! family-specific keys are declared in `family/`. It does not know about tokenizers,
//! presets (see `preset.rs`) or weights.

pub use crate::config::family::kind::Family;
pub use crate::moe::config::MoeConfig;
use serde_json::{Map, Value};

/// RoPE frequency scaling (`rope_scaling` / `rope_parameters` in config.json).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Llama 3.x `rope_type: "llama3"`.
    Llama3 {
        /// Divisor applied to low frequencies (8 in Llama 3.1).
        factor: f64,
        /// Wavelength threshold (as a divisor of the original context) below which
        /// frequencies are fully scaled.
        low_freq_factor: f64,
        /// Wavelength threshold above which frequencies are kept.
        high_freq_factor: f64,
        /// Context length the base model was trained with.
        original_max_position_embeddings: usize,
    },
    /// `rope_type: "linear"`: every inverse frequency is divided by `factor`.
    Linear {
        /// Position interpolation factor.
        factor: f64,
    },
}

/// Decoder hyper-parameters, parsed from an HF `config.json`.
///
/// Field names follow HF. Keys this crate does not interpret are kept in `extra` and written back
/// unchanged by [`ModelConfig::to_hf_json`].
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Model family (`model_type`).
    pub family: Family,
    /// Number of token embeddings / logits.
    pub vocab_size: usize,
    /// Residual stream width `H`.
    pub hidden_size: usize,
    /// Width of the SiLU-gated MLP.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Number of query heads.
    pub num_attention_heads: usize,
    /// Number of key/value heads (GQA); defaults to `num_attention_heads`.
    pub num_key_value_heads: usize,
    /// Per-head width; defaults to `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Optional RoPE frequency scaling.
    pub rope_scaling: Option<RopeScaling>,
    /// Longest context the model claims to support (informational; not enforced).
    pub max_position_embeddings: usize,
    /// The LM head reuses `model.embed_tokens.weight` (no `lm_head.weight` tensor).
    pub tie_word_embeddings: bool,
    /// Llama `attention_bias`: bias on q/k/v/o projections. Ignored for qwen2 (q/k/v bias
    /// always, o never) and mistral (never).
    pub attention_bias: bool,
    /// Llama `mlp_bias`: bias on gate/up/down projections (llama only).
    pub mlp_bias: bool,
    /// Sliding attention window in tokens: key `j` is visible to query `i` iff `i - j < window`.
    /// `None` disables it (qwen2 with `use_sliding_window: false`).
    pub sliding_window: Option<usize>,
    /// First layer index that uses the sliding window (qwen2 `max_window_layers`; 0 for mistral).
    pub max_window_layers: usize,
    /// Beginning-of-sequence token id.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token ids (config.json may hold an int or a list).
    pub eos_token_id: Vec<u32>,
    /// Padding token id (needed by HF sequence classifiers to find the last real token).
    pub pad_token_id: Option<u32>,
    /// Mixture-of-experts hyper-parameters (`None` for the dense families).
    pub moe: Option<MoeConfig>,
    /// Keys of config.json this crate does not interpret, kept for the round trip.
    pub extra: Map<String, Value>,
}

impl ModelConfig {
    /// Sliding attention window of layer `layer` (`None` = full causal attention).
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        match self.sliding_window {
            Some(w) if layer >= self.max_window_layers => Some(w),
            _ => None,
        }
    }

    /// Whether decoder layer `layer` is a sparse MoE block (never for the dense families).
    pub fn is_sparse_layer(&self, layer: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.is_sparse_layer(layer))
    }
}
