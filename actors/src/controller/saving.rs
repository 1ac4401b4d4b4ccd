//! Writing a checkpoint of the running roles: the policy (weights, optimizer state and
//! tokenizer files), the critic when there is one, then the loop state, sealed with
//! checksums and published atomically (see `checkpoint.rs`). Older checkpoints are pruned.

use super::checkpoint::{self, LoopState, Phase};
use super::Ctx;
use crate::monitor::{unix_ms_now, CheckpointInfo};
use crate::roles::{ask, CriticMsg, PolicyMsg};
use ractor::ActorRef;
use std::path::{Path, PathBuf};

/// Tokenizer files copied next to saved policy weights, so the folder is a whole HF model.
const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
];

/// Copies the tokenizer files present in `from` into `to`.
pub(crate) fn copy_tokenizer(from: &Path, to: &Path) -> Result<(), String> {
    for f in TOKENIZER_FILES {
        let src = from.join(f);
        if src.is_file() {
            std::fs::copy(&src, to.join(f))
                .map_err(|e| format!("cannot copy {}: {e}", src.display()))?;
        }
    }
    Ok(())
}

/// Saves `policy` (and `critic`) with `state` as the checkpoint of `state`'s phase and step,
/// reports it to the monitor and prunes old checkpoints. Returns the checkpoint folder.
pub(crate) async fn save_checkpoint(
    ctx: &Ctx<'_>,
    policy: &ActorRef<PolicyMsg>,
    critic: Option<&ActorRef<CriticMsg>>,
    state: &LoopState,
) -> Result<PathBuf, String> {
    let timer = ctx.monitor.time("controller", "checkpoint", state.step);
    let fin = state.checkpoint_dir(ctx.run_dir);
    let fail = |e: &dyn std::fmt::Display| format!("checkpoint {}: {e}", fin.display());
    let staged = checkpoint::staging_dir(&fin).map_err(|e| fail(&e))?;
    let pdir = staged.join("policy");
    ask("policy", policy, |reply| PolicyMsg::Save {
        dir: pdir.clone(),
        optimizer: true,
        reply,
    })
    .await
    .map_err(|e| fail(&e))?;
    copy_tokenizer(ctx.policy_dir, &pdir)?;
    if let Some(c) = critic {
        let cdir = staged.join("critic");
        ask("critic", c, |reply| CriticMsg::Save { dir: cdir, reply })
            .await
            .map_err(|e| fail(&e))?;
    }
    checkpoint::seal(&staged, state).map_err(|e| fail(&e))?;
    checkpoint::publish(&staged, &fin).map_err(|e| fail(&e))?;
    checkpoint::prune(ctx.run_dir, ctx.recipe.run.keep_checkpoints)
        .map_err(|e| format!("pruning checkpoints: {e}"))?;
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

/// Loads the optimizer state saved in `dir/optimizer` into every replica of `role`.
pub(crate) async fn load_policy_optimizer(
    policy: &ActorRef<PolicyMsg>,
    dir: PathBuf,
) -> Result<(), String> {
    ask("policy", policy, |reply| PolicyMsg::LoadOptimizer {
        dir,
        reply,
    })
    .await
    .map_err(|e| format!("cannot restore the policy's optimizer state: {e}"))
}

/// Loads the critic's optimizer state saved in `dir/optimizer` (required: a resumed critic
/// never starts from a fresh optimizer silently).
pub(crate) async fn load_critic_optimizer(
    critic: &ActorRef<CriticMsg>,
    dir: PathBuf,
) -> Result<(), String> {
    ask("critic", critic, |reply| CriticMsg::LoadOptimizer {
        dir,
        reply,
    })
    .await
    .map_err(|e| format!("cannot restore the critic's optimizer state: {e}"))
}
