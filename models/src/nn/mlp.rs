//! The SiLU-gated feed-forward block of a decoder layer:
//! `down(silu(gate(x)) * up(x))` (the gate fused: `oxalign_kernels::ops::swiglu`), with
//! optional biases (llama `mlp_bias`). Nothing else.

use crate::config::layout::MlpParams;
use crate::io::param_store::ParamStore;
use crate::nn::fake_quant::quantizable_linear;
use crate::nn::layers::{swiglu, swiglu_engine_order};
use crate::nn::precision::Precision;
use candle_core::{Result, Tensor};

/// Weights of one MLP block (the tensors of an [`MlpParams`]).
#[derive(Clone, Debug)]
pub(crate) struct Mlp {
    gate_w: Tensor,
    gate_b: Option<Tensor>,
    up_w: Tensor,
    up_b: Option<Tensor>,
    down_w: Tensor,
    down_b: Option<Tensor>,
    precision: Precision,
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
            precision: Precision::F32,
        })
    }

    /// `x`: `[B, T, H]` -> `[B, T, H]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let p = self.precision;
        let gate = quantizable_linear(x, &self.gate_w, self.gate_b.as_ref(), p)?;
        let up = quantizable_linear(x, &self.up_w, self.up_b.as_ref(), p)?;
        // In the engine's numbers the activation must be the engine's bits too.
        let act = match p {
            Precision::F32 | Precision::Bf16Mixed => swiglu(&gate, &up)?,
            Precision::FakeInt8 => swiglu_engine_order(&gate, &up)?,
        };
        quantizable_linear(&act, &self.down_w, self.down_b.as_ref(), p)
    }

    /// Makes the block compute in `precision`.
    pub(crate) fn set_precision(&mut self, precision: Precision) {
        self.precision = precision;
    }
}
