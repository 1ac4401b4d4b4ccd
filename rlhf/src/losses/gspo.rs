//! GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): PPO's clipped surrogate
//! with one importance ratio per sequence, the length-normalised likelihood ratio
//! `s_i = (π_θ(y_i|x) / π_old(y_i|x))^(1/|y_i|) = exp(mean_t (log π_θ − log π_old))`,
//! clipped as a whole (the paper's clip ranges are small, e.g. 3e-4 / 4e-4).
//!
//! Written in the paper's GSPO-token form, `s_{i,t} = sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]`:
//! its value is `s_i` at every token of the sequence and its gradient flows through each
//! token's own log-prob, so per-token advantages work too, and with one advantage per
//! sequence and `seq_mean_token_mean` it is exactly the sequence-level objective. That
//! form is PPO's loss against a shifted "old" log-prob, `sg[log π_θ] − log s_i`, so the
//! clipping, dual clip and importance weights are [`ppo_policy_loss`]'s own.

use candle_core::Tensor;

use crate::error::Result;
use crate::losses::ppo::{ppo_policy_loss, PpoConfig, PpoStats};
use crate::mask::{
    expect_2d, expect_float, expect_like, expect_shape, predicate, zero_unmasked_out,
};

/// GSPO's loss: inputs and stats as in [`ppo_policy_loss`], with the ratio of each token
/// replaced by its sequence's `s_i` (the stats' `clip_frac` counts the tokens of clipped
/// sequences; `approx_kl` is the token-level k1 estimate, as for PPO).
pub(crate) fn gspo_policy_loss(
    logprobs: &Tensor,
    old_logprobs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    config: &PpoConfig,
    is_weights: Option<&Tensor>,
) -> Result<(Tensor, PpoStats)> {
    let dtype = expect_float("logprobs", logprobs)?;
    let dims = expect_2d("logprobs", logprobs)?;
    let dims = [dims.0, dims.1];
    expect_like("old_logprobs", old_logprobs, &dims, dtype, "logprobs")?;
    expect_shape("mask", mask, &dims, "[batch, seq]")?;
    let shifted_old = sequence_ratio_base(logprobs, old_logprobs, mask)?;
    ppo_policy_loss(logprobs, &shifted_old, advantages, mask, config, is_weights)
}

/// `sg[log π_θ] − log s_i` per token: the "old" log-prob that makes PPO's per-token ratio
/// `exp(log π_θ − old)` equal to the sequence ratio `s_i` in value, with the gradient of
/// `π_θ(y_t) / sg[π_θ(y_t)]`.
pub(crate) fn sequence_ratio_base(
    logprobs: &Tensor,
    old_logprobs: &Tensor,
    mask: &Tensor,
) -> Result<Tensor> {
    let pred = predicate(mask)?;
    let m = pred.to_dtype(logprobs.dtype())?;
    let lp = logprobs.detach();
    let d = zero_unmasked_out(&(&lp - old_logprobs.detach())?, &pred)?;
    let tokens = m.sum_keepdim(1)?.maximum(1.0)?;
    let log_s = d.sum_keepdim(1)?.broadcast_div(&tokens)?;
    Ok(lp.broadcast_sub(&log_s)?)
}
