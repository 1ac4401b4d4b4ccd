//! [`RoleError`]: a failure of one role's work, naming the role, the phase (`generate`,
//! `policy_train`, `save`, ...), the replica when one replica failed, and the typed
//! [`Cause`]. The step is added by the controller, which knows it.

use super::Cause;

/// A role's work failed.
#[derive(Debug, thiserror::Error)]
#[error("{role}, {phase}{}: {cause}", rank.map(|r| format!(" (replica {r})")).unwrap_or_default())]
pub struct RoleError {
    /// The role (`policy`, `reference`, `reward`, `critic`).
    pub role: String,
    /// The phase of the step (`generate`, `logprobs`, `policy_train`, `refit`, `save`, ...).
    pub phase: &'static str,
    /// The replica that failed, when the failure was one replica's.
    pub rank: Option<usize>,
    /// What went wrong (boxed: errors stay small on the happy path).
    #[source]
    pub cause: Box<Cause>,
}

impl RoleError {
    /// `cause` in `phase` of `role`, not tied to one replica.
    pub fn new(role: impl Into<String>, phase: &'static str, cause: impl Into<Cause>) -> Self {
        Self {
            role: role.into(),
            phase,
            rank: None,
            cause: Box::new(cause.into()),
        }
    }

    /// The same error, tied to replica `rank`.
    pub fn on_rank(mut self, rank: usize) -> Self {
        self.rank = Some(rank);
        self
    }

    /// True when the cause is the user's input. Loading an optimizer state is reading a
    /// checkpoint, so any trainer error there means the checkpoint is unusable.
    pub fn is_bad_input(&self) -> bool {
        self.cause.is_bad_input()
            || (self.phase == LOAD_OPTIMIZER && matches!(*self.cause, Cause::Rlhf(_)))
    }
}

/// The phase name of restoring an optimizer state from a checkpoint.
pub const LOAD_OPTIMIZER: &str = "load_optimizer";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_role_phase_replica_and_cause() {
        let missing = crate::error::Missing::CriticExperience;
        let e = RoleError::new("critic", "critic_train", missing).on_rank(1);
        assert_eq!(
            e.to_string(),
            "critic, critic_train (replica 1): a critic update needs the batch's old_values \
             and returns (PPO experience)"
        );
        assert!(e.is_bad_input());
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = RoleError::new(
            "policy",
            LOAD_OPTIMIZER,
            oxalign_rlhf::RlhfError::Io {
                path: "o.safetensors".into(),
                source: io,
            },
        );
        assert!(
            e.is_bad_input(),
            "a missing optimizer state is a bad checkpoint"
        );
    }
}
