//! Named model sizes for `oxalign init-model` and tests: `tiny` (~1M parameters, for unit tests
//! and CPU smoke runs) and `small` (~56M parameters for llama). Only hyper-parameters live here;
//! random initialisation is in `param_spec.rs`, whole model folders in `init_dir.rs`.

use crate::config::model_config::{Family, ModelConfig};
use serde_json::Map;

/// Vocabulary sizes of `small` models are rounded up to a multiple of this.
const VOCAB_MULTIPLE: usize = 64;
/// The `small` preset's vocabulary size (when the tokenizer fits in it).
const SMALL_VOCAB: usize = 32_000;

/// A named model size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preset {
    /// hidden 128, intermediate 352, 4 layers, 4 heads, 2 KV heads, vocab = tokenizer size.
    Tiny,
    /// hidden 512, intermediate 1408, 8 layers, 8 heads, 4 KV heads (vocab 32000 gives ~56M
    /// parameters for llama with an untied head).
    Small,
}

impl Preset {
    /// All presets.
    pub const ALL: [Preset; 2] = [Preset::Tiny, Preset::Small];

    /// The model's vocabulary size for a tokenizer of `tokenizer_len` ids: `tiny` uses it
    /// exactly; `small` uses 32000, or `tokenizer_len` rounded up to a multiple of 64 when
    /// that is larger (so the embedding matrix tiles well). This is the one rule: both
    /// `oxalign init-model` and a run's own init (`init_model_dir`) use it; with the byte
    /// tokenizer (260 ids) it gives 260 and 32000.
    pub fn vocab_size(self, tokenizer_len: usize) -> usize {
        match self {
            Preset::Tiny => tokenizer_len,
            Preset::Small => {
                (tokenizer_len.div_ceil(VOCAB_MULTIPLE) * VOCAB_MULTIPLE).max(SMALL_VOCAB)
            }
        }
    }

    /// The preset's name (`tiny`, `small`).
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Small => "small",
        }
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Preset {
    type Err = crate::error::UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| crate::error::UnknownName {
                what: "model preset",
                got: s.to_string(),
                expected: "one of: tiny, small".into(),
            })
    }
}

impl ModelConfig {
    /// The config of `preset` for `family` with the given vocabulary size.
    ///
    /// qwen2 presets tie the embeddings (and always carry q/k/v bias); llama and mistral presets
    /// have an untied LM head and no bias. The MoE families (qwen3_moe, qwen2_moe, mixtral)
    /// have an untied head, 4 experts with 2 per token and the family's own MoE defaults
    /// (`FamilyDecl::preset_moe`); qwen2_moe carries its q/k/v bias (`qkv_bias`). gemma3_text has
    /// Gemma's block, tied embeddings and every sixth layer full, the others sliding over
    /// 512 tokens (`FamilyDecl::adjust_preset`). Token ids (`bos/eos/pad`) are left unset: set them from
    /// the tokenizer. `small` is meant for `vocab_size = 32000`.
    pub fn preset(family: Family, preset: Preset, vocab_size: usize) -> ModelConfig {
        let (hidden, inter, layers, heads, kv) = match preset {
            Preset::Tiny => (128, 352, 4, 4, 2),
            Preset::Small => (512, 1408, 8, 8, 4),
        };
        let mut cfg = ModelConfig {
            family,
            vocab_size,
            hidden_size: hidden,
            intermediate_size: inter,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim: hidden / heads,
            rms_norm_eps: if family.is_qwen() { 1e-6 } else { 1e-5 },
            rope_theta: 10000.0,
            rope_scaling: None,
            max_position_embeddings: 2048,
            tie_word_embeddings: family == Family::Qwen2,
            attention_bias: family == Family::Qwen2Moe,
            mlp_bias: false,
            sliding_window: None,
            max_window_layers: 0,
            sliding_layers: None,
            style: Default::default(),
            bos_token_id: None,
            eos_token_id: vec![],
            pad_token_id: None,
            moe: family.decl().preset_moe(hidden, inter),
            extra: Map::new(),
        };
        family.decl().adjust_preset(&mut cfg);
        cfg
    }
}
