//! The Mixtral family (`model_type: "mixtral"`): Mistral attention (no biases, optional
//! `sliding_window` on every layer) and a sparse block on every layer,
//! `block_sparse_moe.gate` with experts `block_sparse_moe.experts.N.{w1, w3, w2}` (gate, up,
//! down) of width `intermediate_size`; the top-k routing weights are always renormalised.

use super::moe_keys::{read_moe, write_moe, MoeDefaults, MoeKeyNames};
use super::{FamilyDecl, FamilyKeys};
use crate::config::layout::{BackboneParams, Biases};
use crate::config::model_config::ModelConfig;
use crate::config::raw::{At, RawConfig};
use crate::error::{ModelError, Result};
use crate::moe::config::MoeConfig;
use crate::moe::layout::{moe_backbone, MoeNames};
use serde_json::{Map, Value};
use std::path::Path;

/// HF's defaults (`MixtralConfig`); the expert width is `intermediate_size`.
const DEFAULTS: MoeDefaults = MoeDefaults {
    num_experts: 8,
    top_k: 2,
    moe_intermediate_size: None,
    norm_topk_prob: None,
    sparse_layers: false,
    shared_expert: None,
};

const KEY_NAMES: MoeKeyNames = MoeKeyNames {
    experts_key: "num_local_experts",
    moe_width: false,
    sparse_layers: false,
};

const NAMES: MoeNames = MoeNames {
    block: "block_sparse_moe",
    expert: ["w1", "w3", "w2"],
    qk_norm: false,
};

/// The Mixtral declaration.
pub(crate) struct Mixtral;

impl FamilyDecl for Mixtral {
    fn model_type(&self) -> &'static str {
        "mixtral"
    }

    fn class_prefix(&self) -> &'static str {
        "Mixtral"
    }

    fn read_keys(&self, raw: &RawConfig, at: &At<'_>) -> Result<FamilyKeys> {
        Ok(FamilyKeys {
            sliding_window: raw.sliding_window,
            moe: Some(read_moe(raw, at, &DEFAULTS)?),
            ..FamilyKeys::default()
        })
    }

    fn write_keys(&self, cfg: &ModelConfig, out: &mut Map<String, Value>) {
        out.insert("sliding_window".into(), cfg.sliding_window.into());
        write_moe(cfg, KEY_NAMES, out);
    }

    fn biases(&self, _cfg: &ModelConfig) -> Biases {
        Biases {
            qkv: false,
            o: false,
            mlp: false,
        }
    }

    fn validate(&self, cfg: &ModelConfig, path: &Path) -> Result<()> {
        match &cfg.moe {
            Some(m) if m.moe_intermediate_size != cfg.intermediate_size => {
                Err(ModelError::InvalidConfig {
                    path: path.to_path_buf(),
                    key: "intermediate_size".into(),
                    message: format!(
                        "Mixtral's experts are intermediate_size wide ({}), but the MoE config says {}",
                        cfg.intermediate_size, m.moe_intermediate_size
                    ),
                })
            }
            _ => Ok(()),
        }
    }

    fn backbone(&self, cfg: &ModelConfig) -> BackboneParams {
        moe_backbone(cfg, self.biases(cfg), &NAMES)
    }

    fn preset_moe(&self, _hidden: usize, intermediate: usize) -> Option<MoeConfig> {
        Some(MoeConfig {
            num_experts: 4,
            num_experts_per_tok: 2,
            moe_intermediate_size: intermediate,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
            shared_expert_intermediate_size: None,
            router_aux_loss_coef: 0.001,
            output_router_logits: false,
        })
    }
}
