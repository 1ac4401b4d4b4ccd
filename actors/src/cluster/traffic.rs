//! Bytes this process moved over cluster connections (frame headers included when sent;
//! payloads when received), for the run's report and `docs/PERFORMANCE.md`.

use std::sync::atomic::{AtomicU64, Ordering};

static SENT: AtomicU64 = AtomicU64::new(0);
static RECEIVED: AtomicU64 = AtomicU64::new(0);

/// Counts `n` bytes sent.
pub(crate) fn sent(n: u64) {
    SENT.fetch_add(n, Ordering::Relaxed);
}

/// Counts `n` bytes received.
pub(crate) fn received(n: u64) {
    RECEIVED.fetch_add(n, Ordering::Relaxed);
}

/// Bytes sent and received so far by this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Traffic {
    /// Sent, bytes.
    pub sent: u64,
    /// Received, bytes.
    pub received: u64,
}

/// The totals so far.
pub fn traffic() -> Traffic {
    Traffic {
        sent: SENT.load(Ordering::Relaxed),
        received: RECEIVED.load(Ordering::Relaxed),
    }
}
