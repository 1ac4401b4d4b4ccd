//! Writing a checkpoint of the running roles: the policy (weights, optimizer state and
//! tokenizer files), the critic when there is one, copies of the run files a resume checks
//! (`copies.rs`, after the run's logs are synced), then the loop state, sealed with
//! checksums and published atomically (see `checkpoint.rs`). Older checkpoints are pruned.

use crate::controller::context::Ctx;
use crate::controller::error::{At, RunError};
use crate::controller::run::checkpoint::{self, LoopState, Phase};
use crate::controller::run::checksums::write_manifest;
use crate::controller::run::copies as run_copies;
use crate::monitor::{unix_ms_now, CheckpointInfo};
use crate::roles::{CriticRole, PolicyRole};
use std::path::{Path, PathBuf};

/// Copies the tokenizer files present in `from` into `to`.
pub(crate) fn copy_tokenizer(from: &Path, to: &Path) -> Result<(), RunError> {
    oxalign_models::io::tokenizer_files::copy_tokenizer_files(from, to).map_err(|(path, source)| {
        RunError::Io {
            action: "copy",
            path,
            source,
        }
    })
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

/// `<run>/final/`, emptied, for the trained model.
pub(crate) fn final_dir(run_dir: &Path) -> Result<PathBuf, RunError> {
    let dir = run_dir.join("final");
    let io = |action, source| RunError::Io {
        action,
        path: dir.clone(),
        source,
    };
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| io("clear", e))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| io("create", e))?;
    Ok(dir)
}

/// Completes the saved model folder `dir`: the tokenizer files and a SHA-256 of every file.
pub(crate) fn seal_model(ctx: &Ctx<'_>, dir: &Path) -> Result<(), RunError> {
    copy_tokenizer(ctx.policy_dir, dir)?;
    write_manifest(dir, &[]).map_err(|source| RunError::Io {
        action: "write the checksums of",
        path: dir.to_path_buf(),
        source,
    })
}

/// Writes `<run>/final/`: the policy of the RL checkpoint `ckpt` as a Hugging Face model
/// folder (weights, config, tokenizer and chat template, no optimizer state), with the
/// SHA-256 of every file, ready for `oxalign generate` and transformers.
pub(crate) fn write_final_policy(ctx: &Ctx<'_>, ckpt: &Path) -> Result<PathBuf, RunError> {
    let dir = final_dir(ctx.run_dir)?;
    let policy = ckpt.join("policy");
    let entries = std::fs::read_dir(&policy).map_err(|source| RunError::Io {
        action: "read",
        path: policy.clone(),
        source,
    })?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name == oxalign_models::lora::ADAPTER_SUBDIR {
            copy_files(&entry.path(), &dir.join(&name))?;
        }
        if entry.path().is_dir() || name == crate::controller::CHECKSUMS_FILE {
            continue; // the optimizer state stays in the checkpoint
        }
        copy_files(&entry.path(), &dir.join(&name))?;
    }
    seal_model(ctx, &dir)?;
    Ok(dir)
}

/// Copies the file `from` to `to`, or the files directly inside the folder `from` into
/// the folder `to` (created).
fn copy_files(from: &Path, to: &Path) -> Result<(), RunError> {
    let io = |action: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| RunError::Io {
            action,
            path,
            source,
        }
    };
    if from.is_file() {
        return std::fs::copy(from, to)
            .map(|_| ())
            .map_err(io("copy", from));
    }
    std::fs::create_dir_all(to).map_err(io("create", to))?;
    for entry in std::fs::read_dir(from).map_err(io("read", from))?.flatten() {
        if entry.path().is_file() {
            let target = to.join(entry.file_name());
            std::fs::copy(entry.path(), target).map_err(io("copy", &entry.path()))?;
        }
    }
    Ok(())
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

/// Saves the policy's weights (no optimizer) as `<run>/final/`, sealed; returns the folder.
pub(crate) async fn save_final_policy(
    ctx: &Ctx<'_>,
    policy: &dyn PolicyRole,
) -> Result<PathBuf, RunError> {
    let dir = final_dir(ctx.run_dir)?;
    policy
        .save("save", dir.clone(), false)
        .await
        .map_err(RunError::at(At::Setup))?;
    seal_model(ctx, &dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_model_folder_keeps_its_chat_template_and_tokenizer_files() {
        let (from, to) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for f in [
            "tokenizer.json",
            "chat_template.jinja",
            "special_tokens_map.json",
        ] {
            std::fs::write(from.path().join(f), f).unwrap();
        }
        std::fs::write(from.path().join("model.safetensors"), b"weights").unwrap();
        copy_tokenizer(from.path(), to.path()).unwrap();
        for f in [
            "tokenizer.json",
            "chat_template.jinja",
            "special_tokens_map.json",
        ] {
            assert_eq!(std::fs::read_to_string(to.path().join(f)).unwrap(), f);
        }
        assert!(
            !to.path().join("model.safetensors").exists(),
            "weights are saved, not copied"
        );
        assert!(
            !to.path().join("merges.txt").exists(),
            "absent files are skipped"
        );
    }
}
