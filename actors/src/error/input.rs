//! The user's-input failures that no other crate names: what a run needs and does not have
//! ([`Missing`]), and what a role or this build cannot do as the recipe or a request asks
//! ([`Unsupported`]). Both are bad input (exit code 2); each variant's message is fixed or
//! built from its typed fields.

/// Something the run needs is absent from its recipe, data or requests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Missing {
    /// A recipe key that has no default is not set.
    #[error("{key} is required {detail}")]
    Key {
        /// The dotted key, e.g. `data.path`.
        key: &'static str,
        /// What it is or what needs it, e.g. `(a JSONL or Parquet file)`.
        detail: &'static str,
    },
    /// An SFT batch has no prompt with an answer to train on.
    #[error("SFT needs prompts with answers; this batch had none")]
    SftAnswers,
    /// A DPO training pair has no reference log-probs (computed once, before the first step).
    #[error(
        "a training pair has no reference log-probs (did the data file change during the run?)"
    )]
    ReferenceLogprobs,
    /// A critic update got a batch without PPO experience.
    #[error("a critic update needs the batch's old_values and returns (PPO experience)")]
    CriticExperience,
    /// A worker was asked to build a role that loads weights without naming them.
    #[error("the spawn request names no weights folder")]
    SpawnWeights,
    /// A worker was asked to build the engine role from a recipe without one.
    #[error("the spawn request's recipe has no placement.engine")]
    SpawnEngine,
}

/// A role, or this build of oxalign, cannot do what the recipe or a request asks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    /// Generation or refit asked of a policy whose engine is a role of its own.
    #[error("the policy has no engine of its own (placement.engine puts it in the engine role)")]
    PolicyEngine,
    /// An engine role asked for the weights of a policy hosted on a node.
    #[error("placement.engine needs the policy in the controller's process, not on a node")]
    ExportFromNode,
    /// A request sent to a worker connection that hosts another role.
    #[error("this connection hosts the {role}, which cannot answer {request}…")]
    WrongRole {
        /// The role the connection hosts.
        role: &'static str,
        /// The start of the request, as `Debug` shows it.
        request: String,
    },
    /// A group of CUDA devices in a build without the `cuda` feature (no NCCL).
    #[error(
        "a group of CUDA devices needs NCCL, but oxalign was built without the `cuda` feature \
         (rebuild with `--features cuda`)"
    )]
    Nccl,
    /// `run.kind = "rl"` given to the runner of the data-file kinds (SFT, RM, DPO).
    #[error("run.kind = \"rl\" is not a data-file run")]
    RlOffline,
}
