//! Getting the roles to the start of an RL step: either through SFT (a fresh run, or one
//! resumed from an SFT checkpoint), ending with the frozen reference, the held-out
//! evaluation and the RL-start checkpoint `step_000000`; or straight from an RL checkpoint.

use crate::controller::clock::WallClock;
use crate::controller::context::Ctx;
use crate::controller::error::{At, RunError};
use crate::controller::generator::Generator;
use crate::controller::run::checkpoint::{LoopState, Phase};
use crate::controller::run::copies as run_copies;
use crate::controller::run::retry::save_checkpoint_retried as save_checkpoint;
use crate::controller::run::saving::{
    copy_tokenizer, load_critic_optimizer, load_policy_optimizer,
};
use crate::controller::setup::{self, RoleSources, Roles};
use crate::controller::{evaluate, warmup};
use crate::executor::ExecutorPool;
use crate::recipe::Algorithm;
use oxalign_data::PromptSource;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the SFT policy may take to stop before RL's policy starts.
const POLICY_STOP_WAIT: Duration = Duration::from_secs(30);

/// Runs (the rest of) SFT from `state`, freezes the reference, evaluates, spawns the other
/// roles and writes the RL-start checkpoint. `from`: the SFT checkpoint resumed, if any.
pub(crate) async fn through_sft(
    ctx: &Ctx<'_>,
    pool: &ExecutorPool,
    data: &dyn PromptSource,
    state: &mut LoopState,
    from: Option<&Path>,
    clock: WallClock,
) -> Result<Roles, RunError> {
    let r = ctx.recipe;
    let reference_dir = ctx.run_dir.join(run_copies::REFERENCE_DIR);
    let weights = from.map_or_else(|| ctx.policy_dir.to_path_buf(), |c| c.join("policy"));
    let first = match from {
        None if r.sft.steps > 0 => r.warmup_recipe(),
        _ => std::borrow::Cow::Borrowed(r),
    };
    let mut policy = setup::spawn_policy(&first, &weights, ctx.monitor, pool).await?;
    // The engine role (`placement.engine`), when the recipe places one: spawned from the
    // weights RL starts with, or here already for the evaluation before SFT.
    let mut engine = None;
    if let Some(ckpt) = from {
        load_policy_optimizer(policy.as_ref(), ckpt.join("policy")).await?;
    } else if r.sft.steps > 0 {
        engine = setup::spawn_engine(r, &weights, ctx.monitor, pool).await?;
        let generator = Generator::new(policy.as_ref(), engine.as_deref());
        let a = evaluate::accuracy(ctx, &generator, data.eval_items(), "eval init").await?;
        state.accuracy_init = a.map(|a| a.greedy);
    }
    if r.sft.steps > 0 {
        warmup::run_sft(ctx, policy.as_ref(), data, state, clock).await?;
    }
    // The frozen reference is the policy as RL starts.
    policy
        .save("save_reference", reference_dir.clone(), false)
        .await
        .map_err(RunError::at(At::Setup))?;
    copy_tokenizer(ctx.policy_dir, &reference_dir)?;
    drop_adapter(&reference_dir)?;
    run_copies::seal_reference(&reference_dir).map_err(|source| RunError::Io {
        action: "record the checksums of",
        path: reference_dir.clone(),
        source,
    })?;
    if r.sft.steps > 0 || fresh_adapters(r) {
        // RL starts from the SFT weights with a fresh optimizer (no SFT moments).
        policy
            .stop(POLICY_STOP_WAIT)
            .await
            .map_err(RunError::at(At::Setup))?;
        policy = setup::spawn_policy(r, &reference_dir, ctx.monitor, pool).await?;
        if let Some(e) = engine.take() {
            e.stop(POLICY_STOP_WAIT)
                .await
                .map_err(RunError::at(At::Setup))?;
        }
    }
    if engine.is_none() {
        let rl_weights = if r.sft.steps > 0 {
            &reference_dir
        } else {
            &weights
        };
        engine = setup::spawn_engine(r, rl_weights, ctx.monitor, pool).await?;
    }
    // Evaluated through the engine that RL starts with.
    let generator = Generator::new(policy.as_ref(), engine.as_deref());
    let a = evaluate::accuracy(ctx, &generator, data.eval_items(), "eval sft").await?;
    state.accuracy_sft = a.map(|a| a.greedy);
    state.sampled_accuracy_sft = a.map(|a| a.sampled);
    state.phase = Phase::Rl;
    state.step = 0;
    let sources = RoleSources {
        reference: setup::reference_weights(ctx)?,
        critic: r.model.critic_path.as_ref().map(PathBuf::from),
    };
    let roles = setup::spawn_others(r, &sources, policy, engine, ctx.monitor, pool).await?;
    state.wall_seconds = clock.now();
    save_checkpoint(ctx, roles.policy.as_ref(), roles.critic.as_deref(), state).await?;
    Ok(roles)
}

/// Spawns every role from the RL checkpoint `ckpt`, optimizer states included.
pub(crate) async fn from_rl_checkpoint(
    ctx: &Ctx<'_>,
    pool: &ExecutorPool,
    ckpt: &Path,
) -> Result<Roles, RunError> {
    let r = ctx.recipe;
    let policy = setup::spawn_policy(r, &ckpt.join("policy"), ctx.monitor, pool).await?;
    load_policy_optimizer(policy.as_ref(), ckpt.join("policy")).await?;
    let engine = setup::spawn_engine(r, &ckpt.join("policy"), ctx.monitor, pool).await?;
    let sources = RoleSources {
        reference: setup::reference_weights(ctx)?,
        critic: (r.rl.algorithm == Algorithm::Ppo).then(|| ckpt.join("critic")),
    };
    let roles = setup::spawn_others(r, &sources, policy, engine, ctx.monitor, pool).await?;
    if let Some(critic) = &roles.critic {
        load_critic_optimizer(critic.as_ref(), ckpt.join("critic")).await?;
    }
    Ok(roles)
}

/// Removes the adapter files a LoRA policy saved beside its merged weights in the
/// reference folder: the reference is the merged model, and RL's policy puts fresh adapters
/// on it, so its adapters' frozen base is exactly the reference.
fn drop_adapter(reference_dir: &Path) -> Result<(), RunError> {
    let adapter = reference_dir.join(oxalign_models::lora::ADAPTER_SUBDIR);
    match adapter.is_dir() {
        true => std::fs::remove_dir_all(&adapter).map_err(|source| RunError::Io {
            action: "remove",
            path: adapter,
            source,
        }),
        false => Ok(()),
    }
}

/// Whether RL's policy gets fresh LoRA adapters: they go on the reference folder itself, so
/// that their frozen base is the reference (which then shares it: `shared_reference.rs`).
fn fresh_adapters(r: &crate::recipe::Recipe) -> bool {
    r.lora.as_ref().is_some_and(|l| l.adapter.is_none())
}
