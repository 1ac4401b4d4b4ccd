//! Advantage estimators: GAE (critic-based), group-relative (GRPO / Dr. GRPO), RLOO,
//! REINFORCE++, masked whitening, on-policy distillation's
//! reverse-KL advantages, and DAPO's choice of informative groups (dynamic sampling). All are targets: computed detached, never differentiated.

pub mod distill;
pub mod dynamic_sampling;
pub mod gae;
pub mod group;
pub mod reinforce_pp;
pub mod rloo;
pub mod whiten;

pub use distill::distill_advantages;
pub use dynamic_sampling::{informative_count, informative_groups, select_groups, GroupSelection};
pub use gae::{gae, GaeBootstrap, GaeConfig, GaeOutput};
pub use group::{group_relative_advantages, GroupNorm};
pub use reinforce_pp::{reinforce_pp_advantages, ReinforcePpOutput};
pub use rloo::rloo_advantages;
pub use whiten::{masked_whiten, WhitenOptions};
