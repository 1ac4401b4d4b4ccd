//! [`Family`]: which decoder family a model is, as plain data. What each family declares
//! (keys, biases, layout) is the registry's (`family/mod.rs`).

/// A supported decoder family (HF `model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `model_type: "llama"` (Llama 2/3, optional attention/MLP bias, llama3 RoPE scaling).
    Llama,
    /// `model_type: "qwen2"` (q/k/v projections always carry a bias).
    Qwen2,
    /// `model_type: "qwen3"` (q/k RMSNorm per head, explicit `head_dim`, optional
    /// `attention_bias`).
    Qwen3,
    /// `model_type: "mistral"` (optional sliding-window attention).
    Mistral,
    /// `model_type: "phi3"` (fused `qkv_proj` / `gate_up_proj` in its checkpoints, optional
    /// sliding-window attention).
    Phi3,
    /// `model_type: "qwen3_moe"` (routed experts, q/k RMSNorm per head, optional
    /// `mlp_only_layers`).
    Qwen3Moe,
    /// `model_type: "qwen2_moe"` (routed experts plus a sigmoid-gated shared expert; q/k/v
    /// bias by `qkv_bias`).
    Qwen2Moe,
    /// `model_type: "mixtral"` (routed experts `block_sparse_moe.experts.N.w1/w2/w3`,
    /// renormalised top-k, optional sliding window).
    Mixtral,
    /// `model_type: "gemma2"` (`(1 + w)` RMSNorms, four norms per layer, GeGLU, a scaled
    /// embedding, soft-capped attention scores and logits, every other layer sliding).
    Gemma2,
    /// `model_type: "gemma3_text"` (Gemma 3's text decoder: `(1 + w)` RMSNorms, four norms
    /// per layer, q/k norms, GeGLU, a scaled embedding, interleaved sliding-window layers
    /// with their own RoPE base).
    Gemma3,
}

impl Family {
    /// All supported families.
    pub const ALL: [Family; 10] = [
        Family::Llama,
        Family::Qwen2,
        Family::Qwen3,
        Family::Mistral,
        Family::Phi3,
        Family::Qwen3Moe,
        Family::Qwen2Moe,
        Family::Mixtral,
        Family::Gemma2,
        Family::Gemma3,
    ];

    /// Whether the family routes tokens to experts.
    pub fn is_moe(self) -> bool {
        matches!(self, Family::Qwen3Moe | Family::Qwen2Moe | Family::Mixtral)
    }

    /// Whether the family is one of Qwen's (their presets use `rms_norm_eps` 1e-6).
    pub fn is_qwen(self) -> bool {
        matches!(
            self,
            Family::Qwen2 | Family::Qwen3 | Family::Qwen3Moe | Family::Qwen2Moe
        )
    }
}
