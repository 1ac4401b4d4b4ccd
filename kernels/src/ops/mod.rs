//! Fused, differentiable ops as candle custom ops: a CPU kernel (rayon over rows), a backward
//! pass so gradients flow through `Tensor::backward()`, and behind the `cuda` feature a CUDA
//! kernel compiled at run time with NVRTC. Model code calls the wrapper functions only.
//!
//! With a CUDA kernel too (sources in `src/cuda/`, launched by `cuda_launch.rs`): token
//! log-probs, entropy, RMSNorm, RoPE. CPU-only, with the composed candle ops (`reference.rs`)
//! on other devices: the LM head (`lm_head*.rs`: log-probs and entropy straight from hidden
//! states, chunked over rows and vocabulary, recomputing in backward, so no `[B, T, V]`
//! logits), causal attention (`attention*.rs`: flash-style tiles with an online softmax,
//! forward and backward; padding, GQA, sliding windows and packed segments are per-query key
//! ranges in `attention_visibility.rs`; `attention_engine_order.rs` is a second f32 forward in
//! the decoding engine's per-query arithmetic, for a trainer in the engine's numbers), the
//! SwiGLU gate (`swiglu.rs`), the linear layer (`linear.rs`: f32 or bf16 mixed precision
//! over `matmul/`'s GEMMs, both gradients written straight into their layouts; with the
//! residual stream's add inside the op, `linear_residual.rs`; with RoPE on its output heads,
//! `linear_rope.rs`) and the two
//! fused as a feed-forward block's gate and down projection (`swiglu_linear.rs`: the gate's
//! output recomputed in the backward, not held); under bf16 mixed precision the gate and up
//! projections as one op with bf16 outputs (`gate_up_bf16.rs`) and the SwiGLU and down
//! projection over them (`swiglu_pairs.rs`), so the block keeps its widest activations in
//! bf16. The LM head may hand its weight's gradient
//! to a [`GradientSink`] instead of candle's accumulation (`gradient_sink.rs`), and so may
//! the token embedding (`embedding.rs`). Beside them:
//! the token distribution every log-prob is taken under (`truncation.rs`) and the host row
//! math the trainer and the engine share (`rows.rs`).

mod attention;
mod attention_bwd;
mod attention_engine_order;
#[cfg(test)]
mod attention_engine_order_tests;
mod attention_fwd;
#[cfg(test)]
mod attention_segment_tests;
#[cfg(test)]
mod attention_tests;
mod attention_tile;
mod attention_visibility;
mod cpu_math;
#[cfg(feature = "cuda")]
mod cuda_launch;
mod embedding;
mod entropy;
mod exp_avx2;
mod gate_up_bf16;
mod gradient_sink;
mod linear;
mod linear_residual;
mod linear_rope;
mod lm_head;
mod lm_head_bf16;
mod lm_head_cpu;
mod lm_head_kept;
pub mod reference;
mod rms_norm;
mod rope;
pub mod rows;
mod swiglu;
mod swiglu_linear;
mod swiglu_pairs;
#[cfg(test)]
mod testing;
mod token_logprobs;
mod truncation;
mod validate;

pub use crate::matmul::Bf16Path;
pub use attention::{
    causal_attention, causal_attention_engine_order, causal_attention_merged,
    causal_attention_segmented,
};
#[cfg(feature = "cuda")]
pub use cuda_launch::compile_cuda_kernels;
pub use embedding::{embedding, scatter_rows};
pub use entropy::entropy;
pub use gate_up_bf16::gate_up_bf16;
pub use gradient_sink::GradientSink;
pub use linear::{linear_bf16, linear_bf16_on, linear_f32};
pub use linear_residual::{linear_residual_bf16, linear_residual_f32};
pub use linear_rope::{linear_rope_bf16, linear_rope_f32};
pub use lm_head::{
    lm_head_logprobs, lm_head_logprobs_softcapped, lm_head_logprobs_with, softcap, HeadOutputs,
    HeadProducts,
};
pub use rms_norm::rms_norm;
pub use rope::rope;
pub use swiglu::{swiglu, swiglu_engine_order};
pub use swiglu_linear::{swiglu_linear_bf16, swiglu_linear_f32};
pub use swiglu_pairs::swiglu_pairs_linear_bf16;
pub use token_logprobs::token_logprobs;
pub use truncation::{TokenDistribution, Truncation};
