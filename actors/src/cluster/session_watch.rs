//! The controller's watch on its node sessions. `ractor_cluster` tells the node when a
//! session ends (the worker died, the network dropped it, or the worker closed it); every
//! role hosted through that session is then reported failed to its monitor at once, named
//! with its node and address, so the dashboard and the logs show the loss before a call
//! notices it. The calls themselves fail as the session's actor proxies stop and drop their
//! reply ports: [`super::ClusterError::Lost`], on which the supervisor rebuilds the role.

use super::events::Monitors;
use super::node::{dialled_addr, SessionEvent};
use crate::monitor::ActorUpdate;
use tokio::sync::broadcast;

/// Watches the node's session news on a task of its own, for the roles in `roles`.
pub(crate) fn watch_sessions(mut news: broadcast::Receiver<SessionEvent>, roles: Monitors) {
    tokio::spawn(async move {
        loop {
            match news.recv().await {
                Ok(SessionEvent::Gone { label, .. }) => ended(&roles, dialled_addr(&label)),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
}

/// The session to the worker at `addr` ended: its built roles are reported failed.
fn ended(roles: &Monitors, addr: &str) {
    let roles = roles.lock().unwrap();
    for r in roles.values().filter(|r| r.addr == addr) {
        if let Some(actor) = &r.actor {
            let why = format!("node {} ({addr}): its session ended", r.node);
            tracing::warn!("{actor}: {why}");
            r.monitor.report(ActorUpdate::failed(actor, why));
        }
    }
}
