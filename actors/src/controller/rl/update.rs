//! The update stage of an RL step: the policy's and (PPO) the critic's updates on the
//! step's experience, concurrently; a divergence in either stops the step.

use super::experience::Experience;
use super::loss_config::{agg, policy_loss_config};
use super::seeds::sample_seed;
use crate::controller::context::Ctx;
use crate::controller::error::{At, DivergenceError, RunError};
use crate::controller::setup::Roles;
use crate::roles::{CriticWork, PolicyTrainSummary, PolicyWork};

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
        lr: rl.lr,
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
