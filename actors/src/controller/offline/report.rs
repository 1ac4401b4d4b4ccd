//! What an `sft`, `rm` or `dpo` run reports: the data file's row counts (skipped rows are
//! never silent), the held-out metrics at the start and the end, and where the model is.

use crate::recipe::Recipe;
use oxalign_data::DataReport;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The `offline` part of `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct OfflineSummary {
    /// `sft`, `rm` or `dpo`.
    pub kind: String,
    /// Optimizer steps done.
    pub steps: u64,
    /// Held-out metrics before the first step (e.g. `eval_loss`, `eval_accuracy`).
    pub eval_first: BTreeMap<String, f64>,
    /// Held-out metrics after the last step.
    pub eval_last: BTreeMap<String, f64>,
    /// Rows read and skipped in the data files.
    pub data: DataReport,
    /// The trained model (HF folder with tokenizer and `checksums.json`).
    pub model_dir: PathBuf,
}

/// Warns on stderr when rows were skipped: how many of how many, and the first few.
pub(crate) fn print_data_report(recipe: &Recipe, report: &DataReport) {
    let path = recipe.data.path.as_deref().unwrap_or("-");
    if report.skipped > 0 {
        eprintln!(
            "warning: {path}: skipped {} malformed row(s) of {} (data.on_bad_row = \"skip\")",
            report.skipped, report.rows
        );
        for s in &report.first_skipped {
            eprintln!("  skipped {s}");
        }
    }
}
