//! What may stand as the host of a node's address: an RFC 1123 host name or an IP literal.
//! The host is dialled by the controller and handed to ssh by `oxalign launch`, so anything
//! else (a shell word such as `$(...)`, a leading `-` that ssh would read as an option) is
//! refused before it gets there.

use std::net::IpAddr;

/// Longest host name (RFC 1123 §2.1, without the trailing dot).
const MAX_NAME: usize = 253;
/// Longest label of a host name.
const MAX_LABEL: usize = 63;

/// `true` when `host` is an IPv4 or IPv6 literal (without brackets) or an RFC 1123 host
/// name: dot-separated labels of 1 to 63 ASCII letters, digits and `-`, none starting or
/// ending with `-`, at most 253 characters in all (a trailing dot allowed).
pub(crate) fn valid_host(host: &str) -> bool {
    if host.parse::<IpAddr>().is_ok() {
        return true;
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    !name.is_empty() && name.len() <= MAX_NAME && name.split('.').all(valid_label)
}

/// One label of a host name.
fn valid_label(label: &str) -> bool {
    let b = label.as_bytes();
    (1..=MAX_LABEL).contains(&b.len())
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ip_literals_pass_shell_words_do_not() {
        for ok in [
            "node1",
            "gpu-07.cluster.example.org",
            "localhost",
            "10.0.0.5",
            "::1",
            "::ffff:127.0.0.1",
            "fe80::1",
            "a.b.",
            "123",
        ] {
            assert!(valid_host(ok), "{ok}");
        }
        let long_label = "a".repeat(64);
        let long_name = ["abcdefghi"; 26].join(".");
        for bad in [
            "",
            ".",
            "h$(touch${IFS}/tmp/x).x",
            "-oProxyCommand=sh",
            "node1;reboot",
            "a b",
            "a..b",
            "-a.b",
            "a-.b",
            "under_score",
            "user@host",
            "`id`",
            long_label.as_str(),
            long_name.as_str(),
        ] {
            assert!(!valid_host(bad), "{bad:?}");
        }
    }
}
