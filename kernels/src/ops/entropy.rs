//! Fused entropy of `softmax(logits)` per position, `H = logsumexp(z) - sum_v p_v z_v`, as a
//! differentiable candle `CustomOp1` that never materialises `p` in the forward pass.
//! No masking or averaging here: callers reduce the `[B, T]` result themselves.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::cpu_math::{contiguous_slice, row_exp_sums, row_max, rows_per_task, Real};
use super::validate;

/// Entropy (nats) of the categorical distribution `softmax(logits)` at each position.
///
/// * `logits`: `[B, T, V]` (any leading dims `[..., V]`), f32 (f64 on CPU too).
/// * returns `[B, T]` (the leading dims), same dtype, `H >= 0`, at most `ln V`.
///
/// Differentiable: `dH/dz_v = -p_v (z_v - sum_u p_u z_u) = -p_v (ln p_v + H)`.
/// Non-contiguous inputs are copied to contiguous ones first.
pub fn entropy(logits: &Tensor) -> Result<Tensor> {
    const OP: &str = "entropy";
    validate::float_dtype(OP, "logits", logits)?;
    match logits.dims().last() {
        None => candle_core::bail!("{OP}: `logits` must be [B, T, V] (at least 1-D), got a scalar"),
        Some(0) => candle_core::bail!(
            "{OP}: `logits` has an empty vocabulary dimension, shape {:?}",
            logits.dims()
        ),
        Some(_) => {}
    }
    logits.contiguous()?.apply_op1(Entropy)
}

/// Forward op: `logits [rows, V] -> [rows]`.
struct Entropy;

/// Backward op: `(logits [rows, V], grad [rows]) -> grad_logits [rows, V]`.
struct EntropyGrad;

/// Per row: max `m`, `s = sum e^(z-m)`, `w = sum e^(z-m) (z-m)`; `H = ln s - w / s`.
fn fwd_rows<T: Real>(logits: &[T], vocab: usize) -> Vec<T> {
    let rows = logits.len() / vocab;
    let mut out = vec![T::ZERO; rows];
    let per_task = rows_per_task(vocab);
    out.par_chunks_mut(per_task)
        .zip(logits.par_chunks(per_task * vocab))
        .for_each(|(out, logits)| {
            for (o, row) in out.iter_mut().zip(logits.chunks(vocab)) {
                let m = row_max(row);
                let (s, w) = row_exp_sums(row, m, true);
                *o = s.ln() - w / s;
            }
        });
    out
}

/// `grad_z_v = -g p_v ((z_v - m) - w / s)`, recomputing the row statistics.
fn bwd_rows<T: Real>(logits: &[T], grad: &[T], vocab: usize) -> Vec<T> {
    let mut out = vec![T::ZERO; logits.len()];
    let per_task = rows_per_task(vocab);
    out.par_chunks_mut(per_task * vocab)
        .zip(logits.par_chunks(per_task * vocab))
        .zip(grad.par_chunks(per_task))
        .for_each(|((out, logits), grad)| {
            for ((o, z), &g) in out.chunks_mut(vocab).zip(logits.chunks(vocab)).zip(grad) {
                if g == T::ZERO {
                    continue;
                }
                let m = row_max(z);
                let (s, w) = row_exp_sums(z, m, true);
                let mean_shifted = w / s;
                let scale = -g / s;
                for (o, &zv) in o.iter_mut().zip(z) {
                    let d = zv - m;
                    *o = scale * d.exp() * (d - mean_shifted);
                }
            }
        });
    out
}

impl CustomOp1 for Entropy {
    fn name(&self) -> &'static str {
        "entropy"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = l.dims();
        let vocab = dims.last().copied().unwrap_or(1);
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(fwd_rows(
                contiguous_slice(s, l, "entropy", "logits")?,
                vocab,
            )),
            CpuStorage::F64(_) => CpuStorage::F64(fwd_rows(
                contiguous_slice(s, l, "entropy", "logits")?,
                vocab,
            )),
            other => validate::unsupported_cpu_dtype("entropy", other)?,
        };
        Ok((out, Shape::from(&dims[..dims.len() - 1])))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let dims = l.dims();
        let vocab = dims.last().copied().unwrap_or(1);
        let out = super::cuda_launch::softmax_rows_fwd("entropy_fwd_f32", s, l, None, vocab)?;
        Ok((out, Shape::from(&dims[..dims.len() - 1])))
    }

    fn bwd(&self, logits: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad_res.contiguous()?;
        Ok(Some(logits.apply_op2_no_bwd(&grad, &EntropyGrad)?))
    }
}

impl CustomOp2 for EntropyGrad {
    fn name(&self) -> &'static str {
        "entropy-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "entropy backward";
        let vocab = l1.dims().last().copied().unwrap_or(1);
        let out = match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(bwd_rows(
                contiguous_slice(s1, l1, OP, "logits")?,
                contiguous_slice(s2, l2, OP, "grad")?,
                vocab,
            )),
            (CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(bwd_rows(
                contiguous_slice(s1, l1, OP, "logits")?,
                contiguous_slice(s2, l2, OP, "grad")?,
                vocab,
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
        let vocab = l1.dims().last().copied().unwrap_or(1);
        let out =
            super::cuda_launch::softmax_rows_bwd("entropy_bwd_f32", s1, l1, None, s2, l2, vocab)?;
        Ok((out, l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::reference::entropy as entropy_composed;
    use crate::ops::testing::{assert_close, finite_difference_check, random_tensor};
    use candle_core::{DType, Device, Var};

    #[test]
    fn forward_matches_composed() -> Result<()> {
        for &(b, t, v) in &[(2, 5, 37), (1, 1, 1), (3, 1, 9), (2, 4, 64), (1, 3, 1000)] {
            let logits = random_tensor(&[b, t, v], 4.0, 5 + v as u64)?;
            let fused = entropy(&logits)?;
            assert_eq!(fused.dims(), &[b, t]);
            assert_close(&fused, &entropy_composed(&logits)?, 1e-5, "entropy forward")?;
            // Bounds: 0 <= H <= ln V.
            let h = fused.flatten_all()?.to_vec1::<f32>()?;
            let ln_v = (v as f32).ln();
            assert!(h.iter().all(|&x| x >= -1e-6 && x <= ln_v + 1e-5), "{h:?}");
        }
        Ok(())
    }

    #[test]
    fn uniform_logits_have_entropy_ln_v() -> Result<()> {
        let logits = Tensor::full(3.5f32, (2, 1, 100), &Device::Cpu)?;
        let h = entropy(&logits)?.flatten_all()?.to_vec1::<f32>()?;
        for x in h {
            assert!((x - 100f32.ln()).abs() < 1e-5, "{x}");
        }
        // A near one-hot distribution has entropy close to 0, not NaN.
        let mut row = vec![-1.0e4f32; 17];
        row[3] = 1.0e4;
        let h = entropy(&Tensor::from_vec(row, (1, 1, 17), &Device::Cpu)?)?;
        assert!(h.flatten_all()?.to_vec1::<f32>()?[0].abs() < 1e-6);
        Ok(())
    }

    #[test]
    fn forward_handles_non_contiguous() -> Result<()> {
        let base = random_tensor(&[21, 3, 2], 3.0, 30)?;
        let logits = base.permute((2, 1, 0))?;
        assert!(!logits.is_contiguous());
        assert_close(
            &entropy(&logits)?,
            &entropy_composed(&logits)?,
            1e-5,
            "non-contig",
        )
    }

    #[test]
    fn backward_matches_composed_autograd() -> Result<()> {
        let x = Var::from_tensor(&random_tensor(&[2, 3, 41], 3.0, 31)?)?;
        let w = Tensor::new(&[[1f32, 0.0, 0.5], [-2.0, 1.0, 3.0]], &Device::Cpu)?;
        let gf = entropy(x.as_tensor())?.mul(&w)?.sum_all()?.backward()?;
        let gc = entropy_composed(x.as_tensor())?
            .mul(&w)?
            .sum_all()?
            .backward()?;
        let a = gf.get(x.as_tensor()).expect("fused grad");
        let c = gc.get(x.as_tensor()).expect("composed grad");
        assert_close(a, c, 1e-5, "entropy grad")
    }

    #[test]
    fn backward_matches_finite_differences() -> Result<()> {
        let x = random_tensor(&[2, 2, 13], 2.0, 32)?.to_dtype(DType::F64)?;
        let w = random_tensor(&[2, 2], 1.0, 33)?.to_dtype(DType::F64)?;
        finite_difference_check(&x, |x| entropy(x)?.mul(&w)?.sum_all(), 1e-6)?;
        // And in f32 with a coarser step and tolerance.
        let x32 = random_tensor(&[1, 2, 9], 2.0, 34)?;
        finite_difference_check(&x32, |x| entropy(x)?.sum_all(), 2e-2)
    }
}
