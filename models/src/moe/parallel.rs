//! The expert-parallel forward of a sparse block ([`SparseMoe`] with an
//! [`ExpertParallel`] group): each rank routes its own tokens (the router is replicated), sends
//! each (token, choice) row to the rank owning the chosen expert (dispatch), runs its own
//! experts over the rows it receives, sends the outputs back (combine) and sums them per
//! token with its local, differentiable routing weights. Both exchanges are
//! `expert_exchange::exchange_rows`, so gradients flow back to the routers, the experts and
//! the tokens of every rank. Every rank runs both exchanges in every sparse layer, also with
//! nothing to send or receive.

use crate::moe::block::SparseMoe;
use crate::moe::expert_exchange::exchange_rows;
use crate::moe::expert_parallel::ExpertParallel;
use crate::moe::routing::RouterTrace;
use candle_core::{Result, Tensor};

/// Where this rank's (token, choice) slots go: ordered by destination rank, then by slot.
struct Dispatch {
    /// Token of each sent row, in send order.
    tokens: Vec<u32>,
    /// Slot (`token · k + choice`) of each sent row, in send order.
    slots: Vec<u32>,
    /// Rows sent to each rank.
    send: Vec<usize>,
    /// The expert of each sent row, per destination rank (f32, for the exchange).
    experts: Vec<Vec<f32>>,
}

impl Dispatch {
    fn plan(ep: &ExpertParallel, chosen: &[u32], k: usize) -> Dispatch {
        let world = ep.world();
        let mut per_rank: Vec<Vec<u32>> = vec![Vec::new(); world];
        for (slot, &e) in chosen.iter().enumerate() {
            per_rank[ep.owner(e as usize)].push(slot as u32);
        }
        let send = per_rank.iter().map(Vec::len).collect();
        let experts = per_rank
            .iter()
            .map(|s| s.iter().map(|&x| chosen[x as usize] as f32).collect())
            .collect();
        let slots: Vec<u32> = per_rank.into_iter().flatten().collect();
        let tokens = slots.iter().map(|&s| s / k as u32).collect();
        Dispatch {
            tokens,
            slots,
            send,
            experts,
        }
    }
}

impl SparseMoe {
    /// [`SparseMoe::forward`] over an expert-parallel group: `x` `[B, T, H]` (this rank's
    /// tokens) -> `[B, T, H]`.
    pub(crate) fn forward_parallel(
        &self,
        ep: &ExpertParallel,
        x: &Tensor,
        trace: &mut RouterTrace,
    ) -> Result<Tensor> {
        let (b, t, h) = x.dims3()?;
        let n = b * t;
        let (flat, routed) = self.route_rows(x, trace)?;
        let k = self.top_k;
        let plan = Dispatch::plan(ep, &routed.experts, k);
        let comm = ep.comm();
        // The expert of every row each peer sends here; their counts are the rows to expect.
        let arrived_experts = comm
            .all_to_all_f32(plan.experts.clone())
            .map_err(candle_core::Error::wrap)?;
        let recv: Vec<usize> = arrived_experts.iter().map(Vec::len).collect();
        let device = x.device();
        let token_idx = Tensor::from_slice(&plan.tokens, plan.tokens.len(), device)?;
        let outgoing = flat.index_select(&token_idx, 0)?;
        let incoming = exchange_rows(comm, &outgoing, &plan.send, &recv)?;
        let arrived: Vec<u32> = arrived_experts.concat().iter().map(|&e| e as u32).collect();
        let done = self.run_local_experts(&incoming, &arrived)?;
        let returned = exchange_rows(comm, &done, &recv, &plan.send)?;
        let weights = routed.weights.flatten_all()?;
        let slot_idx = Tensor::from_slice(&plan.slots, plan.slots.len(), device)?;
        let w = weights.index_select(&slot_idx, 0)?.unsqueeze(1)?;
        let out = Tensor::zeros((n, h), x.dtype(), device)?;
        let out = out.index_add(&token_idx, &returned.broadcast_mul(&w)?, 0)?;
        let out = self.add_shared(&flat, out)?;
        trace.push(routed.logits, routed.experts, k, routed.overridden);
        out.reshape((b, t, h))
    }

    /// Each received row through the local expert it names: `rows` `[R, H]`, `experts`
    /// `R` ids -> `[R, H]`. With no rows the input itself is returned, so the combine still
    /// depends on the dispatch in every rank's graph.
    fn run_local_experts(&self, rows: &Tensor, experts: &[u32]) -> Result<Tensor> {
        let (r, h) = rows.dims2()?;
        if r != experts.len() {
            candle_core::bail!(
                "expert exchange: {r} rows arrived with {} ids",
                experts.len()
            )
        }
        if r == 0 {
            return Ok(rows.clone());
        }
        let mut by_expert: Vec<Vec<u32>> = vec![Vec::new(); self.experts.len()];
        for (i, &e) in experts.iter().enumerate() {
            match by_expert.get_mut(e as usize) {
                Some(v) => v.push(i as u32),
                None => candle_core::bail!("expert exchange: expert {e} does not exist"),
            }
        }
        let device = rows.device();
        let (mut outs, mut order) = (Vec::new(), Vec::with_capacity(r));
        for (e, idx) in by_expert.iter().enumerate().filter(|(_, v)| !v.is_empty()) {
            let Some(expert) = &self.experts[e] else {
                candle_core::bail!("expert exchange: rows for expert {e}, held by another rank")
            };
            let sel = Tensor::from_slice(idx, idx.len(), device)?;
            outs.push(expert.forward(&rows.index_select(&sel, 0)?)?);
            order.extend_from_slice(idx);
        }
        let order = Tensor::from_vec(order, r, device)?;
        Tensor::zeros((r, h), rows.dtype(), device)?.index_add(&order, &Tensor::cat(&outs, 0)?, 0)
    }
}
