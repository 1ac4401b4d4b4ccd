//! What travels between a controller and a worker's role host: one request per role call
//! and its answer, each in an [`Envelope`] with the role's slot (`host_actor.rs`). Requests and answers are the
//! roles' own host data (`crate::batch`, the work and summary types), encoded as MessagePack
//! (`rmp-serde`, field names kept so serde's defaults round-trip) with their arrays as
//! safetensors bytes beside (`call.rs`), carried as the payload of a `ractor_cluster` message
//! (`messages.rs`). A worker loads
//! a role's initial weights from the paths a request names; the only weights that travel
//! are a refit's buckets to an engine role (`placement.engine`), each bucket one request.
//! Besides the role's calls, a connection may ask the worker for its devices
//! ([`Request::Inventory`]), before its spawn or after.
//!
//! Each [`Request`] is one trait method's call, plus `Spawn`, `Stop` and
//! `Inventory`; an engine role's `RefitBucket` names one bucket waiting in the run folder's
//! spool (`spool.rs`; the weights stay off the node session), and `ApplyWeights` carries
//! the probe. A [`Response`] answers
//! it; `Events` carries a hosted role's monitor reports to the controller's event sink.

use super::inventory::Inventory;
use super::spool::SpooledBucket;
use super::wire_error::WireError;
use crate::batch::{RolloutBatch, RolloutRequest, Sequences, TokenArray};
use crate::monitor::MonitorEvent;
use crate::roles::{
    CriticTrainSummary, CriticWork, DpoSummary, DpoWork, PolicyTrainSummary, PolicyWork,
    RewardRequest, SftStepSummary,
};
use oxalign_kernels::collective::NcclUniqueId;
use oxalign_models::engine::{Probe, RefitReport};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::path::PathBuf;

/// A request or an answer with the id of its call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// The call's id (answers carry the request's).
    pub id: u64,
    /// The request or answer.
    pub body: T,
}

/// Which role a connection hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RoleKind {
    /// The policy (trainer and engine).
    Policy,
    /// The frozen reference.
    Reference,
    /// The reward.
    Reward,
    /// The critic.
    Critic,
    /// The policy's rollout engine as a role of its own (`placement.engine`).
    Engine,
}

impl RoleKind {
    /// The role's name (`policy`, ...).
    pub fn name(self) -> &'static str {
        match self {
            RoleKind::Policy => "policy",
            RoleKind::Reference => "reference",
            RoleKind::Reward => "reward",
            RoleKind::Critic => "critic",
            RoleKind::Engine => "engine",
        }
    }
}

/// The first request on a connection: which role to build, from what.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpawnSpec {
    /// The role.
    pub kind: RoleKind,
    /// The recipe as TOML, its placement of this role already reduced to the devices on
    /// the worker.
    pub recipe_toml: String,
    /// The weights folder: the policy's or the reference's, or for the critic the backbone
    /// it starts from when it has no folder of its own.
    pub weights: Option<PathBuf>,
    /// The critic's own weights folder, when it has one.
    pub critic: Option<PathBuf>,
    /// The NCCL ids of the role's collective groups, made by the controller (the groups'
    /// owner), in the order the role builds its groups; empty unless the role's devices on
    /// the worker are several CUDA GPUs.
    #[serde(default)]
    pub nccl_ids: Vec<NcclUniqueId>,
    /// The node name of the controller that asks (the role stops when its session ends).
    #[serde(default)]
    pub owner: String,
    /// The process group of that controller's event sink, for the role's reports.
    #[serde(default)]
    pub events: String,
}

/// One role call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Build the connection's role (first request only).
    Spawn(Box<SpawnSpec>),
    /// `Generate::generate`.
    Generate {
        /// The requests.
        request: RolloutRequest,
        /// The monitor label.
        label: String,
    },
    /// `Logprobs::logprobs`.
    Logprobs {
        /// The phase named in errors.
        phase: String,
        /// The sequences.
        seqs: Sequences,
    },
    /// `Rewards::rewards`.
    Rewards(RewardRequest),
    /// `Values::values`.
    Values(Sequences),
    /// `TrainPolicy::train`.
    TrainPolicy(Box<PolicyWork>),
    /// `TrainPolicy::sft`.
    Sft {
        /// The batch.
        seqs: Sequences,
        /// Learning rate.
        lr: f64,
        /// Gradient clip.
        max_grad_norm: f64,
    },
    /// `TrainPolicy::dpo`.
    Dpo(Box<DpoWork>),
    /// `TrainCritic::train`.
    TrainCritic(Box<CriticWork>),
    /// `Refit::refit`.
    Refit(u64),
    /// `TakeWeights::take_bucket`: the bucket waits in the run folder's spool (`spool.rs`).
    RefitBucket {
        /// The update's version.
        version: u64,
        /// Where the bucket is, its length and checksum.
        spooled: SpooledBucket,
    },
    /// `TakeWeights::apply_weights`.
    ApplyWeights {
        /// The update's version.
        version: u64,
        /// The trainer's probe.
        probe: Box<Probe>,
    },
    /// `Persist::save`.
    Save {
        /// The phase named in errors.
        phase: String,
        /// The folder (absolute).
        dir: PathBuf,
        /// With the optimizer state.
        optimizer: bool,
    },
    /// `Persist::load_optimizer`.
    LoadOptimizer(PathBuf),
    /// `Stop::stop`: stop the role, wait at most this many milliseconds, then close.
    Stop(u64),
    /// The worker's devices and what its hosted roles hold; answered by the worker itself,
    /// before or after the connection's spawn.
    Inventory,
}

/// The answer to one [`Request`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Response {
    /// The role is built, on these devices of the worker.
    Spawned(Vec<String>),
    /// Rollouts.
    Batch(Box<RolloutBatch>),
    /// Per-token numbers.
    Tokens(TokenArray),
    /// One reward per row.
    Rewards(Vec<f32>),
    /// A policy update.
    PolicyTrained(Box<PolicyTrainSummary>),
    /// An SFT step.
    Sft(SftStepSummary),
    /// A DPO step.
    Dpo(DpoSummary),
    /// A critic update.
    CriticTrained(CriticTrainSummary),
    /// A refit.
    Refit(RefitReport),
    /// Done (save, load, stop).
    Done,
    /// The call failed.
    Failed(WireError),
    /// Not an answer: what the hosted role reported to its monitor (status changes and
    /// spans), sent to the controller's event sink as it happens, under the role's slot.
    Events(Vec<MonitorEvent>),
    /// The worker's devices and what its hosted roles hold.
    Inventory(Inventory),
}

impl Request {
    /// The request's kind, for messages (`values`, `train_policy`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Spawn(_) => "spawn",
            Request::Generate { .. } => "generate",
            Request::Logprobs { .. } => "logprobs",
            Request::Rewards(_) => "rewards",
            Request::Values(_) => "values",
            Request::TrainPolicy(_) => "train_policy",
            Request::Sft { .. } => "sft",
            Request::Dpo(_) => "dpo",
            Request::TrainCritic(_) => "train_critic",
            Request::Refit(_) => "refit",
            Request::RefitBucket { .. } => "refit_bucket",
            Request::ApplyWeights { .. } => "apply_weights",
            Request::Save { .. } => "save",
            Request::LoadOptimizer(_) => "load_optimizer",
            Request::Stop(_) => "stop",
            Request::Inventory => "inventory",
        }
    }
}

impl Response {
    /// The answer's kind, for messages (`batch`, `tokens`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Response::Spawned(_) => "spawned",
            Response::Batch(_) => "batch",
            Response::Tokens(_) => "tokens",
            Response::Rewards(_) => "rewards",
            Response::PolicyTrained(_) => "policy_trained",
            Response::Sft(_) => "sft",
            Response::Dpo(_) => "dpo",
            Response::CriticTrained(_) => "critic_trained",
            Response::Refit(_) => "refit",
            Response::Done => "done",
            Response::Failed(_) => "failed",
            Response::Events(_) => "events",
            Response::Inventory(_) => "inventory",
        }
    }
}

/// The bytes of `value`.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    rmp_serde::to_vec_named(value)
}

/// `T` from `bytes`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, rmp_serde::decode::Error> {
    rmp_serde::from_slice(bytes)
}
