//! Roles on other processes and nodes: `oxalign worker --listen ADDR [--cookie C]` hosts role
//! actors (`worker.rs`, `host.rs`) and the controller reaches them through [`Remote`], which
//! implements the same role traits as an in-process `Local` role. The recipe lists workers
//! under `[cluster] nodes = { node1 = "host:port", ... }` and places a role on one by naming
//! the node before its devices (`placement.policy = "node1:cpu"`; `placement::RolePlacement`
//! splits the two). `controller::setup` builds such a role as a `Remote` instead of a local
//! actor; the loop, the stages and the supervisor see the same traits.
//!
//! The transport is `ractor_cluster` (0.16): every `oxalign worker` runs a node server and
//! one actor other nodes can reach, its role host (`host_actor.rs`, in the process group
//! [`HOST_GROUP`]); the controller's process runs a node of its own (`node.rs`) with an event
//! sink (`events.rs`). The controller dials each worker once (`connection.rs`), the node
//! servers authenticate the session by challenge-response on the cookie (the cookie never
//! travels), and the controller finds the worker's host among the group's members. The two
//! messages that cross nodes (`messages.rs`) carry this module's encoded requests and
//! answers: a MessagePack envelope and the call's arrays as one safetensors buffer
//! (`wire.rs`, `call.rs`, `arrays.rs`, `blob.rs`; a worker's errors as data in
//! `wire_error.rs`). Every other actor stays local. The worker's own hosting of a role is
//! `host.rs`; its reports to the role's monitor travel to the controller's sink (`events.rs`).
//! A worker tells what devices it has and which its roles hold (`inventory.rs`), so a role
//! moves only to a spare node that can take it (`spare_fit.rs`).
//!
//! * **Security.** Beyond loopback a worker needs the cookie, and mutual TLS (`tls.rs`,
//!   rustls; `certs.rs` makes a cluster's CA and certificate for `oxalign cluster certs`)
//!   unless it was started `--insecure`; the recipe check asks the same of the controller.
//!   The session's cookie challenge runs inside TLS. A client that is not a member cannot
//!   open a session; one that holds the member key and the cookie can have a worker build
//!   roles that read and write the paths its requests name with the worker's rights.
//! * **Bounds.** Connections are capped in total and per peer address (`door.rs`); a
//!   connection must finish TLS and authentication within 10 s; before authentication a
//!   frame may announce at most 1 MiB, after it `cluster.max_message_mb`; a peer silent for
//!   a minute is cut, and frames beyond a rate are read only as the rate allows (`stream.rs`).
//!   `traffic.rs` counts the bytes the controller's sessions send and receive.
//! * **One slot, one role.** A [`Connection`] is a slot on a worker's host (the controller's
//!   node keeps one session per worker, shared by the slots). The first request other than
//!   `Inventory` builds the slot's role (it must be a `Spawn`); a `Stop`, the controller
//!   dropping the role after a failure, or the end of the controller's session stops it,
//!   retires its executors on the worker and releases its devices from the worker's
//!   `Holdings`.
//! * **Initial weights do not travel.** A worker loads the policy, reference, critic and engine
//!   role from the folders the controller names and writes checkpoints where the controller
//!   says: the run folder must be on a filesystem both see (the same machine, or a cluster's
//!   shared filesystem). Without `placement.engine` refit stays inside the policy's process
//!   (trainer and engine live in the one role) and per step only the batches travel: ids and
//!   per-token f32 arrays as safetensors bytes (4 bytes a number, bit for bit), rewards,
//!   summaries; each call is one session frame, at most `cluster.max_message_mb`.
//! * **Refit to an engine on another node.** With `placement.engine = "node2:cpu"` the rollout
//!   engine is a role on that worker (`RoleKind::Engine`). Each refit, the controller takes the
//!   policy's buckets (`ExportWeights`, `cluster.refit_bucket_mb` each), writes each to the run
//!   folder's `refit-spool/` and sends the worker only its name, length and CRC32C
//!   (`RefitBucket`; `spool.rs`: the weights stay off the node session and its mailboxes),
//!   then `ApplyWeights` with the probe; the worker reads the file, checks length and checksum,
//!   its engine role checks each bucket's pieces and verifies the applied update with its
//!   checksums and the probe, and the controller removes the file. The weights pass through
//!   the controller, which holds one host copy while it writes them, so the policy must be in
//!   the controller's process (a policy on a node with an engine role is refused).
//!   `tests/cluster_engine.rs` runs it against the one-process run (bit for bit, also with
//!   `rl.max_staleness = 1`, and after a failed refit that rebuilds the engine role with the
//!   policy and replays the step); the bucket codec's tests (`batch/weight_buckets_tests.rs`)
//!   flip a byte and see it refused with the tensor and the bucket named.
//! * **Monitoring.** The controller times every role call (the timeline's spans, local or
//!   remote alike, include the network for a remote role); a remote role's own reports — busy
//!   with what, idle with its throughput, failed with its error — come back over the session to
//!   the controller's event sink (`events.rs`), stamped by the worker's clock.
//! * **Failure.** A session that ends (the worker died, or the network dropped it) fails every
//!   waiting call at once: `Cause::Cluster(ClusterError::Lost)`, retried by the supervisor
//!   (`controller/supervisor.rs`), which also rebuilds the roles placed on the same node on a
//!   fresh session. No worker at a node's address at the start of a run, or a refused cookie
//!   or certificate, is the user's setup (exit 2, naming the node, its address and the command to start there).
//! * **Launching.** `oxalign launch RECIPE --hosts FILE` (`src/cmd/launch.rs`) prints the
//!   commands (a worker per node, over ssh beyond loopback, then the controller's
//!   `oxalign train`); with `--start` (`src/cmd/launch/start.rs`) it runs them: loopback
//!   workers as child processes, the others as
//!   `$OXALIGN_SSH -tt -o SendEnv=COOKIE_ENV HOST 'cd DIR && exec oxalign worker --listen ADDR'`
//!   (`OXALIGN_SSH` defaults to `ssh`; `-tt` and `exec` so the worker ends with the session;
//!   every word of the remote command is quoted, `src/cmd/launch/quote.rs`, and a node's host
//!   must be an RFC 1123 name or an IP literal, `recipe/host_name.rs`), waits for each worker's
//!   handshake within `connect_timeout_s`, runs the controller and then stops the workers. An
//!   ssh that exits or a worker that never answers exits 2 with the command to run by hand.
//! * **Spare nodes.** `cluster.spare_nodes` lists nodes that take over a role whose placed node
//!   accepts no connection within `connect_timeout_s` (`remote.rs`, `open_placed_or_spare`, at
//!   the start and on every restart). Each spare in order: connect, ask `Inventory` (within
//!   `supervision.call_timeout_s`), and `spare_fit::fit` it against the role's devices on the
//!   node (`DeviceGroup::parse_unopened`: the controller opens none of them). The first that
//!   fits hosts the role on that same connection (the `Spawn` follows); one that does not is
//!   named on stderr with why
//!   (`spare node3: lacks cuda:1 (wants cuda:0, cuda:1; has cpu:0, cuda:0)`,
//!   `spare node3: cuda:0 already held (...)`, or its connection error: `Unfit::Lacks`,
//!   `Unfit::Held`, `PassedOver` in `error.rs`), and its connection is dropped before any
//!   spawn. When no spare fits the error is `ClusterError::NoSpare`: the placed node's failure
//!   and each spare with why (exit 2 at the start; on a restart the supervisor makes it a
//!   failure of the run, exit 1 with the `--resume` command, as for a node with no worker). The
//!   placed node is not asked for its inventory. The supervisor still groups roles for a
//!   restart by the node their placement names.
//! * **A node's devices are the node's.** The recipe check, the supervisor and the spawn parse
//!   the devices of a role placed on a node without opening them
//!   (`RolePlacement::device_group`, `DeviceGroup::parse_unopened`), so a controller without
//!   GPUs (a login node) can place roles on a node's GPUs; the worker opens them and reports a
//!   device it lacks as bad input. Devices in the controller's process are opened by the check.
//! * **Slurm.** With `[cluster] slurm = true` the nodes are `node1..nodeN`, the hosts of
//!   `SLURM_JOB_NODELIST` in order (`recipe/slurm.rs` expands host lists), at `cluster.port`;
//!   `ClusterSection::resolved_nodes` joins them with `cluster.nodes`, and both the recipe
//!   check and `Remote` read nodes through it. A worker inside a Slurm job (`SLURM_JOB_ID` set)
//!   listens on `0.0.0.0:7101` when `--listen` is not given. Workers do not need their rank:
//!   the controller connects to them.
//! * **Not done here:** an engine role with the policy on a worker node, with expert
//!   parallelism or with rollout routing replay (refused by the recipe check); weights sent
//!   from the trainer's node straight to the engine's (they pass through the controller) or
//!   over NCCL; `[[faults]]` fire only in the controller's process; sft, rm and dpo runs keep
//!   every role local (the recipe check refuses a node there); roles that share a GPU on their
//!   placed node cannot share it on a spare (the first to move holds it, the next finds it
//!   held); a spare's devices and holds are read when a role moves, not reserved, so two
//!   controllers moving roles to one spare at once may both find a GPU free; a role on several
//!   of a node's GPUs needs a controller built with `cuda`, which makes the NCCL ids it sends
//!   (a CPU-only build says so at the spawn); MoE routing records travel in MessagePack, not as
//!   tensors; NCCL groups stay inside one process (a role's devices on one node; the id
//!   travels, the ranks do not).

mod arrays;
mod blob;
mod call;
mod certs;
mod connection;
mod door;
mod error;
mod events;
mod host;
mod host_actor;
mod inventory;
mod messages;
mod node;
mod remote;
mod session_watch;
mod spare_fit;
mod spool;
mod stream;
mod tls;
mod traffic;
mod wire;
mod wire_error;
mod worker;

pub use call::{decode_request, decode_response, encode_request, encode_response};
pub use certs::{make_cluster_certs, CertError, ClusterCerts};
pub use connection::{Connection, Endpoint};
pub use door::{Admission, Door, DoorCaps, ACCEPT_BACKOFF};
pub use error::{
    ClusterError, DecodeError, EncodeError, PassedOver, TensorError, Unfit, WorkerError,
};
pub use inventory::{Held, Inventory};
pub use messages::{sink_group, HostMessage, SinkMessage, HOST_GROUP};
pub(crate) use remote::{Remote, RemoteSources};
pub use spool::{SpoolError, SpooledBucket, SPOOL_DIR};
pub use stream::Guard;
pub use tls::{server_name, Tls, TlsError, TlsFiles};

pub use traffic::{count_refit, traffic, Traffic};
pub use wire::{decode, encode, Envelope, Request, Response, RoleKind, SpawnSpec};
pub use wire_error::{WireCause, WireError};
pub use worker::{bind, serve, WorkerConfig};

#[cfg(test)]
mod wire_tests;
