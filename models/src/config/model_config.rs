//! `ModelConfig`: the decoder hyper-parameters of an HF `config.json` for the supported
//! families, their validation, and writing them back (`to_hf_json`). Reading the file is
//! `config_json.rs`; family-specific keys and biases are declared in `family/`. It does not
//! know about tokenizers, presets (see `preset.rs`) or weights.

pub use crate::config::family::Family;
use crate::config::layout::BackboneParams;
use crate::error::{ModelError, Result};
pub use crate::moe::config::MoeConfig;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

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
    /// Checks the invariants the model code relies on (divisibility, non-zero sizes).
    pub fn validate(&self) -> Result<()> {
        self.validate_at(Path::new("<in-memory config>"))
    }

    pub(crate) fn validate_at(&self, path: &Path) -> Result<()> {
        let err = |key: &str, message: String| ModelError::InvalidConfig {
            path: PathBuf::from(path),
            key: key.to_string(),
            message,
        };
        for (key, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 {
                return Err(err(key, "must be greater than 0".into()));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(err(
                "num_key_value_heads",
                format!(
                    "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(err(
                "head_dim",
                format!("must be even for RoPE, found {}", self.head_dim),
            ));
        }
        if self.sliding_window == Some(0) {
            return Err(err("sliding_window", "must be greater than 0".into()));
        }
        let memory = crate::io::machine_memory::total_memory_bytes();
        crate::config::bounds::check(self, path, memory)?;
        if let Some(moe) = &self.moe {
            moe.validate_at(path, self.num_hidden_layers)?;
        }
        self.family.decl().validate(self, path)?;
        for (key, id) in [
            ("bos_token_id", self.bos_token_id),
            ("pad_token_id", self.pad_token_id),
        ]
        .into_iter()
        .chain(self.eos_token_id.iter().map(|&e| ("eos_token_id", Some(e))))
        {
            if let Some(id) = id {
                if id as usize >= self.vocab_size {
                    return Err(err(
                        key,
                        format!("token id {id} is not below vocab_size {}", self.vocab_size),
                    ));
                }
            }
        }
        Ok(())
    }

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

    /// Whether q/k/v projections carry a bias (the family's rule).
    pub fn qkv_bias(&self) -> bool {
        self.family.decl().biases(self).qkv
    }

    /// Whether the attention output projection carries a bias (the family's rule).
    pub fn o_bias(&self) -> bool {
        self.family.decl().biases(self).o
    }

    /// Whether gate/up/down projections carry a bias (the family's rule).
    pub fn mlp_bias(&self) -> bool {
        self.family.decl().biases(self).mlp
    }

    /// The backbone's parameters (`model.*`) as the family declares them: names, shapes and
    /// kinds of every tensor, in the canonical order.
    pub fn backbone_params(&self) -> BackboneParams {
        self.family.decl().backbone(self)
    }

    /// The HF config.json object for this config with `architectures: [architecture]` and
    /// `torch_dtype: "float32"`. Unknown keys read from the original file (`extra`) are kept.
    pub fn to_hf_json(&self, architecture: &str) -> Value {
        let mut o = Map::new();
        o.insert(
            "architectures".into(),
            Value::from(vec![architecture.to_string()]),
        );
        o.insert("model_type".into(), self.family.model_type().into());
        o.insert("vocab_size".into(), self.vocab_size.into());
        o.insert("hidden_size".into(), self.hidden_size.into());
        o.insert("intermediate_size".into(), self.intermediate_size.into());
        o.insert("num_hidden_layers".into(), self.num_hidden_layers.into());
        o.insert(
            "num_attention_heads".into(),
            self.num_attention_heads.into(),
        );
        o.insert(
            "num_key_value_heads".into(),
            self.num_key_value_heads.into(),
        );
        o.insert("head_dim".into(), self.head_dim.into());
        o.insert("hidden_act".into(), "silu".into());
        o.insert("rms_norm_eps".into(), self.rms_norm_eps.into());
        o.insert("rope_theta".into(), self.rope_theta.into());
        let scaling = match &self.rope_scaling {
            None => Value::Null,
            Some(RopeScaling::Linear { factor }) => serde_json::json!({
                "rope_type": "linear", "factor": factor,
            }),
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => serde_json::json!({
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max_position_embeddings,
            }),
        };
        o.insert("rope_scaling".into(), scaling);
        o.insert(
            "max_position_embeddings".into(),
            self.max_position_embeddings.into(),
        );
        o.insert(
            "tie_word_embeddings".into(),
            self.tie_word_embeddings.into(),
        );
        self.family.decl().write_keys(self, &mut o);
        o.insert("bos_token_id".into(), self.bos_token_id.into());
        let eos = match self.eos_token_id.as_slice() {
            [] => Value::Null,
            [one] => Value::from(*one),
            many => Value::from(many.to_vec()),
        };
        o.insert("eos_token_id".into(), eos);
        o.insert("pad_token_id".into(), self.pad_token_id.into());
        o.insert("torch_dtype".into(), "float32".into());
        for (k, v) in &self.extra {
            o.entry(k.clone()).or_insert_with(|| v.clone());
        }
        Value::Object(o)
    }

    /// Writes [`ModelConfig::to_hf_json`] as pretty JSON to `path`.
    pub fn save(&self, path: &Path, architecture: &str) -> Result<()> {
        let text = serde_json::to_string_pretty(&self.to_hf_json(architecture)).map_err(|e| {
            ModelError::Json {
                path: path.to_path_buf(),
                message: e.to_string(),
            }
        })?;
        std::fs::write(path, text + "\n").map_err(|source| ModelError::Io {
            action: "write",
            path: path.to_path_buf(),
            source,
        })
    }

    /// Number of parameters of the decoder plus LM head (tied embeddings counted once).
    pub fn num_parameters(&self) -> usize {
        crate::config::layout::causal_lm_specs(self)
            .iter()
            .map(|s| s.numel())
            .sum()
    }
}
