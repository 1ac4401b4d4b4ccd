//! Batches as data: what travels between the roles. Token ids, per-token f32 arrays
//! ([`TokenArray`], `[B, T-1]`, row-major), finish reasons, sample and group ids and the policy
//! version, all in host memory and serializable (serde, and safetensors bytes for the arrays).
//! No candle `Tensor` crosses an actor message: each role moves a batch onto its own devices
//! inside its executor job and answers with plain data again. Checkpoint folders still travel
//! as paths.
//!
//! The batches of one RL step, in order: `Sequences` (prompt and response ids),
//! `RolloutRequest` → `RolloutBatch` (ids, the engine's per-token log-probs, finish reasons,
//! sample and group ids, the policy version), `ScoredBatch`, `ExperienceBatch`. A refit to an
//! engine role travels as `WeightBucket`s (`weight_buckets.rs`).

mod experience;
mod rollout;
mod scored;
mod sequences;
mod token_array;
mod weight_buckets;

pub use experience::ExperienceBatch;
pub use rollout::{Finish, RolloutBatch, RolloutRequest, Sample, SampleRequest, Sampling};
pub(crate) use scored::ScoredBatch;
pub use sequences::Sequences;
pub use token_array::{BatchError, TokenArray};
pub use weight_buckets::{
    pack, Arrived, Assembly, BucketError, HostTensor, WeightBucket, WeightExport,
};

#[cfg(test)]
mod tests;
