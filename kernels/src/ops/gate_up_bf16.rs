//! The gate and up projections of a SwiGLU block under bf16 mixed precision as one
//! differentiable op: `[x·W_gateᵀ | x·W_upᵀ]`, both products in bf16 with f32 sums, the two
//! outputs rounded to bf16 and stored side by side in one `[.., 2·i]` bf16 tensor.
//!
//! Why bf16 outputs: these two are the widest activations a training step keeps for its
//! backward (the SwiGLU's inputs, `[B, T, intermediate]` each). Kept in f32 they were a
//! quarter of the 246M model's activation bytes; in bf16 they are half that. This is
//! PyTorch autocast's contract for these layers (a linear's output is bf16); the one extra
//! rounding against the f32-output [`super::linear_bf16`] is of the size of the rounding the
//! down projection applies to its input anyway. The gradient arriving here is bf16 too
//! (the SwiGLU's backward rounds it, [`super::swiglu_pairs_linear_bf16`]): exactly the
//! rounding the bf16 products below would apply to an f32 one.
//!
//! Consumed by [`super::swiglu_pairs_linear_bf16`]. CPU only, f32 operands (the master
//! weights); other devices compose.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use half::bf16;
use rayon::prelude::*;

use super::linear::{bf16_path, matrix};
use super::validate;
use crate::matmul::{gemm_marked, to_bf16, MatView, Numbers, RoundedOperand};

const OP: &str = "gate-up-bf16";

/// `[x·W_gateᵀ | x·W_upᵀ]` rounded to bf16: `x` `[.., h]` f32, `w_gate`, `w_up` `[i, h]` f32
/// -> `[.., 2·i]` bf16 (the gate in the first `i` columns). Differentiable in all three.
pub fn gate_up_bf16(x: &Tensor, w_gate: &Tensor, w_up: &Tensor) -> Result<Tensor> {
    validate::f32_on_cpu(OP, &[("x", x), ("w_gate", w_gate), ("w_up", w_up)])?;
    let width = x.dims().last().copied().unwrap_or(0);
    if w_gate.rank() != 2 || w_gate.dim(1)? != width || w_up.dims() != w_gate.dims() {
        candle_core::bail!(
            "{OP}: `w_gate` and `w_up` must both be [i, {width}] (the input's width), got {:?} and {:?}",
            w_gate.dims(),
            w_up.dims()
        );
    }
    validate::same_device(OP, x, "w_gate", w_gate)?;
    let numbers = Numbers::Bf16(bf16_path());
    x.contiguous()?.apply_op3(
        &w_gate.contiguous()?,
        &w_up.contiguous()?,
        GateUp { numbers },
    )
}

struct GateUp {
    numbers: Numbers,
}

impl CustomOp3 for GateUp {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let mut wide = (Vec::new(), Vec::new(), Vec::new());
        let x = matrix(s1, l1, "x", &mut wide.0)?;
        let wg = matrix(s2, l2, "w_gate", &mut wide.1)?;
        let wu = matrix(s3, l3, "w_up", &mut wide.2)?;
        let (rows, inner) = (x.rows, wg.rows);
        let x = RoundedOperand::new(self.numbers, x);
        let mut out = vec![bf16::ZERO; rows * 2 * inner];
        for (half, w) in [wg, wu].into_iter().enumerate() {
            let mut product = crate::host_memory::zeros_touched(rows * inner, 0f32);
            gemm_marked(
                self.numbers,
                x.view(),
                w.t(),
                &mut product,
                [x.bf16_exact(), false],
            );
            out.par_chunks_mut(2 * inner)
                .zip(product.par_chunks(inner))
                .for_each(|(o, p)| {
                    let o = &mut o[half * inner..(half + 1) * inner];
                    o.iter_mut().zip(p).for_each(|(o, &v)| *o = to_bf16(v));
                });
        }
        let mut dims = l1.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = 2 * inner;
        }
        Ok((CpuStorage::BF16(out), Shape::from(dims)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w_gate: &Tensor,
        w_up: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let gx = match x.track_op() {
            true => Some(
                grad.apply_op3_no_bwd(w_gate, w_up, &GradInput(self.numbers))?
                    .reshape(x.dims())?,
            ),
            false => None,
        };
        if !(w_gate.track_op() || w_up.track_op()) {
            return Ok((gx, None, None));
        }
        let both = grad.apply_op2_no_bwd(x, &GradWeights(self.numbers))?;
        let (gg, gu) = (both.get(0)?, both.get(1)?);
        Ok((
            gx,
            w_gate.track_op().then_some(gg),
            w_up.track_op().then_some(gu),
        ))
    }
}

/// The gate's and the up projection's column halves of a `[rows, 2·i]` matrix.
fn halves(m: MatView<'_>) -> (MatView<'_>, MatView<'_>) {
    let inner = m.cols / 2;
    let half = |start: usize| MatView {
        data: &m.data[start..],
        rows: m.rows,
        cols: inner,
        row_stride: m.row_stride,
        col_stride: 1,
    };
    (half(0), half(inner))
}

/// `(∂[g | u] [r, 2i], W_gate [i, h], W_up [i, h]) -> ∂g·W_gate + ∂u·W_up [r, h]`.
struct GradInput(Numbers);

impl CustomOp3 for GradInput {
    fn name(&self) -> &'static str {
        "gate-up-bf16-grad-input"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let mut wide = (Vec::new(), Vec::new(), Vec::new());
        let (dg, du) = halves(matrix(s1, l1, "grad", &mut wide.0)?);
        let wg = matrix(s2, l2, "w_gate", &mut wide.1)?;
        let wu = matrix(s3, l3, "w_up", &mut wide.2)?;
        // The gradient halves are bf16 (widened): exact.
        let mut out = crate::host_memory::zeros_touched(dg.rows * wg.cols, 0f32);
        gemm_marked(self.0, dg, wg, &mut out, [true, false]);
        let mut up = crate::host_memory::zeros_touched(du.rows * wu.cols, 0f32);
        gemm_marked(self.0, du, wu, &mut up, [true, false]);
        out.par_iter_mut().zip(&up).for_each(|(o, &u)| *o += u);
        Ok((CpuStorage::F32(out), Shape::from((dg.rows, wg.cols))))
    }
}

/// `(∂[g | u] [r, 2i], x [r, h]) -> [∂gᵀ·x, ∂uᵀ·x]` `[2, i, h]`.
struct GradWeights(Numbers);

impl CustomOp2 for GradWeights {
    fn name(&self) -> &'static str {
        "gate-up-bf16-grad-weights"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let mut wide = (Vec::new(), Vec::new());
        let (dg, du) = halves(matrix(s1, l1, "grad", &mut wide.0)?);
        let x = RoundedOperand::new(self.0, matrix(s2, l2, "x", &mut wide.1)?);
        let marks = [true, x.bf16_exact()]; // the gradient halves are bf16 (widened)
        let (inner, width) = (dg.cols, x.view().cols);
        let mut out = crate::host_memory::zeros_touched(2 * inner * width, 0f32);
        let (og, ou) = out.split_at_mut(inner * width);
        gemm_marked(self.0, dg.t(), x.view(), og, marks);
        gemm_marked(self.0, du.t(), x.view(), ou, marks);
        Ok((CpuStorage::F32(out), Shape::from((2, inner, width))))
    }
}

#[cfg(test)]
#[path = "gate_up_bf16_tests.rs"]
mod tests;
