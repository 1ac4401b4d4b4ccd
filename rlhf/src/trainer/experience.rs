//! From scored rollouts to training targets: KL-shaped rewards, then advantages (GAE, group
//! relative, RLOO or REINFORCE++) and critic returns.
//!
//! Inputs are already computed (policy/reference log-probs, values, scores); nothing here
//! runs a model. All `[B, T-1]` tensors align with next-token log-probs.

use super::scalar;
use crate::advantages::{
    gae, group_relative_advantages, masked_whiten, reinforce_pp_advantages, rloo_advantages,
    GaeConfig, GroupNorm, WhitenOptions,
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
    /// Whiten GAE advantages over the batch.
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
    /// Mean per-token KL(policy ‖ reference) over response tokens.
    pub kl: f64,
    /// Mean sequence score.
    pub score_mean: f64,
    /// Std of the sequence scores.
    pub score_std: f64,
    /// Mean advantage over response tokens.
    pub adv_mean: f64,
    /// Std of the advantage over response tokens.
    pub adv_std: f64,
}

/// Builds advantages (and returns) from sequence `scores` `[B]`, policy `logprobs` and
/// `ref_logprobs` `[B, T-1]`, critic `values` `[B, T-1]` (GAE only) and the response `mask`.
pub fn build_experience(
    scores: &[f32],
    logprobs: &Tensor,
    ref_logprobs: &Tensor,
    values: Option<&Tensor>,
    mask: &Tensor,
    cfg: &ExperienceConfig,
) -> Result<Experience> {
    let device = logprobs.device();
    let score_t = Tensor::from_slice(scores, scores.len(), device)?;
    let kl = kl_per_token(logprobs, ref_logprobs, mask, cfg.kl_estimator)?;
    let kl_mean = scalar(&masked_mean(&kl, mask)?)?;
    let (advantages, returns) = match cfg.kind {
        AdvantageKind::Gae(g) => {
            let values = values.ok_or_else(|| {
                crate::RlhfError::invalid("values", "none", "GAE needs critic values")
            })?;
            let (rewards, _) = kl_shaped_rewards(
                &score_t,
                logprobs,
                ref_logprobs,
                mask,
                cfg.kl_coef,
                cfg.kl_estimator,
            )?;
            let out = gae(&rewards, values, mask, g, None)?;
            let adv = if cfg.whiten {
                masked_whiten(&out.advantages, mask, WhitenOptions::default())?
            } else {
                out.advantages
            };
            (adv, Some(out.returns))
        }
        AdvantageKind::ReinforcePp { gamma } => {
            let (rewards, _) = kl_shaped_rewards(
                &score_t,
                logprobs,
                ref_logprobs,
                mask,
                cfg.kl_coef,
                cfg.kl_estimator,
            )?;
            (
                reinforce_pp_advantages(&rewards, mask, gamma, WhitenOptions::default())?
                    .advantages,
                None,
            )
        }
        AdvantageKind::Grpo | AdvantageKind::DrGrpo | AdvantageKind::Rloo => {
            // A KL-in-reward penalty on group methods charges each sequence its summed KL.
            let seq_kl = (kl.to_dtype(score_t.dtype())? * mask.to_dtype(score_t.dtype())?)?
                .sum(D::Minus1)?;
            let shaped = (&score_t - seq_kl.affine(cfg.kl_coef, 0.0)?)?;
            let per_seq = match cfg.kind {
                AdvantageKind::Grpo => {
                    group_relative_advantages(&shaped, cfg.group_size, GroupNorm::MeanStd, 1e-6)?
                }
                AdvantageKind::DrGrpo => {
                    group_relative_advantages(&shaped, cfg.group_size, GroupNorm::MeanOnly, 0.0)?
                }
                _ => rloo_advantages(&shaped, cfg.group_size)?,
            };
            (broadcast_to_tokens(&per_seq, mask)?, None)
        }
    };
    let n = scores.len() as f64;
    let score_mean = scores.iter().map(|&s| s as f64).sum::<f64>() / n;
    let score_var = scores
        .iter()
        .map(|&s| (s as f64 - score_mean).powi(2))
        .sum::<f64>()
        / n;
    let adv_mean = scalar(&masked_mean(&advantages, mask)?)?;
    let centred = (advantages.affine(1.0, -adv_mean)?.sqr())?;
    let adv_std = scalar(&masked_mean(&centred, mask)?)?.sqrt();
    Ok(Experience {
        advantages,
        returns,
        stats: ExperienceStats {
            kl: kl_mean,
            score_mean,
            score_std: score_var.sqrt(),
            adv_mean,
            adv_std,
        },
    })
}
