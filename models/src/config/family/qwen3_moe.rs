//! The Qwen3-MoE family (`model_type: "qwen3_moe"`): Qwen3 attention (per-head `q_norm` /
//! `k_norm` before RoPE, optional `attention_bias` on q/k/v/o) and routed experts on the
//! layers `decoder_sparse_step` and `mlp_only_layers` leave sparse; no shared expert. With
//! `use_sliding_window` every layer uses `sliding_window`.

use super::moe_keys::{read_moe, write_moe, MoeDefaults, MoeKeyNames};
use super::{FamilyDecl, FamilyKeys};
use crate::config::layout::{BackboneParams, Biases};
use crate::config::model_config::ModelConfig;
use crate::config::raw::{At, RawConfig};
use crate::error::Result;
use crate::moe::config::MoeConfig;
use crate::moe::layout::{moe_backbone, MoeNames};
use serde_json::{Map, Value};

/// HF's defaults (`Qwen3MoeConfig`).
const DEFAULTS: MoeDefaults = MoeDefaults {
    num_experts: 128,
    top_k: 8,
    moe_intermediate_size: Some(768),
    norm_topk_prob: Some(false),
    sparse_layers: true,
    shared_expert: None,
};

const KEY_NAMES: MoeKeyNames = MoeKeyNames {
    experts_key: "num_experts",
    moe_width: true,
    sparse_layers: true,
};

const NAMES: MoeNames = MoeNames {
    block: "mlp",
    expert: ["gate_proj", "up_proj", "down_proj"],
    qk_norm: true,
};

/// The Qwen3-MoE declaration.
pub(crate) struct Qwen3Moe;

impl FamilyDecl for Qwen3Moe {
    fn model_type(&self) -> &'static str {
        "qwen3_moe"
    }

    fn class_prefix(&self) -> &'static str {
        "Qwen3Moe"
    }

    fn read_keys(&self, raw: &RawConfig, at: &At<'_>) -> Result<FamilyKeys> {
        let window = raw.use_sliding_window.unwrap_or(false);
        Ok(FamilyKeys {
            attention_bias: raw.attention_bias.unwrap_or(false),
            sliding_window: if window { raw.sliding_window } else { None },
            moe: Some(read_moe(raw, at, &DEFAULTS)?),
            ..FamilyKeys::default()
        })
    }

    fn write_keys(&self, cfg: &ModelConfig, out: &mut Map<String, Value>) {
        out.insert("attention_bias".into(), cfg.attention_bias.into());
        out.insert(
            "use_sliding_window".into(),
            cfg.sliding_window.is_some().into(),
        );
        out.insert("sliding_window".into(), cfg.sliding_window.into());
        write_moe(cfg, KEY_NAMES, out);
    }

    fn biases(&self, cfg: &ModelConfig) -> Biases {
        Biases::attention_only(cfg.attention_bias)
    }

    fn backbone(&self, cfg: &ModelConfig) -> BackboneParams {
        moe_backbone(cfg, self.biases(cfg), &NAMES)
    }

    fn preset_moe(&self, _hidden: usize, intermediate: usize) -> Option<MoeConfig> {
        Some(MoeConfig {
            num_experts: 4,
            num_experts_per_tok: 2,
            moe_intermediate_size: intermediate / 4,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
            shared_expert_intermediate_size: None,
            router_aux_loss_coef: 0.001,
            output_router_logits: false,
        })
    }
}
