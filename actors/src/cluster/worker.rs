//! `oxalign worker`: a `ractor_cluster` node that hosts role actors for a controller. It
//! listens on one address; each connection is (with TLS) a mutual TLS handshake, then a node
//! session that must pass the node server's challenge-response on the cookie before any
//! actor message; the only actor it can then reach is the role host (`host_actor.rs`), which
//! builds roles and answers their calls. A worker beyond loopback refuses to start without a
//! cookie, and without TLS unless told `--insecure`.
//!
//! Hostile clients: connections are capped in total and per peer address (`door.rs`, from
//! the descriptor limit), and at most half of the places may be held by connections still
//! in their handshake; a connection whose TLS handshake, authentication and exchange of
//! actors are not done within [`HANDSHAKE_TIMEOUT`] is closed. On every connection a frame
//! above the message cap ends the session before its payload is read (and a payload's
//! buffer grows with the bytes that arrive, not with the length announced), a peer that
//! sends nothing for a minute is cut, and frames beyond a rate are read only as the rate
//! allows (`stream.rs`). A failed accept (out of descriptors) is logged and retried, never
//! the end of the worker.

use super::door::{Door, DoorCaps};
use super::error::WorkerError;
use super::host_actor::RoleHost;
use super::inventory::{local_devices, Holdings};
use super::messages::HostMessage;
use super::node::{started, Node, SessionEvent, Start};
use super::stream::Guard;
use super::tls::Tls;
use crate::recipe::is_loopback_host;
use ractor::{Actor, ActorRef};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a new connection may take from accept to a ready session.
const HANDSHAKE_TIMEOUT: Duration = Guard::DEFAULT.handshake;

/// How a worker serves.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The cookie every session must prove it knows; `None` = the empty cookie (loopback only).
    pub cookie: Option<String>,
    /// Largest message accepted, bytes.
    pub max_frame: usize,
    /// Mutual TLS, required beyond loopback unless the worker was started `--insecure`.
    pub tls: Option<Tls>,
}

/// Binds `listen` (`host:port`; port 0 picks a free one). An address beyond loopback
/// needs `cookie`, and TLS unless `insecure`.
pub async fn bind(
    listen: &str,
    cookie: Option<&str>,
    tls: bool,
    insecure: bool,
) -> Result<TcpListener, WorkerError> {
    let bad = |message: String| WorkerError::Listen {
        addr: listen.to_string(),
        message,
    };
    let (host, port) = listen
        .rsplit_once(':')
        .ok_or_else(|| bad("expected host:port, e.g. 127.0.0.1:7101".into()))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(bad(
            "expected host:port with a port from 0 (any free one) to 65535".into(),
        ));
    }
    if !is_loopback_host(host) && cookie.is_none_or(str::is_empty) {
        return Err(bad(
            "a worker beyond loopback needs a cookie: pass --cookie or set OXALIGN_COOKIE".into(),
        ));
    }
    if !is_loopback_host(host) && !tls && !insecure {
        return Err(bad(
            "a worker beyond loopback needs TLS: pass --tls-cert, --tls-key and --tls-ca \
             (make them with `oxalign cluster certs`), or --insecure on a network you trust"
                .into(),
        ));
    }
    TcpListener::bind(listen)
        .await
        .map_err(|source| WorkerError::Bind {
            addr: listen.to_string(),
            source,
        })
}

/// Accepts connections on `listener` until the process ends, each handed to this worker's
/// node within the caps of [`DoorCaps::from_descriptor_limit`]. The roles share one register
/// of the devices they hold, which an inventory request reports with this machine's devices.
pub async fn serve(listener: TcpListener, cfg: WorkerConfig) -> Result<(), WorkerError> {
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    let cookie = cfg.cookie.clone().unwrap_or_default();
    let start = |e: String| WorkerError::Start(e);
    // Unique, so two workers on one port (on two addresses) are two nodes to a controller.
    let name = format!("worker-{port}-{:08x}", rand::random::<u32>());
    let node = Node::start(&name, &cookie, cfg.max_frame as u64, cfg.tls.as_ref())
        .await
        .map_err(|e| start(e.to_string()))?;
    let (host, _join) = Actor::spawn(None, RoleHost, Holdings::new(local_devices()))
        .await
        .map_err(|e| start(format!("the role host did not start: {e}")))?;
    tokio::spawn(stop_roles_of_departed(node.subscribe(), host));
    let node = Arc::new(node);
    let door = Door::new(listener, DoorCaps::from_descriptor_limit());
    let handshakes = Arc::new(Semaphore::new((door.caps().total / 2).max(1)));
    let tls = cfg.tls.map(|t| tokio_rustls::TlsAcceptor::from(t.server));
    loop {
        let (stream, peer, admission) = door.accept().await;
        let Ok(handshake) = handshakes.clone().try_acquire_owned() else {
            tracing::debug!("{peer}: closed at once, too many connections in their handshake");
            continue;
        };
        let (node, tls) = (node.clone(), tls.clone());
        tokio::spawn(async move {
            // The place is the connection's for as long as its session lives.
            let _admission = admission;
            let mut news = node.subscribe();
            if let Some(label) = admit(&node, &mut news, stream, peer, tls, handshake).await {
                ended(&node, &mut news, &label).await;
            }
        });
    }
}

/// The TLS handshake and authentication of one connection within [`HANDSHAKE_TIMEOUT`];
/// its session's label once it is ready, `None` when it was refused or took too long.
async fn admit(
    node: &Node,
    news: &mut tokio::sync::broadcast::Receiver<SessionEvent>,
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    _handshake: OwnedSemaphorePermit,
) -> Option<String> {
    stream.set_nodelay(true).ok();
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    let label = match tls {
        Some(acceptor) => match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
            Ok(Ok(secured)) => node.open(secured, &peer.to_string(), Guard::DEFAULT, true),
            Ok(Err(e)) => {
                tracing::warn!("{peer}: refused in the TLS handshake: {e}");
                return None;
            }
            Err(_) => {
                tracing::warn!("{peer}: closed, no TLS handshake within {HANDSHAKE_TIMEOUT:?}");
                return None;
            }
        },
        None => node.open(stream, &peer.to_string(), Guard::DEFAULT, true),
    };
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    match started(news, &label, left).await {
        Start::Ready(_) => Some(label),
        Start::Gone => {
            tracing::warn!("{peer}: the session ended before it was ready (a wrong cookie?)");
            None
        }
        Start::TimedOut => {
            tracing::warn!("{peer}: closed, not authenticated within {HANDSHAKE_TIMEOUT:?}");
            node.close(&label).await;
            None
        }
    }
}

/// Returns when the session labelled `label` ends.
async fn ended(
    node: &Node,
    news: &mut tokio::sync::broadcast::Receiver<SessionEvent>,
    label: &str,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match news.recv().await {
            Ok(SessionEvent::Gone { label: l, .. }) if l == label => return,
            Err(RecvError::Closed) => return,
            Err(RecvError::Lagged(_)) if !node.is_open(label).await => return,
            _ => {}
        }
    }
}

/// Tells the role host of every session that ends, so the roles its controller spawned stop.
async fn stop_roles_of_departed(
    mut news: tokio::sync::broadcast::Receiver<SessionEvent>,
    host: ActorRef<HostMessage>,
) {
    loop {
        match news.recv().await {
            Ok(SessionEvent::Gone {
                peer: Some(peer), ..
            }) => {
                let _ = host.cast(HostMessage::PeerGone(peer));
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            _ => {}
        }
    }
}
