//! Clipped value (critic) loss as in PPO2 / OpenAI baselines:
//! `0.5 · max((v − R)², (v_clip − R)²)`, `v_clip = v_old + clip(v − v_old, ±ε)`.
//! It does not compute the returns (see `advantages::gae`).

use candle_core::Tensor;

use crate::error::Result;
use crate::losses::aggregate::{aggregate_loss, LossAgg};
use crate::mask::{
    expect_2d, expect_float, expect_like, expect_shape, masked_mean, predicate, scalar,
    zero_unmasked_out,
};

/// Diagnostics of one [`value_loss`] call (masked means over response tokens).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct ValueStats {
    /// Fraction of tokens where the clipped term was larger (gradient zero there).
    pub clip_frac: f64,
    /// Mean predicted value.
    pub value_mean: f64,
    /// Mean of `(v − R)²` (unclipped squared error).
    pub mse: f64,
    /// The loss value.
    pub loss: f64,
}

/// Clipped value loss.
///
/// * `values`: `[batch, seq]` float, current critic predictions (differentiable).
/// * `old_values`: same shape/dtype, predictions at rollout time (constants).
/// * `returns`: same shape/dtype, value targets R (constants).
/// * `mask`: `[batch, seq]`, any dtype, non-zero = response token.
/// * `clip_range`: `Some(ε)` clips `v` to `[v_old − ε, v_old + ε]` in the second term;
///   `None` gives the plain `0.5 (v − R)²`.
///
/// Returns the aggregated `0.5 · max((v − R)², (v_clip − R)²)` and stats.
pub fn value_loss(
    values: &Tensor,
    old_values: &Tensor,
    returns: &Tensor,
    mask: &Tensor,
    clip_range: Option<f64>,
    agg: LossAgg,
) -> Result<(Tensor, ValueStats)> {
    let dtype = expect_float("values", values)?;
    let (b, t) = expect_2d("values", values)?;
    let dims = [b, t];
    expect_like("old_values", old_values, &dims, dtype, "values")?;
    expect_like("returns", returns, &dims, dtype, "values")?;
    expect_shape("mask", mask, &dims, "[batch, seq]")?;
    if let Some(eps) = clip_range {
        crate::error::check_min("clip_range", eps, 0.0)?;
    }
    let pred = predicate(mask)?;
    let v = zero_unmasked_out(values, &pred)?;
    let ret = zero_unmasked_out(&returns.detach(), &pred)?;
    let unclipped = (&v - &ret)?.sqr()?;
    let (per_token, clip_frac) = match clip_range {
        Some(eps) => {
            let old = zero_unmasked_out(&old_values.detach(), &pred)?;
            // Where the clipped term is selected, v is outside [old − ε, old + ε] and
            // d v_clip / d v = 0, so computing it from the detached v loses nothing.
            let v_clip = (&old + (v.detach() - &old)?.clamp(-eps, eps)?)?;
            let clipped = (&v_clip - &ret)?.sqr()?;
            let use_clipped = clipped.gt(&unclipped.detach())?;
            let frac = scalar(&masked_mean(&use_clipped.to_dtype(dtype)?, mask)?)?;
            (use_clipped.where_cond(&clipped, &unclipped)?, frac)
        }
        None => (unclipped.clone(), 0.0),
    };
    let loss = aggregate_loss(&per_token.affine(0.5, 0.0)?, mask, agg)?;
    let stats = ValueStats {
        clip_frac,
        value_mean: scalar(&masked_mean(&v.detach(), mask)?)?,
        mse: scalar(&masked_mean(&unclipped.detach(), mask)?)?,
        loss: scalar(&loss)?,
    };
    Ok((loss, stats))
}
