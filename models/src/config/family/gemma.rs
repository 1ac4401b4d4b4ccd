//! The Gemma families: Gemma 2 (`model_type: "gemma2"`, `Gemma2ForCausalLM`) and Gemma 3's
//! text decoder (`"gemma3_text"`, `Gemma3ForCausalLM`). The dense backbone without biases
//! (unless `attention_bias`), with Gemma's block ([`BlockStyle`]): RMSNorms that scale by
//! `1 + w`, four norms per layer (`post_attention_layernorm` on the attention's output,
//! `pre_feedforward_layernorm` / `post_feedforward_layernorm` around the MLP), a GELU-tanh
//! gate (`hidden_activation: "gelu_pytorch_tanh"`), embeddings scaled by
//! `sqrt(hidden_size)`, scores scaled by `query_pre_attn_scalar^-0.5`, and sliding-window
//! layers interleaved with full ones (`layer_types`). Gemma 2 soft-caps the attention scores
//! and the final logits (`attn_logit_softcapping` 50, `final_logit_softcapping` 30 by
//! default); Gemma 3 adds per-head q/k norms and gives its sliding layers their own RoPE
//! base (`rope_local_base_freq`; transformers 5: `rope_parameters.sliding_attention`). Tied
//! embeddings unless config.json says otherwise. The keys are read in `gemma_keys.rs`.

use super::gemma_keys::{
    gemma_block, read_style, sliding_layers, write_style, Generation, DEFAULT_LOCAL_ROPE_THETA,
    DEFAULT_SLIDING_WINDOW,
};
use super::{FamilyDecl, FamilyKeys};
use crate::config::layout::{add_qk_norms, dense_backbone, norm_param, BackboneParams, Biases};
use crate::config::model_config::{BlockStyle, ModelConfig, SlidingLayers};
use crate::config::raw::{At, RawConfig};
use crate::error::Result;
use serde_json::{Map, Value};

/// The sliding window of the size presets (shorter than their contexts, so it acts).
const PRESET_SLIDING_WINDOW: usize = 512;

/// A Gemma declaration.
pub(crate) struct Gemma(Generation);

/// Gemma 2.
pub(crate) const GEMMA2: Gemma = Gemma(Generation::Two);
/// Gemma 3's text decoder.
pub(crate) const GEMMA3: Gemma = Gemma(Generation::Three);

impl FamilyDecl for Gemma {
    fn model_type(&self) -> &'static str {
        match self.0 {
            Generation::Two => "gemma2",
            Generation::Three => "gemma3_text",
        }
    }

    fn class_prefix(&self) -> &'static str {
        match self.0 {
            Generation::Two => "Gemma2",
            Generation::Three => "Gemma3",
        }
    }

    /// `Gemma3ForCausalLM`, and `Gemma3Text...` for the heads on Gemma 3's text decoder
    /// alone (`Gemma3ForSequenceClassification` is the multimodal model's). transformers
    /// has no token classifier for Gemma 3: a critic saves as
    /// `Gemma3TextForTokenClassification`, which oxalign reads back.
    fn architecture(&self, head: &str) -> String {
        match (self.0, head) {
            (Generation::Three, "ForCausalLM") => format!("Gemma3{head}"),
            (Generation::Three, _) => format!("Gemma3Text{head}"),
            (Generation::Two, _) => format!("Gemma2{head}"),
        }
    }

    fn read_keys(&self, raw: &RawConfig, at: &At<'_>) -> Result<FamilyKeys> {
        let layers = at.required("num_hidden_layers", raw.num_hidden_layers)?;
        Ok(FamilyKeys {
            attention_bias: raw.attention_bias.unwrap_or(false),
            sliding_window: Some(raw.sliding_window.unwrap_or(DEFAULT_SLIDING_WINDOW)),
            sliding_layers: Some(sliding_layers(self.0, raw, layers, at)?),
            style: read_style(self.0, raw, at)?,
            tie_by_default: true,
            ..FamilyKeys::default()
        })
    }

    fn write_keys(&self, cfg: &ModelConfig, out: &mut Map<String, Value>) {
        write_style(self.0, cfg, out);
    }

    fn adjust_preset(&self, cfg: &mut ModelConfig) {
        cfg.tie_word_embeddings = true;
        cfg.rms_norm_eps = 1e-6;
        cfg.sliding_window = Some(PRESET_SLIDING_WINDOW);
        let pattern = self.0.pattern();
        cfg.sliding_layers = Some(SlidingLayers::EveryNthFull(pattern));
        let block = gemma_block();
        cfg.style = match self.0 {
            Generation::Two => BlockStyle {
                query_pre_attn_scalar: Some(cfg.head_dim as f64),
                attn_softcap: Some(50.0),
                final_softcap: Some(30.0),
                ..block
            },
            Generation::Three => {
                cfg.rope_theta = 1_000_000.0;
                BlockStyle {
                    query_pre_attn_scalar: Some(cfg.head_dim as f64),
                    local_rope_theta: Some(DEFAULT_LOCAL_ROPE_THETA),
                    ..block
                }
            }
        };
    }

    fn validate(&self, cfg: &ModelConfig, path: &std::path::Path) -> Result<()> {
        let at = At(path);
        let layers = cfg.num_hidden_layers;
        match &cfg.sliding_layers {
            Some(SlidingLayers::Listed(flags)) if flags.len() != layers => {
                let n = flags.len();
                return Err(at.err(
                    "layer_types",
                    format!("has {n} entries, expected num_hidden_layers = {layers}"),
                ));
            }
            Some(SlidingLayers::EveryNthFull(0)) => {
                return Err(at.err("sliding_window_pattern", "must be at least 1"));
            }
            _ => {}
        }
        let style = &cfg.style;
        for (key, v) in [
            ("query_pre_attn_scalar", style.query_pre_attn_scalar),
            ("rope_local_base_freq", style.local_rope_theta),
            ("attn_logit_softcapping", style.attn_softcap),
            ("final_logit_softcapping", style.final_softcap),
        ] {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v > 0.0)) {
                return Err(at.err(key, format!("must be finite and positive, found {v}")));
            }
        }
        Ok(())
    }

    fn biases(&self, cfg: &ModelConfig) -> Biases {
        Biases::attention_only(cfg.attention_bias)
    }

    fn backbone(&self, cfg: &ModelConfig) -> BackboneParams {
        let mut backbone = dense_backbone(cfg, self.biases(cfg));
        if self.0 == Generation::Three {
            add_qk_norms(&mut backbone, cfg.head_dim);
        }
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
