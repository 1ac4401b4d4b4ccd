//! The supported decoder families and their registry. Each family declares itself once, in
//! its own file (`llama.rs`, `qwen2.rs`, `mistral.rs`): its HF `model_type` and class prefix,
//! the config.json keys only it reads and writes, which projections carry biases, and its
//! parameter layout (`layout.rs`). Everything else (config parsing, the training modules,
//! load/save, the engine) asks the declaration. Adding a family is one new file plus a
//! variant and a match arm here.

mod llama;
mod mistral;
mod qwen2;

use crate::config::ModelConfig;
use crate::config_json::RawConfig;
use crate::layout::{dense_backbone, BackboneParams, Biases};
use serde_json::{Map, Value};

/// A supported decoder family (HF `model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `model_type: "llama"` (Llama 2/3, optional attention/MLP bias, llama3 RoPE scaling).
    Llama,
    /// `model_type: "qwen2"` (q/k/v projections always carry a bias).
    Qwen2,
    /// `model_type: "mistral"` (optional sliding-window attention).
    Mistral,
}

/// The config.json keys a family interprets itself (biases and sliding windows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FamilyKeys {
    /// `ModelConfig::attention_bias`.
    pub attention_bias: bool,
    /// `ModelConfig::mlp_bias`.
    pub mlp_bias: bool,
    /// `ModelConfig::sliding_window`.
    pub sliding_window: Option<usize>,
    /// `ModelConfig::max_window_layers`.
    pub max_window_layers: usize,
}

/// What a family declares about itself. One implementation per family file.
pub(crate) trait FamilyDecl: Sync {
    /// The HF `model_type` string.
    fn model_type(&self) -> &'static str;
    /// The HF class-name prefix (`Llama` in `LlamaForCausalLM`).
    fn class_prefix(&self) -> &'static str;
    /// The family's own keys, read from a parsed config.json.
    fn read_keys(&self, raw: &RawConfig) -> FamilyKeys;
    /// Writes the family's own keys back into a config.json object.
    fn write_keys(&self, cfg: &ModelConfig, out: &mut Map<String, Value>);
    /// Which projections carry a bias under `cfg`.
    fn biases(&self, cfg: &ModelConfig) -> Biases;
    /// The backbone's parameters under `cfg` (the dense Llama layout unless overridden).
    fn backbone(&self, cfg: &ModelConfig) -> BackboneParams {
        dense_backbone(cfg, self.biases(cfg))
    }
}

impl Family {
    /// All supported families.
    pub const ALL: [Family; 3] = [Family::Llama, Family::Qwen2, Family::Mistral];

    /// The family's declaration.
    pub(crate) fn decl(self) -> &'static dyn FamilyDecl {
        match self {
            Family::Llama => &llama::Llama,
            Family::Qwen2 => &qwen2::Qwen2,
            Family::Mistral => &mistral::Mistral,
        }
    }

    /// The HF `model_type` string.
    pub fn model_type(self) -> &'static str {
        self.decl().model_type()
    }

    /// Parses an HF `model_type` string.
    pub fn from_model_type(s: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.model_type() == s)
    }

    /// The `model_type` strings this crate supports.
    pub fn supported_model_types() -> Vec<&'static str> {
        Family::ALL.iter().map(|f| f.model_type()).collect()
    }

    /// HF class name for a head on this family, e.g. `architecture("ForCausalLM")`
    /// gives `LlamaForCausalLM`.
    pub fn architecture(self, head: &str) -> String {
        format!("{}{}", self.decl().class_prefix(), head)
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
    }
}

impl std::str::FromStr for Family {
    type Err = crate::error::UnknownName;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Family::from_model_type(s).ok_or_else(|| crate::error::UnknownName {
            what: "model family",
            got: s.to_string(),
            expected: format!("one of: {}", Family::supported_model_types().join(", ")),
        })
    }
}
