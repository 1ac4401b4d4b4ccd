//! One RL step as a short pipeline over host data: rollout (the policy generates a
//! [`crate::batch::RolloutBatch`], or one generated ahead is taken), score (reference log-probs, rewards, values and old log-probs,
//! concurrently, into a [`ScoredBatch`]), experience (`experience.rs`), update (policy and
//! critic concurrently), refit, report (`report.rs`). No tensor crosses a message.

use super::ahead::{check_staleness, take_or_generate, AheadPlan};
use super::experience::{experience, Experience};
use super::logged_samples;
use super::refit::{self as rl_refit, RefitDone};
use super::report::{self as rl_report, StepOutcome, StepRow};
use super::rollout::Rollout;
use super::score::score;
use super::update::update;
use crate::controller::context::Ctx;
use crate::controller::error::{check_rollout, At, RunError};
use crate::controller::run::checkpoint::LoopState;
use crate::controller::setup::Roles;
use crate::monitor::StepSamples;
use crate::roles::PolicyTrainSummary;
use oxalign_data::PromptSource;
use std::time::Instant;
use tokio::sync::oneshot;

pub(crate) use rl_report::header;

/// What the score, experience and update stages of a step produced.
struct Trained {
    exp: Experience,
    policy: PolicyTrainSummary,
    value_loss: Option<f64>,
    score_secs: f64,
    train_secs: f64,
    /// The samples the step logs (`rl.log_samples`), with their rewards.
    samples: Option<StepSamples>,
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
    let picked = logged_samples::pick(&ro, ctx.recipe.rl.log_samples, ctx.tok);
    let scored = score(ctx, roles, ro, stale).await?;
    let samples = logged_samples::with_rewards(step, picked, &scored.rewards);
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
        samples,
        done: Instant::now(),
    })
}

/// The refit stage: the engine takes the updated weights as the next policy version,
/// verified before its next rollout (`refit.rs`: inside the policy, or as buckets sent to
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

/// Stages 2-4 of step `step` while, once the update starts, the engine generates the
/// batches `plan` asks for: not during scoring, whose reference and trainer forwards it
/// would only slow down where they share cores. Returns what the step trained, the batches
/// generated ahead and when that generation finished. When the update went through but the
/// generation ahead failed, the trainers hold an update that neither the engine nor the
/// newest checkpoint has: `version` moves on, so the loop's replay rewinds them.
#[allow(clippy::too_many_arguments)]
async fn train_while_generating_ahead(
    ctx: &Ctx<'_>,
    roles: &Roles,
    data: &dyn PromptSource,
    (step, version): (u64, &mut u64),
    ro: Rollout,
    stale: bool,
    beta: f64,
    plan: &AheadPlan,
) -> Result<(Trained, Vec<Rollout>, Instant), RunError> {
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
    let batches = generated_ahead.inspect_err(|_| *version += 1)?;
    Ok((trained, batches, ahead_done))
}

/// What to generate ahead during step `step`: the batches that `rl.max_staleness` allows,
/// drawing prompts after `next_position` and after those the batches already waiting drew.
fn plan_ahead(ctx: &Ctx<'_>, ahead: &[Rollout], next_position: u64, step: u64) -> AheadPlan {
    let waiting: u64 = ahead.iter().map(|r| r.prompts_drawn).sum();
    let (max_staleness, steps) = (ctx.recipe.rl.max_staleness, ctx.recipe.run.steps);
    AheadPlan::of(step, ahead, next_position + waiting, max_staleness, steps)
}

/// Runs RL step `step` (1-based) from `state`, which it advances (policy version, data
/// position, KL controller, the batches generated ahead) once the step's updates and refit
/// succeeded. With `rl.max_staleness = k ≥ 1` the engine generates the next steps' batches
/// (`ahead.rs`) while this one scores and trains. Returns what the step reports; the loop
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
    let (prompts_drawn, dynamic, episodes) = (ro.prompts_drawn, ro.dynamic, ro.episodes);
    let plan = plan_ahead(ctx, &ahead, state.data_position + prompts_drawn, step);

    // 2-4. Score, experience, update, while the engine generates the batches ahead.
    let beta = state.kl.beta();
    let version = &mut state.policy_version;
    let (trained, generated_ahead, ahead_done) = train_while_generating_ahead(
        ctx,
        roles,
        data,
        (step, version),
        ro,
        staleness > 0,
        beta,
        &plan,
    )
    .await?;
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
        episodes,
        correct,
        gen_tokens,
        all_tokens,
        beta,
        lr: super::update::policy_lr(&ctx.recipe.rl, step, ctx.recipe.run.steps),
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
    Ok(rl_report::row(&outcome).with_samples(trained.samples))
}
