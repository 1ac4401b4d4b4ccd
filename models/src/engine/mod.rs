//! The rollout engine: a paged KV cache (block pool with reference counts, prefix sharing,
//! copy-on-write and a prefix cache across calls), a continuous-batching scheduler (chunked prefill, batched decode, preemption
//! by recompute), seeded sampling with stop tokens/strings, verified versioned refits, and
//! optional int8/4-bit weights. CPU first; it does not train.
//!
//! The parts:
//! * `block_pool.rs`: the paged KV cache: host f32 blocks per layer, reference counts,
//!   copy-on-write. Keys are channel-major within a block, values position-major.
//! * `prefix_cache.rs`: full blocks of finished sequences kept (a trie over blocks of tokens,
//!   LRU eviction, cleared by every refit), so the next turn of an episode or a recomputed
//!   sequence prefills only what is new.
//! * `scheduler.rs`: continuous batching, chunked prefill under a token budget, prefix sharing
//!   between the samples of one prompt, preemption by recompute.
//! * `forward.rs`: one step over a ragged batch, on host buffers: per layer RMSNorm, fused
//!   q/k/v, optional q/k norms, RoPE, the KV write, attention, output projection, SwiGLU MLP or
//!   the sparse block. The LM head returns either full logits (for sampling) or only the target
//!   tokens' log-probs, 64 rows at a time (for scoring).
//! * `paged_attention.rs`: attention of every new token over its block table, parallel over
//!   tokens (AVX-512 / AVX2 builds).
//! * `weights.rs`, `linear.rs`, `expert.rs`: the engine's own copy of the weights (packed f32
//!   or bf16, int8, ggml Q8_0 / Q4_0, or candle tensors off the CPU), built from the model's
//!   parameter declaration; a layer's feed-forward block is dense (`gate_up`, `down`) or sparse
//!   (`MoeWeights`).
//! * `moe_forward.rs`, `moe_dispatch.rs`: the sparse block on host buffers (router, top-k or
//!   replayed choices, experts over their rows, shared expert) and its expert-parallel token
//!   dispatch.
//! * `route_log.rs`: the per-sequence record of routed experts for `generate_with_routing`.
//! * `score.rs`: batched scoring: sequences packed into prefill steps.
//! * `refit.rs`: verified, versioned weight updates.
//! * `sampler.rs`: one logits row in O(V): a vectorised pass of tempered weights, then an
//!   inverse-CDF walk; top-k uses selection and top-p a lazy partial sort
//!   (`kernels/src/ops/truncation.rs`).
//! * `engine.rs`: `Engine`: `generate` (sampling parallel over rows) and `score`.
//!
//! Every log-prob of an RL step (the engine's sampling log-probs, π_old, π_θ in the update, the
//! reference, the entropy) is taken under the distribution the rollout sampled from:
//! `softmax(logits / T)` restricted to a top-k / top-p kept set and renormalised
//! (`oxalign_kernels::ops::TokenDistribution`; the definition is in
//! `kernels/src/ops/truncation.rs`). The engine's sampler and scorer and the trainer's fused LM
//! head call the same threshold function.
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
mod checksum;
mod config;
mod embed_table;
#[allow(clippy::module_inception)]
mod engine;
mod error;
mod expert;
mod forward;
mod linear;
mod moe_dispatch;
mod moe_forward;
mod paged_attention;
mod prefix_cache;
mod refit;
mod request;
mod route_log;
pub mod sampler;
mod scheduler;
mod score;
mod simd;
mod stats;
mod step_item;
mod weight_source;
mod weights;

pub use checksum::{checksum_f32, tensor_checksum};
pub use config::{EngineConfig, QuantMode};
pub use engine::Engine;
pub use error::{EngineError, EngineResult};
pub use refit::{Probe, RefitReport, WeightUpdate};
pub use request::{Detokenize, EngineRequest};
