//! [`RunSummary`]: what a finished run reports (`summary.json`).

use crate::controller::offline::report::OfflineSummary;
use serde::Serialize;
use std::path::PathBuf;

/// What a finished run reports (`summary.json`).
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// Run name.
    pub name: String,
    /// Run folder.
    pub run_dir: PathBuf,
    /// RL steps completed.
    pub steps: u64,
    /// Held-out accuracy of the initial model.
    pub accuracy_init: Option<f64>,
    /// Held-out accuracy after SFT (before RL).
    pub accuracy_sft: Option<f64>,
    /// Held-out accuracy after RL.
    pub accuracy_final: Option<f64>,
    /// Held-out sampled accuracy (8 samples per prompt at the rollout temperature) after SFT.
    pub sampled_accuracy_sft: Option<f64>,
    /// Held-out sampled accuracy after RL.
    pub sampled_accuracy_final: Option<f64>,
    /// Mean reward over the run's first 10 RL steps (across resumes; fewer in a shorter run).
    pub reward_first: Option<f64>,
    /// Mean reward over the last 10 RL steps.
    pub reward_last: Option<f64>,
    /// Wall seconds, across resumes.
    pub wall_seconds: f64,
    /// The newest checkpoint.
    pub last_checkpoint: Option<PathBuf>,
    /// What an `sft`, `rm` or `dpo` run measured and where its model is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offline: Option<OfflineSummary>,
}
