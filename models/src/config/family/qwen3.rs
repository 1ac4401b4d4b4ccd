//! The dense Qwen3 family (`model_type: "qwen3"`): the dense backbone with Qwen3 attention
//! (per-head `q_norm` / `k_norm` RMSNorm before RoPE, an explicit `head_dim` that need not be
//! `hidden_size / num_attention_heads`, optional `attention_bias` on q/k/v/o), no MLP bias,
//! and Qwen2's sliding-window keys (a window from layer `max_window_layers` on when
//! `use_sliding_window` is true).

use super::qwen2::{qwen2_window_keys, write_qwen2_window_keys};
use super::{FamilyDecl, FamilyKeys};
use crate::config::layout::{add_qk_norms, dense_backbone, BackboneParams, Biases};
use crate::config::model_config::ModelConfig;
use crate::config::raw::{At, RawConfig};
use crate::error::Result;
use serde_json::{Map, Value};

/// The Qwen3 declaration.
pub(crate) struct Qwen3;

impl FamilyDecl for Qwen3 {
    fn model_type(&self) -> &'static str {
        "qwen3"
    }

    fn class_prefix(&self) -> &'static str {
        "Qwen3"
    }

    fn read_keys(&self, raw: &RawConfig, _at: &At<'_>) -> Result<FamilyKeys> {
        Ok(FamilyKeys {
            attention_bias: raw.attention_bias.unwrap_or(false),
            ..qwen2_window_keys(raw)
        })
    }

    fn write_keys(&self, cfg: &ModelConfig, out: &mut Map<String, Value>) {
        out.insert("attention_bias".into(), cfg.attention_bias.into());
        write_qwen2_window_keys(cfg, out);
    }

    fn biases(&self, cfg: &ModelConfig) -> Biases {
        Biases::attention_only(cfg.attention_bias)
    }

    fn backbone(&self, cfg: &ModelConfig) -> BackboneParams {
        let mut backbone = dense_backbone(cfg, self.biases(cfg));
        add_qk_norms(&mut backbone, cfg.head_dim);
        backbone
    }
}
