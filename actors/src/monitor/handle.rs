//! `MonitorHandle`: the cheap, cloneable way for actors, the controller and the dashboard
//! to reach the monitor, plus `SpanTimer` for timing a phase. Reporting never waits or fails.

use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};
use tokio::sync::broadcast;

use super::clock::unix_ms_now;
use super::error::MonitorError;
use super::event::MonitorEvent;
use super::msg::MonitorMsg;
use super::span::Span;
use super::state::MonitorSnapshot;

/// A reference to a running monitor, or a disabled one that drops every event.
/// Cloning is cheap (one reference count).
#[derive(Clone, Debug, Default)]
pub struct MonitorHandle {
    actor: Option<ActorRef<MonitorMsg>>,
}

impl MonitorHandle {
    /// Wraps a monitor actor spawned by hand.
    pub fn new(actor: ActorRef<MonitorMsg>) -> Self {
        MonitorHandle { actor: Some(actor) }
    }

    /// A handle that drops every event (for runs without monitoring, and tests).
    pub fn disabled() -> Self {
        MonitorHandle { actor: None }
    }

    /// `true` when events go to a monitor actor.
    pub fn is_enabled(&self) -> bool {
        self.actor.is_some()
    }

    /// The underlying actor, if any (e.g. to link it into a supervision tree).
    pub fn actor_ref(&self) -> Option<&ActorRef<MonitorMsg>> {
        self.actor.as_ref()
    }

    /// Fire-and-forget: queues `event` for the monitor. Never blocks and never fails; an
    /// event sent after the monitor stopped is dropped. Callable from any thread,
    /// including the per-device executor threads (no async runtime needed).
    pub fn report(&self, event: impl Into<MonitorEvent>) {
        if let Some(actor) = &self.actor {
            if actor.cast(MonitorMsg::Event(event.into())).is_err() {
                tracing::debug!("monitor stopped; event dropped");
            }
        }
    }

    /// Starts timing `phase` of `step` for `actor`; the span is reported when the timer is
    /// finished or dropped.
    pub fn time(&self, actor: impl Into<String>, phase: impl Into<String>, step: u64) -> SpanTimer {
        SpanTimer {
            handle: self.clone(),
            actor: actor.into(),
            phase: phase.into(),
            step,
            start_unix_ms: unix_ms_now(),
            done: false,
        }
    }

    /// A copy of the monitor's current state, after every event sent before this call
    /// through this same handle's actor has been applied.
    pub async fn snapshot(&self) -> Result<MonitorSnapshot, MonitorError> {
        let actor = self.actor.as_ref().ok_or(MonitorError::NotRunning)?;
        match actor.call(MonitorMsg::Snapshot, None).await {
            Ok(CallResult::Success(snapshot)) => Ok(snapshot),
            _ => Err(MonitorError::NotRunning),
        }
    }

    /// A barrier for checkpoints: returns once every event sent before this call has been
    /// written to the run's logs and the logs are fsynced. Fails when a line could not be
    /// written since the previous sync, or the fsync fails. A disabled handle, or a monitor
    /// without a run directory, has nothing to sync.
    pub async fn sync(&self) -> Result<(), MonitorError> {
        let Some(actor) = self.actor.as_ref() else {
            return Ok(());
        };
        match actor.call(MonitorMsg::Sync, None).await {
            Ok(CallResult::Success(result)) => result,
            _ => Err(MonitorError::NotRunning),
        }
    }

    /// The current state and a receiver of every event after it (taken atomically).
    pub async fn subscribe(
        &self,
    ) -> Result<(MonitorSnapshot, broadcast::Receiver<MonitorEvent>), MonitorError> {
        let actor = self.actor.as_ref().ok_or(MonitorError::NotRunning)?;
        let build = |port: RpcReplyPort<_>| MonitorMsg::Subscribe(port);
        match actor.call(build, None).await {
            Ok(CallResult::Success(pair)) => Ok(pair),
            _ => Err(MonitorError::NotRunning),
        }
    }

    /// Processes every event already queued, writes the final `actors.json`, then stops
    /// the monitor and waits for it. Live subscribers see their streams end.
    pub async fn shutdown(&self) -> Result<(), MonitorError> {
        match &self.actor {
            None => Ok(()),
            Some(actor) => actor
                .drain_and_wait(None)
                .await
                .map_err(|_| MonitorError::NotRunning),
        }
    }
}

/// Times one phase; reports a [`Span`] when finished or dropped (so an early `?` return
/// still shows on the timeline).
#[derive(Debug)]
#[must_use = "a SpanTimer reports when dropped; bind it to a variable"]
pub struct SpanTimer {
    handle: MonitorHandle,
    actor: String,
    phase: String,
    step: u64,
    start_unix_ms: u64,
    done: bool,
}

impl SpanTimer {
    /// Reports the span now and returns its duration in seconds.
    pub fn finish(mut self) -> f64 {
        self.report()
    }

    fn report(&mut self) -> f64 {
        self.done = true;
        let span = Span::new(
            std::mem::take(&mut self.actor),
            std::mem::take(&mut self.phase),
            self.step,
            self.start_unix_ms,
            unix_ms_now(),
        );
        let secs = span.seconds();
        self.handle.report(span);
        secs
    }
}

impl Drop for SpanTimer {
    fn drop(&mut self) {
        if !self.done {
            self.report();
        }
    }
}
