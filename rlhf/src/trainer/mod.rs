//! Training steps on real models: token batches, SFT, PPO policy and critic updates, and
//! turning scored rollouts into experience (rewards, advantages, returns).
//!
//! These are synchronous functions on one replica; actors decide where and when they run,
//! and data parallelism enters only through an optional `Collective` for gradients.

mod critic;
mod dpo;
mod experience;
mod expert_parallel;
mod grads;
mod packing;
mod policy;
mod reward_trainer;
mod sharding;
mod spread_experts;
mod token_batch;

pub use critic::CriticTrainer;
pub use dpo::{summed_response_logprobs, DpoConfig};
pub use experience::{
    build_experience, AdvantageKind, CriticInputs, Experience, ExperienceConfig, ExperienceStats,
};
pub use grads::{apply_gradients, backward, check_loss, StepStats};
pub use packing::{first_fit_decreasing, PackedRows, Packing, PAD_SEGMENT};
pub use policy::{PolicyLossConfig, PolicyStats, PolicyTrainer};
pub use reward_trainer::RewardTrainer;
pub use sharding::{expert_rank_dir, Sharded, TrainParams};
pub use token_batch::TokenBatch;

/// Reads a scalar tensor as f64 (for stats).
pub(crate) fn scalar(t: &candle_core::Tensor) -> crate::Result<f64> {
    Ok(t.to_dtype(candle_core::DType::F64)?.to_scalar::<f64>()?)
}
