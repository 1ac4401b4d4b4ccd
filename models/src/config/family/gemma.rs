//! The Gemma 3 text family (`model_type: "gemma3_text"`, `Gemma3ForCausalLM`): the dense
//! backbone without biases (unless `attention_bias`), with Gemma's block ([`BlockStyle`]):
//! RMSNorms that scale by `1 + w`, four norms per layer (`post_attention_layernorm` on the
//! attention's output, `pre_feedforward_layernorm` / `post_feedforward_layernorm` around the
//! MLP), per-head q/k norms, a GELU-tanh gate (`hidden_activation: "gelu_pytorch_tanh"`),
//! embeddings scaled by `sqrt(hidden_size)`, scores scaled by `query_pre_attn_scalar^-0.5`,
//! and sliding-window layers interleaved with full ones (`layer_types`, or every
//! `sliding_window_pattern`-th layer full) whose RoPE base is `rope_local_base_freq`
//! (transformers 5: `rope_parameters.sliding_attention.rope_theta`). Tied embeddings unless
//! config.json says otherwise. Logit soft-capping (Gemma 2's) is refused.

use super::{FamilyDecl, FamilyKeys};
use crate::config::layout::{add_qk_norms, dense_backbone, norm_param, BackboneParams, Biases};
use crate::config::model_config::{Activation, BlockStyle, ModelConfig};
use crate::config::raw::{At, RawConfig};
use crate::error::Result;
use serde_json::{Map, Value};

/// HF's defaults for Gemma 3 (`Gemma3TextConfig`).
const DEFAULT_QUERY_PRE_ATTN_SCALAR: f64 = 256.0;
const DEFAULT_SLIDING_WINDOW: usize = 4096;
const DEFAULT_SLIDING_WINDOW_PATTERN: usize = 6;
const DEFAULT_LOCAL_ROPE_THETA: f64 = 10_000.0;
/// The sliding window of the size presets (shorter than their contexts, so it acts).
const PRESET_SLIDING_WINDOW: usize = 512;
/// The one activation Gemma 3 checkpoints use.
const GELU_TANH: &str = "gelu_pytorch_tanh";

/// The Gemma 3 text declaration.
pub(crate) struct Gemma3;

impl FamilyDecl for Gemma3 {
    fn model_type(&self) -> &'static str {
        "gemma3_text"
    }

    fn class_prefix(&self) -> &'static str {
        "Gemma3"
    }

    /// `Gemma3ForCausalLM`, and `Gemma3Text...` for the heads on the text decoder alone
    /// (`Gemma3ForSequenceClassification` is the multimodal model's). transformers has no
    /// token classifier for Gemma 3: a critic saves as `Gemma3TextForTokenClassification`,
    /// which oxalign reads back.
    fn architecture(&self, head: &str) -> String {
        match head {
            "ForCausalLM" => format!("Gemma3{head}"),
            _ => format!("Gemma3Text{head}"),
        }
    }

    fn read_keys(&self, raw: &RawConfig, at: &At<'_>) -> Result<FamilyKeys> {
        refuse_unsupported(raw, at)?;
        let layers = at.required("num_hidden_layers", raw.num_hidden_layers)?;
        Ok(FamilyKeys {
            attention_bias: raw.attention_bias.unwrap_or(false),
            sliding_window: Some(raw.sliding_window.unwrap_or(DEFAULT_SLIDING_WINDOW)),
            sliding_layers: Some(sliding_layers(raw, layers, at)?),
            style: BlockStyle {
                norm_offset: 1.0,
                scale_embeddings: true,
                activation: Activation::GeluTanh,
                sandwich_norms: true,
                query_pre_attn_scalar: Some(
                    raw.query_pre_attn_scalar
                        .unwrap_or(DEFAULT_QUERY_PRE_ATTN_SCALAR),
                ),
                local_rope_theta: Some(local_rope_theta(raw, at)?),
            },
            tie_by_default: true,
            ..FamilyKeys::default()
        })
    }

    fn write_keys(&self, cfg: &ModelConfig, out: &mut Map<String, Value>) {
        out.remove("hidden_act");
        out.insert("hidden_activation".into(), GELU_TANH.into());
        out.insert("attention_bias".into(), cfg.attention_bias.into());
        out.insert("sliding_window".into(), cfg.sliding_window.into());
        let types: Vec<Value> = (0..cfg.num_hidden_layers)
            .map(|i| match cfg.layer_window(i) {
                Some(_) => "sliding_attention".into(),
                None => "full_attention".into(),
            })
            .collect();
        out.insert("layer_types".into(), types.into());
        let style = &cfg.style;
        // transformers 5 types it as an int.
        let scalar = style.query_pre_attn_scalar.map(|v| match v.fract() == 0.0 {
            true => Value::from(v as u64),
            false => Value::from(v),
        });
        out.insert("query_pre_attn_scalar".into(), scalar.into());
        out.insert("rope_local_base_freq".into(), style.local_rope_theta.into());
        out.insert("attn_logit_softcapping".into(), Value::Null);
        out.insert("final_logit_softcapping".into(), Value::Null);
    }

    fn adjust_preset(&self, cfg: &mut ModelConfig) {
        let layers = cfg.num_hidden_layers;
        let pattern = DEFAULT_SLIDING_WINDOW_PATTERN;
        cfg.tie_word_embeddings = true;
        cfg.rms_norm_eps = 1e-6;
        cfg.rope_theta = 1_000_000.0;
        cfg.sliding_window = Some(PRESET_SLIDING_WINDOW);
        cfg.sliding_layers = Some((0..layers).map(|i| (i + 1) % pattern != 0).collect());
        cfg.style = BlockStyle {
            norm_offset: 1.0,
            scale_embeddings: true,
            activation: Activation::GeluTanh,
            sandwich_norms: true,
            query_pre_attn_scalar: Some(cfg.head_dim as f64),
            local_rope_theta: Some(DEFAULT_LOCAL_ROPE_THETA),
        };
    }

    fn validate(&self, cfg: &ModelConfig, path: &std::path::Path) -> Result<()> {
        let at = At(path);
        let layers = cfg.num_hidden_layers;
        match &cfg.sliding_layers {
            Some(flags) if flags.len() != layers => {
                let n = flags.len();
                return Err(at.err(
                    "layer_types",
                    format!("has {n} entries, expected num_hidden_layers = {layers}"),
                ));
            }
            _ => {}
        }
        let style = &cfg.style;
        for (key, v) in [
            ("query_pre_attn_scalar", style.query_pre_attn_scalar),
            ("rope_local_base_freq", style.local_rope_theta),
        ] {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v > 0.0)) {
                return Err(at.err(key, format!("must be finite and positive, found {v}")));
            }
        }
        Ok(())
    }

    fn biases(&self, cfg: &ModelConfig) -> Biases {
        Biases {
            qkv: cfg.attention_bias,
            o: cfg.attention_bias,
            mlp: false,
        }
    }

    fn backbone(&self, cfg: &ModelConfig) -> BackboneParams {
        let mut backbone = dense_backbone(cfg, self.biases(cfg));
        add_qk_norms(&mut backbone, cfg.head_dim);
        add_feedforward_norms(&mut backbone, cfg.hidden_size);
        backbone
    }
}

/// Gives every layer Gemma's `pre_feedforward_layernorm` and `post_feedforward_layernorm`
/// (`[hidden]` each).
fn add_feedforward_norms(backbone: &mut BackboneParams, hidden: usize) {
    for (i, layer) in backbone.layers.iter_mut().enumerate() {
        let p = format!("model.layers.{i}");
        layer.feedforward_norms = Some((
            norm_param(format!("{p}.pre_feedforward_layernorm.weight"), hidden),
            norm_param(format!("{p}.post_feedforward_layernorm.weight"), hidden),
        ));
    }
}

/// What Gemma 3 checkpoints could say that this crate does not compute.
fn refuse_unsupported(raw: &RawConfig, at: &At<'_>) -> Result<()> {
    for (key, act) in [
        ("hidden_activation", &raw.hidden_activation),
        ("hidden_act", &raw.hidden_act),
    ] {
        if let Some(act) = act.as_deref().filter(|a| *a != GELU_TANH) {
            return Err(at.err(
                key,
                format!("only {GELU_TANH:?} is supported, found {act:?}"),
            ));
        }
    }
    for (key, cap) in [
        ("attn_logit_softcapping", raw.attn_logit_softcapping),
        ("final_logit_softcapping", raw.final_logit_softcapping),
    ] {
        if let Some(cap) = cap {
            return Err(at.err(
                key,
                format!("logit soft-capping ({cap}) is not supported; Gemma 3 checkpoints set it to null"),
            ));
        }
    }
    if raw.use_bidirectional_attention == Some(true) {
        return Err(at.err(
            "use_bidirectional_attention",
            "bidirectional attention (an embedding model) is not a causal LM",
        ));
    }
    Ok(())
}

/// Which layers slide: `layer_types` when given, else every `sliding_window_pattern`-th
/// layer is full (HF's derivation).
fn sliding_layers(raw: &RawConfig, layers: usize, at: &At<'_>) -> Result<Vec<bool>> {
    let Some(types) = &raw.layer_types else {
        let pattern = raw
            .sliding_window_pattern
            .unwrap_or(DEFAULT_SLIDING_WINDOW_PATTERN);
        if pattern == 0 {
            return Err(at.err("sliding_window_pattern", "must be at least 1"));
        }
        return Ok((0..layers).map(|i| (i + 1) % pattern != 0).collect());
    };
    if types.len() != layers {
        let n = types.len();
        return Err(at.err(
            "layer_types",
            format!("has {n} entries, expected num_hidden_layers = {layers}"),
        ));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            "full_attention" => Ok(false),
            "sliding_attention" => Ok(true),
            _ => Err(at.err(
                "layer_types",
                format!(
                    "unsupported layer type {t:?}; expected full_attention or sliding_attention"
                ),
            )),
        })
        .collect()
}

/// The sliding layers' RoPE base: `rope_local_base_freq` (transformers 4), or the
/// `sliding_attention` entry of `rope_parameters` (transformers 5), which must be unscaled.
fn local_rope_theta(raw: &RawConfig, at: &At<'_>) -> Result<f64> {
    if let Some(theta) = raw.rope_local_base_freq {
        return Ok(theta);
    }
    let key = "rope_parameters.sliding_attention";
    let Some(local) = raw
        .rope_parameters
        .as_ref()
        .and_then(|p| p.get("sliding_attention"))
    else {
        return Ok(DEFAULT_LOCAL_ROPE_THETA);
    };
    let rope_type = local.get("rope_type").and_then(Value::as_str);
    if rope_type.is_some_and(|t| t != "default") {
        return Err(at.err(
            &format!("{key}.rope_type"),
            format!("only \"default\" is supported for the sliding layers, found {rope_type:?}"),
        ));
    }
    Ok(local
        .get("rope_theta")
        .and_then(Value::as_f64)
        .unwrap_or(DEFAULT_LOCAL_ROPE_THETA))
}
