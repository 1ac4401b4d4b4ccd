//! The error type of the generation engine: bad requests, a KV pool too small for a request,
//! bad engine settings and rejected refits. Tensor failures pass through as `candle_core::Error`
//! and weight-map problems as [`ModelError`]; nothing here panics on user input.

use crate::error::ModelError;

/// Everything that can go wrong in [`crate::engine::Engine`].
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A request is malformed (empty prompt, token outside the vocabulary, bad sampling value,
    /// stop strings without a detokenizer).
    #[error("invalid generation request {index}: {message}")]
    InvalidRequest {
        /// Index of the request in the batch.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// A single request needs more KV blocks than the whole pool holds.
    #[error(
        "request {index} needs {needed} KV blocks ({tokens} tokens at block size {block_size}) \
         but the pool holds only {num_blocks}; raise the engine's kv_memory_bytes/num_blocks \
         or lower max_new_tokens"
    )]
    Capacity {
        /// Index of the request in the batch.
        index: usize,
        /// Prompt + max new tokens.
        tokens: usize,
        /// Blocks it needs.
        needed: usize,
        /// Tokens per block.
        block_size: usize,
        /// Blocks in the pool.
        num_blocks: usize,
    },
    /// An engine setting is unusable.
    #[error("invalid engine setting `{key}`: {message}")]
    Config {
        /// The setting (e.g. `block_size`, `quant`).
        key: &'static str,
        /// What was expected.
        message: String,
    },
    /// A refit failed verification; the engine kept its previous weights and version.
    #[error("refit to version {version} rejected (engine stays at version {kept}): {reason}")]
    RefitRejected {
        /// The version that was offered.
        version: u64,
        /// The version the engine still serves.
        kept: u64,
        /// Which check failed (tensor names, probe difference).
        reason: String,
    },
    /// The scheduler could not make progress (an internal invariant broke).
    #[error("engine scheduler stalled: {0}")]
    Stalled(String),
    /// A weight map problem (missing tensor, wrong shape).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias of the engine.
pub type EngineResult<T> = std::result::Result<T, EngineError>;
