//! The failures of the cluster transport: connections to a node ([`ClusterError`]) and a
//! worker's start ([`WorkerError`]), each naming the node and its address. A role call that fails on the
//! wire becomes a [`crate::error::Cause::Cluster`] inside the role's error, so the
//! supervisor treats a lost node like a failed role.

use super::inventory::Held;
use oxalign_kernels::device::DeviceSpec;

/// A connection to a node failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A refit bucket could not be written to or read from the run folder's spool.
    #[error(transparent)]
    Spool(#[from] super::spool::SpoolError),
    /// Nothing accepted at the node's address within `cluster.connect_timeout_s`.
    #[error(
        "node {node} ({addr}): no worker accepted within {waited_s:.0} s (last error: {last}); \
         expected `oxalign worker --listen {addr}` running there"
    )]
    NoWorker {
        /// The node's name in `[cluster] nodes`.
        node: String,
        /// Its address.
        addr: String,
        /// Seconds waited.
        waited_s: f64,
        /// The last connection error.
        last: String,
    },
    /// The worker refused the handshake (wrong cookie or protocol).
    #[error("node {node} ({addr}) refused the connection: {reason}")]
    Refused {
        /// The node.
        node: String,
        /// Its address.
        addr: String,
        /// What the worker said.
        reason: String,
    },
    /// The connection broke or was closed (the worker died, or stopped the role).
    #[error("node {node} ({addr}): the connection was lost: {reason}")]
    Lost {
        /// The node.
        node: String,
        /// Its address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// An answer's tensors are malformed (that call fails; the connection goes on).
    #[error("node {node} ({addr}): a malformed answer: {source}")]
    BadAnswer {
        /// The node.
        node: String,
        /// Its address.
        addr: String,
        /// What is wrong with it (boxed: it is the largest cause).
        source: Box<DecodeError>,
    },
    /// A message could not be encoded or decoded.
    #[error("node {node} ({addr}): {message}")]
    Protocol {
        /// The node.
        node: String,
        /// Its address.
        addr: String,
        /// What was wrong.
        message: String,
    },
    /// The cluster's TLS files could not be used.
    #[error(transparent)]
    Tls(#[from] super::tls::TlsError),
    /// The node a role is placed on accepted no connection, and no node of
    /// `cluster.spare_nodes` could take the role over.
    #[error("{placed}; no spare node can host the {role}: {}", passed_over(passed))]
    NoSpare {
        /// The role (`policy`, ...).
        role: String,
        /// Why the placed node failed.
        placed: Box<ClusterError>,
        /// Each spare tried, in order, with why it was passed over.
        passed: Vec<PassedOver>,
    },
}

/// `spare node3: ...; spare node4: ...`.
fn passed_over(passed: &[PassedOver]) -> String {
    let each: Vec<String> = passed.iter().map(ToString::to_string).collect();
    each.join("; ")
}

impl ClusterError {
    /// True when the user must fix something before the run can work: no worker at a
    /// node's address (and no spare that can stand in), or a refused cookie (exit code 2).
    /// A lost connection is a failure of the run, which the supervisor retries.
    pub fn is_bad_input(&self) -> bool {
        match self {
            ClusterError::NoWorker { .. } | ClusterError::Refused { .. } => true,
            ClusterError::Tls(_) => true,
            ClusterError::NoSpare { placed, .. } => placed.is_bad_input(),
            _ => false,
        }
    }
}

/// A worker could not start listening.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The listen address is malformed, or beyond loopback without a cookie.
    #[error("--listen {addr}: {message}")]
    Listen {
        /// The address given.
        addr: String,
        /// What is wrong and what was expected.
        message: String,
    },
    /// Binding the address failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The worker's cluster node or role host could not start.
    #[error("the worker could not start: {0}")]
    Start(String),
    /// The TLS files could not be used.
    #[error(transparent)]
    Tls(#[from] super::tls::TlsError),
}

/// The safetensors part of a call message is malformed, or one of its tensors is not what
/// the message needs (named by its field path, e.g. `seqs.prompt_ids`).
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    /// The bytes are no safetensors buffer (truncated, a bad header, offsets past the end).
    #[error("the tensor bytes are not a safetensors buffer: {0}")]
    Malformed(safetensors::SafeTensorError),
    /// The message needs a tensor the buffer lacks.
    #[error("tensor {name} is missing")]
    Missing {
        /// The tensor's name (its field path).
        name: String,
    },
    /// A tensor has the wrong element type.
    #[error("tensor {name}: expected dtype {expected}, got {got}")]
    Dtype {
        /// The tensor's name.
        name: String,
        /// The dtype the field holds.
        expected: &'static str,
        /// The dtype found.
        got: String,
    },
    /// A tensor has the wrong shape.
    #[error("tensor {name}: expected shape {expected}, got {got:?}")]
    Shape {
        /// The tensor's name.
        name: String,
        /// The shape the field needs (`[rows, cols]`, `[16]`, ...).
        expected: String,
        /// The shape found.
        got: Vec<usize>,
    },
    /// The row lengths of a ragged tensor do not add up to its values.
    #[error("tensor {name}.lens adds up to {sum} values, but {name} holds {len}")]
    Lengths {
        /// The values' tensor.
        name: String,
        /// The sum of `NAME.lens`.
        sum: u64,
        /// The number of values in `NAME`.
        len: usize,
    },
    /// The buffer holds a tensor this message has no field for.
    #[error("tensor {name} is not part of this message")]
    Unexpected {
        /// The tensor's name.
        name: String,
    },
    /// The tensors could not be written (an array whose values do not fill its shape).
    #[error("cannot write tensor bytes: {0}")]
    Write(safetensors::SafeTensorError),
}

/// A call message (a request or an answer) could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The message is shorter than its layout needs.
    #[error("a call message of {len} bytes: {what}")]
    Layout {
        /// The message's length.
        len: usize,
        /// What is wrong, and what was expected.
        what: String,
    },
    /// The MessagePack part does not decode.
    #[error("the message does not decode: {0}")]
    Message(#[from] rmp_serde::decode::Error),
    /// The MessagePack part decoded (the call is known), its tensors did not.
    #[error("call {id} ({call}): {source}")]
    Tensors {
        /// The call's id.
        id: u64,
        /// The request or answer kind (`values`, `batch`, ...).
        call: &'static str,
        /// What is wrong with the tensors.
        source: TensorError,
    },
}

/// A call message could not be written.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// MessagePack failed.
    #[error("cannot encode the message: {0}")]
    Message(#[from] rmp_serde::encode::Error),
    /// The tensors could not be written.
    #[error(transparent)]
    Tensors(#[from] TensorError),
}

/// Why a spare node was passed over for a role.
#[derive(Debug, thiserror::Error)]
pub enum Unfit {
    /// It accepted no connection, or the connection failed before its inventory arrived.
    #[error(transparent)]
    Unreachable(Box<ClusterError>),
    /// Its worker did not answer the inventory request within the call timeout.
    #[error("no answer to the inventory request within {seconds} s")]
    Silent {
        /// The limit, seconds.
        seconds: f64,
    },
    /// It lacks devices the placement names.
    #[error("lacks {} (wants {}; has {})", list(missing), list(wanted), list(has))]
    Lacks {
        /// The placement's devices on the node.
        wanted: Vec<DeviceSpec>,
        /// Those the spare does not have.
        missing: Vec<DeviceSpec>,
        /// The spare's devices.
        has: Vec<DeviceSpec>,
    },
    /// GPUs the placement names are held by roles the spare hosts.
    #[error(
        "{} already held (wants {}; holds {})",
        list(taken),
        list(wanted),
        holds(held)
    )]
    Held {
        /// The placement's devices on the node.
        wanted: Vec<DeviceSpec>,
        /// The wanted GPUs some hosted role holds.
        taken: Vec<DeviceSpec>,
        /// Everything the spare's roles hold.
        held: Vec<Held>,
    },
}

/// A spare node passed over for a role, and why.
#[derive(Debug, thiserror::Error)]
#[error("spare {spare}: {why}")]
pub struct PassedOver {
    /// The spare (`[cluster] nodes` key).
    pub spare: String,
    /// Why it cannot host the role.
    pub why: Unfit,
}

/// `cpu:0, cuda:1` (`none` when empty).
fn list(devices: &[DeviceSpec]) -> String {
    match devices {
        [] => "none".into(),
        _ => join(devices.iter().map(ToString::to_string)),
    }
}

/// `cuda:0 for the reference, cpu:0 for the reward` (`nothing` when empty).
fn holds(held: &[Held]) -> String {
    match held {
        [] => "nothing".into(),
        _ => join(
            held.iter()
                .map(|h| format!("{} for the {}", h.device, h.role)),
        ),
    }
}

fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(", ")
}
