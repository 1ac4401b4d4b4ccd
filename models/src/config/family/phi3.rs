//! The Phi-3 family (`model_type: "phi3"`): Mistral's keys (the dense backbone without
//! biases, an optional `sliding_window` on every layer) and two fused projections in its checkpoints
//! (`self_attn.qkv_proj` = q, k, v rows stacked; `mlp.gate_up_proj` = gate then up rows).
//! The declaration names the separate projections; loading splits the fused tensors and
//! saving fuses them again (`io/fused_projections.rs`). Partial rotary embeddings
//! (`partial_rotary_factor` < 1, Phi-4-mini) and long-context RoPE (`longrope`) are refused.

use super::mistral::Mistral;
use super::{FamilyDecl, FamilyKeys};
use crate::config::layout::Biases;
use crate::config::model_config::ModelConfig;
use crate::config::raw::{At, RawConfig};
use crate::error::Result;
use serde_json::{Map, Value};

/// The Phi-3 declaration.
pub(crate) struct Phi3;

impl FamilyDecl for Phi3 {
    fn model_type(&self) -> &'static str {
        "phi3"
    }

    fn class_prefix(&self) -> &'static str {
        "Phi3"
    }

    fn read_keys(&self, raw: &RawConfig, at: &At<'_>) -> Result<FamilyKeys> {
        let nested = raw.rope_parameters.as_ref();
        let factor = raw
            .extra
            .get("partial_rotary_factor")
            .or_else(|| nested.and_then(|p| p.get("partial_rotary_factor")));
        if let Some(f) = factor {
            if f.as_f64() != Some(1.0) {
                return Err(at.err(
                    "partial_rotary_factor",
                    format!("{f}: only 1.0 (rotary embeddings over the whole head) is supported"),
                ));
            }
        }
        Mistral.read_keys(raw, at)
    }

    fn write_keys(&self, cfg: &ModelConfig, out: &mut Map<String, Value>) {
        Mistral.write_keys(cfg, out)
    }

    fn biases(&self, cfg: &ModelConfig) -> Biases {
        Mistral.biases(cfg)
    }

    fn fused_projections(&self) -> bool {
        true
    }
}
