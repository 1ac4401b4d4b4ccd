//! Runs that train from a data file (`run.kind = "sft" | "rm" | "dpo"`): each kind is a task
//! ([`sft`], [`rm`], [`dpo`]) behind the [`task::OfflineTask`] trait, and one loop
//! ([`driver`]) runs them all; then `summary.json`. What the tasks share lives beside them:
//! token pairs ([`pairs`]), the cadence of steps, evaluations and progress lines ([`cadence`]),
//! held-out scoring ([`eval`], [`eval_log`]) and the report ([`report`]).
//!
//! These runs skip the RL loop: the controller streams rows from a `Dataset`
//! (`oxalign_data`: JSONL or Parquet, checked once, read on demand, seeded order), sends
//! batches through the role traits to the policy (`TrainPolicy::sft`, `TrainPolicy::dpo`:
//! `roles/policy/train.rs`, `roles/policy/dpo.rs`) or to the reward-model trainer
//! (`TrainRewardModel`: `roles/reward_trainer.rs`), and
//! evaluates on the held-out rows. DPO's reference log-probs are computed once by the reference
//! role before the first step. The model goes to `<run>/final/` with `checksums.json`; the keys
//! are in docs/RECIPES.md. Every role of these runs stays in the controller's process (the
//! recipe check refuses a node there).

mod cadence;
mod dpo;
mod driver;
mod eval;
mod eval_log;
pub(crate) mod pairs;
pub(crate) mod report;
mod rm;
mod sft;
mod task;

use crate::controller::context::Ctx;
use crate::controller::error::{At, RunError};
use crate::controller::summary::RunSummary;
use crate::error::Cause;
use crate::executor::ExecutorPool;
use crate::recipe::RunKind;
use std::time::Instant;

/// Runs the recipe's offline kind to the end and writes `summary.json`.
pub(crate) async fn run(
    ctx: &Ctx<'_>,
    pool: &ExecutorPool,
    started: Instant,
) -> Result<RunSummary, RunError> {
    let offline = match ctx.recipe.run.kind {
        RunKind::Sft => sft::run(ctx, pool).await?,
        RunKind::Rm => rm::run(ctx, pool).await?,
        RunKind::Dpo => dpo::run(ctx, pool).await?,
        RunKind::Rl => {
            let e = Cause::Unsupported(crate::error::Unsupported::RlOffline);
            return Err(RunError::controller(At::Setup, "run_kind", e));
        }
    };
    let summary = RunSummary {
        name: ctx.recipe.run.name.clone(),
        run_dir: ctx.run_dir.to_path_buf(),
        steps: offline.steps,
        accuracy_init: None,
        accuracy_sft: None,
        accuracy_final: None,
        sampled_accuracy_sft: None,
        sampled_accuracy_final: None,
        reward_first: None,
        reward_last: None,
        wall_seconds: started.elapsed().as_secs_f64(),
        last_checkpoint: Some(offline.model_dir.clone()),
        offline: Some(offline),
    };
    let path = ctx.run_dir.join("summary.json");
    let text = serde_json::to_string_pretty(&summary).map_err(std::io::Error::other);
    text.and_then(|t| std::fs::write(&path, t))
        .map_err(|source| RunError::Io {
            action: "write",
            path,
            source,
        })?;
    Ok(summary)
}
