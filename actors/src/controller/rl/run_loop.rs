//! The RL loop: runs steps until `run.steps`, reports each step once (with its `restarts`),
//! checkpoints every `run.checkpoint_every` steps and after the last, and supervises the roles:
//! a step whose role failed, or a checkpoint whose save a role failed, is replayed from the
//! newest checkpoint after the roles are rebuilt (`supervisor.rs`: what is retried, what is
//! rebuilt, the restart budget), within the restart budget. It sets the running step on the
//! fault plan (`faults.rs`), so `[[faults]]` fire only inside RL steps.

use super::heldout;
use super::logged_samples;
use super::report::StepRow;
use super::step as rl_step;
use super::zero_variance::ZeroVarianceWatch;
use crate::controller::clock::WallClock;
use crate::controller::context::Ctx;
use crate::controller::error::{At, RunError};
use crate::controller::progress;
use crate::controller::run::checkpoint::LoopState;
use crate::controller::run::retry::save_checkpoint_retried;
use crate::controller::setup::Roles;
use crate::controller::supervisor::{self, Budget};
use crate::executor::ExecutorPool;
use crate::monitor::ActorUpdate;
use crate::recipe::Algorithm;
use oxalign_data::PromptSource;
use std::path::PathBuf;

/// The name of the per-step restart count in `metrics.jsonl`: restarts since the previous
/// step's line (0 on a clean step).
pub(crate) const RESTARTS: &str = "restarts";

/// A policy spawned from a checkpoint has an engine (its own, or the engine role) at version
/// 0 serving the checkpoint's weights: it refits (verified) as `state.policy_version`, so the batches it generates
/// carry their true version (`rl.max_staleness` checks it). A no-op at the start of RL.
async fn label_engine_weights(
    ctx: &Ctx<'_>,
    roles: &Roles,
    state: &LoopState,
) -> Result<(), RunError> {
    let version = state.policy_version;
    if version == 0 {
        return Ok(());
    }
    super::refit::refit(ctx.recipe, roles, version)
        .await
        .map(|_| ())
        .map_err(RunError::at(At::Rl(state.step + 1)))
}

/// The newest checkpoint: its folder, RL step and policy version.
struct Newest {
    dir: PathBuf,
    step: u64,
    version: u64,
}

/// Runs RL steps until `run.steps`, checkpointing every `run.checkpoint_every` steps and at
/// the end; returns the newest checkpoint folder. `roles` may be rebuilt on the way: after a
/// role failed in a step, or in writing a checkpoint (a worker lost while saving).
pub(crate) async fn rl_loop(
    ctx: &Ctx<'_>,
    pool: &ExecutorPool,
    roles: &mut Roles,
    data: &dyn PromptSource,
    state: &mut LoopState,
    clock: WallClock,
) -> Result<Option<PathBuf>, RunError> {
    let recipe = ctx.recipe;
    let mut newest = Newest {
        dir: state.checkpoint_dir(ctx.run_dir),
        step: state.step,
        version: state.policy_version,
    };
    let progress = progress::Progress::new(recipe.run.steps, state.step, ctx.quiet);
    if state.step < recipe.run.steps {
        progress.line(&rl_step::header());
    }
    label_engine_weights(ctx, roles, state).await?;
    let mut budget = Budget::new(&recipe.supervision);
    // Steps up to `reported` have their metrics line; a replay runs them again silently.
    let mut reported = state.step;
    let mut restarts = 0u32;
    let mut zero_variance = ZeroVarianceWatch::default();
    while state.step < recipe.run.steps {
        let step = state.step + 1;
        ctx.monitor
            .report(ActorUpdate::working("controller", format!("step {step}")));
        pool.faults().set_step(step);
        let row = match rl_step::run_step(ctx, roles, data, state, step).await {
            Ok(row) => row,
            Err(e) => {
                recover(ctx, pool, roles, state, &mut budget, &newest, step, e).await?;
                restarts += 1;
                continue;
            }
        };
        state.record_reward(row.reward_mean);
        state.step = step;
        if step > reported {
            let group = recipe.rl.samples_per_prompt;
            if let Some(w) = zero_variance.observe(step, row.spread, group) {
                progress.warn(&w);
            }
            let reported_now = report_step(ctx, roles, data, &progress, (step, restarts), row);
            if let Err(e) = reported_now.await {
                recover(ctx, pool, roles, state, &mut budget, &newest, step, e).await?;
                restarts += 1;
                continue;
            }
            (reported, restarts) = (step, 0);
        }
        let every = recipe.run.checkpoint_every;
        if (every > 0 && step.is_multiple_of(every)) || step == recipe.run.steps {
            state.wall_seconds = clock.now();
            let saved =
                save_checkpoint_retried(ctx, roles.policy.as_ref(), roles.critic.as_deref(), state)
                    .await;
            match saved {
                Ok(dir) => {
                    newest = Newest {
                        dir,
                        step,
                        version: state.policy_version,
                    }
                }
                Err(e) => {
                    // Counted on the next step's line (this one is reported already).
                    recover(ctx, pool, roles, state, &mut budget, &newest, step, e).await?;
                    restarts += 1;
                }
            }
        }
    }
    pool.faults().set_step(0);
    progress.finish();
    Ok(Some(newest.dir))
}

/// Reports step `step` once, with `restarts` since the previous line: its held-out accuracy
/// when `rl.eval_every` measures it (`heldout.rs`), its `samples.jsonl` lines, its
/// `metrics.jsonl` line, its table row.
async fn report_step(
    ctx: &Ctx<'_>,
    roles: &Roles,
    data: &dyn PromptSource,
    progress: &progress::Progress,
    (step, restarts): (u64, u32),
    row: StepRow,
) -> Result<(), RunError> {
    let (mut row, heldout) = heldout::with_heldout(ctx, roles, data, step, row).await?;
    let every = ctx.recipe.log.completions_every;
    let mut shown = Vec::new();
    if let Some(samples) = row.samples.take() {
        if every > 0 && step % every == 0 {
            shown = logged_samples::terminal_lines(&samples);
        }
        ctx.monitor.report(samples);
    }
    ctx.monitor
        .report(row.metrics.with(RESTARTS, f64::from(restarts)));
    progress.line(&row.line);
    shown.iter().for_each(|l| progress.line(l));
    if let Some(acc) = heldout {
        progress.line(&heldout::line(step, acc));
    }
    progress.step(row.brief);
    Ok(())
}

/// After `e` at RL step `step`: charges the restart budget (or returns `e` when it is not
/// retried), rebuilds the failed role, those on its node, and the policy and critic when
/// they may have moved past the newest checkpoint, and reads the loop state back from it.
#[allow(clippy::too_many_arguments)]
async fn recover(
    ctx: &Ctx<'_>,
    pool: &ExecutorPool,
    roles: &mut Roles,
    state: &mut LoopState,
    budget: &mut Budget,
    newest: &Newest,
    step: u64,
    e: RunError,
) -> Result<(), RunError> {
    let note = e.to_string();
    let failure = budget.charge(step, e)?;
    // Steps since the checkpoint, or an update a failed step already applied.
    let moved = state.step > newest.step || state.policy_version > newest.version;
    let ppo = ctx.recipe.rl.algorithm == Algorithm::Ppo;
    let colocated = supervisor::colocated(ctx.recipe, &failure.role);
    let names = supervisor::to_respawn(&failure, &colocated, moved, ppo);
    eprintln!(
        "{}",
        supervisor::restart_note(step, &note, &names, &newest.dir, budget)
    );
    *state = supervisor::rebuild(ctx, pool, roles, &names, &newest.dir, step).await?;
    if names.contains(&"policy") {
        label_engine_weights(ctx, roles, state).await?;
    }
    Ok(())
}
