//! oxalign-rlhf: the RLHF math of oxalign — advantage estimators, losses, KL control, the
//! optimizer, trainer steps, FSDP sharding and rule-based reward verifiers. It reads no
//! dataset and calls no service: datasets are `oxalign-data`'s, the HTTP reward client lives
//! with the reward actor in `oxalign-actors`. All tensor functions take candle tensors in
//! `[batch, seq]` layout with a response mask (non-zero = response token); see
//! docs/ARCHITECTURE.md for what the crate owns.

pub mod advantages;
pub mod error;
pub mod fsdp;
pub mod kl_controller;
pub mod losses;
pub mod mask;
pub mod optim;
pub mod reward;
pub mod trainer;

pub use error::{Result, RlhfError};
pub use kl_controller::{AdaptiveKl, FixedKl, KlController};
pub use mask::{broadcast_to_tokens, masked_abs_diff, masked_mean, masked_sum};
