//! oxalign-models: HF-compatible decoder models (dense Llama, Qwen2, Qwen3, Mistral;
//! mixture-of-experts Qwen3-MoE, Qwen2-MoE, Mixtral). The folders are the parts: `config/`
//! (`config.json`, the families that declare their parameters once, the layout), `nn/` (layers,
//! the decoder, one backbone wearing an LM, value or reward head), `moe/` (router, sparse
//! block, expert parallelism), `io/` (safetensors folders, init, the parameter store),
//! `text/` (tokenizers, chat templates) and `engine/` (the paged inference engine).
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

pub mod config;
pub mod engine;
pub mod error;
pub mod io;
pub mod lora;
pub mod moe;
pub mod nn;
pub mod text;

pub use config::model_config::{Family, ModelConfig, MoeConfig, RopeScaling, SlidingLayers};
pub use config::preset::Preset;
pub use engine::sampler::{Sampler, SamplingParams};
pub use error::ModelError;
pub use io::init_dir::{init_model_dir, InitError, InitHead, InitSpec, InitTokenizer};
pub use io::param_store::ParamStore;
pub use lora::{DropoutScope, LoraConfig, LoraError};
pub use moe::expert_parallel::{ExpertNames, ExpertParallel};
pub use nn::causal_lm::CausalLm;
pub use nn::generate::{Completion, FinishReason, GenerationRequest};
pub use nn::head::{Head, LmHead, RewardHead, ValueHead};
pub use nn::kv_cache::KvCache;
pub use nn::model::Model;
pub use nn::precision::{Precision, UnknownPrecision};
pub use nn::reward_model::RewardModel;
pub use nn::value_model::ValueModel;
pub use oxalign_kernels::ops::{TokenDistribution, Truncation};
