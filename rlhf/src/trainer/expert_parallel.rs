//! Expert-parallel training: a policy trainer whose model holds only its rank's routed
//! experts ([`oxalign_models::ExpertParallel`], rank `r` owns experts `e mod N == r`), and
//! its optimizer step.
//!
//! Each rank trains on its own rows, as a data-parallel replica does. After backward:
//! * dense parameters (embedding, attention, norms, routers, shared experts, head) are on
//!   every rank and their gradients are averaged with all-reduce, as when replicated;
//! * an expert's gradient lives only on its owner and is already the sum over every rank's
//!   tokens (the exchange's backward sent the owner every rank's row gradients), so it is
//!   divided by `N`: the data-parallel mean, which equals one replica on the whole batch.
//!
//! The clip norm is global: the dense squares (the same on every rank) plus the experts'
//! squares summed over ranks. AdamW steps each rank's own parameters (1/N of the experts'
//! moments).

use super::grads::StepStats;
use crate::optim::AdamW;
use crate::{Result, RlhfError};
use candle_core::{DType, Tensor, Var};
use oxalign_kernels::collective::Collective;

/// Which of a trainer's parameters are this rank's routed experts.
#[derive(Clone, Debug)]
pub(crate) struct ExpertShare {
    /// Per parameter (the trainer's `vars` order): a routed expert's tensor.
    pub is_expert: Vec<bool>,
    /// This rank and the group size.
    pub rank: usize,
    pub world: usize,
}

/// Backward, the gradient exchange described in the module docs, the global clip and AdamW.
/// Returns the stats and the bytes of the gradients stepped on.
pub(crate) fn apply_expert_parallel_gradients(
    loss: &Tensor,
    vars: &[Var],
    share: &ExpertShare,
    opt: &mut AdamW,
    max_grad_norm: f64,
    collective: Option<&dyn Collective>,
) -> Result<(StepStats, usize)> {
    crate::error::check_above("max_norm", max_grad_norm, 0.0)?;
    let Some(comm) = collective.filter(|c| c.world_size() == share.world) else {
        return Err(RlhfError::ExpertParallel(format!(
            "a step needs the group of {} ranks the experts are spread over",
            share.world
        )));
    };
    let fail = |e: oxalign_kernels::CollectiveError| {
        RlhfError::ExpertParallel(format!("gradient exchange failed: {e}"))
    };
    let mut grads = loss.backward()?;
    let local: Vec<Tensor> = vars
        .iter()
        .map(|v| match grads.get(v.as_tensor()) {
            Some(g) => Ok(g.clone()),
            None => v.as_tensor().zeros_like(),
        })
        .collect::<candle_core::Result<_>>()?;
    let dense: Vec<Tensor> = local
        .iter()
        .zip(&share.is_expert)
        .filter(|(_, e)| !**e)
        .map(|(g, _)| g.clone())
        .collect();
    let mut averaged = comm.all_reduce_mean(&dense).map_err(fail)?.into_iter();
    let (mut dense_sq, mut expert_sq) = (0f64, 0f64);
    let mut grad_bytes = 0;
    for ((v, g), &is_expert) in vars.iter().zip(local).zip(&share.is_expert) {
        let g = match is_expert {
            true => (g / share.world as f64)?,
            false => averaged.next().ok_or_else(|| {
                RlhfError::ExpertParallel("gradient all-reduce returned too few tensors".into())
            })?,
        };
        let sq = g
            .to_dtype(DType::F64)?
            .sqr()?
            .sum_all()?
            .to_scalar::<f64>()?;
        match is_expert {
            true => expert_sq += sq,
            false => dense_sq += sq,
        }
        grad_bytes += g.elem_count() * g.dtype().size_in_bytes();
        grads.insert(v.as_tensor(), g);
    }
    // Σ over ranks of the experts' squares: the mean times the group size.
    let mut buf = [expert_sq as f32];
    comm.all_reduce_mean_f32(&mut [&mut buf]).map_err(fail)?;
    let grad_norm = (dense_sq + buf[0] as f64 * share.world as f64).sqrt();
    if !grad_norm.is_finite() {
        let stats = StepStats {
            grad_norm,
            skipped: true,
        };
        return Ok((stats, grad_bytes));
    }
    let coef = max_grad_norm / (grad_norm + crate::optim::clip::CLIP_EPS);
    opt.step_scaled(&grads, (coef < 1.0).then_some(coef))?;
    let stats = StepStats {
        grad_norm,
        skipped: false,
    };
    Ok((stats, grad_bytes))
}

/// True when any rank of the group holds a non-finite weight (every rank must call it).
pub(crate) fn any_rank_non_finite(
    local: bool,
    collective: Option<&dyn Collective>,
) -> Result<bool> {
    let Some(comm) = collective.filter(|c| c.world_size() > 1) else {
        return Ok(local);
    };
    let mut flag = [f32::from(u8::from(local))];
    comm.all_reduce_mean_f32(&mut [&mut flag])
        .map_err(|e| RlhfError::ExpertParallel(format!("weight check failed: {e}")))?;
    Ok(flag[0] > 0.0)
}
