//! [`MonitorMsg`]: the messages the monitor actor handles; other actors send them through a
//! [`crate::monitor::MonitorHandle`].

use super::error::MonitorError;
use super::event::MonitorEvent;
use super::state::MonitorSnapshot;
use ractor::RpcReplyPort;
use tokio::sync::broadcast;

/// Messages the monitor actor handles. Other actors use a [`crate::monitor::MonitorHandle`] instead of
/// building these by hand.
pub enum MonitorMsg {
    /// Apply, log and broadcast one event.
    Event(MonitorEvent),
    /// Reply with a copy of the current state.
    Snapshot(RpcReplyPort<MonitorSnapshot>),
    /// Reply with a copy of the current state and a receiver of every later event; the two
    /// are taken atomically, so no event is lost or seen twice between them.
    Subscribe(RpcReplyPort<(MonitorSnapshot, broadcast::Receiver<MonitorEvent>)>),
    /// A barrier: reply once every event queued before it is written and the logs are
    /// fsynced, with the failures since the previous sync (see [`crate::monitor::MonitorHandle::sync`]).
    Sync(RpcReplyPort<Result<(), MonitorError>>),
}

// A local-only message (the cluster feature of ractor needs each message type to say so).
impl ractor::Message for MonitorMsg {}
