//! Why a checkpoint (or a run folder) cannot be resumed from. Every variant names the
//! folder or file; all of them are the user's input being unusable (exit code 2 at the CLI).

use std::path::PathBuf;

/// A checkpoint or run folder that cannot be used to resume.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file of the checkpoint could not be read.
    #[error("cannot read {path}: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `state.json` or `checksums.json` is not what oxalign writes.
    #[error("{path} is malformed: {source}")]
    BadJson {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The checkpoint folder was never sealed (the save was interrupted).
    #[error("{checkpoint} is incomplete: it has no {marker} (the save was interrupted)")]
    Unsealed {
        /// The checkpoint folder.
        checkpoint: PathBuf,
        /// The file a sealed checkpoint has.
        marker: &'static str,
    },
    /// A file the checkpoint needs is absent (or not listed in its checksums).
    #[error("{checkpoint} lacks {file}")]
    MissingFile {
        /// The checkpoint folder.
        checkpoint: PathBuf,
        /// Path relative to the checkpoint folder.
        file: String,
    },
    /// A file's SHA-256 differs from the one recorded when the checkpoint was written.
    #[error("{checkpoint}: {file} does not match its recorded SHA-256 (the file is corrupt)")]
    ChecksumMismatch {
        /// The checkpoint folder.
        checkpoint: PathBuf,
        /// Path relative to the checkpoint folder.
        file: String,
    },
    /// `state.json` parses but contradicts its own checkpoint (a value out of range, or a
    /// step that is not the folder's).
    #[error("{checkpoint}/state.json: {field} is {found}, expected {expected}")]
    BadState {
        /// The checkpoint folder.
        checkpoint: PathBuf,
        /// The key of `state.json`.
        field: &'static str,
        /// The value found.
        found: String,
        /// What the checkpoint requires.
        expected: String,
    },
    /// `metrics.jsonl` does not hold each step up to the checkpoint exactly once, and the
    /// checkpoint has no copy to repair it from.
    #[error("{path} holds steps {found}, expected each of steps 1..={step} exactly once; {checkpoint} has no copy to repair it from (restore the file, or start a new run with --set run.name=NEW)")]
    MetricsGap {
        /// The run's `metrics.jsonl`.
        path: PathBuf,
        /// The checkpoint resumed.
        checkpoint: PathBuf,
        /// The checkpoint's RL step.
        step: u64,
        /// The steps found, in file order (shortened).
        found: String,
    },
    /// A file of the frozen reference differs from the checksums recorded when RL started.
    #[error("{reference}: {file} does not match the SHA-256 recorded in {checkpoint} when the reference was frozen (the reference was changed or is corrupt; restore it, or start a new run)")]
    ReferenceChanged {
        /// The run's reference folder.
        reference: PathBuf,
        /// The checkpoint holding the recorded checksums.
        checkpoint: PathBuf,
        /// The reference file, relative to its folder.
        file: String,
    },
    /// The run folder holds no checkpoint folder at all.
    #[error("{run_dir} holds no checkpoint (expected {run_dir}/checkpoints/step_N/ or sft_N/)")]
    NoCheckpoint {
        /// The run folder.
        run_dir: PathBuf,
    },
    /// Every checkpoint of the run folder failed verification.
    #[error(
        "{run_dir} holds no valid checkpoint to resume from:\n{}\nstart a new run (--set run.name=NEW) or restore the damaged files",
        .reasons.iter().map(|r| format!("  {r}")).collect::<Vec<_>>().join("\n")
    )]
    NoValidCheckpoint {
        /// The run folder.
        run_dir: PathBuf,
        /// Why each checkpoint was rejected, newest first.
        reasons: Vec<String>,
    },
}
