//! From scored rollouts to training targets: KL-shaped rewards, then advantages (GAE, group
//! relative, RLOO or REINFORCE++) and critic returns.
//!
//! Inputs are already computed (policy/reference log-probs, values, scores); nothing here
//! runs a model. All `[B, T-1]` tensors align with next-token log-probs.

use super::scalar;
use crate::advantages::{
    distill_advantages, gae, group_relative_advantages, masked_whiten, reinforce_pp_advantages,
    rloo_advantages, GaeBootstrap, GaeConfig, GroupNorm, WhitenOptions,
};
use crate::losses::{kl_per_token, kl_shaped_rewards, KlEstimator};
use crate::mask::{broadcast_to_tokens, masked_mean};
use crate::Result;
use candle_core::{Tensor, D};

/// Which advantage estimator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AdvantageKind {
    /// GAE with a critic.
    Gae(GaeConfig),
    /// GRPO: (r − mean_g) / (std_g + ε).
    Grpo,
    /// Dr. GRPO: r − mean_g.
    DrGrpo,
    /// RLOO: r − mean of the other samples of the prompt.
    Rloo,
    /// REINFORCE++ with discount γ and global batch normalisation.
    ReinforcePp {
        /// Discount per token.
        gamma: f64,
    },
    /// On-policy distillation: `A_t = −(log π_old − log π_teacher)` per token, the teacher's
    /// log-probs in `ref_logprobs`, plus `reward_coef` times the batch-centred score.
    Distill {
        /// Weight of the task reward (0 = pure distillation).
        reward_coef: f64,
    },
}

/// How experience is built.
#[derive(Debug, Clone, Copy)]
pub struct ExperienceConfig {
    /// The estimator.
    pub kind: AdvantageKind,
    /// Samples per prompt (consecutive rows form a group).
    pub group_size: usize,
    /// KL-in-reward coefficient β (0 when the KL is a loss term).
    pub kl_coef: f64,
    /// KL estimator for the reward penalty and the reported KL.
    pub kl_estimator: KlEstimator,
    /// Whiten GAE and distillation advantages over the batch.
    pub whiten: bool,
}

/// Training targets for one rollout batch.
#[derive(Debug, Clone)]
pub struct Experience {
    /// `[B, T-1]` f32 advantages, 0 off the response.
    pub advantages: Tensor,
    /// `[B, T-1]` f32 critic targets (GAE only).
    pub returns: Option<Tensor>,
    /// Batch statistics.
    pub stats: ExperienceStats,
}

/// Statistics of a batch of experience.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ExperienceStats {
    /// Mean per-token KL(policy ‖ reference) over response tokens (the recipe's estimator).
    pub kl: f64,
    /// Mean over sequences of the summed per-token KL (nats per sequence): the unit of the
    /// adaptive KL controller's target (Ziegler et al. 2019).
    pub kl_seq: f64,
    /// Mean sequence score.
    pub score_mean: f64,
    /// Std of the sequence scores.
    pub score_std: f64,
    /// Mean advantage over response tokens.
    pub adv_mean: f64,
    /// Std of the advantage over response tokens.
    pub adv_std: f64,
}

/// What GAE needs from the critic.
#[derive(Debug, Clone, Copy)]
pub struct CriticInputs<'a> {
    /// `[B, T-1]` values V(s_t), aligned with next-token log-probs.
    pub values: &'a Tensor,
    /// Rows cut off by the length limit and the value after their last token: they
    /// bootstrap instead of ending (their score should then be 0: the response has not ended).
    /// `None` treats every row as terminated.
    pub bootstrap: Option<GaeBootstrap<'a>>,
}

/// Builds advantages (and returns) from sequence `scores` `[B]`, policy `logprobs` and
/// `ref_logprobs` `[B, T-1]`, the critic's values (GAE only) and the response `mask`.
pub fn build_experience(
    scores: &[f32],
    logprobs: &Tensor,
    ref_logprobs: &Tensor,
    critic: Option<CriticInputs<'_>>,
    mask: &Tensor,
    cfg: &ExperienceConfig,
) -> Result<Experience> {
    let device = logprobs.device();
    let score_t = Tensor::from_slice(scores, scores.len(), device)?;
    let kl = kl_per_token(logprobs, ref_logprobs, mask, cfg.kl_estimator)?;
    let kl_mean = scalar(&masked_mean(&kl, mask)?)?;
    let kl_seq = scalar(
        &(&kl * mask.to_dtype(kl.dtype())?)?
            .sum(D::Minus1)?
            .mean_all()?,
    )?;
    let batch = Batch {
        score_t: &score_t,
        logprobs,
        ref_logprobs,
        mask,
        kl: &kl,
    };
    let (advantages, returns) = match cfg.kind {
        AdvantageKind::Gae(g) => gae_advantages(&batch, critic, g, cfg)?,
        AdvantageKind::ReinforcePp { gamma } => {
            let rewards = shaped_rewards(&batch, cfg)?;
            (
                reinforce_pp_advantages(&rewards, mask, gamma, WhitenOptions::default())?
                    .advantages,
                None,
            )
        }
        AdvantageKind::Distill { reward_coef } => {
            // All-negative raw advantages push every sampled token down and the student's
            // entropy up; whitening subtracts a constant baseline (E[∇log π] = 0).
            let adv = distill_advantages(logprobs, ref_logprobs, mask, &score_t, reward_coef)?;
            (whiten_if(adv, mask, cfg.whiten)?, None)
        }
        AdvantageKind::Grpo | AdvantageKind::DrGrpo | AdvantageKind::Rloo => {
            (group_advantages(&batch, cfg)?, None)
        }
    };
    let stats = batch_stats(scores, &advantages, mask, kl_mean, kl_seq)?;
    Ok(Experience {
        advantages,
        returns,
        stats,
    })
}

/// The inputs every estimator reads: sequence scores `[B]`, and the `[B, T-1]` policy and
/// reference log-probs, response mask and per-token KL.
struct Batch<'a> {
    score_t: &'a Tensor,
    logprobs: &'a Tensor,
    ref_logprobs: &'a Tensor,
    mask: &'a Tensor,
    kl: &'a Tensor,
}

/// Per-token rewards `[B, T-1]`: the score on the last response token minus β·KL.
fn shaped_rewards(b: &Batch<'_>, cfg: &ExperienceConfig) -> Result<Tensor> {
    let (rewards, _) = kl_shaped_rewards(
        b.score_t,
        b.logprobs,
        b.ref_logprobs,
        b.mask,
        cfg.kl_coef,
        cfg.kl_estimator,
    )?;
    Ok(rewards)
}

/// `adv` whitened over the response tokens when `whiten`, else unchanged.
fn whiten_if(adv: Tensor, mask: &Tensor, whiten: bool) -> Result<Tensor> {
    Ok(if whiten {
        masked_whiten(&adv, mask, WhitenOptions::default())?
    } else {
        adv
    })
}

/// GAE advantages (whitened when configured) and critic returns, both `[B, T-1]`, over the
/// KL-shaped rewards; fails without critic values.
fn gae_advantages(
    b: &Batch<'_>,
    critic: Option<CriticInputs<'_>>,
    g: GaeConfig,
    cfg: &ExperienceConfig,
) -> Result<(Tensor, Option<Tensor>)> {
    let critic = critic
        .ok_or_else(|| crate::RlhfError::invalid("values", "none", "GAE needs critic values"))?;
    let rewards = shaped_rewards(b, cfg)?;
    let out = gae(&rewards, critic.values, b.mask, g, critic.bootstrap)?;
    let adv = whiten_if(out.advantages, b.mask, cfg.whiten)?;
    Ok((adv, Some(out.returns)))
}

/// GRPO, Dr. GRPO or RLOO advantages `[B, T-1]`: the group baseline of the scores broadcast
/// over the response, minus β times each token's KL still to come when β > 0.
fn group_advantages(b: &Batch<'_>, cfg: &ExperienceConfig) -> Result<Tensor> {
    // Scores are normalised within the group; a KL-in-reward penalty is not (dividing
    // β·KL by a near-zero group std would blow it up): each token is charged the KL
    // still to come in its sequence, as a γ = 1 return of per-token −β·kl rewards
    // (OpenRLHF's placement for group baselines).
    let per_seq = match cfg.kind {
        AdvantageKind::Grpo => {
            group_relative_advantages(b.score_t, cfg.group_size, GroupNorm::MeanStd, 1e-6)?
        }
        AdvantageKind::DrGrpo => {
            group_relative_advantages(b.score_t, cfg.group_size, GroupNorm::MeanOnly, 0.0)?
        }
        _ => rloo_advantages(b.score_t, cfg.group_size)?,
    };
    let adv = broadcast_to_tokens(&per_seq, b.mask)?;
    Ok(if cfg.kl_coef > 0.0 {
        let penalty = kl_to_go(b.kl, b.mask)?.affine(cfg.kl_coef, 0.0)?;
        (adv - penalty.to_dtype(b.score_t.dtype())?)?
    } else {
        adv
    })
}

/// The batch's statistics: the given KL means, mean and std of the scores (f64, population
/// std), and mean and std of the advantages over the response tokens.
fn batch_stats(
    scores: &[f32],
    advantages: &Tensor,
    mask: &Tensor,
    kl: f64,
    kl_seq: f64,
) -> Result<ExperienceStats> {
    let n = scores.len() as f64;
    let score_mean = scores.iter().map(|&s| s as f64).sum::<f64>() / n;
    let score_var = scores
        .iter()
        .map(|&s| (s as f64 - score_mean).powi(2))
        .sum::<f64>()
        / n;
    let adv_mean = scalar(&masked_mean(advantages, mask)?)?;
    let centred = (advantages.affine(1.0, -adv_mean)?.sqr())?;
    let adv_std = scalar(&masked_mean(&centred, mask)?)?.sqrt();
    Ok(ExperienceStats {
        kl,
        kl_seq,
        score_mean,
        score_std: score_var.sqrt(),
        adv_mean,
        adv_std,
    })
}

/// `Σ_{s ≥ t} m_s · kl_s` per row: the KL a token's sequence still carries from `t` on.
fn kl_to_go(kl: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let masked = (kl * mask.to_dtype(kl.dtype())?)?;
    let total = masked.sum_keepdim(D::Minus1)?;
    let before = (masked.cumsum(D::Minus1)? - &masked)?;
    Ok((total.broadcast_sub(&before)? * mask.to_dtype(kl.dtype())?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The adaptive controller's unit is nats per sequence: a response of 3 tokens at 0.1
    /// nats each carries 0.3, one of 1 token 0.1, so the batch's per-sequence KL is 0.2 while
    /// its per-token mean is 0.1.
    #[test]
    fn kl_is_reported_per_token_and_per_sequence() -> Result<()> {
        let dev = Device::Cpu;
        let mask = Tensor::new(&[[0f32, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]], &dev)?;
        let logprobs = Tensor::new(&[[-1f32, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]], &dev)?;
        let ref_logprobs = (&logprobs - 0.1)?;
        let cfg = ExperienceConfig {
            kind: AdvantageKind::Grpo,
            group_size: 2,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K1,
            whiten: false,
        };
        let e = build_experience(&[1.0, 0.0], &logprobs, &ref_logprobs, None, &mask, &cfg)?;
        assert!((e.stats.kl - 0.1).abs() < 1e-6, "{}", e.stats.kl);
        assert!((e.stats.kl_seq - 0.2).abs() < 1e-6, "{}", e.stats.kl_seq);
        Ok(())
    }

    /// GRPO with KL in the reward: the scores are normalised within the group, the KL
    /// penalty is not. A group whose scores differ by 1e-3 (std ~7e-4) used to turn a KL
    /// difference of 0.1 nats into an advantage gap of ~14; now the penalty stays β·KL.
    #[test]
    fn grpo_kl_in_reward_is_not_divided_by_the_group_std() -> Result<()> {
        let dev = Device::Cpu;
        let mask = Tensor::new(&[[1f32, 1.0], [1.0, 1.0]], &dev)?;
        let logprobs = Tensor::new(&[[-1f32, -1.0], [-1.0, -1.0]], &dev)?;
        // Row 0 carries 0.05 + 0.05 nats of k1 KL, row 1 none.
        let ref_logprobs = Tensor::new(&[[-1.05f32, -1.05], [-1.0, -1.0]], &dev)?;
        let cfg = ExperienceConfig {
            kind: AdvantageKind::Grpo,
            group_size: 2,
            kl_coef: 0.1,
            kl_estimator: KlEstimator::K1,
            whiten: false,
        };
        let e = build_experience(&[1.0, 1.001], &logprobs, &ref_logprobs, None, &mask, &cfg)?;
        let a: Vec<Vec<f32>> = e.advantages.to_vec2()?;
        // Group-normalised scores: ∓0.0005 / (std + 1e-6), std = 0.001/√2 (Bessel, n − 1).
        let base = (0.0005 / (0.001 / 2f64.sqrt() + 1e-6)) as f32;
        // Token 0 of row 0 still has 0.1 nats to come, token 1 has 0.05: β = 0.1.
        assert!((a[0][0] - (-base - 0.01)).abs() < 1e-4, "{a:?}");
        assert!((a[0][1] - (-base - 0.005)).abs() < 1e-4, "{a:?}");
        assert!(
            (a[1][0] - base).abs() < 1e-4 && (a[1][1] - base).abs() < 1e-4,
            "{a:?}"
        );
        Ok(())
    }
}
