//! The Llama family (`model_type: "llama"`, Llama 2/3): the dense backbone with optional
//! `attention_bias` (q/k/v/o) and `mlp_bias` (gate/up/down); no sliding window.

use super::{FamilyDecl, FamilyKeys};
use crate::config::layout::Biases;
use crate::config::model_config::ModelConfig;
use crate::config::raw::{At, RawConfig};
use crate::error::Result;
use serde_json::{Map, Value};

/// The Llama declaration.
pub(crate) struct Llama;

impl FamilyDecl for Llama {
    fn model_type(&self) -> &'static str {
        "llama"
    }

    fn class_prefix(&self) -> &'static str {
        "Llama"
    }

    fn read_keys(&self, raw: &RawConfig, _at: &At<'_>) -> Result<FamilyKeys> {
        Ok(FamilyKeys {
            attention_bias: raw.attention_bias.unwrap_or(false),
            mlp_bias: raw.mlp_bias.unwrap_or(false),
            ..FamilyKeys::default()
        })
    }

    fn write_keys(&self, cfg: &ModelConfig, out: &mut Map<String, Value>) {
        out.insert("attention_bias".into(), cfg.attention_bias.into());
        out.insert("mlp_bias".into(), cfg.mlp_bias.into());
    }

    fn biases(&self, cfg: &ModelConfig) -> Biases {
        Biases {
            qkv: cfg.attention_bias,
            o: cfg.attention_bias,
            mlp: cfg.mlp_bias,
        }
    }
}
