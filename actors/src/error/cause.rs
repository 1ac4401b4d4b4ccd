//! [`Cause`]: the kind of a failure inside a role's work, as a typed value, so that a NaN,
//! an out-of-memory tensor error, bad data, a panic and a timeout stay distinguishable all the
//! way to the user. It does not know which role or step failed (see [`super::RoleError`]).

use crate::batch::BatchError;
use crate::executor::ExecutorError;
use crate::roles::reward::http::HttpRewardError;
use crate::roles::Divergence;
use oxalign_data::DataError;
use oxalign_models::engine::EngineError;
use oxalign_models::text::tokenizer::TokenizerError;
use oxalign_models::ModelError;
use oxalign_rlhf::RlhfError;
use std::path::PathBuf;

/// Why a piece of role work failed.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    /// A tensor operation failed (shape, dtype, device, out of memory).
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
    /// Loading, saving or building a model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The generation engine refused a request or failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A trainer step, loss or optimizer state failed.
    #[error(transparent)]
    Rlhf(#[from] RlhfError),
    /// A dataset file or one of its rows is unusable (names the file and the row).
    #[error(transparent)]
    Data(#[from] DataError),
    /// A tokenizer could not be loaded or used.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// A batch does not have the shape its arrays need.
    #[error(transparent)]
    Batch(#[from] BatchError),
    /// Training produced non-finite or exploding numbers.
    #[error(transparent)]
    Diverged(#[from] Divergence),
    /// The input cannot be used; the message names what and what was expected.
    #[error("{0}")]
    BadInput(String),
    /// A file or folder could not be read or written.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was attempted (`read`, `write`, `create`, `copy`).
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A collective among the role's replicas failed: a peer left or timed out, NCCL failed,
    /// or the replicas disagreed on the call. Retried by the supervisor.
    #[error(transparent)]
    Collective(#[from] oxalign_kernels::CollectiveError),
    /// The job panicked on its executor, or the executor has stopped.
    #[error(transparent)]
    Executor(#[from] ExecutorError),
    /// No answer came within the time limit.
    #[error("no answer within the time limit{}", seconds.map(|s| format!(" of {s} s")).unwrap_or_default())]
    Timeout {
        /// The limit, in seconds, when one was set.
        seconds: Option<f64>,
    },
    /// The actor could not start.
    #[error("the actor could not start: {0}")]
    Spawn(#[from] ractor::SpawnErr),
    /// The actor could not be reached or stopped before answering.
    #[error("actor unreachable: {0}")]
    Unreachable(String),
    /// A replica's state was left half-updated by a job that panicked; it is never used
    /// again (the supervisor rebuilds the role).
    #[error("the replica was poisoned by an earlier panic and must be rebuilt")]
    Poisoned,
    /// Refit buckets for an engine role were damaged or incomplete (a checksum mismatch
    /// names the tensor and the bucket); the engine kept its previous weights.
    #[error(transparent)]
    Refit(#[from] crate::batch::BucketError),
    /// The HTTP reward service gave no usable rewards (down, too slow, failing past its
    /// retries, circuit open, or a response that breaks the schema); the message names the
    /// URL, the attempts and the last failure.
    #[error(transparent)]
    RewardService(#[from] HttpRewardError),
    /// A fault from the recipe's `[[faults]]` fired.
    #[error("injected fault: {0}")]
    Injected(String),
    /// The connection to a role on another node failed (no worker, refused, lost).
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    /// A role on another node failed; the message is the worker's error.
    #[error("on node {node}: {message}")]
    Remote {
        /// The node (`[cluster] nodes` key).
        node: String,
        /// The worker's error message.
        message: String,
        /// Whether the worker judged it the user's input.
        bad_input: bool,
    },
}

impl Cause {
    /// An I/O failure on `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Cause::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// True when the cause is the user's input (data, model folders, recipe values,
    /// checkpoint contents) rather than a failure during the run. The CLI exits with 2 for
    /// these and 1 for the rest.
    pub fn is_bad_input(&self) -> bool {
        match self {
            Cause::BadInput(_) | Cause::Tokenizer(_) | Cause::Data(_) => true,
            Cause::Model(e) => !matches!(e, ModelError::Candle(_) | ModelError::Io { .. }),
            Cause::Engine(e) => match e {
                EngineError::InvalidRequest { .. }
                | EngineError::Capacity { .. }
                | EngineError::Config { .. } => true,
                EngineError::Model(m) => {
                    !matches!(m, ModelError::Candle(_) | ModelError::Io { .. })
                }
                _ => false,
            },
            Cause::Rlhf(e) => matches!(
                e,
                RlhfError::StateMismatch { .. }
                    | RlhfError::Json { .. }
                    | RlhfError::InvalidArgument { .. }
            ),
            // A service that stays down or answers badly is a failure of the run (retried by
            // the supervisor, exit 1); only its settings are the user's input.
            Cause::RewardService(e) => e.is_config(),
            Cause::Cluster(e) => e.is_bad_input(),
            Cause::Remote { bad_input, .. } => *bad_input,
            Cause::Tensor(_)
            | Cause::Batch(_)
            | Cause::Diverged(_)
            | Cause::Io { .. }
            | Cause::Executor(_)
            | Cause::Collective(_)
            | Cause::Timeout { .. }
            | Cause::Spawn(_)
            | Cause::Unreachable(_)
            | Cause::Poisoned
            | Cause::Refit(_)
            | Cause::Injected(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_told_apart_from_run_failures() {
        assert!(Cause::BadInput("prompt too long".into()).is_bad_input());
        let bad_file = Cause::Data(DataError::Split {
            path: "x.jsonl".into(),
            message: "no rows left to train on".into(),
        });
        assert!(bad_file.is_bad_input());
        assert_eq!(bad_file.to_string(), "x.jsonl: no rows left to train on");
        let nan = Cause::Diverged(Divergence::Weights {
            tensor: "lm_head.weight".into(),
        });
        assert!(!nan.is_bad_input());
        let panic = Cause::Executor(ExecutorError::Panicked {
            device: "cpu:0".into(),
            message: "boom".into(),
        });
        assert!(!panic.is_bad_input());
        assert!(panic.to_string().contains("boom"), "{panic}");
        let oom = Cause::Tensor(candle_core::Error::Msg("out of memory".into()));
        assert!(!oom.is_bad_input());
        assert!(oom.to_string().contains("out of memory"), "{oom}");
    }

    #[test]
    fn a_failing_reward_service_is_a_run_failure_its_settings_bad_input() {
        let down = Cause::RewardService(HttpRewardError::Failed {
            url: "http://127.0.0.1:9/score".into(),
            rows: 8,
            attempts: 4,
            last: "connection refused".into(),
        });
        assert!(!down.is_bad_input(), "retried by the supervisor, exit 1");
        let msg = down.to_string();
        for want in [
            "http://127.0.0.1:9/score",
            "4 attempt(s)",
            "connection refused",
        ] {
            assert!(msg.contains(want), "{msg}");
        }
        let garbled = Cause::RewardService(HttpRewardError::BadResponse {
            url: "http://h/s".into(),
            rows: 2,
            attempts: 1,
            message: crate::roles::reward::http::schema::ResponseError::Count { rows: 2, got: 1 },
        });
        assert!(
            !garbled.is_bad_input(),
            "a broken service is not the user's input"
        );
        let config = Cause::RewardService(HttpRewardError::Config {
            url: "ftp://h".into(),
            message: "expected an http:// or https:// URL".into(),
        });
        assert!(config.is_bad_input());
    }
}
