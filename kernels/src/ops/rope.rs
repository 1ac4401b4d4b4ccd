//! Fused rotary position embedding in the HF "rotate_half" (non-interleaved) layout, the same
//! maths as `candle_nn::rotary_emb::rope`, as a differentiable candle `CustomOp3`.
//! Gradients flow to `x` only; the cos/sin tables are constants (no learned frequencies).

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use multiversion::multiversion;
use rayon::prelude::*;

use super::cpu_math::{contiguous_slice, Real};
use super::validate;

/// Rotates `x` by the per-position angles whose cosines/sines are given.
///
/// * `x`: `[B, H, T, D]` (D even), f32 (f64 on CPU too); on the CPU read in place when its
///   last dim is contiguous (a transposed `[B, T, H, D]`, as attention has it), the output
///   always contiguous.
/// * `cos`, `sin`: `[T', D/2]` shared by all rows (a table with `T' >= T` is cut to its first
///   `T` positions), or `[B, T, D/2]` per batch row (left-padded batches whose position ids
///   come from the attention mask). Same dtype as `x`.
/// * returns `[B, H, T, D]` with, for `i < D/2`,
///   `y_i = x_i cos_i - x_{i+D/2} sin_i` and `y_{i+D/2} = x_i sin_i + x_{i+D/2} cos_i`.
///
/// Differentiable in `x` (the backward pass rotates the gradient by the opposite angle);
/// `cos`/`sin` receive no gradient.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    const OP: &str = "rope";
    validate::float_dtype(OP, "x", x)?;
    validate::same_dtype(OP, "x", x, "cos", cos)?;
    validate::same_dtype(OP, "x", x, "sin", sin)?;
    validate::same_device(OP, x, "cos", cos)?;
    validate::same_device(OP, x, "sin", sin)?;
    let &[b, _h, t, d] = x.dims() else {
        candle_core::bail!("{OP}: `x` must be [B, H, T, D], got {:?}", x.dims());
    };
    let (cos, sin) = tables(OP, (b, t, d), cos, sin)?;
    // The CPU kernel reads any layout whose last dim is contiguous (a transposed view).
    let x = match x.device().is_cpu() && x.stride().last() == Some(&1) {
        true => x.clone(),
        false => x.contiguous()?,
    };
    x.apply_op3(
        &cos.contiguous()?,
        &sin.contiguous()?,
        Rope { inverse: false },
    )
}

/// `cos`/`sin` cut to the `t` positions of an `x` of batch `b` and head dim `d` (even): a
/// shared table `[T' >= t, d/2]` or per-row tables `[b, t, d/2]`; errors name `op`.
pub(super) fn tables(
    op: &str,
    (b, t, d): (usize, usize, usize),
    cos: &Tensor,
    sin: &Tensor,
) -> Result<(Tensor, Tensor)> {
    if d % 2 != 0 {
        candle_core::bail!("{op}: the head dim D must be even, got {d}");
    }
    if cos.dims() != sin.dims() {
        candle_core::bail!(
            "{op}: `cos` and `sin` must have the same shape, got {:?} and {:?}",
            cos.dims(),
            sin.dims()
        );
    }
    match *cos.dims() {
        [tc, half] if half * 2 == d && tc >= t => Ok((cos.narrow(0, 0, t)?, sin.narrow(0, 0, t)?)),
        [bc, tc, half] if bc == b && tc == t && half * 2 == d => Ok((cos.clone(), sin.clone())),
        _ => candle_core::bail!(
            "{op}: `cos`/`sin` must be [T'>={t}, {}] or [{b}, {t}, {}], got {:?}",
            d / 2,
            d / 2,
            cos.dims()
        ),
    }
}

/// `grad` `[B, H, T, D]` rotated back by the angles of `cos`/`sin` (as [`tables`] returns
/// them): the backward of a rotation.
pub(super) fn rotate_back(grad: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    grad.contiguous()?.apply_op3_no_bwd(
        &cos.contiguous()?,
        &sin.contiguous()?,
        &Rope { inverse: true },
    )
}

/// `(x [B,H,T,D], cos, sin) -> [B,H,T,D]`; `inverse` rotates by `-theta` (the backward).
struct Rope {
    inverse: bool,
}

/// Where `x`'s rows live: the element strides of its batch, head and position dims (its
/// last dim is contiguous). A transposed `[B, T, H, D]` view is read in place, so the
/// attention's projections need no contiguous copy before RoPE.
#[derive(Clone, Copy)]
pub(super) struct RowStrides {
    batch: usize,
    head: usize,
    pos: usize,
}

impl RowStrides {
    /// A `[B, T, heads, D]` buffer read as `[B, heads, T, D]`.
    pub(super) fn transposed_heads(t: usize, heads: usize, d: usize) -> RowStrides {
        RowStrides {
            batch: t * heads * d,
            head: d,
            pos: heads * d,
        }
    }

    /// The strides of `layout` when its last dim is contiguous.
    fn of(layout: &Layout) -> Option<RowStrides> {
        match *layout.stride() {
            [batch, head, pos, 1] => Some(RowStrides { batch, head, pos }),
            _ => None,
        }
    }
}

#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
pub(super) fn rotate<T: Real>(
    (x, at): (&[T], RowStrides),
    cos: &[T],
    sin: &[T],
    (b, h, t, d): (usize, usize, usize, usize),
    per_batch: bool,
    inverse: bool,
) -> Vec<T> {
    let half = d / 2;
    let mut out = vec![T::ZERO; b * h * t * d];
    out.par_chunks_mut(t * d).enumerate().for_each(|(bh, out)| {
        let cs_base = if per_batch { (bh / h) * t * half } else { 0 };
        let base = (bh / h) * at.batch + (bh % h) * at.head;
        for ti in 0..t {
            let cs = cs_base + ti * half;
            let (c, s) = (&cos[cs..cs + half], &sin[cs..cs + half]);
            let start = base + ti * at.pos;
            let (x1, x2) = x[start..start + d].split_at(half);
            let (o1, o2) = out[ti * d..(ti + 1) * d].split_at_mut(half);
            if inverse {
                for i in 0..half {
                    o1[i] = x1[i] * c[i] + x2[i] * s[i];
                    o2[i] = x2[i] * c[i] - x1[i] * s[i];
                }
            } else {
                for i in 0..half {
                    o1[i] = x1[i] * c[i] - x2[i] * s[i];
                    o2[i] = x1[i] * s[i] + x2[i] * c[i];
                }
            }
        }
    });
    out
}

/// `x`'s elements from its layout's start and its row strides: in place when its last dim
/// is contiguous (any strides elsewhere), else an error (the wrapper makes it contiguous).
fn strided_rows<'a, T: candle_core::WithDType>(
    storage: &'a CpuStorage,
    layout: &Layout,
) -> Result<(&'a [T], RowStrides)> {
    let data = T::cpu_storage_as_slice(storage)?;
    let Some(strides) = RowStrides::of(layout) else {
        candle_core::bail!("rope: `x` must have a contiguous last dim, got layout {layout:?}");
    };
    Ok((&data[layout.start_offset()..], strides))
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        if self.inverse {
            "rope-grad"
        } else {
            "rope"
        }
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
        const OP: &str = "rope";
        let dims = l1.shape().dims4()?;
        let per_batch = l2.dims().len() == 3;
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(_), CpuStorage::F32(_), CpuStorage::F32(_)) => {
                CpuStorage::F32(rotate(
                    strided_rows(s1, l1)?,
                    contiguous_slice(s2, l2, OP, "cos")?,
                    contiguous_slice(s3, l3, OP, "sin")?,
                    dims,
                    per_batch,
                    self.inverse,
                ))
            }
            (CpuStorage::F64(_), CpuStorage::F64(_), CpuStorage::F64(_)) => {
                CpuStorage::F64(rotate(
                    strided_rows(s1, l1)?,
                    contiguous_slice(s2, l2, OP, "cos")?,
                    contiguous_slice(s3, l3, OP, "sin")?,
                    dims,
                    per_batch,
                    self.inverse,
                ))
            }
            (a, _, _) => validate::unsupported_cpu_dtype(OP, a)?,
        };
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = super::cuda_launch::rope(s1, l1, s2, l2, s3, l3, self.inverse)?;
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // The inverse rotation runs only as this backward (never differentiated itself).
        let dx = rotate_back(grad_res, cos, sin)?;
        Ok((Some(dx), None, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::reference::rope as rope_composed;
    use crate::ops::testing::{assert_close, finite_difference_check, random_tensor};
    use candle_core::{DType, Var};

    fn tables(dims: &[usize], seed: u64) -> Result<(Tensor, Tensor)> {
        let theta = random_tensor(dims, 3.0, seed)?;
        Ok((theta.cos()?, theta.sin()?))
    }

    #[test]
    fn forward_matches_candle_nn_and_composed() -> Result<()> {
        for &(b, h, t, d) in &[(2, 3, 5, 8), (1, 1, 1, 2), (2, 2, 7, 6), (1, 4, 3, 64)] {
            let x = random_tensor(&[b, h, t, d], 1.0, (t * d) as u64)?;
            let (cos, sin) = tables(&[t, d / 2], 1)?;
            let fused = rope(&x, &cos, &sin)?;
            assert_close(
                &fused,
                &candle_nn::rotary_emb::rope(&x, &cos, &sin)?,
                1e-6,
                "nn",
            )?;
            assert_close(&fused, &rope_composed(&x, &cos, &sin)?, 1e-6, "composed")?;
            // Per-batch tables.
            let (cos_b, sin_b) = tables(&[b, t, d / 2], 2)?;
            let fused = rope(&x, &cos_b, &sin_b)?;
            let nn = candle_nn::rotary_emb::rope(&x, &cos_b, &sin_b)?;
            assert_close(&fused, &nn, 1e-6, "nn per-batch")?;
            assert_close(
                &fused,
                &rope_composed(&x, &cos_b, &sin_b)?,
                1e-6,
                "per-batch",
            )?;
        }
        Ok(())
    }

    #[test]
    fn longer_tables_and_non_contiguous_inputs() -> Result<()> {
        // x as [B, T, H, D] transposed to [B, H, T, D] (the usual attention layout).
        let x = random_tensor(&[2, 5, 3, 8], 1.0, 3)?.transpose(1, 2)?;
        assert!(!x.is_contiguous());
        let (cos, sin) = tables(&[11, 4], 4)?;
        let fused = rope(&x, &cos, &sin)?;
        let want = rope_composed(&x, &cos.narrow(0, 0, 5)?, &sin.narrow(0, 0, 5)?)?;
        assert_close(&fused, &want, 1e-6, "table cut + non-contiguous")
    }

    #[test]
    fn backward_matches_composed_autograd() -> Result<()> {
        let x = Var::from_tensor(&random_tensor(&[2, 2, 4, 6], 1.0, 5)?)?;
        let (cos, sin) = tables(&[2, 4, 3], 6)?;
        let proj = random_tensor(&[2, 2, 4, 6], 1.0, 7)?;
        let gf = rope(x.as_tensor(), &cos, &sin)?
            .mul(&proj)?
            .sum_all()?
            .backward()?;
        let gc = rope_composed(x.as_tensor(), &cos, &sin)?
            .mul(&proj)?
            .sum_all()?
            .backward()?;
        let a = gf.get(x.as_tensor()).expect("fused grad");
        let c = gc.get(x.as_tensor()).expect("composed grad");
        assert_close(a, c, 1e-6, "rope grad")?;
        assert!(gf.get(&cos).is_none() && gf.get(&sin).is_none());
        Ok(())
    }

    #[test]
    fn backward_matches_finite_differences() -> Result<()> {
        let x = random_tensor(&[1, 2, 3, 4], 1.0, 8)?.to_dtype(DType::F64)?;
        let (cos, sin) = tables(&[3, 2], 9)?;
        let (cos, sin) = (cos.to_dtype(DType::F64)?, sin.to_dtype(DType::F64)?);
        let proj = random_tensor(&[1, 2, 3, 4], 1.0, 10)?.to_dtype(DType::F64)?;
        // Square the output so the loss is not linear in x.
        finite_difference_check(
            &x,
            |x| rope(x, &cos, &sin)?.mul(&proj)?.sqr()?.sum_all(),
            1e-6,
        )
    }

    #[test]
    fn bad_shapes_fail_with_clear_messages() -> Result<()> {
        let x = random_tensor(&[1, 2, 3, 4], 1.0, 1)?;
        let (cos, sin) = tables(&[2, 2], 2)?;
        let err = rope(&x, &cos, &sin).unwrap_err().to_string();
        assert!(err.contains("`cos`/`sin` must be [T'>=3, 2]"), "{err}");
        let odd = random_tensor(&[1, 1, 2, 3], 1.0, 1)?;
        let err = rope(&odd, &cos, &sin).unwrap_err().to_string();
        assert!(err.contains("must be even"), "{err}");
        Ok(())
    }
}
