//! [`ExperienceBatch`]: what one update of the policy (and critic) trains on — token ids and
//! the per-token `[B, T-1]` arrays of the experience stage (advantages, returns) next to the
//! log-probs and values they came from. Plain data; each training role moves it onto its own
//! devices inside its executor job.

use super::{Sequences, TokenArray};
use serde::{Deserialize, Serialize};

/// The training data of one RL step. Every array is `[B, T-1]`, aligned with
/// `seqs.batch()`'s response mask.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExperienceBatch {
    /// Prompt and response ids.
    pub seqs: Sequences,
    /// The policy version that generated the rollout.
    pub policy_version: u64,
    /// The policy's log-probs before the update.
    pub old_logprobs: TokenArray,
    /// Advantages.
    pub advantages: TokenArray,
    /// Reference log-probs (for a KL loss term).
    pub ref_logprobs: TokenArray,
    /// The engine's log-probs (for truncated importance sampling).
    pub rollout_logprobs: TokenArray,
    /// Critic values at rollout time (PPO only).
    pub old_values: Option<TokenArray>,
    /// Value targets (PPO only).
    pub returns: Option<TokenArray>,
}

impl ExperienceBatch {
    /// The per-token arrays as one safetensors buffer (the small fields go through serde).
    pub fn arrays_to_safetensors(&self) -> Result<Vec<u8>, super::BatchError> {
        let mut named = vec![
            ("advantages", &self.advantages),
            ("old_logprobs", &self.old_logprobs),
            ("ref_logprobs", &self.ref_logprobs),
            ("rollout_logprobs", &self.rollout_logprobs),
        ];
        if let Some(v) = &self.old_values {
            named.push(("old_values", v));
        }
        if let Some(r) = &self.returns {
            named.push(("returns", r));
        }
        TokenArray::to_safetensors(&named)
    }
}
