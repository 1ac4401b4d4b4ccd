//! PPO clipped surrogate policy loss (Schulman et al. 2017) with asymmetric clip range,
//! optional dual clip (Ye et al. 2020) and optional per-token importance weights (TIS).
//! It does not add KL or entropy terms; combine those from `kl.rs` / `entropy.rs`.

use candle_core::{DType, Tensor};

use crate::error::Result;
use crate::losses::aggregate::{aggregate_loss, LossAgg};
use crate::mask::{
    expect_2d, expect_float, expect_like, expect_shape, predicate, scalar, zero_unmasked_out,
};

/// Log-ratios are clamped to ±this before `exp` (as in verl), so a wild token cannot overflow.
pub(crate) const LOG_RATIO_CLAMP: f64 = 20.0;

/// Hyper-parameters of [`ppo_policy_loss`].
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PpoConfig {
    /// ε_low: the ratio is clipped below at `1 − clip_low` (≥ 0).
    pub clip_low: f64,
    /// ε_high: the ratio is clipped above at `1 + clip_high` (≥ 0; DAPO's "clip-higher" > ε_low).
    pub clip_high: f64,
    /// Dual-clip constant `c > 1`: for negative advantages the per-token loss is capped at
    /// `−A·c`. `None` disables it.
    pub dual_clip: Option<f64>,
    /// How per-token losses are reduced.
    pub agg: LossAgg,
}

impl PpoConfig {
    /// Symmetric clipping `[1 − eps, 1 + eps]`, no dual clip, token-mean.
    pub fn symmetric(eps: f64) -> Self {
        Self {
            clip_low: eps,
            clip_high: eps,
            dual_clip: None,
            agg: LossAgg::TokenMean,
        }
    }
}

impl Default for PpoConfig {
    /// ε = 0.2 both sides, no dual clip, token-mean.
    fn default() -> Self {
        Self::symmetric(0.2)
    }
}

/// Diagnostics of one [`ppo_policy_loss`] call (masked means over response tokens).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct PpoStats {
    /// Fraction of tokens whose clipped term was selected (gradient zero there).
    pub clip_frac: f64,
    /// Fraction of tokens capped by the dual clip (negative advantages only).
    pub dual_clip_frac: f64,
    /// k1 estimate of KL(π_old ‖ π): mean of `old_logprobs − logprobs`.
    pub approx_kl: f64,
    /// Mean of the probability ratio π/π_old.
    pub ratio_mean: f64,
    /// The loss value.
    pub loss: f64,
}

/// The checks every policy surrogate makes of its inputs: float `[batch, seq]` log-probs
/// with old log-probs, advantages and optional importance weights of the same shape and
/// dtype, a `[batch, seq]` mask, and clip widths ≥ 0. Returns the dtype.
pub(crate) fn check_policy_inputs(
    logprobs: &Tensor,
    old_logprobs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    config: &PpoConfig,
    is_weights: Option<&Tensor>,
) -> Result<DType> {
    let dtype = expect_float("logprobs", logprobs)?;
    let (b, t) = expect_2d("logprobs", logprobs)?;
    let dims = [b, t];
    expect_like("old_logprobs", old_logprobs, &dims, dtype, "logprobs")?;
    expect_like("advantages", advantages, &dims, dtype, "logprobs")?;
    expect_shape("mask", mask, &dims, "[batch, seq]")?;
    if let Some(w) = is_weights {
        expect_like("is_weights", w, &dims, dtype, "logprobs")?;
    }
    for (name, v) in [
        ("clip_low", config.clip_low),
        ("clip_high", config.clip_high),
    ] {
        crate::error::check_min(name, v, 0.0)?;
    }
    Ok(dtype)
}

/// PPO clipped surrogate loss.
///
/// * `logprobs`: `[batch, seq]` float, log π_θ(a_t|s_t) in nats (differentiable).
/// * `old_logprobs`: same shape/dtype, log π_old at rollout time (treated as constants).
/// * `advantages`: same shape/dtype (treated as constants).
/// * `mask`: `[batch, seq]`, any dtype, non-zero = response token. Values at masked positions
///   of every input never influence the loss, its gradient or the stats.
/// * `is_weights`: optional `[batch, seq]` per-token importance weights (e.g. from
///   [`crate::losses::tis::truncated_is_weights`]), multiplied into the per-token loss as
///   constants.
///
/// Per token, with r = exp(clamp(logp − old, ±20)):
/// `ℓ = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high))`, then for A < 0 with dual clip `c`:
/// `ℓ = min(ℓ, −A·c)`; aggregated by `config.agg`. Where the clipped (constant) branch is
/// selected the gradient is exactly zero.
pub fn ppo_policy_loss(
    logprobs: &Tensor,
    old_logprobs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    config: &PpoConfig,
    is_weights: Option<&Tensor>,
) -> Result<(Tensor, PpoStats)> {
    let dtype = check_policy_inputs(logprobs, old_logprobs, advantages, mask, config, is_weights)?;
    if let Some(c) = config.dual_clip {
        crate::error::check_above("dual_clip", c, 1.0)?;
    }

    let pred = predicate(mask)?;
    let logp = zero_unmasked_out(logprobs, &pred)?;
    let old = zero_unmasked_out(&old_logprobs.detach(), &pred)?;
    let adv = zero_unmasked_out(&advantages.detach(), &pred)?;

    let log_ratio = (&logp - &old)?.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)?;
    let ratio = log_ratio.exp()?;
    let neg_adv = adv.neg()?;
    let unclipped = (&neg_adv * &ratio)?;
    let clipped_ratio = ratio
        .detach()
        .clamp(1.0 - config.clip_low, 1.0 + config.clip_high)?;
    let clipped = (&neg_adv * &clipped_ratio)?;
    let use_clipped = clipped.gt(&unclipped.detach())?;
    let mut per_token = use_clipped.where_cond(&clipped, &unclipped)?;

    let dual_selected = match config.dual_clip {
        Some(c) => {
            let cap = neg_adv.affine(c, 0.0)?;
            let negative = adv.lt(0.0)?.to_dtype(dtype)?;
            let above = per_token.detach().gt(&cap)?.to_dtype(dtype)?;
            let sel = (negative * above)?.ne(0.0)?;
            per_token = sel.where_cond(&cap, &per_token)?;
            Some(sel)
        }
        None => None,
    };
    if let Some(w) = is_weights {
        per_token = (per_token * zero_unmasked_out(&w.detach(), &pred)?)?;
    }
    let loss = aggregate_loss(&per_token, mask, config.agg)?;

    let frac = |sel: &Tensor| -> Result<f64> {
        scalar(&crate::mask::masked_mean(&sel.to_dtype(dtype)?, mask)?)
    };
    let stats = PpoStats {
        clip_frac: frac(&use_clipped)?,
        dual_clip_frac: match &dual_selected {
            Some(sel) => frac(sel)?,
            None => 0.0,
        },
        approx_kl: scalar(&crate::mask::masked_mean(&(&old - &logp.detach())?, mask)?)?,
        ratio_mean: scalar(&crate::mask::masked_mean(&ratio.detach(), mask)?)?,
        loss: scalar(&loss)?,
    };
    Ok((loss, stats))
}
