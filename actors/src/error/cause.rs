//! [`Cause`]: the kind of a failure inside a role's work, as a typed value, so that a NaN,
//! an out-of-memory tensor error, bad data, a panic and a timeout stay distinguishable all the
//! way to the user. It does not know which role or step failed (see [`super::RoleError`]).

use super::input::{Missing, Unsupported};
use crate::batch::BatchError;
use crate::executor::ExecutorError;
use crate::placement::PlacementError;
use crate::recipe::{RewardKeyError, SlurmError, TeacherError};
use crate::roles::reward::http::HttpRewardError;
use crate::roles::Divergence;
use oxalign_data::DataError;
use oxalign_models::engine::EngineError;
use oxalign_models::error::UnknownName;
use oxalign_models::text::tokenizer::TokenizerError;
use oxalign_models::{InitError, ModelError};
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
    /// A role's placement string does not parse, or names a device that cannot be opened.
    #[error("{}{source}", placement_key(*role, spec.as_deref()))]
    Placement {
        /// The role of the `placement.<role>` key, when the message names the key (the
        /// reward-model trainer runs on `placement.policy`).
        role: Option<&'static str>,
        /// The placement string, when the message quotes it.
        spec: Option<String>,
        /// What is wrong with it.
        #[source]
        source: PlacementError,
    },
    /// A reward setting (`[reward]`, `[[reward.verifiers]]`, `[reward.http]`) is unusable.
    #[error(transparent)]
    RewardKey(#[from] RewardKeyError),
    /// A recipe key names something that does not exist (`model.init_family`, ...).
    #[error("{key}: {source}")]
    UnknownName {
        /// The dotted key.
        key: &'static str,
        /// The name given and the accepted ones.
        #[source]
        source: UnknownName,
    },
    /// A fresh model folder could not be initialised from the recipe's `model.init_*`.
    #[error(transparent)]
    InitModel(InitError),
    /// The teacher of `rl.algorithm = "distill"` cannot be compared with the policy.
    #[error("model.teacher_path = {path:?}: {source}")]
    Teacher {
        /// `model.teacher_path` as given.
        path: String,
        /// Why the two models do not match.
        #[source]
        source: TeacherError,
    },
    /// `rl.routing_replay = true` with a policy that has no routers.
    #[error(
        "rl.routing_replay = true, but the policy in {} is a dense model without routers; \
         expected a mixture-of-experts policy",
        weights.display()
    )]
    RoutingReplayDense {
        /// The policy's weights folder.
        weights: PathBuf,
    },
    /// `placement.expert_parallel` cannot spread the policy's experts (a dense model,
    /// experts it does not divide).
    #[error(
        "placement.expert_parallel = {world}: {source} (policy weights {})",
        weights.display()
    )]
    ExpertParallel {
        /// The number of ranks the experts were to be spread over.
        world: usize,
        /// The policy's weights folder.
        weights: PathBuf,
        /// The trainer's refusal (boxed: it is the largest cause).
        #[source]
        source: Box<RlhfError>,
    },
    /// A role is placed on a node that `[cluster] nodes` does not have.
    #[error("[cluster] has no node {node:?}")]
    NoSuchNode {
        /// The node named by the placement.
        node: String,
    },
    /// The nodes of the Slurm allocation `[cluster]` asks for cannot be read.
    #[error(transparent)]
    Slurm(#[from] SlurmError),
    /// The environment of `[env]` could not be set up (its HTTP client).
    #[error("env: {0}")]
    Environment(String),
    /// Every group of a round had an episode that timed out or whose environment failed
    /// (`env.on_failure = "drop"`), so nothing is left to train on.
    #[error("every episode group had a failed episode, so nothing is left to train on; the first: {first}")]
    EpisodesFailed {
        /// How the first failed episode ended.
        first: String,
    },
    /// Something the run needs is absent (a recipe key, answers, reference log-probs, ...).
    #[error(transparent)]
    Missing(#[from] Missing),
    /// A role or this build cannot do what was asked.
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
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

/// `placement.<role> = "<spec>": `, `placement.<role>: ` or nothing, before a placement error.
fn placement_key(role: Option<&str>, spec: Option<&str>) -> String {
    match (role, spec) {
        (Some(role), Some(spec)) => format!("placement.{role} = {spec:?}: "),
        (Some(role), None) => format!("placement.{role}: "),
        (None, Some(spec)) => format!("{spec:?}: "),
        (None, None) => String::new(),
    }
}

impl Cause {
    /// `placement.<role>` (`spec`) is unusable; the message names the key, not the string.
    pub(crate) fn placement(role: &'static str, source: impl Into<PlacementError>) -> Self {
        Cause::Placement {
            role: Some(role),
            spec: None,
            source: source.into(),
        }
    }

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
            Cause::Tokenizer(_)
            | Cause::Data(_)
            | Cause::Placement { .. }
            | Cause::RewardKey(_)
            | Cause::UnknownName { .. }
            | Cause::Teacher { .. }
            | Cause::RoutingReplayDense { .. }
            | Cause::ExpertParallel { .. }
            | Cause::NoSuchNode { .. }
            | Cause::Slurm(_)
            | Cause::Missing(_)
            | Cause::Unsupported(_) => true,
            Cause::Model(e) => model_is_bad_input(e),
            // A folder that cannot be written is a failure of the run, as under `Io`.
            Cause::InitModel(e) => match e {
                InitError::Io { .. } => false,
                InitError::Model(m) => model_is_bad_input(m),
                _ => true,
            },
            Cause::Engine(e) => match e {
                EngineError::InvalidRequest { .. }
                | EngineError::Capacity { .. }
                | EngineError::Config { .. } => true,
                EngineError::Model(m) => model_is_bad_input(m),
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
            | Cause::EpisodesFailed { .. }
            | Cause::Environment(_)
            | Cause::Injected(_) => false,
        }
    }
}

/// True unless the model failed in a tensor operation or on the file system.
fn model_is_bad_input(e: &ModelError) -> bool {
    !matches!(e, ModelError::Candle(_) | ModelError::Io { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_told_apart_from_run_failures() {
        assert!(Cause::Missing(Missing::SftAnswers).is_bad_input());
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

    /// Each typed bad-input cause, with the message users saw when it was a string.
    fn typed_bad_inputs() -> Vec<(Cause, &'static str)> {
        use oxalign_kernels::device::DeviceError;
        let invalid = || DeviceError::Invalid { spec: "gpu".into() };
        vec![
            (
                Cause::Placement {
                    role: Some("reward"),
                    spec: Some("node2:gpu".into()),
                    source: invalid().into(),
                },
                "placement.reward = \"node2:gpu\": invalid device spec \"gpu\": expected \"cpu\", \
                 \"cpu:N\", \"cuda\" or \"cuda:N\" (N a non-negative integer)",
            ),
            (
                Cause::placement("policy", PlacementError::Group("empty device group".into())),
                "placement.policy: empty device group",
            ),
            (
                Cause::Placement {
                    role: None,
                    spec: None,
                    source: invalid().into(),
                },
                "invalid device spec \"gpu\": expected \"cpu\", \"cpu:N\", \"cuda\" or \
                 \"cuda:N\" (N a non-negative integer)",
            ),
            (
                Cause::RewardKey(RewardKeyError {
                    key: "reward.http.url".into(),
                    message: "expected a URL".into(),
                }),
                "key `reward.http.url`: expected a URL",
            ),
            (
                Cause::UnknownName {
                    key: "model.init_preset",
                    source: UnknownName {
                        what: "model preset",
                        got: "huge".into(),
                        expected: "one of: tiny, small".into(),
                    },
                },
                "model.init_preset: unknown model preset \"huge\"; expected one of: tiny, small",
            ),
            (
                Cause::InitModel(InitError::NoTokenizerJson { path: "tok".into() }),
                "tokenizer tok: tok/tokenizer.json not found",
            ),
            (
                Cause::Teacher {
                    path: "t".into(),
                    source: TeacherError::VocabSize {
                        teacher: 10,
                        policy: 12,
                    },
                },
                "model.teacher_path = \"t\": the teacher's vocab_size is 10, the policy's 12: \
                 distillation compares log-probs token id by token id, so both need the same \
                 vocabulary",
            ),
            (
                Cause::RoutingReplayDense {
                    weights: "models/dense".into(),
                },
                "rl.routing_replay = true, but the policy in models/dense is a dense model \
                 without routers; expected a mixture-of-experts policy",
            ),
            (
                Cause::ExpertParallel {
                    world: 2,
                    weights: "models/dense".into(),
                    source: Box::new(RlhfError::ExpertParallel("no experts".into())),
                },
                "placement.expert_parallel = 2: expert-parallel training: no experts (policy \
                 weights models/dense)",
            ),
            (
                Cause::NoSuchNode {
                    node: "node9".into(),
                },
                "[cluster] has no node \"node9\"",
            ),
            (
                Cause::Slurm(SlurmError::NotSet),
                "SLURM_JOB_NODELIST is not set (not inside a Slurm allocation?)",
            ),
            (
                Missing::Key {
                    key: "data.path",
                    detail: "(a JSONL or Parquet file)",
                }
                .into(),
                "data.path is required (a JSONL or Parquet file)",
            ),
            (
                Missing::Key {
                    key: "model.reward_path",
                    detail: "for reward.kind = \"model\"",
                }
                .into(),
                "model.reward_path is required for reward.kind = \"model\"",
            ),
            (
                Missing::SftAnswers.into(),
                "SFT needs prompts with answers; this batch had none",
            ),
            (
                Missing::ReferenceLogprobs.into(),
                "a training pair has no reference log-probs (did the data file change during \
                 the run?)",
            ),
            (
                Missing::CriticExperience.into(),
                "a critic update needs the batch's old_values and returns (PPO experience)",
            ),
            (
                Missing::SpawnWeights.into(),
                "the spawn request names no weights folder",
            ),
            (
                Missing::SpawnEngine.into(),
                "the spawn request's recipe has no placement.engine",
            ),
            (
                Unsupported::PolicyEngine.into(),
                "the policy has no engine of its own (placement.engine puts it in the engine role)",
            ),
            (
                Unsupported::ExportFromNode.into(),
                "placement.engine needs the policy in the controller's process, not on a node",
            ),
            (
                Unsupported::WrongRole {
                    role: "reward",
                    request: "Logprobs { seqs: Sequences".into(),
                }
                .into(),
                "this connection hosts the reward, which cannot answer Logprobs { seqs: Sequences…",
            ),
            (
                Unsupported::Nccl.into(),
                "a group of CUDA devices needs NCCL, but oxalign was built without the `cuda` \
                 feature (rebuild with `--features cuda`)",
            ),
            (
                Unsupported::RlOffline.into(),
                "run.kind = \"rl\" is not a data-file run",
            ),
        ]
    }

    #[test]
    fn typed_bad_input_is_bad_input_and_keeps_its_message() {
        for (cause, message) in typed_bad_inputs() {
            assert!(cause.is_bad_input(), "{cause:?}");
            assert_eq!(cause.to_string(), message, "{cause:?}");
        }
        // Only the tokenizer and model halves of a model folder's initialisation are the
        // user's; a folder that cannot be written is not.
        let unwritable = Cause::InitModel(InitError::Io {
            action: "create",
            path: "run/init".into(),
            source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied"),
        });
        assert!(!unwritable.is_bad_input());
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
