//! The cadence of a data-file run: its learning-rate schedule, the steps that evaluate, and
//! the progress lines it prints.

use crate::controller::context::Ctx;
use crate::monitor::StepMetrics;
use oxalign_rlhf::optim::LrSchedule;

/// Linear warm-up to `lr`, then cosine decay to `lr / 10` at `steps`.
pub(crate) fn schedule(lr: f64, warmup: u64, steps: u64) -> LrSchedule {
    LrSchedule::WarmupCosine {
        peak_lr: lr,
        min_lr: lr * 0.1,
        warmup_steps: warmup.min(steps),
        total_steps: steps,
    }
}

/// True when step `step` (1-based) of `steps` evaluates: every `every` steps and the last.
pub(crate) fn evaluates(step: u64, steps: u64, every: u64) -> bool {
    step == steps || (every > 0 && step.is_multiple_of(every))
}

/// Prints one progress line unless quiet.
pub(crate) fn progress(ctx: &Ctx<'_>, line: String) {
    if !ctx.quiet {
        println!("{line}");
    }
}

/// Prints an evaluated step's line: `<kind> <step>/<steps>  loss <step loss or ->  <held_out>`.
pub(crate) fn eval_progress(
    ctx: &Ctx<'_>,
    kind: &str,
    (step, steps): (u64, u64),
    metrics: &StepMetrics,
    held_out: String,
) {
    let loss = metrics
        .values
        .get("loss")
        .map_or("-".into(), |l| format!("{l:.4}"));
    progress(
        ctx,
        format!("{kind} {step:>5}/{steps}  loss {loss}  {held_out}"),
    );
}
