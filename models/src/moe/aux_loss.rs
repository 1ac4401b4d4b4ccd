//! The load-balancing auxiliary loss of the MoE families (Switch Transformer eqs. 4-6, HF's
//! `load_balancing_loss_func`): `E * Σ_e f_e * P_e`, where `f_e` is the fraction of top-k
//! assignments that went to expert `e` and `P_e` the mean router probability of `e`, both
//! pooled over every sparse layer and every real (unmasked) token. Differentiable through
//! `P_e` (the counts are constants). HF's training loss adds `router_aux_loss_coef` times it.

use crate::moe::router::top_k_experts;
use crate::moe::routing::RouterTrace;
use crate::nn::head::Head;
use crate::nn::layers::softmax_last_dim;
use crate::nn::model::Model;
use candle_core::{DType, Result, Tensor};

/// The load-balancing loss (a scalar tensor) of the router logits of one forward
/// (`RouterTrace::logits`: per sparse layer `[B*T, E]`, row-major over `[B, T]`), with
/// `top_k` choices per token. `attention_mask` `[B, T]` (1 = real) leaves padding out.
/// `None` when there are no sparse layers.
pub(crate) fn load_balancing_loss(
    router_logits: &[Tensor],
    top_k: usize,
    attention_mask: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let Some(first) = router_logits.first() else {
        return Ok(None);
    };
    let (n, e) = first.dims2()?;
    let (dtype, device) = (first.dtype(), first.device());
    let mask: Vec<f32> = match attention_mask {
        Some(m) => m.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?,
        None => vec![1.0; n],
    };
    if mask.len() != n {
        candle_core::bail!(
            "load-balancing loss: the mask has {} entries for {n} routed tokens",
            mask.len()
        )
    }
    let mask_col = Tensor::from_slice(&mask, (n, 1), device)?.to_dtype(dtype)?;
    let mut counts = vec![0f32; e];
    let mut prob_sum: Option<Tensor> = None;
    let mut rows = 0f64;
    for logits in router_logits {
        let probs = softmax_last_dim(logits)?;
        let host = probs.detach().to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let mut chosen = Vec::with_capacity(top_k);
        for (row, &m) in host.iter().zip(&mask) {
            chosen.clear();
            top_k_experts(row, top_k, &mut chosen);
            for &c in &chosen {
                counts[c as usize] += m;
            }
        }
        let s = probs.broadcast_mul(&mask_col)?.sum(0)?;
        prob_sum = Some(match prob_sum {
            Some(p) => (p + s)?,
            None => s,
        });
        rows += mask.iter().map(|&m| m as f64).sum::<f64>();
    }
    let Some(prob_sum) = prob_sum else {
        return Ok(None);
    };
    let fractions: Vec<f32> = counts.iter().map(|&c| (c as f64 / rows) as f32).collect();
    let fractions = Tensor::from_vec(fractions, e, device)?.to_dtype(dtype)?;
    let p = (prob_sum / rows)?;
    Ok(Some(((fractions * p)?.sum_all()? * e as f64)?))
}

impl<H: Head> Model<H> {
    /// The load-balancing loss of one traced forward (unscaled; HF adds
    /// `router_aux_loss_coef` times it, [`Model::router_aux_loss_coef`]), over the tokens
    /// `attention_mask` `[B, T]` marks real. `None` for a dense model.
    pub fn router_aux_loss(
        &self,
        trace: &RouterTrace,
        attention_mask: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        match &self.config().moe {
            Some(m) => load_balancing_loss(&trace.logits, m.num_experts_per_tok, attention_mask),
            None => Ok(None),
        }
    }

    /// The weight of the load-balancing loss in the training loss (`router_aux_loss_coef`;
    /// 0 for a dense model).
    pub fn router_aux_loss_coef(&self) -> f64 {
        self.config()
            .moe
            .as_ref()
            .map_or(0.0, |m| m.router_aux_loss_coef)
    }
}
