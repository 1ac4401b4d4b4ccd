//! The dashboard's accept loop: hyper's HTTP/1 server behind a capped [`Door`] instead of
//! `axum::serve`, which has no header-read timeout and no connection cap. A connection must
//! send its request head within [`HEADER_TIMEOUT`] and in at most [`MAX_HEAD_BYTES`]; the
//! token (`auth.rs`) is checked as soon as the head is in, and no route reads a body. The
//! connections are capped in total and per peer address from the descriptor limit, and an
//! accept that fails (out of descriptors) is retried, so a flood of half-sent requests
//! neither stops the server nor takes the descriptors the training run needs.

use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use oxalign_actors::cluster::{Admission, Door};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// How long a connection may take to send a request head.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head read, bytes (hyper's read buffer).
pub(crate) const MAX_HEAD_BYTES: usize = 64 << 10;

/// Serves `router` on the connections of `door` until `stop` turns `true` (or its sender is
/// dropped); then stops accepting, lets each connection finish its response and waits for
/// them all.
pub(crate) async fn serve(door: Door, router: Router, mut stop: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => break,
            (stream, _peer, admission) = door.accept() => {
                let service = TowerToHyperService::new(router.clone());
                connections.spawn(connection(stream, service, admission, stop.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(door);
    while connections.join_next().await.is_some() {}
}

/// Serves one connection, holding its `admission` until it closes.
async fn connection(
    stream: TcpStream,
    service: TowerToHyperService<Router>,
    _admission: Admission,
    mut stop: watch::Receiver<bool>,
) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let finished = tokio::select! {
        finished = conn.as_mut() => finished,
        _ = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = finished {
        tracing::debug!("dashboard connection closed: {e}");
    }
}

/// Returns once `stop` is `true` or its sender is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
