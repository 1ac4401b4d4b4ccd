//! The network: the differentiable building blocks (layers, attention, MLP, RoPE, masks),
//! the decoder and its layers (dense or streamed layer by layer), the heads a backbone wears
//! (LM, value, reward), the precision the linear layers compute in (`precision`), the int8
//! engine's numbers in the trainer (`fake_quant`, `f32_linear`)
//! and the simple KV-cached generator the tests hold the engine against.

pub mod attention;
pub(crate) mod causal_lm;
pub mod checkpointing;
pub mod decoder;
pub(crate) mod decoder_layer;
pub(crate) mod f32_linear;
pub(crate) mod fake_quant;
pub mod generate;
pub mod head;
pub(crate) mod kv_cache;
pub mod layer_residency;
pub mod layers;
pub mod lora_model;
pub mod mask;
pub mod mlp;
pub mod model;
pub(crate) mod norm;
pub(crate) mod precision;
pub(crate) mod proj;
pub mod reward_model;
pub mod rope;
pub(crate) mod streamed_layer;
pub(crate) mod value_model;
