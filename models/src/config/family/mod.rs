//! The supported decoder families and their registry. Each family declares itself once, in its
//! own file (`llama.rs`, `qwen2.rs`, `qwen3.rs`, `mistral.rs`, `phi3.rs`, and the mixture-of-experts
//! `qwen3_moe.rs`, `qwen2_moe.rs`, `mixtral.rs` with their shared keys in `moe_keys.rs`, and
//! Gemma 2 and 3 in `gemma.rs` with their keys in `gemma_keys.rs`): its
//! HF `model_type` and class prefix, the config.json keys only it reads and writes, which
//! projections carry biases, and its parameter layout (`config/layout.rs`, `moe/layout.rs`).
//! Everything else (config parsing, the training modules, load/save, the engine) asks the
//! declaration. Adding a family is one new file plus a variant in `kind.rs` and a match arm
//! here.

mod gemma;
mod gemma_keys;
pub(crate) mod kind;
mod llama;
mod mistral;
mod mixtral;
mod moe_keys;
mod phi3;
mod qwen2;
mod qwen2_moe;
mod qwen3;
mod qwen3_moe;

use crate::config::layout::{dense_backbone, BackboneParams, Biases};
use crate::config::model_config::{BlockStyle, ModelConfig, SlidingLayers};
use crate::config::raw::{At, RawConfig};
use crate::error::Result;
use crate::moe::config::MoeConfig;
pub use kind::Family;
use serde_json::{Map, Value};

/// The config.json keys a family interprets itself (biases, sliding windows, experts).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct FamilyKeys {
    /// `ModelConfig::attention_bias`.
    pub attention_bias: bool,
    /// `ModelConfig::mlp_bias`.
    pub mlp_bias: bool,
    /// `ModelConfig::sliding_window`.
    pub sliding_window: Option<usize>,
    /// `ModelConfig::max_window_layers`.
    pub max_window_layers: usize,
    /// `ModelConfig::moe`.
    pub moe: Option<MoeConfig>,
    /// `ModelConfig::sliding_layers` (the family read `layer_types` itself).
    pub sliding_layers: Option<SlidingLayers>,
    /// `ModelConfig::style`.
    pub style: BlockStyle,
    /// `tie_word_embeddings` when config.json does not say (HF's default for the family).
    pub tie_by_default: bool,
}

/// What a family declares about itself. One implementation per family file.
pub(crate) trait FamilyDecl: Sync {
    /// The HF `model_type` string.
    fn model_type(&self) -> &'static str;
    /// The HF class-name prefix (`Llama` in `LlamaForCausalLM`).
    fn class_prefix(&self) -> &'static str;
    /// The family's own keys, read from a parsed config.json (errors name the key via `at`).
    fn read_keys(&self, raw: &RawConfig, at: &At<'_>) -> Result<FamilyKeys>;
    /// Writes the family's own keys back into a config.json object.
    fn write_keys(&self, cfg: &ModelConfig, out: &mut Map<String, Value>);
    /// Which projections carry a bias under `cfg`.
    fn biases(&self, cfg: &ModelConfig) -> Biases;
    /// The backbone's parameters under `cfg` (the dense Llama layout unless overridden).
    fn backbone(&self, cfg: &ModelConfig) -> BackboneParams {
        dense_backbone(cfg, self.biases(cfg))
    }
    /// Family-specific checks of a parsed or built config (errors name `path` and the key).
    fn validate(&self, _cfg: &ModelConfig, _path: &std::path::Path) -> Result<()> {
        Ok(())
    }
    /// The MoE hyper-parameters of the size presets (`hidden`, `intermediate`: the preset's
    /// widths); `None` for the dense families.
    fn preset_moe(&self, _hidden: usize, _intermediate: usize) -> Option<MoeConfig> {
        None
    }
    /// The HF class name of this family with `head` (`ForCausalLM`, ...).
    fn architecture(&self, head: &str) -> String {
        format!("{}{}", self.class_prefix(), head)
    }
    /// Makes a size preset's Llama-like config (`preset.rs`) one of this family.
    fn adjust_preset(&self, _cfg: &mut ModelConfig) {}
    /// Whether its checkpoints fuse q/k/v into `qkv_proj` and gate/up into `gate_up_proj`
    /// (Phi-3); the declaration still names them apart.
    fn fused_projections(&self) -> bool {
        false
    }
}

impl Family {
    /// The family's declaration.
    pub(crate) fn decl(self) -> &'static dyn FamilyDecl {
        match self {
            Family::Llama => &llama::Llama,
            Family::Qwen2 => &qwen2::Qwen2,
            Family::Qwen3 => &qwen3::Qwen3,
            Family::Mistral => &mistral::Mistral,
            Family::Phi3 => &phi3::Phi3,
            Family::Qwen3Moe => &qwen3_moe::Qwen3Moe,
            Family::Qwen2Moe => &qwen2_moe::Qwen2Moe,
            Family::Mixtral => &mixtral::Mixtral,
            Family::Gemma2 => &gemma::GEMMA2,
            Family::Gemma3 => &gemma::GEMMA3,
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
        self.decl().architecture(head)
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
