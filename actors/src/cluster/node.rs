//! One process's `ractor_cluster` node: its [`NodeServer`] and the news of its sessions.
//! Connections are accepted (worker) or dialled (controller) by this module's own code,
//! which applies the caps, the TLS handshake and the stream guard (`stream.rs`), and then
//! handed to the node server as external transports labelled with a unique name, by which
//! the session is found again. The node server authenticates every session by
//! challenge-response on the cookie (the cookie itself never travels) before any actor
//! message passes. ractor_cluster always binds a listener of its own: it is put on a free
//! loopback port and not used, but it is open to this machine's users without the door's
//! caps and the stream guard (it still requires TLS when the node has it, and the cookie).

use super::stream::{Guard, GuardedStream};
use ractor::{Actor, ActorRef};
use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{
    IncomingEncryptionMode, NodeEventSubscription, NodeServer, NodeServerMessage,
};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::broadcast;

/// The host part of every node name (`name@oxalign`).
const HOST: &str = "oxalign";
/// Between the peer and the number in a stream's label (`127.0.0.1:7101#3`).
const LABEL_SEP: char = '#';

/// The peer a stream labelled `label` was opened with (on a controller: the worker's
/// address it dialled).
pub(crate) fn dialled_addr(label: &str) -> &str {
    label.rsplit_once(LABEL_SEP).map_or(label, |(peer, _)| peer)
}

/// What happened to a session, by the label its stream was handed over with.
#[derive(Debug, Clone)]
pub(crate) enum SessionEvent {
    /// Authenticated, and the actors and groups of both sides are exchanged.
    Ready {
        /// The stream's label.
        label: String,
        /// The session's node id (remote actors' ids carry it).
        node_id: u64,
    },
    /// The session ended (before or after it was ready).
    Gone {
        /// The stream's label.
        label: String,
        /// The peer's node name, when it had said it.
        peer: Option<String>,
    },
}

/// Per label of a stream not yet authenticated, the flag its guard reads.
type Pending = Arc<Mutex<HashMap<String, Arc<AtomicBool>>>>;

/// A running node server.
pub(crate) struct Node {
    /// The node server actor.
    pub server: ActorRef<NodeServerMessage>,
    /// This node's full name, as peers see it.
    pub name: String,
    events: broadcast::Sender<SessionEvent>,
    pending: Pending,
}

/// Passes the node server's session news on to a broadcast channel, and lifts the frame cap
/// of a stream whose session is authenticated.
struct Subscriber(broadcast::Sender<SessionEvent>, Pending);

impl Subscriber {
    fn settle(&self, label: &str, authenticated: bool) {
        if let Some(flag) = self.1.lock().unwrap().remove(label) {
            flag.store(authenticated, AtomicOrdering::Release);
        }
    }
}

impl NodeEventSubscription for Subscriber {
    fn node_session_opened(&self, _ses: NodeServerSessionInformation) {}

    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        self.settle(&ses.peer_addr, true);
    }

    fn node_session_ready(&self, ses: NodeServerSessionInformation) {
        let _ = self.0.send(SessionEvent::Ready {
            label: ses.peer_addr,
            node_id: ses.node_id,
        });
    }

    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        self.settle(&ses.peer_addr, false);
        let _ = self.0.send(SessionEvent::Gone {
            label: ses.peer_addr,
            peer: ses.peer_name.map(|n| n.name),
        });
    }
}

/// A node server could not start.
#[derive(Debug, thiserror::Error)]
#[error("the cluster node could not start: {0}")]
pub struct NodeStartError(String);

impl Node {
    /// Starts node `name` with `cookie`, accepting frames of at most `max_frame` bytes; with
    /// `tls` its unused loopback listener requires TLS too.
    pub async fn start(
        name: &str,
        cookie: &str,
        max_frame: u64,
        tls: Option<&super::tls::Tls>,
    ) -> Result<Self, NodeStartError> {
        let mode = tls.map(|t| IncomingEncryptionMode::Tls(t.server.clone().into()));
        let server = NodeServer::new(0, cookie.into(), name.into(), HOST.into(), mode, None)
            .with_listen_addr(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .with_max_inbound_frame_size(max_frame);
        let (server, _join) = Actor::spawn(None, server, ())
            .await
            .map_err(|e| NodeStartError(e.to_string()))?;
        let (events, _) = broadcast::channel(4096);
        let pending = Pending::default();
        server
            .cast(NodeServerMessage::SubscribeToEvents {
                id: "oxalign".into(),
                subscription: Box::new(Subscriber(events.clone(), pending.clone())),
            })
            .map_err(|e| NodeStartError(e.to_string()))?;
        Ok(Self {
            server,
            name: format!("{name}@{HOST}"),
            events,
            pending,
        })
    }

    /// News of this node's sessions from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<SessionEvent> {
        self.events.subscribe()
    }

    /// Hands `stream` to the node server as a session (incoming when `is_server`),
    /// labelled with a fresh name derived from `peer`, which it returns.
    pub fn open<S>(&self, stream: S, peer: &str, guard: Guard, is_server: bool) -> String
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let label = format!(
            "{peer}{LABEL_SEP}{}",
            NEXT.fetch_add(1, AtomicOrdering::Relaxed)
        );
        let authenticated = Arc::new(AtomicBool::new(false));
        self.pending
            .lock()
            .unwrap()
            .insert(label.clone(), authenticated.clone());
        let stream = GuardedStream::new(stream, label.clone(), guard, authenticated);
        let stream = Box::new(stream);
        let _ = self
            .server
            .cast(NodeServerMessage::ConnectionOpenedExternal { stream, is_server });
        label
    }

    /// Whether the session handed over as `label` is still open.
    pub async fn is_open(&self, label: &str) -> bool {
        let sessions = ractor::call!(self.server, NodeServerMessage::GetSessions);
        sessions.is_ok_and(|s| s.values().any(|s| s.peer_addr == label))
    }

    /// Ends the session handed over as `label`, if it is still open.
    pub async fn close(&self, label: &str) {
        let sessions = ractor::call!(self.server, NodeServerMessage::GetSessions);
        if let Ok(sessions) = sessions {
            for s in sessions.values().filter(|s| s.peer_addr == label) {
                s.actor.stop(Some("closed by oxalign".into()));
            }
        }
    }
}

/// How a session handed over as `label` ended its start.
#[derive(Debug)]
pub(crate) enum Start {
    /// Ready, with its node id.
    Ready(u64),
    /// It ended first (the peer refused it, or went away).
    Gone,
    /// Neither within the wait.
    TimedOut,
}

/// Waits up to `wait` for the session labelled `label` to be ready.
pub(crate) async fn started(
    news: &mut broadcast::Receiver<SessionEvent>,
    label: &str,
    wait: Duration,
) -> Start {
    let watch = async {
        loop {
            match news.recv().await {
                Ok(SessionEvent::Ready { label: l, node_id }) if l == label => {
                    return Start::Ready(node_id)
                }
                Ok(SessionEvent::Gone { label: l, .. }) if l == label => return Start::Gone,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return Start::Gone,
            }
        }
    };
    tokio::time::timeout(wait, watch)
        .await
        .unwrap_or(Start::TimedOut)
}
