//! What a remote role reports to its monitor, carried back to the controller's: on the
//! worker a [`Relay`] is the monitor its role reports to, and it sends each status change
//! and span (`ActorUpdate`, `Span`) to the controller's [`Sink`] as it happens, tagged with
//! the role's slot; the sink hands them to the monitor of that slot's connection. The
//! controller's monitor then shows a remote role as it shows a local one. Everything else a
//! role reports (its `ActorInfo`, with the worker's device names) stays on the worker: the
//! controller registers the role itself, with `node/device` names. Before a role's slot is
//! emptied its relay is flushed, so what the role reported reaches the controller before
//! the stop is answered.

use super::call::{decode_response, encode_response};
use super::messages::{sink_group, SinkMessage};
use super::wire::Response;
use crate::monitor::{MonitorEvent, MonitorHandle, MonitorMsg};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a flush may wait for the controller.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// The relay actor of one slot.
struct RelayActor {
    slot: u64,
}

impl Actor for RelayActor {
    type Msg = MonitorMsg;
    type State = Option<ActorRef<SinkMessage>>;
    type Arguments = Option<ActorRef<SinkMessage>>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        sink: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(sink)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        sink: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(sink) = sink else {
            return Ok(());
        };
        match msg {
            MonitorMsg::Event(e @ (MonitorEvent::ActorUpdate(_) | MonitorEvent::Span(_))) => {
                if let Ok(bytes) = encode_response(self.slot, Response::Events(vec![e])) {
                    let _ = sink.cast(SinkMessage::Events(bytes));
                }
            }
            // A flush: answered (by dropping the port) once the sink has what came before.
            MonitorMsg::Snapshot(_port) => {
                let _ = sink.call(SinkMessage::Flush, Some(FLUSH_WAIT)).await;
            }
            // Subscriptions and syncs are the controller's monitor's: their ports drop here.
            _ => {}
        }
        Ok(())
    }
}

/// A worker's relay of one slot's reports; it stops when dropped.
pub(crate) struct Relay(Option<ActorRef<MonitorMsg>>);

impl Relay {
    /// Starts the relay of `slot` to the sink in process group `group` (the controller's,
    /// named in the spawn request), and the monitor handle the role reports to. Without
    /// that sink (a client with none) or an actor, the role runs unobserved.
    pub(crate) async fn start(slot: u64, group: &str) -> (Self, MonitorHandle) {
        let sink = ractor::pg::get_members(&group.to_string())
            .into_iter()
            .next()
            .map(ActorRef::<SinkMessage>::from);
        match Actor::spawn(None, RelayActor { slot }, sink).await {
            Ok((actor, _join)) => {
                let monitor = MonitorHandle::new(actor.clone());
                (Self(Some(actor)), monitor)
            }
            Err(e) => {
                tracing::warn!("the role's monitor relay did not start: {e}");
                (Self(None), MonitorHandle::disabled())
            }
        }
    }

    /// Returns once what was reported so far reached the controller (or the wait is over).
    pub(crate) async fn flush(&self) {
        if let Some(a) = &self.0 {
            let _ = a.call(MonitorMsg::Snapshot, Some(FLUSH_WAIT * 2)).await;
        }
    }

    /// Flushes and stops.
    pub(crate) async fn close(self) {
        self.flush().await;
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(a) = self.0.take() {
            a.stop(None);
        }
    }
}

/// A controller's remote role as its reports are routed: its monitor, and where it runs.
pub(crate) struct RemoteRole {
    /// The role's monitor.
    pub monitor: MonitorHandle,
    /// The node's name in the recipe.
    pub node: String,
    /// The worker's address.
    pub addr: String,
    /// The role's name on the monitor, once it is built (`Connection::watch_as`).
    pub actor: Option<String>,
}

/// The controller's remote roles, by slot: the sink routes their reports, the session
/// watch (`session_watch.rs`) reports them failed when their session ends.
pub(crate) type Monitors = Arc<Mutex<HashMap<u64, RemoteRole>>>;

/// The controller's event sink actor.
pub(crate) struct Sink;

impl Actor for Sink {
    type Msg = SinkMessage;
    type State = Monitors;
    type Arguments = (String, Monitors);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (node, monitors): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        ractor::pg::join(sink_group(&node), vec![myself.get_cell()]);
        Ok(monitors)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        monitors: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SinkMessage::Events(bytes) => {
                let Ok(env) = decode_response(&bytes) else {
                    tracing::warn!("a worker sent events that do not decode");
                    return Ok(());
                };
                let monitor = monitors
                    .lock()
                    .unwrap()
                    .get(&env.id)
                    .map(|r| r.monitor.clone());
                if let (Some(monitor), Response::Events(events)) = (monitor, env.body) {
                    report(&monitor, events);
                }
            }
            SinkMessage::Flush(reply) => {
                let _ = reply.send(Vec::new());
            }
        }
        Ok(())
    }
}

/// Passes a remote role's status changes and spans to `monitor` (a worker cannot register
/// actors, report metrics or end the run).
fn report(monitor: &MonitorHandle, events: Vec<MonitorEvent>) {
    for e in events {
        if matches!(e, MonitorEvent::ActorUpdate(_) | MonitorEvent::Span(_)) {
            monitor.report(e);
        }
    }
}
