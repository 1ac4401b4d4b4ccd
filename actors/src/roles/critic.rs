//! The critic actor (PPO only): per-token values for rollouts and clipped value-loss updates,
//! with data-parallel replicas like the policy. Batches arrive as host data and become tensors
//! on each replica's device inside its job. It starts from `model.critic_path` (a critic, or a
//! reward model whose `score.weight` it reuses with a zero bias) or from the initial policy's
//! backbone with a zero head (`controller::setup::spawn_critic`).

use super::divergence::Divergence;
use super::finite::refuse_non_finite;
use super::minibatch::{minibatch_order, Shard};
use super::rows::concat_rows;
use super::sharded::{load_optimizer, save_replica, with_gathered};
use super::{Busy, Sequences};
use crate::batch::{ExperienceBatch, TokenArray};
use crate::error::{Cause, RoleError, LOAD_OPTIMIZER};
use crate::monitor::MonitorHandle;
use crate::replicas::{shard_ranges, Replicas};
use oxalign_rlhf::losses::LossAgg;
use oxalign_rlhf::trainer::{CriticTrainer, Sharded};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// One critic update: regress values on the batch's `returns` over the response tokens.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CriticWork {
    /// Token ids, values at rollout time and targets (`old_values` and `returns` are
    /// required).
    pub batch: ExperienceBatch,
    /// Value clip range.
    pub clip: Option<f64>,
    /// How per-token value losses are aggregated (the recipe's `rl.loss_agg`).
    pub agg: LossAgg,
    /// Learning rate.
    pub lr: f64,
    /// Gradient clip.
    pub max_grad_norm: f64,
    /// Passes over the batch.
    pub epochs: usize,
    /// Rows per minibatch.
    pub minibatch_size: usize,
    /// Seed of the minibatch order.
    pub shuffle_seed: u64,
}

/// What one critic update did.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct CriticTrainSummary {
    /// Mean value loss over the applied minibatch updates.
    pub value_loss: f64,
    /// Set when the update stopped on a divergence (the rest of the step was not applied).
    pub diverged: Option<Divergence>,
}

/// Messages the critic understands.
pub enum CriticMsg {
    /// Values of every state `[B, T]` of `seqs` (column t: after tokens `..=t`; the first
    /// `T-1` columns align with next-token log-probs, see [`split_state_values`]).
    Values {
        /// The sequences.
        seqs: Sequences,
        /// The values.
        reply: RpcReplyPort<Result<TokenArray, RoleError>>,
    },
    /// One update; replies with the mean value loss and any divergence.
    Train {
        /// The work (boxed: it is the largest message).
        work: Box<CriticWork>,
        /// Mean loss.
        reply: RpcReplyPort<Result<CriticTrainSummary, RoleError>>,
    },
    /// Saves rank 0's model (HF token-classification layout) and optimizer state.
    Save {
        /// Target folder.
        dir: PathBuf,
        /// Done.
        reply: RpcReplyPort<Result<(), RoleError>>,
    },
    /// Loads the optimizer state saved by `Save` into every replica.
    LoadOptimizer {
        /// Source folder.
        dir: PathBuf,
        /// Done.
        reply: RpcReplyPort<Result<(), RoleError>>,
    },
}

// A local-only message (the cluster feature of ractor needs each message type to say so).
impl ractor::Message for CriticMsg {}

/// The critic actor.
pub struct Critic;

/// Its replicas and monitor.
pub struct CriticState {
    replicas: Replicas<CriticTrainer>,
    monitor: MonitorHandle,
}

impl CriticState {
    /// State over built replicas.
    pub fn new(replicas: Replicas<CriticTrainer>, monitor: MonitorHandle) -> Self {
        Self { replicas, monitor }
    }
}

fn critic_update(
    ctx: &crate::replicas::ReplicaCtx<'_>,
    t: &mut CriticTrainer,
    w: &CriticWork,
) -> Result<CriticTrainSummary, Cause> {
    let device = t.model.device().clone();
    let b = &w.batch;
    let full = b.seqs.batch(&device)?;
    let (old_values, returns) = match (&b.old_values, &b.returns) {
        (Some(v), Some(r)) => (v.to_tensor(&device)?, r.to_tensor(&device)?),
        _ => return Err(crate::error::Missing::CriticExperience.into()),
    };
    let order = minibatch_order(
        full.rows(),
        w.minibatch_size,
        w.epochs,
        w.shuffle_seed ^ 0xC21,
    );
    let (mut total, mut n) = (0.0, 0usize);
    let stop = |d| CriticTrainSummary {
        value_loss: f64::NAN,
        diverged: Some(d),
    };
    for mb in order {
        let shard = Shard::new(ctx, &full, &mb)?;
        let weight = shard.weight(ctx, w.agg);
        let (loss, step) = match t.step(
            &shard.local,
            &shard.pick(&old_values)?,
            &shard.pick(&returns)?,
            w.clip,
            w.agg,
            w.lr,
            w.max_grad_norm,
            weight,
            ctx.collective,
        ) {
            Ok(r) => r,
            Err(err) => match Divergence::from_rlhf(&err, n + 1) {
                Some(d) => return Ok(stop(d)),
                None => return Err(err.into()),
            },
        };
        n += 1;
        if step.skipped {
            let norm = step.grad_norm;
            return Ok(stop(Divergence::Gradient { norm, update: n }));
        }
        total += loss;
    }
    let diverged = t
        .first_non_finite_weight(ctx.collective)?
        .map(|tensor| Divergence::Weights { tensor });
    Ok(CriticTrainSummary {
        value_loss: total / n.max(1) as f64,
        diverged,
    })
}

impl Actor for Critic {
    type Msg = CriticMsg;
    type State = CriticState;
    type Arguments = CriticState;

    async fn pre_start(
        &self,
        _me: ActorRef<Self::Msg>,
        a: CriticState,
    ) -> Result<CriticState, ActorProcessingErr> {
        Ok(a)
    }

    async fn handle(
        &self,
        _me: ActorRef<Self::Msg>,
        msg: CriticMsg,
        st: &mut CriticState,
    ) -> Result<(), ActorProcessingErr> {
        let started = Instant::now();
        match msg {
            CriticMsg::Values { seqs, reply } => {
                let busy = Busy::start(&st.monitor, "critic", "values".into());
                let n = seqs.len();
                let seqs = Arc::new(seqs);
                let r = st
                    .replicas
                    .each("values", move |ctx, t| {
                        let range = shard_ranges(seqs.len(), ctx.world)[ctx.rank].clone();
                        with_gathered(ctx, t, |t| {
                            if range.is_empty() {
                                return Ok(None);
                            }
                            let b = seqs.batch_rows(range, t.model.device())?;
                            Ok(Some(TokenArray::from_tensor(&t.state_values(&b)?)?))
                        })
                    })
                    .await
                    .and_then(|parts| concat_rows("critic", "values", parts));
                busy.done(&r, n, started.elapsed().as_secs_f64());
                let _ = reply.send(r);
            }
            CriticMsg::Train { work, reply } => {
                let busy = Busy::start(&st.monitor, "critic", "critic_train".into());
                let n = work.batch.seqs.len() * work.epochs;
                let work: Arc<CriticWork> = Arc::from(work);
                let r = st
                    .replicas
                    .each("critic_train", move |ctx, t| critic_update(ctx, t, &work))
                    .await
                    .map(|mut v| v.swap_remove(0));
                busy.done(&r, n, started.elapsed().as_secs_f64());
                let _ = reply.send(r);
            }
            CriticMsg::Save { dir, reply } => {
                let r = st
                    .replicas
                    .each("save", move |ctx, t| {
                        save_replica(ctx, t, &dir, true, |t| {
                            refuse_non_finite(&t.model.vars())?;
                            Ok(t.model.save(&dir)?)
                        })
                    })
                    .await
                    .map(|_| ());
                let _ = reply.send(r);
            }
            CriticMsg::LoadOptimizer { dir, reply } => {
                let r = st
                    .replicas
                    .each(LOAD_OPTIMIZER, move |_, t| load_optimizer(t, &dir))
                    .await
                    .map(|_| ());
                let _ = reply.send(r);
            }
        }
        Ok(())
    }
}

/// Splits the critic's `[B, T]` state values of `seqs` into the `[B, T-1]` values aligned with
/// next-token log-probs and, per row, the value of the state after its last token.
pub fn split_state_values(full: &TokenArray, seqs: &Sequences) -> (TokenArray, Vec<f32>) {
    let (rows, cols) = (full.rows(), full.cols());
    let width = cols.saturating_sub(1);
    let mut values = TokenArray::zeros(rows, width);
    let mut last = Vec::with_capacity(rows);
    for (i, (p, r)) in seqs.pairs.iter().enumerate() {
        let len = p.len() + r.len();
        let row = &full.data()[i * cols..(i + 1) * cols];
        values.row_mut(i).copy_from_slice(&row[..width]);
        last.push(row[len.clamp(1, cols) - 1]);
    }
    (values, last)
}
