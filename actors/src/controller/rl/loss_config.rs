//! The recipe's `[rl]` keys as the loss configuration the experience and update stages
//! hand to `oxalign-rlhf`: the policy loss, its aggregation and the rollout correction, each
//! built from the library's own kinds with the bounds other keys give.

use crate::recipe::RlSection;
use oxalign_rlhf::losses::{KlMode, LossAgg, PpoConfig, RolloutCorrection};
use oxalign_rlhf::trainer::PolicyLossConfig;

/// The recipe's rollout correction with its bounds.
pub(crate) fn rollout_correction(rl: &RlSection) -> RolloutCorrection {
    // Validation refuses `token_tis` without a cap in force.
    let cap = rl.tis_cap_in_force().unwrap_or(f64::INFINITY);
    rl.rollout_correction()
        .with_bounds(cap, rl.rollout_mask_band())
}

/// The recipe's loss aggregation (Dr. GRPO's horizon is `rl.max_new_tokens`).
pub(crate) fn agg(rl: &RlSection) -> LossAgg {
    rl.loss_agg().with_horizon(rl.max_new_tokens)
}

/// The policy's loss settings for a step with KL coefficient `beta`: the clip range is
/// `[1 − clip_eps, 1 + clip_eps_high]` (DAPO's clip-higher when `clip_eps_high` is set).
pub(crate) fn policy_loss_config(rl: &RlSection, beta: f64) -> PolicyLossConfig {
    PolicyLossConfig {
        objective: rl.policy_loss,
        ppo: PpoConfig {
            clip_low: rl.clip_eps,
            clip_high: rl.clip_eps_high.unwrap_or(rl.clip_eps),
            dual_clip: rl.dual_clip,
            agg: agg(rl),
        },
        kl_loss_coef: if rl.kl_mode == KlMode::Loss {
            beta
        } else {
            0.0
        },
        kl_estimator: rl.kl_estimator,
        entropy_coef: rl.entropy_coef,
        rollout_correction: rollout_correction(rl),
        max_grad_norm: rl.max_grad_norm,
    }
}
