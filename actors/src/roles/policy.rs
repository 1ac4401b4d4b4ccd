//! The policy actor: generates rollouts with its engine (paged KV cache, continuous
//! batching), reports trainer log-probs, trains (SFT and PPO) with data-parallel replicas,
//! and refits the engine from the trainer after each update, verified and versioned.

use super::divergence::{non_finite_weight, Divergence};
use super::minibatch::{local_weight, minibatch_order, Shard};
use super::{Busy, Sequences};
use crate::error::{Cause, RoleError, LOAD_OPTIMIZER};
use crate::monitor::MonitorHandle;
use crate::replicas::{shard_ranges, ReplicaCtx, Replicas};
use candle_core::{Device, Tensor};
use oxalign_models::engine::{Engine, EngineConfig, Probe, QuantMode, RefitReport, WeightUpdate};
use oxalign_models::{Completion, GenerationRequest};
use oxalign_rlhf::losses::LossAgg;
use oxalign_rlhf::trainer::{PolicyLossConfig, PolicyStats, PolicyTrainer};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Everything one PPO update of the policy needs. `[B, T-1]` tensors align with
/// `seqs.batch()`'s response mask.
pub struct PolicyWork {
    /// The rollout's sequences.
    pub seqs: Arc<Sequences>,
    /// Trainer log-probs before the update.
    pub old_logprobs: Tensor,
    /// Advantages.
    pub advantages: Tensor,
    /// Reference log-probs (for a KL loss term).
    pub ref_logprobs: Tensor,
    /// The engine's log-probs (for truncated importance sampling).
    pub rollout_logprobs: Tensor,
    /// Loss settings.
    pub cfg: PolicyLossConfig,
    /// Learning rate for this update.
    pub lr: f64,
    /// Passes over the batch.
    pub epochs: usize,
    /// Rows per minibatch (global, before the data-parallel split).
    pub minibatch_size: usize,
    /// Seed of the minibatch order.
    pub shuffle_seed: u64,
}

/// Averages of one PPO update over its minibatches.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PolicyTrainSummary {
    /// Mean of the per-minibatch stats (rank 0's view; gradients are global).
    pub stats: PolicyStats,
    /// Minibatch updates applied.
    pub updates: usize,
    /// Updates skipped for a non-finite gradient.
    pub skipped: usize,
    /// Set when the update stopped on a divergence (the rest of the step was not applied).
    pub diverged: Option<Divergence>,
}

/// What one SFT step did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SftStepSummary {
    /// Mean NLL per answer token (nats).
    pub nll: f64,
    /// Pre-clip global gradient norm.
    pub grad_norm: f64,
    /// Set when the step was not applied because it diverged.
    pub diverged: Option<Divergence>,
}

/// One replica of the policy: the trainer and the engine that generates its rollouts.
///
/// The engine holds its own copy of the weights; a training step reaches it only through
/// [`PolicyMsg::Refit`].
pub struct PolicyReplica {
    /// Model + optimizer.
    pub trainer: PolicyTrainer,
    /// Generation engine.
    pub engine: Engine,
    refit_tolerance: f32,
}

impl PolicyReplica {
    /// A replica whose engine starts from the trainer's current weights.
    pub fn new(
        trainer: PolicyTrainer,
        engine: EngineConfig,
        refit_tolerance: f32,
    ) -> Result<Self, Cause> {
        let engine = Engine::from_model(&trainer.model, engine)?;
        Ok(Self {
            trainer,
            engine,
            refit_tolerance,
        })
    }

    /// Log-probs `[rows, T-1]` of rows `range` under the current weights. An f32 engine
    /// serves the trainer's exact weights in the trainer's precision (every refit is
    /// verified against the trainer by checksums and a log-prob probe), so it scores with
    /// batched prefill forwards and no `[B, T, V]` logits; a quantized engine does not, and
    /// the trainer's own forward scores instead.
    fn logprobs(
        &mut self,
        seqs: &Sequences,
        range: std::ops::Range<usize>,
    ) -> Result<Tensor, Cause> {
        let device = dev(&self.trainer);
        if self.engine.config().quant == QuantMode::None {
            return seqs.engine_logprobs(&mut self.engine, range, &device);
        }
        let b = seqs.batch_rows(range, &device)?;
        Ok(self.trainer.logprobs(&b)?)
    }

    fn refit(&mut self, version: u64) -> Result<RefitReport, Cause> {
        let model = &self.trainer.model;
        let vocab = model.config().vocab_size as u32;
        // A fixed probe sequence: the engine's log-probs on it must match the trainer's.
        let probe_tokens: Vec<u32> = (0..16u32).map(|i| (i * 37 + 11) % vocab.max(1)).collect();
        let probe = Probe::from_model(model, probe_tokens, self.refit_tolerance)?;
        let update = WeightUpdate::from_model(version, model)?;
        Ok(self.engine.refit(&update, Some(&probe))?)
    }
}

/// Messages the policy understands.
pub enum PolicyMsg {
    /// Complete each request; results in request order.
    Generate {
        /// The requests (prompt ids, sampling, limits).
        requests: Arc<Vec<GenerationRequest>>,
        /// Label for the monitor, e.g. `"generate step 3"`.
        label: String,
        /// The completions.
        reply: RpcReplyPort<Result<Vec<Completion>, RoleError>>,
    },
    /// Trainer log-probs `[B, T-1]` of `seqs`.
    Logprobs {
        /// The sequences.
        seqs: Arc<Sequences>,
        /// The log-probs.
        reply: RpcReplyPort<Result<Tensor, RoleError>>,
    },
    /// One SFT step on `seqs` (responses are the targets). Replies with its summary.
    Sft {
        /// The sequences.
        seqs: Arc<Sequences>,
        /// Learning rate.
        lr: f64,
        /// Gradient clip.
        max_grad_norm: f64,
        /// NLL, pre-clip grad norm, divergence.
        reply: RpcReplyPort<Result<SftStepSummary, RoleError>>,
    },
    /// One PPO update.
    Train {
        /// The work.
        work: Arc<PolicyWork>,
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
}

/// The policy actor.
pub struct Policy;

/// The policy's state: its replicas and its monitor.
pub struct PolicyState {
    replicas: Replicas<PolicyReplica>,
    monitor: MonitorHandle,
    name: String,
}

impl PolicyState {
    /// State over already-built replicas.
    pub fn new(replicas: Replicas<PolicyReplica>, monitor: MonitorHandle) -> Self {
        Self {
            replicas,
            monitor,
            name: "policy".into(),
        }
    }
}

fn dev(t: &PolicyTrainer) -> Device {
    t.model.device().clone()
}

fn ppo_update(
    ctx: &ReplicaCtx<'_>,
    t: &mut PolicyTrainer,
    w: &PolicyWork,
) -> Result<PolicyTrainSummary, Cause> {
    let full = w.seqs.batch(&dev(t))?;
    let mut sum = PolicyStats::default();
    let (mut updates, mut skipped) = (0, 0);
    for mb in minibatch_order(full.rows(), w.minibatch_size, w.epochs, w.shuffle_seed) {
        let shard = Shard::new(ctx, &full, &mb)?;
        let weight = shard.weight(ctx, w.cfg.ppo.agg);
        let s = match t.ppo_step(
            &shard.local,
            &shard.pick(&w.old_logprobs)?,
            &shard.pick(&w.advantages)?,
            Some(&shard.pick(&w.ref_logprobs)?),
            Some(&shard.pick(&w.rollout_logprobs)?),
            &w.cfg,
            w.lr,
            weight,
            ctx.collective,
        ) {
            Ok(s) => s,
            Err(err) => match Divergence::from_rlhf(&err, updates + 1) {
                Some(d) => return Ok(stopped(updates, skipped, d)),
                None => return Err(err.into()),
            },
        };
        updates += 1;
        skipped += usize::from(s.step.skipped);
        if s.step.skipped {
            let d = Divergence::Gradient {
                norm: s.step.grad_norm,
                update: updates,
            };
            return Ok(stopped(updates, skipped, d));
        }
        sum.policy_loss += s.policy_loss;
        sum.clip_frac += s.clip_frac;
        sum.approx_kl += s.approx_kl;
        sum.entropy += s.entropy;
        sum.step.grad_norm += s.step.grad_norm;
    }
    let n = updates.max(1) as f64;
    sum.policy_loss /= n;
    sum.clip_frac /= n;
    sum.approx_kl /= n;
    sum.entropy /= n;
    sum.step.grad_norm /= n;
    let diverged = non_finite_weight(&t.model.vars())?.map(|tensor| Divergence::Weights { tensor });
    Ok(PolicyTrainSummary {
        stats: sum,
        updates,
        skipped,
        diverged,
    })
}

/// Errors when a weight is not finite, so such weights are never saved.
pub(crate) fn refuse_non_finite(named: &[(String, candle_core::Var)]) -> Result<(), Cause> {
    match non_finite_weight(named)? {
        Some(tensor) => Err(Divergence::Weights { tensor }.into()),
        None => Ok(()),
    }
}

/// The summary of an update that stopped on `d`.
fn stopped(updates: usize, skipped: usize, d: Divergence) -> PolicyTrainSummary {
    PolicyTrainSummary {
        stats: PolicyStats::default(),
        updates,
        skipped,
        diverged: Some(d),
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
        match msg {
            PolicyMsg::Generate {
                requests,
                label,
                reply,
            } => {
                let busy = Busy::start(&st.monitor, &st.name, label);
                let n = requests.len();
                let r = st
                    .replicas
                    .each("generate", move |ctx, rep| {
                        let range = shard_ranges(requests.len(), ctx.world)[ctx.rank].clone();
                        if range.is_empty() {
                            return Ok(Vec::new());
                        }
                        Ok(rep.engine.generate(&requests[range])?)
                    })
                    .await
                    .map(|parts| parts.into_iter().flatten().collect::<Vec<_>>());
                busy.done(&r, n, started.elapsed().as_secs_f64());
                let _ = reply.send(r);
            }
            PolicyMsg::Logprobs { seqs, reply } => {
                let busy = Busy::start(&st.monitor, &st.name, "logprobs".into());
                let n = seqs.len();
                let r = st
                    .replicas
                    .each("old_logprobs", move |ctx, rep| {
                        let range = shard_ranges(seqs.len(), ctx.world)[ctx.rank].clone();
                        if range.is_empty() {
                            return Ok(None);
                        }
                        rep.logprobs(&seqs, range).map(Some)
                    })
                    .await
                    .and_then(|parts| concat_rows("policy", "old_logprobs", parts));
                busy.done(&r, n, started.elapsed().as_secs_f64());
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
                let r = st
                    .replicas
                    .each("sft", move |ctx, rep| {
                        let t = &mut rep.trainer;
                        let full = seqs.batch(&dev(t))?;
                        let range = shard_ranges(seqs.len(), ctx.world)[ctx.rank].clone();
                        let local = seqs.batch_rows(range, &dev(t))?;
                        let weight = local_weight(
                            ctx,
                            LossAgg::TokenMean,
                            &local,
                            full.response_tokens(),
                            full.rows(),
                        );
                        sft_step(t, &local, lr, max_grad_norm, weight, ctx)
                    })
                    .await
                    .map(|mut v| v.swap_remove(0));
                busy.done(&r, n, started.elapsed().as_secs_f64());
                let _ = reply.send(r);
            }
            PolicyMsg::Train { work, reply } => {
                let busy = Busy::start(&st.monitor, &st.name, "policy_train".into());
                let n = work.seqs.len() * work.epochs;
                let r = st
                    .replicas
                    .each("policy_train", move |ctx, rep| {
                        ppo_update(ctx, &mut rep.trainer, &work)
                    })
                    .await
                    .map(|mut v| v.swap_remove(0));
                busy.done(&r, n, started.elapsed().as_secs_f64());
                let _ = reply.send(r);
            }
            PolicyMsg::Refit { version, reply } => {
                let busy = Busy::start(&st.monitor, &st.name, format!("refit v{version}"));
                let r = st
                    .replicas
                    .each("refit", move |_, rep| rep.refit(version))
                    .await
                    .map(|mut v| v.swap_remove(0));
                busy.done(&r, 1, started.elapsed().as_secs_f64());
                let _ = reply.send(r);
            }
            PolicyMsg::Save {
                dir,
                optimizer,
                reply,
            } => {
                let r = st
                    .replicas
                    .each("save", move |ctx, rep| {
                        let t = &mut rep.trainer;
                        if ctx.rank != 0 {
                            return Ok(());
                        }
                        refuse_non_finite(&t.model.vars())?;
                        t.model.save(&dir)?;
                        if optimizer {
                            t.opt.save_state(&dir.join("optimizer"))?;
                        }
                        Ok(())
                    })
                    .await
                    .map(|_| ());
                let _ = reply.send(r);
            }
            PolicyMsg::LoadOptimizer { dir, reply } => {
                let r = st
                    .replicas
                    .each(LOAD_OPTIMIZER, move |_, rep| {
                        Ok(rep.trainer.opt.load_state(&dir.join("optimizer"))?)
                    })
                    .await
                    .map(|_| ());
                let _ = reply.send(r);
            }
        }
        Ok(())
    }
}

/// One SFT step of one replica; a divergence is reported in the summary, not applied.
fn sft_step(
    t: &mut PolicyTrainer,
    local: &oxalign_rlhf::trainer::TokenBatch,
    lr: f64,
    max_grad_norm: f64,
    weight: f64,
    ctx: &ReplicaCtx<'_>,
) -> Result<SftStepSummary, Cause> {
    match t.sft_step(local, lr, max_grad_norm, weight, ctx.collective) {
        Ok((nll, step)) => Ok(SftStepSummary {
            nll,
            grad_norm: step.grad_norm,
            diverged: step.skipped.then_some(Divergence::Gradient {
                norm: step.grad_norm,
                update: 1,
            }),
        }),
        Err(err) => match Divergence::from_rlhf(&err, 1) {
            Some(d) => Ok(SftStepSummary {
                nll: f64::NAN,
                grad_norm: f64::NAN,
                diverged: Some(d),
            }),
            None => Err(err.into()),
        },
    }
}

/// Concatenates per-replica `[b_i, T-1]` results of `phase` along rows (skipping empty
/// shards).
pub(crate) fn concat_rows(
    role: &str,
    phase: &'static str,
    parts: Vec<Option<Tensor>>,
) -> Result<Tensor, RoleError> {
    let parts: Vec<Tensor> = parts.into_iter().flatten().collect();
    Tensor::cat(&parts, 0).map_err(|e| RoleError::new(role, phase, e))
}
