//! Reading and writing HF model folders: `config.json` plus `model.safetensors` or a sharded
//! `model.safetensors.index.json`. This file only moves bytes and validates file presence;
//! which tensors a model needs is declared by its family and head (`config/layout.rs`,
//! `nn/head.rs`).

use crate::config::model_config::ModelConfig;
use crate::error::{ModelError, Result};
use candle_core::{Device, Tensor};
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// File name of the model config inside a model folder.
pub const CONFIG_FILE: &str = "config.json";
/// File name of a single-file checkpoint.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// File name of a sharded checkpoint's index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// File name of the optional generation defaults.
pub(crate) const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// Reads `dir/config.json` and every tensor of the checkpoint in `dir` (single file or shards),
/// on `device`, in the dtype stored in the file. Packed MoE experts come back under their
/// per-expert names (`expert_layout.rs`), fused projections under their parts' names
/// (`fused_projections.rs`), a multimodal checkpoint's text decoder under the causal LM's
/// names (`text_decoder.rs`).
pub(crate) fn read_checkpoint(
    dir: &Path,
    device: &Device,
) -> Result<(ModelConfig, HashMap<String, Tensor>)> {
    if !dir.is_dir() {
        return Err(ModelError::MissingPath {
            path: dir.to_path_buf(),
            what: "model folder",
        });
    }
    let config = ModelConfig::from_file(&dir.join(CONFIG_FILE))?;
    let mut tensors = read_weights(dir, device)?;
    crate::io::text_decoder::extract(&config, &mut tensors);
    crate::moe::expert_layout::unpack_experts(&config, &mut tensors, dir)?;
    crate::io::fused_projections::unfuse(&config, &mut tensors, dir)?;
    Ok((config, tensors))
}

/// Reads the tensors of the checkpoint in `dir`: `model.safetensors` if present, else the
/// shards listed in `model.safetensors.index.json`.
pub(crate) fn read_weights(dir: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
    let single = dir.join(WEIGHTS_FILE);
    if single.is_file() {
        return read_safetensors(&single, device);
    }
    let index_path = dir.join(INDEX_FILE);
    if !index_path.is_file() {
        return Err(ModelError::MissingPath {
            path: single,
            what: "weights (model.safetensors or model.safetensors.index.json)",
        });
    }
    let text = std::fs::read_to_string(&index_path).map_err(|source| ModelError::Io {
        action: "read",
        path: index_path.clone(),
        source,
    })?;
    let index: Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: index_path.clone(),
        message: e.to_string(),
    })?;
    let weight_map = index
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| ModelError::Json {
            path: index_path.clone(),
            message: "missing object `weight_map`".into(),
        })?;
    let mut shards = BTreeSet::new();
    for (name, file) in weight_map {
        let file = file.as_str().ok_or_else(|| ModelError::Json {
            path: index_path.clone(),
            message: format!("weight_map[{name:?}] is not a file name"),
        })?;
        shards.insert(file.to_string());
    }
    let mut tensors = HashMap::new();
    for shard in shards {
        let path = dir.join(&shard);
        if !path.is_file() {
            return Err(ModelError::MissingPath {
                path,
                what: "safetensors shard listed in model.safetensors.index.json",
            });
        }
        tensors.extend(read_safetensors(&path, device)?);
    }
    Ok(tensors)
}

/// Reads every tensor of one safetensors file.
pub(crate) fn read_safetensors(path: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })?;
    let tensors = candle_core::safetensors::load_buffer(&bytes, device).map_err(|e| {
        ModelError::Safetensors {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    })?;
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    for name in names {
        if !all_finite(&tensors[name])? {
            return Err(ModelError::NonFinite {
                name: name.clone(),
                path: path.to_path_buf(),
            });
        }
    }
    Ok(tensors)
}

/// True when every value of a float tensor is finite (`0·x` is 0 for a finite value and
/// NaN for NaN or ±inf, so their sum is 0 exactly when all are finite); integer tensors are.
fn all_finite(t: &Tensor) -> Result<bool> {
    if !t.dtype().is_float() {
        return Ok(true);
    }
    let diff = (t * 0.0)?.to_dtype(candle_core::DType::F32)?;
    Ok(diff.sum_all()?.to_scalar::<f32>()? == 0.0)
}

/// Creates `dir` (and parents) if needed.
pub(crate) fn ensure_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
        action: "create folder",
        path: dir.to_path_buf(),
        source,
    })
}

/// Writes `generation_config.json` with the config's bos/eos/pad ids (HF layout).
pub(crate) fn write_generation_config(dir: &Path, config: &ModelConfig) -> Result<()> {
    let mut o = serde_json::Map::new();
    if let Some(b) = config.bos_token_id {
        o.insert("bos_token_id".into(), b.into());
    }
    match config.eos_token_id.as_slice() {
        [] => {}
        [one] => {
            o.insert("eos_token_id".into(), (*one).into());
        }
        many => {
            o.insert("eos_token_id".into(), many.to_vec().into());
        }
    }
    if let Some(p) = config.pad_token_id {
        o.insert("pad_token_id".into(), p.into());
    }
    write_json(&dir.join(GENERATION_CONFIG_FILE), &Value::Object(o))
}

/// Writes `doc` to `path` as pretty JSON with a final newline.
pub(crate) fn write_json(path: &Path, doc: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(doc).map_err(|e| ModelError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    std::fs::write(path, text + "\n").map_err(|source| ModelError::Io {
        action: "write",
        path: path.to_path_buf(),
        source,
    })
}

/// Writes an HF model folder: `config.json` (with `architecture`), `model.safetensors` and
/// `generation_config.json`. An existing sharded index in `dir` is removed so the folder is
/// unambiguous.
pub(crate) fn write_checkpoint(
    dir: &Path,
    config: &ModelConfig,
    architecture: &str,
    store: &crate::io::param_store::ParamStore,
) -> Result<()> {
    write_folder(dir, config, architecture, |path| {
        let tensors = crate::io::fused_projections::fuse(config, store.f32_tensors()?)?;
        crate::io::param_store::write_safetensors(path, &tensors)
    })
}

/// [`write_checkpoint`] of named tensors (written as f32) instead of a store.
pub(crate) fn write_checkpoint_tensors(
    dir: &Path,
    config: &ModelConfig,
    architecture: &str,
    tensors: &[(String, Tensor)],
) -> Result<()> {
    write_folder(dir, config, architecture, |path| {
        let f32s: Vec<(String, Tensor)> = tensors
            .iter()
            .map(|(n, t)| {
                Ok((
                    n.clone(),
                    t.to_dtype(candle_core::DType::F32)?.contiguous()?,
                ))
            })
            .collect::<candle_core::Result<_>>()?;
        let f32s = crate::io::fused_projections::fuse(config, f32s)?;
        crate::io::param_store::write_safetensors(path, &f32s)
    })
}

/// The folder of [`write_checkpoint`], its weights file written by `weights`.
fn write_folder(
    dir: &Path,
    config: &ModelConfig,
    architecture: &str,
    weights: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    ensure_dir(dir)?;
    config.save(&dir.join(CONFIG_FILE), architecture)?;
    weights(&dir.join(WEIGHTS_FILE))?;
    let index = dir.join(INDEX_FILE);
    if index.is_file() {
        std::fs::remove_file(&index).map_err(|source| ModelError::Io {
            action: "remove",
            path: index,
            source,
        })?;
    }
    write_generation_config(dir, config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_weights_are_refused_at_load_with_the_tensor_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(WEIGHTS_FILE);
        let good = Tensor::new(&[1.0f32, -2.0, 3.0], &Device::Cpu).unwrap();
        let nan = Tensor::new(&[1.0f32, f32::NAN, 3.0], &Device::Cpu).unwrap();
        let inf = Tensor::new(&[f32::INFINITY], &Device::Cpu).unwrap();
        let tensors = vec![
            ("model.norm.weight".to_string(), good.clone()),
            ("model.layers.0.mlp.up_proj.weight".to_string(), nan),
        ];
        crate::io::param_store::write_safetensors(&path, &tensors).unwrap();
        let e = read_safetensors(&path, &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`model.layers.0.mlp.up_proj.weight`") && e.contains("NaN"),
            "{e}"
        );
        crate::io::param_store::write_safetensors(&path, &[("lm_head.weight".into(), inf)])
            .unwrap();
        assert!(read_safetensors(&path, &Device::Cpu).is_err());
        crate::io::param_store::write_safetensors(&path, &[("w".into(), good)]).unwrap();
        assert_eq!(read_safetensors(&path, &Device::Cpu).unwrap().len(), 1);
    }
}
