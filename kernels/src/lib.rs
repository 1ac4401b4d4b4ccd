//! oxalign-kernels: device handles, fused differentiable ops and collectives for oxalign.
//! It knows nothing about models or RL: shapes and dtypes in, tensors out. The parts:
//! `device.rs` (device specs), `cpu_threads.rs` (one rayon pool, its workers kept awake
//! through a step; candle's element-wise ops inline), `host_memory.rs` (glibc's allocator
//! thresholds, so freed buffers are reused), `ops/` (the fused ops), `matmul/` (the training
//! GEMMs, f32 and bf16), `linear/` (the engine's inference linear layers) and `collective/`
//! (the [`Collective`] trait, in-process and NCCL). See docs/ARCHITECTURE.md.

pub mod collective;
pub mod cpu_threads;
pub mod device;
pub mod host_memory;
pub mod linear;
mod matmul;
pub mod ops;

pub use collective::{Collective, CollectiveError, ThreadCollective};
pub use device::{parse_device, DeviceError, DeviceKind, DeviceSpec};
pub use ops::{
    causal_attention, causal_attention_segmented, entropy, rms_norm, rope, token_logprobs,
};
