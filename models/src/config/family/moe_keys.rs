//! The config.json keys every mixture-of-experts family shares (`num_experts` /
//! `num_local_experts`, `num_experts_per_tok`, `moe_intermediate_size`, `norm_topk_prob`,
//! `decoder_sparse_step`, `mlp_only_layers`, `shared_expert_intermediate_size`,
//! `router_aux_loss_coef`, `output_router_logits`): reading them with a family's HF
//! defaults, and writing them back. Which keys a family has is its own file's choice.

use crate::config::model_config::ModelConfig;
use crate::config::raw::{At, RawConfig};
use crate::error::Result;
use crate::moe::config::MoeConfig;
use serde_json::{Map, Value};

/// A family's HF defaults for keys missing from config.json, and which keys it has.
pub(super) struct MoeDefaults {
    /// `num_experts` when absent.
    pub num_experts: usize,
    /// `num_experts_per_tok` when absent.
    pub top_k: usize,
    /// `moe_intermediate_size` when absent; `None` = the family has no such key and uses
    /// `intermediate_size` (Mixtral).
    pub moe_intermediate_size: Option<usize>,
    /// `norm_topk_prob` when absent; `None` = the family has no such key and always
    /// renormalises (Mixtral).
    pub norm_topk_prob: Option<bool>,
    /// Whether the family reads `decoder_sparse_step` and `mlp_only_layers`.
    pub sparse_layers: bool,
    /// `shared_expert_intermediate_size` when absent; `None` = no shared expert.
    pub shared_expert: Option<usize>,
}

/// HF's default `router_aux_loss_coef` (every MoE family).
const DEFAULT_AUX_COEF: f64 = 0.001;

/// Reads the MoE keys of `raw` under `d`. `num_experts` and `num_local_experts` are two
/// spellings of one key (HF's `attribute_map`); both may be present only when equal.
pub(super) fn read_moe(raw: &RawConfig, at: &At<'_>, d: &MoeDefaults) -> Result<MoeConfig> {
    let num_experts = match (raw.num_experts, raw.num_local_experts) {
        (Some(a), Some(b)) if a != b => {
            return Err(at.err(
                "num_local_experts",
                format!("{b} disagrees with num_experts {a} (two spellings of one key)"),
            ))
        }
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => d.num_experts,
    };
    let moe_intermediate_size = match d.moe_intermediate_size {
        Some(default) => raw.moe_intermediate_size.unwrap_or(default),
        None => at.required("intermediate_size", raw.intermediate_size)?,
    };
    let (decoder_sparse_step, mlp_only_layers) = if d.sparse_layers {
        (
            raw.decoder_sparse_step.unwrap_or(1),
            raw.mlp_only_layers.clone().unwrap_or_default(),
        )
    } else {
        (1, vec![])
    };
    Ok(MoeConfig {
        num_experts,
        num_experts_per_tok: raw.num_experts_per_tok.unwrap_or(d.top_k),
        moe_intermediate_size,
        norm_topk_prob: match d.norm_topk_prob {
            Some(default) => raw.norm_topk_prob.unwrap_or(default),
            None => true,
        },
        decoder_sparse_step,
        mlp_only_layers,
        shared_expert_intermediate_size: d
            .shared_expert
            .map(|default| raw.shared_expert_intermediate_size.unwrap_or(default)),
        router_aux_loss_coef: raw.router_aux_loss_coef.unwrap_or(DEFAULT_AUX_COEF),
        output_router_logits: raw.output_router_logits.unwrap_or(false),
    })
}

/// Which keys [`write_moe`] writes.
#[derive(Clone, Copy)]
pub(super) struct MoeKeyNames {
    /// The spelling of the expert count (`num_experts` or `num_local_experts`).
    pub experts_key: &'static str,
    /// Whether `moe_intermediate_size` and `norm_topk_prob` are written (not Mixtral).
    pub moe_width: bool,
    /// Whether `decoder_sparse_step` and `mlp_only_layers` are written (not Mixtral).
    pub sparse_layers: bool,
}

/// Writes `cfg.moe`'s keys into a config.json object (nothing for a dense config).
pub(super) fn write_moe(cfg: &ModelConfig, names: MoeKeyNames, out: &mut Map<String, Value>) {
    let Some(m) = &cfg.moe else { return };
    out.insert(names.experts_key.into(), m.num_experts.into());
    out.insert("num_experts_per_tok".into(), m.num_experts_per_tok.into());
    if names.moe_width {
        out.insert(
            "moe_intermediate_size".into(),
            m.moe_intermediate_size.into(),
        );
        out.insert("norm_topk_prob".into(), m.norm_topk_prob.into());
    }
    if names.sparse_layers {
        out.insert("decoder_sparse_step".into(), m.decoder_sparse_step.into());
        out.insert("mlp_only_layers".into(), m.mlp_only_layers.clone().into());
    }
    if let Some(s) = m.shared_expert_intermediate_size {
        out.insert("shared_expert_intermediate_size".into(), s.into());
    }
    out.insert("router_aux_loss_coef".into(), m.router_aux_loss_coef.into());
    out.insert("output_router_logits".into(), m.output_router_logits.into());
}
