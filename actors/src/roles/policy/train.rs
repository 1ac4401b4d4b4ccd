//! The policy's training jobs, run on each replica's executor: one PPO update over the
//! minibatches of an [`ExperienceBatch`] and one SFT step. The batch arrives as host data and
//! becomes tensors on the replica's device here. A divergence is returned in the summary,
//! never applied.

use crate::batch::ExperienceBatch;
use crate::error::Cause;
use crate::replicas::ReplicaCtx;
use crate::roles::divergence::Divergence;
use crate::roles::minibatch::{minibatch_order, Shard};
use oxalign_rlhf::trainer::{PolicyLossConfig, PolicyStats, PolicyTrainer, Sharded, TokenBatch};

/// Everything one PPO update of the policy needs: the step's experience (host data) and the
/// loss settings.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PolicyWork {
    /// Token ids and the `[B, T-1]` arrays (old, reference and engine log-probs, advantages).
    pub batch: ExperienceBatch,
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
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct PolicyTrainSummary {
    /// Mean of the per-minibatch stats (rank 0's view; gradients are global).
    pub stats: PolicyStats,
    /// Minibatch updates applied.
    pub updates: usize,
    /// Updates skipped for a non-finite gradient.
    pub skipped: usize,
    /// Set when the update stopped on a divergence (the rest of the step was not applied).
    pub diverged: Option<Divergence>,
    /// Mean and max |trainer − engine| log-prob of the sampled tokens (nats), measured on the
    /// first minibatch before any update (rank 0's rows).
    pub rollout_mismatch: (f64, f64),
    /// With rollout routing replay: the fraction of (token, sparse layer) routings of the
    /// first minibatch where the trainer's router would have chosen other experts than the
    /// rollout did (rank 0's rows, before any update). None without replay.
    pub routing_overridden: Option<f64>,
}

/// What one SFT step did.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct SftStepSummary {
    /// Mean NLL per answer token (nats).
    pub nll: f64,
    /// Pre-clip global gradient norm.
    pub grad_norm: f64,
    /// Set when the step was not applied because it diverged.
    pub diverged: Option<Divergence>,
}

/// Adds one minibatch update's statistics to `sum`.
fn add_stats(sum: &mut PolicyStats, s: &PolicyStats) {
    sum.policy_loss += s.policy_loss;
    sum.clip_frac += s.clip_frac;
    sum.approx_kl += s.approx_kl;
    sum.entropy += s.entropy;
    sum.step.grad_norm += s.step.grad_norm;
    if let Some(aux) = s.router_aux_loss {
        sum.router_aux_loss = Some(sum.router_aux_loss.unwrap_or(0.0) + aux);
    }
}

/// The mean over `updates` minibatch updates of the statistics summed in `sum`.
fn mean_stats(sum: &mut PolicyStats, updates: usize) {
    let n = updates.max(1) as f64;
    sum.policy_loss /= n;
    sum.clip_frac /= n;
    sum.approx_kl /= n;
    sum.entropy /= n;
    sum.step.grad_norm /= n;
    sum.router_aux_loss = sum.router_aux_loss.map(|aux| aux / n);
}

/// One PPO update of one replica over the minibatches of `w`.
pub(crate) fn ppo_update(
    ctx: &ReplicaCtx<'_>,
    t: &mut PolicyTrainer,
    w: &PolicyWork,
) -> Result<PolicyTrainSummary, Cause> {
    let device = t.model.device().clone();
    let b = &w.batch;
    let full = b.seqs.batch(&device)?;
    let old_logprobs = b.old_logprobs.to_tensor(&device)?;
    let advantages = b.advantages.to_tensor(&device)?;
    let ref_logprobs = b.ref_logprobs.to_tensor(&device)?;
    let rollout_logprobs = b.rollout_logprobs.to_tensor(&device)?;
    let mut sum = PolicyStats::default();
    let (mut updates, mut skipped) = (0, 0);
    let mut rollout_mismatch = (0.0, 0.0);
    let mut routing_overridden = None;
    for mb in minibatch_order(full.rows(), w.minibatch_size, w.epochs, w.shuffle_seed) {
        let shard = Shard::new(ctx, &full, &mb)?;
        let weight = shard.weight(ctx, w.cfg.ppo.agg);
        let s = match t.ppo_step(
            &shard.local,
            &shard.pick(&old_logprobs)?,
            &shard.pick(&advantages)?,
            Some(&shard.pick(&ref_logprobs)?),
            Some(&shard.pick(&rollout_logprobs)?),
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
        if updates == 0 {
            rollout_mismatch = (s.rollout_mismatch_mean, s.rollout_mismatch_max);
            routing_overridden = shard
                .local
                .routing
                .is_some()
                .then_some(s.routing_overridden);
        }
        updates += 1;
        skipped += usize::from(s.step.skipped);
        if s.step.skipped {
            let d = Divergence::Gradient {
                norm: s.step.grad_norm,
                update: updates,
            };
            return Ok(stopped(updates, skipped, d));
        }
        add_stats(&mut sum, &s);
    }
    mean_stats(&mut sum, updates);
    let diverged = t
        .first_non_finite_weight(ctx.collective)?
        .map(|tensor| Divergence::Weights { tensor });
    Ok(PolicyTrainSummary {
        stats: sum,
        updates,
        skipped,
        diverged,
        rollout_mismatch,
        routing_overridden,
    })
}

/// The summary of an update that stopped on `d`.
fn stopped(updates: usize, skipped: usize, d: Divergence) -> PolicyTrainSummary {
    PolicyTrainSummary {
        stats: PolicyStats::default(),
        updates,
        skipped,
        diverged: Some(d),
        rollout_mismatch: (0.0, 0.0),
        routing_overridden: None,
    }
}

/// One SFT step of one replica; a divergence is reported in the summary, not applied.
pub(crate) fn sft_step(
    t: &mut PolicyTrainer,
    local: &TokenBatch,
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
