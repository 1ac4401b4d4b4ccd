//! The Qwen2-MoE family (`model_type: "qwen2_moe"`): Qwen2 attention (q/k/v bias by
//! `qkv_bias`, default on; o never), routed experts on the sparse layers plus an always-on
//! shared expert scaled per token by `sigmoid(shared_expert_gate(x))`, and Qwen2's sliding
//! window keys.

use super::moe_keys::{read_moe, write_moe, MoeDefaults, MoeKeyNames};
use super::qwen2::{qwen2_window_keys, write_qwen2_window_keys};
use super::{FamilyDecl, FamilyKeys};
use crate::config::layout::{BackboneParams, Biases};
use crate::config::model_config::ModelConfig;
use crate::config::raw::{At, RawConfig};
use crate::error::Result;
use crate::moe::config::MoeConfig;
use crate::moe::layout::{moe_backbone, MoeNames};
use serde_json::{Map, Value};

/// HF's defaults (`Qwen2MoeConfig`).
const DEFAULTS: MoeDefaults = MoeDefaults {
    num_experts: 60,
    top_k: 4,
    moe_intermediate_size: Some(1408),
    norm_topk_prob: Some(false),
    sparse_layers: true,
    shared_expert: Some(5632),
};

const KEY_NAMES: MoeKeyNames = MoeKeyNames {
    experts_key: "num_experts",
    moe_width: true,
    sparse_layers: true,
};

const NAMES: MoeNames = MoeNames {
    block: "mlp",
    expert: ["gate_proj", "up_proj", "down_proj"],
    qk_norm: false,
};

/// The Qwen2-MoE declaration.
pub(crate) struct Qwen2Moe;

impl FamilyDecl for Qwen2Moe {
    fn model_type(&self) -> &'static str {
        "qwen2_moe"
    }

    fn class_prefix(&self) -> &'static str {
        "Qwen2Moe"
    }

    fn read_keys(&self, raw: &RawConfig, at: &At<'_>) -> Result<FamilyKeys> {
        Ok(FamilyKeys {
            attention_bias: raw.qkv_bias.unwrap_or(true),
            moe: Some(read_moe(raw, at, &DEFAULTS)?),
            ..qwen2_window_keys(raw)
        })
    }

    fn write_keys(&self, cfg: &ModelConfig, out: &mut Map<String, Value>) {
        out.insert("qkv_bias".into(), cfg.attention_bias.into());
        write_qwen2_window_keys(cfg, out);
        write_moe(cfg, KEY_NAMES, out);
    }

    fn biases(&self, cfg: &ModelConfig) -> Biases {
        Biases {
            qkv: cfg.attention_bias,
            o: false,
            mlp: false,
        }
    }

    fn backbone(&self, cfg: &ModelConfig) -> BackboneParams {
        moe_backbone(cfg, self.biases(cfg), &NAMES)
    }

    fn preset_moe(&self, _hidden: usize, intermediate: usize) -> Option<MoeConfig> {
        Some(MoeConfig {
            num_experts: 4,
            num_experts_per_tok: 2,
            moe_intermediate_size: intermediate / 4,
            norm_topk_prob: false,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
            shared_expert_intermediate_size: Some(intermediate / 2),
            router_aux_loss_coef: 0.001,
            output_router_logits: false,
        })
    }
}
