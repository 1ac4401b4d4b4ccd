//! Choosing the checkpoint a run resumes from: the newest one that is sealed, holds every
//! file a resume needs (weights *and* optimizer states) and matches its checksums. Newer
//! checkpoints that fail are reported (to be warned about) and set aside. It loads nothing
//! into a model.

use crate::controller::error::CheckpointError;
use crate::controller::run::checkpoint::{
    checkpoint_folders, checkpoint_order, LoopState, Phase, STATE_FILE,
};
use crate::controller::run::checksums::{self, CHECKSUMS_FILE};
use std::path::{Path, PathBuf};

/// Sub-folder of `checkpoints/` where rejected checkpoints are moved.
pub(crate) const REJECTED_DIR: &str = "rejected";

/// The checkpoint a run resumes from.
#[derive(Debug)]
pub struct ResumePoint {
    /// The checkpoint folder.
    pub dir: PathBuf,
    /// Its loop state.
    pub state: LoopState,
    /// Newer checkpoints that failed verification, newest first, with the reason.
    pub rejected: Vec<(PathBuf, CheckpointError)>,
}

/// Files (relative to the checkpoint `dir`) a resume of a role folder needs: its HF
/// weights and its optimizer state, whole (replicated) or as rank shards with their layout
/// (sharded: `optimizer/shard_<rank>/`, every rank's files covered by the checksums), or per
/// expert-parallel rank (`optimizer/expert_rank_<rank>/`).
fn role_files(dir: &Path, role: &str) -> Vec<String> {
    let optimizer = if dir.join(role).join("optimizer/shard_0").is_dir() {
        "optimizer/shard_0/"
    } else if dir.join(role).join("optimizer/expert_rank_0").is_dir() {
        "optimizer/expert_rank_0/"
    } else {
        "optimizer/"
    };
    let mut files = vec![
        format!("{role}/config.json"),
        format!("{role}/model.safetensors"),
        format!("{role}/{optimizer}optimizer.json"),
        format!("{role}/{optimizer}optimizer.safetensors"),
    ];
    if optimizer == "optimizer/shard_0/" {
        files.push(format!("{role}/{optimizer}shard_layout.json"));
    }
    files
}

/// Verifies one checkpoint folder and reads its state: every file against its checksum
/// (`state.json` included, so an edited step, data position or KL coefficient is caught),
/// then the state against the folder it sits in. `needs_critic`: the run trains a critic,
/// so an RL checkpoint must hold one with its optimizer.
pub(crate) fn verify_checkpoint(
    dir: &Path,
    needs_critic: bool,
) -> Result<LoopState, CheckpointError> {
    for marker in [STATE_FILE, CHECKSUMS_FILE] {
        if !dir.join(marker).is_file() {
            return Err(CheckpointError::Unsealed {
                checkpoint: dir.to_path_buf(),
                marker,
            });
        }
    }
    let path = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| CheckpointError::Unreadable {
        path: path.clone(),
        source,
    })?;
    let state: Result<LoopState, _> = serde_json::from_str(&text);
    let rl = state.as_ref().map_or(true, |s| s.phase == Phase::Rl);
    let mut required = vec![STATE_FILE.to_string()];
    required.extend(role_files(dir, "policy"));
    if needs_critic && rl {
        required.extend(role_files(dir, "critic"));
    }
    checksums::verify(dir, &required)?;
    let state = state.map_err(|source| CheckpointError::BadJson { path, source })?;
    check_state(dir, &state)?;
    Ok(state)
}

/// Checks a (checksum-verified) loop state against its folder: the phase and step its
/// name says, a valid KL controller, finite non-negative wall time, accuracies in [0, 1].
fn check_state(dir: &Path, state: &LoopState) -> Result<(), CheckpointError> {
    let bad = |field: &'static str, found: String, expected: String| {
        Err(CheckpointError::BadState {
            checkpoint: dir.to_path_buf(),
            field,
            found,
            expected,
        })
    };
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    if let Some((phase, step)) = name.as_deref().and_then(checkpoint_order) {
        let (field, found) = match phase {
            Phase::Sft => ("sft_step", state.sft_step),
            Phase::Rl => ("step", state.step),
        };
        if state.phase != phase {
            return bad("phase", format!("{:?}", state.phase), format!("{phase:?}"));
        }
        if found != step {
            return bad(
                field,
                found.to_string(),
                format!("{step} (the folder's step)"),
            );
        }
    }
    if let Err(e) = state.kl.validate() {
        return bad("kl", format!("{:?}", state.kl), e.to_string());
    }
    if !(state.wall_seconds.is_finite() && state.wall_seconds >= 0.0) {
        return bad(
            "wall_seconds",
            state.wall_seconds.to_string(),
            "finite and ≥ 0".into(),
        );
    }
    let accuracies = [
        ("accuracy_sft", state.accuracy_sft),
        ("sampled_accuracy_sft", state.sampled_accuracy_sft),
        ("accuracy_init", state.accuracy_init),
    ];
    for (field, a) in accuracies {
        if let Some(a) = a.filter(|a| !(0.0..=1.0).contains(a)) {
            return bad(field, a.to_string(), "in [0, 1]".into());
        }
    }
    Ok(())
}

/// The newest valid checkpoint of `run_dir`. Fails when the run has no checkpoint folder,
/// or when every one is rejected (each reason listed).
pub fn find_resume_point(
    run_dir: &Path,
    needs_critic: bool,
) -> Result<ResumePoint, CheckpointError> {
    let folders = checkpoint_folders(run_dir);
    if folders.is_empty() {
        return Err(CheckpointError::NoCheckpoint {
            run_dir: run_dir.to_path_buf(),
        });
    }
    let mut rejected = Vec::new();
    for dir in folders {
        match verify_checkpoint(&dir, needs_critic) {
            Ok(state) => {
                return Ok(ResumePoint {
                    dir,
                    state,
                    rejected,
                })
            }
            Err(e) => rejected.push((dir, e)),
        }
    }
    Err(CheckpointError::NoValidCheckpoint {
        run_dir: run_dir.to_path_buf(),
        reasons: rejected.iter().map(|(_, e)| e.to_string()).collect(),
    })
}

/// Moves rejected checkpoints to `checkpoints/rejected/`, where they are kept for
/// inspection but never resumed from or pruned; returns their new paths.
pub fn set_aside(rejected: &[(PathBuf, CheckpointError)]) -> std::io::Result<Vec<PathBuf>> {
    let mut moved = Vec::new();
    for (dir, _) in rejected {
        let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
            continue;
        };
        let target_dir = parent.join(REJECTED_DIR);
        std::fs::create_dir_all(&target_dir)?;
        let target = target_dir.join(name);
        if target.exists() {
            std::fs::remove_dir_all(&target)?;
        }
        std::fs::rename(dir, &target)?;
        moved.push(target);
    }
    Ok(moved)
}
