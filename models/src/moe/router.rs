//! The MoE router of the training forward: logits `x W_r^T`, softmax over the experts, the
//! top-k experts per token, and their routing weights. The *choice* of experts is host data
//! (it is not differentiable); the routing *weights* are gathered from the softmax tensor, so
//! they stay in the autograd graph and the router receives a gradient (candle-transformers'
//! MoE models copy them to the host as constants, and their router never learns). The engine
//! uses the same [`top_k_experts`] on its host probabilities.

use crate::moe::routing::FREE;
use crate::nn::f32_linear::f32_linear;
use crate::nn::layers::softmax_last_dim;
use crate::nn::precision::Precision;
use candle_core::{DType, Result, Tensor};

/// One layer's routing of `N` tokens.
#[derive(Clone, Debug)]
pub struct Routed {
    /// Router logits `[N, E]` (differentiable).
    pub logits: Tensor,
    /// Chosen experts, `N * k` ids, token-major.
    pub experts: Vec<u32>,
    /// Routing weight of each choice `[N, k]` (differentiable): the softmax probability,
    /// renormalised over the k choices when `norm_topk_prob`.
    pub weights: Tensor,
    /// With a replay: the replayed tokens whose expert set differs from the router's own
    /// top-k, and the replayed tokens (tokens left [`FREE`] are not counted). `(0, 0)`
    /// without a replay.
    pub overridden: (usize, usize),
}

/// Writes the `k` experts of largest `probs` (one token's `[E]` row) into `out`, largest
/// first, the lower index first among equal values.
pub(crate) fn top_k_experts(probs: &[f32], k: usize, out: &mut Vec<u32>) {
    let start = out.len();
    for _ in 0..k {
        let mut best: Option<usize> = None;
        for (e, &p) in probs.iter().enumerate() {
            if out[start..].contains(&(e as u32)) {
                continue;
            }
            if best.is_none_or(|b| p > probs[b]) {
                best = Some(e);
            }
        }
        if let Some(b) = best {
            out.push(b as u32);
        }
    }
}

/// Routes `x` `[N, H]` with router weight `w` `[E, H]`: the top `k` experts per token, or the
/// `replay` choices (`N * k` ids) when given (a token whose choices are all [`FREE`] picks its
/// own). Errors when a replay has the wrong length or names no expert.
pub fn route(
    x: &Tensor,
    w: &Tensor,
    (k, norm_topk_prob): (usize, bool),
    replay: Option<&[u32]>,
    precision: Precision,
) -> Result<Routed> {
    let (n, _) = x.dims2()?;
    let e = w.dim(0)?;
    let logits = f32_linear(x, w, precision)?;
    let probs = softmax_last_dim(&logits)?;
    let host = probs.detach().to_dtype(DType::F32)?.to_vec2::<f32>()?;
    let experts = choose(&host, e, k, replay)?;
    let overridden = replay.map_or((0, 0), |r| overrides(&host, k, r));
    let index = Tensor::from_slice(&experts, (n, k), x.device())?;
    let weights = probs.gather(&index, 1)?;
    let weights = if norm_topk_prob {
        weights.broadcast_div(&weights.sum_keepdim(1)?)?
    } else {
        weights
    };
    Ok(Routed {
        logits,
        experts,
        weights,
        overridden,
    })
}

/// Of the tokens `replay` (`N * k` ids, checked by [`choose`]) assigns, how many get an
/// expert set other than their own top `k` of `probs`, and how many it assigns.
pub fn overrides(probs: &[Vec<f32>], k: usize, replay: &[u32]) -> (usize, usize) {
    let (mut differ, mut total) = (0, 0);
    let mut own = Vec::with_capacity(k);
    for (row, rec) in probs.iter().zip(replay.chunks(k)) {
        if rec.contains(&FREE) {
            continue;
        }
        own.clear();
        top_k_experts(row, k, &mut own);
        total += 1;
        differ += usize::from(rec.iter().any(|x| !own.contains(x)));
    }
    (differ, total)
}

/// The experts of every token (`probs`: `[N][E]` host rows): the replayed ones where given,
/// else the top `k`. Shared with the engine.
pub fn choose(probs: &[Vec<f32>], e: usize, k: usize, replay: Option<&[u32]>) -> Result<Vec<u32>> {
    let n = probs.len();
    if let Some(r) = replay {
        if r.len() != n * k {
            candle_core::bail!(
                "routing replay: {} recorded choices for {n} tokens x top-{k}",
                r.len()
            )
        }
        if let Some(bad) = r.iter().find(|&&x| x != FREE && x as usize >= e) {
            candle_core::bail!("routing replay: expert {bad} is not below num_experts {e}")
        }
    }
    let mut out = Vec::with_capacity(n * k);
    for (t, row) in probs.iter().enumerate() {
        match replay.map(|r| &r[t * k..(t + 1) * k]) {
            Some(rec) if !rec.contains(&FREE) => out.extend_from_slice(rec),
            _ => top_k_experts(row, k, &mut out),
        }
    }
    Ok(out)
}
