//! The controller's watch on its node sessions. `ractor_cluster` tells the node when a
//! session ends (the worker died, the network dropped it, or the worker closed it); every
//! role hosted through that session is then reported failed to its monitor at once, named
//! with its node and address, so the dashboard and the logs show the loss before a call
//! notices it. The calls themselves fail as the session's actor proxies stop and drop their
//! reply ports: [`super::ClusterError::Lost`], on which the supervisor rebuilds the role.

use super::node::SessionEvent;
use crate::monitor::{ActorUpdate, MonitorHandle};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// A role hosted through a session.
pub(crate) struct Watched {
    /// The worker's address (its sessions' key).
    pub addr: String,
    /// The node's name in the recipe.
    pub node: String,
    /// The role's name on the monitor.
    pub actor: String,
    /// Its monitor.
    pub monitor: MonitorHandle,
}

/// The sessions (by stream label, to their worker's address) and the roles behind them.
#[derive(Clone, Default)]
pub(crate) struct SessionWatch {
    labels: Arc<Mutex<HashMap<String, String>>>,
    roles: Arc<Mutex<HashMap<u64, Watched>>>,
}

impl SessionWatch {
    /// Starts watching the node's session news.
    pub fn start(mut news: broadcast::Receiver<SessionEvent>) -> Self {
        let watch = Self::default();
        let me = watch.clone();
        tokio::spawn(async move {
            loop {
                match news.recv().await {
                    Ok(SessionEvent::Gone { label, .. }) => me.ended(&label),
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        watch
    }

    /// The session handed over as `label` is to the worker at `addr`.
    pub fn session(&self, label: &str, addr: &str) {
        self.labels
            .lock()
            .unwrap()
            .insert(label.to_string(), addr.to_string());
    }

    /// The role in `slot` is hosted through the session to `role.addr`.
    pub fn role(&self, slot: u64, role: Watched) {
        self.roles.lock().unwrap().insert(slot, role);
    }

    /// The role in `slot` is gone from the controller's view.
    pub fn forget(&self, slot: u64) {
        self.roles.lock().unwrap().remove(&slot);
    }

    /// The session labelled `label` ended: its roles are reported failed.
    fn ended(&self, label: &str) {
        let Some(addr) = self.labels.lock().unwrap().remove(label) else {
            return;
        };
        let roles = self.roles.lock().unwrap();
        for r in roles.values().filter(|r| r.addr == addr) {
            let why = format!("node {} ({addr}): its session ended", r.node);
            tracing::warn!("{}: {why}", r.actor);
            r.monitor.report(ActorUpdate::failed(&r.actor, why));
        }
    }
}
