//! oxalign-kernels: device handles, fused differentiable ops and collectives for oxalign.
//! It knows nothing about models or RL: shapes and dtypes in, tensors out (see DESIGN.md).

pub mod collective;
pub mod cpu_threads;
pub mod device;
pub mod host_memory;
pub mod linear;
pub mod ops;

pub use collective::{Collective, CollectiveError, ThreadCollective};
pub use device::{parse_device, DeviceError, DeviceKind, DeviceSpec};
pub use ops::{
    causal_attention, causal_attention_segmented, entropy, rms_norm, rope, token_logprobs,
};
