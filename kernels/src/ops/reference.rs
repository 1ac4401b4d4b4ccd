//! Composed (unfused) candle equivalents of the fused ops, built only from differentiable
//! candle primitives. They are the yardstick for tests and benchmarks (and the off-CPU
//! fallback of `causal_attention`): each materialises full-size intermediates the fused ops
//! avoid.

use candle_core::{DType, Device, Result, Tensor, D};

/// `log_softmax(logits)[targets]`: `logits [..., V]`, `targets [...]` -> `[...]` (nats).
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let logits = logits.contiguous()?;
    let last = logits.rank() - 1;
    let m = logits.max_keepdim(last)?.detach();
    let shifted = logits.broadcast_sub(&m)?;
    let lse = shifted.exp()?.sum_keepdim(last)?.log()?;
    let logp = shifted.broadcast_sub(&lse)?;
    let idx = targets
        .to_dtype(DType::U32)?
        .unsqueeze(last)?
        .contiguous()?;
    logp.gather(&idx, last)?.squeeze(last)
}

/// Entropy of `softmax(logits)`: `[..., V]` -> `[...]` (nats), as `-sum p log p`.
pub fn entropy(logits: &Tensor) -> Result<Tensor> {
    let logp = log_softmax(logits)?;
    (logp.exp()? * &logp)?.sum(D::Minus1)?.neg()
}

/// `x / sqrt(mean(x^2) + eps) * weight` over the last dim: `[..., D]`, `[D]` -> `[..., D]`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(weight)
}

/// HF `rotate_half` rope: `x [B,H,T,D]`, `cos`/`sin` `[T, D/2]` or `[B, T, D/2]`.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let cos = Tensor::cat(&[cos, cos], D::Minus1)?;
    let sin = Tensor::cat(&[sin, sin], D::Minus1)?;
    // [T, D] -> [1, 1, T, D]; [B, T, D] -> [B, 1, T, D].
    let (cos, sin) = if cos.rank() == 2 {
        (
            cos.unsqueeze(0)?.unsqueeze(0)?,
            sin.unsqueeze(0)?.unsqueeze(0)?,
        )
    } else {
        (cos.unsqueeze(1)?, sin.unsqueeze(1)?)
    };
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
}

/// Score given to a hidden key by [`causal_attention`] (replaces the score): large and finite
/// so a query row with no visible key gets a uniform softmax, not NaN. Mirrors
/// `oxalign_models::nn::mask::MASKED_SCORE`.
pub const MASKED_SCORE: f32 = -1e9;

/// Causal self-attention composed as `oxalign-models` does it: `q` `[B, nh, T, hd]`, `k`/`v`
/// `[B, nkv, T, hd]`, `key_mask` `[B, T]` (nonzero = real), optional sliding `window`;
/// hidden scores are replaced by [`MASKED_SCORE`]. Returns `[B, nh, T, hd]`.
pub fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_mask: Option<&[u32]>,
    window: Option<usize>,
) -> Result<Tensor> {
    causal_attention_segmented(q, k, v, key_mask, None, window)
}

/// [`causal_attention`] over packed rows: with `segments` (`[B, T]` ids), key `j` is also
/// hidden from query `i` when an id change lies between them (they are in different runs).
pub fn causal_attention_segmented(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_mask: Option<&[u32]>,
    segments: Option<&[u32]>,
    window: Option<usize>,
) -> Result<Tensor> {
    let (b, nh, t, hd) = q.dims4()?;
    let nkv = k.dim(1)?;
    // GQA without copying K/V: the n_rep query heads of a group stacked along the sequence.
    let q = q.contiguous()?.reshape((b, nkv, (nh / nkv) * t, hd))?;
    let k = k.contiguous()?;
    let scores = (q.matmul(&k.t()?)? * (hd as f64).powf(-0.5))?.reshape((b, nh, t, t))?;
    let scores = match visibility_mask((key_mask, segments), b, t, window, q.device())? {
        Some(visible) => {
            let visible = visible.broadcast_as(scores.shape())?;
            let hidden = Tensor::new(MASKED_SCORE, scores.device())?
                .to_dtype(scores.dtype())?
                .broadcast_as(scores.shape())?;
            visible.where_cond(&scores, &hidden)?
        }
        None => scores,
    };
    let max = scores.max_keepdim(D::Minus1)?.detach();
    let e = scores.broadcast_sub(&max)?.exp()?;
    let probs = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    probs
        .reshape((b, nkv, (nh / nkv) * t, t))?
        .matmul(&v.contiguous()?)?
        .reshape((b, nh, t, hd))
}

/// u8 mask `[B|1, 1, T, T]` (1 = visible) of the rule in [`causal_attention_segmented`],
/// `None` when nothing is hidden.
fn visibility_mask(
    (key_mask, segments): (Option<&[u32]>, Option<&[u32]>),
    b: usize,
    t: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Option<Tensor>> {
    for (name, m) in [("key_mask", key_mask), ("segments", segments)] {
        if let Some(m) = m.filter(|m| m.len() != b * t) {
            candle_core::bail!(
                "causal_attention: `{name}` must hold {b} * {t} entries, got {}",
                m.len()
            );
        }
    }
    // Run index of each token: the number of segment-id changes before it in its row.
    let runs: Option<Vec<usize>> = segments.map(|s| {
        s.chunks(t)
            .flat_map(|row| {
                row.iter().enumerate().scan(0, |run, (i, &x)| {
                    *run += usize::from(i > 0 && x != row[i - 1]);
                    Some(*run)
                })
            })
            .collect()
    });
    let rows = if key_mask.is_some() || segments.is_some() {
        b
    } else {
        1
    };
    let mut visible = vec![1u8; rows * t * t];
    for r in 0..rows {
        for i in 0..t {
            for j in 0..t {
                let ok = j <= i
                    && window.is_none_or(|w| i - j < w)
                    && key_mask.is_none_or(|m| m[r * t + j] != 0)
                    && runs.as_ref().is_none_or(|s| s[r * t + i] == s[r * t + j]);
                visible[(r * t + i) * t + j] = u8::from(ok);
            }
        }
    }
    if visible.iter().all(|&x| x == 1) {
        return Ok(None);
    }
    Ok(Some(Tensor::from_vec(visible, (rows, 1, t, t), device)?))
}

fn log_softmax(logits: &Tensor) -> Result<Tensor> {
    let m = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&m)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&lse)
}
