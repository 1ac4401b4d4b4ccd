//! The schema of an HF `config.json` as serde reads it ([`RawConfig`], every key optional),
//! and [`At`], which names the file in the errors of reading it. Leaf types: the reading
//! rules are `json.rs`'s, the family-specific keys `family/`'s.

use crate::error::{ModelError, Result};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::Path;

/// config.json as HF writes it. Every key is optional here (required ones are checked after,
/// so a missing key gets its own message); JSON `null` reads as absent, except for the
/// soft-caps, where `null` means none and absent means the family's default. Keys this crate does
/// not interpret land in `extra` and are written back unchanged.
#[derive(Debug, Deserialize)]
pub(crate) struct RawConfig {
    // Keys read elsewhere or rewritten on save; listed so they stay out of `extra`.
    #[allow(dead_code)]
    pub(crate) model_type: Option<Value>,
    #[allow(dead_code)]
    pub(crate) architectures: Option<Value>,
    #[allow(dead_code)]
    pub(crate) torch_dtype: Option<Value>,
    #[allow(dead_code)]
    pub(crate) dtype: Option<Value>,
    pub(crate) vocab_size: Option<usize>,
    pub(crate) hidden_size: Option<usize>,
    pub(crate) intermediate_size: Option<usize>,
    pub(crate) num_hidden_layers: Option<usize>,
    pub(crate) num_attention_heads: Option<usize>,
    pub(crate) num_key_value_heads: Option<usize>,
    pub(crate) head_dim: Option<usize>,
    pub(crate) hidden_act: Option<String>,
    pub(crate) rms_norm_eps: Option<f64>,
    pub(crate) rope_theta: Option<f64>,
    /// HF v4 spelling of the RoPE variant (parsed as [`RopeParams`] once chosen).
    pub(crate) rope_scaling: Option<Value>,
    /// HF v5 spelling (used when `rope_scaling` is absent).
    pub(crate) rope_parameters: Option<Value>,
    pub(crate) max_position_embeddings: Option<usize>,
    pub(crate) tie_word_embeddings: Option<bool>,
    pub(crate) attention_bias: Option<bool>,
    pub(crate) mlp_bias: Option<bool>,
    pub(crate) sliding_window: Option<usize>,
    pub(crate) use_sliding_window: Option<bool>,
    pub(crate) max_window_layers: Option<usize>,
    // Mixture-of-experts keys (read by the MoE families, `family/moe_keys.rs`).
    pub(crate) qkv_bias: Option<bool>,
    pub(crate) num_experts: Option<usize>,
    pub(crate) num_local_experts: Option<usize>,
    pub(crate) num_experts_per_tok: Option<usize>,
    pub(crate) moe_intermediate_size: Option<usize>,
    pub(crate) norm_topk_prob: Option<bool>,
    pub(crate) decoder_sparse_step: Option<usize>,
    pub(crate) mlp_only_layers: Option<Vec<usize>>,
    pub(crate) shared_expert_intermediate_size: Option<usize>,
    pub(crate) router_aux_loss_coef: Option<f64>,
    pub(crate) output_router_logits: Option<bool>,
    pub(crate) layer_types: Option<Vec<String>>,
    // Gemma keys (read by `family/gemma.rs`).
    pub(crate) hidden_activation: Option<String>,
    pub(crate) query_pre_attn_scalar: Option<f64>,
    /// `None`: absent; `Some(None)`: written as `null` (no cap).
    #[serde(default, deserialize_with = "present")]
    pub(crate) attn_logit_softcapping: Option<Option<f64>>,
    #[serde(default, deserialize_with = "present")]
    pub(crate) final_logit_softcapping: Option<Option<f64>>,
    pub(crate) rope_local_base_freq: Option<f64>,
    pub(crate) sliding_window_pattern: Option<usize>,
    pub(crate) use_bidirectional_attention: Option<bool>,
    pub(crate) bos_token_id: Option<u32>,
    #[serde(default, deserialize_with = "token_ids")]
    pub(crate) eos_token_id: Vec<u32>,
    pub(crate) pad_token_id: Option<u32>,
    #[serde(flatten)]
    pub(crate) extra: Map<String, Value>,
}

/// The object under `rope_scaling` / `rope_parameters`.
#[derive(Debug, Deserialize)]
pub(crate) struct RopeParams {
    pub(crate) rope_type: Option<Value>,
    #[serde(rename = "type")]
    pub(crate) legacy_type: Option<Value>,
    pub(crate) rope_theta: Option<f64>,
    pub(crate) factor: Option<f64>,
    pub(crate) low_freq_factor: Option<f64>,
    pub(crate) high_freq_factor: Option<f64>,
    pub(crate) original_max_position_embeddings: Option<f64>,
}

/// A key that may be written as `null`: `Some(None)` then, and `None` only when absent.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> std::result::Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// `eos_token_id`: one token id or a list of them (`null` = none).
fn token_ids<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Vec<u32>, D::Error> {
    struct Ids;
    impl<'de> Visitor<'de> for Ids {
        type Value = Vec<u32>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a token id or a list of token ids")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Vec<u32>, E> {
            u32::try_from(v)
                .map(|id| vec![id])
                .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
        }
        fn visit_unit<E: de::Error>(self) -> std::result::Result<Vec<u32>, E> {
            Ok(vec![])
        }
        fn visit_seq<A: SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Vec<u32>, A::Error> {
            let mut out = vec![];
            while let Some(id) = seq.next_element::<u32>()? {
                out.push(id);
            }
            Ok(out)
        }
    }
    d.deserialize_any(Ids)
}

/// Builds `InvalidConfig` errors for one file.
pub(crate) struct At<'a>(pub(crate) &'a Path);

impl At<'_> {
    pub(crate) fn err(&self, key: &str, message: impl Into<String>) -> ModelError {
        ModelError::InvalidConfig {
            path: self.0.to_path_buf(),
            key: key.to_string(),
            message: message.into(),
        }
    }

    pub(crate) fn required(&self, key: &str, v: Option<usize>) -> Result<usize> {
        v.ok_or_else(|| self.err(key, "required key is missing"))
    }

    /// Deserializes `value` as `T`; a type error names `key` (plus the path inside it).
    pub(crate) fn parse<'de, T: Deserialize<'de>>(
        &self,
        key: &str,
        value: &'de Value,
    ) -> Result<T> {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let inner = e.path().to_string();
            let key = match (key, inner.as_str()) {
                ("", p) => p.to_string(),
                (k, ".") => k.to_string(),
                (k, p) => format!("{k}.{p}"),
            };
            self.err(&key, e.into_inner().to_string())
        })
    }
}
