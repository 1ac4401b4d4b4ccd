//! The text decoder inside a multimodal checkpoint (Gemma 3's
//! `Gemma3ForConditionalGeneration`, `model_type: "gemma3"`): its tensors are stored under
//! `language_model.model.` and `language_model.lm_head.` (transformers 5 names them
//! `model.language_model.` and `lm_head.` in memory). They come back under the causal LM's
//! names (`model.`, `lm_head.`), a classifier's `score` stays; the vision tower's and the
//! projector's tensors are dropped.
//! The config side is `config/json.rs`'s (`text_config` read as `gemma3_text`).

use crate::config::model_config::{Family, ModelConfig};
use candle_core::Tensor;
use std::collections::HashMap;

/// Where a multimodal checkpoint keeps its decoder, and the causal LM's name for it.
const DECODER_PREFIXES: [(&str, &str); 3] = [
    ("language_model.model.", "model."),
    ("model.language_model.", "model."),
    ("language_model.lm_head.", "lm_head."),
];

/// Head tensors a multimodal checkpoint keeps at the top level.
const TOP_LEVEL_HEADS: [&str; 2] = ["lm_head.", "score."];

/// Renames a multimodal Gemma 3 checkpoint's decoder tensors in `tensors` to the causal
/// LM's names and drops the rest; a text-only checkpoint (or another family) is left as it
/// is.
pub(crate) fn extract(cfg: &ModelConfig, tensors: &mut HashMap<String, Tensor>) {
    let prefixed = |name: &str| {
        DECODER_PREFIXES
            .iter()
            .find(|(from, _)| name.starts_with(from))
    };
    if cfg.family != Family::Gemma3 || !tensors.keys().any(|k| prefixed(k).is_some()) {
        return;
    }
    for (name, t) in std::mem::take(tensors) {
        match prefixed(&name) {
            Some((from, to)) => {
                tensors.insert(format!("{to}{}", &name[from.len()..]), t);
            }
            // The heads sit at the top level (transformers 5's untied LM head, a classifier's
            // `score`).
            None if TOP_LEVEL_HEADS.iter().any(|h| name.starts_with(h)) => {
                tensors.insert(name, t);
            }
            None => {}
        }
    }
}
