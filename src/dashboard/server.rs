//! Starting and stopping the dashboard: address and token checks, binding, access control
//! and common headers around the routes, graceful shutdown. What is served is in `routes.rs`;
//! the accept loop, with its connection caps and header timeout, in `accept.rs`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::Response;
use oxalign_actors::cluster::{Door, DoorCaps};
use oxalign_actors::monitor::MonitorHandle;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::accept;
use super::auth::{self, Access};
use super::error::DashboardError;
use super::routes::{self, App};
use super::source::{DashboardSource, Source};

/// Default listening address of `oxalign dashboard` and `oxalign train --dashboard`.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8265";

/// A dashboard running in the background on the current tokio runtime.
#[derive(Debug)]
pub struct DashboardServer {
    addr: SocketAddr,
    token: Option<Arc<str>>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<std::io::Result<()>>,
    source: Arc<Source>,
    /// Task mirroring a live monitor (ends by itself when the monitor stops).
    mirror: Option<JoinHandle<()>>,
}

impl DashboardServer {
    /// The address actually bound (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The page's URL, with `?token=` when a token is set (for printing to the user).
    pub fn url(&self) -> String {
        match &self.token {
            Some(t) => format!("http://{}/?token={t}", self.addr),
            None => format!("http://{}/", self.addr),
        }
    }

    /// Number of page event streams (`/api/events`) open now; a browser showing a live
    /// run holds one.
    pub fn event_streams(&self) -> usize {
        self.source.streams()
    }

    /// Stops accepting requests, ends open event streams and waits for the server to stop.
    pub async fn shutdown(self) -> Result<(), DashboardError> {
        let _ = self.shutdown.send(true);
        self.wait().await
    }

    /// Serves until Ctrl-C (then shuts down gracefully) or until the server fails.
    pub async fn run_until_ctrl_c(mut self) -> Result<(), DashboardError> {
        let finished = tokio::select! {
            _ = tokio::signal::ctrl_c() => {
                let _ = self.shutdown.send(true);
                (&mut self.task).await
            }
            finished = &mut self.task => finished,
        };
        if let Some(mirror) = self.mirror.take() {
            mirror.abort();
        }
        finish(finished)
    }

    /// Waits until the server stops (it only stops by itself on an I/O error).
    pub async fn wait(self) -> Result<(), DashboardError> {
        let result = finish(self.task.await);
        if let Some(mirror) = self.mirror {
            mirror.abort();
        }
        result
    }
}

/// Adds headers every response carries: no caching (the data is live), no MIME sniffing,
/// no referrer (the URL may hold the token).
async fn common_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

/// Refuses what [`spawn`] would refuse before binding: an invalid `token`, or a
/// non-loopback `addr` without one. `oxalign train` calls it before it creates the run
/// folder, so a refused dashboard leaves nothing behind.
pub fn check_access(addr: SocketAddr, token: Option<&str>) -> Result<(), DashboardError> {
    match token {
        Some(t) if !auth::valid_token(t) => Err(DashboardError::BadToken),
        None if !addr.ip().is_loopback() => Err(DashboardError::TokenRequired { addr }),
        _ => Ok(()),
    }
}

/// Binds `addr` and serves `source` in the background.
///
/// * `addr`: use `127.0.0.1:0` for a free port. A non-loopback address (e.g. `0.0.0.0`)
///   is refused unless `token` is set.
/// * `token`: when set, every request (page, API, event stream, `/metrics`, `/healthz`)
///   must carry it as `Authorization: Bearer TOKEN` or `?token=TOKEN`, else 401. It must be
///   1 to 256 printable ASCII characters without spaces.
///
/// Connections are capped in total and per peer from the descriptor limit, and each must
/// send its request head within 10 s (`accept.rs`).
///
/// Must be called inside a tokio runtime.
pub async fn spawn(
    addr: SocketAddr,
    token: Option<String>,
    source: DashboardSource,
) -> Result<DashboardServer, DashboardError> {
    check_access(addr, token.as_deref())?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| DashboardError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| DashboardError::Bind { addr, source })?;
    // after binding, so a failed bind leaves no mirroring task behind
    let (source, mirror) = Source::resolve(source).await?;
    let source = Arc::new(source);

    let token: Option<Arc<str>> = token.map(Arc::from);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let app = App {
        source: source.clone(),
        shutdown: shutdown_rx.clone(),
    };
    let router = routes::router(app)
        .layer(middleware::from_fn_with_state(
            Access {
                token: token.clone(),
            },
            auth::check,
        ))
        .layer(middleware::from_fn(common_headers));

    let door = Door::new(listener, DoorCaps::from_descriptor_limit());
    let task = tokio::spawn(async move {
        accept::serve(door, router, shutdown_rx).await;
        Ok(())
    });
    tracing::info!(addr = %local, "dashboard listening");
    Ok(DashboardServer {
        addr: local,
        token,
        shutdown: shutdown_tx,
        task,
        source,
        mirror,
    })
}

/// Serves `source` on `addr` until Ctrl-C (see [`spawn`] for `addr` and `token`).
pub async fn serve(
    addr: SocketAddr,
    token: Option<String>,
    source: DashboardSource,
) -> Result<(), DashboardError> {
    spawn(addr, token, source).await?.run_until_ctrl_c().await
}

fn finish(
    joined: Result<std::io::Result<()>, tokio::task::JoinError>,
) -> Result<(), DashboardError> {
    match joined {
        Ok(result) => result.map_err(DashboardError::Serve),
        Err(join) => Err(DashboardError::Serve(std::io::Error::other(join))),
    }
}

/// Serves a live monitor in the background, for `oxalign train RECIPE --dashboard ADDR`.
/// Same rules as [`spawn`]; stop it with [`DashboardServer::shutdown`] when training ends.
pub async fn serve_live(
    addr: SocketAddr,
    token: Option<String>,
    monitor: MonitorHandle,
) -> Result<DashboardServer, DashboardError> {
    spawn(addr, token, DashboardSource::Live(monitor)).await
}
