//! Checkpoints of a run: policy and critic in HF layout with their optimizer states, and the
//! loop's own state (phase, step, data position, KL controller, results so far).
//!
//! RL checkpoints are `checkpoints/step_<N>/`; SFT checkpoints (policy and its optimizer
//! only) are `checkpoints/sft_<N>/` and order before every RL checkpoint. A checkpoint is
//! written into a temporary folder, given per-file SHA-256 checksums (`checksums.json`),
//! fsynced, then renamed into place, so a crash mid-save leaves the previous checkpoint
//! intact; a folder without `state.json` (written last) is never taken as a checkpoint.

use crate::controller::error::CheckpointError;
use crate::controller::rl::rollout::Rollout;
use crate::controller::run::checksums;
use oxalign_rlhf::KlController;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// File that marks a complete checkpoint (written last).
pub(crate) const STATE_FILE: &str = "state.json";

/// The rollouts generated ahead of a checkpoint's step (only when there are some).
pub(crate) const AHEAD_FILE: &str = "rollouts_ahead.json";

/// The checkpoint's copy of the run's `metrics.jsonl` (RL steps up to its own).
pub(crate) const METRICS_COPY: &str = "metrics.jsonl";

/// The checkpoint's copy of the run's `recipe.toml`.
pub(crate) const RECIPE_COPY: &str = "recipe.toml";

/// The checkpoint's copy of the frozen reference's `checksums.json` (RL checkpoints).
pub(crate) const REFERENCE_SUMS: &str = "reference.checksums.json";

/// The phase a checkpoint was taken in.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// During the supervised warm-up: policy weights and optimizer only.
    Sft,
    /// During RL (step 0 is the start of RL, after SFT).
    #[default]
    Rl,
}

/// The loop's state at the end of a step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoopState {
    /// The phase this state belongs to.
    #[serde(default)]
    pub phase: Phase,
    /// SFT steps completed.
    #[serde(default)]
    pub sft_step: u64,
    /// RL steps completed.
    pub step: u64,
    /// Next training-stream position to read.
    pub data_position: u64,
    /// Policy version (updates applied since the start of RL).
    pub policy_version: u64,
    /// The KL controller (β and, if adaptive, its settings).
    pub kl: KlController,
    /// Held-out accuracy after SFT, if measured.
    pub accuracy_sft: Option<f64>,
    /// Held-out sampled accuracy after SFT, if measured.
    #[serde(default)]
    pub sampled_accuracy_sft: Option<f64>,
    /// Held-out accuracy of the initial model, if measured.
    pub accuracy_init: Option<f64>,
    /// Wall seconds spent in this run before this checkpoint (across resumes).
    pub wall_seconds: f64,
    /// Mean reward over the run's first [`REWARD_WINDOW`] RL steps (fewer in a shorter run).
    #[serde(default)]
    pub reward_first: Option<f64>,
    /// Mean reward over the newest [`REWARD_WINDOW`] RL steps.
    #[serde(default)]
    pub reward_last: Option<f64>,
    /// The step rewards `reward_first` averages (at most [`REWARD_WINDOW`]).
    #[serde(default)]
    pub rewards_first: Vec<f64>,
    /// The step rewards `reward_last` averages: the newest [`REWARD_WINDOW`].
    #[serde(default)]
    pub rewards_last: Vec<f64>,
    /// Rollouts generated ahead for the next steps (`rl.max_staleness ≥ 1`), oldest first.
    /// Kept in [`AHEAD_FILE`] beside `state.json`, so a resumed or replayed step trains on
    /// exactly the batch the uninterrupted run would have.
    #[serde(skip)]
    pub(crate) ahead: Vec<Rollout>,
}

/// RL steps the summary's `reward_first` and `reward_last` average over.
pub const REWARD_WINDOW: usize = 10;

impl LoopState {
    /// Records the mean reward of the step just done into the first and newest windows. A
    /// state resumed from a checkpoint written before the windows existed keeps its
    /// `reward_first`.
    pub(crate) fn record_reward(&mut self, reward: f64) {
        let first_open = self.reward_first.is_none() || !self.rewards_first.is_empty();
        if first_open && self.rewards_first.len() < REWARD_WINDOW {
            self.rewards_first.push(reward);
            self.reward_first = Some(mean(&self.rewards_first));
        }
        self.rewards_last.push(reward);
        if self.rewards_last.len() > REWARD_WINDOW {
            self.rewards_last.remove(0);
        }
        self.reward_last = Some(mean(&self.rewards_last));
    }

    /// The state of a run before its first step: SFT phase, nothing measured, KL controller
    /// `kl`.
    pub fn start(kl: KlController) -> LoopState {
        LoopState {
            phase: Phase::Sft,
            sft_step: 0,
            step: 0,
            data_position: 0,
            policy_version: 0,
            kl,
            accuracy_sft: None,
            sampled_accuracy_sft: None,
            accuracy_init: None,
            wall_seconds: 0.0,
            reward_first: None,
            reward_last: None,
            rewards_first: Vec::new(),
            rewards_last: Vec::new(),
            ahead: Vec::new(),
        }
    }

    /// The folder a checkpoint of this state goes to.
    pub fn checkpoint_dir(&self, run_dir: &Path) -> PathBuf {
        match self.phase {
            Phase::Sft => sft_checkpoint_dir(run_dir, self.sft_step),
            Phase::Rl => checkpoint_dir(run_dir, self.step),
        }
    }
}

/// `<run>/checkpoints/step_<N>`.
pub(crate) fn checkpoint_dir(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join("checkpoints").join(format!("step_{step:06}"))
}

/// `<run>/checkpoints/sft_<N>`: after N SFT steps.
pub(crate) fn sft_checkpoint_dir(run_dir: &Path, sft_step: u64) -> PathBuf {
    run_dir
        .join("checkpoints")
        .join(format!("sft_{sft_step:06}"))
}

/// Where a checkpoint folder name sits in the run: `(phase, step)`, or `None` for a name
/// that is not a checkpoint's.
pub(crate) fn checkpoint_order(name: &str) -> Option<(Phase, u64)> {
    if let Some(n) = name.strip_prefix("step_") {
        return n.parse().ok().map(|n| (Phase::Rl, n));
    }
    name.strip_prefix("sft_")
        .and_then(|n| n.parse().ok())
        .map(|n| (Phase::Sft, n))
}

/// Every checkpoint folder of a run (sealed or not), newest first.
pub(crate) fn checkpoint_folders(run_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(run_dir.join("checkpoints")) else {
        return Vec::new();
    };
    let mut found: Vec<((Phase, u64), PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            checkpoint_order(&name).map(|k| (k, e.path()))
        })
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found.into_iter().map(|(_, p)| p).collect()
}

/// The newest sealed checkpoint of a run, if any (not verified; see `resume_point`).
pub fn latest_checkpoint(run_dir: &Path) -> Option<PathBuf> {
    checkpoint_folders(run_dir)
        .into_iter()
        .find(|p| p.join(STATE_FILE).is_file())
}

/// Reads a checkpoint's loop state.
pub(crate) fn read_state(ckpt: &Path) -> Result<LoopState, CheckpointError> {
    let path = ckpt.join(STATE_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| CheckpointError::Unreadable {
        path: path.clone(),
        source,
    })?;
    let mut state: LoopState =
        serde_json::from_str(&text).map_err(|source| CheckpointError::BadJson { path, source })?;
    let ahead = ckpt.join(AHEAD_FILE);
    if ahead.is_file() {
        let text =
            std::fs::read_to_string(&ahead).map_err(|source| CheckpointError::Unreadable {
                path: ahead.clone(),
                source,
            })?;
        state.ahead = serde_json::from_str(&text).map_err(|source| CheckpointError::BadJson {
            path: ahead,
            source,
        })?;
    }
    Ok(state)
}

/// Writes the rollouts generated ahead (if any), `state.json`, then `checksums.json`
/// (SHA-256 of every file, `state.json` included) into the staged folder, and fsyncs every
/// file in it. The staged folder becomes a checkpoint only when [`publish`] renames it.
pub(crate) fn seal(staged: &Path, state: &LoopState) -> std::io::Result<()> {
    if !state.ahead.is_empty() {
        let text = serde_json::to_string(&state.ahead).map_err(std::io::Error::other)?;
        std::fs::write(staged.join(AHEAD_FILE), text)?;
    }
    let text = serde_json::to_string_pretty(state).map_err(std::io::Error::other)?;
    std::fs::write(staged.join(STATE_FILE), text)?;
    checksums::write_manifest(staged, &[])?;
    fsync_tree(staged)
}

/// Moves a sealed staging folder to its final name (replacing an older copy of the same
/// step) and fsyncs the parent.
pub(crate) fn publish(staged: &Path, final_dir: &Path) -> std::io::Result<()> {
    if final_dir.exists() {
        std::fs::remove_dir_all(final_dir)?;
    }
    std::fs::rename(staged, final_dir)?;
    if let Some(parent) = final_dir.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// A fresh staging folder next to the final one.
pub(crate) fn staging_dir(final_dir: &Path) -> std::io::Result<PathBuf> {
    let parent = final_dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let name = final_dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let staged = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    if staged.exists() {
        std::fs::remove_dir_all(&staged)?;
    }
    std::fs::create_dir_all(&staged)?;
    Ok(staged)
}

/// Deletes all but the newest `keep` complete checkpoints, stale staging folders and step
/// folders that were never sealed.
pub(crate) fn prune(run_dir: &Path, keep: usize) -> std::io::Result<()> {
    let dir = run_dir.join("checkpoints");
    let mut steps: Vec<((Phase, u64), PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with('.') && name.contains(".tmp-") {
            std::fs::remove_dir_all(entry.path())?;
        } else if let Some(n) = checkpoint_order(&name) {
            if entry.path().join(STATE_FILE).is_file() {
                steps.push((n, entry.path()));
            } else {
                // Never sealed: not a checkpoint, and never resumed from.
                std::fs::remove_dir_all(entry.path())?;
            }
        }
    }
    steps.sort();
    let drop = steps.len().saturating_sub(keep.max(1));
    for (_, p) in steps.into_iter().take(drop) {
        std::fs::remove_dir_all(p)?;
    }
    Ok(())
}

fn fsync_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)?.flatten() {
        let p = entry.path();
        if p.is_dir() {
            fsync_tree(&p)?;
        } else {
            std::fs::File::open(&p)?.sync_all()?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_rewards_are_means_over_the_first_and_newest_ten_steps() {
        let mut st = LoopState::start(KlController::Fixed(oxalign_rlhf::FixedKl { beta: 0.0 }));
        for step in 1..=25 {
            st.record_reward(step as f64);
        }
        // Steps 1..=10 and 16..=25.
        assert_eq!(st.reward_first, Some(5.5));
        assert_eq!(st.reward_last, Some(20.5));
        // A short run averages what it has.
        let mut short = LoopState::start(KlController::Fixed(oxalign_rlhf::FixedKl { beta: 0.0 }));
        short.record_reward(1.0);
        short.record_reward(2.0);
        assert_eq!(
            (short.reward_first, short.reward_last),
            (Some(1.5), Some(1.5))
        );
        // A state from before the windows keeps its first reward.
        let mut old = LoopState::start(KlController::Fixed(oxalign_rlhf::FixedKl { beta: 0.0 }));
        old.reward_first = Some(0.25);
        old.record_reward(1.0);
        assert_eq!((old.reward_first, old.reward_last), (Some(0.25), Some(1.0)));
    }

    fn state(step: u64) -> LoopState {
        LoopState {
            phase: Phase::Rl,
            sft_step: 0,
            reward_first: None,
            reward_last: None,
            rewards_first: Vec::new(),
            rewards_last: Vec::new(),
            step,
            data_position: step * 10,
            policy_version: step,
            kl: KlController::Fixed(oxalign_rlhf::FixedKl { beta: 0.1 }),
            accuracy_sft: Some(0.5),
            sampled_accuracy_sft: Some(0.4),
            accuracy_init: None,
            wall_seconds: 1.0,
            ahead: Vec::new(),
        }
    }

    #[test]
    fn only_sealed_checkpoints_count_and_prune_keeps_newest() {
        let run = tempfile::tempdir().unwrap();
        for step in [1, 2, 3] {
            let fin = checkpoint_dir(run.path(), step);
            let staged = staging_dir(&fin).unwrap();
            std::fs::write(staged.join("weights.bin"), b"w").unwrap();
            seal(&staged, &state(step)).unwrap();
            publish(&staged, &fin).unwrap();
        }
        // A crash mid-save: a staged folder without state.json, and an unsealed step folder.
        let crashed = staging_dir(&checkpoint_dir(run.path(), 4)).unwrap();
        std::fs::write(crashed.join("weights.bin"), b"partial").unwrap();
        std::fs::create_dir_all(checkpoint_dir(run.path(), 5)).unwrap();
        let latest = latest_checkpoint(run.path()).unwrap();
        assert_eq!(read_state(&latest).unwrap(), state(3));
        prune(run.path(), 2).unwrap();
        assert!(!checkpoint_dir(run.path(), 1).exists());
        assert!(checkpoint_dir(run.path(), 2).exists());
        assert!(!crashed.exists());
        assert!(!checkpoint_dir(run.path(), 5).exists());
        assert_eq!(latest_checkpoint(run.path()).unwrap(), latest);
    }
}
