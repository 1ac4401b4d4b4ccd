//! Wall-clock helper shared by the monitor types: milliseconds since the Unix epoch.
//! It deliberately offers no monotonic time; spans and heartbeats are wall-clock stamps.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (UTC) now; 0 if the system clock is before 1970.
pub fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
