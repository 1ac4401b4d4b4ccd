//! A query or key projection with its rotary embedding, as one op: `x · Wᵀ` split into heads
//! and rotated, `[B, T, in]` -> `[B, heads, T, D]` (attention's layout). Composed, the
//! projection's output `[B, T, heads · D]` stays alive until the backward because the
//! rotation's graph node holds it, though a rotation's gradient needs no values; here only
//! the rotated heads exist. The product is `linear.rs`'s (f32, or bf16 with f32 sums) and
//! the rotation `rope.rs`'s, so the result is bit-identical to the composed
//! `rope(linear(x, w).reshape(..).transpose(1, 2))`.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

use super::linear::{bf16_path, gradients, Kind, Product};
use super::rope::{rotate, rotate_back, tables, RowStrides};
use super::validate;
use crate::matmul::Numbers;

const OP: &str = "linear_rope";

/// `rope(x · Wᵀ)` in f32: `x` `[B, T, in]`, `w` `[heads · D, in]`, `cos`/`sin` as
/// [`super::rope`] takes them -> `[B, heads, T, D]`. f32 tensors on the CPU (the caller
/// composes elsewhere); differentiable in `x` and `w`.
pub fn linear_rope_f32(
    x: &Tensor,
    w: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    heads: usize,
) -> Result<Tensor> {
    rotated_op(Numbers::F32, x, w, (cos, sin), heads)
}

/// [`linear_rope_f32`] with the product in bf16 mixed precision (as
/// [`super::linear_bf16`]); the rotation stays f32.
pub fn linear_rope_bf16(
    x: &Tensor,
    w: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    heads: usize,
) -> Result<Tensor> {
    rotated_op(Numbers::Bf16(bf16_path()), x, w, (cos, sin), heads)
}

fn rotated_op(
    numbers: Numbers,
    x: &Tensor,
    w: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    heads: usize,
) -> Result<Tensor> {
    validate::same_device(OP, x, "w", w)?;
    let f32s = [x.dtype(), w.dtype(), cos.dtype(), sin.dtype()] == [DType::F32; 4];
    if !x.device().is_cpu() || !f32s {
        candle_core::bail!("{OP}: f32 tensors on the CPU only");
    }
    let (b, t, inp) = x.dims3()?;
    let (out, w_in) = w.dims2()?;
    if w_in != inp || heads == 0 || out % heads != 0 {
        candle_core::bail!(
            "{OP}: weight {:?} against input {:?} in {heads} heads",
            w.dims(),
            x.dims()
        );
    }
    let d = out / heads;
    let (cos, sin) = tables(OP, (b, t, d), cos, sin)?;
    let op = RotatedProduct {
        numbers,
        dims: (b, heads, t, d),
        cos: cos.contiguous()?,
        sin: sin.contiguous()?,
    };
    x.contiguous()?.apply_op2(&w.contiguous()?, op)
}

struct RotatedProduct {
    numbers: Numbers,
    /// `(B, heads, T, D)` of the output.
    dims: (usize, usize, usize, usize),
    cos: Tensor,
    sin: Tensor,
}

impl CustomOp2 for RotatedProduct {
    fn name(&self) -> &'static str {
        "linear-rope"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (y, _) = Product::new(Kind::Forward, self.numbers).compute((s1, l1), (s2, l2))?;
        let (b, heads, t, d) = self.dims;
        let (cos, sin) = (
            self.cos.flatten_all()?.to_vec1::<f32>()?,
            self.sin.flatten_all()?.to_vec1::<f32>()?,
        );
        let per_batch = self.cos.rank() == 3;
        let strides = RowStrides::transposed_heads(t, heads, d);
        let out = rotate((&y, strides), &cos, &sin, self.dims, per_batch, false);
        Ok((CpuStorage::F32(out), Shape::from((b, heads, t, d))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (b, heads, t, d) = self.dims;
        let dy = rotate_back(grad, &self.cos, &self.sin)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b * t, heads * d))?;
        gradients(self.numbers, x, w, &dy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{assert_close, random_tensor};
    use crate::ops::{linear_bf16, linear_f32, rope};
    use candle_core::Var;

    type Fused = fn(&Tensor, &Tensor, (&Tensor, &Tensor), usize) -> Result<Tensor>;
    type Plain = fn(&Tensor, &Tensor) -> Result<Tensor>;

    /// Output and both gradients are bit-identical to the composed projection, head split,
    /// transpose and rotation, in f32 and bf16 mixed precision, with shared (longer) and
    /// per-row tables.
    #[test]
    fn fused_equals_the_composed_rotation_bit_for_bit() -> Result<()> {
        let (b, t, inp, heads, d) = (2, 5, 24, 3, 8);
        let x = Var::from_tensor(&random_tensor(&[b, t, inp], 1.0, 1)?)?;
        let w = Var::from_tensor(&random_tensor(&[heads * d, inp], 0.3, 2)?)?;
        let probe = random_tensor(&[b, heads, t, d], 1.0, 3)?;
        let theta = random_tensor(&[9, d / 2], 3.0, 4)?;
        let per_row = random_tensor(&[b, t, d / 2], 3.0, 5)?;
        let pairs: [(Fused, Plain, &str); 2] = [
            (linear_rope_f32, linear_f32, "f32"),
            (linear_rope_bf16, linear_bf16, "bf16"),
        ];
        for (fused, plain, what) in pairs {
            for table in [&theta, &per_row] {
                let (cos, sin) = (table.cos()?, table.sin()?);
                let (xt, wt) = (x.as_tensor(), w.as_tensor());
                let ours = fused(xt, wt, (&cos, &sin), heads)?;
                let split = plain(xt, wt)?.reshape((b, t, heads, d))?.transpose(1, 2)?;
                let theirs = rope(&split.contiguous()?, &cos, &sin)?;
                assert_close(&ours, &theirs, 0.0, what)?;
                let g_ours = (ours * &probe)?.sqr()?.sum_all()?.backward()?;
                let g_theirs = (theirs * &probe)?.sqr()?.sum_all()?.backward()?;
                for (v, name) in [(&x, "dx"), (&w, "dw")] {
                    let a = g_ours.get(v.as_tensor()).expect("fused gradient");
                    let b = g_theirs.get(v.as_tensor()).expect("composed gradient");
                    assert_close(a, b, 0.0, &format!("{what} {name}"))?;
                }
            }
        }
        Ok(())
    }

    /// A weight that does not split into the heads is an error naming the shapes.
    #[test]
    fn a_weight_that_does_not_split_into_heads_is_an_error() -> Result<()> {
        let x = random_tensor(&[1, 2, 8], 1.0, 6)?;
        let w = random_tensor(&[10, 8], 1.0, 7)?;
        let theta = random_tensor(&[2, 2], 1.0, 8)?;
        let err = linear_rope_f32(&x, &w, (&theta.cos()?, &theta.sin()?), 3)
            .unwrap_err()
            .to_string();
        assert!(err.contains("in 3 heads"), "{err}");
        Ok(())
    }
}
