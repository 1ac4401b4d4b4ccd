//! Truncated importance sampling (TIS) between the rollout engine and the trainer (Yao et al.
//! 2025, "Your efficient RL framework secretly brings you off-policy RL training"): weights
//! `min(π_trainer_old / π_rollout, C)` and the log-prob mismatch metrics. Applying the weights is
//! the policy loss's job (`ppo_policy_loss(.., is_weights)`).

use candle_core::Tensor;

use crate::error::Result;
use crate::mask::{
    expect_2d, expect_float, expect_like, expect_shape, host_f64, host_mask, predicate,
    zero_unmasked_out,
};

/// Mismatch diagnostics between trainer and rollout log-probs (over response tokens).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct TisStats {
    /// Mean of `|log π_trainer_old − log π_rollout|` (nats).
    pub mismatch_abs_mean: f64,
    /// Max of `|log π_trainer_old − log π_rollout|` (nats); `0` with no response tokens.
    pub mismatch_abs_max: f64,
    /// Mean of the truncated weights.
    pub weight_mean: f64,
    /// Fraction of tokens whose weight was truncated at `C`.
    pub truncated_frac: f64,
}

/// Checks the inputs shared by TIS and the rollout corrections: float `[batch, seq]` trainer
/// log-probs, engine log-probs of the same shape and dtype, and a `[batch, seq]` mask.
/// Returns `(batch, seq)`.
pub(crate) fn expect_logprob_pair(
    trainer_old_logprobs: &Tensor,
    rollout_logprobs: &Tensor,
    mask: &Tensor,
) -> Result<(usize, usize)> {
    let dtype = expect_float("trainer_old_logprobs", trainer_old_logprobs)?;
    let (b, t) = expect_2d("trainer_old_logprobs", trainer_old_logprobs)?;
    expect_like(
        "rollout_logprobs",
        rollout_logprobs,
        &[b, t],
        dtype,
        "trainer_old_logprobs",
    )?;
    expect_shape("mask", mask, &[b, t], "[batch, seq]")?;
    Ok((b, t))
}

/// Per-token TIS weights `w_t = min(exp(log π_trainer_old − log π_rollout), cap)`.
///
/// * `trainer_old_logprobs`: `[batch, seq]` float, log-probs of the rollout tokens recomputed by
///   the trainer with the pre-update weights (nats).
/// * `rollout_logprobs`: same shape/dtype, log-probs reported by the generation engine.
/// * `mask`: `[batch, seq]`, any dtype, non-zero = response token.
/// * `cap`: truncation constant `C > 0` (e.g. 2.0).
/// * Returns detached weights `[batch, seq]` (`0` at masked positions) and the mismatch stats.
pub fn truncated_is_weights(
    trainer_old_logprobs: &Tensor,
    rollout_logprobs: &Tensor,
    mask: &Tensor,
    cap: f64,
) -> Result<(Tensor, TisStats)> {
    expect_logprob_pair(trainer_old_logprobs, rollout_logprobs, mask)?;
    crate::error::check_above("cap", cap, 0.0)?;
    let pred = predicate(mask)?;
    let delta = (zero_unmasked_out(&trainer_old_logprobs.detach(), &pred)?
        - zero_unmasked_out(&rollout_logprobs.detach(), &pred)?)?;
    let weights = zero_unmasked_out(&delta.exp()?.minimum(cap)?, &pred)?;

    let d = host_f64(&delta)?;
    let w = host_f64(&weights)?;
    let m = host_mask(mask)?;
    let (mut n, mut abs_sum, mut abs_max, mut w_sum, mut n_trunc) =
        (0usize, 0.0, 0.0f64, 0.0, 0usize);
    for i in 0..d.len() {
        if m[i] {
            n += 1;
            abs_sum += d[i].abs();
            abs_max = abs_max.max(d[i].abs());
            w_sum += w[i];
            if d[i].exp() > cap {
                n_trunc += 1;
            }
        }
    }
    let denom = n.max(1) as f64;
    let stats = TisStats {
        mismatch_abs_mean: abs_sum / denom,
        mismatch_abs_max: abs_max,
        weight_mean: w_sum / denom,
        truncated_frac: n_trunc as f64 / denom,
    };
    Ok((weights, stats))
}
