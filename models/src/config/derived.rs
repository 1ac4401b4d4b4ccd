//! What a [`ModelConfig`] implies through its family's declaration: which projections carry
//! biases, the backbone's parameters, and their count.

use crate::config::layout::BackboneParams;
use crate::config::model_config::ModelConfig;

impl ModelConfig {
    /// Whether q/k/v projections carry a bias (the family's rule).
    pub fn qkv_bias(&self) -> bool {
        self.family.decl().biases(self).qkv
    }

    /// Whether the attention output projection carries a bias (the family's rule).
    pub fn o_bias(&self) -> bool {
        self.family.decl().biases(self).o
    }

    /// Whether gate/up/down projections carry a bias (the family's rule).
    pub fn mlp_bias(&self) -> bool {
        self.family.decl().biases(self).mlp
    }

    /// The backbone's parameters (`model.*`) as the family declares them: names, shapes and
    /// kinds of every tensor, in the canonical order.
    pub fn backbone_params(&self) -> BackboneParams {
        self.family.decl().backbone(self)
    }

    /// Number of parameters of the decoder plus LM head (tied embeddings counted once).
    pub fn num_parameters(&self) -> usize {
        crate::config::layout::causal_lm_specs(self)
            .iter()
            .map(|s| s.numel())
            .sum()
    }
}
