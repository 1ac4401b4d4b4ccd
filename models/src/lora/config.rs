//! [`LoraConfig`]: the adapter settings under PEFT's names (`r`, `lora_alpha`,
//! `lora_dropout`, `target_modules`, `modules_to_save`, `use_rslora`), their checks and the
//! scale `alpha / r` (`alpha / √r` with rsLoRA), and [`LoraError`].

use serde::{Deserialize, Serialize};

/// The linear-layer names PEFT users write in `target_modules` that oxalign's decoders have.
pub const LINEAR_MODULES: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// PEFT's shorthand for every linear layer except the output head.
pub const ALL_LINEAR: &str = "all-linear";

/// The settings of a model's LoRA adapters, spelled as PEFT's `LoraConfig` spells them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// The rank of each adapter.
    pub r: usize,
    /// The numerator of the scale: the update is `(alpha / r) · B·A`.
    #[serde(rename = "lora_alpha")]
    pub alpha: f64,
    /// Dropout on the adapter's input in a training forward (`0 <= p < 1`).
    #[serde(rename = "lora_dropout", default)]
    pub dropout: f64,
    /// The linear layers that carry an adapter, by module name (`q_proj`, ..., or
    /// `all-linear`).
    pub target_modules: Vec<String>,
    /// Head modules trained whole (e.g. `score` for a reward model or critic, `lm_head`).
    #[serde(default)]
    pub modules_to_save: Vec<String>,
    /// rsLoRA's scale `alpha / √r` instead of `alpha / r`.
    #[serde(default)]
    pub use_rslora: bool,
}

/// An adapter setting or file oxalign cannot use, with what was expected.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    /// A setting out of range or unsupported.
    #[error("lora.{key}: {message}")]
    Setting { key: &'static str, message: String },
    /// The adapter does not fit the model it is put on.
    #[error("LoRA adapter: {0}")]
    Mismatch(String),
}

impl LoraConfig {
    /// The adapters PEFT users start from: rank 16, alpha 32, every linear layer.
    pub fn all_linear(r: usize, alpha: f64) -> LoraConfig {
        LoraConfig {
            r,
            alpha,
            dropout: 0.0,
            target_modules: vec![ALL_LINEAR.into()],
            modules_to_save: vec![],
            use_rslora: false,
        }
    }

    /// What multiplies `B·A`: `alpha / r`, or `alpha / √r` with rsLoRA.
    pub fn scale(&self) -> f64 {
        match self.use_rslora {
            true => self.alpha / (self.r as f64).sqrt(),
            false => self.alpha / self.r as f64,
        }
    }

    /// Refuses a rank of 0, a non-finite alpha, a dropout outside `[0, 1)`, an empty or
    /// unknown target.
    pub fn check(&self) -> Result<(), LoraError> {
        let bad = |key, message: String| Err(LoraError::Setting { key, message });
        if self.r == 0 {
            return bad("r", "must be at least 1".into());
        }
        if !self.alpha.is_finite() || self.alpha <= 0.0 {
            return bad(
                "alpha",
                format!("must be a positive number, got {}", self.alpha),
            );
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(
                "dropout",
                format!("must be in [0, 1), got {}", self.dropout),
            );
        }
        if self.target_modules.is_empty() {
            return bad("target_modules", "names no module".into());
        }
        for t in &self.target_modules {
            if t != ALL_LINEAR && !LINEAR_MODULES.contains(&t.as_str()) {
                let known = LINEAR_MODULES.join(", ");
                return bad(
                    "target_modules",
                    format!("unknown module {t:?}; expected {ALL_LINEAR} or some of {known}"),
                );
            }
        }
        Ok(())
    }

    /// Whether the linear layer called `module` (`q_proj`, ...) carries an adapter.
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules
            .iter()
            .any(|t| t == ALL_LINEAR || t == module)
    }
}
