//! The experience of one RL step: from a [`ScoredBatch`] (host data) to the
//! [`ExperienceBatch`] both trainers learn from — advantages for the recipe's algorithm, KL in
//! the reward or in the loss — with the batch statistics and the engine/trainer log-prob
//! mismatch. The arithmetic is `oxalign-rlhf`'s, on CPU tensors, off the async runtime.

use super::run_error::{At, RunError};
use crate::batch::{ExperienceBatch, ScoredBatch, TokenArray};
use crate::error::Cause;
use crate::executor::ExecutorError;
use crate::recipe::{Algorithm, KlEstimatorName, KlModeName, LossAggName, RlSection};
use candle_core::Device;
use oxalign_rlhf::advantages::GaeConfig;
use oxalign_rlhf::losses::{KlEstimator, LossAgg, PpoConfig};
use oxalign_rlhf::masked_abs_diff;
use oxalign_rlhf::trainer::{
    build_experience, AdvantageKind, ExperienceConfig, ExperienceStats, PolicyLossConfig,
};

/// The experience stage's output.
pub(crate) struct Experience {
    /// What the trainers learn from.
    pub batch: ExperienceBatch,
    /// KL, score and advantage statistics.
    pub stats: ExperienceStats,
    /// Mean and max `|trainer - engine|` log-prob over the response tokens (nats), when the
    /// trainer scored the whole rollout (a quantized engine); else the update measures it.
    pub mismatch: Option<(f64, f64)>,
}

/// The recipe's KL estimator.
pub(crate) fn estimator(e: KlEstimatorName) -> KlEstimator {
    match e {
        KlEstimatorName::K1 => KlEstimator::K1,
        KlEstimatorName::K2 => KlEstimator::K2,
        KlEstimatorName::K3 => KlEstimator::K3,
    }
}

/// The recipe's loss aggregation (Dr. GRPO's horizon is `rl.max_new_tokens`).
pub(crate) fn agg(rl: &RlSection) -> LossAgg {
    match rl.loss_agg() {
        LossAggName::TokenMean => LossAgg::TokenMean,
        LossAggName::SeqMeanTokenSum => LossAgg::SeqMeanTokenSum,
        LossAggName::SeqMeanTokenMean => LossAgg::SeqMeanTokenMean,
        LossAggName::SeqMeanTokenSumNorm => LossAgg::SeqMeanTokenSumNorm {
            horizon: rl.max_new_tokens,
        },
    }
}

/// The experience settings of `rl` with KL coefficient `beta`.
/// The policy's loss settings for a step with KL coefficient `beta`: the clip range is
/// `[1 − clip_eps, 1 + clip_eps_high]` (DAPO's clip-higher when `clip_eps_high` is set).
pub(crate) fn policy_loss_config(rl: &RlSection, beta: f64) -> PolicyLossConfig {
    PolicyLossConfig {
        ppo: PpoConfig {
            clip_low: rl.clip_eps,
            clip_high: rl.clip_eps_high.unwrap_or(rl.clip_eps),
            dual_clip: rl.dual_clip,
            agg: agg(rl),
        },
        kl_loss_coef: if rl.kl_mode == KlModeName::Loss {
            beta
        } else {
            0.0
        },
        kl_estimator: estimator(rl.kl_estimator),
        entropy_coef: rl.entropy_coef,
        tis_cap: rl.tis_cap,
        max_grad_norm: rl.max_grad_norm,
    }
}

fn config(rl: &RlSection, beta: f64) -> ExperienceConfig {
    let kind = match rl.algorithm {
        Algorithm::Ppo => AdvantageKind::Gae(GaeConfig {
            gamma: rl.gamma,
            lambda: rl.lam,
        }),
        Algorithm::Grpo => AdvantageKind::Grpo,
        Algorithm::DrGrpo => AdvantageKind::DrGrpo,
        Algorithm::Rloo => AdvantageKind::Rloo,
        Algorithm::ReinforcePp => AdvantageKind::ReinforcePp { gamma: rl.gamma },
    };
    ExperienceConfig {
        kind,
        group_size: rl.samples_per_prompt,
        kl_coef: if rl.kl_mode == KlModeName::Reward {
            beta
        } else {
            0.0
        },
        kl_estimator: estimator(rl.kl_estimator),
        whiten: rl.whiten_advantages,
    }
}

/// Builds the experience of `scored` (token ids padded with `pad_id`) on a blocking thread.
pub(crate) async fn experience(
    at: At,
    rl: &RlSection,
    beta: f64,
    scored: ScoredBatch,
    pad_id: u32,
) -> Result<Experience, RunError> {
    let cfg = config(rl, beta);
    tokio::task::spawn_blocking(move || build(scored, pad_id, &cfg))
        .await
        .map_err(blocking_panic)
        .and_then(|r| r)
        .map_err(|e| RunError::controller(at, "experience", e))
}

fn build(scored: ScoredBatch, pad_id: u32, cfg: &ExperienceConfig) -> Result<Experience, Cause> {
    let cpu = Device::Cpu;
    let seqs = scored.rollout.sequences(pad_id);
    let mask = seqs.batch(&cpu)?.response_mask;
    let old_lp = scored.old_logprobs.to_tensor(&cpu)?;
    let ref_lp = scored.ref_logprobs.to_tensor(&cpu)?;
    let rollout_lp = scored.rollout_logprobs.to_tensor(&cpu)?;
    let values = scored
        .values
        .as_ref()
        .map(|v| v.to_tensor(&cpu))
        .transpose()?;
    let exp = build_experience(
        &scored.rewards,
        &old_lp,
        &ref_lp,
        values.as_ref(),
        &mask,
        cfg,
    )?;
    let mismatch = if scored.trainer_scored_old {
        Some(masked_abs_diff(&old_lp, &rollout_lp, &mask)?)
    } else {
        None
    };
    let returns = exp
        .returns
        .as_ref()
        .map(TokenArray::from_tensor)
        .transpose()?;
    let batch = ExperienceBatch {
        seqs,
        policy_version: scored.rollout.policy_version,
        old_logprobs: scored.old_logprobs,
        advantages: TokenArray::from_tensor(&exp.advantages)?,
        ref_logprobs: scored.ref_logprobs,
        rollout_logprobs: scored.rollout_logprobs,
        old_values: scored.values,
        returns,
    };
    Ok(Experience {
        batch,
        stats: exp.stats,
        mismatch,
    })
}

/// A panic of a blocking task as a typed cause.
fn blocking_panic(e: tokio::task::JoinError) -> Cause {
    Cause::Executor(ExecutorError::Panicked {
        device: "the blocking pool".into(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_high_defaults_to_clip_eps_and_follows_clip_eps_high() {
        let mut rl = RlSection::default();
        let c = policy_loss_config(&rl, 0.0).ppo;
        assert_eq!((c.clip_low, c.clip_high), (0.2, 0.2));
        rl.clip_eps_high = Some(0.28);
        let c = policy_loss_config(&rl, 0.0).ppo;
        assert_eq!((c.clip_low, c.clip_high), (0.2, 0.28));
    }
}
