//! Writing a checkpoint of the running roles: the policy (weights, optimizer state and
//! tokenizer files), the critic when there is one, copies of the run files a resume checks
//! (`run_copies.rs`, after the run's logs are synced), then the loop state, sealed with
//! checksums and published atomically (see `checkpoint.rs`). Older checkpoints are pruned.

use super::checkpoint::{self, LoopState, Phase};
use super::run_copies;
use super::run_error::{At, RunError};
use super::Ctx;
use crate::monitor::{unix_ms_now, CheckpointInfo};
use crate::roles::{CriticRole, PolicyRole};
use std::path::{Path, PathBuf};

/// Tokenizer files copied next to saved policy weights, so the folder is a whole HF model.
const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
];

/// Copies the tokenizer files present in `from` into `to`.
pub(crate) fn copy_tokenizer(from: &Path, to: &Path) -> Result<(), RunError> {
    for f in TOKENIZER_FILES {
        let src = from.join(f);
        if src.is_file() {
            std::fs::copy(&src, to.join(f)).map_err(|source| RunError::Io {
                action: "copy",
                path: src.clone(),
                source,
            })?;
        }
    }
    Ok(())
}

/// Saves `policy` (and `critic`) with `state` as the checkpoint of `state`'s phase and step,
/// reports it to the monitor and prunes old checkpoints. Returns the checkpoint folder.
pub(crate) async fn save_checkpoint(
    ctx: &Ctx<'_>,
    policy: &dyn PolicyRole,
    critic: Option<&dyn CriticRole>,
    state: &LoopState,
) -> Result<PathBuf, RunError> {
    let timer = ctx.monitor.time("controller", "checkpoint", state.step);
    let fin = state.checkpoint_dir(ctx.run_dir);
    let at = At::Checkpoint {
        sft: state.phase == Phase::Sft,
        step: match state.phase {
            Phase::Sft => state.sft_step,
            Phase::Rl => state.step,
        },
    };
    let io = |action: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| RunError::Io {
            action,
            path,
            source,
        }
    };
    let staged = checkpoint::staging_dir(&fin).map_err(io("stage checkpoint", &fin))?;
    let pdir = staged.join("policy");
    policy
        .save("save", pdir.clone(), true)
        .await
        .map_err(RunError::at(at))?;
    copy_tokenizer(ctx.policy_dir, &pdir)?;
    if let Some(c) = critic {
        let cdir = staged.join("critic");
        c.save("save", cdir, true).await.map_err(RunError::at(at))?;
    }
    // A barrier: the metrics and timeline of every step up to this one are on disk (and
    // fsynced) before the checkpoint that covers them commits.
    ctx.monitor
        .sync()
        .await
        .map_err(|source| RunError::Logs { at, source })?;
    run_copies::stage(ctx.run_dir, &staged, state)
        .map_err(io("copy the run's logs into", &staged))?;
    checkpoint::seal(&staged, state).map_err(io("seal checkpoint", &staged))?;
    checkpoint::publish(&staged, &fin).map_err(io("publish checkpoint", &fin))?;
    checkpoint::prune(ctx.run_dir, ctx.recipe.run.keep_checkpoints)
        .map_err(io("prune the checkpoints of", ctx.run_dir))?;
    timer.finish();
    if state.phase == Phase::Rl {
        ctx.monitor.report(CheckpointInfo {
            step: state.step,
            path: fin.display().to_string(),
            unix_ms: unix_ms_now(),
        });
    }
    Ok(fin)
}

/// Loads the optimizer state saved in `dir/optimizer` into every replica of the policy.
pub(crate) async fn load_policy_optimizer(
    policy: &dyn PolicyRole,
    dir: PathBuf,
) -> Result<(), RunError> {
    policy
        .load_optimizer(dir)
        .await
        .map_err(RunError::at(At::Setup))
}

/// Loads the critic's optimizer state saved in `dir/optimizer` (required: a resumed critic
/// never starts from a fresh optimizer silently).
pub(crate) async fn load_critic_optimizer(
    critic: &dyn CriticRole,
    dir: PathBuf,
) -> Result<(), RunError> {
    critic
        .load_optimizer(dir)
        .await
        .map_err(RunError::at(At::Setup))
}
