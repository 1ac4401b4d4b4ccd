//! The cadence of a data-file run: its learning-rate schedule, the steps that evaluate, the
//! evaluation lines it prints and the brief shown next to its progress bar.

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

/// The step's loss as shown: four decimals, or `-` when the step has none.
fn loss_of(metrics: &StepMetrics) -> String {
    metrics
        .values
        .get("loss")
        .map_or("-".into(), |l| format!("{l:.4}"))
}

/// An evaluated step's line: `<kind> <step>/<steps>  loss <step loss or ->  <held_out>`.
pub(crate) fn eval_line(
    kind: &str,
    (step, steps): (u64, u64),
    metrics: &StepMetrics,
    held_out: &str,
) -> String {
    let loss = loss_of(metrics);
    format!("{kind} {step:>5}/{steps}  loss {loss}  {held_out}")
}

/// What the progress bar shows next to it after a step: the step's training loss.
pub(crate) fn brief(metrics: &StepMetrics) -> String {
    format!("loss {}", loss_of(metrics))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brief_shows_the_loss_or_a_dash() {
        let m = StepMetrics::new(3).with("loss", 0.123456);
        assert_eq!(brief(&m), "loss 0.1235");
        assert_eq!(brief(&StepMetrics::new(3)), "loss -");
    }

    #[test]
    fn eval_line_keeps_its_format() {
        let m = StepMetrics::new(5).with("loss", 1.5);
        assert_eq!(
            eval_line("sft", (5, 10), &m, "eval_loss 1.2"),
            "sft     5/10  loss 1.5000  eval_loss 1.2"
        );
    }
}
