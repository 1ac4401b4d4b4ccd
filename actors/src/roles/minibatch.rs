//! Minibatches of a training update and each replica's share of one: the seeded order, the
//! rows this replica trains on, and the weight that makes the replicas' averaged gradient
//! equal the full minibatch's. Shared by the policy and critic updates.

use crate::error::Cause;
use crate::replicas::{shard_ranges, ReplicaCtx};
use candle_core::Tensor;
use oxalign_rlhf::losses::LossAgg;
use oxalign_rlhf::trainer::TokenBatch;

/// This replica's share of a loss aggregated with `agg`, scaled by the world size so that
/// the mean over replicas of the scaled local losses is the global loss.
pub(crate) fn local_weight(
    ctx: &ReplicaCtx<'_>,
    agg: LossAgg,
    local: &TokenBatch,
    global_tokens: usize,
    global_rows: usize,
) -> f64 {
    let w = match agg {
        LossAgg::TokenMean => local.response_tokens() as f64 / global_tokens.max(1) as f64,
        _ => local.rows() as f64 / global_rows.max(1) as f64,
    };
    w * ctx.world as f64
}

/// The minibatches of one update: a seeded permutation per epoch, cut into chunks.
pub(crate) fn minibatch_order(
    rows: usize,
    size: usize,
    epochs: usize,
    seed: u64,
) -> Vec<Vec<usize>> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut out = Vec::new();
    for epoch in 0..epochs {
        let mut rng =
            rand::rngs::StdRng::seed_from_u64(seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9));
        let mut order: Vec<usize> = (0..rows).collect();
        order.shuffle(&mut rng);
        out.extend(order.chunks(size.max(1)).map(|c| c.to_vec()));
    }
    out
}

/// One replica's rows of one minibatch.
pub(crate) struct Shard {
    /// The whole minibatch (for global token and row counts).
    pub global: TokenBatch,
    /// This replica's rows of it.
    pub local: TokenBatch,
    idx: Tensor,
}

impl Shard {
    /// Rows `mb` of `full`, split over the replicas; this replica keeps its contiguous part.
    pub(crate) fn new(
        ctx: &ReplicaCtx<'_>,
        full: &TokenBatch,
        mb: &[usize],
    ) -> Result<Self, Cause> {
        let rows: Vec<usize> = mb[shard_ranges(mb.len(), ctx.world)[ctx.rank].clone()].to_vec();
        let idx = Tensor::from_vec(
            rows.iter().map(|&r| r as u32).collect::<Vec<_>>(),
            rows.len(),
            full.ids.device(),
        )?;
        Ok(Self {
            global: full.select_rows(mb)?,
            local: full.select_rows(&rows)?,
            idx,
        })
    }

    /// This replica's rows of a `[B, ...]` tensor aligned with the full batch.
    pub(crate) fn pick(&self, x: &Tensor) -> Result<Tensor, Cause> {
        Ok(x.contiguous()?.index_select(&self.idx, 0)?)
    }

    /// [`local_weight`] of this shard within its minibatch.
    pub(crate) fn weight(&self, ctx: &ReplicaCtx<'_>, agg: LossAgg) -> f64 {
        local_weight(
            ctx,
            agg,
            &self.local,
            self.global.response_tokens(),
            self.global.rows(),
        )
    }
}
