//! `MoeConfig`: the mixture-of-experts hyper-parameters of an HF `config.json` (Qwen3-MoE,
//! Qwen2-MoE, Mixtral): how many experts, how many a token visits, their width, which layers
//! are sparse, the shared expert, and the load-balancing loss. Reading the keys is the
//! family's business (`family/`); this file holds the values, their rules and validation.

use crate::error::{ModelError, Result};
use std::path::Path;

/// Mixture-of-experts hyper-parameters (HF key names).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Routed experts per sparse layer (`num_experts` / `num_local_experts`).
    pub num_experts: usize,
    /// Experts each token is sent to (`num_experts_per_tok`, the top-k).
    pub num_experts_per_tok: usize,
    /// Width of each routed expert's SiLU-gated MLP (`moe_intermediate_size`; Mixtral uses
    /// `intermediate_size`).
    pub moe_intermediate_size: usize,
    /// Renormalise the top-k routing probabilities to sum to 1 (`norm_topk_prob`; always on
    /// for Mixtral).
    pub norm_topk_prob: bool,
    /// Layer `i` is sparse when `(i + 1) % decoder_sparse_step == 0` (and not in
    /// `mlp_only_layers`).
    pub decoder_sparse_step: usize,
    /// Layers that keep a dense MLP of `intermediate_size`.
    pub mlp_only_layers: Vec<usize>,
    /// Width of the always-on shared expert (Qwen2-MoE `shared_expert_intermediate_size`),
    /// gated per token by `sigmoid(shared_expert_gate(x))`; `None` = no shared expert.
    pub shared_expert_intermediate_size: Option<usize>,
    /// Weight of the load-balancing auxiliary loss in HF's training loss
    /// (`router_aux_loss_coef`).
    pub router_aux_loss_coef: f64,
    /// HF's switch to return router logits (and add the auxiliary loss) by default
    /// (`output_router_logits`). Kept for the round trip; oxalign's forwards always record
    /// router logits and the trainer decides whether to add the loss.
    pub output_router_logits: bool,
}

impl MoeConfig {
    /// Whether decoder layer `layer` is a sparse (routed) block rather than a dense MLP: HF's
    /// rule `layer ∉ mlp_only_layers && num_experts > 0 && (layer + 1) % decoder_sparse_step == 0`.
    pub fn is_sparse_layer(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && self.num_experts > 0
            && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }

    /// Checks the invariants the MoE code relies on; errors name `path` and the key.
    pub(crate) fn validate_at(&self, path: &Path, num_layers: usize) -> Result<()> {
        let err = |key: &str, message: String| ModelError::InvalidConfig {
            path: path.to_path_buf(),
            key: key.to_string(),
            message,
        };
        if self.decoder_sparse_step == 0 {
            return Err(err("decoder_sparse_step", "must be greater than 0".into()));
        }
        if self.num_experts > 0 {
            for (key, v) in [
                ("num_experts_per_tok", self.num_experts_per_tok),
                ("moe_intermediate_size", self.moe_intermediate_size),
            ] {
                if v == 0 {
                    return Err(err(key, "must be greater than 0".into()));
                }
            }
            if self.num_experts_per_tok > self.num_experts {
                return Err(err(
                    "num_experts_per_tok",
                    format!(
                        "{} is more than num_experts {}",
                        self.num_experts_per_tok, self.num_experts
                    ),
                ));
            }
        }
        if let Some(&bad) = self.mlp_only_layers.iter().find(|&&l| l >= num_layers) {
            return Err(err(
                "mlp_only_layers",
                format!("layer {bad} is not below num_hidden_layers {num_layers}"),
            ));
        }
        if self.shared_expert_intermediate_size == Some(0) {
            return Err(err(
                "shared_expert_intermediate_size",
                "must be greater than 0".into(),
            ));
        }
        if !self.router_aux_loss_coef.is_finite() || self.router_aux_loss_coef < 0.0 {
            return Err(err(
                "router_aux_loss_coef",
                format!(
                    "must be a finite number >= 0, found {}",
                    self.router_aux_loss_coef
                ),
            ));
        }
        Ok(())
    }
}
