//! `oxalign merge-lora`: a LoRA adapter (a PEFT folder, from oxalign or from peft) merged
//! into its base as one plain HF folder (`W + (α/r)·B·A`; PEFT's `merge_and_unload`), with
//! the base's tokenizer files. The head follows the adapter's `task_type` (`CAUSAL_LM`,
//! `SEQ_CLS`, `TOKEN_CLS`). This file parses flags and words errors; the merge is
//! `oxalign_models`'.

use std::path::{Path, PathBuf};

use clap::Parser;
use oxalign_models::io::tokenizer_files::copy_tokenizer_files;
use oxalign_models::lora::{recorded_origin, ADAPTER_CONFIG_FILE};
use oxalign_models::nn::head::{Head, LmHead, RewardHead, ValueHead};
use oxalign_models::nn::model::Model;

use crate::model_dir::model_error;
use crate::user_error::{user_error, UserError};

/// Arguments of `oxalign merge-lora`.
#[derive(Debug, Parser)]
#[command(
    about = "Merge a LoRA adapter (PEFT folder) into its base: one plain HF model folder",
    long_about = "Merge a LoRA adapter into its base model and write one plain HF folder \
(config.json, model.safetensors, tokenizer files) that transformers and `oxalign generate` \
load without peft. The adapter is a PEFT folder (adapter_config.json + \
adapter_model.safetensors), e.g. the `adapter/` of a LoRA run's final/ or one peft saved. \
Without --base, the base is the folder the adapter records as base_model_name_or_path."
)]
pub struct Args {
    /// The adapter folder.
    #[arg(long)]
    pub adapter: PathBuf,
    /// The base model folder (default: the adapter's base_model_name_or_path).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Output folder (created if needed).
    #[arg(long)]
    pub out: PathBuf,
    /// Overwrite a folder that already holds a config.json.
    #[arg(long)]
    pub force: bool,
}

/// Runs `oxalign merge-lora`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if !args.adapter.join(ADAPTER_CONFIG_FILE).is_file() {
        return user_error(format!(
            "{}: no {ADAPTER_CONFIG_FILE} (expected a PEFT LoRA adapter folder)",
            args.adapter.display()
        ));
    }
    if args.out.join("config.json").exists() && !args.force {
        return user_error(format!(
            "{} already holds a model (config.json); pass --force to overwrite it",
            args.out.display()
        ));
    }
    let (recorded, task) =
        recorded_origin(&args.adapter).map_err(|e| model_error(e, &args.adapter))?;
    let base = match (&args.base, recorded) {
        (Some(b), _) => b.clone(),
        (None, Some(b)) => PathBuf::from(b),
        (None, None) => {
            return user_error(format!(
                "{} records no base_model_name_or_path; pass --base DIR",
                args.adapter.display()
            ))
        }
    };
    let n = match task.as_deref() {
        Some("SEQ_CLS") => merge::<RewardHead>(&base, &args)?,
        Some("TOKEN_CLS") => merge::<ValueHead>(&base, &args)?,
        _ => merge::<LmHead>(&base, &args)?,
    };
    copy_tokenizer_files(&base, &args.out)
        .map_err(|(path, e)| UserError::new(format!("cannot copy {}: {e}", path.display())))?;
    println!(
        "merged {} adapters of {} into {} ({})",
        n,
        args.adapter.display(),
        base.display(),
        args.out.display()
    );
    Ok(())
}

/// Loads `base` with head `H`, puts the adapter on, and saves the merged weights as a plain
/// folder. Returns how many tensors the adapter held.
fn merge<H: Head>(base: &Path, args: &Args) -> anyhow::Result<usize> {
    let dev = candle_core::Device::Cpu;
    let model = Model::<H>::load(base, &dev).map_err(|e| model_error(e, base))?;
    let adapted = model
        .load_adapter(&args.adapter)
        .map_err(|e| model_error(e, &args.adapter))?;
    let merged = Model::<H>::from_weights(
        model.config().clone(),
        &adapted.weights()?,
        model.dtype(),
        &dev,
    )
    .map_err(|e| model_error(e, base))?;
    merged
        .save(&args.out)
        .map_err(|e| model_error(e, &args.out))?;
    Ok(adapted.vars().len())
}
