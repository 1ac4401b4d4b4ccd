//! One projection of a decoder layer (q/k/v/o, gate/up/down): its weight, optional bias and
//! optional LoRA adapter, `y = x·Wᵀ + b + (α/r)·(drop(x)·Aᵀ)·Bᵀ` (PEFT's `lora.Linear`;
//! `drop` is the identity outside a trainer's differentiated forward, `lora/dropout.rs`). The base product runs in the layer's [`Precision`]; the adapter's two small
//! products run in f32. Which projections carry an adapter is decided by the store the
//! layer binds to ([`ParamStore::lora_pair`]); the adapters themselves are `lora/`'s.

use crate::config::layout::LinearParams;
use crate::io::param_store::ParamStore;
use crate::lora::dropout::AdapterBinding;
use crate::nn::fake_quant::quantizable_linear;
use crate::nn::layers::{linear, with_bias};
use crate::nn::precision::Precision;
use candle_core::{DType, Result, Tensor};
use oxalign_kernels::ops::{swiglu_linear_bf16, swiglu_linear_f32};

/// The low-rank update of one projection.
#[derive(Clone, Debug)]
struct Adapter {
    /// `[r, in]`.
    a: Tensor,
    /// `[out, r]`.
    b: Tensor,
    /// `alpha / r` and the dropout on the adapter's input.
    binding: AdapterBinding,
}

/// Weight `[out, in]`, optional bias `[out]` and optional LoRA adapter of a linear layer.
#[derive(Clone, Debug)]
pub(crate) struct Proj {
    weight: Tensor,
    bias: Option<Tensor>,
    adapter: Option<Adapter>,
}

impl Proj {
    /// Picks up the tensors `decl` names from `params`, with the adapter the store binds to
    /// that weight, if any.
    pub fn new(params: &ParamStore, decl: &LinearParams) -> Result<Proj> {
        let adapter = params
            .lora_pair(&decl.weight.name)?
            .map(|(a, b, binding)| Adapter { a, b, binding });
        Ok(Proj {
            weight: params.get(&decl.weight.name)?,
            bias: params.bias(decl)?,
            adapter,
        })
    }

    /// `self(swiglu(gate, up))` as one fused op ([`oxalign_kernels::ops::swiglu_linear_f32`]:
    /// the gate's output is recomputed in the backward, not kept), where that applies: f32
    /// tensors on the CPU, f32 or bf16-mixed numbers, no LoRA adapter. `None` elsewhere
    /// (the caller composes the gate and [`Self::forward`]).
    pub fn forward_after_swiglu(
        &self,
        gate: &Tensor,
        up: &Tensor,
        precision: Precision,
    ) -> Result<Option<Tensor>> {
        let fusable = self.adapter.is_none()
            && gate.device().is_cpu()
            && [gate.dtype(), up.dtype(), self.weight.dtype()] == [DType::F32; 3];
        let y = match (precision, fusable) {
            (Precision::F32, true) => swiglu_linear_f32(gate, up, &self.weight)?,
            (Precision::Bf16Mixed, true) => swiglu_linear_bf16(gate, up, &self.weight)?,
            _ => return Ok(None),
        };
        with_bias(y, self.bias.as_ref()).map(Some)
    }

    /// `x` `[.., in]` -> `[.., out]`, the base product in `precision`'s numbers.
    pub fn forward(&self, x: &Tensor, precision: Precision) -> Result<Tensor> {
        let y = quantizable_linear(x, &self.weight, self.bias.as_ref(), precision)?;
        match &self.adapter {
            None => Ok(y),
            Some(ad) => {
                let dropped = ad.binding.dropout.apply(x)?;
                let low = linear(&linear(&dropped, &ad.a, None)?, &ad.b, None)?;
                y + (low * ad.binding.scale)?
            }
        }
    }
}
