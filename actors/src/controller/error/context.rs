//! The error of a sequence longer than the policy's context (`max_position_embeddings`).

/// A prompt plus what follows it exceeds the policy's context.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{what}: the prompt ({prompt_len} tokens) plus {extra_key} ({extra_len} tokens) exceeds the policy's context of {context} tokens (max_position_embeddings); lower {extra_key} or shorten the prompts"
)]
pub struct ContextError {
    /// The prompt, e.g. `RL step 3, prompt "7+8="`.
    pub what: String,
    /// Its length in tokens.
    pub prompt_len: usize,
    /// The recipe key or data that the extra tokens come from.
    pub extra_key: &'static str,
    /// The extra tokens.
    pub extra_len: usize,
    /// The policy's context in tokens.
    pub context: usize,
}
