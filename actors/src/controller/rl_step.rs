//! One RL step as a short pipeline over host data: rollout (the policy generates a
//! [`crate::batch::RolloutBatch`], or one generated ahead is taken), score (reference log-probs, rewards, values and old log-probs,
//! concurrently, into a [`ScoredBatch`]), experience (`rl_experience.rs`), update (policy and
//! critic concurrently), refit, report (`rl_report.rs`). No tensor crosses a message.

use super::divergence::{check_rollout, DivergenceError};
use super::rl_ahead::{check_staleness, take_or_generate, AheadPlan};
use super::rl_experience::{agg, experience, policy_loss_config, Experience};
use super::rl_refit::{self, RefitDone};
use super::rl_report::{self, StepOutcome, StepRow};
use super::rl_rollout::Rollout;
use super::run_error::{At, RunError};
use super::setup::Roles;
use super::{Ctx, LoopState};
use crate::batch::ScoredBatch;
use crate::recipe::EngineQuant;
use crate::roles::{split_state_values, CriticWork, PolicyTrainSummary, PolicyWork, RewardRequest};
use oxalign_rlhf::data::PromptSource;
use std::time::Instant;
use tokio::sync::oneshot;

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
/// them: `ro.rewards`), values (PPO) and, for a quantized engine or a stale batch
/// (`stale`), the trainer's log-probs of the rollout, concurrently.
async fn score(
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
    let trainer_scores_old = ctx.recipe.engine.quant != EngineQuant::None || stale;
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

/// What the score, experience and update stages of a step produced.
struct Trained {
    exp: Experience,
    policy: PolicyTrainSummary,
    value_loss: Option<f64>,
    score_secs: f64,
    train_secs: f64,
    /// When the update finished.
    done: Instant,
}

/// Stages 2-4 of step `step` on rollout `ro`: score, experience (a divergence of the
/// rollout itself stops the step here), update. `updating` is told when the update starts.
async fn score_and_update(
    ctx: &Ctx<'_>,
    roles: &Roles,
    step: u64,
    ro: Rollout,
    stale: bool,
    beta: f64,
    updating: oneshot::Sender<()>,
) -> Result<Trained, RunError> {
    let t_score = Instant::now();
    let scored = score(ctx, roles, ro, stale).await?;
    let score_secs = t_score.elapsed().as_secs_f64();
    let exp = experience(At::Rl(step), &ctx.recipe.rl, beta, scored, ctx.pad_id).await?;
    let guard = &ctx.recipe.guard;
    check_rollout(step, "kl", exp.stats.kl, guard.max_kl)?;
    check_rollout(step, "reward_mean", exp.stats.score_mean, f64::INFINITY)?;
    check_rollout(step, "adv_std", exp.stats.adv_std, f64::INFINITY)?;
    let t_train = Instant::now();
    let _ = updating.send(());
    let (policy, value_loss) = update(ctx, roles, step, &exp, beta).await?;
    Ok(Trained {
        exp,
        policy,
        value_loss,
        score_secs,
        train_secs: t_train.elapsed().as_secs_f64(),
        done: Instant::now(),
    })
}

/// The refit stage: the engine takes the updated weights as the next policy version,
/// verified before its next rollout (`rl_refit.rs`: inside the policy, or as buckets sent to
/// the engine role).
async fn refit(
    ctx: &Ctx<'_>,
    roles: &Roles,
    state: &mut LoopState,
    step: u64,
) -> Result<RefitDone, RunError> {
    state.policy_version += 1;
    let timer = ctx.monitor.time("policy", "refit", step);
    let done = rl_refit::refit(ctx.recipe, roles, state.policy_version)
        .await
        .map_err(RunError::at(At::Rl(step)))?;
    timer.finish();
    Ok(done)
}

/// Runs RL step `step` (1-based) from `state`, which it advances (policy version, data
/// position, KL controller, the batches generated ahead) once the step's updates and refit
/// succeeded. With `rl.max_staleness = k ≥ 1` the engine generates the next steps' batches
/// (`rl_ahead.rs`) while this one scores and trains. Returns what the step reports; the loop
/// sends it to the monitor (a replayed step is not reported again).
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

    // 1. Rollout: generated ahead during an earlier step, or now.
    let mut ahead = std::mem::take(&mut state.ahead);
    let (ro, gen_now_secs) =
        take_or_generate(ctx, roles, data, &mut ahead, state.data_position, step).await?;
    let staleness = check_staleness(&ro, state.policy_version, rl.max_staleness)?;
    let n = ro.batch.len();
    let (generated, gen_secs, correct) = (ro.generated, ro.gen_secs, ro.correct);
    let (gen_tokens, all_tokens) = (ro.gen_tokens, ro.all_tokens);
    let (prompts_drawn, dynamic) = (ro.prompts_drawn, ro.dynamic);
    let waiting: u64 = ahead.iter().map(|r| r.prompts_drawn).sum();
    let plan = AheadPlan::of(
        step,
        &ahead,
        state.data_position + prompts_drawn + waiting,
        rl.max_staleness,
        ctx.recipe.run.steps,
    );

    // 2-4. Score, experience, update. While the trainers update, the engine generates the
    // batches ahead: not during scoring, whose reference and trainer forwards it would only
    // slow down where they share cores.
    let beta = state.kl.beta();
    let stale = staleness > 0;
    let (updating, update_started) = oneshot::channel();
    let generate_ahead = async {
        // The update never started: the step fails, and nothing is generated ahead.
        let out = match update_started.await {
            Ok(()) => plan.generate(ctx, roles, data).await,
            Err(_) => Ok(Vec::new()),
        };
        (out, Instant::now())
    };
    let train = score_and_update(ctx, roles, step, ro, stale, beta, updating);
    let ((generated_ahead, ahead_done), trained) = tokio::join!(generate_ahead, train);
    let trained = trained?;
    let generated_ahead = match generated_ahead {
        Ok(batches) => batches,
        Err(e) => {
            // The update went through but the generation ahead failed: the trainers hold an
            // update that neither the engine nor the newest checkpoint has, so a replay must
            // rewind them (the loop sees the version move).
            state.policy_version += 1;
            return Err(e);
        }
    };
    let gen_wait_secs = gen_now_secs
        + ahead_done
            .saturating_duration_since(trained.done)
            .as_secs_f64();
    ahead.extend(generated_ahead);

    // 5. Refit, and the loop state moves on.
    let refit = refit(ctx, roles, state, step).await?;
    state.data_position += prompts_drawn;
    state.ahead = ahead;
    state
        .kl
        .update(trained.exp.stats.kl_seq, n as u64)
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
        exp: &trained.exp,
        policy: &trained.policy,
        value_loss: trained.value_loss,
        refit: &refit.report,
        refit_moved: refit.moved,
        policy_version: state.policy_version,
        data_position: state.data_position,
        staleness,
        step_secs: t0.elapsed().as_secs_f64(),
        gen_secs,
        gen_wait_secs,
        score_secs: trained.score_secs,
        train_secs: trained.train_secs,
    };
    Ok(rl_report::row(&outcome))
}
