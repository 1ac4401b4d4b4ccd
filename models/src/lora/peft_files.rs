//! PEFT's adapter files: `adapter_config.json` (a `LoraConfig`, `peft_type = "LORA"`) and
//! `adapter_model.safetensors` (the adapters under `base_model.model.<name>`), written so
//! that `peft.PeftModel.from_pretrained` loads them on the transformers model, and read
//! back from folders PEFT wrote. Settings PEFT has and oxalign does not (per-layer ranks,
//! DoRA, trained biases, regex targets) are refused by name, never ignored.

use crate::error::{ModelError, Result};
use crate::io::checkpoint::{ensure_dir, read_safetensors, write_json};
use crate::io::param_store::write_safetensors;
use crate::lora::config::{LoraConfig, ALL_LINEAR};
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::Path;

/// The adapter settings file of a PEFT folder.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// The adapter weights file of a PEFT folder.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// The folder inside a saved LoRA model that holds PEFT's adapter files. Not the model
/// folder itself: transformers would take a folder with `adapter_config.json` for an
/// adapter and load the base beneath it, applying the adapter twice to merged weights.
pub const ADAPTER_SUBDIR: &str = "adapter";
/// The prefix PEFT's `PeftModel` puts before the wrapped model's parameter names.
const PEFT_PREFIX: &str = "base_model.model.";

/// Writes `adapters` (names inside the model) and `config` as a PEFT folder in `dir`.
/// `task_type` is PEFT's (`CAUSAL_LM`, `SEQ_CLS`, `TOKEN_CLS`); `base` is what
/// `base_model_name_or_path` records.
pub(crate) fn write_adapter(
    dir: &Path,
    config: &LoraConfig,
    targeted_modules: &[String],
    adapters: &HashMap<String, Tensor>,
    task_type: &str,
    base: &str,
) -> Result<()> {
    ensure_dir(dir)?;
    let modules_to_save = match config.modules_to_save.is_empty() {
        true => Value::Null,
        false => json!(config.modules_to_save),
    };
    let doc = json!({
        "peft_type": "LORA",
        "task_type": task_type,
        "base_model_name_or_path": base,
        "r": config.r,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": targeted_modules,
        "modules_to_save": modules_to_save,
        "use_rslora": config.use_rslora,
        "bias": "none",
        "fan_in_fan_out": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "use_dora": false,
        "rank_pattern": {},
        "alpha_pattern": {},
        "layers_to_transform": null,
    });
    write_json(&dir.join(ADAPTER_CONFIG_FILE), &doc)?;
    let mut named: Vec<(String, Tensor)> = adapters
        .iter()
        .map(|(n, t)| Ok((format!("{PEFT_PREFIX}{n}"), t.to_dtype(DType::F32)?)))
        .collect::<candle_core::Result<_>>()?;
    named.sort_by(|a, b| a.0.cmp(&b.0));
    write_safetensors(&dir.join(ADAPTER_WEIGHTS_FILE), &named)
}

/// Reads a PEFT LoRA folder: its settings and its tensors under the model's own names.
pub(crate) fn read_adapter(
    dir: &Path,
    device: &Device,
) -> Result<(LoraConfig, HashMap<String, Tensor>)> {
    let path = dir.join(ADAPTER_CONFIG_FILE);
    if !path.is_file() {
        return Err(ModelError::MissingPath {
            what: "LoRA adapter settings (adapter_config.json)",
            path,
        });
    }
    let doc = read_config_doc(&path)?;
    let config = lora_config_of(&doc).map_err(|(key, message)| ModelError::InvalidConfig {
        path: path.clone(),
        key: key.into(),
        message,
    })?;
    let weights = dir.join(ADAPTER_WEIGHTS_FILE);
    if !weights.is_file() {
        return Err(ModelError::MissingPath {
            what: "LoRA adapter weights (adapter_model.safetensors)",
            path: weights,
        });
    }
    let tensors = read_safetensors(&weights, device)?
        .into_iter()
        .map(|(n, t)| (n.strip_prefix(PEFT_PREFIX).unwrap_or(&n).to_string(), t))
        .collect();
    Ok((config, tensors))
}

/// What an adapter folder's `adapter_config.json` records of its origin: the base
/// (`base_model_name_or_path`, when non-empty) and PEFT's `task_type` (when present).
pub fn recorded_origin(dir: &Path) -> Result<(Option<String>, Option<String>)> {
    let doc = read_config_doc(&dir.join(ADAPTER_CONFIG_FILE))?;
    let text_of = |k: &str| {
        doc.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    Ok((text_of("base_model_name_or_path"), text_of("task_type")))
}

/// The JSON object of the `adapter_config.json` at `path`.
fn read_config_doc(path: &Path) -> Result<Map<String, Value>> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// The [`LoraConfig`] of an `adapter_config.json`, or the key that cannot be used and why.
fn lora_config_of(
    doc: &Map<String, Value>,
) -> std::result::Result<LoraConfig, (&'static str, String)> {
    let get = |k: &str| doc.get(k).filter(|v| !v.is_null());
    if let Some(t) = get("peft_type").and_then(Value::as_str) {
        if t != "LORA" {
            return Err((
                "peft_type",
                format!("{t:?} is not supported; expected \"LORA\""),
            ));
        }
    }
    let unsupported = |k: &'static str, ok: &dyn Fn(&Value) -> bool, want: &str| match get(k) {
        Some(v) if !ok(v) => Err((k, format!("{v} is not supported; expected {want}"))),
        _ => Ok(()),
    };
    unsupported("bias", &|v| v == "none", "\"none\"")?;
    unsupported("use_dora", &|v| v == false, "false")?;
    unsupported("fan_in_fan_out", &|v| v == false, "false")?;
    let empty = |v: &Value| v.as_object().is_some_and(|o| o.is_empty());
    unsupported("rank_pattern", &empty, "{} (one rank for every layer)")?;
    unsupported("alpha_pattern", &empty, "{} (one alpha for every layer)")?;
    unsupported("layers_to_transform", &|_| false, "null (every layer)")?;
    let r = get("r")
        .and_then(Value::as_u64)
        .ok_or(("r", "missing or not a positive integer".to_string()))? as usize;
    let alpha = get("lora_alpha")
        .and_then(Value::as_f64)
        .ok_or(("lora_alpha", "missing or not a number".to_string()))?;
    let target_modules = match get("target_modules") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or(("target_modules", "expected a list of module names".to_string()))?,
        Some(Value::String(s)) if s == ALL_LINEAR => vec![s.clone()],
        Some(v) => {
            return Err(("target_modules", format!("{v} is not supported; expected a list of module names or \"{ALL_LINEAR}\" (regular expressions are not)")))
        }
        None => return Err(("target_modules", "missing".into())),
    };
    let modules_to_save = match get("modules_to_save") {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => vec![],
    };
    Ok(LoraConfig {
        r,
        alpha,
        // Dropout acts only in training forwards; the adapter's function is the same without.
        dropout: get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0),
        target_modules,
        modules_to_save,
        use_rslora: get("use_rslora").and_then(Value::as_bool).unwrap_or(false),
    })
}
