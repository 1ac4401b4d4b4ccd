//! The Mistral family (`model_type: "mistral"`): the dense backbone without biases, with an
//! optional `sliding_window` on every layer.

use super::{FamilyDecl, FamilyKeys};
use crate::config::layout::Biases;
use crate::config::model_config::ModelConfig;
use crate::config::raw::{At, RawConfig};
use crate::error::Result;
use serde_json::{Map, Value};

/// The Mistral declaration.
pub(crate) struct Mistral;

impl FamilyDecl for Mistral {
    fn model_type(&self) -> &'static str {
        "mistral"
    }

    fn class_prefix(&self) -> &'static str {
        "Mistral"
    }

    fn read_keys(&self, raw: &RawConfig, _at: &At<'_>) -> Result<FamilyKeys> {
        Ok(FamilyKeys {
            sliding_window: raw.sliding_window,
            ..FamilyKeys::default()
        })
    }

    fn write_keys(&self, cfg: &ModelConfig, out: &mut Map<String, Value>) {
        out.insert("sliding_window".into(), cfg.sliding_window.into());
    }

    fn biases(&self, _cfg: &ModelConfig) -> Biases {
        Biases {
            qkv: false,
            o: false,
            mlp: false,
        }
    }
}
