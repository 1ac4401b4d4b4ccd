//! `[cluster]`: the worker nodes a recipe may place roles on (`placement.<role> =
//! "node1:cpu"`), where the cookie comes from, and how long to wait for a node; with its
//! checks. The transport itself is `crate::cluster`.

use super::host_name::valid_host;
use super::slurm::SlurmError;
use super::{Recipe, RecipeError, RunKind};
use crate::cluster::TlsFiles;
use crate::placement::RolePlacement;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

/// The environment variable a cookie is read from unless `cluster.cookie_env` says otherwise.
pub const DEFAULT_COOKIE_ENV: &str = "OXALIGN_COOKIE";

/// `[cluster]`: worker nodes by name. Unused (and not written to `recipe.toml`) while every
/// role is placed in this process.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// Node name → `host:port` where its `oxalign worker --listen` accepts, e.g.
    /// `{ node1 = "127.0.0.1:7101" }`. Default none.
    pub nodes: BTreeMap<String, String>,
    /// The environment variable holding the shared cookie (never the cookie itself, so a
    /// recipe can be committed). Required to be set when a node is not on loopback. Default
    /// `"OXALIGN_COOKIE"`.
    pub cookie_env: String,
    /// Seconds to wait for a node's worker to accept a connection, at the start and when a
    /// node's roles are restarted after a failure (a new worker may take that long to join).
    /// Default `30`.
    pub connect_timeout_s: f64,
    /// Largest message a node session sends or accepts, MiB (a frame above it ends the
    /// session before its payload is read). Default `1024`.
    pub max_message_mb: usize,
    /// Inside a Slurm allocation: node `nodeK` is the K-th host of `SLURM_JOB_NODELIST` at
    /// `cluster.port` (where `srun oxalign worker` listens by default); a name also in
    /// `nodes` keeps its address there. Default `false`.
    pub slurm: bool,
    /// The workers' port with `slurm = true`. Default `7101`.
    pub port: u16,
    /// Nodes (names in `nodes`, or Slurm's) that take over a role when the node its
    /// placement names accepts no connection within `connect_timeout_s`, at the start or
    /// when the role is restarted after a failure; tried in order, and the first that
    /// accepts hosts the role (with the devices its placement names). Default none.
    pub spare_nodes: Vec<String>,
    /// Largest refit bucket, MiB, when `placement.engine` puts the rollout engine in a role
    /// of its own: the trainer's weights go to it as safetensors buffers of at most this size
    /// (a tensor bigger than a bucket in chunks), each a file in the run folder's
    /// `refit-spool/` that the worker reads. Must be below `max_message_mb`.
    /// Default `256`.
    pub refit_bucket_mb: usize,
    /// This controller's certificate (PEM), signed by `tls_ca`: with `tls_key` and `tls_ca`
    /// the sessions to the workers run over mutual TLS. Required when a node is not on
    /// loopback, unless `insecure = true`. Default none.
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM). Default none.
    pub tls_key: Option<PathBuf>,
    /// The CA that signed every member's certificate (PEM). Default none.
    pub tls_ca: Option<PathBuf>,
    /// Sessions to nodes beyond loopback without TLS (the cookie is still proven, never
    /// sent, but every byte after it travels in clear). Default `false`.
    pub insecure: bool,
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            nodes: BTreeMap::new(),
            cookie_env: DEFAULT_COOKIE_ENV.into(),
            connect_timeout_s: 30.0,
            max_message_mb: 1024,
            slurm: false,
            port: 7101,
            spare_nodes: Vec::new(),
            refit_bucket_mb: 256,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            insecure: false,
        }
    }
}

impl ClusterSection {
    /// True when the section is at its defaults (then `recipe.toml` leaves it out).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The cookie from `cookie_env`, when it is set and not empty.
    pub fn cookie(&self) -> Option<String> {
        std::env::var(&self.cookie_env)
            .ok()
            .filter(|c| !c.is_empty())
    }

    /// The connect wait as a duration.
    pub fn connect_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.connect_timeout_s)
    }

    /// Every node and its address: `nodes`, and with `slurm` the allocation's hosts.
    pub fn resolved_nodes(&self) -> Result<BTreeMap<String, String>, SlurmError> {
        let mut all = if self.slurm {
            super::slurm::slurm_nodes(self.port)?
        } else {
            BTreeMap::new()
        };
        all.extend(self.nodes.clone());
        Ok(all)
    }

    /// The refit bucket limit in bytes.
    pub fn refit_bucket_bytes(&self) -> usize {
        self.refit_bucket_mb << 20
    }

    /// The message cap in bytes.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_mb << 20
    }

    /// The cluster's TLS, loaded from the files when all three are set.
    pub fn tls(&self) -> Result<Option<crate::cluster::Tls>, crate::cluster::TlsError> {
        self.tls_files()
            .map(|files| crate::cluster::Tls::load(&files))
            .transpose()
    }

    /// The TLS files, when all three are set.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            }),
            _ => None,
        }
    }
}

/// The placement of each role that can live on a node, with its recipe key.
pub fn role_placements(r: &Recipe) -> [(&'static str, &str); 4] {
    [
        ("policy", r.placement.policy.as_str()),
        ("reference", r.placement.reference.as_str()),
        ("reward", r.placement.reward.as_str()),
        ("critic", r.placement.critic.as_str()),
    ]
}

/// True when `addr` (`host:port`) is on loopback (`127.0.0.0/8`, `::1`, `localhost`).
pub fn is_loopback(addr: &str) -> bool {
    split_addr(addr).is_ok_and(|(host, _)| is_loopback_host(host))
}

/// True when `host` is `localhost` or a loopback IP.
pub fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Why an address is not `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// No `:port`.
    #[error("{addr:?}: expected host:port, e.g. \"127.0.0.1:7101\"")]
    NoPort {
        /// The address given.
        addr: String,
    },
    /// The port is not a `u16`.
    #[error("{addr:?}: the port {port:?} is not a number from 0 to 65535")]
    BadPort {
        /// The address given.
        addr: String,
        /// Its port part.
        port: String,
    },
    /// The host is neither an RFC 1123 host name nor an IP address.
    #[error(
        "{addr:?}: the host {host:?} is not a host name (letters, digits, '-' and '.', as in \
         RFC 1123) nor an IP address"
    )]
    BadHost {
        /// The address given.
        addr: String,
        /// Its host part.
        host: String,
    },
    /// An empty host or port 0.
    #[error("{addr:?}: expected a host and a non-zero port, e.g. \"127.0.0.1:7101\"")]
    Incomplete {
        /// The address given.
        addr: String,
    },
}

/// Splits `host:port` (`[::1]:7101` for IPv6) into host and port, or says what is wrong;
/// the host must be an RFC 1123 host name or an IP literal ([`valid_host`]).
pub fn split_addr(addr: &str) -> Result<(&str, u16), AddressError> {
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| AddressError::NoPort {
        addr: addr.to_string(),
    })?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port: u16 = port.parse().map_err(|_| AddressError::BadPort {
        addr: addr.to_string(),
        port: port.to_string(),
    })?;
    if host.is_empty() || port == 0 {
        return Err(AddressError::Incomplete {
            addr: addr.to_string(),
        });
    }
    if !valid_host(host) {
        return Err(AddressError::BadHost {
            addr: addr.to_string(),
            host: host.to_string(),
        });
    }
    Ok((host, port))
}

/// The TLS keys: all three or none, files that load, and TLS (or `insecure = true`) for a
/// node beyond loopback.
fn validate_tls(
    c: &ClusterSection,
    nodes: &BTreeMap<String, String>,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let set = [&c.tls_cert, &c.tls_key, &c.tls_ca]
        .iter()
        .filter(|p| p.is_some())
        .count();
    if set != 0 && set != 3 {
        return Err(bad(
            "cluster.tls_cert",
            "tls_cert, tls_key and tls_ca go together: expected all three or none (make them \
             with `oxalign cluster certs`)"
                .into(),
        ));
    }
    if c.tls()
        .map_err(|e| bad("cluster.tls_cert", e.to_string()))?
        .is_some()
    {
        return Ok(());
    }
    if c.insecure {
        return Ok(());
    }
    if let Some((name, addr)) = nodes.iter().find(|(_, a)| !is_loopback(a)) {
        return Err(bad(
            "cluster.tls_cert",
            format!(
                "node {name} ({addr}) is not on loopback, so its session needs TLS: set \
                 tls_cert, tls_key and tls_ca (make them with `oxalign cluster certs`), or \
                 insecure = true on a network you trust"
            ),
        ));
    }
    Ok(())
}

/// Checks the nodes, their addresses, the cookie and every role's node.
pub(crate) fn validate(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let c = &r.cluster;
    let nodes = c
        .resolved_nodes()
        .map_err(|e| bad("cluster.slurm", e.to_string()))?;
    for (name, addr) in &nodes {
        let key = format!("cluster.nodes.{name}");
        split_addr(addr).map_err(|e| bad(&key, e.to_string()))?;
        if !is_loopback(addr) && c.cookie().is_none() {
            return Err(bad(
                "cluster.cookie_env",
                format!(
                    "node {name} ({addr}) is not on loopback, so a cookie is required: set the \
                     environment variable {} (and start its worker with the same cookie)",
                    c.cookie_env
                ),
            ));
        }
    }
    if !(c.connect_timeout_s.is_finite() && c.connect_timeout_s > 0.0) {
        return Err(bad(
            "cluster.connect_timeout_s",
            format!(
                "{}: expected a positive number of seconds",
                c.connect_timeout_s
            ),
        ));
    }
    if !(1..=16384).contains(&c.max_message_mb) {
        return Err(bad(
            "cluster.max_message_mb",
            format!("{}: expected 1 to 16384 MiB", c.max_message_mb),
        ));
    }
    validate_tls(c, &nodes, bad)?;
    for spare in &c.spare_nodes {
        if !nodes.contains_key(spare) {
            return Err(bad(
                "cluster.spare_nodes",
                format!("{spare:?} is not a node of [cluster] nodes; expected a listed name"),
            ));
        }
    }
    for (role, spec) in role_placements(r) {
        let Some(node) = RolePlacement::parse(spec).node else {
            continue;
        };
        let key = format!("placement.{role}");
        if !nodes.contains_key(node) {
            let known: Vec<&str> = nodes.keys().map(String::as_str).collect();
            return Err(bad(
                &key,
                format!(
                    "{spec:?} names node {node:?}, which [cluster] nodes does not list (known: \
                     {}); expected \"<node>:<devices>\" with a listed node, or devices only",
                    if known.is_empty() {
                        "none".into()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
        if r.run.kind != RunKind::Rl {
            return Err(bad(
                &key,
                format!(
                    "{spec:?}: roles on other nodes need run.kind = \"rl\"; sft, rm and dpo \
                     runs keep every role in this process"
                ),
            ));
        }
    }
    Ok(())
}
