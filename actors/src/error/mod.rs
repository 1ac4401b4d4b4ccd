//! The typed errors of the role actors: what went wrong ([`Cause`]) and where
//! ([`RoleError`]: the role, the phase and the replica). The controller adds the step
//! (`controller::RunError`). Nothing here decides what to do about an error.

mod cause;
mod role;

pub use cause::Cause;
pub use role::{RoleError, LOAD_OPTIMIZER};
