//! Fused per-token log-probabilities: `log_softmax(logits)[target]` without materialising the
//! `[B, T, V]` log-softmax, as a differentiable candle `CustomOp2` (CPU, and CUDA behind the
//! `cuda` feature). No masking here: callers multiply the `[B, T]` result by their mask.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use multiversion::multiversion;
use rayon::prelude::*;

use super::cpu_math::{
    contiguous_slice, row_exp_sums, row_logsumexp, row_max, rows_per_task, Real,
};
use super::validate;

/// Log-probability (nats) of each target token under `softmax(logits)`.
///
/// * `logits`: `[B, T, V]` (any leading dims `[..., V]`), f32 (f64 on CPU too).
/// * `targets`: `[B, T]` (the leading dims of `logits`), u32 token ids in `0..V`
///   (i64/u8 ids are converted). Targets carry no gradient.
/// * returns `[B, T]`, same dtype as `logits`: `logits[b,t,y] - logsumexp_v logits[b,t,v]`.
///
/// Differentiable in `logits`: the backward pass writes `g * (onehot(y) - softmax(logits))`.
/// Non-contiguous inputs are copied to contiguous ones first. An out-of-range target id is an
/// error on CPU; on CUDA it yields NaN for that position (checking would cost a device sync).
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    const OP: &str = "token_logprobs";
    validate::float_dtype(OP, "logits", logits)?;
    let dims = logits.dims();
    let Some((&vocab, lead)) = dims.split_last() else {
        candle_core::bail!("{OP}: `logits` must be [B, T, V] (at least 1-D), got a scalar");
    };
    if vocab == 0 {
        candle_core::bail!("{OP}: `logits` has an empty vocabulary dimension, shape {dims:?}");
    }
    if targets.dims() != lead {
        candle_core::bail!(
            "{OP}: `targets` must have shape {lead:?} (the leading dims of `logits` {dims:?}), got {:?}",
            targets.dims()
        );
    }
    validate::same_device(OP, logits, "targets", targets)?;
    let targets = validate::token_ids(OP, "targets", targets)?;
    let logits = logits.contiguous()?;
    let targets = targets.contiguous()?;
    logits.apply_op2(&targets, TokenLogprobs)
}

/// Forward op: `(logits [rows, V], targets [rows]) -> [rows]`.
struct TokenLogprobs;

/// Backward op: `(logits [rows, V], targets [rows], grad [rows]) -> grad_logits [rows, V]`.
struct TokenLogprobsGrad;

fn fwd_rows<T: Real>(logits: &[T], targets: &[u32], vocab: usize) -> Vec<T> {
    let mut out = vec![T::ZERO; targets.len()];
    let per_task = rows_per_task(vocab);
    out.par_chunks_mut(per_task)
        .zip(logits.par_chunks(per_task * vocab))
        .zip(targets.par_chunks(per_task))
        .for_each(|((out, logits), targets)| fwd_task(out, logits, targets, vocab));
    out
}

/// One task's rows of [`fwd_rows`]. The per-task bodies are functions of their own,
/// multiversioned, not the closures rayon calls: a closure is compiled for the baseline CPU
/// (SSE2) whatever the function defining it is compiled for.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn fwd_task<T: Real>(out: &mut [T], logits: &[T], targets: &[u32], vocab: usize) {
    for ((o, row), &y) in out.iter_mut().zip(logits.chunks(vocab)).zip(targets) {
        *o = row[y as usize] - row_logsumexp(row);
    }
}

fn bwd_rows<T: Real>(logits: &[T], targets: &[u32], grad: &[T], vocab: usize) -> Vec<T> {
    let mut out = vec![T::ZERO; logits.len()];
    let per_task = rows_per_task(vocab);
    out.par_chunks_mut(per_task * vocab)
        .zip(logits.par_chunks(per_task * vocab))
        .zip(targets.par_chunks(per_task).zip(grad.par_chunks(per_task)))
        .for_each(|((out, logits), (targets, grad))| bwd_task(out, logits, (targets, grad), vocab));
    out
}

/// One task's rows of [`bwd_rows`] (multiversioned as [`fwd_task`] is).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn bwd_task<T: Real>(out: &mut [T], logits: &[T], (targets, grad): (&[u32], &[T]), vocab: usize) {
    let rows = out.chunks_mut(vocab).zip(logits.chunks(vocab));
    for (((o, z), &y), &g) in rows.zip(targets).zip(grad) {
        // A zero upstream gradient (masked position) leaves the zeros in place.
        if g == T::ZERO {
            continue;
        }
        let m = row_max(z);
        let (s, _) = row_exp_sums(z, m, false);
        let lse = m + s.ln();
        let neg_g = -g;
        for (o, &zv) in o.iter_mut().zip(z) {
            *o = neg_g * (zv - lse).exp();
        }
        o[y as usize] += g;
    }
}

impl CustomOp2 for TokenLogprobs {
    fn name(&self) -> &'static str {
        "token-logprobs"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let vocab = l1.dims().last().copied().unwrap_or(1);
        let targets = contiguous_slice::<u32>(s2, l2, "token_logprobs", "targets")?;
        validate::targets_in_vocab("token_logprobs", targets, vocab)?;
        let out = match s1 {
            CpuStorage::F32(_) => {
                let z = contiguous_slice::<f32>(s1, l1, "token_logprobs", "logits")?;
                CpuStorage::F32(fwd_rows(z, targets, vocab))
            }
            CpuStorage::F64(_) => {
                let z = contiguous_slice::<f64>(s1, l1, "token_logprobs", "logits")?;
                CpuStorage::F64(fwd_rows(z, targets, vocab))
            }
            other => validate::unsupported_cpu_dtype("token_logprobs", other)?,
        };
        Ok((out, l2.shape().clone()))
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
        let out = super::cuda_launch::softmax_rows_fwd(
            "token_logprobs_fwd_f32",
            s1,
            l1,
            Some((s2, l2)),
            vocab,
        )?;
        Ok((out, l2.shape().clone()))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad_res.contiguous()?;
        let grad_logits = logits.apply_op3_no_bwd(targets, &grad, &TokenLogprobsGrad)?;
        Ok((Some(grad_logits), None))
    }
}

impl CustomOp3 for TokenLogprobsGrad {
    fn name(&self) -> &'static str {
        "token-logprobs-grad"
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
        let vocab = l1.dims().last().copied().unwrap_or(1);
        let targets = contiguous_slice::<u32>(s2, l2, "token_logprobs backward", "targets")?;
        validate::targets_in_vocab("token_logprobs", targets, vocab)?;
        let out = match (s1, s3) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => {
                let z = contiguous_slice::<f32>(s1, l1, "token_logprobs backward", "logits")?;
                let g = contiguous_slice::<f32>(s3, l3, "token_logprobs backward", "grad")?;
                CpuStorage::F32(bwd_rows(z, targets, g, vocab))
            }
            (CpuStorage::F64(_), CpuStorage::F64(_)) => {
                let z = contiguous_slice::<f64>(s1, l1, "token_logprobs backward", "logits")?;
                let g = contiguous_slice::<f64>(s3, l3, "token_logprobs backward", "grad")?;
                CpuStorage::F64(bwd_rows(z, targets, g, vocab))
            }
            (a, _) => validate::unsupported_cpu_dtype("token_logprobs backward", a)?,
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
        let vocab = l1.dims().last().copied().unwrap_or(1);
        let out = super::cuda_launch::softmax_rows_bwd(
            "token_logprobs_bwd_f32",
            s1,
            l1,
            Some((s2, l2)),
            s3,
            l3,
            vocab,
        )?;
        Ok((out, l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::reference::token_logprobs as token_logprobs_composed;
    use crate::ops::testing::{assert_close, finite_difference_check, random_ids, random_tensor};
    use candle_core::{DType, Device, Var};

    #[test]
    fn forward_matches_composed() -> Result<()> {
        for &(b, t, v) in &[(2, 5, 37), (1, 1, 1), (3, 1, 9), (2, 4, 64), (1, 3, 1000)] {
            let logits = random_tensor(&[b, t, v], 3.0, 11 + v as u64)?;
            let targets = random_ids(&[b, t], v, 7)?;
            let fused = token_logprobs(&logits, &targets)?;
            let composed = token_logprobs_composed(&logits, &targets)?;
            assert_eq!(fused.dims(), &[b, t]);
            assert_close(&fused, &composed, 1e-5, "token_logprobs forward")?;
            // Against candle_nn's log_softmax as a second, independent reference.
            let ls = candle_nn::ops::log_softmax(&logits, 2)?;
            let want = ls.gather(&targets.unsqueeze(2)?, 2)?.squeeze(2)?;
            assert_close(&fused, &want, 1e-5, "token_logprobs vs candle_nn")?;
        }
        Ok(())
    }

    #[test]
    fn forward_handles_non_contiguous_and_large_logits() -> Result<()> {
        // [V, T, B] transposed to [B, T, V]: not contiguous.
        let base = random_tensor(&[13, 4, 2], 50.0, 3)?;
        let logits = base.permute((2, 1, 0))?;
        assert!(!logits.is_contiguous());
        let targets = random_ids(&[2, 4], 13, 5)?;
        let fused = token_logprobs(&logits, &targets)?;
        let composed = token_logprobs_composed(&logits, &targets)?;
        assert_close(&fused, &composed, 1e-5, "non-contiguous")?;
        // Shifting all logits by a large constant leaves log-probs unchanged.
        let shifted = (logits.contiguous()? + 1.0e4)?;
        let again = token_logprobs(&shifted, &targets)?;
        assert_close(&fused, &again, 2e-3, "shift invariance")?;
        Ok(())
    }

    #[test]
    fn backward_matches_composed_autograd() -> Result<()> {
        let (b, t, v) = (2, 3, 37);
        let x = random_tensor(&[b, t, v], 2.0, 21)?;
        let targets = random_ids(&[b, t], v, 4)?;
        // A loss weighted by a 0/1 mask and arbitrary per-position weights.
        let w = Tensor::new(&[[1f32, 0.5, 0.0], [2.0, -1.0, 1.0]], &Device::Cpu)?;
        let var = Var::from_tensor(&x)?;
        let g_fused = token_logprobs(var.as_tensor(), &targets)?
            .mul(&w)?
            .sum_all()?
            .backward()?;
        let g_comp = token_logprobs_composed(var.as_tensor(), &targets)?
            .mul(&w)?
            .sum_all()?
            .backward()?;
        let a = g_fused.get(var.as_tensor()).expect("fused grad");
        let c = g_comp.get(var.as_tensor()).expect("composed grad");
        assert_close(a, c, 1e-5, "token_logprobs grad")?;
        // Masked position (weight 0) has an all-zero gradient row.
        let masked = a.get(0)?.get(2)?.abs()?.sum_all()?.to_scalar::<f32>()?;
        assert_eq!(masked, 0.0);
        Ok(())
    }

    #[test]
    fn backward_matches_finite_differences() -> Result<()> {
        let x = random_tensor(&[2, 2, 11], 1.5, 8)?.to_dtype(DType::F64)?;
        let targets = random_ids(&[2, 2], 11, 9)?;
        let w = random_tensor(&[2, 2], 1.0, 10)?.to_dtype(DType::F64)?;
        finite_difference_check(
            &x,
            |x| token_logprobs(x, &targets)?.mul(&w)?.sum_all(),
            1e-6,
        )
    }

    #[test]
    fn targets_carry_no_gradient_and_bad_targets_fail() -> Result<()> {
        let x = Var::from_tensor(&random_tensor(&[1, 2, 5], 1.0, 1)?)?;
        let targets = Tensor::new(&[[0u32, 4]], &Device::Cpu)?;
        let grads = token_logprobs(x.as_tensor(), &targets)?
            .sum_all()?
            .backward()?;
        assert!(grads.get(&targets).is_none());
        // Each gradient row sums to zero (softmax minus one-hot).
        let row_sums = grads.get(x.as_tensor()).expect("grad").sum(2)?;
        assert!(row_sums.abs()?.max_all()?.to_scalar::<f32>()? < 1e-6);

        let bad = Tensor::new(&[[0u32, 5]], &Device::Cpu)?;
        let err = token_logprobs(x.as_tensor(), &bad).unwrap_err().to_string();
        assert!(
            err.contains("target id 5") && err.contains("vocabulary of 5"),
            "{err}"
        );
        let wrong_shape = Tensor::new(&[0u32, 1, 2], &Device::Cpu)?;
        let err = token_logprobs(x.as_tensor(), &wrong_shape)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`targets` must have shape [1, 2]"), "{err}");
        let i64_targets = Tensor::new(&[[0i64, 4]], &Device::Cpu)?;
        let a = token_logprobs(x.as_tensor(), &i64_targets)?;
        let b = token_logprobs(x.as_tensor(), &targets)?;
        assert_close(&a, &b, 0.0, "i64 targets")?;
        Ok(())
    }
}
