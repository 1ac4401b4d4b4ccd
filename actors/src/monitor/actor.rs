//! The `Monitor` ractor actor: applies every `MonitorEvent` to its state, appends it to the
//! run directory and broadcasts it to live subscribers (the dashboard). It never blocks a
//! reporter: events arrive by `cast`, and a failing disk only produces warnings.

use std::path::PathBuf;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::broadcast;

use super::clock::unix_ms_now;
use super::error::MonitorError;
use super::event::MonitorEvent;
use super::handle::MonitorHandle;
use super::msg::MonitorMsg;
use super::replay::load_run_dir;
use super::run_log::{files, RunLog};
use super::state::{ActorChange, MonitorLimits, MonitorState};

/// How to start a [`Monitor`].
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// Run directory to write `metrics.jsonl`, `timeline.jsonl`, `samples.jsonl`, `actors.json`,
    /// `recipe.toml` and `run.json` into (created if missing); `None` keeps everything in
    /// memory only. Default `None`.
    pub run_dir: Option<PathBuf>,
    /// In-memory history limits. Default [`MonitorLimits::default`].
    pub limits: MonitorLimits,
    /// Events a slow subscriber may fall behind before it is told it lagged (it then
    /// re-reads a snapshot). Default 4096.
    pub broadcast_capacity: usize,
    /// When `true` and `run_dir` already holds a run, start from its state (resume) and
    /// keep appending; when `false` the old logs are appended to but not loaded.
    /// Default `false`.
    pub resume: bool,
    /// Also write the step metrics as TensorBoard event files in `run_dir/tensorboard/`.
    /// Default `false`.
    pub tensorboard: bool,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            run_dir: None,
            limits: MonitorLimits::default(),
            broadcast_capacity: 4096,
            resume: false,
            tensorboard: false,
        }
    }
}

impl MonitorConfig {
    /// A monitor that keeps state in memory only.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// A monitor that writes its logs into `dir`.
    pub fn with_run_dir(dir: impl Into<PathBuf>) -> Self {
        MonitorConfig {
            run_dir: Some(dir.into()),
            ..Self::default()
        }
    }
}

/// The monitor actor (stateless handler; its state is [`MonitorActorState`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Monitor;

/// The monitor actor's state.
pub struct MonitorActorState {
    state: MonitorState,
    log: Option<RunLog>,
    tx: broadcast::Sender<MonitorEvent>,
    write_errors: u64,
    /// `write_errors` at the previous sync.
    synced_errors: u64,
}

impl MonitorActorState {
    fn log_result(&mut self, result: Result<(), MonitorError>) {
        if let Err(e) = result {
            self.write_errors += 1;
            // warn on the first failure and then every 1000th, so a full disk cannot
            // flood the log
            if self.write_errors % 1000 == 1 {
                tracing::warn!(error = %e, failures = self.write_errors, "monitor: cannot write run log");
            }
        }
    }

    /// Fsyncs the logs and reports the writes that failed since the previous sync.
    fn sync(&mut self) -> Result<(), MonitorError> {
        let Some(log) = self.log.as_mut() else {
            return Ok(());
        };
        let failures = self.write_errors - self.synced_errors;
        self.synced_errors = self.write_errors;
        if failures > 0 {
            return Err(MonitorError::LostLines {
                dir: log.dir().to_path_buf(),
                failures,
            });
        }
        log.sync()
    }

    fn handle_event(&mut self, event: MonitorEvent) {
        let change = self.state.apply(&event);
        if let Some(log) = self.log.as_mut() {
            let result = match &event {
                MonitorEvent::Metrics(m) => log.append_metrics(m),
                MonitorEvent::Span(s) => log.append_span(s),
                MonitorEvent::Samples(s) => log.append_samples(s),
                MonitorEvent::Run(r) => log.write_run(r),
                MonitorEvent::Finished(f) => log
                    .write_finished(f)
                    .and_then(|_| log.write_actors(self.state.actors(), true, unix_ms_now())),
                MonitorEvent::Actor(_) | MonitorEvent::ActorUpdate(_) => match change {
                    ActorChange::None => Ok(()),
                    ActorChange::Heartbeat => {
                        log.write_actors(self.state.actors(), false, unix_ms_now())
                    }
                    ActorChange::Record => {
                        log.write_actors(self.state.actors(), true, unix_ms_now())
                    }
                },
                MonitorEvent::Checkpoint(_) => Ok(()),
            };
            self.log_result(result);
        }
        // no receivers is fine: nobody is watching
        let _ = self.tx.send(event);
    }
}

impl Monitor {
    /// Spawns a monitor and returns its handle and the actor's join handle.
    pub async fn spawn(
        config: MonitorConfig,
    ) -> Result<(MonitorHandle, tokio::task::JoinHandle<()>), MonitorError> {
        let (actor, join) = <Monitor as Actor>::spawn(None, Monitor, config)
            .await
            .map_err(|e| MonitorError::Spawn(e.to_string()))?;
        Ok((MonitorHandle::new(actor), join))
    }

    /// Spawns a monitor supervised by `supervisor`.
    pub async fn spawn_linked(
        config: MonitorConfig,
        supervisor: ractor::ActorCell,
    ) -> Result<(MonitorHandle, tokio::task::JoinHandle<()>), MonitorError> {
        let (actor, join) = <Monitor as Actor>::spawn_linked(None, Monitor, config, supervisor)
            .await
            .map_err(|e| MonitorError::Spawn(e.to_string()))?;
        Ok((MonitorHandle::new(actor), join))
    }
}

impl Actor for Monitor {
    type Msg = MonitorMsg;
    type State = MonitorActorState;
    type Arguments = MonitorConfig;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        config: MonitorConfig,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut state = MonitorState::new(config.limits);
        let log = match &config.run_dir {
            None => None,
            Some(dir) => {
                if config.resume && dir.join(files::METRICS).is_file() {
                    let mut snap = load_run_dir(dir, config.limits)?;
                    snap.finished = None;
                    state = MonitorState::from_snapshot(&snap, config.limits);
                }
                let mut log = RunLog::open(dir)?;
                if config.tensorboard {
                    log.enable_tensorboard()?;
                }
                Some(log)
            }
        };
        let (tx, _) = broadcast::channel(config.broadcast_capacity.max(16));
        Ok(MonitorActorState {
            state,
            log,
            tx,
            write_errors: 0,
            synced_errors: 0,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            MonitorMsg::Event(event) => st.handle_event(event),
            MonitorMsg::Snapshot(reply) => {
                // the asker may have given up (timeout); that is not our error
                let _ = reply.send(st.state.snapshot());
            }
            MonitorMsg::Subscribe(reply) => {
                let _ = reply.send((st.state.snapshot(), st.tx.subscribe()));
            }
            MonitorMsg::Sync(reply) => {
                let _ = reply.send(st.sync());
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // the last heartbeats may have been throttled: leave the final table on disk
        if let Some(log) = st.log.as_mut() {
            let result = log.write_actors(st.state.actors(), true, unix_ms_now());
            st.log_result(result);
        }
        Ok(())
    }
}
