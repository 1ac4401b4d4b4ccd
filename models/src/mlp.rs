//! The SiLU-gated feed-forward block of a decoder layer:
//! `down(silu(gate(x)) * up(x))` (the gate fused: `oxalign_kernels::ops::swiglu`), with
//! optional biases (llama `mlp_bias`). Nothing else.

use crate::layers::{linear, swiglu};
use crate::layout::MlpParams;
use crate::param_store::ParamStore;
use candle_core::{Result, Tensor};

/// Weights of one MLP block (the tensors of an [`MlpParams`]).
#[derive(Clone, Debug)]
pub struct Mlp {
    gate_w: Tensor,
    gate_b: Option<Tensor>,
    up_w: Tensor,
    up_b: Option<Tensor>,
    down_w: Tensor,
    down_b: Option<Tensor>,
}

impl Mlp {
    /// Picks up the tensors `decl` names (with a bias where it declares one) from `params`.
    pub fn new(params: &ParamStore, decl: &MlpParams) -> Result<Mlp> {
        Ok(Mlp {
            gate_w: params.get(&decl.gate.weight.name)?,
            gate_b: params.bias(&decl.gate)?,
            up_w: params.get(&decl.up.weight.name)?,
            up_b: params.bias(&decl.up)?,
            down_w: params.get(&decl.down.weight.name)?,
            down_b: params.bias(&decl.down)?,
        })
    }

    /// `x`: `[B, T, H]` -> `[B, T, H]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = linear(x, &self.gate_w, self.gate_b.as_ref())?;
        let up = linear(x, &self.up_w, self.up_b.as_ref())?;
        linear(&swiglu(&gate, &up)?, &self.down_w, self.down_b.as_ref())
    }
}
