//! A checkpoint the run has written, as listed on the dashboard. The monitor only records
//! checkpoints; it never writes or reads their contents.

use serde::{Deserialize, Serialize};

/// One saved checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    /// Training step the checkpoint holds (weights after that step's update).
    pub step: u64,
    /// Folder of the checkpoint, as given by the writer (usually
    /// `<run_dir>/checkpoints/step_<N>`).
    pub path: String,
    /// When it was finished, ms since the Unix epoch.
    pub unix_ms: u64,
}
