//! oxalign-models: HF-compatible decoder models (dense Llama, Qwen2, Mistral; mixture-of-experts
//! Qwen3-MoE, Qwen2-MoE, Mixtral), each family declaring
//! its parameters once (`family/`, `layout.rs`); one backbone with LM, value and reward heads
//! (`model.rs`, `head.rs`); safetensors + `config.json` load/save; model-folder init;
//! tokenizers and chat templates.
//! It knows nothing about PPO or other training algorithms (see docs/ARCHITECTURE.md).
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use oxalign_models::{CausalLm, Family, GenerationRequest, ModelConfig, Preset};
//!
//! let mut cfg = ModelConfig::preset(Family::Llama, Preset::Tiny, 64);
//! cfg.num_hidden_layers = 1;
//! let model = CausalLm::init_random(&cfg, 0, &Device::Cpu)?;
//! let ids = Tensor::new(&[[5u32, 6, 7]], &Device::Cpu)?;
//! let logits = model.forward(&ids, None)?; // [1, 3, 64], differentiable
//! assert_eq!(logits.dims(), &[1, 3, 64]);
//! let out = model.generate(&[GenerationRequest::new(vec![5, 6, 7], 4)])?;
//! assert_eq!(out[0].tokens.len(), out[0].logprobs.len());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod byte_tokenizer;
pub mod chat_template;
mod engine_f32_linear;
pub mod tokenizer;

pub mod attention;
pub mod aux_loss;
pub mod causal_lm;
pub mod checkpoint;
pub mod config;
pub mod config_bounds;
mod config_json;
pub mod decoder;
pub mod decoder_layer;
pub mod engine;
pub mod error;
pub mod expert_exchange;
pub mod expert_layout;
pub mod expert_parallel;
pub mod fake_quant;
pub mod family;
pub mod generate;
pub mod head;
pub mod init_dir;
pub mod kv_cache;
pub mod layer_residency;
pub mod layers;
pub mod layout;
pub mod layout_moe;
pub mod machine_memory;
pub mod mask;
pub mod mlp;
pub mod model;
pub mod moe;
pub mod moe_config;
mod moe_parallel;
pub mod param_spec;
pub mod param_store;
pub mod preset;
pub mod reward_model;
pub mod rope;
pub mod router;
pub mod routing;
pub mod sampler;
mod streamed_layer;
pub mod value_model;

pub use causal_lm::CausalLm;
pub use config::{Family, ModelConfig, MoeConfig, RopeScaling};
pub use error::ModelError;
pub use expert_parallel::{ExpertNames, ExpertParallel};
pub use fake_quant::Precision;
pub use generate::{Completion, FinishReason, GenerationRequest};
pub use head::{Head, LmHead, RewardHead, ValueHead};
pub use init_dir::{init_model_dir, InitError, InitHead, InitSpec, InitTokenizer};
pub use kv_cache::KvCache;
pub use model::Model;
pub use oxalign_kernels::ops::{TokenDistribution, Truncation};
pub use param_store::ParamStore;
pub use preset::Preset;
pub use reward_model::RewardModel;
pub use sampler::{Sampler, SamplingParams};
pub use value_model::ValueModel;
