//! The error of a batch generated ahead that the controller will not train on.

/// A batch generated ahead that the controller will not train on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StalenessError {
    /// The batch lags the trainer by more than `rl.max_staleness` versions.
    #[error(
        "RL step {step}: its batch comes from policy version {batch_version}, {lag} versions \
         behind the trainer's {policy_version}: more than rl.max_staleness = {max_staleness}"
    )]
    TooStale {
        step: u64,
        batch_version: u64,
        policy_version: u64,
        lag: u64,
        max_staleness: u64,
    },
    /// The oldest batch waiting belongs to another step (the loop state is inconsistent).
    #[error("RL step {step}: the oldest batch generated ahead is step {waiting}'s")]
    OutOfOrder { step: u64, waiting: u64 },
}
