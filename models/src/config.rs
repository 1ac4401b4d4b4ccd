//! `ModelConfig`: the decoder hyper-parameters read from (and written back to) an HF `config.json`
//! for the `llama`, `qwen2` and `mistral` model types. It validates what the model code relies on;
//! it does not know about tokenizers, presets (see `preset.rs`) or weights.

use crate::error::{ModelError, Result};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// A supported decoder family (HF `model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `model_type: "llama"` (Llama 2/3, optional attention/MLP bias, llama3 RoPE scaling).
    Llama,
    /// `model_type: "qwen2"` (q/k/v projections always carry a bias).
    Qwen2,
    /// `model_type: "mistral"` (optional sliding-window attention).
    Mistral,
}

impl Family {
    /// All supported families.
    pub const ALL: [Family; 3] = [Family::Llama, Family::Qwen2, Family::Mistral];

    /// The HF `model_type` string.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Mistral => "mistral",
        }
    }

    /// Parses an HF `model_type` string.
    pub fn from_model_type(s: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.model_type() == s)
    }

    /// The `model_type` strings this crate supports.
    pub fn supported_model_types() -> Vec<&'static str> {
        Family::ALL.iter().map(|f| f.model_type()).collect()
    }

    fn class_prefix(self) -> &'static str {
        match self {
            Family::Llama => "Llama",
            Family::Qwen2 => "Qwen2",
            Family::Mistral => "Mistral",
        }
    }

    /// HF class name for a head on this family, e.g. `architecture("ForCausalLM")`
    /// gives `LlamaForCausalLM`.
    pub fn architecture(self, head: &str) -> String {
        format!("{}{}", self.class_prefix(), head)
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
    }
}

impl std::str::FromStr for Family {
    type Err = crate::error::UnknownName;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Family::from_model_type(s).ok_or_else(|| crate::error::UnknownName {
            what: "model family",
            got: s.to_string(),
            expected: format!("one of: {}", Family::supported_model_types().join(", ")),
        })
    }
}

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
    /// Keys of config.json this crate does not interpret, kept for the round trip.
    pub extra: Map<String, Value>,
}

/// Keys that `to_hf_json` writes itself (never copied from `extra`).
const OWN_KEYS: &[&str] = &[
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "torch_dtype",
    "dtype",
];

struct Reader<'a> {
    obj: &'a Map<String, Value>,
    path: &'a Path,
}

impl Reader<'_> {
    fn err(&self, key: &str, message: impl Into<String>) -> ModelError {
        ModelError::InvalidConfig {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            message: message.into(),
        }
    }

    /// The value of `key`, treating JSON `null` as absent.
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
                self.err(key, format!("expected a non-negative integer, found {v}"))
            }),
        }
    }

    fn usize_req(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?
            .ok_or_else(|| self.err(key, "required key is missing"))
    }

    fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a number, found {v}"))),
        }
    }

    fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected true or false, found {v}"))),
        }
    }

    fn token_id(&self, key: &str) -> Result<Option<u32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(x) if x <= u32::MAX as u64 => Ok(Some(x as u32)),
                _ => Err(self.err(key, format!("expected a token id, found {v}"))),
            },
        }
    }

    fn token_ids(&self, key: &str) -> Result<Vec<u32>> {
        match self.get(key) {
            None => Ok(vec![]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v.as_u64() {
                    Some(x) if x <= u32::MAX as u64 => Ok(x as u32),
                    _ => Err(self.err(key, format!("expected a list of token ids, found {v}"))),
                })
                .collect(),
            Some(_) => Ok(self.token_id(key)?.into_iter().collect()),
        }
    }
}

impl ModelConfig {
    /// Reads and validates `config.json` at `path`.
    pub fn from_file(path: &Path) -> Result<ModelConfig> {
        if !path.is_file() {
            return Err(ModelError::MissingPath {
                path: path.to_path_buf(),
                what: "config.json",
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            action: "read",
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_str(&text, path)
    }

    /// Parses config.json text; `path` is only used in error messages.
    pub fn from_json_str(text: &str, path: &Path) -> Result<ModelConfig> {
        let value: Value = serde_json::from_str(text).map_err(|e| ModelError::Json {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Self::from_json_value(&value, path)
    }

    /// Validates an already-parsed config.json object; `path` is only used in error messages.
    pub fn from_json_value(value: &Value, path: &Path) -> Result<ModelConfig> {
        let obj = value.as_object().ok_or_else(|| ModelError::Json {
            path: path.to_path_buf(),
            message: "expected a JSON object at the top level".into(),
        })?;
        let r = Reader { obj, path };
        let model_type = obj.get("model_type").and_then(Value::as_str).unwrap_or("");
        let family = Family::from_model_type(model_type).ok_or_else(|| {
            ModelError::UnsupportedModelType {
                path: path.to_path_buf(),
                model_type: model_type.to_string(),
                supported: Family::supported_model_types(),
            }
        })?;

        if let Some(act) = r.get("hidden_act") {
            if act.as_str() != Some("silu") {
                return Err(r.err(
                    "hidden_act",
                    format!("only \"silu\" is supported, found {act}"),
                ));
            }
        }
        let hidden_size = r.usize_req("hidden_size")?;
        let num_attention_heads = r.usize_req("num_attention_heads")?;
        let num_key_value_heads = r
            .usize_opt("num_key_value_heads")?
            .unwrap_or(num_attention_heads);
        let head_dim = match r.usize_opt("head_dim")? {
            Some(d) => d,
            None => {
                if num_attention_heads == 0 || hidden_size % num_attention_heads != 0 {
                    return Err(r.err(
                        "num_attention_heads",
                        format!("hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads} (and head_dim is not set)"),
                    ));
                }
                hidden_size / num_attention_heads
            }
        };

        // RoPE: HF v4 writes `rope_theta` + `rope_scaling`, v5 writes `rope_parameters`.
        let rope_params = r.get("rope_scaling").or_else(|| r.get("rope_parameters"));
        let mut rope_theta = r.f64_opt("rope_theta")?;
        let mut rope_scaling = None;
        if let Some(params) = rope_params {
            let key = if r.get("rope_scaling").is_some() {
                "rope_scaling"
            } else {
                "rope_parameters"
            };
            let p = params
                .as_object()
                .ok_or_else(|| r.err(key, format!("expected an object, found {params}")))?;
            let pr = Reader { obj: p, path };
            if rope_theta.is_none() {
                rope_theta = pr.f64_opt("rope_theta")?;
            }
            let rope_type = p
                .get("rope_type")
                .or_else(|| p.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("default");
            let need = |k: &str| -> Result<f64> {
                pr.f64_opt(k)?
                    .ok_or_else(|| r.err(&format!("{key}.{k}"), "required for this rope_type"))
            };
            rope_scaling = match rope_type {
                "default" => None,
                "llama3" => Some(RopeScaling::Llama3 {
                    factor: need("factor")?,
                    low_freq_factor: need("low_freq_factor")?,
                    high_freq_factor: need("high_freq_factor")?,
                    original_max_position_embeddings: need("original_max_position_embeddings")?
                        as usize,
                }),
                "linear" => Some(RopeScaling::Linear {
                    factor: need("factor")?,
                }),
                other => {
                    return Err(r.err(
                        &format!("{key}.rope_type"),
                        format!(
                            "unsupported rope_type {other:?}; supported: default, linear, llama3"
                        ),
                    ))
                }
            };
        }

        let num_hidden_layers = r.usize_req("num_hidden_layers")?;
        let (sliding_window, max_window_layers) = match family {
            Family::Llama => (None, 0),
            Family::Mistral => (r.usize_opt("sliding_window")?, 0),
            Family::Qwen2 => {
                if r.bool_opt("use_sliding_window")?.unwrap_or(false) {
                    let window = r.usize_opt("sliding_window")?;
                    (window, r.usize_opt("max_window_layers")?.unwrap_or(28))
                } else {
                    (None, 0)
                }
            }
        };
        let mut cfg = ModelConfig {
            family,
            vocab_size: r.usize_req("vocab_size")?,
            hidden_size,
            intermediate_size: r.usize_req("intermediate_size")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: r.f64_opt("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta: rope_theta.unwrap_or(10000.0),
            rope_scaling,
            max_position_embeddings: r.usize_opt("max_position_embeddings")?.unwrap_or(2048),
            tie_word_embeddings: r.bool_opt("tie_word_embeddings")?.unwrap_or(false),
            attention_bias: r.bool_opt("attention_bias")?.unwrap_or(false),
            mlp_bias: r.bool_opt("mlp_bias")?.unwrap_or(false),
            sliding_window,
            max_window_layers,
            bos_token_id: r.token_id("bos_token_id")?,
            eos_token_id: r.token_ids("eos_token_id")?,
            pad_token_id: r.token_id("pad_token_id")?,
            extra: Map::new(),
        };
        if family != Family::Llama {
            cfg.attention_bias = false;
            cfg.mlp_bias = false;
        }
        // An explicit `layer_types` list must be "full... then sliding..." (what HF derives).
        if let Some(types) = r.get("layer_types") {
            let types = types
                .as_array()
                .ok_or_else(|| r.err("layer_types", "expected a list of strings"))?;
            let sliding: Vec<bool> = types
                .iter()
                .map(|t| match t.as_str() {
                    Some("full_attention") => Ok(false),
                    Some("sliding_attention") => Ok(true),
                    _ => Err(r.err("layer_types", format!("unsupported layer type {t}"))),
                })
                .collect::<Result<_>>()?;
            if sliding.len() != num_hidden_layers {
                return Err(r.err(
                    "layer_types",
                    format!(
                        "has {} entries, expected num_hidden_layers = {num_hidden_layers}",
                        sliding.len()
                    ),
                ));
            }
            let first = sliding.iter().position(|&s| s).unwrap_or(num_hidden_layers);
            if sliding[first..].iter().any(|&s| !s) {
                return Err(r.err(
                    "layer_types",
                    "interleaved full/sliding layers are not supported",
                ));
            }
            if first == num_hidden_layers {
                cfg.sliding_window = None;
                cfg.max_window_layers = 0;
            } else {
                if cfg.sliding_window.is_none() {
                    cfg.sliding_window = r.usize_opt("sliding_window")?;
                }
                cfg.max_window_layers = first;
            }
        }
        for (k, v) in obj {
            if !OWN_KEYS.contains(&k.as_str()) {
                cfg.extra.insert(k.clone(), v.clone());
            }
        }
        cfg.validate_at(path)?;
        Ok(cfg)
    }

    /// Checks the invariants the model code relies on (divisibility, non-zero sizes).
    pub fn validate(&self) -> Result<()> {
        self.validate_at(Path::new("<in-memory config>"))
    }

    fn validate_at(&self, path: &Path) -> Result<()> {
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

    /// Whether q/k/v projections carry a bias.
    pub fn qkv_bias(&self) -> bool {
        match self.family {
            Family::Llama => self.attention_bias,
            Family::Qwen2 => true,
            Family::Mistral => false,
        }
    }

    /// Whether the attention output projection carries a bias.
    pub fn o_bias(&self) -> bool {
        self.family == Family::Llama && self.attention_bias
    }

    /// Whether gate/up/down projections carry a bias.
    pub fn mlp_bias(&self) -> bool {
        self.family == Family::Llama && self.mlp_bias
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
        match self.family {
            Family::Llama => {
                o.insert("attention_bias".into(), self.attention_bias.into());
                o.insert("mlp_bias".into(), self.mlp_bias.into());
            }
            Family::Qwen2 => {
                o.insert(
                    "use_sliding_window".into(),
                    self.sliding_window.is_some().into(),
                );
                o.insert("sliding_window".into(), self.sliding_window.into());
                o.insert("max_window_layers".into(), self.max_window_layers.into());
            }
            Family::Mistral => {
                o.insert("sliding_window".into(), self.sliding_window.into());
            }
        }
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
        crate::param_spec::causal_lm_specs(self)
            .iter()
            .map(|s| s.shape.iter().product::<usize>())
            .sum()
    }
}
