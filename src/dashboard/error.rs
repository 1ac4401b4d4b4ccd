//! Errors of the dashboard server: refusing an unsafe bind, failing to bind, failing to load
//! a replayed run. Errors inside a request become HTTP statuses instead (see `routes.rs`).

use std::net::SocketAddr;
use std::path::PathBuf;

use oxalign_actors::monitor::MonitorError;

/// Why the dashboard could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// A non-loopback address was asked for without a token.
    #[error(
        "refusing to serve the dashboard on {addr} without a token: it is not a loopback \
         address, so anyone who can reach it could read the run; pass --token TOKEN (or \
         bind 127.0.0.1)"
    )]
    TokenRequired {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The token is empty or holds characters that cannot travel in a header and a URL.
    #[error(
        "invalid dashboard token: expected 1 to 256 printable ASCII characters without \
         spaces"
    )]
    BadToken,
    /// The socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The replayed run directory could not be loaded.
    #[error("cannot replay run {dir}: {source}")]
    Replay {
        /// The run directory.
        dir: PathBuf,
        /// What was wrong with it.
        #[source]
        source: MonitorError,
    },
    /// The server failed while running.
    #[error("dashboard server failed: {0}")]
    Serve(#[source] std::io::Error),
}
