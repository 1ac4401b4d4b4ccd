//! Training losses (PPO, GSPO, CISPO, value, entropy, KL, TIS and the other rollout corrections, DPO/IPO/cDPO, Bradley–Terry, SFT) and their
//! aggregation. Each takes candle tensors and returns a scalar loss plus a small stats struct.

pub(crate) mod aggregate;
pub mod bradley_terry;
pub mod cispo;
pub mod dpo;
pub mod entropy;
pub mod gspo;
pub mod kl;
pub mod log_sigmoid;
pub mod objective;
pub mod ppo;
pub mod rollout_correction;
pub mod sft;
pub mod tis;
pub mod value;

pub use aggregate::{aggregate_loss, aggregate_loss_with_denominator, LossAgg, LossAggKind};
pub use bradley_terry::{bradley_terry_loss, BradleyTerryStats};
pub use dpo::{dpo_loss, DpoLoss, DpoLossKind, DpoStats, PreferenceLogprobs};
pub use entropy::{entropy_bonus, EntropyStats};
pub use kl::{kl_loss, kl_per_token, kl_shaped_rewards, KlEstimator, KlMode, KlStats};
pub use log_sigmoid::log_sigmoid;
pub use objective::PolicyObjective;
pub use ppo::{ppo_policy_loss, PpoConfig, PpoStats};
pub use rollout_correction::{CorrectionStats, RolloutCorrection, RolloutCorrectionKind};
pub use sft::{sft_loss, SftStats};
pub use tis::{truncated_is_weights, TisStats};
pub use value::{value_loss, ValueStats};
