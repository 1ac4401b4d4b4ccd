//! The parameter declaration of the mixture-of-experts backbones (Qwen3-MoE, Qwen2-MoE,
//! Mixtral): the dense layout of `layout.rs` with each sparse layer's MLP replaced by a router,
//! its experts and (Qwen2-MoE) a gated shared expert, and optionally per-head q/k RMSNorms.
//! The families (`family/`) choose the names; no tensors live here.

use crate::config::layout::{
    add_qk_norms, dense_backbone, mlp_params, BackboneParams, Biases, FeedForwardParams,
    LinearParams, MoeParams, PackedExpertNames, SharedExpertParams,
};
use crate::config::model_config::ModelConfig;
use crate::config::param_spec::ParamKind;

/// How a family names the tensors of its sparse blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MoeNames {
    /// The block's module under `model.layers.N` (`mlp`, Mixtral `block_sparse_moe`).
    pub block: &'static str,
    /// Each expert's gate, up and down projection (`gate_proj, up_proj, down_proj`, Mixtral
    /// `w1, w3, w2`).
    pub expert: [&'static str; 3],
    /// Whether attention has per-head `q_norm` / `k_norm` (Qwen3).
    pub qk_norm: bool,
}

/// The MoE backbone of `cfg` (whose `moe` must be set; without it the dense one) with
/// `biases` on the attention projections and the names of `names`.
pub(crate) fn moe_backbone(cfg: &ModelConfig, biases: Biases, names: &MoeNames) -> BackboneParams {
    let mut backbone = dense_backbone(cfg, biases);
    if names.qk_norm {
        add_qk_norms(&mut backbone, cfg.head_dim);
    }
    for (i, layer) in backbone.layers.iter_mut().enumerate() {
        if cfg.is_sparse_layer(i) {
            if let Some(moe) = moe_params(cfg, i, names) {
                layer.ffn = FeedForwardParams::Sparse(moe);
            }
        }
    }
    backbone
}

/// The sparse block of layer `i`: `{block}.gate` `[E, H]`, `{block}.experts.{e}.*`, and the
/// shared expert `{block}.shared_expert.*` with `{block}.shared_expert_gate` `[1, H]`.
fn moe_params(cfg: &ModelConfig, i: usize, names: &MoeNames) -> Option<MoeParams> {
    let m = cfg.moe.as_ref()?;
    let h = cfg.hidden_size;
    let b = format!("model.layers.{i}.{}", names.block);
    let router = LinearParams::new(&format!("{b}.gate"), m.num_experts, h, false)
        .with_kind(ParamKind::Router);
    let experts = (0..m.num_experts)
        .map(|e| {
            let prefix = format!("{b}.experts.{e}");
            mlp_params(&prefix, names.expert, m.moe_intermediate_size, h, false)
        })
        .collect();
    let shared = m.shared_expert_intermediate_size.map(|width| {
        let names = ["gate_proj", "up_proj", "down_proj"];
        SharedExpertParams {
            mlp: mlp_params(&format!("{b}.shared_expert"), names, width, h, false),
            gate: LinearParams::new(&format!("{b}.shared_expert_gate"), 1, h, false)
                .with_kind(ParamKind::Router),
        }
    });
    // The packed layout always lives under `mlp` (transformers renames Mixtral's module).
    let packed = format!("model.layers.{i}.mlp");
    Some(MoeParams {
        router,
        experts,
        shared,
        packed: PackedExpertNames {
            gate_up: format!("{packed}.experts.gate_up_proj"),
            down: format!("{packed}.experts.down_proj"),
            router: format!("{packed}.gate.weight"),
        },
    })
}
