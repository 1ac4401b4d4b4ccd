//! Optimisation: AdamW with parameter groups, global-norm clipping, gradient accumulation,
//! learning-rate schedules and optimizer-state save/load. Single-process; no collectives.

pub mod accumulate;
pub mod adamw;
pub mod clip;
mod fused_adamw;
pub(crate) mod param_groups;
pub mod schedule;
pub(crate) mod state_io;

pub use accumulate::GradAccumulator;
pub use adamw::{AdamW, AdamWConfig};
pub use clip::{clip_coefficient, clip_grad_norm, global_grad_norm};
pub use param_groups::{default_group_of, default_groups, is_no_decay, ParamGroup};
pub use schedule::LrSchedule;
