//! The fused LM head: token log-probs and entropy of `softmax(h Wᵀ / temperature)` straight
//! from the hidden states, as a differentiable candle op that never builds the `[N, V]`
//! logits or their gradient (Liger-style fused linear cross-entropy, generalised to the
//! log-prob and entropy that RL losses need). The backward pass reads the logits back when
//! the forward kept them (at most `lm_head_kept::LOGITS_CACHE_BYTES`, only when a gradient
//! will be taken), and recomputes them block by block otherwise. CPU kernels in `lm_head_cpu.rs`; on other devices the same math is composed from
//! candle ops (which does build the logits). No masking here: callers weight the results.
//!
//! The distribution is `softmax(logits / T)` over a kept set (`truncation.rs`), the one the
//! rollout sampled from: with top-k / top-p the CPU kernel builds one block of whole rows at a
//! time to find each row's kept set.

use std::any::Any;
use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

use super::cpu_math::{contiguous_slice, Real};
use super::gradient_sink::GradientSink;
use super::lm_head_bf16::{Bf16Head, HeadPass};
use super::lm_head_cpu::{self, BackwardRows, HeadDims, COLS};
use super::lm_head_kept::KeptLogits;
use super::truncation::{TokenDistribution, Truncation};
use super::validate;

const OP: &str = "lm_head_logprobs";

/// Per-token results of [`lm_head_logprobs`], shaped like the targets.
#[derive(Debug, Clone)]
pub struct HeadOutputs {
    /// `log p(target)` in nats.
    pub logprobs: Tensor,
    /// Entropy of the next-token distribution (over its kept set), in nats.
    pub entropy: Tensor,
}

/// Log-prob of each target token and the entropy of each row's distribution under
/// `softmax(hidden · weightᵀ / T)` restricted to `dist`'s kept set (widened to reach the
/// target when it fell outside), without materialising the logits.
///
/// * `hidden`: `[..., H]` f32 (f64 on CPU too), e.g. `[B, T, H]` final-normed states.
/// * `weight`: `[V, H]`, the LM head (same dtype and device).
/// * `targets`: the leading dims of `hidden`, u32 ids in `0..V` (no gradient).
/// * `dist`: temperature > 0 and truncation; [`TokenDistribution::MODEL`] is the model's own
///   distribution.
///
/// Both outputs are differentiable in `hidden` and `weight` (the kept set held fixed).
/// Untruncated, they equal (to float rounding) `token_logprobs(linear(hidden, weight) / T,
/// targets)` and `entropy(...)` of the same logits.
pub fn lm_head_logprobs(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    dist: TokenDistribution,
) -> Result<HeadOutputs> {
    lm_head_logprobs_with(hidden, weight, targets, dist, HeadProducts::F32, None)
}

/// The numbers the fused head multiplies in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HeadProducts {
    /// f32 operands and sums.
    #[default]
    F32,
    /// The hidden states, the weight and (backward) the logits' gradient rounded to bf16,
    /// f32 sums (`lm_head_bf16.rs`): bf16 mixed precision. The softmax, log-probs and
    /// entropy stay f32; f64 inputs compute in f64.
    Bf16,
}

/// [`lm_head_logprobs`] with its products in `products`' numbers. On the CPU, the backward
/// hands the weight's gradient to `sink` when one is given (`gradient_sink.rs`).
pub fn lm_head_logprobs_with(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    dist: TokenDistribution,
    products: HeadProducts,
    sink: Option<Arc<dyn GradientSink>>,
) -> Result<HeadOutputs> {
    let temperature = dist.temperature;
    validate::float_dtype(OP, "hidden", hidden)?;
    validate::same_dtype(OP, "hidden", hidden, "weight", weight)?;
    validate::same_device(OP, hidden, "weight", weight)?;
    validate::same_device(OP, hidden, "targets", targets)?;
    if !(temperature.is_finite() && temperature > 0.0) {
        candle_core::bail!("{OP}: `temperature` must be a finite number > 0, got {temperature}");
    }
    let top_p = dist.truncation.top_p;
    if !(top_p > 0.0 && top_p <= 1.0) {
        candle_core::bail!("{OP}: `top_p` must be in (0, 1], got {top_p}");
    }
    let dims = hidden.dims();
    let Some((&h, lead)) = dims.split_last() else {
        candle_core::bail!("{OP}: `hidden` must be [..., H], got a scalar");
    };
    let (v, wh) = weight.dims2()?;
    if wh != h || v == 0 {
        candle_core::bail!(
            "{OP}: `weight` must be [V, {h}] with V > 0 (hidden is {dims:?}), got {:?}",
            weight.dims()
        );
    }
    if targets.dims() != lead {
        candle_core::bail!(
            "{OP}: `targets` must have shape {lead:?} (the leading dims of `hidden` {dims:?}), got {:?}",
            targets.dims()
        );
    }
    let targets = validate::token_ids(OP, "targets", targets)?;
    let n: usize = lead.iter().product();
    let out = if hidden.device().is_cpu() {
        let hf = hidden.reshape((n, h))?.contiguous()?;
        let tf = targets.reshape(n)?.contiguous()?;
        let op = LmHead {
            dist,
            products,
            keep_logits: hidden.track_op() || weight.track_op(),
            kept: Mutex::new(None),
            sink,
        };
        hf.apply_op3(&weight.contiguous()?, &tf, op)?
    } else {
        let round = |t: &Tensor| match products {
            HeadProducts::Bf16 if t.dtype() == DType::F32 => {
                t.to_dtype(DType::BF16)?.to_dtype(DType::F32)
            }
            _ => Ok(t.clone()),
        };
        let (hidden, weight) = (round(&hidden.reshape((n, h))?)?, round(weight)?);
        composed(&hidden, &weight, &targets.reshape(n)?, dist, None)?
    };
    Ok(HeadOutputs {
        logprobs: out.narrow(1, 0, 1)?.reshape(lead)?,
        entropy: out.narrow(1, 1, 1)?.reshape(lead)?,
    })
}

/// [`lm_head_logprobs`] of soft-capped logits: `softcap · tanh(hidden · weightᵀ / softcap)`,
/// then `dist` (Gemma 2's `final_logit_softcapping`). Composed from candle ops, so the
/// `[N, V]` logits are built (a chunk of rows at a time is left for later).
pub fn lm_head_logprobs_softcapped(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    dist: TokenDistribution,
    softcap: f64,
) -> Result<HeadOutputs> {
    if !(softcap.is_finite() && softcap > 0.0) {
        candle_core::bail!("{OP}: `softcap` must be a finite number > 0, got {softcap}");
    }
    let dims = hidden.dims();
    let Some((&h, lead)) = dims.split_last() else {
        candle_core::bail!("{OP}: `hidden` must be [..., H], got a scalar");
    };
    let n: usize = lead.iter().product();
    let targets = validate::token_ids(OP, "targets", targets)?;
    let out = composed(
        &hidden.reshape((n, h))?,
        weight,
        &targets.reshape(n)?,
        dist,
        Some(softcap),
    )?;
    Ok(HeadOutputs {
        logprobs: out.narrow(1, 0, 1)?.reshape(lead)?,
        entropy: out.narrow(1, 1, 1)?.reshape(lead)?,
    })
}

/// `c · tanh(z / c)`, differentiable.
pub fn softcap(z: &Tensor, c: f64) -> Result<Tensor> {
    (z / c)?.tanh()? * c
}

/// The same `[N, 2]` (log-prob, entropy) from composed candle ops, for devices without a
/// fused kernel and for soft-capped logits (`cap`). A truncation finds each row's kept set on the host and pushes the other
/// logits to a large negative value (their probability underflows to exactly 0).
fn composed(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    dist: TokenDistribution,
    cap: Option<f64>,
) -> Result<Tensor> {
    let raw = hidden.matmul(&weight.t()?)?;
    let raw = match cap {
        Some(c) => softcap(&raw, c)?,
        None => raw,
    };
    let mut logits = (raw / dist.temperature)?;
    if !dist.truncation.is_off(weight.dim(0)?) {
        let keep = kept_mask(&logits, targets, dist.truncation)?;
        let floor =
            Tensor::full(-1e30f32, logits.shape(), logits.device())?.to_dtype(logits.dtype())?;
        logits = keep.where_cond(&logits, &floor)?;
    }
    let lp = super::token_logprobs(&logits, targets)?;
    let ent = super::entropy(&logits)?;
    Tensor::stack(&[lp, ent], 1)
}

/// `[N, V]` u8, 1 where a tempered logit is in its row's kept set (widened to the target).
fn kept_mask(logits: &Tensor, targets: &Tensor, cut: Truncation) -> Result<Tensor> {
    let z: Vec<Vec<f32>> = logits.detach().to_dtype(DType::F32)?.to_vec2()?;
    let y: Vec<u32> = targets.to_vec1()?;
    let mut mask = Vec::with_capacity(z.len() * z.first().map_or(0, Vec::len));
    for (row, &t) in z.iter().zip(&y) {
        let tau = super::rows::kept_threshold(row, cut).min(row[t as usize]);
        mask.extend(row.iter().map(|&x| u8::from(x >= tau)));
    }
    Tensor::from_vec(mask, logits.shape(), logits.device())
}

/// Forward op: `(hidden [N, H], weight [V, H], targets [N]) -> [N, 4]`, columns
/// (log-prob, entropy, logsumexp, kept threshold). The last two are kept for the backward
/// pass and are not differentiable.
struct LmHead {
    dist: TokenDistribution,
    products: HeadProducts,
    /// Whether a backward pass will follow, so the forward keeps its logits when they fit
    /// (`lm_head_kept.rs`).
    keep_logits: bool,
    /// The kept logits (a `KeptLogits<T>` of the forward's dtype), taken by the backward.
    kept: Mutex<Option<Box<dyn Any + Send>>>,
    /// Where the backward hands the weight's gradient, if anywhere.
    sink: Option<Arc<dyn GradientSink>>,
}

/// Backward op: `(hidden, weight, targets) -> [N·H + V·H]`, the gradients of hidden and
/// weight flattened one after the other. Carries the forward output and its gradient.
struct LmHeadGrad<T> {
    temperature: f64,
    products: HeadProducts,
    /// Whether the weight's gradient is wanted (not for a frozen head).
    want_dw: bool,
    res: Vec<T>,
    grad: Vec<T>,
    /// The forward's logits, when it kept them.
    cache: Option<KeptLogits<T>>,
}

fn dims_of(l1: &Layout, l2: &Layout) -> Result<HeadDims> {
    let (n, hidden) = l1.shape().dims2()?;
    let (vocab, _) = l2.shape().dims2()?;
    Ok(HeadDims { n, hidden, vocab })
}

impl LmHead {
    fn fwd_typed<T: Real + 'static>(
        &self,
        (s1, l1): (&CpuStorage, &Layout),
        (s2, l2): (&CpuStorage, &Layout),
        targets: &[u32],
    ) -> Result<Vec<T>> {
        let d = dims_of(l1, l2)?;
        let h = contiguous_slice::<T>(s1, l1, OP, "hidden")?;
        let w = contiguous_slice::<T>(s2, l2, OP, "weight")?;
        let scale = T::from_f64(1.0 / self.dist.temperature);
        let head = bf16_head(self.products, w, d, HeadPass::Forward);
        let cut = self.dist.truncation;
        let (out, kept) = lm_head_cpu::forward(
            h,
            w,
            targets,
            d,
            scale,
            cut,
            head.as_ref(),
            self.keep_logits,
        );
        if let Some(kept) = kept {
            *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(kept));
        }
        Ok(out)
    }

    /// The logits the forward kept, if it kept them in `T`'s numbers (taken: a second
    /// backward pass recomputes them).
    fn take_kept<T: 'static>(&self) -> Option<KeptLogits<T>> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        kept.downcast::<KeptLogits<T>>().ok().map(|b| *b)
    }
}

/// The weight prepared for bf16 products when `products` asks for them and `w` is f32.
fn bf16_head<T: 'static>(
    products: HeadProducts,
    w: &[T],
    d: HeadDims,
    pass: HeadPass,
) -> Option<Bf16Head> {
    match products {
        HeadProducts::Bf16 => {
            Bf16Head::new(w, (d.vocab, d.hidden), pass, super::linear::bf16_path())
        }
        HeadProducts::F32 => None,
    }
}

impl CustomOp3 for LmHead {
    fn name(&self) -> &'static str {
        "lm-head-logprobs"
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
        let targets = contiguous_slice::<u32>(s3, l3, OP, "targets")?;
        let d = dims_of(l1, l2)?;
        validate::targets_in_vocab(OP, targets, d.vocab)?;
        let out = match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => {
                CpuStorage::F32(self.fwd_typed::<f32>((s1, l1), (s2, l2), targets)?)
            }
            (CpuStorage::F64(_), CpuStorage::F64(_)) => {
                CpuStorage::F64(self.fwd_typed::<f64>((s1, l1), (s2, l2), targets)?)
            }
            (a, _) => validate::unsupported_cpu_dtype(OP, a)?,
        };
        Ok((out, Shape::from((d.n, COLS))))
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        targets: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (n, h) = hidden.dims2()?;
        let v = weight.dim(0)?;
        // A frozen head (a LoRA model's) gets no gradient: its products are skipped.
        let want_dw = weight.track_op();
        let flat = match hidden.dtype() {
            DType::F64 => {
                let op = LmHeadGrad::<f64> {
                    temperature: self.dist.temperature,
                    products: self.products,
                    want_dw,
                    res: res.flatten_all()?.to_vec1()?,
                    grad: grad_res.flatten_all()?.to_vec1()?,
                    cache: self.take_kept(),
                };
                hidden.apply_op3_no_bwd(weight, targets, &op)?
            }
            _ => {
                let op = LmHeadGrad::<f32> {
                    temperature: self.dist.temperature,
                    products: self.products,
                    want_dw,
                    res: res.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?,
                    grad: grad_res.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?,
                    cache: self.take_kept(),
                };
                hidden.apply_op3_no_bwd(weight, targets, &op)?
            }
        };
        let dh = flat.narrow(0, 0, n * h)?.reshape((n, h))?;
        let dw = match (want_dw, &self.sink) {
            (false, _) => None,
            (true, sink) => {
                let dw = flat.narrow(0, n * h, v * h)?.reshape((v, h))?;
                match sink {
                    Some(sink) => sink.accept(weight, dw)?,
                    None => Some(dw),
                }
            }
        };
        Ok((Some(dh), dw, None))
    }
}

impl<T: Real + 'static> LmHeadGrad<T> {
    fn run(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        targets: &[u32],
    ) -> Result<Vec<T>> {
        let d = dims_of(l1, l2)?;
        let h = contiguous_slice::<T>(s1, l1, OP, "hidden")?;
        let w = contiguous_slice::<T>(s2, l2, OP, "weight")?;
        let rows = BackwardRows::select(h, targets, &self.res, &self.grad, d.hidden);
        let scale = T::from_f64(1.0 / self.temperature);
        let pass = HeadPass::Backward {
            recompute_logits: self.cache.is_none(),
        };
        let head = bf16_head(self.products, w, d, pass);
        let source = (w, self.cache.as_ref());
        Ok(lm_head_cpu::backward(
            rows,
            source,
            d,
            (scale, self.want_dw),
            head.as_ref(),
        ))
    }
}

impl<T: Real + 'static> CustomOp3 for LmHeadGrad<T> {
    fn name(&self) -> &'static str {
        "lm-head-logprobs-grad"
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
        let targets = contiguous_slice::<u32>(s3, l3, OP, "targets")?;
        let d = dims_of(l1, l2)?;
        let flat = self.run(s1, l1, s2, l2, targets)?;
        let storage = match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(cast(flat)),
            (CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(cast(flat)),
            (a, _) => validate::unsupported_cpu_dtype(OP, a)?,
        };
        let dw_len = if self.want_dw { d.vocab * d.hidden } else { 0 };
        Ok((storage, Shape::from(d.n * d.hidden + dw_len)))
    }
}

/// `Vec<T>` as `Vec<U>` when both are the same type (checked), without copying.
fn cast<T: 'static, U: 'static>(v: Vec<T>) -> Vec<U> {
    let mut v = std::mem::ManuallyDrop::new(v);
    assert_eq!(std::any::TypeId::of::<T>(), std::any::TypeId::of::<U>());
    // SAFETY: T and U are the same type (asserted), so layout and allocation match.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr() as *mut U, v.len(), v.capacity()) }
}

#[cfg(test)]
#[path = "lm_head_tests.rs"]
mod tests;
