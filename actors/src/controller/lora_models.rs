//! The models of a run with `[lora]`: each trainer's model wears adapters. A folder a LoRA
//! run saved for the same kind of model (a merged HF folder with PEFT's files in
//! `adapter/` of the same `task_type`, e.g. a checkpoint being resumed, or the previous
//! stage's policy) is rebuilt exactly as the base its `adapter_config.json` names plus that
//! adapter, so training continues the same adapter; any other folder (a critic started
//! from a LoRA policy's folder included) gets fresh adapters (or, for the policy,
//! `lora.adapter`). The reference folder of an RL run holds no adapter (`start.rs`), so RL
//! after a LoRA warm-up starts fresh adapters on the warm-up's merged result: the
//! adapters' frozen base is exactly the reference.

use crate::error::Cause;
use crate::recipe::{BaseDtype, Recipe};
use candle_core::Device;
use oxalign_models::lora::{recorded_origin, ADAPTER_CONFIG_FILE, ADAPTER_SUBDIR};
use oxalign_models::nn::head::Head;
use oxalign_models::nn::model::Model;
use oxalign_models::CausalLm;
use oxalign_models::ModelError;
use std::path::{Path, PathBuf};

/// The model at `weights` as this run trains it: as `load` reads it without `[lora]`;
/// with it, the saved adapter continued, `start_adapter` (a PEFT folder) put on, or fresh
/// adapters seeded by `seed` (which seeds the adapters' dropout masks too). The adapters record their base folder (absolute), so a
/// checkpoint resumes from any working directory.
pub(crate) fn load_trained<H: Head>(
    recipe: &Recipe,
    weights: &Path,
    start_adapter: Option<&Path>,
    seed: u64,
    load: impl Fn(&Path) -> Result<Model<H>, Cause>,
) -> Result<Model<H>, Cause> {
    let Some(lora) = &recipe.lora else {
        return load(weights);
    };
    let saved = weights.join(ADAPTER_SUBDIR);
    let (base_dir, adapter) = match saved_adapter::<H>(&saved)? {
        Some(base) => (PathBuf::from(base), Some(saved)),
        None => (weights.to_path_buf(), start_adapter.map(Path::to_path_buf)),
    };
    let base = load(&base_dir)?;
    let mut model = match adapter {
        Some(dir) => base.load_adapter(&dir)?,
        None => base.with_lora(&lora.config(), seed)?,
    };
    let absolute = std::fs::canonicalize(&base_dir).unwrap_or(base_dir);
    model.set_adapter_base(&absolute.to_string_lossy());
    model.set_dropout_seed(seed);
    match lora.base_dtype {
        BaseDtype::F32 => Ok(model),
        kept => Ok(model.with_base_in(kept.dtype())?),
    }
}

/// The policy's model at `weights` on `device` as its trainer builds it: with `[lora]`,
/// the adapters of `load_trained` (`lora.adapter` to start from, seeded by the run's seed).
/// An engine role of a LoRA run builds the same model, so that it can take adapters alone.
pub(crate) fn policy_model(
    recipe: &Recipe,
    weights: &Path,
    device: &Device,
) -> Result<CausalLm, Cause> {
    let start = recipe.lora.as_ref().and_then(|l| l.adapter.as_deref());
    let seed = recipe.run.seed ^ 0x10AA;
    load_trained(recipe, weights, start.map(Path::new), seed, |d| {
        Ok(CausalLm::load(d, device)?)
    })
}

/// The base folder of the adapter in `saved`, when it holds one for this kind of model.
fn saved_adapter<H: Head>(saved: &Path) -> Result<Option<String>, ModelError> {
    let file = saved.join(ADAPTER_CONFIG_FILE);
    if !file.is_file() {
        return Ok(None);
    }
    let (base, task) = recorded_origin(saved)?;
    if task.as_deref() != Some(Model::<H>::peft_task_type()) {
        return Ok(None);
    }
    base.map(Some).ok_or_else(|| ModelError::InvalidConfig {
        path: file,
        key: "base_model_name_or_path".into(),
        message: "names no base folder; expected the folder the adapter was trained on".into(),
    })
}
