//! A role's error on the wire: what the supervisor and the exit code need of a
//! [`RoleError`] raised on a worker (divergence, bad input, timeout, a lost actor, or any
//! other failure with its message). The controller rebuilds the error with the role and
//! phase of its own call.

use crate::error::{Cause, RoleError};
use crate::roles::Divergence;
use serde::{Deserialize, Serialize};

/// A [`RoleError`] as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireError {
    /// The replica that failed, when one did.
    pub rank: Option<usize>,
    /// The cause.
    pub cause: WireCause,
}

/// The kinds of [`Cause`] the controller acts on differently; everything else is `Other`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WireCause {
    /// [`Cause::Diverged`] (never retried).
    Diverged(Divergence),
    /// [`Cause::Timeout`] inside the worker.
    Timeout(Option<f64>),
    /// Any other cause: its message, and whether it is the user's input (exit code 2).
    Other {
        /// The error's message, with the worker's role and phase.
        message: String,
        /// [`RoleError::is_bad_input`] on the worker.
        bad_input: bool,
    },
}

impl WireError {
    /// A failure that is not a role's (e.g. building the role failed before it existed).
    pub fn other(message: String, bad_input: bool) -> Self {
        Self {
            rank: None,
            cause: WireCause::Other { message, bad_input },
        }
    }

    /// The error of `role`'s `phase` on node `node`.
    pub fn into_role_error(self, role: &str, phase: &'static str, node: &str) -> RoleError {
        let cause = match self.cause {
            WireCause::Diverged(d) => Cause::Diverged(d),
            WireCause::Timeout(seconds) => Cause::Timeout { seconds },
            WireCause::Other { message, bad_input } => Cause::Remote {
                node: node.to_string(),
                message,
                bad_input,
            },
        };
        let e = RoleError::new(role, phase, cause);
        match self.rank {
            Some(r) => e.on_rank(r),
            None => e,
        }
    }
}

impl From<&RoleError> for WireError {
    fn from(e: &RoleError) -> Self {
        let cause = match &*e.cause {
            Cause::Diverged(d) => WireCause::Diverged(d.clone()),
            Cause::Timeout { seconds } => WireCause::Timeout(*seconds),
            _ => WireCause::Other {
                message: e.to_string(),
                bad_input: e.is_bad_input(),
            },
        };
        Self {
            rank: e.rank,
            cause,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_supervisor_reads_survives_the_wire() {
        let bad = RoleError::new(
            "reward",
            "setup",
            Cause::NoSuchNode {
                node: "node9".into(),
            },
        );
        let back = WireError::from(&bad).into_role_error("reward", "setup", "node2");
        assert!(back.is_bad_input(), "{back}");
        assert_eq!(
            back.to_string(),
            "reward, setup: on node node2: reward, setup: [cluster] has no node \"node9\""
        );
        let nan = RoleError::new(
            "critic",
            "critic_train",
            Cause::Diverged(Divergence::Weights {
                tensor: "score.weight".into(),
            }),
        )
        .on_rank(1);
        let back = WireError::from(&nan).into_role_error("critic", "critic_train", "node2");
        assert!(matches!(*back.cause, Cause::Diverged(_)), "{back}");
        assert_eq!(back.rank, Some(1));
        let panic = RoleError::new("policy", "generate", Cause::Poisoned);
        let back = WireError::from(&panic).into_role_error("policy", "generate", "node1");
        assert!(!back.is_bad_input(), "{back}");
        assert!(back.to_string().contains("node1"), "{back}");
    }
}
