//! The live monitoring dashboard: an HTTP server (axum) over a `Monitor` (live) or a run
//! directory (replay), serving one self-contained page, a JSON snapshot, a server-sent-event
//! stream and Prometheus metrics. It trains nothing and keeps no state of its own.
//!
//! Routes (all behind the token when one is set):
//! * `/`: the page (HTML with inline CSS/JS, no network beyond this server);
//! * `/api/state`: [`StateView`] as JSON;
//! * `/api/events`: SSE; a `snapshot` event, then one `monitor` event per
//!   [`MonitorEvent`](oxalign_actors::monitor::MonitorEvent), and `end` when the source
//!   has no more events;
//! * `/metrics`: Prometheus text exposition (`oxalign_step`, `oxalign_reward_mean`,
//!   `oxalign_kl`, `oxalign_actor_status{actor,status}`, ...);
//! * `/healthz`: `ok`.

mod accept;
mod auth;
mod error;
mod page;
mod prometheus;
mod routes;
mod server;
mod source;

pub use error::DashboardError;
pub use page::html as page_html;
pub use prometheus::render as render_prometheus;
pub use server::{check_access, serve, serve_live, spawn, DashboardServer, DEFAULT_ADDR};
pub use source::{DashboardSource, StateView};
