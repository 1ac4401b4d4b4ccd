//! Composed (unfused) candle equivalents of the fused ops, built only from differentiable
//! candle primitives. They are the yardstick for tests and benchmarks, not for training:
//! each materialises full-size intermediates that the fused ops avoid.

use candle_core::{DType, Result, Tensor, D};

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

fn log_softmax(logits: &Tensor) -> Result<Tensor> {
    let m = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&m)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&lse)
}
