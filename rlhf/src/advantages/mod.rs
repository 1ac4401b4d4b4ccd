//! Advantage estimators: GAE (critic-based), group-relative (GRPO / Dr. GRPO), RLOO,
//! REINFORCE++ and masked whitening. All are targets: computed detached, never differentiated.

pub mod gae;
pub mod group;
pub mod reinforce_pp;
pub mod rloo;
pub mod whiten;

pub use gae::{gae, GaeBootstrap, GaeConfig, GaeOutput};
pub use group::{group_relative_advantages, GroupNorm};
pub use reinforce_pp::{reinforce_pp_advantages, ReinforcePpOutput};
pub use rloo::rloo_advantages;
pub use whiten::{masked_whiten, WhitenOptions};
