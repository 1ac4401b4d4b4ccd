//! The monitor a worker gives the role it hosts: a small actor that sends each status change
//! and span the role reports (`ActorUpdate`, `Span`) to the controller as
//! [`Response::Events`] under [`EVENTS_ID`], as they happen, on the role's own connection.
//! The controller's monitor then shows a remote role as it shows a local one. Everything
//! else a role reports (its `ActorInfo`, with the worker's device names) stays here: the
//! controller registers the role itself, with `node/device` names. Before the worker sends
//! an answer it [`Flush`]es the relay, so what the role reported while answering (e.g.
//! "idle, 1200 rows/s") reaches the controller before the answer does.

use super::wire::{Envelope, Response, EVENTS_ID};
use crate::monitor::{MonitorEvent, MonitorHandle, MonitorMsg};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;

/// How long the relay may take to pass on what is queued when its role stops.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// The relay actor (its state is the connection's outbox).
struct Relay;

impl Actor for Relay {
    type Msg = MonitorMsg;
    type State = UnboundedSender<Envelope<Response>>;
    type Arguments = UnboundedSender<Envelope<Response>>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        outbox: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(outbox)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        outbox: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Snapshots and subscriptions are the controller's monitor's: their ports drop here.
        if let MonitorMsg::Event(e @ (MonitorEvent::ActorUpdate(_) | MonitorEvent::Span(_))) = msg {
            let _ = outbox.send(Envelope {
                id: EVENTS_ID,
                body: Response::Events(vec![e]),
            });
        }
        Ok(())
    }
}

/// Waits until the relay passed on every event reported before the call (cheap to clone).
#[derive(Clone)]
pub(crate) struct Flush(Option<ActorRef<MonitorMsg>>);

impl Flush {
    /// Returns once the events reported so far are in the outbox.
    pub(crate) async fn flush(&self) {
        if let Some(a) = &self.0 {
            // The relay drops the port after the events queued before it: that is the answer.
            let _ = a.call(MonitorMsg::Snapshot, Some(DRAIN_WAIT)).await;
        }
    }
}

/// A running relay; [`RelayHandle::close`] stops it (it holds a sender of the outbox, so
/// the connection's writer ends only after it).
pub(crate) struct RelayHandle {
    actor: Option<ActorRef<MonitorMsg>>,
}

impl RelayHandle {
    /// Starts a relay into `outbox`, and the monitor handle the role reports to (a disabled
    /// one if the actor cannot start: the role then runs unobserved, as before).
    pub(crate) async fn start(
        outbox: UnboundedSender<Envelope<Response>>,
    ) -> (Self, MonitorHandle) {
        match Actor::spawn(None, Relay, outbox).await {
            Ok((actor, _join)) => {
                let monitor = MonitorHandle::new(actor.clone());
                (Self { actor: Some(actor) }, monitor)
            }
            Err(e) => {
                tracing::warn!("the role's monitor relay did not start: {e}");
                (Self { actor: None }, MonitorHandle::disabled())
            }
        }
    }

    /// A [`Flush`] of this relay.
    pub(crate) fn flusher(&self) -> Flush {
        Flush(self.actor.clone())
    }

    /// Passes on what is queued (waiting at most [`DRAIN_WAIT`]) and stops.
    pub(crate) async fn close(self) {
        if let Some(a) = self.actor {
            if a.drain_and_wait(Some(DRAIN_WAIT)).await.is_err() {
                a.stop(None);
            }
        }
    }
}
