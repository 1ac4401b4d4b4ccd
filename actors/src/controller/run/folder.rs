//! Claiming a run folder for a new process, so the folder never mixes two runs or repeats a
//! step. A fresh start is refused over an old run's checkpoints or a finished run's outputs
//! (`summary.json`, `final/`, which later stages may read) unless the user asks to
//! overwrite, and otherwise clears the old run's files; a resume rewinds `metrics.jsonl`, `samples.jsonl` and `timeline.jsonl` to the
//! checkpoint's step (dropping a partly written last line) and removes the stale `summary.json`.
//! Checkpoints themselves are chosen in `resume_point.rs`. While a process uses the folder
//! it holds [`RunLock`], so a second writer is refused instead of interleaving its logs.

use crate::controller::run::checkpoint::{LoopState, Phase};
use crate::monitor::files;
use std::path::{Path, PathBuf};

/// Why a run folder cannot be claimed.
#[derive(Debug, thiserror::Error)]
pub enum RunFolderError {
    /// A fresh start over a folder that holds an earlier run's checkpoints.
    #[error(
        "{run_dir} already holds a run with checkpoints; continue it with --resume {run_dir}, pick another run.name (--set run.name=...), or delete the folder to start over"
    )]
    HasCheckpoints {
        /// The run folder.
        run_dir: PathBuf,
    },
    /// A fresh start over a folder that holds a finished run's outputs.
    #[error(
        "{run_dir} holds a finished run ({found}), which later stages may read; pick another run.name (--set run.name=...), or pass --overwrite to replace it"
    )]
    Finished {
        /// The run folder.
        run_dir: PathBuf,
        /// The finished run's outputs found (`summary.json`, `final/`).
        found: String,
    },
    /// Another process holds the run folder's lock.
    #[error(
        "{run_dir} is in use by another oxalign process ({holder}); wait for it to finish or stop it (lock file {lock})"
    )]
    Locked {
        /// The run folder.
        run_dir: PathBuf,
        /// What the holder wrote into the lock file (pid and host), if readable.
        holder: String,
        /// The lock file.
        lock: PathBuf,
    },
    /// A file of the folder could not be read, written or removed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was attempted.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RunFolderError {
    let path = path.to_path_buf();
    move |source| RunFolderError::Io {
        action,
        path,
        source,
    }
}

/// The lock file inside a run folder.
pub(crate) const LOCK_FILE: &str = ".oxalign.lock";

/// An exclusive lock (`flock`) on a run folder, held until dropped. The lock file names
/// the holder (pid and host), so a refused second writer can say who has the folder. The
/// kernel releases the lock when the process dies, so a killed run never leaves it stuck.
#[derive(Debug)]
pub struct RunLock {
    _file: std::fs::File,
}

impl RunLock {
    /// Takes the lock of `run_dir` (created if missing) without waiting; refused with
    /// [`RunFolderError::Locked`] while another process (or another open of it) holds it.
    pub fn acquire(run_dir: &Path) -> Result<RunLock, RunFolderError> {
        use std::io::{Read, Seek, Write};
        std::fs::create_dir_all(run_dir).map_err(io("cannot create", run_dir))?;
        let lock = run_dir.join(LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock)
            .map_err(io("cannot open", &lock))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => "holder unknown".to_string(),
                    h => h.to_string(),
                };
                return Err(RunFolderError::Locked {
                    run_dir: run_dir.to_path_buf(),
                    holder,
                    lock,
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io("cannot lock", &lock)(e)),
        }
        let me = format!("pid {} on host {}", std::process::id(), host_name());
        file.set_len(0)
            .and_then(|_| file.rewind())
            .and_then(|_| file.write_all(me.as_bytes()))
            .and_then(|_| file.flush())
            .map_err(io("cannot write", &lock))?;
        Ok(RunLock { _file: file })
    }
}

/// This machine's host name (Linux), or `unknown`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Files and folders a run writes (besides `checkpoints/`), removed by a fresh start.
const RUN_OUTPUTS: &[&str] = &[
    files::METRICS,
    files::SAMPLES,
    files::TIMELINE,
    files::RUN,
    files::ACTORS,
    files::RECIPE,
    "summary.json",
    "final",
    "init",
    "reference",
];

/// Refuses a folder whose checkpoints or finished outputs a fresh start would delete.
fn refuse_earlier_results(run_dir: &Path) -> Result<(), RunFolderError> {
    if has_checkpoints(run_dir) {
        return Err(RunFolderError::HasCheckpoints {
            run_dir: run_dir.to_path_buf(),
        });
    }
    let found: Vec<&str> = ["summary.json", "final/"]
        .into_iter()
        .filter(|name| run_dir.join(name.trim_end_matches('/')).exists())
        .collect();
    if found.is_empty() {
        return Ok(());
    }
    Err(RunFolderError::Finished {
        run_dir: run_dir.to_path_buf(),
        found: found.join(", "),
    })
}

/// True when `run_dir/checkpoints` holds anything but interrupted staging folders.
fn has_checkpoints(run_dir: &Path) -> bool {
    std::fs::read_dir(run_dir.join(files::CHECKPOINTS))
        .map(|entries| {
            entries
                .flatten()
                .any(|e| !e.file_name().to_string_lossy().starts_with('.'))
        })
        .unwrap_or(false)
}

/// Whether a fresh start may replace a finished run's outputs and checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    /// Refuse a folder holding checkpoints or a finished run.
    Refuse,
    /// Replace them (the user passed `--overwrite`).
    Replace,
}

/// Prepares `run_dir` for a fresh start. Refused when it holds checkpoints or a finished
/// run's outputs, unless `overwrite` replaces them; otherwise the files of an earlier run
/// that never reached a checkpoint are removed (it cannot be resumed, and its logs would mix
/// with the new run's). Returns what was removed.
pub fn prepare_fresh(run_dir: &Path, overwrite: Overwrite) -> Result<Vec<PathBuf>, RunFolderError> {
    if overwrite == Overwrite::Refuse {
        refuse_earlier_results(run_dir)?;
    }
    let mut removed = Vec::new();
    for name in RUN_OUTPUTS
        .iter()
        .copied()
        .chain(std::iter::once(files::CHECKPOINTS))
    {
        let p = run_dir.join(name);
        if p.is_dir() {
            std::fs::remove_dir_all(&p).map_err(io("cannot remove", &p))?;
        } else if p.exists() {
            std::fs::remove_file(&p).map_err(io("cannot remove", &p))?;
        } else {
            continue;
        }
        removed.push(p);
    }
    Ok(removed)
}

/// What [`rewind_logs`] dropped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rewound {
    /// Lines of `metrics.jsonl` for steps after the checkpoint.
    pub metrics_dropped: usize,
    /// Lines of `timeline.jsonl` for steps after the checkpoint.
    pub timeline_dropped: usize,
    /// Lines of `samples.jsonl` for steps after the checkpoint.
    pub samples_dropped: usize,
    /// Lines that were not whole JSON objects (a write cut short by a kill).
    pub partial_dropped: usize,
}

/// Rewinds the logs of `run_dir` to the checkpoint state `state`: keeps each line of
/// `metrics.jsonl`, `samples.jsonl` and `timeline.jsonl` whose `step` is at most the
/// checkpoint's RL step (none of the metrics or samples for an SFT checkpoint), drops lines that are not whole JSON objects,
/// and removes `summary.json`. Files are rewritten atomically.
pub fn rewind_logs(run_dir: &Path, state: &LoopState) -> Result<Rewound, RunFolderError> {
    let last = match state.phase {
        Phase::Sft => None,
        Phase::Rl => Some(state.step),
    };
    let mut r = Rewound::default();
    let (kept_m, partial_m) = rewind_file(&run_dir.join(files::METRICS), |s| {
        last.is_some_and(|l| s <= l)
    })?;
    r.metrics_dropped = kept_m;
    let (kept_s, partial_s) = rewind_file(&run_dir.join(files::SAMPLES), |s| {
        last.is_some_and(|l| s <= l)
    })?;
    r.samples_dropped = kept_s;
    let (kept_t, partial_t) =
        rewind_file(&run_dir.join(files::TIMELINE), |s| s <= last.unwrap_or(0))?;
    r.timeline_dropped = kept_t;
    r.partial_dropped = partial_m + partial_s + partial_t;
    let summary = run_dir.join("summary.json");
    if summary.exists() {
        std::fs::remove_file(&summary).map_err(io("cannot remove", &summary))?;
    }
    Ok(r)
}

/// Keeps the lines of a JSONL file whose `step` passes `keep`; returns (lines dropped for
/// their step, lines dropped as partial). A missing file is left missing.
fn rewind_file(path: &Path, keep: impl Fn(u64) -> bool) -> Result<(usize, usize), RunFolderError> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok((0, 0));
    };
    let (mut out, mut by_step, mut partial) = (String::new(), 0, 0);
    for line in text.split_inclusive('\n') {
        let whole = line.ends_with('\n');
        let parsed: Option<serde_json::Value> = serde_json::from_str(line.trim_end()).ok();
        match parsed.filter(|v| whole && v.is_object()) {
            None if line.trim().is_empty() => {}
            None => partial += 1,
            Some(v) => {
                let step = v.get("step").and_then(|s| s.as_u64()).unwrap_or(0);
                if keep(step) {
                    out.push_str(line);
                } else {
                    by_step += 1;
                }
            }
        }
    }
    if by_step + partial > 0 {
        let tmp = path.with_extension("jsonl.tmp");
        std::fs::write(&tmp, out).map_err(io("cannot write", &tmp))?;
        std::fs::rename(&tmp, path).map_err(io("cannot rename into", path))?;
    }
    Ok((by_step, partial))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rl_state(step: u64) -> LoopState {
        let kl = oxalign_rlhf::KlController::Fixed(oxalign_rlhf::FixedKl { beta: 0.1 });
        LoopState {
            phase: Phase::Rl,
            sft_step: 10,
            step,
            policy_version: step,
            ..LoopState::start(kl)
        }
    }

    #[test]
    fn rewind_keeps_steps_up_to_the_checkpoint_and_drops_a_partial_line() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let metrics = "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n{\"st";
        std::fs::write(d.join(files::METRICS), metrics).unwrap();
        std::fs::write(d.join(files::TIMELINE), "{\"step\":0}\n{\"step\":3}\n").unwrap();
        let samples = "{\"step\":2}\n{\"step\":2}\n{\"step\":3}\n{\"step\":3}\n";
        std::fs::write(d.join(files::SAMPLES), samples).unwrap();
        std::fs::write(d.join("summary.json"), "{}").unwrap();
        let r = rewind_logs(d, &rl_state(2)).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.join(files::METRICS)).unwrap(),
            "{\"step\":1}\n{\"step\":2}\n"
        );
        assert_eq!(
            std::fs::read_to_string(d.join(files::TIMELINE)).unwrap(),
            "{\"step\":0}\n"
        );
        assert_eq!(
            std::fs::read_to_string(d.join(files::SAMPLES)).unwrap(),
            "{\"step\":2}\n{\"step\":2}\n"
        );
        assert_eq!(
            r,
            Rewound {
                metrics_dropped: 1,
                timeline_dropped: 1,
                samples_dropped: 2,
                partial_dropped: 1
            }
        );
        assert!(!d.join("summary.json").exists());
    }

    #[test]
    fn a_second_lock_on_a_run_folder_is_refused_naming_the_holder_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("runs/r");
        let first = RunLock::acquire(&run).unwrap();
        let err = RunLock::acquire(&run).unwrap_err().to_string();
        let me = format!("pid {}", std::process::id());
        assert!(err.contains(&me) && err.contains("in use"), "{err}");
        drop(first);
        let again = RunLock::acquire(&run).unwrap();
        drop(again);
    }

    #[test]
    fn fresh_start_clears_a_run_without_checkpoints_and_refuses_one_with() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join(files::METRICS), "{\"step\":1}\n").unwrap();
        std::fs::create_dir_all(d.join("init")).unwrap();
        std::fs::write(d.join("notes.txt"), "mine").unwrap();
        let removed = prepare_fresh(d, Overwrite::Refuse).unwrap();
        assert_eq!(removed.len(), 2);
        assert!(!d.join(files::METRICS).exists() && d.join("notes.txt").exists());
        std::fs::create_dir_all(d.join("checkpoints/step_000002")).unwrap();
        let err = prepare_fresh(d, Overwrite::Refuse).unwrap_err();
        assert!(err.to_string().contains("--resume"), "{err}");
    }

    /// A finished offline run (no checkpoints, but `final/` and `summary.json`, which the
    /// next stage reads) is not silently replaced; `--overwrite` replaces it and its
    /// checkpoints, and keeps the user's own files.
    #[test]
    fn a_finished_run_is_replaced_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("final")).unwrap();
        std::fs::write(d.join("final/model.safetensors"), "weights").unwrap();
        std::fs::write(d.join("summary.json"), "{}").unwrap();
        std::fs::write(d.join("notes.txt"), "mine").unwrap();
        let err = prepare_fresh(d, Overwrite::Refuse).unwrap_err().to_string();
        assert!(
            err.contains("summary.json, final/") && err.contains("--overwrite"),
            "{err}"
        );
        assert!(d.join("final/model.safetensors").exists());
        std::fs::create_dir_all(d.join("checkpoints/step_000002")).unwrap();
        let removed = prepare_fresh(d, Overwrite::Replace).unwrap();
        assert_eq!(removed.len(), 3, "{removed:?}");
        assert!(!d.join("final").exists() && !d.join("checkpoints").exists());
        assert!(d.join("notes.txt").exists());
    }
}
