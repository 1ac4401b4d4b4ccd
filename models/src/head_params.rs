//! Shared plumbing of the scalar heads (value and reward models): building the parameter
//! store from backbone + `score.*` tensors (initialising a missing head on request) and the
//! `num_labels = 1` config keys HF classifiers expect. No forward math here.

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::param_spec::{backbone_specs, init_tensors, ParamSpec};
use crate::param_store::ParamStore;
use candle_core::{DType, Device, Tensor};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;

/// Builds the store of a head model: `model.*` (always required) plus `head` specs.
/// With `new_head_seed = Some(seed)`, head tensors missing from `tensors` are initialised
/// (Normal(0, 0.02) weight, zero bias) instead of being an error; present ones must still have
/// the right shape.
pub(crate) fn head_store(
    config: &ModelConfig,
    head: &[ParamSpec],
    tensors: &HashMap<String, Tensor>,
    source: &Path,
    new_head_seed: Option<u64>,
    dtype: DType,
    device: &Device,
) -> Result<ParamStore> {
    config.validate()?;
    let mut specs = backbone_specs(config);
    specs.extend_from_slice(head);
    match new_head_seed {
        None => ParamStore::from_tensors(&specs, tensors, source, dtype, device),
        Some(seed) => {
            let missing: Vec<ParamSpec> = head
                .iter()
                .filter(|s| !tensors.contains_key(&s.name))
                .cloned()
                .collect();
            if missing.is_empty() {
                return ParamStore::from_tensors(&specs, tensors, source, dtype, device);
            }
            let mut all = tensors.clone();
            all.extend(init_tensors(&missing, seed, dtype, device)?);
            ParamStore::from_tensors(&specs, &all, source, dtype, device)
        }
    }
}

/// `config` with the HF keys of a one-label classifier (`id2label`/`label2id`, i.e.
/// `num_labels = 1`).
pub(crate) fn classifier_config(config: &ModelConfig) -> ModelConfig {
    let mut c = config.clone();
    c.extra.remove("num_labels");
    c.extra.insert("id2label".into(), json!({"0": "LABEL_0"}));
    c.extra.insert("label2id".into(), json!({"LABEL_0": 0}));
    c
}

/// Checks that a checkpoint config describes one label (when it says anything about labels).
pub(crate) fn check_one_label(config: &ModelConfig, source: &Path) -> Result<()> {
    let n = match (config.extra.get("num_labels"), config.extra.get("id2label")) {
        (Some(n), _) => n.as_u64().map(|n| n as usize),
        (None, Some(map)) => map.as_object().map(|m| m.len()),
        (None, None) => return Ok(()),
    };
    if n == Some(1) {
        Ok(())
    } else {
        Err(ModelError::InvalidConfig {
            path: source.join(crate::checkpoint::CONFIG_FILE),
            key: "num_labels".into(),
            message: format!("scalar heads need exactly 1 label, found {n:?}"),
        })
    }
}
