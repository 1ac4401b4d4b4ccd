//! The messages every actor sends the monitor (`MonitorEvent`) and the run-level records
//! (`RunInfo`, `RunFinished`). Plain serde data: what to do with an event lives in `state.rs`.

use serde::{Deserialize, Serialize};

use super::actor_info::{ActorInfo, ActorUpdate};
use super::checkpoint_info::CheckpointInfo;
use super::samples::StepSamples;
use super::span::Span;
use super::step_metrics::StepMetrics;

/// The run being trained, sent once by the controller when the run starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Run name (usually the run directory's name).
    pub name: String,
    /// The fully resolved recipe, as TOML text (every default filled in).
    pub recipe_toml: String,
    /// When the run started, ms since the Unix epoch.
    pub started_unix_ms: u64,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// All planned steps done.
    Completed,
    /// Stopped on an error it could not recover from.
    Failed,
    /// Stopped early on request (Ctrl-C, `max_steps` lowered, ...).
    Stopped,
}

/// The run ended; sent once by the controller as the last event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFinished {
    /// How it ended.
    pub outcome: RunOutcome,
    /// Number of training steps completed.
    pub steps_completed: u64,
    /// When it ended, ms since the Unix epoch.
    pub finished_unix_ms: u64,
    /// Error or reason, if any.
    #[serde(default)]
    pub message: Option<String>,
}

/// One thing that happened, reported to the monitor.
///
/// JSON form (SSE payloads, logs): `{"type":"span","data":{...}}`, with `type` one of
/// `run`, `actor`, `actor_update`, `span`, `metrics`, `samples`, `checkpoint`, `finished`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data", rename_all = "snake_case")]
pub enum MonitorEvent {
    /// The run started (or its recipe was resolved). Replaces any earlier `RunInfo`.
    Run(RunInfo),
    /// Registers an actor or replaces its whole record.
    Actor(ActorInfo),
    /// Heartbeat / status change of one actor (partial update, see [`ActorUpdate`]).
    ActorUpdate(ActorUpdate),
    /// A finished span of work on the timeline.
    Span(Span),
    /// Metrics of one step (a second report for the same step is merged into the first).
    Metrics(StepMetrics),
    /// A few rollout samples of one RL step (`rl.log_samples`), one `samples.jsonl` line each.
    Samples(StepSamples),
    /// A checkpoint was written.
    Checkpoint(CheckpointInfo),
    /// The run ended.
    Finished(RunFinished),
}

impl From<RunInfo> for MonitorEvent {
    fn from(v: RunInfo) -> Self {
        MonitorEvent::Run(v)
    }
}
impl From<ActorInfo> for MonitorEvent {
    fn from(v: ActorInfo) -> Self {
        MonitorEvent::Actor(v)
    }
}
impl From<ActorUpdate> for MonitorEvent {
    fn from(v: ActorUpdate) -> Self {
        MonitorEvent::ActorUpdate(v)
    }
}
impl From<Span> for MonitorEvent {
    fn from(v: Span) -> Self {
        MonitorEvent::Span(v)
    }
}
impl From<StepMetrics> for MonitorEvent {
    fn from(v: StepMetrics) -> Self {
        MonitorEvent::Metrics(v)
    }
}
impl From<StepSamples> for MonitorEvent {
    fn from(v: StepSamples) -> Self {
        MonitorEvent::Samples(v)
    }
}
impl From<CheckpointInfo> for MonitorEvent {
    fn from(v: CheckpointInfo) -> Self {
        MonitorEvent::Checkpoint(v)
    }
}
impl From<RunFinished> for MonitorEvent {
    fn from(v: RunFinished) -> Self {
        MonitorEvent::Finished(v)
    }
}
