//! What a benchmark reads of its own process from `/proc` (Linux): CPU seconds used and the
//! peak resident set. `None` where the file or the field is missing (other systems).

use std::path::Path;

/// User + system CPU time of this process (all threads) from a `/proc/<pid>/stat` file, in
/// seconds (fields 14 and 15, in USER_HZ = 100 ticks per second on Linux); `None` when the
/// file is missing or malformed.
pub fn process_cpu_seconds(stat: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(stat).ok()?;
    // The command name (field 2) may hold spaces; fields after its closing ')' are plain.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state), so utime (14) and stime (15) are at 11 and 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// The `VmHWM` (peak resident set) line of a `/proc/<pid>/status` file, in bytes; `None` when
/// the file or the line is missing (non-Linux systems).
pub fn peak_rss_bytes(status: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(status).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}
