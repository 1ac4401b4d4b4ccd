//! [`OfflineTask`]: what one kind of data-file run (`sft`, `rm`, `dpo`) contributes to the
//! loop that [`super::driver`] runs for all of them — one update on a step's rows, the
//! held-out evaluation, and saving the trained model. Each task holds its roles behind the
//! role traits (`roles/api.rs`).

use crate::controller::context::Ctx;
use crate::controller::error::RunError;
use crate::monitor::StepMetrics;
use async_trait::async_trait;
use oxalign_data::RowSchema;
use std::path::PathBuf;

/// Held-out metrics `(key, value)` and the progress-line text that shows them.
pub(crate) type HeldOut = (Vec<(&'static str, f64)>, String);

/// One kind of data-file run, as the driver sees it.
#[async_trait]
pub(crate) trait OfflineTask: Send + Sync {
    /// The rows the run trains on.
    type Row: RowSchema + Send + Sync;

    /// The run kind as the progress lines and `summary.json` spell it (`"sft"`, ...).
    fn name(&self) -> &'static str;

    /// One update on `rows` (step `step`, 1-based) at learning rate `lr`: its metrics, or the
    /// divergence that stopped it.
    async fn train(
        &self,
        ctx: &Ctx<'_>,
        rows: &[Self::Row],
        step: u64,
        lr: f64,
    ) -> Result<StepMetrics, RunError>;

    /// The held-out metrics now, or `None` when the data file has no held-out rows.
    async fn evaluate(&self, ctx: &Ctx<'_>) -> Result<Option<HeldOut>, RunError>;

    /// Saves the trained model as `<run>/final/`, sealed; returns the folder.
    async fn save(&self, ctx: &Ctx<'_>) -> Result<PathBuf, RunError>;

    /// Stops the task's roles (the end of the run).
    fn shutdown(&self);
}
