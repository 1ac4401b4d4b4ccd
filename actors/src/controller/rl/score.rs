//! The score stage of an RL step: reference log-probs, rewards, values (PPO) and, when the
//! engine's own log-probs cannot serve as π_old, the trainer's log-probs of the rollout,
//! concurrently, into a [`ScoredBatch`].

use super::rollout::Rollout;
use crate::batch::ScoredBatch;
use crate::controller::context::Ctx;
use crate::controller::error::{At, RunError};
use crate::controller::setup::Roles;
use crate::roles::{split_state_values, RewardRequest};
use oxalign_models::engine::QuantMode;

/// The score stage: reference log-probs, rewards (unless dynamic sampling already scored
/// them: `ro.rewards`), values (PPO) and, for a quantized engine or a stale batch
/// (`stale`), the trainer's log-probs of the rollout, concurrently.
pub(crate) async fn score(
    ctx: &Ctx<'_>,
    roles: &Roles,
    ro: Rollout,
    stale: bool,
) -> Result<ScoredBatch, RunError> {
    let Rollout {
        step,
        batch: rollout,
        texts,
        rows,
        rewards: known_rewards,
        ..
    } = ro;
    let seqs = rollout.sequences(ctx.pad_id);
    let timed = |actor: &'static str, phase: &'static str| ctx.monitor.time(actor, phase, step);
    let ref_fut = async {
        let _t = timed("reference", "reference_logprobs");
        roles
            .reference
            .logprobs("reference_logprobs", seqs.clone())
            .await
    };
    let reward_fut = async {
        if let Some(r) = known_rewards {
            return Ok(r);
        }
        let _t = timed("reward", "reward");
        let request = RewardRequest {
            seqs: seqs.clone(),
            prompts: rows.prompts,
            texts,
            answers: rows.answers,
            columns: rows.columns,
        };
        roles.reward.rewards(request).await
    };
    let values_fut = async {
        let Some(c) = &roles.critic else {
            return Ok(None);
        };
        let _t = timed("critic", "values");
        c.values(seqs.clone())
            .await
            .map(|full| Some(split_state_values(&full, &seqs)))
    };
    // π_old's log-probs: an f32 engine already reported them while sampling an on-policy
    // batch (the trainer's weights in the trainer's precision; the update measures the gap
    // on its first minibatch), so only a quantized engine or a batch from an older version
    // (the engine's log-probs are then the behaviour policy's) needs the trainer to score it.
    let trainer_scores_old = ctx.recipe.engine.quant != QuantMode::None || stale;
    let old_fut = async {
        if !trainer_scores_old {
            return Ok(None);
        }
        let _t = timed("policy", "old_logprobs");
        roles
            .policy
            .logprobs("old_logprobs", seqs.clone())
            .await
            .map(Some)
    };
    let (ref_lp, rewards, values, old_lp) = tokio::join!(ref_fut, reward_fut, values_fut, old_fut);
    let failed = RunError::at(At::Rl(step));
    let engine_lp: Vec<Vec<f32>> = rollout.samples.iter().map(|s| s.logprobs.clone()).collect();
    let rollout_logprobs = seqs.place_response_values(&engine_lp);
    let (values, last_values) = values.map_err(&failed)?.unzip();
    Ok(ScoredBatch {
        old_logprobs: old_lp
            .map_err(&failed)?
            .unwrap_or_else(|| rollout_logprobs.clone()),
        trainer_scored_old: trainer_scores_old,
        rollout_logprobs,
        rollout,
        rewards: rewards.map_err(&failed)?,
        ref_logprobs: ref_lp.map_err(&failed)?,
        values,
        last_values,
    })
}
