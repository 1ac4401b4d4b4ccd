//! [`ScoredBatch`]: a rollout with everything the score stage adds — rewards, reference
//! and old (pre-update) log-probs and, for PPO, values — as per-token `[B, T-1]` arrays
//! aligned with the rollout's [`Sequences::batch`](super::Sequences::batch). Plain data.

use super::{RolloutBatch, TokenArray};
use serde::{Deserialize, Serialize};

/// A scored rollout.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ScoredBatch {
    /// The rollout.
    pub rollout: RolloutBatch,
    /// One reward per sample.
    pub rewards: Vec<f32>,
    /// Reference log-probs `[B, T-1]`.
    pub ref_logprobs: TokenArray,
    /// Log-probs of the rollout policy π_old `[B, T-1]`: the engine's sampling log-probs
    /// when it serves the trainer's f32 weights, else the trainer's own scoring.
    pub old_logprobs: TokenArray,
    /// True when `old_logprobs` came from the trainer (a quantized engine), so they can be
    /// compared with `rollout_logprobs` over the whole batch.
    pub trainer_scored_old: bool,
    /// The engine's log-probs at the response positions `[B, T-1]` (zeros elsewhere).
    pub rollout_logprobs: TokenArray,
    /// Critic values `[B, T-1]` (PPO only).
    pub values: Option<TokenArray>,
    /// The critic's value of the state after each row's last token (PPO only): what GAE
    /// bootstraps from for a response cut off by `max_new_tokens`.
    #[serde(default)]
    pub last_values: Option<Vec<f32>>,
}
