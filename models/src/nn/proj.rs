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
use oxalign_kernels::ops::{
    gate_up_bf16, linear_residual_bf16, linear_residual_f32, linear_rope_bf16, linear_rope_f32,
    swiglu_linear_bf16, swiglu_linear_f32, swiglu_pairs_linear_bf16,
};

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
        let fusable = self.fused_kernels_apply(gate) && up.dtype() == DType::F32;
        let y = match (precision, fusable) {
            (Precision::F32, true) => swiglu_linear_f32(gate, up, &self.weight)?,
            (Precision::Bf16Mixed, true) => swiglu_linear_bf16(gate, up, &self.weight)?,
            _ => return Ok(None),
        };
        with_bias(y, self.bias.as_ref()).map(Some)
    }

    /// `self(swiglu(gate(x), up(x)))` under bf16 mixed precision, with `self` the down
    /// projection, the gate's and up's outputs rounded to bf16 and kept so for the backward
    /// ([`oxalign_kernels::ops::gate_up_bf16`], then
    /// [`oxalign_kernels::ops::swiglu_pairs_linear_bf16`]), where that applies: f32 tensors
    /// on the CPU, no LoRA adapter on any of the three, no bias on the gate or up. `None`
    /// elsewhere (the caller composes).
    pub fn forward_swiglu_block_bf16(
        &self,
        gate: &Proj,
        up: &Proj,
        x: &Tensor,
    ) -> Result<Option<Tensor>> {
        let fusable = [self, gate, up].iter().all(|p| p.fused_kernels_apply(x))
            && gate.bias.is_none()
            && up.bias.is_none();
        if !fusable {
            return Ok(None);
        }
        let pairs = gate_up_bf16(x, &gate.weight, &up.weight)?;
        let y = swiglu_pairs_linear_bf16(&pairs, &self.weight)?;
        with_bias(y, self.bias.as_ref()).map(Some)
    }

    /// `self(x)` split into `heads` heads `[B, heads, T, D]` and rotated by `cos`/`sin`, as one
    /// fused op where that applies (f32 tensors on the CPU, f32 or bf16-mixed numbers, no
    /// bias, no LoRA adapter: the unrotated projection is then not kept for the backward,
    /// [`oxalign_kernels::ops::linear_rope_f32`]). `None` elsewhere (the caller composes).
    pub fn forward_rotated(
        &self,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        heads: usize,
        precision: Precision,
    ) -> Result<Option<Tensor>> {
        let fusable = self.fused_kernels_apply(x) && self.bias.is_none();
        if !fusable || [cos.dtype(), sin.dtype()] != [DType::F32; 2] {
            return Ok(None);
        }
        match precision {
            Precision::F32 => linear_rope_f32(x, &self.weight, (cos, sin), heads).map(Some),
            Precision::Bf16Mixed => linear_rope_bf16(x, &self.weight, (cos, sin), heads).map(Some),
            Precision::FakeInt8 => Ok(None),
        }
    }

    /// Whether this projection's product of `x` may run in one of the fused kernels: f32
    /// tensors on the CPU, no LoRA adapter.
    fn fused_kernels_apply(&self, x: &Tensor) -> bool {
        self.adapter.is_none()
            && x.device().is_cpu()
            && [x.dtype(), self.weight.dtype()] == [DType::F32; 2]
    }

    /// `residual + self(x)`, as one fused op where that applies (f32 tensors on the CPU, f32
    /// or bf16-mixed numbers, no bias, no LoRA adapter: the product is then not kept for the
    /// backward beside the sum, [`oxalign_kernels::ops::linear_residual_f32`]); composed
    /// elsewhere. Bit-identical either way.
    pub fn forward_onto(
        &self,
        x: &Tensor,
        residual: &Tensor,
        precision: Precision,
    ) -> Result<Tensor> {
        let fusable =
            self.fused_kernels_apply(x) && self.bias.is_none() && residual.dtype() == DType::F32;
        match (precision, fusable) {
            (Precision::F32, true) => linear_residual_f32(x, &self.weight, residual),
            (Precision::Bf16Mixed, true) => linear_residual_bf16(x, &self.weight, residual),
            _ => residual + self.forward(x, precision)?,
        }
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
