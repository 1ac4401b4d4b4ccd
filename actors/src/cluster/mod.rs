//! Roles on other processes and nodes: `oxalign worker` hosts role actors (`worker.rs`,
//! `host.rs`) and the controller reaches them through [`Remote`], which implements the same
//! role traits as an in-process `Local` role.
//!
//! The transport is our own small protocol on tokio TCP rather than `ractor_cluster`:
//! ractor_cluster connects actor systems and lets a node look up actors another node
//! registered, but it cannot spawn an actor on a remote node, it needs every message type
//! (reply ports included) converted to its own wire form, and its 0.15 line allocates
//! whatever frame length a peer announces. Here a connection is one role: the first request
//! builds it on the worker, the following ones are its calls, and closing the connection
//! stops it. Frames are capped (`frame.rs`), the handshake checks a shared cookie
//! (`worker.rs`), and a lost connection fails the waiting calls at once (`connection.rs`).
//! A call's arrays travel as one safetensors buffer beside its MessagePack envelope
//! (`call.rs`, `arrays.rs`, `blob.rs`), and the hosted role's status reports come back on its
//! connection (`relay.rs`). A worker tells what devices it has and which its roles hold
//! (`inventory.rs`), so a role moves only to a spare node that can take it (`spare_fit.rs`).

mod arrays;
mod blob;
mod call;
mod connection;
mod door;
mod error;
mod frame;
mod host;
mod inventory;
mod relay;
mod remote;
mod spare_fit;
mod traffic;
mod wire;
mod wire_error;
mod worker;

pub use call::{decode_request, decode_response, encode_request, encode_response};
pub use connection::{Connection, Endpoint};
pub use door::{Admission, Door, DoorCaps, ACCEPT_BACKOFF};
pub use error::{
    ClusterError, ConnectionError, DecodeError, EncodeError, FrameError, PassedOver, TensorError,
    Unfit, WorkerError,
};
pub use frame::{read_message, write_message, Limits, HEADER_BYTES};
pub use inventory::{Held, Inventory};
pub use remote::{Remote, RemoteSources};

pub use traffic::{count_refit, traffic, Traffic};
pub use wire::{
    decode, encode, Envelope, Hello, HelloReply, Request, Response, RoleKind, SpawnSpec, EVENTS_ID,
    PROTOCOL,
};
pub use wire_error::{WireCause, WireError};
pub use worker::{bind, serve, WorkerConfig};

#[cfg(test)]
mod wire_tests;
