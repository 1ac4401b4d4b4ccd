//! Held-out accuracy during RL (`rl.eval_every`): the measurement taken before and after RL
//! (`controller/evaluate.rs`: greedy, and the mean over seeded samples), on the engine's
//! weights after a step's refit, added to that step's `metrics.jsonl` line. It draws nothing
//! from the training stream and changes no state, so a run measured this way trains exactly
//! as one that is not.

use super::report::StepRow;
use crate::controller::context::Ctx;
use crate::controller::error::RunError;
use crate::controller::evaluate::{self, Accuracy};
use crate::controller::setup::Roles;
use oxalign_data::PromptSource;

/// `metrics.jsonl` key of the held-out greedy accuracy, in `[0, 1]`.
pub(crate) const HELDOUT_GREEDY: &str = "heldout_greedy";
/// `metrics.jsonl` key of the held-out sampled accuracy, in `[0, 1]`.
pub(crate) const HELDOUT_SAMPLED: &str = "heldout_sampled";

/// True when step `step` of `steps` is measured: every `every` steps and the last one
/// (`every = 0`: never).
pub(crate) fn measures(step: u64, steps: u64, every: u64) -> bool {
    every > 0 && (step.is_multiple_of(every) || step == steps)
}

/// `row` with the held-out accuracy of the policy after step `step` when
/// [`measures`] says so and there are held-out prompts with an exact-match check;
/// otherwise `row` unchanged. The last step's measurement and the run's final one
/// (`controller/mod.rs`) are of the same weights; both are taken.
pub(crate) async fn with_heldout(
    ctx: &Ctx<'_>,
    roles: &Roles,
    data: &dyn PromptSource,
    step: u64,
    row: StepRow,
) -> Result<(StepRow, Option<Accuracy>), RunError> {
    let (steps, every) = (ctx.recipe.run.steps, ctx.recipe.rl.eval_every);
    if !measures(step, steps, every) {
        return Ok((row, None));
    }
    let items = data.eval_items();
    // `None` without held-out prompts or an exact-match check: nothing to measure.
    let Some(acc) = evaluate::accuracy(ctx, &roles.generator(), items, "eval during RL").await?
    else {
        return Ok((row, None));
    };
    let metrics = row
        .metrics
        .with(HELDOUT_GREEDY, acc.greedy)
        .with(HELDOUT_SAMPLED, acc.sampled);
    Ok((StepRow { metrics, ..row }, Some(acc)))
}

/// The table line announcing a measurement.
pub(crate) fn line(step: u64, acc: Accuracy) -> String {
    format!(
        "      held-out after step {step}: greedy {:.1}%, sampled {:.1}%",
        100.0 * acc.greedy,
        100.0 * acc.sampled
    )
}

#[cfg(test)]
mod tests {
    use super::measures;

    #[test]
    fn measures_every_nth_step_and_the_last() {
        let hit: Vec<u64> = (1..=25).filter(|&s| measures(s, 25, 10)).collect();
        assert_eq!(hit, vec![10, 20, 25]);
        assert!(!(1..=25).any(|s| measures(s, 25, 0)));
    }
}
