//! The controller's end of a remote role: a [`Connection`] is one slot on a worker's role
//! host, reached over this process's `ractor_cluster` node (`node.rs`). The process has one
//! node per cookie and frame cap, with one session per worker address, shared by the roles
//! placed there and opened on first use: dial (retrying until the node's wait is over), TLS
//! when the endpoint has it, then the node server's challenge-response on the cookie and the
//! exchange of actors and groups, after which the worker's role host is found among the
//! members of [`HOST_GROUP`] by the session's node id. Each call is an RPC to the host; when
//! the session ends (the worker died, or refused us) every waiting call fails at once with
//! [`ClusterError::Lost`], and the next open dials afresh. Dropping a connection stops its
//! role on the worker; the worker also stops the roles of a controller whose session ended.
//! What a remote role reports to its monitor arrives at this process's event sink
//! (`events.rs`) and goes to the monitor given at [`Connection::open_reporting`].

use super::call::{decode_response, encode_request};
use super::error::{ClusterError, DecodeError};
use super::events::{Monitors, RemoteRole, Sink};
use super::messages::{sink_group, HostMessage, HOST_GROUP};
use super::node::{started, Node, Start};
use super::session_watch::watch_sessions;
use super::stream::Guard;
use super::tls::{server_name, Tls};
use super::wire::{Request, Response};
use crate::monitor::MonitorHandle;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef, ActorStatus};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// How long to wait between connection attempts.
const RETRY_EVERY: Duration = Duration::from_millis(200);
/// How long TLS, authentication and the exchange of actors may take once connected.
const HANDSHAKE_TIMEOUT: Duration = Guard::DEFAULT.handshake;

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The node's name (`[cluster] nodes` key).
    pub node: String,
    /// Its `host:port`.
    pub addr: String,
    /// The cookie (empty: none was set, which a worker on loopback accepts).
    pub cookie: Option<String>,
    /// Largest message, bytes.
    pub max_frame: usize,
    /// How long to keep trying to connect.
    pub patience: Duration,
    /// TLS, when the cluster uses it.
    pub tls: Option<Tls>,
}

type Answer = Result<Response, ClusterError>;

/// An open slot on a worker's role host.
pub struct Connection {
    node: String,
    addr: String,
    slot: u64,
    host: ActorRef<HostMessage>,
    local: Arc<LocalNode>,
    /// Whether a spawn was sent on this slot.
    spawned: AtomicBool,
}

impl Connection {
    /// Connects to `ep`, retrying until `ep.patience` is over, and passes the handshake.
    /// The role's monitor events are dropped.
    pub async fn open(ep: &Endpoint) -> Result<Self, ClusterError> {
        Self::open_reporting(ep, MonitorHandle::disabled()).await
    }

    /// [`Connection::open`], with the hosted role's status changes and spans reported to
    /// `monitor`.
    pub async fn open_reporting(
        ep: &Endpoint,
        monitor: MonitorHandle,
    ) -> Result<Self, ClusterError> {
        static NEXT_SLOT: AtomicU64 = AtomicU64::new(1);
        let local = LocalNode::get(ep).await?;
        let host = local.session(ep).await?;
        let slot = NEXT_SLOT.fetch_add(1, Ordering::Relaxed);
        let role = RemoteRole {
            monitor,
            node: ep.node.clone(),
            addr: ep.addr.clone(),
            actor: None,
        };
        local.monitors.lock().unwrap().insert(slot, role);
        Ok(Self {
            node: ep.node.clone(),
            addr: ep.addr.clone(),
            slot,
            host,
            local,
            spawned: AtomicBool::new(false),
        })
    }

    /// The slot's number on the worker's host.
    pub fn slot(&self) -> u64 {
        self.slot
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// This process's node name, which the worker knows the role's owner by.
    pub fn owner(&self) -> &str {
        &self.local.node.name
    }

    /// Reports the slot's role, named `actor` on its monitor, failed at once when the
    /// session to its worker ends (`session_watch.rs`).
    pub fn watch_as(&self, actor: &str) {
        if let Some(role) = self.local.monitors.lock().unwrap().get_mut(&self.slot) {
            role.actor = Some(actor.to_string());
        }
    }

    /// The process group of this process's event sink, for the role's reports.
    pub fn events_group(&self) -> String {
        sink_group(&self.local.node.name)
    }

    /// Sends `request` and waits for its answer; `None` = no answer within `timeout` (the
    /// call may still run on the worker).
    pub async fn call(&self, request: Request, timeout: Duration) -> Option<Answer> {
        if matches!(request, Request::Spawn(_)) {
            self.spawned.store(true, Ordering::Relaxed);
        }
        let bytes = match self.encode(request) {
            Ok(b) => b,
            Err(e) => return Some(Err(e)),
        };
        let answer = self
            .host
            .call(|port| HostMessage::Call(bytes, port), Some(timeout))
            .await;
        match answer {
            Ok(CallResult::Success(bytes)) => Some(self.decode(&bytes)),
            Ok(CallResult::Timeout) => None,
            Ok(CallResult::SenderError) | Err(_) => Some(Err(self.lost())),
        }
    }

    /// Sends `request` without waiting for an answer.
    pub fn notify(&self, request: Request) {
        if let Ok(bytes) = self.encode(request) {
            let _ = self.host.cast(HostMessage::Cast(bytes));
        }
    }

    fn encode(&self, request: Request) -> Result<Vec<u8>, ClusterError> {
        let kind = request.kind();
        encode_request(self.slot, request).map_err(|e| ClusterError::Protocol {
            node: self.node.clone(),
            addr: self.addr.clone(),
            message: format!("cannot encode a {kind} request: {e}"),
        })
    }

    fn decode(&self, bytes: &[u8]) -> Answer {
        match decode_response(bytes) {
            Ok(env) => Ok(env.body),
            Err(source @ DecodeError::Tensors { .. }) => {
                tracing::warn!(
                    "node {} ({}): a malformed answer: {source}",
                    self.node,
                    self.addr
                );
                Err(ClusterError::BadAnswer {
                    node: self.node.clone(),
                    addr: self.addr.clone(),
                    source: Box::new(source),
                })
            }
            Err(e) => Err(ClusterError::Protocol {
                node: self.node.clone(),
                addr: self.addr.clone(),
                message: format!("an answer that does not decode: {e}"),
            }),
        }
    }

    fn lost(&self) -> ClusterError {
        let reason = if self.host.get_status() == ActorStatus::Running {
            "the call's answer was dropped"
        } else {
            "the node session ended (the worker is gone or closed it)"
        };
        ClusterError::Lost {
            node: self.node.clone(),
            addr: self.addr.clone(),
            reason: reason.into(),
        }
    }
}

impl Drop for Connection {
    /// Stops the slot's role on the worker, if one was asked for.
    fn drop(&mut self) {
        if self.spawned.load(Ordering::Relaxed) {
            self.notify(Request::Stop(0));
        }
        self.local.monitors.lock().unwrap().remove(&self.slot);
    }
}

/// The role host of one worker address's open session, if any (locked while dialling).
type SessionSlot = Arc<tokio::sync::Mutex<Option<ActorRef<HostMessage>>>>;

/// This process's node for one cookie and frame cap, its event sink and its sessions.
struct LocalNode {
    node: Node,
    monitors: Monitors,
    /// Per worker address, the host of the open session (the lock is held while dialling).
    sessions: Mutex<HashMap<String, SessionSlot>>,
}

impl LocalNode {
    /// The process's node for `ep`'s cookie and frame cap, started on first use.
    async fn get(ep: &Endpoint) -> Result<Arc<Self>, ClusterError> {
        type Nodes = tokio::sync::Mutex<HashMap<(String, usize), Arc<LocalNode>>>;
        static NODES: OnceLock<Nodes> = OnceLock::new();
        let key = (ep.cookie.clone().unwrap_or_default(), ep.max_frame);
        let mut nodes = NODES.get_or_init(Default::default).lock().await;
        if let Some(n) = nodes.get(&key) {
            return Ok(n.clone());
        }
        let fail = |e: String| ClusterError::Protocol {
            node: ep.node.clone(),
            addr: ep.addr.clone(),
            message: e,
        };
        let name = format!(
            "controller-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        );
        let node = Node::start(&name, &key.0, ep.max_frame as u64, None)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let monitors = Monitors::default();
        Actor::spawn(None, Sink, (node.name.clone(), monitors.clone()))
            .await
            .map_err(|e| fail(format!("the event sink did not start: {e}")))?;
        watch_sessions(node.subscribe(), monitors.clone());
        let local = Arc::new(LocalNode {
            node,
            monitors,
            sessions: Mutex::default(),
        });
        nodes.insert(key, local.clone());
        Ok(local)
    }

    /// The role host of the worker at `ep.addr`, on the open session or a new one.
    async fn session(&self, ep: &Endpoint) -> Result<ActorRef<HostMessage>, ClusterError> {
        let entry = self
            .sessions
            .lock()
            .unwrap()
            .entry(ep.addr.clone())
            .or_default()
            .clone();
        let mut open = entry.lock().await;
        if let Some(host) = open.as_ref() {
            if host.get_status() == ActorStatus::Running {
                return Ok(host.clone());
            }
        }
        let host = self.dial(ep).await?;
        *open = Some(host.clone());
        Ok(host)
    }

    /// Dials `ep`, hands the stream to the node server and waits for the session.
    async fn dial(&self, ep: &Endpoint) -> Result<ActorRef<HostMessage>, ClusterError> {
        let stream = connect(ep).await?;
        stream.set_nodelay(true).ok();
        let mut news = self.node.subscribe();
        let guard = Guard {
            count_traffic: true,
            ..Guard::DEFAULT
        };
        let label = match &ep.tls {
            Some(tls) => {
                let secured = tokio::time::timeout(HANDSHAKE_TIMEOUT, secure(ep, tls, stream))
                    .await
                    .map_err(|_| lost(ep, "no answer to the TLS handshake".into()))??;
                self.node.open(secured, &ep.addr, guard, false)
            }
            None => self.node.open(stream, &ep.addr, guard, false),
        };
        match started(&mut news, &label, HANDSHAKE_TIMEOUT).await {
            Start::Ready(node_id) => host_of(node_id).ok_or_else(|| ClusterError::Protocol {
                node: ep.node.clone(),
                addr: ep.addr.clone(),
                message: "the session is up but no oxalign role host is there".into(),
            }),
            Start::Gone => Err(ClusterError::Refused {
                node: ep.node.clone(),
                addr: ep.addr.clone(),
                reason: "the worker ended the session before it was authenticated: a wrong \
                         or missing cookie, or a certificate it does not accept"
                    .into(),
            }),
            Start::TimedOut => {
                self.node.close(&label).await;
                Err(lost(ep, "no answer to the handshake".into()))
            }
        }
    }
}

/// The role host of the session with node id `node_id`.
fn host_of(node_id: u64) -> Option<ActorRef<HostMessage>> {
    ractor::pg::get_members(&HOST_GROUP.to_string())
        .into_iter()
        .find(|c| !c.get_id().is_local() && c.get_id().node() == node_id)
        .map(ActorRef::from)
}

/// The TLS client handshake with the worker at `ep.addr`, whose certificate must name its host.
async fn secure(
    ep: &Endpoint,
    tls: &Tls,
    stream: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ClusterError> {
    let host = ep
        .addr
        .rsplit_once(':')
        .map_or(ep.addr.as_str(), |(h, _)| h);
    let name = server_name(host).map_err(|e| lost(ep, e.to_string()))?;
    tokio_rustls::TlsConnector::from(tls.client.clone())
        .connect(name, stream)
        .await
        .map_err(|e| ClusterError::Refused {
            node: ep.node.clone(),
            addr: ep.addr.clone(),
            reason: format!("TLS: {e}"),
        })
}

fn lost(ep: &Endpoint, reason: String) -> ClusterError {
    ClusterError::Lost {
        node: ep.node.clone(),
        addr: ep.addr.clone(),
        reason,
    }
}

/// Connects, retrying every [`RETRY_EVERY`] until `ep.patience` is over.
async fn connect(ep: &Endpoint) -> Result<TcpStream, ClusterError> {
    let start = Instant::now();
    loop {
        match TcpStream::connect(&ep.addr).await {
            Ok(s) => return Ok(s),
            Err(e) if start.elapsed() + RETRY_EVERY >= ep.patience => {
                return Err(ClusterError::NoWorker {
                    node: ep.node.clone(),
                    addr: ep.addr.clone(),
                    waited_s: start.elapsed().as_secs_f64(),
                    last: e.to_string(),
                })
            }
            Err(_) => tokio::time::sleep(RETRY_EVERY).await,
        }
    }
}
