//! The two actor messages that cross nodes, with their wire forms for `ractor_cluster`:
//! [`HostMessage`] to a worker's role host (`host_actor.rs`) and [`SinkMessage`] to a
//! controller's event sink (`events.rs`). Their payloads are this module's own encoded
//! requests and answers (`call.rs`: a MessagePack envelope and a safetensors buffer), so the
//! wire form is the bytes as they are; a payload that does not decode is answered (or
//! dropped) by the receiving actor, never a panic. Every other actor in the process is
//! local-only and cannot be reached from another node.

use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::RpcReplyPort;

/// The process group every worker's role host joins; a controller finds the host of a
/// node session among its members by the session's node id.
pub const HOST_GROUP: &str = "oxalign.role_host";

/// The process group of the event sink of the controller node named `node`.
pub fn sink_group(node: &str) -> String {
    format!("oxalign.events.{node}")
}

const CALL: &str = "call";
const CAST: &str = "cast";
const EVENTS: &str = "events";
const FLUSH: &str = "flush";

/// A message to a worker's role host.
pub enum HostMessage {
    /// An encoded request envelope (its id is the role's slot); the answer is an encoded
    /// answer envelope.
    Call(Vec<u8>, RpcReplyPort<Vec<u8>>),
    /// An encoded request envelope whose answer nobody waits for (a stop on drop).
    Cast(Vec<u8>),
    /// Local only: the node session of controller `.0` (its node name) ended; the roles it
    /// spawned stop.
    PeerGone(String),
}

/// A message to a controller's event sink.
pub enum SinkMessage {
    /// An encoded answer envelope holding `Response::Events` of the role in slot `id`.
    Events(Vec<u8>),
    /// Answered once the events sent before it were passed on.
    Flush(RpcReplyPort<Vec<u8>>),
}

impl ractor::Message for HostMessage {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        match self {
            Self::Call(args, reply) => Ok(call(CALL, args, reply)),
            Self::Cast(args) => Ok(cast(CAST, args)),
            Self::PeerGone(_) => Err(BoxedDowncastErr),
        }
    }

    fn deserialize(m: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        match m {
            SerializedMessage::Call {
                variant,
                args,
                reply,
                ..
            } if variant == CALL => Ok(Self::Call(args, reply)),
            SerializedMessage::Cast { variant, args, .. } if variant == CAST => {
                Ok(Self::Cast(args))
            }
            _ => Err(BoxedDowncastErr),
        }
    }
}

impl ractor::Message for SinkMessage {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        match self {
            Self::Events(args) => Ok(cast(EVENTS, args)),
            Self::Flush(reply) => Ok(call(FLUSH, Vec::new(), reply)),
        }
    }

    fn deserialize(m: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        match m {
            SerializedMessage::Cast { variant, args, .. } if variant == EVENTS => {
                Ok(Self::Events(args))
            }
            SerializedMessage::Call { variant, reply, .. } if variant == FLUSH => {
                Ok(Self::Flush(reply))
            }
            _ => Err(BoxedDowncastErr),
        }
    }
}

fn call(variant: &str, args: Vec<u8>, reply: RpcReplyPort<Vec<u8>>) -> SerializedMessage {
    SerializedMessage::Call {
        variant: variant.into(),
        args,
        reply,
        metadata: None,
    }
}

fn cast(variant: &str, args: Vec<u8>) -> SerializedMessage {
    SerializedMessage::Cast {
        variant: variant.into(),
        args,
        metadata: None,
    }
}
