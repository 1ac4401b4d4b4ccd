//! The one loop of every data-file run: evaluate before the first step; then per step, the
//! step's rows, the task's update at the scheduled learning rate, an evaluation every
//! `eval_every` steps and at the end, the step's metrics to the monitor; then the model
//! saved as `<run>/final/`. A progress bar with ETA and the latest loss runs under the
//! evaluation lines (hidden with `--quiet` or when stderr is not a terminal). What differs between SFT, RM and DPO is the [`OfflineTask`].

use super::cadence::{brief, eval_line, evaluates, schedule};
use super::eval_log::EvalLog;
use super::pairs::step_rows;
use super::report::OfflineSummary;
use super::task::OfflineTask;
use crate::controller::context::Ctx;
use crate::controller::error::{At, RunError};
use crate::controller::progress::Progress;
use crate::monitor::StepMetrics;
use oxalign_data::Dataset;

/// The step settings of one run (`[sft]`, `[rm]` or `[dpo]`).
pub(crate) struct Steps {
    /// Updates to run.
    pub steps: u64,
    /// Rows per update.
    pub batch_size: usize,
    /// Peak learning rate (linear warm-up, then cosine decay to a tenth).
    pub lr: f64,
    pub warmup_steps: u64,
    /// Evaluate every this many steps (0: only at the start and the end).
    pub eval_every: u64,
}

/// Runs `task` over `data` for `s.steps` updates and saves the model; `kind` names the
/// steps in errors (`"SFT"`, `"RM"`, `"DPO"`).
pub(crate) async fn drive<T: OfflineTask>(
    ctx: &Ctx<'_>,
    task: &T,
    data: &Dataset<T::Row>,
    kind: &'static str,
    s: Steps,
) -> Result<OfflineSummary, RunError> {
    let lr_at = schedule(s.lr, s.warmup_steps, s.steps);
    let mut log = EvalLog::default();
    let bar = Progress::counting(s.steps, 0, ctx.quiet, kind);
    for step in 0..=s.steps {
        let mut m = StepMetrics::new(step);
        if step > 0 {
            let at = At::Train { kind, step };
            let rows = step_rows(data, step, s.batch_size, at)?;
            m = task.train(ctx, &rows, step, lr_at.lr_at(step - 1)).await?;
        }
        if step == 0 || evaluates(step, s.steps, s.eval_every) {
            if let Some((values, text)) = task.evaluate(ctx).await? {
                m = log.record(step, &values, m);
                bar.line(&eval_line(task.name(), (step, s.steps), &m, &text));
            }
        }
        if step > 0 {
            bar.step(brief(&m));
            ctx.monitor.report(m);
        }
    }
    bar.finish();
    let model_dir = task.save(ctx).await?;
    task.shutdown();
    Ok(OfflineSummary {
        kind: task.name().into(),
        steps: s.steps,
        eval_first: log.first,
        eval_last: log.last,
        data: data.report().clone(),
        model_dir,
    })
}
