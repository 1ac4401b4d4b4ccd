//! LoRA adapters (Hu et al. 2021, as HF PEFT implements them): the settings
//! ([`LoraConfig`], PEFT's `LoraConfig` keys), which linear layers of a model carry an adapter
//! (`targets.rs`), their seeded initialisation (`init.rs`), the merged weights the engine
//! and HF folders take (`merge.rs`) and PEFT's files, `adapter_config.json` and
//! `adapter_model.safetensors` (`peft_files.rs`). A model wears adapters through
//! `Model::with_lora` (`nn/lora_model.rs`); the layer math is `nn/proj.rs`.
//!
//! Inside a model the adapter of the layer whose weight is `{prefix}.weight` is
//! `{prefix}.lora_A.weight` `[r, in]` and `{prefix}.lora_B.weight` `[out, r]`; PEFT's
//! files prefix these names with `base_model.model.`.

pub(crate) mod config;
pub(crate) mod dropout;
pub(crate) mod init;
pub(crate) mod merge;
pub(crate) mod parts;
pub(crate) mod peft_files;
pub(crate) mod targets;

pub use config::{LoraConfig, LoraError};
pub use dropout::DropoutScope;
pub use merge::AdapterMerge;
pub use peft_files::{recorded_origin, ADAPTER_CONFIG_FILE, ADAPTER_SUBDIR, ADAPTER_WEIGHTS_FILE};
