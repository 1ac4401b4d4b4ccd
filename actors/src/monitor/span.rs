//! A span of work on the training timeline: which actor did which phase of which step,
//! from when to when. The dashboard's Gantt chart is drawn from these; nothing is timed here.

use serde::{Deserialize, Serialize};

/// Well-known phase names. `Span::phase` is a free string so new phases need no schema
/// change; use these constants for the standard ones so the dashboard colours match.
pub mod phase {
    /// Policy engine generates responses for the step's prompts.
    pub const GENERATE: &str = "generate";
    /// Reference model scores the responses' log-probs.
    pub const REFERENCE_LOGPROBS: &str = "reference_logprobs";
    /// Reward model / reward function scores the responses.
    pub const REWARD: &str = "reward";
    /// Critic computes value estimates.
    pub const VALUES: &str = "values";
    /// Controller computes KL-shaped rewards and advantages.
    pub const ADVANTAGES: &str = "advantages";
    /// Policy optimisation (all PPO epochs of the step).
    pub const POLICY_TRAIN: &str = "policy_train";
    /// Critic optimisation.
    pub const CRITIC_TRAIN: &str = "critic_train";
    /// Engine refit from the trainer's new weights.
    pub const REFIT: &str = "refit";
    /// Writing a checkpoint.
    pub const CHECKPOINT: &str = "checkpoint";
}

/// One interval of work by one actor, in wall-clock ms since the Unix epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// Name of the actor that did the work (a key of the actor table).
    pub actor: String,
    /// Phase name, see [`phase`] for the standard ones.
    pub phase: String,
    /// Training step (0-based or 1-based, as the controller counts) the work belongs to.
    pub step: u64,
    /// Start, ms since the Unix epoch.
    pub start_unix_ms: u64,
    /// End, ms since the Unix epoch (`>= start_unix_ms`).
    pub end_unix_ms: u64,
}

impl Span {
    /// Builds a span; `end_unix_ms` is raised to `start_unix_ms` if it is earlier.
    pub fn new(
        actor: impl Into<String>,
        phase: impl Into<String>,
        step: u64,
        start_unix_ms: u64,
        end_unix_ms: u64,
    ) -> Self {
        Span {
            actor: actor.into(),
            phase: phase.into(),
            step,
            start_unix_ms,
            end_unix_ms: end_unix_ms.max(start_unix_ms),
        }
    }

    /// Duration in seconds.
    pub fn seconds(&self) -> f64 {
        self.end_unix_ms.saturating_sub(self.start_unix_ms) as f64 / 1000.0
    }
}
