//! Mixture of experts: the config, the parameter layout and the two checkpoint layouts of
//! experts, the router and what it chose, the sparse block, its auxiliary loss, and expert
//! parallelism (ownership, row exchange, the parallel forward).

pub mod aux_loss;
pub mod block;
pub mod config;
pub mod expert_exchange;
pub mod expert_layout;
pub mod expert_parallel;
pub mod layout;
pub(crate) mod parallel;
pub mod router;
pub mod routing;
