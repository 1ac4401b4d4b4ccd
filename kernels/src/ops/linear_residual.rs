//! A linear layer whose output is added to the residual stream, as one op:
//! `residual + x · Wᵀ` (a decoder layer's attention output projection). Composed, the add's
//! graph node keeps the product `[.., out]` alive until the backward, though an add needs no
//! values for its gradient; here only the sum exists. The products are `linear.rs`'s (f32, or
//! bf16 with f32 sums), so the result is bit-identical to the composed `residual + linear`.

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::cpu_math::contiguous_slice;
use super::linear::{bf16_path, gradients, Kind, Product};
use super::validate;
use crate::matmul::Numbers;

const OP: &str = "linear_residual";

/// `residual + x · Wᵀ` in f32: `x` `[.., in]`, `w` `[out, in]`, `residual` `[.., out]`, all
/// f32 on the CPU (the caller composes elsewhere). Differentiable in all three.
pub fn linear_residual_f32(x: &Tensor, w: &Tensor, residual: &Tensor) -> Result<Tensor> {
    residual_op(Numbers::F32, x, w, residual)
}

/// [`linear_residual_f32`] with the product in bf16 mixed precision (as
/// [`super::linear_bf16`]); the sum with the residual stays f32.
pub fn linear_residual_bf16(x: &Tensor, w: &Tensor, residual: &Tensor) -> Result<Tensor> {
    residual_op(Numbers::Bf16(bf16_path()), x, w, residual)
}

fn residual_op(numbers: Numbers, x: &Tensor, w: &Tensor, residual: &Tensor) -> Result<Tensor> {
    validate::same_device(OP, x, "w", w)?;
    validate::same_device(OP, x, "residual", residual)?;
    if !x.device().is_cpu() || [x.dtype(), w.dtype(), residual.dtype()] != [DType::F32; 3] {
        candle_core::bail!("{OP}: f32 tensors on the CPU only");
    }
    let (out, inp) = w.dims2()?;
    let mut want = x.dims().to_vec();
    match want.last_mut() {
        Some(last) if *last == inp => *last = out,
        _ => candle_core::bail!("{OP}: input {:?} against weight {:?}", x.dims(), w.dims()),
    }
    if residual.dims() != want {
        candle_core::bail!(
            "{OP}: `residual` must be {want:?}, got {:?}",
            residual.dims()
        );
    }
    let op = ResidualProduct { numbers };
    x.contiguous()?
        .apply_op3(&w.contiguous()?, &residual.contiguous()?, op)
}

struct ResidualProduct {
    numbers: Numbers,
}

impl CustomOp3 for ResidualProduct {
    fn name(&self) -> &'static str {
        "linear-residual"
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
        let forward = Product::new(Kind::Forward, self.numbers);
        let (mut out, _) = forward.compute((s1, l1), (s2, l2))?;
        let residual = contiguous_slice::<f32>(s3, l3, OP, "residual")?;
        out.par_iter_mut()
            .zip(residual.par_iter())
            .for_each(|(o, r)| *o += *r);
        Ok((CpuStorage::F32(out), l3.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        residual: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let (gx, gw) = gradients(self.numbers, x, w, &grad)?;
        Ok((gx, gw, residual.track_op().then_some(grad)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{assert_close, random_tensor};
    use crate::ops::{linear_bf16, linear_f32};
    use candle_core::Var;

    /// Output and the three gradients are bit-identical to `residual + linear(x, w)` composed,
    /// in f32 and in bf16 mixed precision.
    #[test]
    fn fused_equals_the_composed_add_bit_for_bit() -> Result<()> {
        let x = Var::from_tensor(&random_tensor(&[2, 5, 24], 1.0, 1)?)?;
        let w = Var::from_tensor(&random_tensor(&[16, 24], 0.3, 2)?)?;
        let r = Var::from_tensor(&random_tensor(&[2, 5, 16], 1.0, 3)?)?;
        let probe = random_tensor(&[2, 5, 16], 1.0, 4)?;
        type Fused = fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;
        type Plain = fn(&Tensor, &Tensor) -> Result<Tensor>;
        let pairs: [(Fused, Plain, &str); 2] = [
            (linear_residual_f32, linear_f32, "f32"),
            (linear_residual_bf16, linear_bf16, "bf16"),
        ];
        for (fused, plain, what) in pairs {
            let (xt, wt, rt) = (x.as_tensor(), w.as_tensor(), r.as_tensor());
            let ours = fused(xt, wt, rt)?;
            let theirs = (rt + plain(xt, wt)?)?;
            assert_close(&ours, &theirs, 0.0, what)?;
            let g_ours = (ours * &probe)?.sqr()?.sum_all()?.backward()?;
            let g_theirs = (theirs * &probe)?.sqr()?.sum_all()?.backward()?;
            for (v, name) in [(&x, "dx"), (&w, "dw"), (&r, "dresidual")] {
                let a = g_ours.get(v.as_tensor()).expect("fused gradient");
                let b = g_theirs.get(v.as_tensor()).expect("composed gradient");
                assert_close(a, b, 0.0, &format!("{what} {name}"))?;
            }
        }
        Ok(())
    }

    /// Mismatched shapes are errors that name the argument.
    #[test]
    fn a_residual_of_the_wrong_shape_is_an_error() -> Result<()> {
        let x = random_tensor(&[3, 8], 1.0, 5)?;
        let w = random_tensor(&[4, 8], 1.0, 6)?;
        let r = random_tensor(&[3, 5], 1.0, 7)?;
        let err = linear_residual_f32(&x, &w, &r).unwrap_err().to_string();
        assert!(err.contains("`residual` must be [3, 4]"), "{err}");
        Ok(())
    }
}
