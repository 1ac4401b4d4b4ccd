//! `[log]`: what a run writes besides `metrics.jsonl`, `timeline.jsonl` and
//! `samples.jsonl` (always written).

use serde::{Deserialize, Serialize};

/// `[log]`: experiment-tracking outputs of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// Also write every step's metrics as TensorBoard event files in
    /// `<run>/tensorboard/` (`tensorboard --logdir runs`). Default false.
    pub tensorboard: bool,
}

impl LogSection {
    /// Whether every key has its default (the section is then left out of `recipe.toml`).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}
