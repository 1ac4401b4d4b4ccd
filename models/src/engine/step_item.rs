//! What one engine step runs: the runs of new tokens per sequence ([`StepItem`]), which
//! logits each wants, and the model's attention shape. Leaf types shared by the forward,
//! the attention kernel and the scorer.

/// Which logits an item wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WantLogits {
    /// None (a prefill chunk that does not reach the end of the sequence).
    None,
    /// The last new position only (to sample the next token).
    Last,
    /// Every new position from the `k`-th on (scoring a sequence: 0 for all of them, the
    /// prompt's length less one for a rollout's response only).
    From(usize),
}

/// A run of new tokens of one sequence.
pub(crate) struct StepItem<'a> {
    /// The sequence's block table (already covering `start + tokens.len()` positions).
    pub table: &'a [usize],
    /// Position of the first new token (= tokens already cached).
    pub start: usize,
    /// The new tokens.
    pub tokens: &'a [u32],
    /// Which logits to return.
    pub want: WantLogits,
}

/// Attention shape of the model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnDims {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Scores become `c · tanh(s / c)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
}
