//! `[log]`: what a run writes besides `metrics.jsonl`, `timeline.jsonl` and
//! `samples.jsonl` (always written).

use super::{Recipe, RecipeError, RunKind};
use serde::{Deserialize, Serialize};

/// `[log]`: experiment-tracking outputs of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// Also write every step's metrics as TensorBoard event files in
    /// `<run>/tensorboard/` (`tensorboard --logdir runs`). Default false.
    pub tensorboard: bool,
    /// Every this many RL steps, print the step's logged samples (the first
    /// `rl.log_samples` of its batch: prompt, completion, reward) under its table line, as
    /// TRL's `log_completions` does; 0 = never. Default 0.
    pub completions_every: u64,
}

impl LogSection {
    /// Whether every key has its default (the section is then left out of `recipe.toml`).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Refuses `log.completions_every` where there is nothing to print: a run without RL steps,
/// or `rl.log_samples = 0`.
pub(super) fn validate(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if r.log.completions_every == 0 {
        return Ok(());
    }
    if r.run.kind != RunKind::Rl {
        return Err(bad(
            "log.completions_every",
            "RL runs only: a run of another kind generates no completions".into(),
        ));
    }
    if r.rl.log_samples == 0 {
        return Err(bad(
            "log.completions_every",
            "prints the samples each step logs, and rl.log_samples = 0 logs none: set rl.log_samples to 1 or more".into(),
        ));
    }
    Ok(())
}
