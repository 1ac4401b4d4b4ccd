//! Fused RMS normalisation `y = x / sqrt(mean(x^2) + eps) * weight` over the last dim, as a
//! differentiable candle `CustomOp2` with gradients for both `x` and `weight`.
//! Deliberately no bias and no "(1 + weight)" (Gemma) variant: Llama/Qwen2/Mistral only.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use multiversion::multiversion;
use rayon::prelude::*;

use super::cpu_math::{contiguous_slice, row_dot3, row_sum_sq, rows_per_task, Real};
use super::validate;

/// RMS-normalises `x` over its last dimension and scales by `weight`.
///
/// * `x`: `[..., D]`, f32 (f64 on CPU too).
/// * `weight`: `[D]`, same dtype.
/// * `eps`: added to the mean square before the square root (e.g. `1e-6`).
/// * returns `[..., D]`: `x_i * weight_i / sqrt(mean_j x_j^2 + eps)`.
///
/// Differentiable in `x` and `weight`. The weight gradient is summed over rows in a fixed
/// order, so it is bit-reproducible run to run regardless of the thread count.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    const OP: &str = "rms_norm";
    validate::float_dtype(OP, "x", x)?;
    validate::same_dtype(OP, "x", x, "weight", weight)?;
    validate::same_device(OP, x, "weight", weight)?;
    let Some(&d) = x.dims().last() else {
        candle_core::bail!("{OP}: `x` must be [..., D] (at least 1-D), got a scalar");
    };
    if weight.dims() != [d] {
        candle_core::bail!(
            "{OP}: `weight` must have shape [{d}] (the last dim of `x` {:?}), got {:?}",
            x.dims(),
            weight.dims()
        );
    }
    if d == 0 {
        candle_core::bail!(
            "{OP}: `x` has an empty last dimension, shape {:?}",
            x.dims()
        );
    }
    if !(eps >= 0.0 && eps.is_finite()) {
        candle_core::bail!("{OP}: `eps` must be finite and >= 0, got {eps}");
    }
    x.contiguous()?
        .apply_op2(&weight.contiguous()?, RmsNorm { eps })
}

/// Forward op: `(x [rows, D], weight [D]) -> y [rows, D]`.
struct RmsNorm {
    eps: f64,
}

/// Backward for `x`: `(x, weight, grad_y) -> grad_x [rows, D]`.
struct RmsNormGradX {
    eps: f64,
}

/// Backward for `weight`: `(x, grad_y) -> grad_w [D]`.
struct RmsNormGradW {
    eps: f64,
}

/// `1 / sqrt(mean(row^2) + eps)`.
#[inline]
fn inv_rms<T: Real>(row: &[T], eps: T) -> T {
    let ms = row_sum_sq(row) / T::from_usize(row.len());
    T::ONE / (ms + eps).sqrt()
}

fn fwd_rows<T: Real>(x: &[T], w: &[T], eps: f64) -> Vec<T> {
    let d = w.len();
    let eps = T::from_f64(eps);
    let mut out = vec![T::ZERO; x.len()];
    let per_task = rows_per_task(d);
    out.par_chunks_mut(per_task * d)
        .zip(x.par_chunks(per_task * d))
        .for_each(|(out, x)| fwd_task(out, x, w, eps));
    out
}

/// One task's rows of [`fwd_rows`]. The per-task bodies here are functions of their own,
/// multiversioned, not the closures rayon calls: a closure is compiled for the baseline CPU
/// (SSE2) whatever the function defining it is compiled for.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn fwd_task<T: Real>(out: &mut [T], x: &[T], w: &[T], eps: T) {
    let d = w.len();
    for (o, row) in out.chunks_mut(d).zip(x.chunks(d)) {
        let r = inv_rms(row, eps);
        for ((o, &xi), &wi) in o.iter_mut().zip(row).zip(w) {
            *o = xi * r * wi;
        }
    }
}

/// `dx_i = r w_i g_i - (r^3 / D) x_i sum_j g_j w_j x_j`.
fn bwd_x_rows<T: Real>(x: &[T], w: &[T], g: &[T], eps: f64) -> Vec<T> {
    let d = w.len();
    let eps = T::from_f64(eps);
    let inv_d = T::ONE / T::from_usize(d);
    let mut out = vec![T::ZERO; x.len()];
    let per_task = rows_per_task(d);
    out.par_chunks_mut(per_task * d)
        .zip(x.par_chunks(per_task * d))
        .zip(g.par_chunks(per_task * d))
        .for_each(|((out, x), g)| bwd_x_task(out, (x, g), w, (eps, inv_d)));
    out
}

/// One task's rows of [`bwd_x_rows`] (`inv_d`: `1 / D`).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn bwd_x_task<T: Real>(out: &mut [T], (x, g): (&[T], &[T]), w: &[T], (eps, inv_d): (T, T)) {
    let d = w.len();
    for ((o, xr), gr) in out.chunks_mut(d).zip(x.chunks(d)).zip(g.chunks(d)) {
        let r = inv_rms(xr, eps);
        let dot = row_dot3(gr, w, xr);
        let c = r * r * r * inv_d * dot;
        for (((o, &xi), &wi), &gi) in o.iter_mut().zip(xr).zip(w).zip(gr) {
            *o = r * wi * gi - c * xi;
        }
    }
}

/// One block's partial sums of [`bwd_w`].
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn bwd_w_task<T: Real>(x: &[T], g: &[T], d: usize, eps: T) -> Vec<T> {
    let mut acc = vec![T::ZERO; d];
    for (xr, gr) in x.chunks(d).zip(g.chunks(d)) {
        let r = inv_rms(xr, eps);
        for ((a, &xi), &gi) in acc.iter_mut().zip(xr).zip(gr) {
            *a += gi * xi * r;
        }
    }
    acc
}

/// `dw_i = sum_rows g_i x_i r`, summed per fixed row block, then over blocks in order.
fn bwd_w<T: Real>(x: &[T], g: &[T], d: usize, eps: f64) -> Vec<T> {
    let eps = T::from_f64(eps);
    let rows = x.len() / d;
    // Block size depends on the shape only (never on the thread count): reproducible sums.
    let n_blocks = rows.clamp(1, 64);
    let block = rows.div_ceil(n_blocks).max(1);
    let partials: Vec<Vec<T>> = x
        .par_chunks(block * d)
        .zip(g.par_chunks(block * d))
        .map(|(x, g)| bwd_w_task(x, g, d, eps))
        .collect();
    let mut dw = vec![T::ZERO; d];
    for p in &partials {
        for (a, &v) in dw.iter_mut().zip(p) {
            *a += v;
        }
    }
    dw
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "rms_norm";
        let out = match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(fwd_rows(
                contiguous_slice(s1, l1, OP, "x")?,
                contiguous_slice(s2, l2, OP, "weight")?,
                self.eps,
            )),
            (CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(fwd_rows(
                contiguous_slice(s1, l1, OP, "x")?,
                contiguous_slice(s2, l2, OP, "weight")?,
                self.eps,
            )),
            (a, _) => validate::unsupported_cpu_dtype(OP, a)?,
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
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = super::cuda_launch::rms_norm_fwd(s1, l1, s2, l2, self.eps)?;
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = grad_res.contiguous()?;
        let eps = self.eps;
        let dx = if x.track_op() {
            Some(x.apply_op3_no_bwd(weight, &g, &RmsNormGradX { eps })?)
        } else {
            None
        };
        let dw = if weight.track_op() {
            Some(x.apply_op2_no_bwd(&g, &RmsNormGradW { eps })?)
        } else {
            None
        };
        Ok((dx, dw))
    }
}

impl CustomOp3 for RmsNormGradX {
    fn name(&self) -> &'static str {
        "rms-norm-grad-x"
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
        const OP: &str = "rms_norm backward";
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(_), CpuStorage::F32(_), CpuStorage::F32(_)) => {
                CpuStorage::F32(bwd_x_rows(
                    contiguous_slice(s1, l1, OP, "x")?,
                    contiguous_slice(s2, l2, OP, "weight")?,
                    contiguous_slice(s3, l3, OP, "grad")?,
                    self.eps,
                ))
            }
            (CpuStorage::F64(_), CpuStorage::F64(_), CpuStorage::F64(_)) => {
                CpuStorage::F64(bwd_x_rows(
                    contiguous_slice(s1, l1, OP, "x")?,
                    contiguous_slice(s2, l2, OP, "weight")?,
                    contiguous_slice(s3, l3, OP, "grad")?,
                    self.eps,
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
        let out = super::cuda_launch::rms_norm_bwd_x(s1, l1, s2, l2, s3, l3, self.eps)?;
        Ok((out, l1.shape().clone()))
    }
}

impl CustomOp2 for RmsNormGradW {
    fn name(&self) -> &'static str {
        "rms-norm-grad-w"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "rms_norm backward";
        let d = l1.dims().last().copied().unwrap_or(1);
        let out = match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(bwd_w(
                contiguous_slice(s1, l1, OP, "x")?,
                contiguous_slice(s2, l2, OP, "grad")?,
                d,
                self.eps,
            )),
            (CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(bwd_w(
                contiguous_slice(s1, l1, OP, "x")?,
                contiguous_slice(s2, l2, OP, "grad")?,
                d,
                self.eps,
            )),
            (a, _) => validate::unsupported_cpu_dtype(OP, a)?,
        };
        Ok((out, Shape::from(d)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let d = l1.dims().last().copied().unwrap_or(1);
        let out = super::cuda_launch::rms_norm_bwd_w(s1, l1, s2, l2, self.eps)?;
        Ok((out, Shape::from(d)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::reference::rms_norm as rms_norm_composed;
    use crate::ops::testing::{assert_close, finite_difference_check, random_tensor};
    use candle_core::{DType, Var};

    #[test]
    fn forward_matches_composed() -> Result<()> {
        for dims in [&[2, 3, 16][..], &[1, 1, 7], &[5, 33], &[4, 2, 3, 8], &[9]] {
            let d = *dims.last().unwrap();
            let x = random_tensor(dims, 2.0, d as u64)?;
            let w = random_tensor(&[d], 1.0, 99)?;
            let fused = rms_norm(&x, &w, 1e-6)?;
            assert_close(
                &fused,
                &rms_norm_composed(&x, &w, 1e-6)?,
                1e-5,
                "rms_norm fwd",
            )?;
            // candle_nn's (non-differentiable) fused op agrees too.
            let nn = candle_nn::ops::rms_norm(&x, &w, 1e-6)?;
            assert_close(&fused, &nn, 1e-5, "rms_norm vs candle_nn")?;
        }
        Ok(())
    }

    #[test]
    fn forward_handles_non_contiguous() -> Result<()> {
        let x = random_tensor(&[10, 3], 2.0, 1)?.t()?;
        assert!(!x.is_contiguous());
        let w = random_tensor(&[10], 1.0, 2)?;
        assert_close(
            &rms_norm(&x, &w, 1e-5)?,
            &rms_norm_composed(&x, &w, 1e-5)?,
            1e-5,
            "non-contig",
        )
    }

    #[test]
    fn backward_matches_composed_autograd() -> Result<()> {
        let x = Var::from_tensor(&random_tensor(&[3, 4, 19], 2.0, 3)?)?;
        let w = Var::from_tensor(&random_tensor(&[19], 1.0, 4)?)?;
        let proj = random_tensor(&[3, 4, 19], 1.0, 5)?;
        let loss = |f: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>| -> Result<_> {
            f(x.as_tensor(), w.as_tensor())?
                .mul(&proj)?
                .sum_all()?
                .backward()
        };
        let gf = loss(&|x, w| rms_norm(x, w, 1e-5))?;
        let gc = loss(&|x, w| rms_norm_composed(x, w, 1e-5))?;
        for (name, t) in [("x", x.as_tensor()), ("weight", w.as_tensor())] {
            let a = gf.get(t).expect("fused grad");
            let c = gc.get(t).expect("composed grad");
            assert_close(a, c, 1e-5, name)?;
        }
        Ok(())
    }

    #[test]
    fn backward_matches_finite_differences() -> Result<()> {
        let x = random_tensor(&[3, 6], 1.5, 6)?.to_dtype(DType::F64)?;
        let w = random_tensor(&[6], 1.0, 7)?.to_dtype(DType::F64)?;
        let proj = random_tensor(&[3, 6], 1.0, 8)?.to_dtype(DType::F64)?;
        finite_difference_check(&x, |x| rms_norm(x, &w, 1e-6)?.mul(&proj)?.sum_all(), 1e-6)?;
        finite_difference_check(&w, |w| rms_norm(&x, w, 1e-6)?.mul(&proj)?.sum_all(), 1e-6)
    }

    #[test]
    fn frozen_weight_gets_no_gradient_and_bad_shapes_fail() -> Result<()> {
        let x = Var::from_tensor(&random_tensor(&[2, 5], 1.0, 9)?)?;
        let w = random_tensor(&[5], 1.0, 10)?;
        let grads = rms_norm(x.as_tensor(), &w, 1e-6)?.sum_all()?.backward()?;
        assert!(grads.get(x.as_tensor()).is_some());
        assert!(grads.get(&w).is_none());
        let err = rms_norm(x.as_tensor(), &random_tensor(&[4], 1.0, 1)?, 1e-6).unwrap_err();
        assert!(
            err.to_string().contains("`weight` must have shape [5]"),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn weight_gradient_is_reproducible() -> Result<()> {
        let x = random_tensor(&[300, 24], 2.0, 11)?;
        let g = random_tensor(&[300, 24], 1.0, 12)?;
        let a = x.apply_op2_no_bwd(&g, &RmsNormGradW { eps: 1e-6 })?;
        for _ in 0..3 {
            let b = x.apply_op2_no_bwd(&g, &RmsNormGradW { eps: 1e-6 })?;
            assert_eq!(a.to_vec1::<f32>()?, b.to_vec1::<f32>()?);
        }
        Ok(())
    }
}
