//! The Qwen2 family (`model_type: "qwen2"`): the dense backbone with a bias on q/k/v (never
//! on o or the MLP), and a sliding window from layer `max_window_layers` on when
//! `use_sliding_window` is true.

use super::{FamilyDecl, FamilyKeys};
use crate::config::layout::Biases;
use crate::config::model_config::ModelConfig;
use crate::config::raw::{At, RawConfig};
use crate::error::Result;
use serde_json::{Map, Value};

/// HF's default `max_window_layers` for Qwen2.
const DEFAULT_MAX_WINDOW_LAYERS: usize = 28;

/// Qwen2's sliding-window keys (shared with Qwen2-MoE): a window from layer
/// `max_window_layers` on, only when `use_sliding_window` is true.
pub(super) fn qwen2_window_keys(raw: &RawConfig) -> FamilyKeys {
    if !raw.use_sliding_window.unwrap_or(false) {
        return FamilyKeys::default();
    }
    FamilyKeys {
        sliding_window: raw.sliding_window,
        max_window_layers: raw.max_window_layers.unwrap_or(DEFAULT_MAX_WINDOW_LAYERS),
        ..FamilyKeys::default()
    }
}

/// Writes Qwen2's sliding-window keys (shared with Qwen2-MoE).
pub(super) fn write_qwen2_window_keys(cfg: &ModelConfig, out: &mut Map<String, Value>) {
    out.insert(
        "use_sliding_window".into(),
        cfg.sliding_window.is_some().into(),
    );
    out.insert("sliding_window".into(), cfg.sliding_window.into());
    out.insert("max_window_layers".into(), cfg.max_window_layers.into());
}

/// The Qwen2 declaration.
pub(crate) struct Qwen2;

impl FamilyDecl for Qwen2 {
    fn model_type(&self) -> &'static str {
        "qwen2"
    }

    fn class_prefix(&self) -> &'static str {
        "Qwen2"
    }

    fn read_keys(&self, raw: &RawConfig, _at: &At<'_>) -> Result<FamilyKeys> {
        Ok(qwen2_window_keys(raw))
    }

    fn write_keys(&self, cfg: &ModelConfig, out: &mut Map<String, Value>) {
        write_qwen2_window_keys(cfg, out);
    }

    fn biases(&self, _cfg: &ModelConfig) -> Biases {
        Biases {
            qkv: true,
            o: false,
            mlp: false,
        }
    }
}
