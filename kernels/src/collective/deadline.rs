//! [`Deadline`]: waiting for an asynchronous collective with a time limit. A GPU collective
//! is queued on a stream and completes later, or never when a peer is missing; the caller
//! polls for completion until the deadline and then gets [`CollectiveError::Timeout`] naming
//! the operation and the rank, instead of hanging. This file knows nothing about CUDA: the
//! poll is a closure, so the logic is tested on the CPU.

use super::CollectiveError;
use std::time::{Duration, Instant};

/// The time limit of one collective call on one rank.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    rank: usize,
    op: &'static str,
    start: Instant,
    timeout: Duration,
}

/// Longest sleep between two polls.
const MAX_BACKOFF: Duration = Duration::from_millis(2);

impl Deadline {
    /// A deadline `timeout` from now for rank `rank`'s `op`.
    pub fn new(rank: usize, op: &'static str, timeout: Duration) -> Self {
        Self {
            rank,
            op,
            start: Instant::now(),
            timeout,
        }
    }

    /// Time left before the limit (zero once it has passed).
    pub fn remaining(&self) -> Duration {
        self.timeout.saturating_sub(self.start.elapsed())
    }

    /// True once the time limit has passed.
    pub fn expired(&self) -> bool {
        self.start.elapsed() >= self.timeout
    }

    /// The timeout error for this call: `missing` are the ranks known not to have arrived
    /// (empty when, as on a GPU, which peer is late cannot be known).
    pub fn timeout_error(&self, missing: Vec<usize>) -> CollectiveError {
        CollectiveError::Timeout {
            rank: self.rank,
            op: self.op,
            waited: self.start.elapsed(),
            missing,
        }
    }

    /// Calls `done` until it returns `Ok(true)`, sleeping a little longer each time (spinning
    /// first, then up to 2 ms), and returns `Ok(())`; an error from `done` is returned at
    /// once. Past the deadline it returns [`CollectiveError::Timeout`] without calling
    /// `done` again; the caller then aborts whatever it was waiting for.
    pub fn wait<F>(&self, mut done: F) -> Result<(), CollectiveError>
    where
        F: FnMut() -> Result<bool, CollectiveError>,
    {
        let mut pause = Duration::from_micros(1);
        loop {
            if done()? {
                return Ok(());
            }
            if self.expired() {
                return Err(self.timeout_error(Vec::new()));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_BACKOFF);
        }
    }
}
