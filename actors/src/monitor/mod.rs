//! The run monitor: the event types every actor reports (health, spans, step metrics,
//! rollout samples, checkpoints), the `Monitor` actor that keeps the live state, writes the run's logs and
//! broadcasts events to the dashboard, and a loader that rebuilds the state from a run
//! directory for replay. It serves no HTTP itself (the root crate's `dashboard` does).
//!
//! ```no_run
//! # async fn demo() -> Result<(), oxalign_actors::monitor::MonitorError> {
//! use oxalign_actors::monitor::*;
//! let (monitor, _join) = Monitor::spawn(MonitorConfig::with_run_dir("runs/demo")).await?;
//! monitor.report(ActorInfo::new("policy", "policy", vec!["cpu".into()]));
//! monitor.report(ActorUpdate::working("policy", "generate step 0"));
//! {
//!     let _t = monitor.time("policy", phase::GENERATE, 0); // span reported on drop
//! }
//! monitor.report(StepMetrics::new(0).with(metric::REWARD_MEAN, 0.4));
//! monitor.shutdown().await?;
//! # Ok(()) }
//! ```

mod actor;
mod actor_info;
mod checkpoint_info;
mod clock;
mod error;
mod event;
mod handle;
mod msg;
mod replay;
mod run_log;
mod samples;
mod span;
mod state;
mod step_metrics;
pub mod tensorboard;

pub use actor::{Monitor, MonitorActorState, MonitorConfig};
pub use actor_info::{ActorInfo, ActorStatus, ActorUpdate};
pub use checkpoint_info::CheckpointInfo;
pub use clock::unix_ms_now;
pub use error::MonitorError;
pub use event::{MonitorEvent, RunFinished, RunInfo, RunOutcome};
pub use handle::{MonitorHandle, SpanTimer};
pub use msg::MonitorMsg;
pub use replay::load_run_dir;
pub use run_log::{files, RunLog, RunRecord};
pub use samples::{EpisodeLog, SampleRecord, StepSamples};
pub use span::{phase, Span};
pub use state::{ActorChange, MonitorLimits, MonitorSnapshot, MonitorState};
pub use step_metrics::{metric, StepMetrics};

#[cfg(test)]
mod tests;
