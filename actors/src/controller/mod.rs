//! The controller: runs a whole training run from a recipe — SFT warm-up, then RL steps
//! (generate; reference log-probs, rewards and values concurrently; advantages; policy and
//! critic updates concurrently), evaluation, checkpoints and the run summary.
//!
//! It sends work to the role actors and waits for answers; the only tensor math it does is
//! the small experience computation, on a blocking thread. A run starts fresh (through SFT,
//! checkpointed as it goes) or from a checkpoint chosen by [`find_resume_point`]; a
//! diverging step stops it with a [`DivergenceError`] before anything of that step is saved.
//! Every role call has the recipe's time limit; an RL step whose role panicked, failed or
//! timed out is replayed from the newest checkpoint once the role is rebuilt (`rl/run_loop.rs`,
//! `supervisor.rs`), within the restart budget.

mod activations;
mod clock;
mod context;
mod data_check;
mod error;
mod evaluate;
mod expert_setup;
pub(crate) mod generator;
mod lengths;
mod lora_models;
mod offline;
mod progress;
mod rl;
use rl::episodes::RunEnv;
pub mod run;
pub(crate) mod setup;
mod shared_reference;
mod start;
mod summary;
mod supervisor;
mod warmup;

pub use data_check::{answers_needed_by, check_data, DataChecked};
pub use error::{At, CheckpointError, ContextError, DivergenceError, RunError, StalenessError};
pub use run::checkpoint::{latest_checkpoint, LoopState, Phase};
pub(crate) use run::checksums::CHECKSUMS_FILE;
pub use run::resume_point::{find_resume_point, ResumePoint};
pub use setup::{data_spec, policy_dir, prompt_source};
pub use summary::RunSummary;

use crate::collective_groups::GroupSettings;
use crate::error::Cause;
use crate::executor::ExecutorPool;
use crate::faults::FaultPlan;
use crate::monitor::{
    unix_ms_now, ActorInfo, ActorUpdate, MonitorHandle, RunFinished, RunInfo, RunOutcome,
};
use crate::recipe::{Recipe, RunKind};
use clock::WallClock;
use context::Ctx;
use oxalign_models::text::tokenizer::Tokenizer;
use oxalign_rlhf::{AdaptiveKl, FixedKl, KlController};
use run::checkpoint;
use run::saving;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How to run.
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// Continue from this checkpoint folder (chosen and verified by [`find_resume_point`]).
    pub resume_from: Option<PathBuf>,
    /// No per-step table on stdout.
    pub quiet: bool,
}

fn kl_controller(recipe: &Recipe) -> Result<KlController, RunError> {
    Ok(match recipe.rl.kl_target {
        Some(t) => KlController::Adaptive(
            AdaptiveKl::new(recipe.rl.kl_coef, t, recipe.rl.kl_horizon)
                .map_err(|e| RunError::controller(At::Setup, "kl_controller", e))?,
        ),
        None => KlController::Fixed(FixedKl {
            beta: recipe.rl.kl_coef,
        }),
    })
}

/// Runs the recipe to the end. The monitor (already spawned, writing into the run folder)
/// receives every actor status, span, metric and checkpoint.
pub async fn train(
    recipe: &Recipe,
    monitor: &MonitorHandle,
    opts: &TrainOptions,
) -> Result<RunSummary, RunError> {
    let started = Instant::now();
    let run_dir = recipe.run_dir();
    std::fs::create_dir_all(&run_dir).map_err(|source| RunError::Io {
        action: "create the run folder",
        path: run_dir.clone(),
        source,
    })?;
    monitor.report(RunInfo {
        name: recipe.run.name.clone(),
        recipe_toml: recipe.to_toml(),
        started_unix_ms: unix_ms_now(),
    });

    let result = run(recipe, monitor, opts, &run_dir, started).await;
    let (outcome, message, steps) = match &result {
        Ok(s) => (RunOutcome::Completed, None, s.steps),
        Err(e) => (RunOutcome::Failed, Some(e.to_string()), 0),
    };
    monitor.report(RunFinished {
        outcome,
        steps_completed: steps,
        finished_unix_ms: unix_ms_now(),
        message,
    });
    result
}

/// The loop state of a run that starts from nothing.
fn fresh_state(recipe: &Recipe) -> Result<LoopState, RunError> {
    Ok(LoopState::start(kl_controller(recipe)?))
}

async fn run(
    recipe: &Recipe,
    monitor: &MonitorHandle,
    opts: &TrainOptions,
    run_dir: &Path,
    started: Instant,
) -> Result<RunSummary, RunError> {
    let pdir = setup::policy_dir(recipe, run_dir)?;
    let setup = |phase, cause: Cause| RunError::controller(At::Setup, phase, cause);
    let mut tok = Tokenizer::from_dir(&pdir).map_err(|e| setup("tokenizer", e.into()))?;
    let env = match &recipe.env {
        Some(e) => Some(
            RunEnv::new(e, &tok).map_err(|e| setup("env", Cause::Environment(e.to_string())))?,
        ),
        None => None,
    };
    // Prompts and SFT conversations declare the tools through the chat template.
    tok.set_tools(env.as_ref().and_then(|e| e.tools.clone()));
    let config = pdir.join("config.json");
    let context = oxalign_models::ModelConfig::from_file(&config)
        .map_err(|e| setup("model_config", e.into()))?
        .max_position_embeddings;
    let answer_check = recipe
        .reward
        .answer_check()
        .map_err(|e| setup("reward", e.into()))?;
    let ctx = Ctx {
        recipe,
        run_dir,
        policy_dir: &pdir,
        context,
        tok: &tok,
        monitor,
        pad_id: tok.pad_token_id().or(tok.eos_token_id()).unwrap_or(0),
        quiet: opts.quiet,
        timeout: recipe.supervision.call_timeout(),
        answer_check,
        env: env.as_ref(),
    };
    // A collective call waits no longer than a role call: the supervisor then acts on it.
    let groups = GroupSettings::default().with_timeout(recipe.supervision.call_timeout());
    let pool = ExecutorPool::with_faults(FaultPlan::new(&recipe.faults)).with_groups(groups);
    if recipe.run.kind != RunKind::Rl {
        return offline::run(&ctx, &pool, started).await;
    }
    run_rl(&ctx, &pool, opts, started).await
}

/// The loop state an RL run starts from: the checkpoint's when resuming, else a fresh one.
fn start_state(ctx: &Ctx<'_>, opts: &TrainOptions) -> Result<LoopState, RunError> {
    let Some(ckpt) = &opts.resume_from else {
        return fresh_state(ctx.recipe);
    };
    let state = checkpoint::read_state(ckpt)?;
    if !opts.quiet {
        println!(
            "resuming {} from {} ({:?} phase, SFT step {}, RL step {})",
            ctx.recipe.run.name,
            ckpt.display(),
            state.phase,
            state.sft_step,
            state.step
        );
    }
    Ok(state)
}

/// An RL run: SFT (unless resumed past it), the RL steps, the final policy and evaluation.
async fn run_rl(
    ctx: &Ctx<'_>,
    pool: &ExecutorPool,
    opts: &TrainOptions,
    started: Instant,
) -> Result<RunSummary, RunError> {
    let data = setup::prompt_source(ctx.recipe, ctx.tok)?;
    let mut state = start_state(ctx, opts)?;
    let clock = WallClock {
        prior: state.wall_seconds,
        started,
    };
    ctx.monitor.report(ActorInfo::new(
        "controller",
        "controller",
        vec!["cpu".into()],
    ));
    ctx.monitor
        .report(ActorUpdate::working("controller", "setup"));
    let from = opts.resume_from.as_deref();
    let mut roles = match (state.phase, from) {
        (Phase::Rl, Some(ckpt)) => start::from_rl_checkpoint(ctx, pool, ckpt).await?,
        _ => start::through_sft(ctx, pool, data.as_ref(), &mut state, from, clock).await?,
    };
    if let (false, Some(a)) = (opts.quiet, state.accuracy_sft) {
        println!("held-out accuracy before RL: {:.1}%", 100.0 * a);
    }
    let last_checkpoint =
        rl::run_loop::rl_loop(ctx, pool, &mut roles, data.as_ref(), &mut state, clock).await?;
    if let Some(ckpt) = &last_checkpoint {
        saving::write_final_policy(ctx, ckpt)?;
    }
    let final_acc = if data.eval_items().is_empty() {
        None
    } else {
        evaluate::accuracy(ctx, &roles.generator(), data.eval_items(), "eval final").await?
    };
    roles.finish().await;
    ctx.monitor.report(ActorUpdate::idle("controller"));
    let summary = RunSummary {
        name: ctx.recipe.run.name.clone(),
        run_dir: ctx.run_dir.to_path_buf(),
        steps: state.step,
        accuracy_init: state.accuracy_init,
        accuracy_sft: state.accuracy_sft,
        accuracy_final: final_acc.map(|a| a.greedy),
        sampled_accuracy_sft: state.sampled_accuracy_sft,
        sampled_accuracy_final: final_acc.map(|a| a.sampled),
        reward_first: state.reward_first,
        reward_last: state.reward_last,
        wall_seconds: clock.now(),
        last_checkpoint,
        offline: None,
    };
    write_summary(ctx.run_dir, &summary)?;
    Ok(summary)
}

/// Writes `summary.json` into the run folder.
fn write_summary(run_dir: &Path, summary: &RunSummary) -> Result<(), RunError> {
    let path = run_dir.join("summary.json");
    let text = serde_json::to_string_pretty(summary).map_err(std::io::Error::other);
    text.and_then(|t| std::fs::write(&path, t))
        .map_err(|source| RunError::Io {
            action: "write",
            path,
            source,
        })
}
