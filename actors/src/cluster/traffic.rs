//! Bytes this process moved over cluster connections (frame headers included when sent;
//! payloads when received), and the refit buckets sent to an engine role
//! (`placement.engine`), for the run's report (`cluster traffic: ...` at the end of
//! `oxalign train`) and `docs/PERFORMANCE.md`.

use std::sync::atomic::{AtomicU64, Ordering};

static SENT: AtomicU64 = AtomicU64::new(0);
static RECEIVED: AtomicU64 = AtomicU64::new(0);
static REFIT_BYTES: AtomicU64 = AtomicU64::new(0);
static REFITS: AtomicU64 = AtomicU64::new(0);

/// Counts one refit that sent `bytes` of buckets to an engine role.
pub fn count_refit(bytes: u64) {
    REFIT_BYTES.fetch_add(bytes, Ordering::Relaxed);
    REFITS.fetch_add(1, Ordering::Relaxed);
}

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
    /// Refit bucket bytes sent to an engine role (part of `sent` when it is on a node).
    pub refit_bytes: u64,
    /// Refits that sent them.
    pub refits: u64,
}

/// The totals so far.
pub fn traffic() -> Traffic {
    Traffic {
        sent: SENT.load(Ordering::Relaxed),
        received: RECEIVED.load(Ordering::Relaxed),
        refit_bytes: REFIT_BYTES.load(Ordering::Relaxed),
        refits: REFITS.load(Ordering::Relaxed),
    }
}
