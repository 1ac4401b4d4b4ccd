//! Supervised fine-tuning loss: token-mean negative log-likelihood of the target tokens with
//! the prompt masked out. It does not gather log-probs from logits (a kernels op does that).

use candle_core::Tensor;

use crate::error::Result;
use crate::losses::aggregate::{aggregate_loss, LossAgg};
use crate::mask::{expect_2d, expect_float, expect_shape, predicate, scalar};

/// Diagnostics of [`sft_loss`].
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct SftStats {
    /// Mean NLL per trained token (nats) = the loss value.
    pub nll: f64,
    /// `exp(nll)`.
    pub perplexity: f64,
    /// Number of trained (unmasked) tokens.
    pub num_tokens: usize,
}

/// Token-mean cross-entropy `−Σ m·log p / Σ m`.
///
/// * `token_logprobs`: `[batch, seq]` float, log p(target_t) in nats (differentiable).
/// * `loss_mask`: `[batch, seq]`, any dtype, non-zero = trained token (prompt and padding 0).
/// * Returns a scalar of the input dtype (`0` when no token is trained) and stats.
pub fn sft_loss(token_logprobs: &Tensor, loss_mask: &Tensor) -> Result<(Tensor, SftStats)> {
    expect_float("token_logprobs", token_logprobs)?;
    let (b, t) = expect_2d("token_logprobs", token_logprobs)?;
    expect_shape("loss_mask", loss_mask, &[b, t], "[batch, seq]")?;
    let loss = aggregate_loss(&token_logprobs.neg()?, loss_mask, LossAgg::TokenMean)?;
    let nll = scalar(&loss)?;
    let num_tokens = predicate(loss_mask)?
        .to_dtype(candle_core::DType::F64)?
        .sum_all()?
        .to_scalar::<f64>()? as usize;
    Ok((
        loss,
        SftStats {
            nll,
            perplexity: nll.exp(),
            num_tokens,
        },
    ))
}
