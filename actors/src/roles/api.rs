//! The roles as traits: what the controller can ask of a policy, a reference, a reward and a
//! critic, in host data only. The loop holds each role as a trait object
//! (`controller::setup::Roles`), so how a role is served is not its concern.
//!
//! [`Local`] is today's implementation: a ractor actor in this process over
//! replicas-on-executors (`roles/*.rs`), called with the recipe's time limit
//! (`[supervision] call_timeout_s`). A role served by another process implements the same
//! traits over the wire.

use super::rollout_engine::EngineMsg;
use super::{
    ask, CriticMsg, CriticTrainSummary, CriticWork, DpoSummary, DpoWork, PolicyMsg,
    PolicyTrainSummary, PolicyWork, ReferenceMsg, RewardMsg, RmStepSummary, RmTrainerMsg,
    SftStepSummary,
};
use crate::batch::{
    RolloutBatch, RolloutRequest, Sequences, TokenArray, WeightBucket, WeightExport,
};
use crate::error::{Cause, RoleError, LOAD_OPTIMIZER};
use async_trait::async_trait;
use oxalign_models::engine::{Probe, RefitReport};
use ractor::{ActorRef, RpcReplyPort};
use std::path::PathBuf;
use std::time::Duration;

/// Completes rollout requests (the policy's engine).
#[async_trait]
pub trait Generate: Send + Sync {
    /// The samples of `request`, in request order, with the policy version that made them;
    /// `label` names the work in the monitor (e.g. `"generate step 3"`).
    async fn generate(
        &self,
        request: RolloutRequest,
        label: String,
    ) -> Result<RolloutBatch, RoleError>;
}

/// Scores sequences with next-token log-probs (the policy's trainer, the reference).
#[async_trait]
pub trait Logprobs: Send + Sync {
    /// Log-probs `[B, T-1]` of `seqs`; `phase` names the call in errors.
    async fn logprobs(&self, phase: &'static str, seqs: Sequences)
        -> Result<TokenArray, RoleError>;
}

/// One reward request: the sequences and their texts.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RewardRequest {
    /// Token ids (for a reward model; response lengths for verifiers).
    pub seqs: Sequences,
    /// Prompt texts (for a reward service).
    pub prompts: Vec<String>,
    /// Decoded responses.
    pub texts: Vec<String>,
    /// Reference answers.
    pub answers: Vec<Option<String>>,
    /// The rows' other dataset columns, each row's as JSON object text (for a reward
    /// service); empty when the data has none.
    #[serde(default)]
    pub columns: Vec<Option<String>>,
}

/// Scores responses (the reward).
#[async_trait]
pub trait Rewards: Send + Sync {
    /// One reward per row of `request`.
    async fn rewards(&self, request: RewardRequest) -> Result<Vec<f32>, RoleError>;
}

/// Values of states (the critic).
#[async_trait]
pub trait Values: Send + Sync {
    /// Values of every state `[B, T]` of `seqs`.
    async fn values(&self, seqs: Sequences) -> Result<TokenArray, RoleError>;
}

/// The policy's updates.
#[async_trait]
pub trait TrainPolicy: Send + Sync {
    /// One PPO-family update on an experience batch.
    async fn train(&self, work: PolicyWork) -> Result<PolicyTrainSummary, RoleError>;
    /// One SFT step on `seqs` (responses are the targets).
    async fn sft(
        &self,
        seqs: Sequences,
        lr: f64,
        max_grad_norm: f64,
    ) -> Result<SftStepSummary, RoleError>;
    /// One preference (DPO) update.
    async fn dpo(&self, work: DpoWork) -> Result<DpoSummary, RoleError>;
    /// A LoRA policy's frozen base with its adapters off, one model per replica (sharing
    /// the weights, not copying them), for a reference that scores with it; `None` for a
    /// policy without adapters or in another process.
    async fn frozen_base(&self) -> Result<Option<FrozenBase>, RoleError> {
        Ok(None)
    }
}

/// The frozen base of a LoRA policy's replicas ([`TrainPolicy::frozen_base`]).
pub struct FrozenBase {
    /// The folder the base was loaded from (as the adapters record it).
    pub folder: PathBuf,
    /// One model per replica, in rank order, on that replica's device.
    pub models: Vec<oxalign_models::CausalLm>,
}

/// The critic's updates.
#[async_trait]
pub trait TrainCritic: Send + Sync {
    /// One value update on an experience batch.
    async fn train(&self, work: CriticWork) -> Result<CriticTrainSummary, RoleError>;
}

/// Moves the trainer's weights into the engine.
#[async_trait]
pub trait Refit: Send + Sync {
    /// The engine takes the trainer's weights as `version`, verified.
    async fn refit(&self, version: u64) -> Result<RefitReport, RoleError>;
}

/// Hands the trainer's weights to an engine role (`placement.engine`).
#[async_trait]
pub trait ExportWeights: Send + Sync {
    /// Rank 0's weights (gathered when sharded) as update `version`, in buckets of at most
    /// `bucket_bytes`, with the probe that verifies them.
    async fn export_weights(
        &self,
        version: u64,
        bucket_bytes: usize,
    ) -> Result<WeightExport, RoleError>;
}

/// An engine role takes the trainer's weights bucket by bucket.
#[async_trait]
pub trait TakeWeights: Send + Sync {
    /// Receives one bucket of update `version`; its pieces' checksums are checked now.
    async fn take_bucket(&self, version: u64, bucket: WeightBucket) -> Result<(), RoleError>;
    /// Applies the buckets of `version` received, verified by their checksums and `probe`.
    async fn apply_weights(&self, version: u64, probe: Probe) -> Result<RefitReport, RoleError>;
}

/// Saving and loading a trainer's state.
#[async_trait]
pub trait Persist: Send + Sync {
    /// Saves the weights (HF layout) and, with `optimizer`, the optimizer state into `dir`;
    /// `phase` names the call in errors.
    async fn save(
        &self,
        phase: &'static str,
        dir: PathBuf,
        optimizer: bool,
    ) -> Result<(), RoleError>;
    /// Loads the optimizer state saved by [`Persist::save`] from `dir`.
    async fn load_optimizer(&self, dir: PathBuf) -> Result<(), RoleError>;
}

/// A reward model's training (`run.kind = "rm"`): Bradley–Terry updates on preference
/// pairs, sequence scores, and the trained model saved.
#[async_trait]
pub trait TrainRewardModel: Send + Sync {
    /// One update; row `i` of `chosen` and `rejected` is pair `i`.
    async fn train(
        &self,
        chosen: Sequences,
        rejected: Sequences,
        lr: f64,
        max_grad_norm: f64,
    ) -> Result<RmStepSummary, RoleError>;
    /// One score per row of `seqs` (prompt + response).
    async fn score(&self, seqs: Sequences) -> Result<Vec<f64>, RoleError>;
    /// Saves the model as an HF `*ForSequenceClassification` folder `dir`.
    async fn save_model(&self, dir: PathBuf) -> Result<(), RoleError>;
}

/// Ends a role, including a call it is hung in.
#[async_trait]
pub trait Stop: Send + Sync {
    /// Stops the role and waits at most `wait` for it to be gone.
    async fn stop(&self, wait: Duration) -> Result<(), RoleError>;
    /// Asks the role to stop after its current work, without waiting (the end of a run).
    fn shutdown(&self);
    /// Ends the role at the end of a run: what it reported reaches the controller's
    /// monitor first. A local role reports there directly, so it is only asked to stop.
    async fn finish(&self) {
        self.shutdown();
    }
}

/// Everything the controller asks of the policy.
pub trait PolicyRole:
    Generate + Logprobs + TrainPolicy + Refit + ExportWeights + Persist + Stop
{
}
impl<T: Generate + Logprobs + TrainPolicy + Refit + ExportWeights + Persist + Stop> PolicyRole
    for T
{
}

/// Everything the controller asks of the engine role.
pub trait EngineRole: Generate + TakeWeights + Stop {}
impl<T: Generate + TakeWeights + Stop> EngineRole for T {}

/// Everything the controller asks of the reference.
pub trait ReferenceRole: Logprobs + Stop {}
impl<T: Logprobs + Stop> ReferenceRole for T {}

/// Everything the controller asks of the reward.
pub trait RewardRole: Rewards + Stop {}
impl<T: Rewards + Stop> RewardRole for T {}

/// Everything the controller asks of a reward model in training.
pub trait RewardModelRole: TrainRewardModel + Stop {}
impl<T: TrainRewardModel + Stop> RewardModelRole for T {}

/// Everything the controller asks of the critic.
pub trait CriticRole: Values + TrainCritic + Persist + Stop {}
impl<T: Values + TrainCritic + Persist + Stop> CriticRole for T {}

/// A role served by an actor of this process, each call bounded by `timeout`.
pub struct Local<M: ractor::Message> {
    role: &'static str,
    actor: ActorRef<M>,
    timeout: Duration,
}

impl<M: ractor::Message> Local<M> {
    /// Role `role` (`"policy"`, ...) served by `actor`.
    pub fn new(role: &'static str, actor: ActorRef<M>, timeout: Duration) -> Self {
        Self {
            role,
            actor,
            timeout,
        }
    }

    /// The actor.
    pub fn actor(&self) -> &ActorRef<M> {
        &self.actor
    }

    async fn call<T: Send + 'static>(
        &self,
        phase: &'static str,
        build: impl FnOnce(RpcReplyPort<Result<T, RoleError>>) -> M,
    ) -> Result<T, RoleError> {
        ask(self.role, phase, &self.actor, self.timeout, build).await
    }
}

#[async_trait]
impl<M: ractor::Message> Stop for Local<M> {
    async fn stop(&self, wait: Duration) -> Result<(), RoleError> {
        self.actor
            .kill_and_wait(Some(wait))
            .await
            .map_err(|m| RoleError::new(self.role, "restart", Cause::Unreachable(m.to_string())))
    }

    fn shutdown(&self) {
        self.actor.stop(None);
    }
}

#[async_trait]
impl Generate for Local<PolicyMsg> {
    async fn generate(
        &self,
        request: RolloutRequest,
        label: String,
    ) -> Result<RolloutBatch, RoleError> {
        self.call("generate", |reply| PolicyMsg::Generate {
            request,
            label,
            reply,
        })
        .await
    }
}

#[async_trait]
impl Logprobs for Local<PolicyMsg> {
    async fn logprobs(
        &self,
        phase: &'static str,
        seqs: Sequences,
    ) -> Result<TokenArray, RoleError> {
        self.call(phase, |reply| PolicyMsg::Logprobs { seqs, reply })
            .await
    }
}

#[async_trait]
impl TrainPolicy for Local<PolicyMsg> {
    async fn train(&self, work: PolicyWork) -> Result<PolicyTrainSummary, RoleError> {
        let work = Box::new(work);
        self.call("policy_train", |reply| PolicyMsg::Train { work, reply })
            .await
    }

    async fn sft(
        &self,
        seqs: Sequences,
        lr: f64,
        max_grad_norm: f64,
    ) -> Result<SftStepSummary, RoleError> {
        self.call("sft", |reply| PolicyMsg::Sft {
            seqs,
            lr,
            max_grad_norm,
            reply,
        })
        .await
    }

    async fn dpo(&self, work: DpoWork) -> Result<DpoSummary, RoleError> {
        let work = Box::new(work);
        self.call("dpo", |reply| PolicyMsg::Dpo { work, reply })
            .await
    }

    async fn frozen_base(&self) -> Result<Option<FrozenBase>, RoleError> {
        self.call("frozen_base", |reply| PolicyMsg::FrozenBase { reply })
            .await
    }
}

#[async_trait]
impl Refit for Local<PolicyMsg> {
    async fn refit(&self, version: u64) -> Result<RefitReport, RoleError> {
        self.call("refit", |reply| PolicyMsg::Refit { version, reply })
            .await
    }
}

#[async_trait]
impl ExportWeights for Local<PolicyMsg> {
    async fn export_weights(
        &self,
        version: u64,
        bucket_bytes: usize,
    ) -> Result<WeightExport, RoleError> {
        self.call("refit", |reply| PolicyMsg::ExportWeights {
            version,
            bucket_bytes,
            reply,
        })
        .await
    }
}

#[async_trait]
impl Generate for Local<EngineMsg> {
    async fn generate(
        &self,
        request: RolloutRequest,
        label: String,
    ) -> Result<RolloutBatch, RoleError> {
        self.call("generate", |reply| EngineMsg::Generate {
            request,
            label,
            reply,
        })
        .await
    }
}

#[async_trait]
impl TakeWeights for Local<EngineMsg> {
    async fn take_bucket(&self, version: u64, bucket: WeightBucket) -> Result<(), RoleError> {
        self.call("refit", |reply| EngineMsg::Bucket {
            version,
            bucket,
            reply,
        })
        .await
    }

    async fn apply_weights(&self, version: u64, probe: Probe) -> Result<RefitReport, RoleError> {
        let probe = Box::new(probe);
        self.call("refit", |reply| EngineMsg::Apply {
            version,
            probe,
            reply,
        })
        .await
    }
}

#[async_trait]
impl Persist for Local<PolicyMsg> {
    async fn save(
        &self,
        phase: &'static str,
        dir: PathBuf,
        optimizer: bool,
    ) -> Result<(), RoleError> {
        self.call(phase, |reply| PolicyMsg::Save {
            dir,
            optimizer,
            reply,
        })
        .await
    }

    async fn load_optimizer(&self, dir: PathBuf) -> Result<(), RoleError> {
        self.call(LOAD_OPTIMIZER, |reply| PolicyMsg::LoadOptimizer {
            dir,
            reply,
        })
        .await
    }
}

#[async_trait]
impl Logprobs for Local<ReferenceMsg> {
    async fn logprobs(
        &self,
        phase: &'static str,
        seqs: Sequences,
    ) -> Result<TokenArray, RoleError> {
        self.call(phase, |reply| ReferenceMsg::Logprobs { seqs, reply })
            .await
    }
}

#[async_trait]
impl Rewards for Local<RewardMsg> {
    async fn rewards(&self, r: RewardRequest) -> Result<Vec<f32>, RoleError> {
        self.call("reward", |reply| RewardMsg::Score {
            seqs: r.seqs,
            prompts: r.prompts,
            texts: r.texts,
            answers: r.answers,
            columns: r.columns,
            reply,
        })
        .await
    }
}

#[async_trait]
impl Values for Local<CriticMsg> {
    async fn values(&self, seqs: Sequences) -> Result<TokenArray, RoleError> {
        self.call("values", |reply| CriticMsg::Values { seqs, reply })
            .await
    }
}

#[async_trait]
impl TrainCritic for Local<CriticMsg> {
    async fn train(&self, work: CriticWork) -> Result<CriticTrainSummary, RoleError> {
        let work = Box::new(work);
        self.call("critic_train", |reply| CriticMsg::Train { work, reply })
            .await
    }
}

#[async_trait]
impl Persist for Local<CriticMsg> {
    /// A critic always saves its optimizer with its weights (`optimizer` is not consulted).
    async fn save(
        &self,
        phase: &'static str,
        dir: PathBuf,
        _optimizer: bool,
    ) -> Result<(), RoleError> {
        self.call(phase, |reply| CriticMsg::Save { dir, reply })
            .await
    }

    async fn load_optimizer(&self, dir: PathBuf) -> Result<(), RoleError> {
        self.call(LOAD_OPTIMIZER, |reply| CriticMsg::LoadOptimizer {
            dir,
            reply,
        })
        .await
    }
}

#[async_trait]
impl TrainRewardModel for Local<RmTrainerMsg> {
    async fn train(
        &self,
        chosen: Sequences,
        rejected: Sequences,
        lr: f64,
        max_grad_norm: f64,
    ) -> Result<RmStepSummary, RoleError> {
        self.call("rm_train", |reply| RmTrainerMsg::Train {
            chosen,
            rejected,
            lr,
            max_grad_norm,
            reply,
        })
        .await
    }

    async fn score(&self, seqs: Sequences) -> Result<Vec<f64>, RoleError> {
        self.call("rm_score", |reply| RmTrainerMsg::Score { seqs, reply })
            .await
    }

    async fn save_model(&self, dir: PathBuf) -> Result<(), RoleError> {
        self.call("save", |reply| RmTrainerMsg::Save { dir, reply })
            .await
    }
}
