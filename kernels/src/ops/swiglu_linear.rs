//! The feed-forward block's gate and down projection as one differentiable op:
//! `down(silu(gate) · up) = (silu(gate) · up) · Wᵀ`, in f32 or bf16 mixed precision, with
//! exactly the arithmetic of [`super::swiglu`] followed by [`super::linear_f32`] /
//! [`super::linear_bf16`] (the same kernels, so the same bits).
//!
//! Why fused: composed, autograd keeps the gate's output `silu(gate) · up`
//! `[.., intermediate]` alive from the forward to the backward as the down projection's
//! input, beside `gate` and `up` that the gate's own backward needs. Fused, the op keeps
//! only `gate` and `up` and recomputes the product in its backward (one elementwise pass,
//! against the two GEMMs the backward runs anyway): a training step holds one
//! `[B, T, intermediate]` tensor less per layer, the largest activation of the block.

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

use super::linear::{matrix, Kind, Product};
use super::swiglu::{silu_times_up, SwiGlu, SwiGluGrad};
use super::validate;
use crate::matmul::{gemm, MatView, Numbers};

const OP: &str = "swiglu-linear";

/// `swiglu(gate, up) · Wᵀ` in f32: `gate`, `up` `[.., i]` f32 on the CPU, `w` `[o, i]`
/// -> `[.., o]`. Differentiable in all three.
pub fn swiglu_linear_f32(gate: &Tensor, up: &Tensor, w: &Tensor) -> Result<Tensor> {
    swiglu_linear_op(Numbers::F32, gate, up, w)
}

/// [`swiglu_linear_f32`] with the product in bf16 mixed precision ([`super::linear_bf16`]'s
/// numbers; `w` f32, the master weight).
pub fn swiglu_linear_bf16(gate: &Tensor, up: &Tensor, w: &Tensor) -> Result<Tensor> {
    swiglu_linear_op(Numbers::Bf16(super::linear::bf16_path()), gate, up, w)
}

fn swiglu_linear_op(numbers: Numbers, gate: &Tensor, up: &Tensor, w: &Tensor) -> Result<Tensor> {
    validate::f32_on_cpu(OP, &[("gate", gate), ("up", up), ("w", w)])?;
    if gate.dims() != up.dims() {
        candle_core::bail!(
            "{OP}: `up` must have the shape of `gate` {:?}, got {:?}",
            gate.dims(),
            up.dims()
        );
    }
    let width = gate.dims().last().copied().unwrap_or(0);
    if w.rank() != 2 || w.dim(1)? != width {
        candle_core::bail!(
            "{OP}: `w` must be [out, {width}] (the gate's width), got {:?}",
            w.dims()
        );
    }
    validate::same_device(OP, gate, "w", w)?;
    gate.contiguous()?.apply_op3(
        &up.contiguous()?,
        &w.contiguous()?,
        SwiGluLinear { numbers },
    )
}

struct SwiGluLinear {
    numbers: Numbers,
}

impl CustomOp3 for SwiGluLinear {
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
        let act = silu_times_up(s1, l1, s2, l2)?;
        let width = *l1.dims().last().unwrap_or(&1);
        let rows = act.len().checked_div(width).unwrap_or(0);
        let mut wide = Vec::new();
        let w = matrix(s3, l3, "w", &mut wide)?;
        let a = MatView::row_major(&act, rows, width);
        let mut out = crate::host_memory::zeros_touched(rows * w.rows, 0f32);
        gemm(self.numbers, a, w.t(), &mut out);
        let mut dims = l1.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = w.rows;
        }
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let product = |kind| Product::new(kind, self.numbers);
        let act = gate.apply_op2_no_bwd(up, &SwiGlu::PLAIN)?;
        let gw = match w.track_op() {
            true => Some(grad.apply_op2_no_bwd(&act, &product(Kind::GradWeight))?),
            false => None,
        };
        drop(act);
        if !(gate.track_op() || up.track_op()) {
            return Ok((None, None, gw));
        }
        let d_act = grad
            .apply_op2_no_bwd(w, &product(Kind::GradInput))?
            .reshape(gate.dims())?;
        let both = gate.apply_op3_no_bwd(up, &d_act, &SwiGluGrad)?;
        let shape = gate.shape();
        Ok((
            Some(both.get(0)?.reshape(shape)?),
            Some(both.get(1)?.reshape(shape)?),
            gw,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{bits, random_tensor};
    use crate::ops::{linear_bf16, linear_f32, swiglu};
    use candle_core::Var;

    /// Fused and composed give the same output and the same three gradients, bit for bit,
    /// in both precisions.
    #[test]
    fn fused_is_the_composed_blocks_bits() -> Result<()> {
        for bf16 in [false, true] {
            let g = Var::from_tensor(&(random_tensor(&[2, 9, 40], 1.0, 1)? * 4.0)?)?;
            let u = Var::from_tensor(&random_tensor(&[2, 9, 40], 1.0, 2)?)?;
            let w = Var::from_tensor(&random_tensor(&[24, 40], 0.2, 3)?)?;
            let probe = random_tensor(&[2, 9, 24], 1.0, 4)?;
            let (gt, ut, wt) = (g.as_tensor(), u.as_tensor(), w.as_tensor());
            let (fused, composed) = match bf16 {
                false => (
                    swiglu_linear_f32(gt, ut, wt)?,
                    linear_f32(&swiglu(gt, ut)?, wt)?,
                ),
                true => (
                    swiglu_linear_bf16(gt, ut, wt)?,
                    linear_bf16(&swiglu(gt, ut)?, wt)?,
                ),
            };
            assert_eq!(bits(&fused), bits(&composed), "forward (bf16 {bf16})");
            let gf = fused.mul(&probe)?.sum_all()?.backward()?;
            let gc = composed.mul(&probe)?.sum_all()?.backward()?;
            for (v, what) in [(&g, "d gate"), (&u, "d up"), (&w, "d w")] {
                let a = gf.get(v.as_tensor()).expect("fused grad");
                let b = gc.get(v.as_tensor()).expect("composed grad");
                assert_eq!(bits(a), bits(b), "{what} (bf16 {bf16})");
            }
        }
        Ok(())
    }

    #[test]
    fn a_frozen_weight_takes_no_gradient_and_bad_shapes_are_named() -> Result<()> {
        let g = Var::from_tensor(&random_tensor(&[3, 8], 1.0, 1)?)?;
        let u = random_tensor(&[3, 8], 1.0, 2)?;
        let w = random_tensor(&[5, 8], 1.0, 3)?;
        let y = swiglu_linear_f32(g.as_tensor(), &u, &w)?;
        let grads = y.sum_all()?.backward()?;
        assert!(grads.get(&w).is_none());
        assert!(grads.get(g.as_tensor()).is_some());
        let err = swiglu_linear_f32(g.as_tensor(), &u, &random_tensor(&[5, 7], 1.0, 3)?)
            .unwrap_err()
            .to_string();
        assert!(err.contains("must be [out, 8]"), "{err}");
        Ok(())
    }
}
