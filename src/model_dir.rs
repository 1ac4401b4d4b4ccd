//! Opening a model folder for the inference subcommands: the compute device, the tokenizer
//! (optional when inputs are token ids) and the classification of model-loading errors into
//! user errors. It does not run models.

use std::path::Path;

use candle_core::Device;
use oxalign_models::text::tokenizer::{Tokenizer, TOKENIZER_FILE};
use oxalign_models::ModelError;

use crate::user_error::{user_error, IntoUserError, UserError};

/// Opens the device named by `--device` (`cpu`, `cuda:N`).
pub fn open_device(spec: &str) -> anyhow::Result<Device> {
    oxalign_kernels::device::parse_device(spec).user_err(format!("--device {spec}"))
}

/// Fails with a user error unless `dir` is an existing folder.
pub fn check_model_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.exists() {
        return user_error(format!("model folder {} does not exist", dir.display()));
    }
    if !dir.is_dir() {
        return user_error(format!(
            "model path {} is not a folder (expected a folder with config.json and model.safetensors)",
            dir.display()
        ));
    }
    Ok(())
}

/// Loads `dir/tokenizer.json` (+ config) if present; `None` when the folder has no tokenizer.
/// A tokenizer that is present but broken is a user error.
pub fn load_tokenizer(dir: &Path) -> anyhow::Result<Option<Tokenizer>> {
    if !dir.join(TOKENIZER_FILE).exists() {
        return Ok(None);
    }
    Tokenizer::from_dir(dir)
        .map(Some)
        .user_err(format!("cannot load the tokenizer of {}", dir.display()))
}

/// Maps a model-loading error to `anyhow`: problems with the folder's files (missing files,
/// bad config keys, unknown `model_type`, missing tensors, shape mismatches) are user errors;
/// tensor-math failures are not.
pub fn model_error(err: ModelError, dir: &Path) -> anyhow::Error {
    match err {
        ModelError::Candle(e) => {
            anyhow::Error::new(e).context(format!("while loading the model in {}", dir.display()))
        }
        other => UserError::new(format!(
            "cannot load the model in {}: {other}",
            dir.display()
        ))
        .into(),
    }
}
