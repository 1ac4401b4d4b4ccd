//! The controller's end of one connection to a worker: connect (retrying until the node's
//! wait is over), the cookie handshake, then calls multiplexed by id — a writer task sends
//! requests in the order they are made, a reader task hands each answer to its caller.
//! When the stream breaks every waiting call fails at once with [`ClusterError::Lost`], so a
//! dead worker is noticed as soon as the OS reports it, not at the call timeout. Dropping the
//! connection closes it (and the worker then stops the role it hosted). What the hosted role
//! reports to its monitor arrives as [`Response::Events`] and goes to the controller's.

use super::call::{decode_response, encode_request};
use super::error::{ClusterError, DecodeError, FrameError};
use super::frame::{read_message, write_message, Limits};
use super::traffic;
use super::wire::{decode, encode, Hello, HelloReply, Request, Response, EVENTS_ID, PROTOCOL};
use crate::monitor::{MonitorEvent, MonitorHandle};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// How long to wait between connection attempts.
const RETRY_EVERY: Duration = Duration::from_millis(200);
/// How long the handshake may take once connected.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The node's name (`[cluster] nodes` key).
    pub node: String,
    /// Its `host:port`.
    pub addr: String,
    /// The cookie, if any.
    pub cookie: Option<String>,
    /// Frame cap, bytes.
    pub max_frame: usize,
    /// How long to keep trying to connect.
    pub patience: Duration,
}

type Answer = Result<Response, ClusterError>;

/// Calls waiting for their answers; `closed` once the stream broke.
#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, oneshot::Sender<Answer>>,
    closed: Option<String>,
}

/// An open, authenticated connection.
pub struct Connection {
    node: String,
    addr: String,
    outbox: mpsc::UnboundedSender<Vec<u8>>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
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
        let stream = connect(ep).await?;
        stream.set_nodelay(true).ok();
        let (mut rd, mut wr) = stream.into_split();
        let limits = Limits::with_frame(ep.max_frame);
        tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(ep, &mut rd, &mut wr, limits))
            .await
            .map_err(|_| lost(ep, "no answer to the handshake".into()))??;
        let pending = Arc::new(Mutex::new(Pending::default()));
        let (outbox, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(wr, rx, ep.max_frame, pending.clone()));
        let reader = tokio::spawn(read_loop(rd, limits, pending.clone(), ep.clone(), monitor));
        Ok(Self {
            node: ep.node.clone(),
            addr: ep.addr.clone(),
            outbox,
            pending,
            next_id: AtomicU64::new(1),
            reader,
        })
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Sends `request` and waits for its answer; `None` = no answer within `timeout` (the
    /// call may still run on the worker).
    pub async fn call(&self, request: Request, timeout: Duration) -> Option<Answer> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Err(e) = self.send(id, request, Some(tx)) {
            return Some(Err(e));
        }
        let answer = tokio::time::timeout(timeout, rx).await;
        self.pending.lock().unwrap().waiting.remove(&id);
        match answer {
            Ok(Ok(a)) => Some(a),
            Ok(Err(_)) => Some(Err(self.lost_now())),
            Err(_) => None,
        }
    }

    /// Sends `request` without waiting for an answer.
    pub fn notify(&self, request: Request) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let _ = self.send(id, request, None);
    }

    fn send(
        &self,
        id: u64,
        request: Request,
        reply: Option<oneshot::Sender<Answer>>,
    ) -> Result<(), ClusterError> {
        let kind = request.kind();
        let bytes = encode_request(id, request).map_err(|e| ClusterError::Protocol {
            node: self.node.clone(),
            addr: self.addr.clone(),
            message: format!("cannot encode a {kind} request: {e}"),
        })?;
        {
            let mut p = self.pending.lock().unwrap();
            if p.closed.is_some() {
                drop(p);
                return Err(self.lost_now());
            }
            if let Some(tx) = reply {
                p.waiting.insert(id, tx);
            }
        }
        self.outbox.send(bytes).map_err(|_| self.lost_now())
    }

    fn lost_now(&self) -> ClusterError {
        let reason = self.pending.lock().unwrap().closed.clone();
        ClusterError::Lost {
            node: self.node.clone(),
            addr: self.addr.clone(),
            reason: reason.unwrap_or_else(|| "closed".into()),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
    }
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

/// Sends the [`Hello`] and reads the worker's verdict.
async fn handshake(
    ep: &Endpoint,
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    limits: Limits,
) -> Result<(), ClusterError> {
    let hello = Hello {
        protocol: PROTOCOL.into(),
        cookie: ep.cookie.clone().unwrap_or_default(),
    };
    let bytes = encode(&hello).map_err(|e| lost(ep, e.to_string()))?;
    write_message(wr, &bytes, ep.max_frame)
        .await
        .map_err(|e| lost(ep, format!("sending the handshake: {e}")))?;
    let answer = read_message(rd, limits)
        .await
        .map_err(|e| lost(ep, format!("reading the handshake: {e}")))?
        .ok_or_else(|| lost(ep, "closed during the handshake".into()))?;
    match decode::<HelloReply>(&answer) {
        Ok(HelloReply::Welcome) => Ok(()),
        Ok(HelloReply::Refused { reason }) => Err(ClusterError::Refused {
            node: ep.node.clone(),
            addr: ep.addr.clone(),
            reason,
        }),
        Err(e) => Err(ClusterError::Protocol {
            node: ep.node.clone(),
            addr: ep.addr.clone(),
            message: format!("the handshake answer does not decode: {e}"),
        }),
    }
}

/// Marks the connection closed and fails every waiting call.
fn close(pending: &Mutex<Pending>, reason: String) {
    let mut p = pending.lock().unwrap();
    p.closed.get_or_insert(reason);
    p.waiting.clear();
}

async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    max_frame: usize,
    pending: Arc<Mutex<Pending>>,
) {
    while let Some(bytes) = rx.recv().await {
        match write_message(&mut wr, &bytes, max_frame).await {
            Ok(n) => traffic::sent(n),
            Err(e) => return close(&pending, format!("sending: {e}")),
        }
    }
}

async fn read_loop(
    mut rd: OwnedReadHalf,
    limits: Limits,
    pending: Arc<Mutex<Pending>>,
    ep: Endpoint,
    monitor: MonitorHandle,
) {
    let mut closed_cleanly = false;
    let reason = loop {
        let bytes = match read_message(&mut rd, limits).await {
            Ok(Some(b)) => b,
            Ok(None) => {
                closed_cleanly = true;
                break "the worker closed the connection".to_string();
            }
            Err(FrameError::Io(e)) => break format!("the worker is gone ({e})"),
            Err(e) => break format!("bad frame from the worker: {e}"),
        };
        traffic::received(bytes.len() as u64);
        let (id, answer) = match decode_response(&bytes) {
            Ok(env) if env.id == EVENTS_ID => {
                report(&monitor, env.body);
                continue;
            }
            Ok(env) => (env.id, Ok(env.body)),
            // The call is known and the stream intact: only that call fails.
            Err(source @ DecodeError::Tensors { id, .. }) => (id, Err(bad_answer(&ep, source))),
            Err(e) => break format!("an answer that does not decode: {e}"),
        };
        let waiting = pending.lock().unwrap().waiting.remove(&id);
        if let Some(tx) = waiting {
            let _ = tx.send(answer);
        }
    };
    if closed_cleanly {
        tracing::debug!("node {} ({}): {reason}", ep.node, ep.addr);
    } else {
        tracing::warn!("node {} ({}): {reason}", ep.node, ep.addr);
    }
    close(&pending, reason);
}

fn bad_answer(ep: &Endpoint, source: DecodeError) -> ClusterError {
    tracing::warn!(
        "node {} ({}): a malformed answer: {source}",
        ep.node,
        ep.addr
    );
    ClusterError::BadAnswer {
        node: ep.node.clone(),
        addr: ep.addr.clone(),
        source: Box::new(source),
    }
}

/// Passes the hosted role's status changes and spans to `monitor` (a worker cannot
/// register actors, report metrics or end the run).
fn report(monitor: &MonitorHandle, body: Response) {
    let Response::Events(events) = body else {
        return;
    };
    for e in events {
        if matches!(e, MonitorEvent::ActorUpdate(_) | MonitorEvent::Span(_)) {
            monitor.report(e);
        }
    }
}
