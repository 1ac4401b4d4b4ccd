//! The policy-gradient surrogate a minibatch update minimises: PPO's clipped token ratio,
//! GSPO's clipped sequence ratio, or CISPO's clipped, stop-gradient importance weight.

use candle_core::Tensor;

use crate::error::Result;
use crate::losses::cispo::cispo_policy_loss;
use crate::losses::gspo::gspo_policy_loss;
use crate::losses::ppo::{ppo_policy_loss, PpoConfig, PpoStats};

/// Which surrogate the policy loss uses; all share [`PpoConfig`]'s clip range and
/// aggregation and [`PpoStats`]'s diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyObjective {
    /// Per-token ratio, clipped (Schulman et al. 2017).
    #[default]
    Ppo,
    /// Per-sequence, length-normalised ratio, clipped (Zheng et al. 2025).
    Gspo,
    /// Clipped, stop-gradient per-token weight on log π (MiniMax-M1, 2025).
    Cispo,
}

impl PolicyObjective {
    /// The loss and its stats; inputs as in [`ppo_policy_loss`].
    pub fn loss(
        self,
        logprobs: &Tensor,
        old_logprobs: &Tensor,
        advantages: &Tensor,
        mask: &Tensor,
        config: &PpoConfig,
        is_weights: Option<&Tensor>,
    ) -> Result<(Tensor, PpoStats)> {
        let f = match self {
            PolicyObjective::Ppo => ppo_policy_loss,
            PolicyObjective::Gspo => gspo_policy_loss,
            PolicyObjective::Cispo => cispo_policy_loss,
        };
        f(logprobs, old_logprobs, advantages, mask, config, is_weights)
    }
}
