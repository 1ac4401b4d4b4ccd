//! How `oxalign train` claims its run folder before anything runs: the folder is locked
//! against a second writer, a fresh start never appends to an old run, and `--resume` picks
//! the newest checkpoint that verifies, checks that the recipe still computes the same run
//! and the reference is the one RL started with, and rewinds the logs to the checkpoint.
//! Every refusal is a user error (exit code 2) naming the folder, file or key.

use std::path::{Path, PathBuf};

use oxalign_actors::controller::find_resume_point;
use oxalign_actors::controller::run::copies::{
    check_metrics, stored_recipe, verify_reference, MetricsCheck,
};
use oxalign_actors::controller::run::folder::{prepare_fresh, rewind_logs, Overwrite, RunLock};
use oxalign_actors::controller::run::resume_point::set_aside;
use oxalign_actors::monitor::files;
use oxalign_actors::recipe::{check_resume, Algorithm, Recipe};

use crate::user_error::IntoUserError;

/// Locks `run_dir` for this process (exit 2 naming the holder when another has it).
pub fn lock(run_dir: &Path) -> anyhow::Result<RunLock> {
    RunLock::acquire(run_dir).user_err("")
}

/// Prepares `run_dir` for a fresh start: refused over checkpoints or a finished run unless
/// `--overwrite` replaces them; an earlier run that never reached a checkpoint is cleared
/// (and said so on stderr).
pub fn claim_fresh(run_dir: &Path, overwrite: bool) -> anyhow::Result<()> {
    let overwrite = if overwrite {
        Overwrite::Replace
    } else {
        Overwrite::Refuse
    };
    let removed = prepare_fresh(run_dir, overwrite).user_err("")?;
    if !removed.is_empty() {
        let what = match overwrite {
            Overwrite::Replace => "an earlier run (--overwrite)",
            Overwrite::Refuse => "an earlier run without checkpoints (nothing to resume)",
        };
        eprintln!(
            "note: {} held {what}; starting it over (removed {})",
            run_dir.display(),
            removed
                .iter()
                .filter_map(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// Chooses the checkpoint `--resume dir` continues from and prepares the folder; returns the
/// checkpoint folder. The checkpoint's files (its `state.json` included) match their
/// checksums; the recipe is checked against the checkpoint's copy; the frozen reference
/// against the checksums recorded when RL started; `metrics.jsonl` holds each step up to
/// the checkpoint exactly once (repaired from the checkpoint's copy when it does not).
pub fn claim_resume(
    dir: &Path,
    recipe: &Recipe,
    allow_change: &[String],
    quiet: bool,
) -> anyhow::Result<PathBuf> {
    let context = format!("--resume {}", dir.display());
    let needs_critic = recipe.rl.algorithm == Algorithm::Ppo;
    let point = find_resume_point(dir, needs_critic).user_err(&context)?;
    let stored = stored_recipe(dir, &point.dir);
    match Recipe::load(&stored, &[]) {
        Ok(old) => check_resume(&old, recipe, &stored, allow_change).user_err("")?,
        Err(e) if stored.exists() => return Err(e).user_err(&context),
        Err(_) => eprintln!(
            "warning: {} is missing; cannot check that the recipe matches the run",
            stored.display()
        ),
    }
    verify_reference(dir, &point.dir, &point.state).user_err(&context)?;
    if !point.rejected.is_empty() {
        let moved = set_aside(&point.rejected).user_err(&context)?;
        for ((_, why), to) in point.rejected.iter().zip(&moved) {
            eprintln!(
                "warning: skipping a damaged checkpoint: {why} (moved to {})",
                to.display()
            );
        }
        eprintln!(
            "warning: resuming from the newest valid checkpoint, {}",
            point.dir.display()
        );
    }
    let rewound = rewind_logs(dir, &point.state).user_err(&context)?;
    if !quiet && rewound.metrics_dropped + rewound.partial_dropped > 0 {
        eprintln!(
            "note: {}: dropped {} metrics line(s) after the checkpoint and {} partly written line(s)",
            dir.display(),
            rewound.metrics_dropped,
            rewound.partial_dropped
        );
    }
    if check_metrics(dir, &point.dir, &point.state).user_err(&context)? == MetricsCheck::Repaired {
        eprintln!(
            "warning: {}/{} did not hold each step up to the checkpoint exactly once; restored it from {}",
            dir.display(),
            files::METRICS,
            point.dir.display()
        );
    }
    Ok(point.dir)
}
