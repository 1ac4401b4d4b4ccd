//! The machine's total memory (`MemTotal` of `/proc/meminfo`), the bound that recipe and
//! config checks hold sizes against before anything is allocated. It allocates nothing.

/// Total memory of this machine in bytes, when `/proc/meminfo` can be read (Linux).
pub fn total_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_total(&text)
}

/// The `MemTotal:` line of a `/proc/meminfo` text, in bytes.
pub(crate) fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    let unit = match words.next() {
        Some("kB") => 1024,
        None => 1,
        Some(_) => return None,
    };
    value.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:         1000 kB\n";
        assert_eq!(parse_mem_total(text), Some(24_576_000 * 1024));
        assert_eq!(parse_mem_total("MemFree: 5 kB\n"), None);
        assert!(total_memory_bytes().is_none_or(|b| b > 0));
    }
}
