//! The SwiGLU and the down projection over [`super::gate_up_bf16`]'s bf16 pairs, as one
//! differentiable op: `down(silu(g) · u)` where `[g | u]` is one `[.., 2·i]` bf16 tensor.
//!
//! What the op keeps for its backward is that bf16 tensor, half the bytes of the f32 `gate`
//! and `up` that [`super::swiglu_linear_bf16`] keeps; like it, the product `silu(g) · u` is
//! recomputed in the backward, not kept. The activation is computed in f32 from the widened
//! bf16 values with [`super::swiglu`]'s arithmetic, and the gradient of `[g | u]` is rounded
//! to bf16 on its way back (the rounding the gate's and up's bf16 products would apply to it).

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};
use half::bf16;
use multiversion::multiversion;
use rayon::prelude::*;

use super::cpu_math::contiguous_slice;
use super::linear::{bf16_path, matrix, rounded_once, Kind, Product};
use super::swiglu::{silu_times, silu_times_grads};
use super::validate;
use crate::matmul::{gemm_marked, round_to_bf16, to_bf16, widen_bf16, MatView, Numbers};

const OP: &str = "swiglu-pairs-linear";
/// Rows per rayon task of the elementwise passes.
const ROWS_PER_TASK: usize = 8;

/// `(silu(g) · u) · Wᵀ` with the product in bf16 mixed precision: `gate_up` `[.., 2·i]` bf16
/// (`[g | u]`, [`super::gate_up_bf16`]'s output), `w` `[o, i]` f32 -> `[.., o]` f32.
/// Differentiable in both.
pub fn swiglu_pairs_linear_bf16(gate_up: &Tensor, w: &Tensor) -> Result<Tensor> {
    if gate_up.dtype() != DType::BF16 || !gate_up.device().is_cpu() {
        candle_core::bail!(
            "{OP}: `gate_up` must be bf16 on the CPU, got {:?} on {:?}",
            gate_up.dtype(),
            gate_up.device()
        );
    }
    let pairs = gate_up.dims().last().copied().unwrap_or(0);
    if pairs % 2 != 0 || w.rank() != 2 || w.dim(1)? != pairs / 2 || w.dtype() != DType::F32 {
        candle_core::bail!(
            "{OP}: `gate_up` must be [.., 2·i] and `w` f32 [out, i], got {:?} and {:?} {:?}",
            gate_up.dims(),
            w.dims(),
            w.dtype()
        );
    }
    validate::same_device(OP, gate_up, "w", w)?;
    let numbers = Numbers::Bf16(bf16_path());
    gate_up
        .contiguous()?
        .apply_op2(&w.contiguous()?, SwiGluPairsLinear { numbers })
}

struct SwiGluPairsLinear {
    numbers: Numbers,
}

impl CustomOp2 for SwiGluPairsLinear {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (act, rows, inner) = activation(s1, l1)?;
        let mut wide = Vec::new();
        let w = matrix(s2, l2, "w", &mut wide)?;
        let mut out = crate::host_memory::zeros_touched(rows * w.rows, 0f32);
        gemm_marked(
            self.numbers,
            MatView::row_major(&act, rows, inner),
            w.t(),
            &mut out,
            [true, false], // the activation is rounded to bf16 values
        );
        let mut dims = l1.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = w.rows;
        }
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }

    fn bwd(
        &self,
        gate_up: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        // The gradient rounded once for both products where both run; the activation is.
        let rounded = match gate_up.track_op() && w.track_op() {
            true => rounded_once(self.numbers, &grad)?,
            false => None,
        };
        let grad = rounded.as_ref().unwrap_or(&grad);
        let product = |kind, act| Product::marked(kind, self.numbers, [rounded.is_some(), act]);
        let gw = match w.track_op() {
            true => {
                let act = gate_up.apply_op1_no_bwd(&Activation)?;
                Some(grad.apply_op2_no_bwd(&act, &product(Kind::GradWeight, true))?)
            }
            false => None,
        };
        if !gate_up.track_op() {
            return Ok((None, gw));
        }
        let d_act = grad.apply_op2_no_bwd(w, &product(Kind::GradInput, false))?;
        let d_pairs = gate_up.apply_op2_no_bwd(&d_act, &PairsGrad)?;
        Ok((Some(d_pairs.reshape(gate_up.dims())?), gw))
    }
}

/// `[g | u] [.., 2i]` bf16 -> `silu(g) · u` `[rows, i]` f32, rounded to bf16 values (the
/// down projection's operand).
struct Activation;

impl CustomOp1 for Activation {
    fn name(&self) -> &'static str {
        "swiglu-pairs"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (act, rows, inner) = activation(s, l)?;
        Ok((CpuStorage::F32(act), Shape::from((rows, inner))))
    }
}

/// `silu(g) · u` of a `[.., 2i]` bf16 storage of pairs, as `[rows, i]` f32 with `(rows, i)`.
fn activation(s: &CpuStorage, l: &Layout) -> Result<(Vec<f32>, usize, usize)> {
    let gu = contiguous_slice::<bf16>(s, l, OP, "gate_up")?;
    let inner = *l.dims().last().unwrap_or(&0) / 2;
    let act = silu_times_up(gu, inner);
    let rows = act.len().checked_div(inner).unwrap_or(0);
    Ok((act, rows, inner))
}

/// `([g | u] [.., 2i] bf16, ∂a [rows, i] f32) -> [∂g | ∂u]` `[rows, 2i]` bf16, for
/// `a = silu(g) · u`.
struct PairsGrad;

impl CustomOp2 for PairsGrad {
    fn name(&self) -> &'static str {
        "swiglu-pairs-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let gu = contiguous_slice::<bf16>(s1, l1, OP, "gate_up")?;
        let d_act = contiguous_slice::<f32>(s2, l2, OP, "grad")?;
        let pairs = *l1.dims().last().unwrap_or(&0);
        if d_act.len() * 2 != gu.len() {
            candle_core::bail!(
                "{OP}: the activation's gradient has {} values for {} pairs",
                d_act.len(),
                gu.len()
            );
        }
        let rows = gu.len().checked_div(pairs).unwrap_or(0);
        Ok((
            CpuStorage::BF16(pairs_grad(gu, d_act, pairs / 2)),
            Shape::from((rows, pairs)),
        ))
    }
}

/// `silu(g) · u` per row of `[g | u]` (`inner` each), as [`super::swiglu`] computes it,
/// rounded to bf16 values (as the down projection's product would round it).
fn silu_times_up(gu: &[bf16], inner: usize) -> Vec<f32> {
    let mut out = vec![0f32; gu.len() / 2];
    if inner == 0 {
        return out;
    }
    out.par_chunks_mut(ROWS_PER_TASK * inner)
        .zip(gu.par_chunks(ROWS_PER_TASK * 2 * inner))
        .for_each(|(o, gu)| activation_rows(o, gu, inner));
    out
}

/// One task's rows of [`silu_times_up`]. Its own multiversioned function (not the body of
/// the closure rayon calls): a closure is compiled for the baseline CPU (SSE2), whatever
/// the function that defines it is compiled for.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn activation_rows(out: &mut [f32], gu: &[bf16], inner: usize) {
    for (o, gu) in out.chunks_mut(inner).zip(gu.chunks(2 * inner)) {
        let (g, u) = gu.split_at(inner);
        for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
            *o = round_to_bf16(silu_times(widen_bf16(*g), widen_bf16(*u)));
        }
    }
}

/// `[∂g | ∂u]` rounded to bf16, [`super::swiglu`]'s backward arithmetic.
fn pairs_grad(gu: &[bf16], d_act: &[f32], inner: usize) -> Vec<bf16> {
    let mut out = vec![bf16::ZERO; gu.len()];
    if inner == 0 {
        return out;
    }
    out.par_chunks_mut(ROWS_PER_TASK * 2 * inner)
        .zip(gu.par_chunks(ROWS_PER_TASK * 2 * inner))
        .zip(d_act.par_chunks(ROWS_PER_TASK * inner))
        .for_each(|((o, gu), da)| pairs_grad_rows(o, gu, da, inner));
    out
}

/// One task's rows of [`pairs_grad`] (multiversioned as [`activation_rows`] is).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn pairs_grad_rows(out: &mut [bf16], gu: &[bf16], d_act: &[f32], inner: usize) {
    let rows = out.chunks_mut(2 * inner).zip(gu.chunks(2 * inner));
    for ((o, gu), da) in rows.zip(d_act.chunks(inner)) {
        let (dg, du) = o.split_at_mut(inner);
        let (g, u) = gu.split_at(inner);
        for i in 0..inner {
            let (d_g, d_u) = silu_times_grads(widen_bf16(g[i]), widen_bf16(u[i]), da[i]);
            (dg[i], du[i]) = (to_bf16(d_g), to_bf16(d_u));
        }
    }
}

#[cfg(test)]
#[path = "swiglu_pairs_tests.rs"]
mod tests;
