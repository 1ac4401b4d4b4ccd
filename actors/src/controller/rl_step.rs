//! One RL step as a short pipeline over host data: rollout (the policy generates a
//! [`RolloutBatch`]), score (reference log-probs, rewards, values and old log-probs,
//! concurrently, into a [`ScoredBatch`]), experience (`rl_experience.rs`), update (policy and
//! critic concurrently), refit, report (`rl_report.rs`). No tensor crosses a message.

use super::divergence::{check_rollout, DivergenceError};
use super::rl_experience::{agg, experience, policy_loss_config, Experience};
use super::rl_report::{self, StepOutcome, StepRow};
use super::rl_rollout::{rollout, RowTexts};
use super::run_error::{At, RunError};
use super::setup::Roles;
use super::{Ctx, LoopState};
use crate::batch::{RolloutBatch, ScoredBatch};
use crate::recipe::EngineQuant;
use crate::roles::{
    ask, split_state_values, CriticMsg, CriticWork, PolicyMsg, PolicyTrainSummary, PolicyWork,
    ReferenceMsg, RewardMsg,
};
use oxalign_rlhf::data::PromptSource;
use std::time::Instant;

pub(crate) use rl_report::header;

/// Per-sample sampling seed: a pure function of run seed, step and sample index, so a
/// resumed run samples exactly what the uninterrupted run would have.
pub(super) fn sample_seed(seed: u64, step: u64, index: usize) -> u64 {
    let mut x = seed
        ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (index as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x.wrapping_mul(0x94D0_49BB_1331_11EB)
}

/// The score stage: reference log-probs, rewards (unless dynamic sampling already scored
/// them: `known_rewards`), values (PPO) and, for a quantized engine, the trainer's log-probs
/// of `rollout`, concurrently.
async fn score(
    ctx: &Ctx<'_>,
    roles: &Roles,
    step: u64,
    rollout: RolloutBatch,
    texts: Vec<String>,
    rows: RowTexts,
    known_rewards: Option<Vec<f32>>,
) -> Result<ScoredBatch, RunError> {
    let seqs = rollout.sequences(ctx.pad_id);
    let timed = |actor: &'static str, phase: &'static str| ctx.monitor.time(actor, phase, step);
    let ref_fut = async {
        let _t = timed("reference", "reference_logprobs");
        ask(
            "reference",
            "reference_logprobs",
            &roles.reference,
            ctx.timeout,
            |reply| ReferenceMsg::Logprobs {
                seqs: seqs.clone(),
                reply,
            },
        )
        .await
    };
    let reward_fut = async {
        if let Some(r) = known_rewards {
            return Ok(r);
        }
        let _t = timed("reward", "reward");
        ask("reward", "reward", &roles.reward, ctx.timeout, |reply| {
            RewardMsg::Score {
                seqs: seqs.clone(),
                prompts: rows.prompts,
                texts,
                answers: rows.answers,
                reply,
            }
        })
        .await
    };
    let values_fut = async {
        let Some(c) = &roles.critic else {
            return Ok(None);
        };
        let _t = timed("critic", "values");
        ask("critic", "values", c, ctx.timeout, |reply| {
            CriticMsg::Values {
                seqs: seqs.clone(),
                reply,
            }
        })
        .await
        .map(|full| Some(split_state_values(&full, &seqs)))
    };
    // π_old's log-probs: an f32 engine already reported them while sampling (the trainer's
    // weights in the trainer's precision; the update measures the gap on its first
    // minibatch), so only a quantized engine needs the trainer to score the rollout again.
    let trainer_scores_old = ctx.recipe.engine.quant != EngineQuant::None;
    let old_fut = async {
        if !trainer_scores_old {
            return Ok(None);
        }
        let _t = timed("policy", "old_logprobs");
        ask(
            "policy",
            "old_logprobs",
            &roles.policy,
            ctx.timeout,
            |reply| PolicyMsg::Logprobs {
                seqs: seqs.clone(),
                reply,
            },
        )
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

/// The update stage: the policy's and (PPO) the critic's updates on `exp`, concurrently.
/// Returns the policy's summary and the critic's value loss; a divergence in either stops
/// the step.
async fn update(
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
        ask(
            "policy",
            "policy_train",
            &roles.policy,
            ctx.timeout,
            |reply| PolicyMsg::Train {
                work: Box::new(policy_work),
                reply,
            },
        )
        .await
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
        ask("critic", "critic_train", c, ctx.timeout, |reply| {
            CriticMsg::Train {
                work: Box::new(work),
                reply,
            }
        })
        .await
        .map(Some)
    };
    let (ps, vl) = tokio::join!(policy_fut, critic_fut);
    let failed = RunError::at(At::Rl(step));
    let (ps, vl) = (ps.map_err(&failed)?, vl.map_err(&failed)?);
    let diverged = |role, phase, cause, lower| DivergenceError {
        role,
        phase,
        sft: false,
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

/// Runs RL step `step` (1-based) from `state`, which it advances (policy version, data
/// position, KL controller) once the step's updates and refit succeeded. Returns what the
/// step reports; the loop sends it to the monitor (a replayed step is not reported again).
pub(crate) async fn run_step(
    ctx: &Ctx<'_>,
    roles: &Roles,
    data: &dyn PromptSource,
    state: &mut LoopState,
    step: u64,
) -> Result<StepRow, RunError> {
    let at = At::Rl(step);
    let rl = &ctx.recipe.rl;
    let t0 = Instant::now();

    // 1. Rollout (with dynamic sampling, rounds of generation and rewards).
    let ro = rollout(ctx, roles, data, state.data_position, step).await?;
    let n = ro.batch.len();
    let (generated, gen_secs, correct) = (ro.generated, ro.gen_secs, ro.correct);
    let (gen_tokens, all_tokens) = (ro.gen_tokens, ro.all_tokens);
    let (prompts_drawn, dynamic) = (ro.prompts_drawn, ro.dynamic);

    // 2. Score, 3. experience; divergence of the rollout itself stops the step here.
    let t_score = Instant::now();
    let scored = score(ctx, roles, step, ro.batch, ro.texts, ro.rows, ro.rewards).await?;
    let score_secs = t_score.elapsed().as_secs_f64();
    let beta = state.kl.beta();
    let exp = experience(at, rl, beta, scored, ctx.pad_id).await?;
    let guard = &ctx.recipe.guard;
    check_rollout(step, "kl", exp.stats.kl, guard.max_kl)?;
    check_rollout(step, "reward_mean", exp.stats.score_mean, f64::INFINITY)?;
    check_rollout(step, "adv_std", exp.stats.adv_std, f64::INFINITY)?;

    // 4. Update, 5. refit: the engine takes the new weights, verified before the next rollout.
    let t_train = Instant::now();
    let (policy, value_loss) = update(ctx, roles, step, &exp, beta).await?;
    let train_secs = t_train.elapsed().as_secs_f64();
    state.policy_version += 1;
    let timer = ctx.monitor.time("policy", "refit", step);
    let version = state.policy_version;
    let refit = ask("policy", "refit", &roles.policy, ctx.timeout, |reply| {
        PolicyMsg::Refit { version, reply }
    })
    .await
    .map_err(RunError::at(at))?;
    timer.finish();
    state.data_position += prompts_drawn;
    state
        .kl
        .update(exp.stats.kl_seq, n as u64)
        .map_err(|e| RunError::controller(at, "kl_controller", e))?;

    // 6. Report.
    let outcome = StepOutcome {
        step,
        samples: n,
        generated,
        dynamic,
        correct,
        gen_tokens,
        all_tokens,
        beta,
        exp: &exp,
        policy: &policy,
        value_loss,
        refit: &refit,
        policy_version: state.policy_version,
        data_position: state.data_position,
        step_secs: t0.elapsed().as_secs_f64(),
        gen_secs,
        score_secs,
        train_secs,
    };
    Ok(rl_report::row(&outcome))
}
