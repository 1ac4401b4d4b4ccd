//! Reading an HF `config.json` into a [`ModelConfig`]: the file's schema as a serde struct
//! ([`RawConfig`]), and the few rules serde cannot express (defaults derived from other keys,
//! RoPE scaling variants, `layer_types`, the family's own keys). Every error names the file
//! and the key. Writing the file back is `ModelConfig::to_hf_json`, also here.

use crate::config::family::Family;
use crate::config::model_config::{Activation, ModelConfig, RopeScaling};
use crate::config::raw::{At, RawConfig, RopeParams};
use crate::error::{ModelError, Result};
use serde_json::{Map, Value};
use std::path::Path;

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
        let model_type = obj.get("model_type").and_then(Value::as_str).unwrap_or("");
        if model_type == MULTIMODAL_GEMMA3 {
            return Self::from_json_value(&gemma3_text_config(obj, path)?, path);
        }
        let family = Family::from_model_type(model_type).ok_or_else(|| {
            ModelError::UnsupportedModelType {
                path: path.to_path_buf(),
                model_type: model_type.to_string(),
                supported: Family::supported_model_types(),
            }
        })?;
        let at = At(path);
        let raw: RawConfig = at.parse("", value)?;
        let cfg = raw.into_config(family, &at)?;
        cfg.validate_at(path)?;
        Ok(cfg)
    }
}

/// `model_type` of Gemma 3's multimodal checkpoints (`Gemma3ForConditionalGeneration`):
/// their text decoder is read as `gemma3_text`.
const MULTIMODAL_GEMMA3: &str = "gemma3";

/// The `text_config` of a multimodal Gemma 3 config.json, as a `gemma3_text` config: its
/// `model_type` set, the top level's `tie_word_embeddings` (HF's switch for the tie)
/// carried in. The vision tower's keys are dropped; oxalign trains and saves the decoder.
fn gemma3_text_config(obj: &Map<String, Value>, path: &Path) -> Result<Value> {
    let Some(Value::Object(text)) = obj.get("text_config") else {
        return Err(ModelError::InvalidConfig {
            path: path.to_path_buf(),
            key: "text_config".into(),
            message: "a multimodal Gemma 3 config needs its text decoder's `text_config` object"
                .into(),
        });
    };
    let mut text = text.clone();
    text.insert("model_type".into(), "gemma3_text".into());
    if let Some(tie) = obj.get("tie_word_embeddings") {
        text.insert("tie_word_embeddings".into(), tie.clone());
    }
    Ok(Value::Object(text))
}

impl RawConfig {
    /// The config these keys describe (not yet validated).
    fn into_config(self, family: Family, at: &At<'_>) -> Result<ModelConfig> {
        let hidden_size = at.required("hidden_size", self.hidden_size)?;
        let num_attention_heads = at.required("num_attention_heads", self.num_attention_heads)?;
        let head_dim = match self.head_dim {
            Some(d) => d,
            None if num_attention_heads == 0 || hidden_size % num_attention_heads != 0 => {
                return Err(at.err(
                    "num_attention_heads",
                    format!("hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads} (and head_dim is not set)"),
                ))
            }
            None => hidden_size / num_attention_heads,
        };
        let (rope_theta, rope_scaling) = self.rope(at)?;
        let num_hidden_layers = at.required("num_hidden_layers", self.num_hidden_layers)?;
        let keys = family.decl().read_keys(&self, at)?;
        if let Some(act) = self.hidden_act.as_deref() {
            if act != "silu" && keys.style.activation == Activation::Silu {
                return Err(at.err(
                    "hidden_act",
                    format!("only \"silu\" is supported, found {act:?}"),
                ));
            }
        }
        let tie_word_embeddings = self.tie_word_embeddings.unwrap_or(keys.tie_by_default);
        let mut cfg = ModelConfig {
            family,
            vocab_size: at.required("vocab_size", self.vocab_size)?,
            hidden_size,
            intermediate_size: at.required("intermediate_size", self.intermediate_size)?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim,
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: rope_theta.unwrap_or(10000.0),
            rope_scaling,
            max_position_embeddings: self.max_position_embeddings.unwrap_or(2048),
            tie_word_embeddings,
            attention_bias: keys.attention_bias,
            mlp_bias: keys.mlp_bias,
            sliding_window: keys.sliding_window,
            max_window_layers: keys.max_window_layers,
            sliding_layers: keys.sliding_layers.clone(),
            style: keys.style.clone(),
            bos_token_id: self.bos_token_id,
            eos_token_id: self.eos_token_id.clone(),
            pad_token_id: self.pad_token_id,
            moe: keys.moe,
            extra: Map::new(),
        };
        if let (Some(types), None) = (&self.layer_types, &keys.sliding_layers) {
            self.apply_layer_types(types, &mut cfg, at)?;
        }
        cfg.extra = self.extra;
        Ok(cfg)
    }

    /// RoPE base and scaling: HF v4 writes `rope_theta` + `rope_scaling`, v5 writes
    /// `rope_parameters` (with the base inside).
    fn rope(&self, at: &At<'_>) -> Result<(Option<f64>, Option<RopeScaling>)> {
        let (key, params) = match (&self.rope_scaling, &self.rope_parameters) {
            (Some(p), _) => ("rope_scaling", p),
            // Gemma 3 under transformers 5: one entry per layer type.
            (None, Some(p)) => match p.get("full_attention") {
                Some(full) => ("rope_parameters.full_attention", full),
                None => ("rope_parameters", p),
            },
            (None, None) => return Ok((self.rope_theta, None)),
        };
        if !params.is_object() {
            return Err(at.err(key, format!("expected an object, found {params}")));
        }
        let p: RopeParams = at.parse(key, params)?;
        let theta = self.rope_theta.or(p.rope_theta);
        let rope_type = [&p.rope_type, &p.legacy_type]
            .into_iter()
            .find_map(|t| t.as_ref().and_then(Value::as_str))
            .unwrap_or("default");
        let need = |k: &str, v: Option<f64>| {
            v.ok_or_else(|| at.err(&format!("{key}.{k}"), "required for this rope_type"))
        };
        let scaling = match rope_type {
            "default" => None,
            "llama3" => Some(RopeScaling::Llama3 {
                factor: need("factor", p.factor)?,
                low_freq_factor: need("low_freq_factor", p.low_freq_factor)?,
                high_freq_factor: need("high_freq_factor", p.high_freq_factor)?,
                original_max_position_embeddings: need(
                    "original_max_position_embeddings",
                    p.original_max_position_embeddings,
                )? as usize,
            }),
            "linear" => Some(RopeScaling::Linear {
                factor: need("factor", p.factor)?,
            }),
            other => {
                return Err(at.err(
                    &format!("{key}.rope_type"),
                    format!("unsupported rope_type {other:?}; supported: default, linear, llama3"),
                ))
            }
        };
        Ok((theta, scaling))
    }

    /// An explicit `layer_types` list must be "full... then sliding..." (what HF derives); it
    /// sets where the sliding window starts.
    fn apply_layer_types(
        &self,
        types: &[String],
        cfg: &mut ModelConfig,
        at: &At<'_>,
    ) -> Result<()> {
        let sliding: Vec<bool> = types
            .iter()
            .map(|t| match t.as_str() {
                "full_attention" => Ok(false),
                "sliding_attention" => Ok(true),
                _ => Err(at.err("layer_types", format!("unsupported layer type {t:?}"))),
            })
            .collect::<Result<_>>()?;
        let n = cfg.num_hidden_layers;
        if sliding.len() != n {
            return Err(at.err(
                "layer_types",
                format!(
                    "has {} entries, expected num_hidden_layers = {n}",
                    sliding.len()
                ),
            ));
        }
        let first = sliding.iter().position(|&s| s).unwrap_or(n);
        if sliding[first..].iter().any(|&s| !s) {
            return Err(at.err(
                "layer_types",
                "interleaved full/sliding layers are not supported",
            ));
        }
        if first == n {
            cfg.sliding_window = None;
            cfg.max_window_layers = 0;
        } else {
            cfg.sliding_window = cfg.sliding_window.or(self.sliding_window);
            cfg.max_window_layers = first;
        }
        Ok(())
    }
}

impl ModelConfig {
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
}
