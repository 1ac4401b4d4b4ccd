//! Where the dashboard's data comes from. A live monitor is mirrored: one background task
//! subscribes to it, keeps a copy of its state and relays its events to the page streams
//! (so requests never queue on the monitor actor, and the final state stays served after
//! the monitor stops). A replayed run directory is loaded once. Nothing is rendered here.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use oxalign_actors::monitor::{
    load_run_dir, unix_ms_now, MonitorEvent, MonitorHandle, MonitorLimits, MonitorSnapshot,
    MonitorState,
};
use serde::Serialize;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

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
    /// `false` once a live monitor has stopped (the state shown is its last one), and
    /// always for a replay.
    pub monitor_running: bool,
    /// The server's "now" in ms since the Unix epoch: the wall clock when live, the
    /// run's latest record when replaying (heartbeat ages are measured from it).
    pub now_unix_ms: u64,
    /// The run's state.
    #[serde(flatten)]
    pub snapshot: MonitorSnapshot,
}

/// What the mirror relays to page streams.
#[derive(Debug, Clone)]
pub(crate) enum Relay {
    /// One monitor event, already applied to the mirror.
    Event(MonitorEvent),
    /// The mirror was rebuilt from a fresh snapshot (the relay task fell behind).
    Resync(Arc<StateView>),
    /// The monitor stopped; no more events.
    Ended,
}

/// Capacity of the relay channel, in events, per page stream.
const RELAY_CAPACITY: usize = 4096;

#[derive(Debug)]
struct MirrorInner {
    state: MonitorState,
    running: bool,
    tx: broadcast::Sender<Relay>,
}

/// A copy of a live monitor's state, kept current by [`Mirror::follow`].
#[derive(Debug)]
pub(crate) struct Mirror {
    inner: Mutex<MirrorInner>,
}

impl Mirror {
    fn lock(&self) -> MutexGuard<'_, MirrorInner> {
        // a panic while holding the lock cannot leave the state half-applied in a way
        // that matters for display, so keep serving
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn live_view(inner: &MirrorInner) -> StateView {
        StateView {
            mode: "live",
            monitor_running: inner.running,
            now_unix_ms: unix_ms_now(),
            snapshot: inner.state.snapshot(),
        }
    }

    /// Subscribes to `handle` and returns the mirror and the task keeping it current.
    async fn start(handle: MonitorHandle) -> (Arc<Mirror>, JoinHandle<()>) {
        let (tx, _) = broadcast::channel(RELAY_CAPACITY);
        let first = handle.subscribe().await.ok();
        let (state, running, rx) = match first {
            Some((snap, rx)) => (
                MonitorState::from_snapshot(&snap, snap.limits),
                true,
                Some(rx),
            ),
            None => (MonitorState::new(MonitorLimits::default()), false, None),
        };
        let mirror = Arc::new(Mirror {
            inner: Mutex::new(MirrorInner { state, running, tx }),
        });
        let task = tokio::spawn(Self::follow(mirror.clone(), handle, rx));
        (mirror, task)
    }

    /// Applies and relays every monitor event until the monitor stops.
    async fn follow(
        mirror: Arc<Mirror>,
        handle: MonitorHandle,
        mut rx: Option<broadcast::Receiver<MonitorEvent>>,
    ) {
        while let Some(receiver) = rx.as_mut() {
            match receiver.recv().await {
                Ok(event) => {
                    let mut inner = mirror.lock();
                    inner.state.apply(&event);
                    let _ = inner.tx.send(Relay::Event(event));
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "dashboard fell behind the monitor; resyncing");
                    match handle.subscribe().await {
                        Ok((snap, new_rx)) => {
                            let mut inner = mirror.lock();
                            inner.state = MonitorState::from_snapshot(&snap, snap.limits);
                            let view = Arc::new(Self::live_view(&inner));
                            let _ = inner.tx.send(Relay::Resync(view));
                            rx = Some(new_rx);
                        }
                        Err(_) => rx = None,
                    }
                }
                Err(broadcast::error::RecvError::Closed) => rx = None,
            }
        }
        let mut inner = mirror.lock();
        inner.running = false;
        let _ = inner.tx.send(Relay::Ended);
    }

    fn view(&self) -> StateView {
        Self::live_view(&self.lock())
    }

    /// The current view and a receiver of every later relay message (taken atomically);
    /// no receiver once the monitor has stopped.
    fn subscribe(&self) -> (StateView, Option<broadcast::Receiver<Relay>>) {
        let inner = self.lock();
        let view = Self::live_view(&inner);
        let rx = inner.running.then(|| inner.tx.subscribe());
        (view, rx)
    }

    fn streams(&self) -> usize {
        self.lock().tx.receiver_count()
    }
}

/// A resolved source, shared by all requests.
#[derive(Debug)]
pub(crate) enum Source {
    Live(Arc<Mirror>),
    Replay(Arc<MonitorSnapshot>),
}

impl Source {
    /// Resolves a [`DashboardSource`]: starts mirroring a live monitor (returning the
    /// mirroring task), or loads a replayed run (which can fail).
    pub(crate) async fn resolve(
        source: DashboardSource,
    ) -> Result<(Self, Option<JoinHandle<()>>), DashboardError> {
        match source {
            DashboardSource::Live(handle) => {
                let (mirror, task) = Mirror::start(handle).await;
                Ok((Source::Live(mirror), Some(task)))
            }
            DashboardSource::Replay(dir) => {
                let loaded = tokio::task::spawn_blocking({
                    let dir = dir.clone();
                    move || load_run_dir(&dir, MonitorLimits::default())
                })
                .await
                .map_err(|e| DashboardError::Serve(std::io::Error::other(e)))?;
                loaded
                    .map(|s| (Source::Replay(Arc::new(s)), None))
                    .map_err(|source| DashboardError::Replay { dir, source })
            }
        }
    }

    fn replay_view(snapshot: &MonitorSnapshot) -> StateView {
        StateView {
            mode: "replay",
            monitor_running: false,
            now_unix_ms: snapshot.latest_unix_ms(),
            snapshot: snapshot.clone(),
        }
    }

    /// The current state (the last known one once a live monitor has stopped).
    pub(crate) fn state(&self) -> StateView {
        match self {
            Source::Live(m) => m.view(),
            Source::Replay(s) => Self::replay_view(s),
        }
    }

    /// The current state and, while a live monitor runs, a receiver of what follows.
    pub(crate) fn subscribe(&self) -> (StateView, Option<broadcast::Receiver<Relay>>) {
        match self {
            Source::Live(m) => m.subscribe(),
            Source::Replay(s) => (Self::replay_view(s), None),
        }
    }

    /// Number of open page event streams.
    pub(crate) fn streams(&self) -> usize {
        match self {
            Source::Live(m) => m.streams(),
            Source::Replay(_) => 0,
        }
    }
}
