//! The policy role: the actor ([`actor`]) that owns the trainer replicas ([`replica`]) and,
//! unless the recipe places an engine role, their rollout engines ([`engine`]); its updates —
//! PPO-family steps and SFT steps ([`train`]), DPO steps ([`dpo`]).
//!
//! * A trainer (model + AdamW) and an engine per device. They are separate replicas on separate
//!   executor lanes (`cpu:0/policy` and `cpu:0/policy-engine` on the CPU; a GPU's one executor
//!   serves both), and a generation request is served off the actor's mailbox, so the engine
//!   can generate while the trainer updates (`rl.max_staleness`). A refit's engine job queues
//!   behind any generation still running.
//! * It generates with the engine and trains (SFT steps, PPO minibatch updates, DPO steps).
//!   After every update it refits the engine from the trainer's weights; the refit is verified
//!   by per-tensor checksums and a log-prob probe, and is versioned.
//! * π_old's log-probs are the engine's own sampling log-probs when it serves f32 weights (the
//!   trainer's weights in the trainer's precision) and the batch is on-policy; a quantized
//!   engine, or a batch generated ahead by an older version, has the trainer score the rollout
//!   instead. The update measures the engine-vs-trainer gap on its first minibatch
//!   (`logprob_mismatch_*`).
//! * With `placement.engine` the policy builds no engine: at a refit its rank 0 exports the
//!   trainer's weights as buckets (a sharded trainer gathers them first) for the controller to
//!   send to the engine role (`roles/rollout_engine.rs`).

mod actor;
mod dpo;
mod engine;
mod replica;
mod train;

pub(crate) use actor::{Policy, PolicyMsg, PolicyState};
pub use dpo::{DpoSummary, DpoWork};
pub(crate) use engine::generate;
pub use engine::{EngineReplica, ENGINE_LANE};
pub use replica::PolicyReplica;
pub use train::{PolicyTrainSummary, PolicyWork, SftStepSummary};

use super::{Local, PolicyRole};
use crate::error::RoleError;
use crate::monitor::MonitorHandle;
use crate::replicas::Replicas;
use std::sync::Arc;
use std::time::Duration;

/// Spawns the policy actor (named `name`, or anonymous) over its trainer `replicas` and,
/// when it serves its own rollouts, its `engines` (on [`ENGINE_LANE`]); every call through
/// the returned role is bounded by `timeout`.
pub async fn spawn_local(
    name: Option<String>,
    replicas: Replicas<PolicyReplica>,
    engines: Option<Replicas<EngineReplica>>,
    monitor: MonitorHandle,
    timeout: Duration,
) -> Result<Arc<dyn PolicyRole>, RoleError> {
    let state = PolicyState::new(replicas, engines, monitor);
    let (actor, _) = ractor::Actor::spawn(name, Policy, state)
        .await
        .map_err(|e| RoleError::new("policy", "setup", crate::error::Cause::from(e)))?;
    Ok(Arc::new(Local::new("policy", actor, timeout)))
}
