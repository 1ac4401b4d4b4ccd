//! `oxalign worker`: a node that hosts role actors for a controller. It listens on one
//! address; each connection must open with a [`Hello`] carrying the worker's cookie (a
//! worker beyond loopback refuses to start without one), then asks for one role
//! ([`Request::Spawn`]) and calls it until it sends [`Request::Stop`] or goes away; either
//! way the role is stopped and its executors retired. Before or after its spawn a
//! connection may ask for the worker's devices and those its roles hold
//! ([`Request::Inventory`]). A connection that sends an oversized frame or bytes that do
//! not decode is closed; a call whose tensors are malformed is answered with the error
//! (naming the tensor) and the connection goes on; the worker and its other connections go
//! on either way. What the role reports to its monitor goes back to the controller on the
//! same connection (`relay.rs`).
//!
//! Hostile clients: connections are capped in total and per peer address (`door.rs`, from
//! the descriptor limit), and at most half of the places may be held by connections still
//! in their handshake; a failed accept (out of descriptors) is logged and retried, never
//! the end of the worker. The cookie is compared in constant time. The [`Hello`] is capped
//! at 4 KiB and must arrive within [`HELLO_TIMEOUT`]; after it, a message that stops
//! arriving midway is cut after [`STALL_TIMEOUT`], and a message's buffer grows with the
//! bytes that arrive, not with the lengths announced (`frame.rs`).

use super::call::{decode_request, encode_response};
use super::door::{Door, DoorCaps};
use super::error::{ConnectionError, DecodeError, WorkerError};
use super::frame::{read_message, write_message, Limits};
use super::host::HostedRole;
use super::inventory::{local_devices, Holdings};
use super::relay::{Flush, RelayHandle};
use super::wire::{decode, encode, Envelope, Hello, HelloReply, Request, Response, PROTOCOL};
use super::wire_error::WireError;
use crate::recipe::is_loopback_host;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// How long a new connection may take to send its [`Hello`].
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a message that has begun may go without a byte.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// The cap on a [`Hello`] (a protocol name and a cookie).
const HELLO_MAX: usize = 4096;
/// How long a role whose connection went away may take to stop.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// How a worker serves.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The cookie every connection must present; `None` = any (loopback only).
    pub cookie: Option<String>,
    /// Frame cap, bytes.
    pub max_frame: usize,
}

/// Binds `listen` (`host:port`; port 0 picks a free one). An address beyond loopback
/// needs `cookie`.
pub async fn bind(listen: &str, cookie: Option<&str>) -> Result<TcpListener, WorkerError> {
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
    TcpListener::bind(listen)
        .await
        .map_err(|source| WorkerError::Bind {
            addr: listen.to_string(),
            source,
        })
}

/// Accepts connections on `listener` until the process ends, each served on its own task,
/// within the caps of [`DoorCaps::from_descriptor_limit`]; never returns. The connections
/// share one register of the devices their roles hold, which an inventory request reports
/// with this machine's devices.
pub async fn serve(listener: TcpListener, cfg: WorkerConfig) -> std::convert::Infallible {
    let door = Door::new(listener, DoorCaps::from_descriptor_limit());
    let handshakes = Arc::new(Semaphore::new((door.caps().total / 2).max(1)));
    let cfg = Arc::new(cfg);
    let holdings = Holdings::new(local_devices());
    loop {
        let (stream, peer, admission) = door.accept().await;
        let Ok(handshake) = handshakes.clone().try_acquire_owned() else {
            tracing::debug!("{peer}: closed at once, too many connections in their handshake");
            continue;
        };
        let (cfg, holdings) = (cfg.clone(), holdings.clone());
        tokio::spawn(async move {
            let _admission = admission;
            if let Err(reason) = connection(stream, peer, handshake, &cfg, &holdings).await {
                tracing::warn!("connection from {peer} closed: {reason}");
            }
        });
    }
}

/// Compares two cookies in time independent of where they differ.
fn same_cookie(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The verdict on a [`Hello`].
fn judge(hello: &Hello, cfg: &WorkerConfig) -> HelloReply {
    if hello.protocol != PROTOCOL {
        return HelloReply::Refused {
            reason: format!("protocol {:?}, expected {PROTOCOL:?}", hello.protocol),
        };
    }
    match &cfg.cookie {
        Some(c) if !same_cookie(c, &hello.cookie) => HelloReply::Refused {
            reason: "wrong or missing cookie".into(),
        },
        _ => HelloReply::Welcome,
    }
}

/// Serves one connection: handshake (holding `handshake` until it is done), spawn, calls.
async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    handshake: OwnedSemaphorePermit,
    cfg: &WorkerConfig,
    holdings: &Holdings,
) -> Result<(), ConnectionError> {
    stream.set_nodelay(true).ok();
    let hello_limits = Limits {
        max_frame: HELLO_MAX,
        max_message: HELLO_MAX,
        stall: None,
    };
    let hello = tokio::time::timeout(HELLO_TIMEOUT, read_message(&mut stream, hello_limits))
        .await
        .map_err(|_| ConnectionError::HandshakeTimeout)?
        .map_err(|source| ConnectionError::Frame {
            during: "handshake",
            source,
        })?
        .ok_or(ConnectionError::ClosedBeforeHandshake)?;
    let hello: Hello = decode(&hello).map_err(|e| ConnectionError::Decode {
        what: "handshake",
        source: e.into(),
    })?;
    let verdict = judge(&hello, cfg);
    let bytes = encode(&verdict)?;
    write_message(&mut stream, &bytes, cfg.max_frame)
        .await
        .map_err(|source| ConnectionError::Frame {
            during: "reply",
            source,
        })?;
    if let HelloReply::Refused { reason } = verdict {
        return Err(ConnectionError::Refused { peer, reason });
    }
    drop(handshake);
    let (rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Envelope<Response>>();
    let max_frame = cfg.max_frame;
    let writer = tokio::spawn(async move {
        while let Some(env) = rx.recv().await {
            if write_message(&mut wr, &answer_bytes(env), max_frame)
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let (relay, monitor) = RelayHandle::start(tx.clone()).await;
    let r = calls(
        rd,
        Limits::with_frame(cfg.max_frame).stalling_after(STALL_TIMEOUT),
        &tx,
        monitor,
        relay.flusher(),
        holdings,
    )
    .await;
    relay.close().await;
    drop(tx);
    let _ = tokio::time::timeout(STOP_WAIT, writer).await;
    r
}

/// The bytes of answer `env`; one that cannot be encoded becomes a failed call.
fn answer_bytes(env: Envelope<Response>) -> Vec<u8> {
    let id = env.id;
    encode_response(id, env.body).unwrap_or_else(|e| {
        let failed = WireError::other(format!("the worker cannot encode its answer: {e}"), false);
        encode_response(id, Response::Failed(failed)).unwrap_or_default()
    })
}

/// The answer to a call whose tensors are malformed: the user's input, naming the tensor.
fn refused(e: &DecodeError) -> Response {
    Response::Failed(WireError::other(format!("a malformed request: {e}"), true))
}

/// Reads the spawn request and then the calls, until a stop, the end of the stream or a
/// bad message; inventory requests are answered from `holdings` at any point. The role
/// (reporting to `monitor`) holds its devices in `holdings` from its spawn until it is
/// stopped, and is always stopped before this returns.
async fn calls(
    mut rd: OwnedReadHalf,
    limits: Limits,
    tx: &mpsc::UnboundedSender<Envelope<Response>>,
    monitor: crate::monitor::MonitorHandle,
    flush: Flush,
    holdings: &Holdings,
) -> Result<(), ConnectionError> {
    let reply = |id, body| {
        let _ = tx.send(Envelope { id, body });
    };
    let Some(first) = first_call(&mut rd, limits, &reply, holdings).await? else {
        return Ok(());
    };
    let Request::Spawn(spec) = first.body else {
        reply(
            first.id,
            Response::Failed(WireError::other(
                "the first request must be a spawn".into(),
                true,
            )),
        );
        return Err(ConnectionError::NoSpawn);
    };
    let kind = spec.kind;
    let host = match HostedRole::spawn(*spec, monitor).await {
        Ok(h) => h,
        Err(e) => {
            reply(first.id, Response::Failed(e));
            return Err(ConnectionError::Spawn(kind.name()));
        }
    };
    let hold = holdings.hold(host.name, &host.group.specs);
    reply(first.id, Response::Spawned(host.group.names()));
    let outcome = loop {
        let env = match next(&mut rd, limits).await {
            Ok(Some(Incoming::Call(env))) => env,
            Ok(Some(Incoming::Bad { id, error })) => {
                tracing::warn!("refused call {id}: {error}");
                reply(id, refused(&error));
                continue;
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        match env.body {
            Request::Stop(ms) => {
                host.stop(Duration::from_millis(ms).max(Duration::from_secs(1)))
                    .await;
                drop(hold);
                reply(env.id, Response::Done);
                return Ok(());
            }
            Request::Inventory => reply(env.id, Response::Inventory(holdings.inventory())),
            Request::Spawn(_) => reply(
                env.id,
                Response::Failed(WireError::other(
                    "this connection already hosts a role".into(),
                    true,
                )),
            ),
            request => answer(&host, env.id, request, tx, &flush).await,
        }
    };
    host.stop(STOP_WAIT).await;
    drop(hold);
    outcome
}

/// The connection's first request other than an inventory request (those are answered
/// here); `None` when the stream ends first.
async fn first_call(
    rd: &mut OwnedReadHalf,
    limits: Limits,
    reply: &impl Fn(u64, Response),
    holdings: &Holdings,
) -> Result<Option<Envelope<Request>>, ConnectionError> {
    loop {
        match next(rd, limits).await? {
            None => return Ok(None),
            Some(Incoming::Call(Envelope {
                id,
                body: Request::Inventory,
            })) => reply(id, Response::Inventory(holdings.inventory())),
            Some(Incoming::Call(env)) => return Ok(Some(env)),
            Some(Incoming::Bad { id, error }) => {
                reply(id, refused(&error));
                return Err(ConnectionError::BadFirst(error));
            }
        }
    }
}

/// Starts answering `request`: polled once here, so the role's actor receives calls in
/// the order they arrived; the rest runs on its own task. The answer is sent after the
/// role's reports (`flush`).
async fn answer(
    host: &HostedRole,
    id: u64,
    request: Request,
    tx: &mpsc::UnboundedSender<Envelope<Response>>,
    flush: &Flush,
) {
    let mut fut = host.answer(request);
    let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
    match first {
        Poll::Ready(body) => {
            flush.flush().await;
            let _ = tx.send(Envelope { id, body });
        }
        Poll::Pending => {
            let (tx, flush) = (tx.clone(), flush.clone());
            tokio::spawn(async move {
                let body = fut.await;
                flush.flush().await;
                let _ = tx.send(Envelope { id, body });
            });
        }
    }
}

/// A request as read: a call, or a call whose tensors are malformed.
enum Incoming {
    /// A whole call.
    Call(Envelope<Request>),
    /// Call `id`, refused for `error`.
    Bad {
        /// The call's id.
        id: u64,
        /// What is wrong with its tensors.
        error: DecodeError,
    },
}

/// The next request, `None` at the end of the stream. A message that does not decode at
/// all is an error (the connection closes); one whose tensors do not is [`Incoming::Bad`].
async fn next(rd: &mut OwnedReadHalf, limits: Limits) -> Result<Option<Incoming>, ConnectionError> {
    match read_message(rd, limits).await {
        Ok(Some(bytes)) => match decode_request(&bytes) {
            Ok(env) => Ok(Some(Incoming::Call(env))),
            Err(error @ DecodeError::Tensors { id, .. }) => Ok(Some(Incoming::Bad { id, error })),
            Err(source) => Err(ConnectionError::Decode {
                what: "a request",
                source,
            }),
        },
        Ok(None) => Ok(None),
        Err(source) => Err(ConnectionError::Frame {
            during: "request",
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_and_protocol_decide_the_handshake() {
        let cfg = WorkerConfig {
            cookie: Some("s3cret".into()),
            max_frame: 1 << 20,
        };
        let hello = |cookie: &str| Hello {
            protocol: PROTOCOL.into(),
            cookie: cookie.into(),
        };
        assert!(matches!(judge(&hello("s3cret"), &cfg), HelloReply::Welcome));
        assert!(matches!(
            judge(&hello(""), &cfg),
            HelloReply::Refused { .. }
        ));
        assert!(matches!(
            judge(&hello("s3cre"), &cfg),
            HelloReply::Refused { .. }
        ));
        let other = Hello {
            protocol: "http/1.1".into(),
            cookie: "s3cret".into(),
        };
        assert!(matches!(judge(&other, &cfg), HelloReply::Refused { .. }));
        let open = WorkerConfig {
            cookie: None,
            ..cfg
        };
        assert!(matches!(judge(&hello(""), &open), HelloReply::Welcome));
    }
}
