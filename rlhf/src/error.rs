//! The error type of `oxalign-rlhf`: shape/dtype mistakes, invalid hyper-parameters and
//! optimizer-state files that do not match. It does not wrap I/O of other crates' formats.

use std::path::PathBuf;

/// Every fallible function of this crate returns this error.
#[derive(Debug, thiserror::Error)]
pub enum RlhfError {
    /// A tensor argument has the wrong shape.
    #[error("`{name}`: expected shape {expected}, got {got:?}")]
    Shape {
        /// Argument name, e.g. `"values"`.
        name: String,
        /// What was expected, e.g. `"[batch, seq] = [4, 16]"`.
        expected: String,
        /// The shape that was passed.
        got: Vec<usize>,
    },
    /// A tensor argument has a dtype this function does not take.
    #[error("`{name}`: expected dtype {expected}, got {got:?}")]
    DType {
        /// Argument name.
        name: String,
        /// What was expected, e.g. `"a float dtype"` or `"F32 (same as `logprobs`)"`.
        expected: String,
        /// The dtype that was passed.
        got: candle_core::DType,
    },
    /// A hyper-parameter or option is out of its valid range.
    #[error("invalid `{name}` = {value}: {reason}")]
    InvalidArgument {
        /// Parameter name, e.g. `"gamma"`.
        name: String,
        /// The offending value, formatted.
        value: String,
        /// What is allowed.
        reason: String,
    },
    /// A row that must contain at least one response token has an all-zero mask.
    #[error("`{name}`: row {row} has no response tokens (its mask is all zero)")]
    EmptyRow {
        /// Argument name of the mask.
        name: String,
        /// Row index in the batch.
        row: usize,
    },
    /// Two named parameters share a name.
    #[error("duplicate parameter name `{0}`")]
    DuplicateParam(String),
    /// An optimizer state on disk does not match the optimizer it is loaded into.
    #[error("optimizer state {path}: {reason}")]
    StateMismatch {
        /// The file being read.
        path: PathBuf,
        /// What did not match, naming the tensor or key.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A JSON sidecar file could not be parsed or written.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: serde_json::Error,
    },
    /// A loss was not finite or exceeded its configured limit; no weight was changed.
    #[error("{what} diverged: {value} (limit |{what}| <= {limit})")]
    Diverged {
        /// Which loss, e.g. `"policy loss"`.
        what: &'static str,
        /// Its value (averaged over data-parallel replicas when there are several).
        value: f64,
        /// The configured limit.
        limit: f64,
    },
    /// Sharded (FSDP) training could not gather, scatter or use its shards: a collective
    /// failed, the weights were released when read, or the model cannot be sharded.
    #[error("sharded training: {0}")]
    Sharding(String),
    /// Expert-parallel training could not spread the experts or exchange gradients: a
    /// dense model, a group that does not divide the experts, FSDP, a failed collective.
    #[error("expert-parallel training: {0}")]
    ExpertParallel(String),
    /// A collective among data-parallel replicas failed (a peer left or timed out, NCCL
    /// failed): a failure of the run, which the supervisor retries, never the user's input.
    #[error("{what} failed: {source}")]
    Collective {
        /// Which exchange (`gradient all-reduce`, ...).
        what: &'static str,
        /// The collective's error (its timeout names the operation and the rank).
        #[source]
        source: oxalign_kernels::CollectiveError,
    },
    /// An error from candle's tensor operations.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// `Result` with [`RlhfError`].
pub type Result<T> = std::result::Result<T, RlhfError>;

impl RlhfError {
    /// Shorthand for [`RlhfError::InvalidArgument`].
    pub(crate) fn invalid(
        name: impl Into<String>,
        value: impl std::fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        RlhfError::InvalidArgument {
            name: name.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

/// Errors unless `value >= min` (NaN is rejected).
pub(crate) fn check_min(name: impl Into<String>, value: f64, min: f64) -> Result<()> {
    match value.partial_cmp(&min) {
        Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal) => Ok(()),
        _ => Err(RlhfError::invalid(name, value, format!("must be >= {min}"))),
    }
}

/// Errors unless `value > min` (NaN is rejected).
pub(crate) fn check_above(name: impl Into<String>, value: f64, min: f64) -> Result<()> {
    match value.partial_cmp(&min) {
        Some(std::cmp::Ordering::Greater) => Ok(()),
        _ => Err(RlhfError::invalid(name, value, format!("must be > {min}"))),
    }
}
