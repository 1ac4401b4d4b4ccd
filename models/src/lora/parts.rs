//! [`LoraParts`]: what a model wearing adapters keeps beside its trainable store (the
//! methods are `nn/lora_model.rs`'s).

use crate::io::param_store::ParamStore;
use crate::lora::config::LoraConfig;
use crate::lora::dropout::LoraDropout;
use candle_core::DType;
use std::sync::Arc;

/// What a LoRA model keeps beside its trainable store.
#[derive(Clone)]
pub(crate) struct LoraParts {
    pub(crate) config: LoraConfig,
    /// The frozen base weights (every parameter of the plain model).
    pub(crate) base: ParamStore,
    /// The PEFT module names that carry an adapter (`q_proj`, ...), for `adapter_config.json`.
    pub(crate) modules: Vec<String>,
    /// What `adapter_config.json` records as `base_model_name_or_path`.
    pub(crate) base_name: String,
    /// The dtype the base's projection weights are kept in: f32, or bf16
    /// ([`crate::nn::model::Model::with_base_in`]).
    pub(crate) base_dtype: DType,
    /// The dropout every adapter of the model shares.
    pub(crate) dropout: Arc<LoraDropout>,
}
