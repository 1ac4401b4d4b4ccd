//! The SiLU-gated feed-forward block of a decoder layer:
//! `down(silu(gate(x)) * up(x))` (the gate fused: `oxalign_kernels::ops::swiglu`), with
//! optional biases (llama `mlp_bias`). Nothing else.

use crate::config::ModelConfig;
use crate::layers::{linear, swiglu};
use crate::param_store::ParamStore;
use candle_core::{Result, Tensor};

/// Weights of `model.layers.N.mlp.{gate,up,down}_proj`.
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
    /// Picks up `{prefix}.{gate,up,down}_proj.{weight,bias}` from `params`.
    pub fn new(cfg: &ModelConfig, params: &ParamStore, prefix: &str) -> Result<Mlp> {
        let w = |n: &str| params.get(&format!("{prefix}.{n}_proj.weight"));
        let b = |n: &str| -> Result<Option<Tensor>> {
            cfg.mlp_bias()
                .then(|| params.get(&format!("{prefix}.{n}_proj.bias")))
                .transpose()
        };
        Ok(Mlp {
            gate_w: w("gate")?,
            gate_b: b("gate")?,
            up_w: w("up")?,
            up_b: b("up")?,
            down_w: w("down")?,
            down_b: b("down")?,
        })
    }

    /// `x`: `[B, T, H]` -> `[B, T, H]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = linear(x, &self.gate_w, self.gate_b.as_ref())?;
        let up = linear(x, &self.up_w, self.up_b.as_ref())?;
        linear(&swiglu(&gate, &up)?, &self.down_w, self.down_b.as_ref())
    }
}
