//! [`RunError`]: why a training run stopped, as a typed value. It names where (`setup`,
//! `SFT step 4`, `RL step 3`, an evaluation), the role and phase that failed and the typed
//! cause, and says whether the user's input is at fault ([`RunError::is_bad_input`]: exit
//! code 2 at the CLI) or the run failed (exit code 1). It detects nothing itself.

use super::{CheckpointError, ContextError, DivergenceError, StalenessError};
use crate::error::{Cause, RoleError};
use std::path::PathBuf;

/// Where in a run something failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// Building the run: model folders, tokenizer, data, the role actors.
    Setup,
    /// A supervised warm-up step (1-based).
    Sft(u64),
    /// An RL step (1-based).
    Rl(u64),
    /// A held-out evaluation (`eval init`, `eval sft`, `eval final`).
    Eval(&'static str),
    /// A step of an `sft`, `rm` or `dpo` run (1-based).
    Train {
        /// `SFT`, `RM` or `DPO`.
        kind: &'static str,
        /// The step.
        step: u64,
    },
    /// Writing the checkpoint of the SFT or RL step.
    Checkpoint {
        /// True for an SFT checkpoint.
        sft: bool,
        /// Its step.
        step: u64,
    },
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Setup => write!(f, "setup"),
            At::Sft(s) => write!(f, "SFT step {s}"),
            At::Rl(s) => write!(f, "RL step {s}"),
            At::Eval(label) => write!(f, "{label}"),
            At::Train { kind, step } => write!(f, "{kind} step {step}"),
            At::Checkpoint { sft: true, step } => write!(f, "checkpoint of SFT step {step}"),
            At::Checkpoint { sft: false, step } => write!(f, "checkpoint of RL step {step}"),
        }
    }
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A role (or the controller's own work) failed.
    #[error("{at}: {source}")]
    Role {
        /// Where in the run.
        at: At,
        /// The role, the phase and the cause.
        #[source]
        source: RoleError,
    },
    /// Training diverged; nothing of the failing step was applied or saved.
    #[error(transparent)]
    Diverged(#[from] DivergenceError),
    /// The checkpoint resumed from cannot be used.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A prompt (plus what is generated or trained after it) exceeds the policy's context.
    #[error(transparent)]
    Context(#[from] ContextError),
    /// A role kept failing: one more restart would exceed `supervision.max_restarts`
    /// within `supervision.restart_window` RL steps.
    #[error("{source}\nthe restart budget is spent: supervision.max_restarts = {max} restarts within supervision.restart_window = {window} RL steps")]
    RestartBudget {
        /// `supervision.max_restarts`.
        max: u32,
        /// `supervision.restart_window`.
        window: u64,
        /// The failure that would have needed one more restart.
        #[source]
        source: Box<RunError>,
    },
    /// A batch generated ahead does not fit the step about to train on it.
    #[error(transparent)]
    Staleness(#[from] StalenessError),
    /// The run's logs could not be written or synced before a checkpoint committed.
    #[error("{at}: {source}")]
    Logs {
        /// The checkpoint being written.
        at: At,
        /// The monitor's write or fsync failure.
        #[source]
        source: crate::monitor::MonitorError,
    },
    /// A file of the run folder could not be written.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was attempted.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl RunError {
    /// `source` at `at`.
    pub fn role(at: At, source: RoleError) -> Self {
        RunError::Role { at, source }
    }

    /// The controller's own work of `phase` failed at `at` with `cause`.
    pub fn controller(at: At, phase: &'static str, cause: impl Into<Cause>) -> Self {
        RunError::Role {
            at,
            source: RoleError::new("controller", phase, cause),
        }
    }

    /// A closure turning a [`RoleError`] into a [`RunError`] at `at`, for `map_err`.
    pub fn at(at: At) -> impl Fn(RoleError) -> RunError {
        move |source| RunError::Role { at, source }
    }

    /// True when the user's input is at fault (a data file, a model folder, a recipe value,
    /// a checkpoint, a prompt too long): exit code 2. False for a failure during the run
    /// (divergence, a tensor error, a panic, a timeout, a write that failed): exit code 1.
    pub fn is_bad_input(&self) -> bool {
        match self {
            // Writing a checkpoint reads no input: whatever fails there (a full disk, a lost
            // mount) is a failure of the run, whatever the writer called it.
            RunError::Role {
                at: At::Checkpoint { .. },
                ..
            } => false,
            RunError::Role { source, .. } => source.is_bad_input(),
            RunError::Checkpoint(_) | RunError::Context(_) => true,
            RunError::Diverged(_)
            | RunError::Io { .. }
            | RunError::Logs { .. }
            | RunError::RestartBudget { .. }
            | RunError::Staleness(_) => false,
        }
    }

    /// True when training diverged (the newest checkpoint holds the last good weights, but
    /// resuming with the same recipe would diverge again).
    pub fn is_divergence(&self) -> bool {
        matches!(self, RunError::Diverged(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_step_role_phase_and_cause() {
        let e = RunError::role(
            At::Rl(3),
            RoleError::new("policy", "sft", crate::error::Missing::SftAnswers).on_rank(0),
        );
        assert_eq!(
            e.to_string(),
            "RL step 3: policy, sft (replica 0): SFT needs prompts with answers; this batch had \
             none"
        );
        assert!(e.is_bad_input());
        let e = RunError::controller(
            At::Sft(2),
            "sft",
            candle_core::Error::Msg("out of memory".into()),
        );
        assert!(!e.is_bad_input());
        assert!(
            e.to_string().starts_with("SFT step 2: controller, sft: "),
            "{e}"
        );
    }

    #[test]
    fn a_failed_checkpoint_write_is_a_run_failure_not_bad_input() {
        // What a full disk looked like from the safetensors writer before it kept I/O errors.
        let full = || oxalign_models::ModelError::Safetensors {
            path: "step_000003/policy/model.safetensors".into(),
            message: "I/O error: No space left on device (os error 28)".into(),
        };
        let read = RunError::role(At::Setup, RoleError::new("policy", "load", full()));
        assert!(
            read.is_bad_input(),
            "a bad safetensors file read is the user's"
        );
        let e = RunError::role(
            At::Checkpoint {
                sft: false,
                step: 3,
            },
            RoleError::new("policy", "save", full()),
        );
        assert!(!e.is_bad_input(), "{e}");
    }
}
