//! The typed errors of the role actors: what went wrong ([`Cause`]: a tensor error, the model,
//! the engine, the trainer, the tokenizer, divergence, bad input of each kind (a placement, a
//! recipe key, a missing input, an unsupported request: [`Missing`], [`Unsupported`]), I/O, an
//! executor panic, a timeout, an unreachable actor, a poisoned replica, the reward service, a
//! collective, the cluster, a refit bucket, an injected fault, ...) and where ([`RoleError`]:
//! the role, the phase and the replica). The controller adds the step (`controller::RunError`,
//! whose `is_bad_input` picks the exit code: 2 when the user's input is at fault, 1 when the
//! run failed). Nothing here decides what to do about an error.

mod cause;
mod input;
mod role;

pub use cause::Cause;
pub use input::{Missing, Unsupported};
pub use role::{RoleError, LOAD_OPTIMIZER};
