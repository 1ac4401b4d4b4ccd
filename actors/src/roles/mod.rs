//! The role actors: policy, reference, reward and critic; the rollout engine when
//! `placement.engine` places it apart from the policy; the reward-model trainer of
//! `run.kind = "rm"`. Each is a thin ractor facade over [`crate::replicas::Replicas`]; the
//! tensor work runs on device executors through `oxalign-rlhf` and `oxalign-models`. Messages
//! carry the host data of [`crate::batch`], never tensors.
//!
//! The controller sees each role through traits (`api.rs`): `Generate`, `Logprobs`, `Rewards`,
//! `Values`, `TrainPolicy`, `TrainCritic`, `Refit`, `ExportWeights`, `TakeWeights`, `Persist`
//! and `Stop`, grouped as `PolicyRole`, `ReferenceRole`, `RewardRole`, `CriticRole` and
//! `EngineRole`. `controller::setup::Roles` holds them as trait objects, and no loop names an
//! actor or a message. Two implementations: `Local`, a ractor actor of this process, and
//! `Remote` (`cluster/remote.rs`), the same role hosted by an `oxalign worker` on another
//! process or node; each call is bounded by `[supervision] call_timeout_s` either way.
//!
//! Each role owns one replica per device of its `[placement]` group and runs heavy work on an
//! executor thread, never on tokio's workers: one thread per GPU, shared by the roles placed on
//! it, and on the CPU one thread per role and spec (`cpu:0/critic`), so roles the step runs
//! concurrently really run at once over the shared rayon pool (`executor.rs`).
//!
//! The roles, one file or folder each: the policy (`policy/`: trainers and, without an engine
//! role, their engines); the engine role (`rollout_engine.rs`); the reference (`reference.rs`);
//! the reward (`reward/`, with the HTTP reward-service client in `reward/http/`); the critic
//! (`critic.rs`, PPO only); the reward-model trainer (`reward_trainer.rs`). What several
//! share: minibatches and each replica's share (`minibatch.rs`), per-row answers joined in
//! request order (`rows.rs`), the whole-model jobs of a sharded trainer (`sharded.rs`), the
//! non-finite weight check (`finite.rs`) and divergence as data (`divergence.rs`).

mod api;
mod critic;
mod divergence;
mod finite;
mod minibatch;
mod policy;
mod reference;
pub mod reward;
mod reward_trainer;
mod rollout_engine;
mod rows;
mod sharded;

pub use crate::batch::Sequences;
pub use api::{
    CriticRole, EngineRole, ExportWeights, FrozenBase, Generate, Local, Logprobs, Persist,
    PolicyRole, ReferenceRole, Refit, RewardModelRole, RewardRequest, RewardRole, Rewards, Stop,
    TakeWeights, TrainCritic, TrainPolicy, TrainRewardModel, Values,
};
pub use critic::{split_state_values, CriticTrainSummary, CriticWork};
pub(crate) use critic::{Critic, CriticMsg, CriticState};
pub use divergence::{non_finite_weight, Divergence};
pub use policy::spawn_local as spawn_local_policy;
pub(crate) use policy::PolicyMsg;
pub use policy::{
    DpoSummary, DpoWork, EngineReplica, PolicyReplica, PolicyTrainSummary, PolicyWork,
    SftStepSummary, ENGINE_LANE,
};
pub(crate) use reference::{Reference, ReferenceModel, ReferenceMsg, ReferenceState};
pub(crate) use reward::{Reward, RewardMsg, RewardState};
pub use reward::{Scorer, Scoring};
pub use reward_trainer::RmStepSummary;
pub(crate) use reward_trainer::{RmTrainer, RmTrainerMsg, RmTrainerState};
pub(crate) use rollout_engine::{EngineState, RolloutEngine, ENGINE_ROLE};

use crate::error::{Cause, RoleError};
use crate::monitor::{ActorUpdate, MonitorHandle};
use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};
use std::time::Duration;

/// Sends a request for `phase` to `actor` and waits for the answer at most `timeout`,
/// mapping transport failures to a [`RoleError`] naming the role and the phase (a call past
/// its time is [`Cause::Timeout`]; the actor may still be busy with it).
pub async fn ask<M, T>(
    role: &str,
    phase: &'static str,
    actor: &ActorRef<M>,
    timeout: Duration,
    build: impl FnOnce(RpcReplyPort<Result<T, RoleError>>) -> M,
) -> Result<T, RoleError>
where
    M: ractor::Message,
    T: Send + 'static,
{
    let unreachable = |m: String| Err(RoleError::new(role, phase, Cause::Unreachable(m)));
    match actor.call(build, Some(timeout)).await {
        Ok(CallResult::Success(r)) => r,
        Ok(CallResult::Timeout) => Err(RoleError::new(
            role,
            phase,
            Cause::Timeout {
                seconds: Some(timeout.as_secs_f64()),
            },
        )),
        Ok(CallResult::SenderError) => unreachable("stopped before answering".into()),
        Err(e) => unreachable(e.to_string()),
    }
}

/// Marks `actor` as working on `work` in the monitor and returns a guard that marks it idle
/// (or failed) again.
pub(crate) struct Busy<'a> {
    monitor: &'a MonitorHandle,
    actor: &'a str,
}

impl<'a> Busy<'a> {
    pub(crate) fn start(monitor: &'a MonitorHandle, actor: &'a str, work: String) -> Self {
        monitor.report(ActorUpdate::working(actor, work));
        Self { monitor, actor }
    }

    /// Reports the outcome: idle with a throughput, or failed with the error.
    pub(crate) fn done<T>(self, r: &Result<T, RoleError>, items: usize, seconds: f64) {
        match r {
            Ok(_) => self.monitor.report(
                ActorUpdate::idle(self.actor).with_items_per_sec(items as f64 / seconds.max(1e-9)),
            ),
            Err(e) => self
                .monitor
                .report(ActorUpdate::failed(self.actor, e.to_string())),
        }
    }
}
