//! Reading an HF `config.json` into a [`ModelConfig`]: the file's schema as a serde struct
//! ([`RawConfig`]), and the few rules serde cannot express (defaults derived from other keys,
//! RoPE scaling variants, `layer_types`, the family's own keys). Every error names the file
//! and the key. Writing the file back is `ModelConfig::to_hf_json` in `config.rs`.

use crate::config::family::Family;
use crate::config::model_config::{ModelConfig, RopeScaling};
use crate::error::{ModelError, Result};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::Path;

/// config.json as HF writes it. Every key is optional here (required ones are checked after,
/// so a missing key gets its own message); JSON `null` reads as absent. Keys this crate does
/// not interpret land in `extra` and are written back unchanged.
#[derive(Debug, Deserialize)]
pub(crate) struct RawConfig {
    // Keys read elsewhere or rewritten on save; listed so they stay out of `extra`.
    #[allow(dead_code)]
    model_type: Option<Value>,
    #[allow(dead_code)]
    architectures: Option<Value>,
    #[allow(dead_code)]
    torch_dtype: Option<Value>,
    #[allow(dead_code)]
    dtype: Option<Value>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    pub(crate) intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    hidden_act: Option<String>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    /// HF v4 spelling of the RoPE variant (parsed as [`RopeParams`] once chosen).
    rope_scaling: Option<Value>,
    /// HF v5 spelling (used when `rope_scaling` is absent).
    rope_parameters: Option<Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    pub(crate) attention_bias: Option<bool>,
    pub(crate) mlp_bias: Option<bool>,
    pub(crate) sliding_window: Option<usize>,
    pub(crate) use_sliding_window: Option<bool>,
    pub(crate) max_window_layers: Option<usize>,
    // Mixture-of-experts keys (read by the MoE families, `family/moe_keys.rs`).
    pub(crate) qkv_bias: Option<bool>,
    pub(crate) num_experts: Option<usize>,
    pub(crate) num_local_experts: Option<usize>,
    pub(crate) num_experts_per_tok: Option<usize>,
    pub(crate) moe_intermediate_size: Option<usize>,
    pub(crate) norm_topk_prob: Option<bool>,
    pub(crate) decoder_sparse_step: Option<usize>,
    pub(crate) mlp_only_layers: Option<Vec<usize>>,
    pub(crate) shared_expert_intermediate_size: Option<usize>,
    pub(crate) router_aux_loss_coef: Option<f64>,
    pub(crate) output_router_logits: Option<bool>,
    layer_types: Option<Vec<String>>,
    bos_token_id: Option<u32>,
    #[serde(default, deserialize_with = "token_ids")]
    eos_token_id: Vec<u32>,
    pad_token_id: Option<u32>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// The object under `rope_scaling` / `rope_parameters`.
#[derive(Debug, Deserialize)]
struct RopeParams {
    rope_type: Option<Value>,
    #[serde(rename = "type")]
    legacy_type: Option<Value>,
    rope_theta: Option<f64>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
}

/// `eos_token_id`: one token id or a list of them (`null` = none).
fn token_ids<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Vec<u32>, D::Error> {
    struct Ids;
    impl<'de> Visitor<'de> for Ids {
        type Value = Vec<u32>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a token id or a list of token ids")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Vec<u32>, E> {
            u32::try_from(v)
                .map(|id| vec![id])
                .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
        }
        fn visit_unit<E: de::Error>(self) -> std::result::Result<Vec<u32>, E> {
            Ok(vec![])
        }
        fn visit_seq<A: SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Vec<u32>, A::Error> {
            let mut out = vec![];
            while let Some(id) = seq.next_element::<u32>()? {
                out.push(id);
            }
            Ok(out)
        }
    }
    d.deserialize_any(Ids)
}

/// Builds `InvalidConfig` errors for one file.
pub(crate) struct At<'a>(&'a Path);

impl At<'_> {
    pub(crate) fn err(&self, key: &str, message: impl Into<String>) -> ModelError {
        ModelError::InvalidConfig {
            path: self.0.to_path_buf(),
            key: key.to_string(),
            message: message.into(),
        }
    }

    pub(crate) fn required(&self, key: &str, v: Option<usize>) -> Result<usize> {
        v.ok_or_else(|| self.err(key, "required key is missing"))
    }

    /// Deserializes `value` as `T`; a type error names `key` (plus the path inside it).
    fn parse<'de, T: Deserialize<'de>>(&self, key: &str, value: &'de Value) -> Result<T> {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let inner = e.path().to_string();
            let key = match (key, inner.as_str()) {
                ("", p) => p.to_string(),
                (k, ".") => k.to_string(),
                (k, p) => format!("{k}.{p}"),
            };
            self.err(&key, e.into_inner().to_string())
        })
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
        let model_type = obj.get("model_type").and_then(Value::as_str).unwrap_or("");
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

impl RawConfig {
    /// The config these keys describe (not yet validated).
    fn into_config(self, family: Family, at: &At<'_>) -> Result<ModelConfig> {
        if let Some(act) = &self.hidden_act {
            if act != "silu" {
                return Err(at.err(
                    "hidden_act",
                    format!("only \"silu\" is supported, found {act:?}"),
                ));
            }
        }
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
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            attention_bias: keys.attention_bias,
            mlp_bias: keys.mlp_bias,
            sliding_window: keys.sliding_window,
            max_window_layers: keys.max_window_layers,
            bos_token_id: self.bos_token_id,
            eos_token_id: self.eos_token_id.clone(),
            pad_token_id: self.pad_token_id,
            moe: keys.moe,
            extra: Map::new(),
        };
        if let Some(types) = &self.layer_types {
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
            (None, Some(p)) => ("rope_parameters", p),
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
