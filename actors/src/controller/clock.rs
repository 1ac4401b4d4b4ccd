//! [`WallClock`]: a run's wall time across resumes.

/// Seconds of wall time of this run before the current process, and when it started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WallClock {
    /// Seconds spent before this process (from the checkpoint resumed).
    pub prior: f64,
    /// When this process started.
    pub started: std::time::Instant,
}

impl WallClock {
    /// Wall seconds of the run so far, across resumes.
    pub fn now(&self) -> f64 {
        self.prior + self.started.elapsed().as_secs_f64()
    }
}
