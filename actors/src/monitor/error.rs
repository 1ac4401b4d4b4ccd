//! Errors of the monitor: writing or reading a run directory, and talking to the actor.
//! Write errors while a run is live are logged by the actor, not returned to reporters.

use std::path::PathBuf;

/// What went wrong in the monitor.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// A file or folder of the run directory could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was attempted (`"cannot create"`, `"cannot read"`, ...).
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A line of a `.jsonl` log is not a valid record.
    #[error("{path} line {line}: expected one JSON {expected} per line: {source}")]
    BadLine {
        /// The log file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What the line should hold (`"StepMetrics object"`, `"Span object"`).
        expected: &'static str,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A JSON file of the run directory (`actors.json`, `run.json`) is malformed.
    #[error("{path}: expected {expected}: {source}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        expected: &'static str,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The folder holds none of the files a run directory has.
    #[error(
        "{path} is not an oxalign run directory: expected at least one of metrics.jsonl, \
         timeline.jsonl, recipe.toml, run.json, actors.json"
    )]
    NotARunDir {
        /// The folder given.
        path: PathBuf,
    },
    /// The monitor actor could not be started.
    #[error("cannot start the monitor actor: {0}")]
    Spawn(String),
    /// Lines of the run's logs could not be written since the last sync (a full disk, a
    /// removed folder): a checkpoint must not commit over logs that miss its steps.
    #[error("{failures} line(s) of the run's logs in {dir} could not be written since the last checkpoint; the logs would miss steps the checkpoint covers")]
    LostLines {
        /// The run directory.
        dir: PathBuf,
        /// Failed writes since the last sync.
        failures: u64,
    },
    /// The monitor actor has stopped (or never ran), so it cannot answer.
    #[error("the monitor actor is not running")]
    NotRunning,
}
