//! The policy actor: generates rollouts with its engine (paged KV cache, continuous
//! batching), reports old log-probs, trains (SFT and PPO) with data-parallel replicas, and
//! refits the engine from the trainer after each update, verified and versioned. Messages
//! carry host data only; the replicas' jobs (`replica.rs`, `engine.rs`, `train.rs`) move it
//! onto their devices.
//!
//! The trainers and the engines are separate replicas on separate executor lanes, and a
//! generation request is served off the actor's mailbox, so the engine can generate the next
//! batch while the trainer updates on this one (`rl.max_staleness`). A refit's engine job
//! queues behind any generation still running on the engine's lane.
//!
//! With `placement.engine` the policy has no engine of its own: the engine is a role of its
//! own (`roles/rollout_engine.rs`), and a refit exports the trainer's weights as buckets
//! ([`PolicyMsg::ExportWeights`]) for the controller to send there.

use super::dpo::{dpo_update, DpoSummary, DpoWork};
use super::engine::generate;
use super::engine::EngineReplica;
use super::replica::PolicyReplica;
use super::train::{ppo_update, sft_step};
use super::train::{PolicyTrainSummary, PolicyWork, SftStepSummary};
use crate::batch::{RolloutBatch, RolloutRequest, Sequences, TokenArray, WeightExport};
use crate::error::{Cause, RoleError, LOAD_OPTIMIZER};
use crate::monitor::MonitorHandle;
use crate::replicas::{shard_ranges, Replicas};
use crate::roles::finite::refuse_non_finite;
use crate::roles::minibatch::local_weight;
use crate::roles::rows::concat_rows;
use crate::roles::sharded;
use crate::roles::{Busy, FrozenBase};
use oxalign_models::engine::RefitReport;
use oxalign_rlhf::losses::LossAgg;
use oxalign_rlhf::trainer::Sharded;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Messages the policy understands.
pub enum PolicyMsg {
    /// Complete each sample of `request`; the batch holds them in request order.
    Generate {
        /// Prompt ids, sampling and limits of each sample.
        request: RolloutRequest,
        /// Label for the monitor, e.g. `"generate step 3"`.
        label: String,
        /// The samples and the policy version that generated them.
        reply: RpcReplyPort<Result<RolloutBatch, RoleError>>,
    },
    /// Old log-probs `[B, T-1]` of `seqs` under the current weights.
    Logprobs {
        /// The sequences.
        seqs: Sequences,
        /// The log-probs.
        reply: RpcReplyPort<Result<TokenArray, RoleError>>,
    },
    /// One SFT step on `seqs` (responses are the targets). Replies with its summary.
    Sft {
        /// The sequences.
        seqs: Sequences,
        /// Learning rate.
        lr: f64,
        /// Gradient clip.
        max_grad_norm: f64,
        /// NLL, pre-clip grad norm, divergence.
        reply: RpcReplyPort<Result<SftStepSummary, RoleError>>,
    },
    /// One preference (DPO) update.
    Dpo {
        /// The pairs, the reference's log-probs and the settings (boxed: it is large).
        work: Box<DpoWork>,
        /// Summary.
        reply: RpcReplyPort<Result<DpoSummary, RoleError>>,
    },
    /// One PPO update.
    Train {
        /// The experience and the loss settings (boxed: it is the largest message).
        work: Box<PolicyWork>,
        /// Summary.
        reply: RpcReplyPort<Result<PolicyTrainSummary, RoleError>>,
    },
    /// Copies the trainer's weights into the engine as `version`, verified by per-tensor
    /// checksums and a log-prob probe. Replies with rank 0's report.
    Refit {
        /// New weight version (must increase).
        version: u64,
        /// The report.
        reply: RpcReplyPort<Result<RefitReport, RoleError>>,
    },
    /// Rank 0's weights (a sharded trainer gathers them) as buckets for an engine role.
    ExportWeights {
        /// The version the weights become.
        version: u64,
        /// Largest bucket, bytes.
        bucket_bytes: usize,
        /// The buckets and the probe.
        reply: RpcReplyPort<Result<WeightExport, RoleError>>,
    },
    /// Saves rank 0's weights (HF layout) and, with `optimizer`, its AdamW state into `dir`.
    Save {
        /// Target folder.
        dir: PathBuf,
        /// Also save the optimizer state.
        optimizer: bool,
        /// Done.
        reply: RpcReplyPort<Result<(), RoleError>>,
    },
    /// Loads the AdamW state saved by `Save` into every replica.
    LoadOptimizer {
        /// Source folder.
        dir: PathBuf,
        /// Done.
        reply: RpcReplyPort<Result<(), RoleError>>,
    },
    /// The frozen base of a LoRA policy's replicas (`None` without adapters).
    FrozenBase {
        /// The base models and their folder.
        reply: RpcReplyPort<Result<Option<FrozenBase>, RoleError>>,
    },
}

// A local-only message (the cluster feature of ractor needs each message type to say so).
impl ractor::Message for PolicyMsg {}

/// The policy actor.
pub struct Policy;

/// The policy's state: its trainer and engine replicas (one of each per device; no engines
/// when the engine is a role of its own) and its monitor.
pub struct PolicyState {
    replicas: Replicas<PolicyReplica>,
    engines: Option<Replicas<EngineReplica>>,
    monitor: MonitorHandle,
    name: String,
}

impl PolicyState {
    /// State over already-built replicas: `replicas` (trainers) and `engines`, one per
    /// device of the same group, rank by rank (`None` when an engine role serves the policy).
    pub fn new(
        replicas: Replicas<PolicyReplica>,
        engines: Option<Replicas<EngineReplica>>,
        monitor: MonitorHandle,
    ) -> Self {
        Self {
            replicas,
            engines,
            monitor,
            name: "policy".into(),
        }
    }

    /// Serves a generation request off the mailbox, so later messages (an update, old
    /// log-probs) are handled while the engine generates.
    fn spawn_generate(
        &self,
        request: RolloutRequest,
        label: String,
        reply: RpcReplyPort<Result<RolloutBatch, RoleError>>,
    ) {
        let (engines, monitor, name) = (
            self.engines.clone(),
            self.monitor.clone(),
            self.name.clone(),
        );
        tokio::spawn(async move {
            let started = Instant::now();
            let busy = Busy::start(&monitor, &name, label);
            let n = request.samples.len();
            let r = match &engines {
                Some(engines) => generate(engines, request).await,
                None => Err(no_engine("generate")),
            };
            busy.done(&r, n, started.elapsed().as_secs_f64());
            let _ = reply.send(r);
        });
    }

    async fn logprobs(&self, seqs: Sequences) -> Result<TokenArray, RoleError> {
        let seqs = Arc::new(seqs);
        let parts = self
            .replicas
            .each("old_logprobs", move |ctx, rep| {
                let range = shard_ranges(seqs.len(), ctx.world)[ctx.rank].clone();
                sharded::with_policy_gathered(ctx, rep, |rep| {
                    let spread = rep.trainer.is_expert_parallel();
                    match (range.is_empty(), spread) {
                        (false, _) => rep.logprobs(&seqs, range).map(Some),
                        // An expert-parallel rank without rows still runs a forward (its
                        // peers exchange rows with it in every sparse layer): one stand-in
                        // row, dropped.
                        (true, true) if !seqs.is_empty() => rep.logprobs(&seqs, 0..1).map(|_| None),
                        (true, _) => Ok(None),
                    }
                })
            })
            .await?;
        concat_rows("policy", "old_logprobs", parts)
    }

    async fn sft(
        &self,
        seqs: Sequences,
        lr: f64,
        max_grad_norm: f64,
    ) -> Result<SftStepSummary, RoleError> {
        let seqs = Arc::new(seqs);
        let mut v = self
            .replicas
            .each("sft", move |ctx, rep| {
                let t = &mut rep.trainer;
                let device = t.model.device().clone();
                let full = seqs.batch(&device)?;
                let range = shard_ranges(seqs.len(), ctx.world)[ctx.rank].clone();
                let local = seqs.batch_rows(range, &device)?;
                let (tokens, rows) = (full.response_tokens(), full.rows());
                let weight = local_weight(ctx, LossAgg::TokenMean, &local, tokens, rows);
                sft_step(t, &local, lr, max_grad_norm, weight, ctx)
            })
            .await?;
        Ok(v.swap_remove(0))
    }

    async fn train(&self, work: Box<PolicyWork>) -> Result<PolicyTrainSummary, RoleError> {
        let work: Arc<PolicyWork> = Arc::from(work);
        let mut v = self
            .replicas
            .each("policy_train", move |ctx, rep| {
                ppo_update(ctx, &mut rep.trainer, &work)
            })
            .await?;
        Ok(v.swap_remove(0))
    }

    async fn dpo(&self, work: Box<DpoWork>) -> Result<DpoSummary, RoleError> {
        let work: Arc<DpoWork> = Arc::from(work);
        let mut v = self
            .replicas
            .each("dpo", move |ctx, rep| {
                dpo_update(ctx, &mut rep.trainer, &work)
            })
            .await?;
        Ok(v.swap_remove(0))
    }

    /// Each trainer exports its weights and probe; its rank's engine takes them (after any
    /// generation still running on it), verified.
    async fn refit(&self, version: u64) -> Result<RefitReport, RoleError> {
        let updates = self
            .replicas
            .each("refit", move |ctx, rep| {
                sharded::with_policy_gathered(ctx, rep, |rep| rep.refit_update(version))
            })
            .await?;
        let updates = Arc::new(updates);
        let engines = self.engines.as_ref().ok_or_else(|| no_engine("refit"))?;
        let mut v = engines
            .each("refit", move |ctx, rep| {
                let (update, probe) = &updates[ctx.rank];
                rep.refit(update, probe)
            })
            .await?;
        Ok(v.swap_remove(0))
    }

    /// Rank 0's weights as buckets of at most `bucket_bytes` (every rank joins a sharded
    /// trainer's gather; the others export nothing).
    async fn export(&self, version: u64, bucket_bytes: usize) -> Result<WeightExport, RoleError> {
        let mut v = self
            .replicas
            .each("refit", move |ctx, rep| {
                sharded::with_policy_gathered(ctx, rep, |rep| match ctx.rank {
                    0 => rep.export(version, bucket_bytes).map(Some),
                    _ => Ok(None),
                })
            })
            .await?;
        v.swap_remove(0).ok_or_else(|| {
            RoleError::new(
                "policy",
                "refit",
                Cause::Unreachable("rank 0 exported nothing".into()),
            )
        })
    }

    async fn frozen_base(&self) -> Result<Option<FrozenBase>, RoleError> {
        let bases = self
            .replicas
            .each("frozen_base", |_, rep| {
                let m = &rep.trainer.model;
                let folder = m.adapter_base().map(PathBuf::from);
                Ok(folder.map(|f| m.base_model().map(|b| (f, b))).transpose()?)
            })
            .await?;
        let Some(Some((folder, _))) = bases.first() else {
            return Ok(None);
        };
        let folder = folder.clone();
        let models = bases.into_iter().flatten().map(|(_, m)| m).collect();
        Ok(Some(FrozenBase { folder, models }))
    }

    async fn load_optimizer(&self, dir: PathBuf) -> Result<(), RoleError> {
        self.replicas
            .each(LOAD_OPTIMIZER, move |_, rep| {
                sharded::load_optimizer(&mut rep.trainer, &dir)
            })
            .await
            .map(|_| ())
    }

    async fn save(&self, dir: PathBuf, optimizer: bool) -> Result<(), RoleError> {
        self.replicas
            .each("save", move |ctx, rep| {
                sharded::save_replica(ctx, &mut rep.trainer, &dir, optimizer, |t| {
                    refuse_non_finite(&t.model.vars())?;
                    Ok(t.model.save(&dir)?)
                })
            })
            .await
            .map(|_| ())
    }
}

impl Actor for Policy {
    type Msg = PolicyMsg;
    type State = PolicyState;
    type Arguments = PolicyState;

    async fn pre_start(
        &self,
        _me: ActorRef<Self::Msg>,
        args: PolicyState,
    ) -> Result<PolicyState, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _me: ActorRef<Self::Msg>,
        msg: PolicyMsg,
        st: &mut PolicyState,
    ) -> Result<(), ActorProcessingErr> {
        let started = Instant::now();
        let secs = || started.elapsed().as_secs_f64();
        match msg {
            PolicyMsg::Generate {
                request,
                label,
                reply,
            } => st.spawn_generate(request, label, reply),
            PolicyMsg::Logprobs { seqs, reply } => {
                let busy = Busy::start(&st.monitor, &st.name, "logprobs".into());
                let n = seqs.len();
                let r = st.logprobs(seqs).await;
                busy.done(&r, n, secs());
                let _ = reply.send(r);
            }
            PolicyMsg::Sft {
                seqs,
                lr,
                max_grad_norm,
                reply,
            } => {
                let busy = Busy::start(&st.monitor, &st.name, "sft".into());
                let n = seqs.len();
                let r = st.sft(seqs, lr, max_grad_norm).await;
                busy.done(&r, n, secs());
                let _ = reply.send(r);
            }
            PolicyMsg::Train { work, reply } => {
                let busy = Busy::start(&st.monitor, &st.name, "policy_train".into());
                let n = work.batch.seqs.len() * work.epochs;
                let r = st.train(work).await;
                busy.done(&r, n, secs());
                let _ = reply.send(r);
            }
            PolicyMsg::Dpo { work, reply } => {
                let busy = Busy::start(&st.monitor, &st.name, "dpo".into());
                let n = work.chosen.len();
                let r = st.dpo(work).await;
                busy.done(&r, n, secs());
                let _ = reply.send(r);
            }
            PolicyMsg::Refit { version, reply } => {
                let busy = Busy::start(&st.monitor, &st.name, format!("refit v{version}"));
                let r = st.refit(version).await;
                busy.done(&r, 1, secs());
                let _ = reply.send(r);
            }
            PolicyMsg::ExportWeights {
                version,
                bucket_bytes,
                reply,
            } => {
                let busy = Busy::start(&st.monitor, &st.name, format!("export v{version}"));
                let r = st.export(version, bucket_bytes).await;
                busy.done(&r, 1, secs());
                let _ = reply.send(r);
            }
            PolicyMsg::Save {
                dir,
                optimizer,
                reply,
            } => {
                let _ = reply.send(st.save(dir, optimizer).await);
            }
            PolicyMsg::LoadOptimizer { dir, reply } => {
                let _ = reply.send(st.load_optimizer(dir).await);
            }
            PolicyMsg::FrozenBase { reply } => {
                let _ = reply.send(st.frozen_base().await);
            }
        }
        Ok(())
    }
}

/// The error of a generation or refit asked of a policy whose engine is a role of its own.
fn no_engine(phase: &'static str) -> RoleError {
    RoleError::new(
        "policy",
        phase,
        Cause::Unsupported(crate::error::Unsupported::PolicyEngine),
    )
}
