//! The experience of one RL step: from a [`ScoredBatch`] (host data) to the
//! [`ExperienceBatch`] both trainers learn from — advantages for the recipe's algorithm, KL in
//! the reward or in the loss — with the batch statistics and the engine/trainer log-prob
//! mismatch. The arithmetic is `oxalign-rlhf`'s, on CPU tensors, off the async runtime.

use super::loss_config::rollout_correction;
use super::shaping::RewardShaping;
use super::zero_variance::{group_spread, GroupSpread};
use crate::batch::{ExperienceBatch, ScoredBatch, TokenArray};
use crate::controller::error::{At, RunError};
use crate::error::Cause;
use crate::executor::ExecutorError;
use crate::recipe::{Algorithm, RlSection};
use candle_core::Device;
use oxalign_rlhf::advantages::{GaeBootstrap, GaeConfig};
use oxalign_rlhf::losses::{CorrectionStats, KlMode, RolloutCorrection};
use oxalign_rlhf::masked_abs_diff;
use oxalign_rlhf::trainer::{
    build_experience, AdvantageKind, CriticInputs, ExperienceConfig, ExperienceStats,
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
    /// What the rollout correction did over the whole batch, when one is on.
    pub correction: Option<CorrectionStats>,
    /// The groups whose scores were all equal, with group-relative advantages (GRPO,
    /// Dr. GRPO, RLOO); `None` for the others.
    pub spread: Option<GroupSpread>,
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
        Algorithm::Distill => AdvantageKind::Distill {
            reward_coef: rl.distill_reward_coef,
        },
    };
    ExperienceConfig {
        kind,
        group_size: rl.samples_per_prompt,
        kl_coef: if rl.kl_mode == KlMode::Reward {
            beta
        } else {
            0.0
        },
        kl_estimator: rl.kl_estimator,
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
    let shaping = RewardShaping::of(rl);
    let correction = rollout_correction(rl);
    tokio::task::spawn_blocking(move || build(scored, pad_id, &cfg, shaping, correction))
        .await
        .map_err(blocking_panic)
        .and_then(|r| r)
        .map_err(|e| RunError::controller(at, "experience", e))
}

fn build(
    scored: ScoredBatch,
    pad_id: u32,
    cfg: &ExperienceConfig,
    shaping: RewardShaping,
    correction: RolloutCorrection,
) -> Result<Experience, Cause> {
    let cpu = Device::Cpu;
    let (scores, truncated) = shaping.apply(&scored);
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
    let last = match (&scored.last_values, shaping.bootstrap_truncated) {
        (Some(l), true) => Some((
            candle_core::Tensor::from_slice(l, l.len(), &cpu)?,
            candle_core::Tensor::from_slice(&truncated, truncated.len(), &cpu)?,
        )),
        _ => None,
    };
    let critic = values.as_ref().map(|values| CriticInputs {
        values,
        bootstrap: last.as_ref().map(|(last_value, truncated)| GaeBootstrap {
            last_value,
            truncated,
        }),
    });
    let exp = build_experience(&scores, &old_lp, &ref_lp, critic, &mask, cfg)?;
    let spread = match cfg.kind {
        AdvantageKind::Grpo | AdvantageKind::DrGrpo | AdvantageKind::Rloo => {
            group_spread(&scores, cfg.group_size)
        }
        _ => None,
    };
    let mismatch = if scored.trainer_scored_old {
        Some(masked_abs_diff(&old_lp, &rollout_lp, &mask)?)
    } else {
        None
    };
    // The weights the update will apply, measured here over the whole batch (a row's weights
    // depend on that row only, so every minibatch sees the same ones).
    let correction = correction
        .weights(&old_lp, &rollout_lp, &mask)?
        .map(|(_, stats)| stats);
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
        correction,
        spread,
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
    use crate::batch::Finish;
    use crate::controller::rl::loss_config::policy_loss_config;
    use crate::recipe::Truncation;

    #[test]
    fn clip_high_defaults_to_clip_eps_and_follows_clip_eps_high() {
        let mut rl = RlSection::default();
        let c = policy_loss_config(&rl, 0.0).ppo;
        assert_eq!((c.clip_low, c.clip_high), (0.2, 0.2));
        rl.clip_eps_high = Some(0.28);
        let c = policy_loss_config(&rl, 0.0).ppo;
        assert_eq!((c.clip_low, c.clip_high), (0.2, 0.28));
    }

    fn sample(id: u64, response: Vec<u32>, finish: Finish) -> crate::batch::Sample {
        crate::batch::Sample {
            sample_id: id,
            group_id: id,
            prompt: vec![1, 2],
            logprobs: vec![-1.0; response.len()],
            response,
            finish,
            routing: None,
            observations: Vec::new(),
        }
    }

    /// With `truncated = "bootstrap"`, a response cut by the length limit is not scored and
    /// GAE bootstraps from the critic's value after it; one that stopped keeps its score.
    /// The overlong penalty lowers the score of a response that runs into the buffer.
    #[test]
    fn truncated_rows_bootstrap_and_long_rows_are_shaped() -> Result<(), Cause> {
        let rollout = crate::batch::RolloutBatch {
            policy_version: 0,
            samples: vec![
                sample(0, vec![5, 6, 7], Finish::Stop),
                sample(1, vec![5, 6, 8], Finish::Length),
            ],
        };
        let seqs = rollout.sequences(0);
        let values = seqs.place_response_values(&[vec![0.1, 0.2, 0.3], vec![0.1, 0.2, 0.3]]);
        let scored = ScoredBatch {
            rewards: vec![1.0, 1.0],
            ref_logprobs: seqs.place_response_values(&[vec![-1.0; 3], vec![-1.0; 3]]),
            old_logprobs: seqs.place_response_values(&[vec![-1.0; 3], vec![-1.0; 3]]),
            rollout_logprobs: seqs.place_response_values(&[vec![-1.0; 3], vec![-1.0; 3]]),
            values: Some(values),
            last_values: Some(vec![9.0, 0.5]),
            rollout,
            ..Default::default()
        };
        let mut rl = RlSection {
            gamma: 1.0,
            lam: 1.0,
            whiten_advantages: false,
            max_new_tokens: 3,
            truncated: Truncation::Bootstrap,
            ..RlSection::default()
        };
        let cfg = config(&rl, 0.0);
        let e = build(
            scored.clone(),
            0,
            &cfg,
            RewardShaping::of(&rl),
            RolloutCorrection::None,
        )?;
        let adv = e.batch.advantages;
        // Row 0 (stopped): 1 − V(s_last) = 1 − 0.3 at its last response token (column 3);
        // row 1 (cut off): score 0, bootstrap V = 0.5, so 0.5 − 0.3.
        assert!((adv.data()[3] - 0.7).abs() < 1e-6, "{:?}", adv.data());
        assert!(
            (adv.data()[adv.cols() + 3] - 0.2).abs() < 1e-6,
            "{:?}",
            adv.data()
        );
        // Terminal (the default): both rows scored, no bootstrap; a 2-token overlong buffer
        // on a 3-token budget with a penalty of 0.5 takes all 0.5 off a 3-token response.
        rl.truncated = Truncation::Terminal;
        rl.overlong_buffer = Some(2);
        rl.overlong_penalty = 0.5;
        let e = build(
            scored,
            0,
            &config(&rl, 0.0),
            RewardShaping::of(&rl),
            RolloutCorrection::None,
        )?;
        let adv = e.batch.advantages;
        assert!((adv.data()[3] - 0.2).abs() < 1e-6, "{:?}", adv.data());
        assert!(
            (adv.data()[adv.cols() + 3] - 0.2).abs() < 1e-6,
            "{:?}",
            adv.data()
        );
        Ok(())
    }
}
