//! CISPO (MiniMax-M1, 2025; also in NeMo RL): REINFORCE with clipped, stop-gradient
//! importance-sampling weights. Per token
//! `ℓ_t = −sg(clip(r_t, 1 − ε_low, 1 + ε_high)) · A_t · log π_θ(y_t)` with
//! `r_t = π_θ / π_old`, aggregated over the response tokens (token mean in the paper).
//! Unlike PPO's clip, no token's gradient is ever dropped: a clipped ratio only caps its
//! weight. MiniMax-M1 sets no effective lower bound (a large ε_low) and tunes ε_high.

use candle_core::Tensor;

use crate::error::Result;
use crate::losses::aggregate::aggregate_loss;
use crate::losses::ppo::{check_policy_inputs, PpoConfig, PpoStats, LOG_RATIO_CLAMP};
use crate::mask::{masked_mean, predicate, scalar, zero_unmasked_out};

/// CISPO's loss. Inputs as in [`crate::losses::ppo_policy_loss`]; `config.clip_low` and
/// `config.clip_high` bound the weight, `config.agg` aggregates, `config.dual_clip` must be
/// `None` (it has no meaning here). `clip_frac` counts the tokens whose weight was clipped.
pub(crate) fn cispo_policy_loss(
    logprobs: &Tensor,
    old_logprobs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    config: &PpoConfig,
    is_weights: Option<&Tensor>,
) -> Result<(Tensor, PpoStats)> {
    let dtype = check_policy_inputs(logprobs, old_logprobs, advantages, mask, config, is_weights)?;
    if config.dual_clip.is_some() {
        return Err(crate::RlhfError::invalid(
            "dual_clip",
            "set",
            "CISPO never drops a token's gradient, so a dual clip has no meaning",
        ));
    }
    let pred = predicate(mask)?;
    let logp = zero_unmasked_out(logprobs, &pred)?;
    let old = zero_unmasked_out(&old_logprobs.detach(), &pred)?;
    let adv = zero_unmasked_out(&advantages.detach(), &pred)?;
    let ratio = (&logp.detach() - &old)?
        .clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)?
        .exp()?;
    let (lo, hi) = (1.0 - config.clip_low, 1.0 + config.clip_high);
    let weight = ratio.clamp(lo, hi)?;
    let mut per_token = (weight * adv)?.neg()?.mul(&logp)?;
    if let Some(w) = is_weights {
        per_token = (per_token * zero_unmasked_out(&w.detach(), &pred)?)?;
    }
    let loss = aggregate_loss(&per_token, mask, config.agg)?;
    let clipped = (ratio.gt(hi)?.to_dtype(dtype)? + ratio.lt(lo)?.to_dtype(dtype)?)?;
    let stats = PpoStats {
        clip_frac: scalar(&masked_mean(&clipped, mask)?)?,
        dual_clip_frac: 0.0,
        approx_kl: scalar(&masked_mean(&(&old - &logp.detach())?, mask)?)?,
        ratio_mean: scalar(&masked_mean(&ratio, mask)?)?,
        loss: scalar(&loss)?,
    };
    Ok((loss, stats))
}
