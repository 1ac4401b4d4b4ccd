//! The reward-model trainer actor (`run.kind = "rm"`): Bradley–Terry updates of an HF
//! `*ForSequenceClassification` model on preference pairs, held-out scoring, and saving. Each
//! replica trains on its share of the pairs; gradients are averaged. Messages carry host data.

use super::divergence::{after_one_update, Divergence};
use super::finite::refuse_non_finite;
use super::{Busy, Sequences};
use crate::error::{Cause, RoleError};
use crate::monitor::MonitorHandle;
use crate::replicas::{shard_ranges, ReplicaCtx, Replicas};
use oxalign_rlhf::losses::BradleyTerryStats;
use oxalign_rlhf::trainer::RewardTrainer;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Messages the reward-model trainer understands.
pub enum RmTrainerMsg {
    /// One Bradley–Terry update; row `i` of `chosen` and `rejected` is pair `i`.
    Train {
        /// Prompt + chosen response per pair.
        chosen: Sequences,
        /// Prompt + rejected response per pair.
        rejected: Sequences,
        /// Learning rate.
        lr: f64,
        /// Gradient clip.
        max_grad_norm: f64,
        /// The update's summary.
        reply: RpcReplyPort<Result<RmStepSummary, RoleError>>,
    },
    /// Sequence scores of `seqs` (prompt + response), in row order.
    Score {
        /// The sequences.
        seqs: Sequences,
        /// One score per row.
        reply: RpcReplyPort<Result<Vec<f64>, RoleError>>,
    },
    /// Saves rank 0's model as an HF `*ForSequenceClassification` folder.
    Save {
        /// Target folder.
        dir: PathBuf,
        /// Done.
        reply: RpcReplyPort<Result<(), RoleError>>,
    },
}

// A local-only message (the cluster feature of ractor needs each message type to say so).
impl ractor::Message for RmTrainerMsg {}

/// What one update did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RmStepSummary {
    /// Loss, accuracy and margin of the batch (rank 0's rows).
    pub stats: BradleyTerryStats,
    /// Pre-clip global gradient norm.
    pub grad_norm: f64,
    /// Set when the update was not applied because it diverged.
    pub diverged: Option<Divergence>,
}

/// The reward-model trainer actor.
pub struct RmTrainer;

/// Its replicas and monitor.
pub struct RmTrainerState {
    replicas: Replicas<RewardTrainer>,
    monitor: MonitorHandle,
}

impl RmTrainerState {
    /// State over built replicas.
    pub fn new(replicas: Replicas<RewardTrainer>, monitor: MonitorHandle) -> Self {
        Self { replicas, monitor }
    }
}

fn rm_update(
    ctx: &ReplicaCtx<'_>,
    t: &mut RewardTrainer,
    pairs: &(Sequences, Sequences, f64, f64),
) -> Result<RmStepSummary, Cause> {
    let (chosen, rejected, lr, clip) = pairs;
    let device = t.model.device().clone();
    let range = shard_ranges(chosen.len(), ctx.world)[ctx.rank].clone();
    let weight = range.len() as f64 / chosen.len().max(1) as f64 * ctx.world as f64;
    let c = chosen.batch_rows(range.clone(), &device)?;
    let r = rejected.batch_rows(range, &device)?;
    match t.step(&c, &r, *lr, *clip, weight, ctx.collective) {
        Ok((stats, step)) => {
            let diverged = after_one_update(&step, &t.model.vars())?;
            Ok(RmStepSummary {
                stats,
                grad_norm: step.grad_norm,
                diverged,
            })
        }
        Err(err) => match Divergence::from_rlhf(&err, 1) {
            Some(d) => Ok(RmStepSummary {
                diverged: Some(d),
                ..RmStepSummary::default()
            }),
            None => Err(err.into()),
        },
    }
}

impl Actor for RmTrainer {
    type Msg = RmTrainerMsg;
    type State = RmTrainerState;
    type Arguments = RmTrainerState;

    async fn pre_start(
        &self,
        _me: ActorRef<Self::Msg>,
        a: RmTrainerState,
    ) -> Result<RmTrainerState, ActorProcessingErr> {
        Ok(a)
    }

    async fn handle(
        &self,
        _me: ActorRef<Self::Msg>,
        msg: RmTrainerMsg,
        st: &mut RmTrainerState,
    ) -> Result<(), ActorProcessingErr> {
        let started = Instant::now();
        let secs = || started.elapsed().as_secs_f64();
        match msg {
            RmTrainerMsg::Train {
                chosen,
                rejected,
                lr,
                max_grad_norm,
                reply,
            } => {
                let busy = Busy::start(&st.monitor, "reward_model", "rm_train".into());
                let n = chosen.len();
                let work = Arc::new((chosen, rejected, lr, max_grad_norm));
                let r = st
                    .replicas
                    .each("rm_train", move |ctx, t| rm_update(ctx, t, &work))
                    .await
                    .map(|mut v| v.swap_remove(0));
                busy.done(&r, n, secs());
                let _ = reply.send(r);
            }
            RmTrainerMsg::Score { seqs, reply } => {
                let busy = Busy::start(&st.monitor, "reward_model", "rm_score".into());
                let n = seqs.len();
                let seqs = Arc::new(seqs);
                let r = st
                    .replicas
                    .each("rm_score", move |ctx, t| {
                        let range = shard_ranges(seqs.len(), ctx.world)[ctx.rank].clone();
                        if range.is_empty() {
                            return Ok(Vec::new());
                        }
                        let b = seqs.batch_rows(range, t.model.device())?;
                        Ok(t.scores(&b)?)
                    })
                    .await
                    .map(|parts| parts.into_iter().flatten().collect());
                busy.done(&r, n, secs());
                let _ = reply.send(r);
            }
            RmTrainerMsg::Save { dir, reply } => {
                let r = st
                    .replicas
                    .each("save", move |ctx, t| {
                        if ctx.rank == 0 {
                            refuse_non_finite(&t.model.vars())?;
                            t.model.save(&dir)?;
                        }
                        Ok(())
                    })
                    .await
                    .map(|_| ());
                let _ = reply.send(r);
            }
        }
        Ok(())
    }
}
