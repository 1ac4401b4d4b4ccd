//! The dashboard's HTTP routes: `/` (page), `/api/state` (JSON), `/api/events` (SSE),
//! `/metrics` (Prometheus), `/healthz`. Access control and headers are applied around them
//! in `server.rs`; the data comes from a `Source`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::Stream;
use oxalign_actors::monitor::MonitorEvent;
use tokio::sync::{broadcast, watch};

use super::page;
use super::prometheus;
use super::source::{Relay, Source, StateView};

/// Shared by every handler.
#[derive(Clone)]
pub(crate) struct App {
    pub(crate) source: Arc<Source>,
    /// Turns `true` when the server shuts down; open event streams end then.
    pub(crate) shutdown: watch::Receiver<bool>,
}

/// The routes, without access control (see `server.rs`).
pub(crate) fn router(app: App) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/api/state", get(state))
        .route("/api/events", get(events))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .with_state(app)
}

async fn index() -> Response {
    let mut resp = Html(page::html()).into_response();
    // everything is inline; the page may talk to this server only
    resp.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'",
        ),
    );
    resp
}

async fn state(State(app): State<App>) -> Json<StateView> {
    Json(app.source.state())
}

async fn metrics(State(app): State<App>) -> Response {
    let view = app.source.state();
    let body = prometheus::render(&view.snapshot, view.now_unix_ms);
    ([(header::CONTENT_TYPE, prometheus::CONTENT_TYPE)], body).into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn not_found() -> (StatusCode, &'static str) {
    (StatusCode::NOT_FOUND, "404 Not Found\n")
}

fn snapshot_event(view: &StateView) -> Event {
    match serde_json::to_string(view) {
        Ok(json) => Event::default()
            .event("snapshot")
            .data(json)
            .retry(Duration::from_millis(2000)),
        Err(e) => Event::default().comment(format!("cannot encode snapshot: {e}")),
    }
}

fn monitor_event(event: &MonitorEvent) -> Event {
    match serde_json::to_string(event) {
        Ok(json) => Event::default().event("monitor").data(json),
        Err(e) => Event::default().comment(format!("cannot encode event: {e}")),
    }
}

fn end_event(reason: &str) -> Event {
    Event::default().event("end").data(reason)
}

/// Where one event stream is.
enum Phase {
    /// Send this snapshot next, then follow the receiver (or end if there is none).
    Start(Box<Event>, Option<broadcast::Receiver<Relay>>),
    /// Follow the relay.
    Live(broadcast::Receiver<Relay>),
    /// Send this last event, then close.
    Last(Box<Event>),
    Done,
}

/// `/api/events`: an SSE stream that opens with a `snapshot` event (same JSON as
/// `/api/state`), then sends one `monitor` event per `MonitorEvent` (`{"type":..,"data":..}`).
/// A stream that falls behind gets a fresh `snapshot`. When the monitor stops (or for a
/// replayed run, right after the snapshot) an `end` event (data `monitor stopped` or
/// `replay`) closes the stream.
async fn events(State(app): State<App>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (view, rx) = app.source.subscribe();
    let end_reason = if view.mode == "replay" {
        "replay"
    } else {
        "monitor stopped"
    };
    let start = Phase::Start(Box::new(snapshot_event(&view)), rx);
    let stream = futures::stream::unfold((start, app), move |(phase, mut app)| async move {
        match phase {
            Phase::Done => None,
            Phase::Start(first, Some(rx)) => Some((Ok(*first), (Phase::Live(rx), app))),
            Phase::Start(first, None) => {
                // nothing will follow: send the snapshot, then `end`
                let end = Box::new(end_event(end_reason));
                Some((Ok(*first), (Phase::Last(end), app)))
            }
            Phase::Last(event) => Some((Ok(*event), (Phase::Done, app))),
            Phase::Live(mut rx) => {
                if *app.shutdown.borrow() {
                    return None;
                }
                tokio::select! {
                    received = rx.recv() => match received {
                        Ok(Relay::Event(event)) => {
                            Some((Ok(monitor_event(&event)), (Phase::Live(rx), app)))
                        }
                        Ok(Relay::Resync(view)) => {
                            Some((Ok(snapshot_event(&view)), (Phase::Live(rx), app)))
                        }
                        Ok(Relay::Ended) | Err(broadcast::error::RecvError::Closed) => {
                            Some((Ok(end_event("monitor stopped")), (Phase::Done, app)))
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            // this page fell behind: start it over from a fresh snapshot
                            let (view, rx) = app.source.subscribe();
                            let first = snapshot_event(&view);
                            let next = match rx {
                                Some(rx) => Phase::Live(rx),
                                None => Phase::Last(Box::new(end_event("monitor stopped"))),
                            };
                            Some((Ok(first), (next, app)))
                        }
                    },
                    _ = app.shutdown.changed() => None,
                }
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
