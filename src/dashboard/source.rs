//! Where the dashboard's data comes from: a live monitor (snapshot + event stream) or a run
//! directory loaded once for replay. It renders nothing; `routes.rs` turns it into HTTP.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use oxalign_actors::monitor::{
    load_run_dir, unix_ms_now, MonitorError, MonitorEvent, MonitorHandle, MonitorLimits,
    MonitorSnapshot,
};
use serde::Serialize;
use tokio::sync::broadcast;

use super::error::DashboardError;

/// What a dashboard shows.
#[derive(Debug, Clone)]
pub enum DashboardSource {
    /// A running monitor: live state and a live event stream.
    Live(MonitorHandle),
    /// A finished (or crashed) run's directory, loaded once when the server starts.
    Replay(PathBuf),
}

/// The JSON body of `/api/state` and of the SSE `snapshot` event.
#[derive(Debug, Clone, Serialize)]
pub struct StateView {
    /// `"live"` or `"replay"`.
    pub mode: &'static str,
    /// `false` once a live monitor has stopped (the state shown is its last one).
    pub monitor_running: bool,
    /// The server's "now" in ms since the Unix epoch: the wall clock when live, the
    /// run's latest record when replaying (heartbeat ages are measured from it).
    pub now_unix_ms: u64,
    /// The run's state.
    #[serde(flatten)]
    pub snapshot: MonitorSnapshot,
}

/// A resolved source, shared by all requests.
#[derive(Debug)]
pub(crate) enum Source {
    Live {
        handle: MonitorHandle,
        /// Last snapshot obtained, served once the monitor has stopped.
        last: Mutex<MonitorSnapshot>,
    },
    Replay(Arc<MonitorSnapshot>),
}

impl Source {
    /// Resolves a [`DashboardSource`]; loading a replayed run can fail.
    pub(crate) fn resolve(source: DashboardSource) -> Result<Self, DashboardError> {
        match source {
            DashboardSource::Live(handle) => Ok(Source::Live {
                handle,
                last: Mutex::new(MonitorSnapshot::default()),
            }),
            DashboardSource::Replay(dir) => load_run_dir(&dir, MonitorLimits::default())
                .map(|s| Source::Replay(Arc::new(s)))
                .map_err(|source| DashboardError::Replay { dir, source }),
        }
    }

    fn remember(&self, snapshot: &MonitorSnapshot) {
        if let Source::Live { last, .. } = self {
            if let Ok(mut last) = last.lock() {
                *last = snapshot.clone();
            }
        }
    }

    fn fallback(&self) -> MonitorSnapshot {
        match self {
            Source::Live { last, .. } => last.lock().map(|s| s.clone()).unwrap_or_default(),
            Source::Replay(s) => (**s).clone(),
        }
    }

    fn view(&self, snapshot: MonitorSnapshot, monitor_running: bool) -> StateView {
        match self {
            Source::Live { .. } => StateView {
                mode: "live",
                monitor_running,
                now_unix_ms: unix_ms_now(),
                snapshot,
            },
            Source::Replay(_) => StateView {
                mode: "replay",
                monitor_running: false,
                now_unix_ms: snapshot.latest_unix_ms(),
                snapshot,
            },
        }
    }

    /// The current state (the last known one if the live monitor has stopped).
    pub(crate) async fn state(&self) -> StateView {
        match self {
            Source::Live { handle, .. } => match handle.snapshot().await {
                Ok(s) => {
                    self.remember(&s);
                    self.view(s, true)
                }
                Err(_) => self.view(self.fallback(), false),
            },
            Source::Replay(s) => self.view((**s).clone(), false),
        }
    }

    /// The current state and, when live, a receiver of every later event.
    pub(crate) async fn subscribe(
        &self,
    ) -> (StateView, Option<broadcast::Receiver<MonitorEvent>>) {
        match self {
            Source::Live { handle, .. } => match handle.subscribe().await {
                Ok((s, rx)) => {
                    self.remember(&s);
                    (self.view(s, true), Some(rx))
                }
                Err(MonitorError::NotRunning) | Err(_) => (self.view(self.fallback(), false), None),
            },
            Source::Replay(s) => (self.view((**s).clone(), false), None),
        }
    }
}
