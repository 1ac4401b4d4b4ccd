//! Parameter groups for the optimizer: per-group lr scale and weight decay, and the default
//! "no decay for norms, biases and embeddings" rule. It does not hold optimizer state.

/// One group of parameters sharing an lr scale and a weight decay.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ParamGroup {
    /// Group name (for logs and the saved state), e.g. `"decay"`.
    pub name: String,
    /// Multiplies the optimizer's learning rate for this group.
    pub lr_scale: f64,
    /// Decoupled weight decay coefficient λ (PyTorch AdamW: `p ← p·(1 − lr·λ)`).
    pub weight_decay: f64,
}

/// Name of the default group with weight decay.
pub(crate) const DECAY_GROUP: &str = "decay";
/// Name of the default group without weight decay.
pub(crate) const NO_DECAY_GROUP: &str = "no_decay";

/// The default rule: no weight decay for a parameter whose HF name contains `"norm"`
/// (`input_layernorm`, `model.norm`, ...), ends with `".bias"`, or contains `"embed_tokens"`.
pub fn is_no_decay(name: &str) -> bool {
    name.contains("norm") || name.ends_with(".bias") || name.contains("embed_tokens")
}

/// The default two groups: index 0 `"decay"` with `weight_decay`, index 1 `"no_decay"` with 0;
/// both with lr scale 1. Pair with [`default_group_of`].
pub fn default_groups(weight_decay: f64) -> Vec<ParamGroup> {
    vec![
        ParamGroup {
            name: DECAY_GROUP.into(),
            lr_scale: 1.0,
            weight_decay,
        },
        ParamGroup {
            name: NO_DECAY_GROUP.into(),
            lr_scale: 1.0,
            weight_decay: 0.0,
        },
    ]
}

/// Group index of `name` under [`default_groups`] (0 = decay, 1 = no decay).
pub fn default_group_of(name: &str) -> usize {
    usize::from(is_no_decay(name))
}
