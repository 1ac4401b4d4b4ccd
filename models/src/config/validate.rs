//! Checking a [`ModelConfig`] before any weight is allocated: non-zero sizes, head
//! divisibility, the numbers' bounds (`bounds.rs`), the MoE keys and the family's own rules.

use crate::config::model_config::ModelConfig;
use crate::error::{ModelError, Result};
use std::path::{Path, PathBuf};

impl ModelConfig {
    /// Checks the invariants the model code relies on (divisibility, non-zero sizes).
    pub fn validate(&self) -> Result<()> {
        self.validate_at(Path::new("<in-memory config>"))
    }

    pub(crate) fn validate_at(&self, path: &Path) -> Result<()> {
        let err = |key: &str, message: String| ModelError::InvalidConfig {
            path: PathBuf::from(path),
            key: key.to_string(),
            message,
        };
        for (key, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 {
                return Err(err(key, "must be greater than 0".into()));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(err(
                "num_key_value_heads",
                format!(
                    "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(err(
                "head_dim",
                format!("must be even for RoPE, found {}", self.head_dim),
            ));
        }
        if self.sliding_window == Some(0) {
            return Err(err("sliding_window", "must be greater than 0".into()));
        }
        let memory = crate::io::machine_memory::total_memory_bytes();
        crate::config::bounds::check(self, path, memory)?;
        if let Some(moe) = &self.moe {
            moe.validate_at(path, self.num_hidden_layers)?;
        }
        self.family.decl().validate(self, path)?;
        for (key, id) in [
            ("bos_token_id", self.bos_token_id),
            ("pad_token_id", self.pad_token_id),
        ]
        .into_iter()
        .chain(self.eos_token_id.iter().map(|&e| ("eos_token_id", Some(e))))
        {
            if let Some(id) = id {
                if id as usize >= self.vocab_size {
                    return Err(err(
                        key,
                        format!("token id {id} is not below vocab_size {}", self.vocab_size),
                    ));
                }
            }
        }
        Ok(())
    }
}
