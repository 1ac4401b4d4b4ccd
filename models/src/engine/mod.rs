//! The rollout engine: a paged KV cache (block pool with reference counts, prefix sharing and
//! copy-on-write), a continuous-batching scheduler (chunked prefill, batched decode,
//! preemption by recompute), seeded sampling with stop tokens/strings, verified versioned
//! refits, and optional int8/4-bit weights. CPU first; it does not train.
//!
//! ```
//! use candle_core::Device;
//! use oxalign_models::engine::{Engine, EngineConfig, Probe, WeightUpdate};
//! use oxalign_models::{CausalLm, Family, GenerationRequest, ModelConfig, Preset, SamplingParams};
//!
//! let mut cfg = ModelConfig::preset(Family::Llama, Preset::Tiny, 64);
//! cfg.num_hidden_layers = 1;
//! let trainer = CausalLm::init_random(&cfg, 0, &Device::Cpu)?;
//! let mut engine = Engine::from_model(&trainer, EngineConfig { num_blocks: Some(64), ..Default::default() })?;
//! let mut req = GenerationRequest::new(vec![5, 6, 7], 4);
//! req.sampling = SamplingParams::greedy();
//! let out = engine.generate(&[req.clone(), req])?;
//! assert_eq!(out[0].tokens, out[1].tokens);
//!
//! // After a training step: a verified refit to version 1.
//! let probe = Probe::from_model(&trainer, vec![3, 4, 5, 6], 1e-4)?;
//! let report = engine.refit(&WeightUpdate::from_model(1, &trainer)?, Some(&probe))?;
//! assert_eq!(report.version, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod block_pool;
mod config;
#[allow(clippy::module_inception)]
mod engine;
mod error;
mod expert;
mod forward;
mod linear;
mod moe_dispatch;
mod moe_forward;
mod paged_attention;
mod refit;
mod request;
mod route_log;
pub mod sampler;
mod scheduler;
mod score;
mod simd;
mod stats;
mod step_item;
mod weights;

pub use block_pool::BlockPool;
pub use config::{EngineConfig, QuantMode};
pub use engine::Engine;
pub use error::{EngineError, EngineResult};
pub use refit::{Probe, RefitReport, WeightUpdate};
pub use request::{Detokenize, EngineRequest};
pub use stats::EngineStats;
pub use weights::{checksum_f32, tensor_checksum};
