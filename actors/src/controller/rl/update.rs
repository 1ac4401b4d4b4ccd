//! The update stage of an RL step: the policy's and (PPO) the critic's updates on the
//! step's experience, concurrently; a divergence in either stops the step.

use super::experience::Experience;
use super::loss_config::{agg, policy_loss_config};
use super::seeds::sample_seed;
use crate::controller::context::Ctx;
use crate::controller::error::{At, DivergenceError, RunError};
use crate::controller::setup::Roles;
use crate::recipe::{RlLrSchedule, RlSection};
use crate::roles::{CriticWork, PolicyTrainSummary, PolicyWork};
use oxalign_rlhf::optim::LrSchedule;

/// The policy's learning rate at RL step `step` (1-based) of `steps`, by `rl.lr_schedule`.
pub(crate) fn policy_lr(rl: &RlSection, step: u64, steps: u64) -> f64 {
    let (peak_lr, min_lr, warmup_steps, total_steps) = (rl.lr, 0.0, 0, steps);
    let schedule = match rl.lr_schedule {
        RlLrSchedule::Constant => LrSchedule::Constant { lr: rl.lr },
        RlLrSchedule::Linear => LrSchedule::WarmupLinear {
            peak_lr,
            min_lr,
            warmup_steps,
            total_steps,
        },
        RlLrSchedule::Cosine => LrSchedule::WarmupCosine {
            peak_lr,
            min_lr,
            warmup_steps,
            total_steps,
        },
    };
    schedule.lr_at(step.saturating_sub(1))
}

/// The update stage: the policy's and (PPO) the critic's updates on `exp`, concurrently.
/// Returns the policy's summary and the critic's value loss; a divergence in either stops
/// the step.
pub(crate) async fn update(
    ctx: &Ctx<'_>,
    roles: &Roles,
    step: u64,
    exp: &Experience,
    beta: f64,
) -> Result<(PolicyTrainSummary, Option<f64>), RunError> {
    let rl = &ctx.recipe.rl;
    let timed = |actor: &'static str, phase: &'static str| ctx.monitor.time(actor, phase, step);
    let shuffle_seed = sample_seed(ctx.recipe.run.seed ^ 0x5EED, step, 0);
    let policy_work = PolicyWork {
        batch: exp.batch.clone(),
        cfg: policy_loss_config(rl, beta),
        lr: policy_lr(rl, step, ctx.recipe.run.steps),
        epochs: rl.ppo_epochs,
        minibatch_size: rl.minibatch_size,
        shuffle_seed,
    };
    let policy_fut = async {
        let _t = timed("policy", "policy_train");
        roles.policy.train(policy_work).await
    };
    let critic_fut = async {
        let b = &exp.batch;
        let (Some(c), true) = (&roles.critic, b.old_values.is_some() && b.returns.is_some()) else {
            return Ok(None);
        };
        let _t = timed("critic", "critic_train");
        let work = CriticWork {
            batch: b.clone(),
            clip: Some(rl.value_clip),
            agg: agg(rl),
            lr: rl.critic_lr,
            max_grad_norm: rl.max_grad_norm,
            epochs: rl.ppo_epochs,
            minibatch_size: rl.minibatch_size,
            shuffle_seed,
        };
        c.train(work).await.map(Some)
    };
    let (ps, vl) = tokio::join!(policy_fut, critic_fut);
    let failed = RunError::at(At::Rl(step));
    let (ps, vl) = (ps.map_err(&failed)?, vl.map_err(&failed)?);
    let diverged = |role, phase, cause, lower| DivergenceError {
        role,
        phase,
        kind: crate::recipe::RunKind::Rl,
        step,
        cause,
        lower,
    };
    if let Some(cause) = ps.diverged.clone() {
        return Err(diverged("policy", "policy_train", cause, "rl.lr").into());
    }
    match vl {
        Some(c) => match c.diverged {
            Some(cause) => Err(diverged("critic", "critic_train", cause, "rl.critic_lr").into()),
            None => Ok((ps, Some(c.value_loss))),
        },
        None => Ok((ps, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rl(schedule: RlLrSchedule) -> RlSection {
        RlSection {
            lr: 1e-4,
            lr_schedule: schedule,
            ..RlSection::default()
        }
    }

    #[test]
    fn the_policy_lr_follows_the_schedule_over_the_run() {
        let c = rl(RlLrSchedule::Constant);
        assert_eq!(policy_lr(&c, 1, 100), 1e-4);
        assert_eq!(policy_lr(&c, 100, 100), 1e-4);
        // Step 1 trains at the peak; step 51 of 100 half way down; the last step is above 0.
        let l = rl(RlLrSchedule::Linear);
        assert_eq!(policy_lr(&l, 1, 100), 1e-4);
        assert!((policy_lr(&l, 51, 100) - 0.5e-4).abs() < 1e-12);
        assert!((policy_lr(&l, 100, 100) - 1e-6).abs() < 1e-12);
        let k = rl(RlLrSchedule::Cosine);
        assert_eq!(policy_lr(&k, 1, 100), 1e-4);
        assert!((policy_lr(&k, 51, 100) - 0.5e-4).abs() < 1e-12);
        let last = policy_lr(&k, 100, 100);
        assert!(last > 0.0 && last < 1e-7, "{last}");
    }
}
