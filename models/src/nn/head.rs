//! The heads a backbone can wear, each declared once: its HF class suffix, its parameters
//! (added after the backbone's in `config/layout.rs` order) and how it binds them. The LM head
//! (`*ForCausalLM`), the critic's per-token value (`*ForTokenClassification`, one label) and
//! the reward model's sequence score (`*ForSequenceClassification`, one label). The forward
//! math of each head is in its model file (`causal_lm.rs`, `value_model.rs`,
//! `reward_model.rs`); the shared constructors and accessors are in `model.rs`.

use crate::config::layout::{lm_head_param, LinearParams};
use crate::config::model_config::ModelConfig;
use crate::config::param_spec::ParamSpec;
use crate::io::param_store::ParamStore;
use crate::nn::decoder::Decoder;
use candle_core::{Result, Tensor};

/// A head on the shared backbone. Implemented by [`LmHead`], [`ValueHead`] and [`RewardHead`].
pub trait Head: Clone + Sized {
    /// The HF class-name suffix, e.g. `ForCausalLM`.
    const ARCHITECTURE: &'static str;
    /// Whether this is a one-label classifier: saved with `id2label`/`label2id`, and a loaded
    /// folder that names its labels must name exactly one.
    const SCALAR: bool;

    /// The head's own parameters under `cfg` (none for a tied LM head).
    fn params(cfg: &ModelConfig) -> Vec<ParamSpec>;

    /// Picks up the head's tensors from `params` (a tied LM head reuses the embedding).
    fn bind(cfg: &ModelConfig, params: &ParamStore, decoder: &Decoder) -> Result<Self>;
}

/// The language-model head: logits `[.., V]` from `lm_head.weight` `[V, H]`, or from the
/// token embedding when `tie_word_embeddings` is set.
#[derive(Clone, Debug)]
pub struct LmHead {
    /// `[V, H]`.
    pub(crate) weight: Tensor,
}

impl Head for LmHead {
    const ARCHITECTURE: &'static str = "ForCausalLM";
    const SCALAR: bool = false;

    fn params(cfg: &ModelConfig) -> Vec<ParamSpec> {
        lm_head_param(cfg).into_iter().collect()
    }

    fn bind(cfg: &ModelConfig, params: &ParamStore, decoder: &Decoder) -> Result<Self> {
        let weight = match lm_head_param(cfg) {
            Some(spec) => params.get(&spec.name)?,
            None => decoder.embed_tokens().clone(),
        };
        Ok(LmHead { weight })
    }
}

/// The critic's head: `score` Linear(H, 1) with bias, one value per token.
#[derive(Clone, Debug)]
pub struct ValueHead {
    /// `score.weight` `[1, H]`.
    pub(crate) weight: Tensor,
    /// `score.bias` `[1]`.
    pub(crate) bias: Tensor,
}

/// `score` `[1, H]`, with or without a bias.
fn score(cfg: &ModelConfig, bias: bool) -> LinearParams {
    LinearParams::new("score", 1, cfg.hidden_size, bias)
}

impl Head for ValueHead {
    const ARCHITECTURE: &'static str = "ForTokenClassification";
    const SCALAR: bool = true;

    fn params(cfg: &ModelConfig) -> Vec<ParamSpec> {
        let s = score(cfg, true);
        [s.weight].into_iter().chain(s.bias).collect()
    }

    fn bind(cfg: &ModelConfig, params: &ParamStore, _decoder: &Decoder) -> Result<Self> {
        let s = score(cfg, true);
        let bias = s.bias.as_ref().map(|b| b.name.as_str()).unwrap_or_default();
        Ok(ValueHead {
            weight: params.get(&s.weight.name)?,
            bias: params.get(bias)?,
        })
    }
}

/// The reward model's head: `score.weight` `[1, H]` (no bias), read at the last real token.
#[derive(Clone, Debug)]
pub struct RewardHead {
    /// `score.weight` `[1, H]`.
    pub(crate) weight: Tensor,
}

impl Head for RewardHead {
    const ARCHITECTURE: &'static str = "ForSequenceClassification";
    const SCALAR: bool = true;

    fn params(cfg: &ModelConfig) -> Vec<ParamSpec> {
        vec![score(cfg, false).weight]
    }

    fn bind(cfg: &ModelConfig, params: &ParamStore, _decoder: &Decoder) -> Result<Self> {
        Ok(RewardHead {
            weight: params.get(&score(cfg, false).weight.name)?,
        })
    }
}
