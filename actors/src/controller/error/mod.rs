//! Why a run stops, as typed values: [`RunError`] (where, which role and phase, the cause)
//! over the controller's own leaf errors — an unusable checkpoint, a sequence longer than
//! the context, a diverged step, a batch too stale to train on. These files import no other
//! part of the controller.

mod checkpoint;
mod context;
mod divergence;
mod run;
mod staleness;

pub use checkpoint::CheckpointError;
pub use context::ContextError;
pub(crate) use divergence::check_rollout;
pub use divergence::DivergenceError;
pub use run::{At, RunError};
pub use staleness::StalenessError;
