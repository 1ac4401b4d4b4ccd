//! The policy's preference update (DPO, cDPO, IPO), run on each replica's executor: the
//! pairs arrive as host data with the reference's summed log-probs (computed once by the
//! reference role), each replica trains on its share of the rows, and gradients are averaged.

use crate::batch::Sequences;
use crate::error::Cause;
use crate::replicas::{shard_ranges, ReplicaCtx};
use crate::roles::divergence::{after_one_update, Divergence};
use candle_core::Tensor;
use oxalign_rlhf::losses::DpoStats;
use oxalign_rlhf::trainer::{DpoConfig, PolicyTrainer};

/// One preference update: row `i` of `chosen` and `rejected` is pair `i`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DpoWork {
    /// Prompt + chosen response per pair.
    pub chosen: Sequences,
    /// Prompt + rejected response per pair.
    pub rejected: Sequences,
    /// The reference's summed response log-probs of the chosen rows (nats).
    pub ref_chosen: Vec<f32>,
    /// The same of the rejected rows.
    pub ref_rejected: Vec<f32>,
    /// β, loss, learning rate, clip.
    pub cfg: DpoConfig,
}

/// What one preference update did.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct DpoSummary {
    /// Loss, implicit rewards, margin and accuracy of the batch (rank 0's rows).
    pub stats: DpoStats,
    /// Pre-clip global gradient norm.
    pub grad_norm: f64,
    /// Set when the update was not applied because it diverged.
    pub diverged: Option<Divergence>,
}

/// One replica's share of `w`.
pub(crate) fn dpo_update(
    ctx: &ReplicaCtx<'_>,
    t: &mut PolicyTrainer,
    w: &DpoWork,
) -> Result<DpoSummary, Cause> {
    let device = t.model.device().clone();
    let range = shard_ranges(w.chosen.len(), ctx.world)[ctx.rank].clone();
    let weight = range.len() as f64 / w.chosen.len().max(1) as f64 * ctx.world as f64;
    let chosen = w.chosen.batch_rows(range.clone(), &device)?;
    let rejected = w.rejected.batch_rows(range.clone(), &device)?;
    let rc = Tensor::new(&w.ref_chosen[range.clone()], &device)?;
    let rr = Tensor::new(&w.ref_rejected[range], &device)?;
    match t.dpo_step(&chosen, &rejected, &rc, &rr, &w.cfg, weight, ctx.collective) {
        Ok((stats, step)) => {
            let diverged = after_one_update(&step, &t.model.vars())?;
            Ok(DpoSummary {
                stats,
                grad_norm: step.grad_norm,
                diverged,
            })
        }
        Err(err) => match Divergence::from_rlhf(&err, 1) {
            Some(d) => Ok(DpoSummary {
                diverged: Some(d),
                ..DpoSummary::default()
            }),
            None => Err(err.into()),
        },
    }
}
