//! The recipe's `[rl]` keys as the loss configuration the experience and update stages
//! hand to `oxalign-rlhf`: the policy loss, its aggregation, the KL estimator and the
//! rollout correction.

use crate::recipe::{
    KlEstimatorName, KlModeName, LossAggName, PolicyLossName, RlSection, RolloutCorrectionName,
};
use oxalign_rlhf::losses::{KlEstimator, LossAgg, PolicyObjective, PpoConfig, RolloutCorrection};
use oxalign_rlhf::trainer::PolicyLossConfig;

/// The recipe's rollout correction with its bounds.
pub(crate) fn rollout_correction(rl: &RlSection) -> RolloutCorrection {
    let (lower, upper) = rl.rollout_mask_band();
    match rl.rollout_correction() {
        RolloutCorrectionName::None => RolloutCorrection::None,
        // Validation refuses `token_tis` without a cap in force.
        RolloutCorrectionName::TokenTis => RolloutCorrection::TokenTis {
            cap: rl.tis_cap_in_force().unwrap_or(f64::INFINITY),
        },
        RolloutCorrectionName::SeqMask => RolloutCorrection::SeqMask { lower, upper },
        RolloutCorrectionName::Icepop => RolloutCorrection::Icepop { lower, upper },
    }
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
        objective: match rl.policy_loss {
            PolicyLossName::Ppo => PolicyObjective::Ppo,
            PolicyLossName::Gspo => PolicyObjective::Gspo,
            PolicyLossName::Cispo => PolicyObjective::Cispo,
        },
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
        rollout_correction: rollout_correction(rl),
        max_grad_norm: rl.max_grad_norm,
    }
}
