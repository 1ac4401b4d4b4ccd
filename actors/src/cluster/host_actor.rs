//! The role host: the one actor a worker lets other nodes reach. It is in the process group
//! [`HOST_GROUP`], so a controller whose node session is ready finds it there. Each role it
//! builds sits in a slot numbered by the controller (the request envelope's id); the first
//! request for a slot must be a [`Request::Spawn`], later ones are answered by the slot's
//! role, and a [`Request::Stop`] empties it. Calls for a slot reach its role's actor in the
//! order they arrived (each answer is polled once here, the rest runs on its own task), so
//! a slow call of one role holds up no other. When the node session of the controller that
//! spawned a role ends, the role stops, its executors retire and its devices are released
//! from the worker's [`Holdings`]. [`Request::Inventory`] is answered for any slot.

use super::call::{decode_request, encode_response};
use super::error::DecodeError;
use super::events::Relay;
use super::host::HostedRole;
use super::inventory::{Hold, Holdings};
use super::messages::HostMessage;
use super::wire::{Request, Response, SpawnSpec};
use super::wire_error::WireError;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

/// How long a role whose controller went away may take to stop.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// A hosted role with what it holds.
struct Slot {
    role: HostedRole,
    owner: String,
    _hold: Hold,
    relay: Relay,
}

/// The slots, shared with the tasks that fill and empty them.
type Slots = Arc<Mutex<HashMap<u64, Arc<Slot>>>>;

/// The role host actor.
pub(crate) struct RoleHost;

/// Its state.
pub(crate) struct HostState {
    slots: Slots,
    holdings: Holdings,
}

impl Actor for RoleHost {
    type Msg = HostMessage;
    type State = HostState;
    type Arguments = Holdings;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        holdings: Holdings,
    ) -> Result<Self::State, ActorProcessingErr> {
        ractor::pg::join(super::messages::HOST_GROUP.into(), vec![myself.get_cell()]);
        Ok(HostState {
            slots: Arc::default(),
            holdings,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            HostMessage::Call(bytes, reply) => state.request(&bytes, Some(reply)).await,
            HostMessage::Cast(bytes) => state.request(&bytes, None).await,
            HostMessage::PeerGone(peer) => state.stop_owned_by(&peer),
        }
        Ok(())
    }
}

/// Where an answer goes: the caller's port, or nowhere (a cast).
type Reply = Option<RpcReplyPort<Vec<u8>>>;

fn send(reply: Reply, slot: u64, body: Response) {
    if let Some(port) = reply {
        let bytes = encode_response(slot, body).unwrap_or_else(|e| {
            let failed =
                WireError::other(format!("the worker cannot encode its answer: {e}"), false);
            encode_response(slot, Response::Failed(failed)).unwrap_or_default()
        });
        let _ = port.send(bytes);
    }
}

fn failed(message: String) -> Response {
    Response::Failed(WireError::other(message, true))
}

impl HostState {
    async fn request(&mut self, bytes: &[u8], reply: Reply) {
        let env = match decode_request(bytes) {
            Ok(env) => env,
            Err(error @ DecodeError::Tensors { id, .. }) => {
                tracing::warn!("refused call for slot {id}: {error}");
                return send(reply, id, failed(format!("a malformed request: {error}")));
            }
            Err(error) => {
                tracing::warn!("a request that does not decode: {error}");
                return send(
                    reply,
                    0,
                    failed(format!("a request that does not decode: {error}")),
                );
            }
        };
        let slot = env.id;
        match env.body {
            Request::Inventory => send(reply, slot, Response::Inventory(self.holdings.inventory())),
            Request::Spawn(spec) => self.spawn(slot, *spec, reply),
            Request::Stop(ms) => self.stop(slot, Duration::from_millis(ms), reply),
            request => self.answer(slot, request, reply).await,
        }
    }

    /// Builds the role of `spec` into `slot` on a task of its own (loading weights takes a
    /// while; other slots go on meanwhile), then answers with its devices.
    fn spawn(&mut self, slot: u64, spec: SpawnSpec, reply: Reply) {
        if self.slots.lock().unwrap().contains_key(&slot) {
            return send(
                reply,
                slot,
                failed(format!("slot {slot} already hosts a role")),
            );
        }
        let (slots, holdings) = (self.slots.clone(), self.holdings.clone());
        tokio::spawn(async move {
            let owner = spec.owner.clone();
            let (relay, monitor) = Relay::start(slot, &spec.events).await;
            match HostedRole::spawn(spec, monitor).await {
                Ok(role) => {
                    let names = role.group.names();
                    let hold = holdings.hold(role.name, &role.group.specs);
                    let filled = Slot {
                        role,
                        owner,
                        _hold: hold,
                        relay,
                    };
                    slots.lock().unwrap().insert(slot, Arc::new(filled));
                    send(reply, slot, Response::Spawned(names));
                }
                Err(e) => {
                    relay.close().await;
                    send(reply, slot, Response::Failed(e));
                }
            }
        });
    }

    /// Empties `slot`: its role stops (within `wait`, at least a second) and what it
    /// reported reaches the controller before the answer.
    fn stop(&mut self, slot: u64, wait: Duration, reply: Reply) {
        let taken = self.slots.lock().unwrap().remove(&slot);
        let Some(filled) = taken else {
            return send(reply, slot, Response::Done);
        };
        tokio::spawn(async move {
            retire(filled, wait.max(Duration::from_secs(1))).await;
            send(reply, slot, Response::Done);
        });
    }

    /// Stops every role spawned by `peer`, whose session ended.
    fn stop_owned_by(&mut self, peer: &str) {
        let gone: Vec<Arc<Slot>> = {
            let mut slots = self.slots.lock().unwrap();
            let ids: Vec<u64> = slots
                .iter()
                .filter(|(_, s)| s.owner == peer)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| slots.remove(id)).collect()
        };
        for filled in gone {
            tracing::info!(
                "{} stops: its controller {peer} went away",
                filled.role.name
            );
            tokio::spawn(retire(filled, STOP_WAIT));
        }
    }

    /// Starts answering `request` with the role in `slot`: polled once here, so its actor
    /// receives calls in the order they arrived; the rest runs on its own task.
    async fn answer(&mut self, slot: u64, request: Request, reply: Reply) {
        let filled = self.slots.lock().unwrap().get(&slot).cloned();
        let Some(filled) = filled else {
            let kind = request.kind();
            return send(
                reply,
                slot,
                failed(format!(
                    "no role in slot {slot} for a {kind} request (spawn it first)"
                )),
            );
        };
        let mut fut = filled.role.answer(request);
        let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        match first {
            Poll::Ready(body) => send(reply, slot, body),
            Poll::Pending => {
                tokio::spawn(async move {
                    let body = fut.await;
                    send(reply, slot, body);
                });
            }
        }
    }
}

/// Stops a slot's role, passes on what it reported and releases its devices.
async fn retire(filled: Arc<Slot>, wait: Duration) {
    filled.role.stop(wait).await;
    filled.relay.flush().await;
    // The devices are released when the last clone of the slot (a finishing call's) drops.
}
