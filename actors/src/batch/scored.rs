//! [`ScoredBatch`]: a rollout with everything the score stage adds — rewards, reference
//! and old (pre-update) log-probs and, for PPO, values — as per-token `[B, T-1]` arrays
//! aligned with the rollout's [`Sequences::batch`](super::Sequences::batch). Plain data.

use super::{RolloutBatch, TokenArray};
use serde::{Deserialize, Serialize};

/// A scored rollout.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScoredBatch {
    /// The rollout.
    pub rollout: RolloutBatch,
    /// One reward per sample.
    pub rewards: Vec<f32>,
    /// Reference log-probs `[B, T-1]`.
    pub ref_logprobs: TokenArray,
    /// The policy's log-probs before the update `[B, T-1]`.
    pub old_logprobs: TokenArray,
    /// The engine's log-probs at the response positions `[B, T-1]` (zeros elsewhere).
    pub rollout_logprobs: TokenArray,
    /// Critic values `[B, T-1]` (PPO only).
    pub values: Option<TokenArray>,
}
