//! The gated feed-forward block of a decoder layer: `down(act(gate(x)) * up(x))`, SiLU (the
//! gate fused: `oxalign_kernels::ops::swiglu`, and fused with the down projection where that
//! applies, `Proj::forward_after_swiglu`, so the gate's output is not held for the
//! backward; under bf16 mixed precision the gate's and up's outputs are bf16 as well,
//! `Proj::forward_swiglu_block_bf16`) or GELU-tanh (Gemma's GeGLU, candle ops),
//! with optional biases (llama `mlp_bias`) and LoRA adapters (`proj.rs`). Nothing else.

use crate::config::layout::MlpParams;
use crate::config::model_config::Activation;
use crate::io::param_store::ParamStore;
use crate::nn::layers::{swiglu, swiglu_engine_order};
use crate::nn::precision::Precision;
use crate::nn::proj::Proj;
use candle_core::{Result, Tensor};

/// Weights of one MLP block (the tensors of an [`MlpParams`]).
#[derive(Clone, Debug)]
pub(crate) struct Mlp {
    gate: Proj,
    up: Proj,
    down: Proj,
    activation: Activation,
    precision: Precision,
}

impl Mlp {
    /// Picks up the tensors `decl` names (with a bias where it declares one) from `params`.
    /// The gate's activation is `activation`.
    pub fn new(params: &ParamStore, decl: &MlpParams, activation: Activation) -> Result<Mlp> {
        Ok(Mlp {
            gate: Proj::new(params, &decl.gate)?,
            up: Proj::new(params, &decl.up)?,
            down: Proj::new(params, &decl.down)?,
            activation,
            precision: Precision::F32,
        })
    }

    /// `x`: `[B, T, H]` -> `[B, T, H]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let p = self.precision;
        if (self.activation, p) == (Activation::Silu, Precision::Bf16Mixed) {
            if let Some(y) = self
                .down
                .forward_swiglu_block_bf16(&self.gate, &self.up, x)?
            {
                return Ok(y);
            }
        }
        let gate = self.gate.forward(x, p)?;
        let up = self.up.forward(x, p)?;
        // In the engine's numbers the activation must be the engine's bits too.
        let act = match (self.activation, p) {
            (Activation::GeluTanh, _) => (gate.gelu()? * up)?,
            (Activation::Silu, Precision::F32 | Precision::Bf16Mixed) => {
                if let Some(y) = self.down.forward_after_swiglu(&gate, &up, p)? {
                    return Ok(y);
                }
                swiglu(&gate, &up)?
            }
            (Activation::Silu, Precision::FakeInt8) => swiglu_engine_order(&gate, &up)?,
        };
        self.down.forward(&act, p)
    }

    /// Makes the block compute in `precision`.
    pub(crate) fn set_precision(&mut self, precision: Precision) {
        self.precision = precision;
    }
}
