//! Nodes from a Slurm allocation: with `[cluster] slurm = true`, node `nodeK` is the K-th
//! host (1-based) of `SLURM_JOB_NODELIST`, reached at `cluster.port`, where `srun oxalign
//! worker` listens by default. Only the host list is read here; nothing is started.

use std::collections::BTreeMap;

/// The variable holding the allocation's hosts.
pub(crate) const NODELIST_ENV: &str = "SLURM_JOB_NODELIST";

/// Why a Slurm host list does not expand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostListError {
    /// A `[` without its `]`.
    #[error("{item:?}: a '[' without its ']'")]
    Unclosed {
        /// The list item.
        item: String,
    },
    /// A bracket range that is not `N` or `N-M` with `N <= M`.
    #[error("{item:?}: {range:?} is not N or N-M")]
    BadRange {
        /// The list item.
        item: String,
        /// The range inside its brackets.
        range: String,
    },
    /// The list names no host.
    #[error("{list:?}: no hosts")]
    Empty {
        /// The whole list.
        list: String,
    },
}

/// Why the allocation's nodes cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlurmError {
    /// Not inside a Slurm allocation.
    #[error("{NODELIST_ENV} is not set (not inside a Slurm allocation?)")]
    NotSet,
    /// The host list is malformed.
    #[error("{NODELIST_ENV}={0}")]
    HostList(#[from] HostListError),
}

/// Expands a Slurm host list (`"gpu[01-03,07],login1"`) into host names in order.
pub(crate) fn expand_hostlist(list: &str) -> Result<Vec<String>, HostListError> {
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
        let close =
            item.rfind(']')
                .filter(|c| *c > open)
                .ok_or_else(|| HostListError::Unclosed {
                    item: item.to_string(),
                })?;
        let (prefix, suffix) = (&item[..open], &item[close + 1..]);
        for range in item[open + 1..close].split(',') {
            let numbers = expand_range(range).ok_or_else(|| HostListError::BadRange {
                item: item.to_string(),
                range: range.trim().to_string(),
            })?;
            for n in numbers {
                hosts.push(format!("{prefix}{n}{suffix}"));
            }
        }
    }
    if hosts.is_empty() {
        return Err(HostListError::Empty {
            list: list.to_string(),
        });
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

/// `"01-03"` → `["01", "02", "03"]` (zero padding kept); `"7"` → `["7"]`; `None` unless
/// the range is `N` or `N-M` with `N <= M`.
fn expand_range(range: &str) -> Option<Vec<String>> {
    let range = range.trim();
    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
    let (a, b): (u64, u64) = (lo.parse().ok()?, hi.parse().ok()?);
    if a > b {
        return None;
    }
    let width = lo.len();
    Some((a..=b).map(|n| format!("{n:0width$}")).collect())
}

/// `node1 = "HOST1:port"`, ... for the hosts of `SLURM_JOB_NODELIST`.
pub(crate) fn slurm_nodes(port: u16) -> Result<BTreeMap<String, String>, SlurmError> {
    let list = std::env::var(NODELIST_ENV).map_err(|_| SlurmError::NotSet)?;
    let hosts = expand_hostlist(&list)?;
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
