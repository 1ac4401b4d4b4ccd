//! The error type of `oxalign-models`: loading, saving and validating HF-layout model folders.
//! Tensor math inside a forward pass reports plain `candle_core::Error`; this enum is for what a
//! user can get wrong (paths, config keys, tensor names and shapes) and says which file/key.

use std::path::PathBuf;

/// Everything that can go wrong while loading, saving or building a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A folder or file that must exist does not.
    #[error("{what} not found: {}", path.display())]
    MissingPath {
        /// The path that was looked for.
        path: PathBuf,
        /// What it should have been (e.g. "model folder", "config.json").
        what: &'static str,
    },
    /// Reading or writing a file failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// `read` or `write`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file (config.json, the shard index) is not valid JSON of the expected shape.
    #[error("cannot parse {}: {message}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// What serde said.
        message: String,
    },
    /// `model_type` in config.json is not one this crate implements.
    #[error("{}: unsupported model_type {model_type:?}; supported model types: {}", path.display(), supported.join(", "))]
    UnsupportedModelType {
        /// The config file.
        path: PathBuf,
        /// The value found (empty when the key is missing).
        model_type: String,
        /// The model types this crate implements.
        supported: Vec<&'static str>,
    },
    /// A config key has a value this crate cannot use.
    #[error("{}: invalid config key `{key}`: {message}", path.display())]
    InvalidConfig {
        /// The config file (or `<in-memory config>`).
        path: PathBuf,
        /// The key.
        key: String,
        /// What was expected.
        message: String,
    },
    /// A weight the architecture needs is not in the checkpoint.
    #[error("tensor `{name}` is missing from {}", path.display())]
    MissingTensor {
        /// HF tensor name, e.g. `model.layers.0.self_attn.q_proj.weight`.
        name: String,
        /// The folder or file that was searched.
        path: PathBuf,
    },
    /// A weight has the wrong shape for the config.
    #[error("tensor `{name}` in {} has shape {found:?}, expected {expected:?}", path.display())]
    ShapeMismatch {
        /// HF tensor name.
        name: String,
        /// Shape implied by config.json.
        expected: Vec<usize>,
        /// Shape found in the checkpoint.
        found: Vec<usize>,
        /// The folder or file it came from.
        path: PathBuf,
    },
    /// A weight holds NaN or infinite values (a damaged or diverged checkpoint).
    #[error("tensor `{name}` in {} holds NaN or infinite values; expected finite weights (a damaged or diverged checkpoint)", path.display())]
    NonFinite {
        /// HF tensor name.
        name: String,
        /// The file it came from.
        path: PathBuf,
    },
    /// A safetensors file could not be read or written.
    #[error("safetensors file {}: {message}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        message: String,
    },
    /// A generation request is malformed (empty prompt, bad sampling parameter, ...).
    #[error("invalid generation request {index}: {message}")]
    InvalidRequest {
        /// Index of the request in the batch.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// A tensor operation failed.
    /// Experts cannot be spread over the group as asked.
    #[error("expert parallelism over {world} ranks: {message}")]
    ExpertParallel {
        /// Ranks in the group.
        world: usize,
        /// What is wrong (a dense model, experts the group does not divide, ...).
        message: String,
    },
    #[error(transparent)]
    Lora(#[from] crate::lora::config::LoraError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias for this crate's fallible non-tensor operations.
/// A name (model family, preset, quantization mode) that is not one of the known ones.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("unknown {what} {got:?}; expected {expected}")]
pub struct UnknownName {
    /// What was being named, e.g. `model family`.
    pub what: &'static str,
    /// The name given.
    pub got: String,
    /// The accepted names, as the message shows them.
    pub expected: String,
}

/// A sampling setting out of its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{name} must be {expected}, got {value}")]
pub struct InvalidSampling {
    /// The setting, e.g. `top_p`.
    pub name: &'static str,
    /// Its value.
    pub value: f32,
    /// The accepted range, e.g. `in (0, 1]`.
    pub expected: &'static str,
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
