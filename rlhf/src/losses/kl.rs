//! KL(π ‖ π_ref) estimators k1/k2/k3 (Schulman 2020, "Approximating KL divergence") from
//! per-token log-probs sampled from π, used as a reward penalty or as a loss term.
//! It does not pick β (see `kl_controller.rs`).

use candle_core::Tensor;

use crate::error::{Result, RlhfError};
use crate::losses::aggregate::{aggregate_loss, LossAgg};
use crate::mask::{
    expect_1d, expect_2d, expect_float, expect_like, expect_shape, from_host, host_f64, host_mask,
    predicate, scalar, zero_unmasked_out,
};

/// Per-token estimator of KL(π ‖ π_ref) with `d = log π − log π_ref` (tokens sampled from π).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// `d` (unbiased, can be negative).
    #[default]
    K1,
    /// `½ d²` (biased, low variance, ≥ 0).
    K2,
    /// `exp(−d) + d − 1 = exp(log π_ref − log π) − (log π_ref − log π) − 1` (unbiased, ≥ 0;
    /// clamped at 0 against f32 rounding).
    K3,
}

/// Where the KL penalty enters the objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlMode {
    /// Reward shaping: `r_t −= β·kl_t` before computing advantages ([`kl_shaped_rewards`]).
    #[default]
    Reward,
    /// A separate loss term `β·agg(kl)` added to the policy loss ([`kl_loss`]).
    Loss,
}

/// KL statistics over response tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct KlStats {
    /// Mean per-token KL estimate (nats per token).
    pub kl_token_mean: f64,
    /// Mean over non-empty sequences of the summed per-token KL (nats per sequence): the
    /// quantity an adaptive controller tracks.
    pub kl_seq_mean: f64,
}

/// Per-token KL estimate.
///
/// * `logprobs`: `[batch, seq]` float, log π (nats; differentiable).
/// * `ref_logprobs`: same shape/dtype, log π_ref (treated as constants).
/// * `mask`: `[batch, seq]`, any dtype, non-zero = response token.
/// * Returns `[batch, seq]`, `0` at masked positions (masked inputs never influence it).
pub fn kl_per_token(
    logprobs: &Tensor,
    ref_logprobs: &Tensor,
    mask: &Tensor,
    estimator: KlEstimator,
) -> Result<Tensor> {
    let dtype = expect_float("logprobs", logprobs)?;
    let (b, t) = expect_2d("logprobs", logprobs)?;
    expect_like("ref_logprobs", ref_logprobs, &[b, t], dtype, "logprobs")?;
    expect_shape("mask", mask, &[b, t], "[batch, seq]")?;
    let pred = predicate(mask)?;
    let d =
        (zero_unmasked_out(logprobs, &pred)? - zero_unmasked_out(&ref_logprobs.detach(), &pred)?)?;
    Ok(match estimator {
        KlEstimator::K1 => d,
        KlEstimator::K2 => d.sqr()?.affine(0.5, 0.0)?,
        KlEstimator::K3 => {
            // ≥ 0 mathematically; in f32 rounding can give −6e-8 near d = 0, so clamp there
            // (the true gradient 1 − e^{−d} is ~1e-4 at such points).
            let k3 = ((d.neg()?.exp()? + &d)? - 1.0)?;
            k3.ge(0.0)?.where_cond(&k3, &k3.zeros_like()?)?
        }
    })
}

fn kl_stats(kl: &Tensor, mask: &Tensor) -> Result<KlStats> {
    let kl = kl.detach();
    Ok(KlStats {
        kl_token_mean: scalar(&aggregate_loss(&kl, mask, LossAgg::TokenMean)?)?,
        kl_seq_mean: scalar(&aggregate_loss(&kl, mask, LossAgg::SeqMeanTokenSum)?)?,
    })
}

/// KL as a loss term (`KlMode::Loss`): `coef · agg(kl_t)`.
///
/// * Inputs as in [`kl_per_token`]; `coef` is β (≥ 0). Differentiable w.r.t. `logprobs`.
pub fn kl_loss(
    logprobs: &Tensor,
    ref_logprobs: &Tensor,
    mask: &Tensor,
    estimator: KlEstimator,
    coef: f64,
    agg: LossAgg,
) -> Result<(Tensor, KlStats)> {
    crate::error::check_min("coef", coef, 0.0)?;
    let kl = kl_per_token(logprobs, ref_logprobs, mask, estimator)?;
    let loss = aggregate_loss(&kl, mask, agg)?.affine(coef, 0.0)?;
    Ok((loss, kl_stats(&kl, mask)?))
}

/// KL-shaped token rewards (`KlMode::Reward`): `r_t = −β·kl_t` on every response token, plus the
/// sequence score added on the last response token of each row.
///
/// * `scores`: `[batch]` float (same dtype as `logprobs`), one scalar reward per sequence.
/// * `logprobs`, `ref_logprobs`, `mask`: as in [`kl_per_token`] (`logprobs` is read, not
///   differentiated: the result is detached).
/// * `beta`: KL coefficient (≥ 0).
/// * Returns `[batch, seq]` rewards, `0` at masked positions, and KL stats. Every row must have
///   at least one response token (its score needs a place), else [`RlhfError::EmptyRow`].
pub fn kl_shaped_rewards(
    scores: &Tensor,
    logprobs: &Tensor,
    ref_logprobs: &Tensor,
    mask: &Tensor,
    beta: f64,
    estimator: KlEstimator,
) -> Result<(Tensor, KlStats)> {
    let dtype = expect_float("logprobs", logprobs)?;
    let (b, t) = expect_2d("logprobs", logprobs)?;
    expect_float("scores", scores)?;
    if expect_1d("scores", scores)? != b {
        return Err(RlhfError::Shape {
            name: "scores".into(),
            expected: format!("[batch] = [{b}]"),
            got: scores.dims().to_vec(),
        });
    }
    crate::error::check_min("beta", beta, 0.0)?;
    let kl = kl_per_token(&logprobs.detach(), ref_logprobs, mask, estimator)?;
    let stats = kl_stats(&kl, mask)?;
    let kl_host = host_f64(&kl)?;
    let m = host_mask(mask)?;
    let s = host_f64(scores)?;
    let mut rewards = vec![0.0; b * t];
    for (row, score) in s.iter().enumerate() {
        let mut last = None;
        for col in 0..t {
            let i = row * t + col;
            if m[i] {
                rewards[i] = -beta * kl_host[i];
                last = Some(i);
            }
        }
        match last {
            Some(i) => rewards[i] += score,
            None => {
                return Err(RlhfError::EmptyRow {
                    name: "mask".into(),
                    row,
                })
            }
        }
    }
    Ok((from_host(rewards, &[b, t], dtype, logprobs)?, stats))
}
