//! Nodes from a Slurm allocation: with `[cluster] slurm = true`, node `nodeK` is the K-th
//! host (1-based) of `SLURM_JOB_NODELIST`, reached at `cluster.port`, where `srun oxalign
//! worker` listens by default. Only the host list is read here; nothing is started.

use std::collections::BTreeMap;

/// The variable holding the allocation's hosts.
pub const NODELIST_ENV: &str = "SLURM_JOB_NODELIST";

/// Expands a Slurm host list (`"gpu[01-03,07],login1"`) into host names in order.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for item in split_top(list) {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let Some(open) = item.find('[') else {
            hosts.push(item.to_string());
            continue;
        };
        let close = item
            .rfind(']')
            .filter(|c| *c > open)
            .ok_or_else(|| format!("{item:?}: a '[' without its ']'"))?;
        let (prefix, suffix) = (&item[..open], &item[close + 1..]);
        for range in item[open + 1..close].split(',') {
            for n in expand_range(range).map_err(|e| format!("{item:?}: {e}"))? {
                hosts.push(format!("{prefix}{n}{suffix}"));
            }
        }
    }
    if hosts.is_empty() {
        return Err(format!("{list:?}: no hosts"));
    }
    Ok(hosts)
}

/// Splits at the commas outside brackets.
fn split_top(list: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0usize, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&list[start..]);
    out
}

/// `"01-03"` → `["01", "02", "03"]` (zero padding kept); `"7"` → `["7"]`.
fn expand_range(range: &str) -> Result<Vec<String>, String> {
    let range = range.trim();
    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
    let bad = || format!("{range:?} is not N or N-M");
    let (a, b): (u64, u64) = (
        lo.parse().map_err(|_| bad())?,
        hi.parse().map_err(|_| bad())?,
    );
    if a > b {
        return Err(bad());
    }
    let width = lo.len();
    Ok((a..=b).map(|n| format!("{n:0width$}")).collect())
}

/// `node1 = "HOST1:port"`, ... for the hosts of `SLURM_JOB_NODELIST`.
pub fn slurm_nodes(port: u16) -> Result<BTreeMap<String, String>, String> {
    let list = std::env::var(NODELIST_ENV)
        .map_err(|_| format!("{NODELIST_ENV} is not set (not inside a Slurm allocation?)"))?;
    let hosts = expand_hostlist(&list).map_err(|e| format!("{NODELIST_ENV}={e}"))?;
    Ok(hosts
        .into_iter()
        .enumerate()
        .map(|(i, h)| (format!("node{}", i + 1), format!("{h}:{port}")))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_expand_in_order_with_padding() {
        assert_eq!(
            expand_hostlist("gpu[01-03,07],login1").unwrap(),
            ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
        );
        assert_eq!(
            expand_hostlist("127.0.0.[1-2]").unwrap(),
            ["127.0.0.1", "127.0.0.2"]
        );
        assert_eq!(expand_hostlist("a,b").unwrap(), ["a", "b"]);
        assert!(expand_hostlist("n[3-1]").is_err());
        assert!(expand_hostlist("n[1-2").is_err());
        assert!(expand_hostlist("").is_err());
    }
}
