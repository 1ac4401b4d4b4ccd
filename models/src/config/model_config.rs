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

/// The activation of the gated MLP: `down(act(gate(x)) * up(x))`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (`hidden_act: "silu"`, SwiGLU).
    #[default]
    Silu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`, GeGLU: Gemma).
    GeluTanh,
}

/// Where a decoder block departs from Llama's; the default is Llama's block. The Gemma
/// families set it (`family/gemma.rs`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockStyle {
    /// Added to every RMSNorm weight before it scales (Gemma: 1, so a stored weight `w`
    /// scales by `1 + w`, computed in f32 as HF does).
    pub norm_offset: f32,
    /// The token embeddings are multiplied by `sqrt(hidden_size)` (Gemma; in f32).
    pub scale_embeddings: bool,
    /// The gate's activation.
    pub activation: Activation,
    /// Gemma 2/3's four norms per layer: `post_attention_layernorm` normalises the
    /// attention's output before the residual add, `pre_feedforward_layernorm` and
    /// `post_feedforward_layernorm` wrap the MLP.
    pub sandwich_norms: bool,
    /// Attention scores scale by `query_pre_attn_scalar^-0.5` instead of `head_dim^-0.5`.
    pub query_pre_attn_scalar: Option<f64>,
    /// RoPE base of the sliding-window layers (Gemma 3 `rope_local_base_freq`, unscaled);
    /// `None`: every layer uses `rope_theta` and `rope_scaling`.
    pub local_rope_theta: Option<f64>,
    /// Attention scores become `c · tanh(s / c)` before the mask (Gemma 2's
    /// `attn_logit_softcapping`).
    pub attn_softcap: Option<f64>,
    /// The LM head's logits become `c · tanh(z / c)` (Gemma 2's `final_logit_softcapping`).
    pub final_softcap: Option<f64>,
}

/// Which layers slide when sliding and full layers interleave (Gemma).
#[derive(Clone, Debug, PartialEq)]
pub enum SlidingLayers {
    /// Every n-th layer (1-based) is full, the others slide (HF's `sliding_window_pattern`;
    /// holds for any layer count).
    EveryNthFull(usize),
    /// One flag per layer (`layer_types`: true = sliding).
    Listed(Vec<bool>),
}

impl SlidingLayers {
    /// Whether layer `layer` slides.
    pub fn slides(&self, layer: usize) -> bool {
        match self {
            SlidingLayers::EveryNthFull(n) => !(layer + 1).is_multiple_of(*n.max(&1)),
            SlidingLayers::Listed(flags) => flags.get(layer).copied().unwrap_or(false),
        }
    }
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
    /// Which layers use the sliding window when sliding and full layers interleave (Gemma's
    /// `layer_types`); when set it decides instead of `max_window_layers`.
    pub sliding_layers: Option<SlidingLayers>,
    /// Where the block departs from Llama's (Gemma).
    pub style: BlockStyle,
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
        let sliding = match &self.sliding_layers {
            Some(layers) => layers.slides(layer),
            None => layer >= self.max_window_layers,
        };
        self.sliding_window.filter(|_| sliding)
    }

    /// What the token embeddings are multiplied by (`style.scale_embeddings`), as the f32
    /// HF computes.
    pub fn embed_scale(&self) -> Option<f32> {
        let scale = (self.hidden_size as f64).sqrt() as f32;
        self.style.scale_embeddings.then_some(scale)
    }

    /// Whether layer `layer` takes its RoPE from `style.local_rope_theta` (a sliding layer
    /// of a model that has a local base).
    pub fn layer_uses_local_rope(&self, layer: usize) -> bool {
        self.style.local_rope_theta.is_some() && self.layer_window(layer).is_some()
    }

    /// Whether decoder layer `layer` is a sparse MoE block (never for the dense families).
    pub fn is_sparse_layer(&self, layer: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.is_sparse_layer(layer))
    }
}
