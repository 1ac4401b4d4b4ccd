//! The run files a checkpoint keeps a verified copy of, and their use on resume.
//!
//! A checkpoint is sealed with copies of the run's `metrics.jsonl` (the lines of its RL
//! steps), `recipe.toml` and the frozen reference's `checksums.json`, all covered by the
//! checkpoint's own checksums. A resume then repairs a `metrics.jsonl` that lost or
//! repeated a step from the copy, checks the recipe against the copy, and refuses a
//! reference whose files changed since RL started. It writes no weights.

use crate::controller::error::CheckpointError;
use crate::controller::run::checkpoint::{
    LoopState, Phase, METRICS_COPY, RECIPE_COPY, REFERENCE_SUMS,
};
use crate::controller::run::checksums::{self, CHECKSUMS_FILE};
use crate::monitor::files;
use std::path::{Path, PathBuf};

/// The run's frozen reference folder (the policy as RL started).
pub(crate) const REFERENCE_DIR: &str = "reference";

/// Files of the reference whose checksums must be recorded.
const REFERENCE_FILES: &[&str] = &["config.json", "model.safetensors"];

/// Writes the reference folder's `checksums.json` (every file it holds), once, when the
/// reference is frozen.
pub(crate) fn seal_reference(reference: &Path) -> std::io::Result<()> {
    checksums::write_manifest(reference, &[])
}

/// Copies into the staged checkpoint what a resume verifies the run folder against: the
/// metrics lines of steps up to the checkpoint's (RL checkpoints), `recipe.toml`, and the
/// reference's checksums (RL checkpoints). Files the run does not have are skipped.
pub(crate) fn stage(run_dir: &Path, staged: &Path, state: &LoopState) -> std::io::Result<()> {
    let recipe = run_dir.join(files::RECIPE);
    if recipe.is_file() {
        std::fs::copy(&recipe, staged.join(RECIPE_COPY))?;
    }
    if state.phase != Phase::Rl {
        return Ok(());
    }
    let sums = run_dir.join(REFERENCE_DIR).join(CHECKSUMS_FILE);
    if sums.is_file() {
        std::fs::copy(&sums, staged.join(REFERENCE_SUMS))?;
    }
    let metrics = std::fs::read_to_string(run_dir.join(files::METRICS)).unwrap_or_default();
    let kept: String = metrics
        .split_inclusive('\n')
        .filter(|line| line_step(line).is_some_and(|s| s <= state.step))
        .collect();
    std::fs::write(staged.join(METRICS_COPY), kept)
}

/// The `step` of one whole JSON line of `metrics.jsonl`, if it is one.
fn line_step(line: &str) -> Option<u64> {
    if !line.ends_with('\n') {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(line.trim_end()).ok()?;
    v.get("step").and_then(|s| s.as_u64())
}

/// The steps of a metrics file's lines, in order (`None` for a line without one).
fn steps_of(text: &str) -> Vec<Option<u64>> {
    text.split_inclusive('\n')
        .filter(|l| !l.trim().is_empty())
        .map(line_step)
        .collect()
}

/// True when `steps` is exactly 1, 2, ..., `last`.
fn covers(steps: &[Option<u64>], last: u64) -> bool {
    steps.len() as u64 == last && steps.iter().zip(1..).all(|(s, want)| *s == Some(want))
}

/// A short rendering of what a metrics file holds, for an error message.
fn describe(steps: &[Option<u64>]) -> String {
    let shown: Vec<String> = steps
        .iter()
        .take(12)
        .map(|s| s.map_or("?".into(), |s| s.to_string()))
        .collect();
    let more = if steps.len() > 12 { ", ..." } else { "" };
    format!("[{}{more}] ({} lines)", shown.join(", "), steps.len())
}

/// What [`check_metrics`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsCheck {
    /// `metrics.jsonl` already held each step once.
    Whole,
    /// It was rewritten from the checkpoint's copy.
    Repaired,
}

/// Checks that the run's `metrics.jsonl` (already rewound to the checkpoint) holds each RL
/// step 1..=N of the checkpoint exactly once, in order; if not, restores it from the
/// checkpoint's verified copy, or refuses when there is none (or it is incomplete too).
pub fn check_metrics(
    run_dir: &Path,
    ckpt: &Path,
    state: &LoopState,
) -> Result<MetricsCheck, CheckpointError> {
    let last = match state.phase {
        Phase::Sft => 0,
        Phase::Rl => state.step,
    };
    let path = run_dir.join(files::METRICS);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let steps = steps_of(&text);
    if covers(&steps, last) {
        return Ok(MetricsCheck::Whole);
    }
    let gap = || CheckpointError::MetricsGap {
        path: path.clone(),
        checkpoint: ckpt.to_path_buf(),
        step: last,
        found: describe(&steps),
    };
    let copy = if last == 0 {
        String::new()
    } else {
        std::fs::read_to_string(ckpt.join(METRICS_COPY)).map_err(|_| gap())?
    };
    if !covers(&steps_of(&copy), last) {
        return Err(gap());
    }
    let tmp = path.with_extension("jsonl.tmp");
    let unreadable = |source| CheckpointError::Unreadable {
        path: path.clone(),
        source,
    };
    std::fs::write(&tmp, copy).map_err(unreadable)?;
    std::fs::rename(&tmp, &path).map_err(unreadable)?;
    Ok(MetricsCheck::Repaired)
}

/// The recipe a resume is checked against: the checkpoint's verified copy when it has one,
/// else the run folder's `recipe.toml`.
pub fn stored_recipe(run_dir: &Path, ckpt: &Path) -> PathBuf {
    let copy = ckpt.join(RECIPE_COPY);
    if copy.is_file() {
        copy
    } else {
        run_dir.join(files::RECIPE)
    }
}

/// Checks the run's frozen reference against the checksums the RL checkpoint `ckpt`
/// recorded of it. An SFT checkpoint (no reference yet) passes; an RL checkpoint without
/// the record fails, since the reference could not be verified.
pub fn verify_reference(
    run_dir: &Path,
    ckpt: &Path,
    state: &LoopState,
) -> Result<(), CheckpointError> {
    if state.phase != Phase::Rl {
        return Ok(());
    }
    let reference = run_dir.join(REFERENCE_DIR);
    let recorded = ckpt.join(REFERENCE_SUMS);
    if !recorded.is_file() {
        return Err(CheckpointError::MissingFile {
            checkpoint: ckpt.to_path_buf(),
            file: REFERENCE_SUMS.into(),
        });
    }
    let changed = |file: String| CheckpointError::ReferenceChanged {
        reference: reference.clone(),
        checkpoint: ckpt.to_path_buf(),
        file,
    };
    let required: Vec<String> = REFERENCE_FILES.iter().map(|f| f.to_string()).collect();
    match checksums::verify_against(&recorded, &reference, &required) {
        Ok(()) => Ok(()),
        Err(CheckpointError::ChecksumMismatch { file, .. })
        | Err(CheckpointError::MissingFile { file, .. }) => Err(changed(file)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(phase: Phase, step: u64) -> LoopState {
        let kl = oxalign_rlhf::KlController::Fixed(oxalign_rlhf::FixedKl { beta: 0.1 });
        LoopState {
            phase,
            sft_step: 4,
            step,
            policy_version: step,
            ..LoopState::start(kl)
        }
    }

    fn lines(steps: &[u64]) -> String {
        steps
            .iter()
            .map(|s| format!("{{\"step\":{s}}}\n"))
            .collect()
    }

    #[test]
    fn a_metrics_file_missing_or_repeating_a_step_is_repaired_from_the_checkpoint() {
        let run = tempfile::tempdir().unwrap();
        let ckpt = run.path().join("checkpoints/step_000003");
        std::fs::create_dir_all(&ckpt).unwrap();
        let metrics = run.path().join(files::METRICS);
        std::fs::write(&metrics, lines(&[1, 2, 3, 4])).unwrap();
        let st = state(Phase::Rl, 3);
        stage(run.path(), &ckpt, &st).unwrap();
        assert_eq!(
            std::fs::read_to_string(ckpt.join(METRICS_COPY)).unwrap(),
            lines(&[1, 2, 3])
        );

        for damaged in [
            lines(&[1, 3]),
            lines(&[1, 2, 2, 3]),
            lines(&[]),
            lines(&[1, 2, 3, 3]),
        ] {
            std::fs::write(&metrics, &damaged).unwrap();
            let got = check_metrics(run.path(), &ckpt, &st).unwrap();
            assert_eq!(got, MetricsCheck::Repaired, "{damaged:?}");
            assert_eq!(
                std::fs::read_to_string(&metrics).unwrap(),
                lines(&[1, 2, 3])
            );
        }
        assert_eq!(
            check_metrics(run.path(), &ckpt, &st).unwrap(),
            MetricsCheck::Whole
        );

        // Without a copy (or with a damaged one) the gap is refused, naming the steps.
        std::fs::write(ckpt.join(METRICS_COPY), lines(&[1, 2])).unwrap();
        std::fs::write(&metrics, lines(&[1, 3])).unwrap();
        let err = check_metrics(run.path(), &ckpt, &st)
            .unwrap_err()
            .to_string();
        assert!(err.contains("[1, 3]") && err.contains("1..=3"), "{err}");
    }

    #[test]
    fn a_changed_reference_is_refused_naming_the_file() {
        let run = tempfile::tempdir().unwrap();
        let reference = run.path().join(REFERENCE_DIR);
        std::fs::create_dir_all(&reference).unwrap();
        std::fs::write(reference.join("config.json"), b"{}").unwrap();
        std::fs::write(reference.join("model.safetensors"), b"weights").unwrap();
        seal_reference(&reference).unwrap();
        let ckpt = run.path().join("checkpoints/step_000001");
        std::fs::create_dir_all(&ckpt).unwrap();
        let st = state(Phase::Rl, 1);
        // Before the checkpoint recorded the reference: refused, it cannot be checked.
        assert!(verify_reference(run.path(), &ckpt, &st).is_err());
        stage(run.path(), &ckpt, &st).unwrap();
        verify_reference(run.path(), &ckpt, &st).unwrap();
        // An edit of the reference's own checksums does not hide a change of its weights.
        std::fs::write(reference.join("model.safetensors"), b"weightz").unwrap();
        seal_reference(&reference).unwrap();
        let err = verify_reference(run.path(), &ckpt, &st)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("model.safetensors") && err.contains("reference"),
            "{err}"
        );
        verify_reference(run.path(), &ckpt, &state(Phase::Sft, 0)).unwrap();
    }
}
