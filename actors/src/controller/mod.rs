//! The controller: runs a whole training run from a recipe — SFT warm-up, then RL steps
//! (generate; reference log-probs, rewards and values concurrently; advantages; policy and
//! critic updates concurrently), evaluation, checkpoints and the run summary.
//!
//! It sends work to the role actors and waits for answers; the only tensor math it does is
//! the small experience computation, on a blocking thread.

pub mod checkpoint;
mod evaluate;
mod progress;
mod rl_step;
mod setup;
mod sft;

pub use checkpoint::{latest_checkpoint, LoopState};
pub use setup::{policy_dir, prompt_source};

use crate::executor::ExecutorPool;
use crate::monitor::{
    unix_ms_now, ActorInfo, ActorUpdate, CheckpointInfo, MonitorHandle, RunFinished, RunInfo,
    RunOutcome,
};
use crate::recipe::Recipe;
use crate::roles::{ask, CriticMsg, PolicyMsg};
use oxalign_models::tokenizer::Tokenizer;
use oxalign_rlhf::{AdaptiveKl, FixedKl, KlController};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How to run.
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// Continue from the newest checkpoint of the run folder.
    pub resume: bool,
    /// No per-step table on stdout.
    pub quiet: bool,
}

/// What a finished run reports (`summary.json`).
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// Run name.
    pub name: String,
    /// Run folder.
    pub run_dir: PathBuf,
    /// RL steps completed.
    pub steps: u64,
    /// Held-out accuracy of the initial model.
    pub accuracy_init: Option<f64>,
    /// Held-out accuracy after SFT (before RL).
    pub accuracy_sft: Option<f64>,
    /// Held-out accuracy after RL.
    pub accuracy_final: Option<f64>,
    /// Held-out sampled accuracy (8 samples per prompt at the rollout temperature) after SFT.
    pub sampled_accuracy_sft: Option<f64>,
    /// Held-out sampled accuracy after RL.
    pub sampled_accuracy_final: Option<f64>,
    /// Mean reward of the first RL step of this process and of the last.
    pub reward_first: Option<f64>,
    /// Mean reward of the last RL step.
    pub reward_last: Option<f64>,
    /// Wall seconds, across resumes.
    pub wall_seconds: f64,
    /// The newest checkpoint.
    pub last_checkpoint: Option<PathBuf>,
}

/// The pieces every phase needs.
pub(crate) struct Ctx<'a> {
    pub recipe: &'a Recipe,
    pub tok: &'a Tokenizer,
    pub monitor: &'a MonitorHandle,
    pub pad_id: u32,
    pub quiet: bool,
}

fn kl_controller(recipe: &Recipe) -> Result<KlController, String> {
    Ok(match recipe.rl.kl_target {
        Some(t) => KlController::Adaptive(
            AdaptiveKl::new(recipe.rl.kl_coef, t, recipe.rl.kl_horizon)
                .map_err(|e| e.to_string())?,
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
) -> Result<RunSummary, String> {
    let started = Instant::now();
    let run_dir = recipe.run_dir();
    std::fs::create_dir_all(&run_dir)
        .map_err(|e| format!("cannot create run folder {}: {e}", run_dir.display()))?;
    monitor.report(RunInfo {
        name: recipe.run.name.clone(),
        recipe_toml: recipe.to_toml(),
        started_unix_ms: unix_ms_now(),
    });

    let result = run(recipe, monitor, opts, &run_dir, started).await;
    let (outcome, message, steps) = match &result {
        Ok(s) => (RunOutcome::Completed, None, s.steps),
        Err(e) => (RunOutcome::Failed, Some(e.clone()), 0),
    };
    monitor.report(RunFinished {
        outcome,
        steps_completed: steps,
        finished_unix_ms: unix_ms_now(),
        message,
    });
    result
}

async fn run(
    recipe: &Recipe,
    monitor: &MonitorHandle,
    opts: &TrainOptions,
    run_dir: &Path,
    started: Instant,
) -> Result<RunSummary, String> {
    let pdir = setup::policy_dir(recipe, run_dir)?;
    let tok =
        Tokenizer::from_dir(&pdir).map_err(|e| format!("tokenizer of {}: {e}", pdir.display()))?;
    let pad_id = tok.pad_token_id().or(tok.eos_token_id()).unwrap_or(0);
    let data = setup::prompt_source(recipe)?;
    let ctx = Ctx {
        recipe,
        tok: &tok,
        monitor,
        pad_id,
        quiet: opts.quiet,
    };
    let pool = ExecutorPool::new();
    let reference_dir = run_dir.join("reference");

    let resume_from = if opts.resume {
        latest_checkpoint(run_dir)
    } else {
        None
    };
    let (mut state, sources) = match &resume_from {
        Some(ckpt) => {
            let state = checkpoint::read_state(ckpt)?;
            let critic = ckpt.join("critic");
            let sources = setup::RoleSources {
                policy: ckpt.join("policy"),
                reference: reference_dir.clone(),
                critic: critic.join("config.json").is_file().then_some(critic),
            };
            if !opts.quiet {
                println!(
                    "resuming {} from {} (step {})",
                    recipe.run.name,
                    ckpt.display(),
                    state.step
                );
            }
            (state, sources)
        }
        None => {
            let state = LoopState {
                step: 0,
                data_position: 0,
                policy_version: 0,
                kl: kl_controller(recipe)?,
                accuracy_sft: None,
                sampled_accuracy_sft: None,
                accuracy_init: None,
                wall_seconds: 0.0,
            };
            let critic = recipe.model.critic_path.as_ref().map(PathBuf::from);
            (
                state,
                setup::RoleSources {
                    policy: pdir.clone(),
                    reference: reference_dir.clone(),
                    critic,
                },
            )
        }
    };
    let prior_wall = state.wall_seconds;

    monitor.report(ActorInfo::new(
        "controller",
        "controller",
        vec!["cpu".into()],
    ));
    monitor.report(ActorUpdate::working("controller", "setup"));
    let mut policy = setup::spawn_policy(recipe, &sources.policy, monitor, &pool).await?;
    if resume_from.is_none() {
        if recipe.sft.steps > 0 {
            let a = evaluate::accuracy(&ctx, &policy, data.eval_items(), "eval init").await?;
            state.accuracy_init = Some(a.greedy);
            sft::run_sft(&ctx, &policy, data.as_ref(), &mut state).await?;
        }
        // The frozen reference is the policy as RL starts.
        ask("policy", &policy, |reply| PolicyMsg::Save {
            dir: reference_dir.clone(),
            optimizer: false,
            reply,
        })
        .await
        .map_err(|e| e.to_string())?;
        copy_tokenizer(&pdir, &reference_dir)?;
        if recipe.sft.steps > 0 {
            // RL starts from the SFT weights with a fresh optimizer (no SFT moments).
            policy
                .stop_and_wait(None, None)
                .await
                .map_err(|e| e.to_string())?;
            policy = setup::spawn_policy(recipe, &reference_dir, monitor, &pool).await?;
        }
        // Evaluated through the engine that RL starts with.
        let a = evaluate::accuracy(&ctx, &policy, data.eval_items(), "eval sft").await?;
        state.accuracy_sft = Some(a.greedy);
        state.sampled_accuracy_sft = Some(a.sampled);
    } else if let Some(ckpt) = &resume_from {
        let dir = ckpt.join("policy");
        ask("policy", &policy, |reply| PolicyMsg::LoadOptimizer {
            dir,
            reply,
        })
        .await
        .map_err(|e| e.to_string())?;
    }
    if !opts.quiet {
        if let Some(a) = state.accuracy_sft {
            println!("held-out accuracy before RL: {:.1}%", 100.0 * a);
        }
    }
    let roles = setup::spawn_others(recipe, &sources, policy, monitor, &pool).await?;
    if let (Some(ckpt), Some(critic)) = (&resume_from, &roles.critic) {
        let dir = ckpt.join("critic");
        if dir.join("optimizer").exists() {
            ask("critic", critic, |reply| CriticMsg::LoadOptimizer {
                dir,
                reply,
            })
            .await
            .map_err(|e| e.to_string())?;
        }
    }

    let mut reward_first = None;
    let mut reward_last = None;
    let mut last_checkpoint = resume_from.clone();
    let progress = progress::Progress::new(recipe.run.steps, state.step, opts.quiet);
    if state.step < recipe.run.steps {
        progress.line(&rl_step::header());
    }
    while state.step < recipe.run.steps {
        let step = state.step + 1;
        monitor.report(ActorUpdate::working("controller", format!("step {step}")));
        let row = rl_step::run_step(&ctx, &roles, data.as_ref(), &mut state, step).await?;
        progress.line(&row.line);
        progress.step(row.brief);
        reward_first.get_or_insert(row.reward_mean);
        reward_last = Some(row.reward_mean);
        state.step = step;
        let every = recipe.run.checkpoint_every;
        if (every > 0 && step % every == 0) || step == recipe.run.steps {
            state.wall_seconds = prior_wall + started.elapsed().as_secs_f64();
            let dir = save_checkpoint(&ctx, &roles, &state, run_dir).await?;
            monitor.report(CheckpointInfo {
                step,
                path: dir.display().to_string(),
                unix_ms: unix_ms_now(),
            });
            last_checkpoint = Some(dir);
        }
    }
    progress.finish();
    let final_acc = if data.eval_items().is_empty() {
        None
    } else {
        Some(evaluate::accuracy(&ctx, &roles.policy, data.eval_items(), "eval final").await?)
    };
    roles.stop();
    monitor.report(ActorUpdate::idle("controller"));
    let summary = RunSummary {
        name: recipe.run.name.clone(),
        run_dir: run_dir.to_path_buf(),
        steps: state.step,
        accuracy_init: state.accuracy_init,
        accuracy_sft: state.accuracy_sft,
        accuracy_final: final_acc.map(|a| a.greedy),
        sampled_accuracy_sft: state.sampled_accuracy_sft,
        sampled_accuracy_final: final_acc.map(|a| a.sampled),
        reward_first,
        reward_last,
        wall_seconds: prior_wall + started.elapsed().as_secs_f64(),
        last_checkpoint,
    };
    let text = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
    std::fs::write(run_dir.join("summary.json"), text)
        .map_err(|e| format!("cannot write summary.json: {e}"))?;
    Ok(summary)
}

fn copy_tokenizer(from: &Path, to: &Path) -> Result<(), String> {
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        let src = from.join(f);
        if src.is_file() {
            std::fs::copy(&src, to.join(f))
                .map_err(|e| format!("cannot copy {}: {e}", src.display()))?;
        }
    }
    Ok(())
}

async fn save_checkpoint(
    ctx: &Ctx<'_>,
    roles: &setup::Roles,
    state: &LoopState,
    run_dir: &Path,
) -> Result<PathBuf, String> {
    let timer = ctx.monitor.time("controller", "checkpoint", state.step);
    let fin = checkpoint::checkpoint_dir(run_dir, state.step);
    let staged =
        checkpoint::staging_dir(&fin).map_err(|e| format!("checkpoint {}: {e}", fin.display()))?;
    let pdir = staged.join("policy");
    ask("policy", &roles.policy, |reply| PolicyMsg::Save {
        dir: pdir.clone(),
        optimizer: true,
        reply,
    })
    .await
    .map_err(|e| e.to_string())?;
    copy_tokenizer(&run_dir.join("reference"), &pdir)?;
    if let Some(c) = &roles.critic {
        let cdir = staged.join("critic");
        ask("critic", c, |reply| CriticMsg::Save { dir: cdir, reply })
            .await
            .map_err(|e| e.to_string())?;
    }
    checkpoint::seal(&staged, state).map_err(|e| format!("checkpoint {}: {e}", fin.display()))?;
    checkpoint::publish(&staged, &fin).map_err(|e| format!("checkpoint {}: {e}", fin.display()))?;
    checkpoint::prune(run_dir, ctx.recipe.run.keep_checkpoints)
        .map_err(|e| format!("pruning checkpoints: {e}"))?;
    timer.finish();
    Ok(fin)
}
