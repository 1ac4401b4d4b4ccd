//! The config.json keys of the Gemma families (`gemma.rs`) and how they are read and
//! written: the activation, the soft-caps, the query scale, which layers slide and the
//! sliding layers' RoPE base, each with HF's default for the generation.

use crate::config::model_config::{Activation, BlockStyle, ModelConfig, SlidingLayers};
use crate::config::raw::{At, RawConfig};
use crate::error::Result;
use serde_json::{Map, Value};

/// Gemma 2 or Gemma 3: what their configs and blocks differ in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Generation {
    /// `gemma2`: logit soft-caps, every other layer full, one RoPE base.
    Two,
    /// `gemma3_text`: q/k norms, every sixth layer full, a local RoPE base.
    Three,
}

impl Generation {
    /// HF's `sliding_window_pattern`: every n-th layer is full.
    pub(super) fn pattern(self) -> usize {
        match self {
            Generation::Two => 2,
            Generation::Three => 6,
        }
    }

    /// HF's default (attention, final) logit soft-caps.
    fn default_softcaps(self) -> (Option<f64>, Option<f64>) {
        match self {
            Generation::Two => (Some(50.0), Some(30.0)),
            Generation::Three => (None, None),
        }
    }
}

/// HF's defaults shared by both generations.
const DEFAULT_QUERY_PRE_ATTN_SCALAR: f64 = 256.0;
pub(super) const DEFAULT_SLIDING_WINDOW: usize = 4096;
pub(super) const DEFAULT_LOCAL_ROPE_THETA: f64 = 10_000.0;
/// The one activation Gemma checkpoints use.
const GELU_TANH: &str = "gelu_pytorch_tanh";

/// Gemma's block as `raw` configures it.
pub(super) fn read_style(gen: Generation, raw: &RawConfig, at: &At<'_>) -> Result<BlockStyle> {
    refuse_unsupported(raw, at)?;
    let (attn, fin) = gen.default_softcaps();
    // A missing key takes HF's default; `null` is no cap (what Gemma 3 checkpoints write).
    Ok(BlockStyle {
        query_pre_attn_scalar: Some(
            raw.query_pre_attn_scalar
                .unwrap_or(DEFAULT_QUERY_PRE_ATTN_SCALAR),
        ),
        local_rope_theta: match gen {
            Generation::Two => None,
            Generation::Three => Some(local_rope_theta(raw, at)?),
        },
        attn_softcap: raw.attn_logit_softcapping.unwrap_or(attn),
        final_softcap: raw.final_logit_softcapping.unwrap_or(fin),
        ..gemma_block()
    })
}

/// What every Gemma block has: `(1 + w)` norms, scaled embeddings, a GELU-tanh gate and
/// four norms per layer.
pub(super) fn gemma_block() -> BlockStyle {
    BlockStyle {
        norm_offset: 1.0,
        scale_embeddings: true,
        activation: Activation::GeluTanh,
        sandwich_norms: true,
        ..BlockStyle::default()
    }
}

/// Writes the Gemma keys of `cfg` into a config.json object.
pub(super) fn write_style(gen: Generation, cfg: &ModelConfig, out: &mut Map<String, Value>) {
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
    if gen == Generation::Three {
        out.insert("rope_local_base_freq".into(), style.local_rope_theta.into());
    }
    out.insert("attn_logit_softcapping".into(), style.attn_softcap.into());
    out.insert("final_logit_softcapping".into(), style.final_softcap.into());
}

/// What Gemma checkpoints could say that this crate does not compute.
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
    if raw.use_bidirectional_attention == Some(true) {
        return Err(at.err(
            "use_bidirectional_attention",
            "bidirectional attention (an embedding model) is not a causal LM",
        ));
    }
    Ok(())
}

/// Which layers slide: `layer_types` when given, else every `pattern`-th layer is full
/// (`sliding_window_pattern` when given; HF's derivation).
pub(super) fn sliding_layers(
    gen: Generation,
    raw: &RawConfig,
    layers: usize,
    at: &At<'_>,
) -> Result<SlidingLayers> {
    let Some(types) = &raw.layer_types else {
        let pattern = raw.sliding_window_pattern.unwrap_or(gen.pattern());
        if pattern == 0 {
            return Err(at.err("sliding_window_pattern", "must be at least 1"));
        }
        return Ok(SlidingLayers::EveryNthFull(pattern));
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
        .collect::<Result<_>>()
        .map(SlidingLayers::Listed)
}

/// Gemma 3's sliding layers' RoPE base: `rope_local_base_freq` (transformers 4), or the
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
