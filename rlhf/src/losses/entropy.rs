//! Entropy bonus from per-token policy entropies: `−coef · agg(H)`. It does not compute the
//! entropies from logits (that is a fused op in `oxalign-kernels`).

use candle_core::Tensor;

use crate::error::Result;
use crate::losses::aggregate::{aggregate_loss, LossAgg};
use crate::mask::{expect_2d, expect_float, expect_shape, scalar};

/// Diagnostics of [`entropy_bonus`].
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct EntropyStats {
    /// Aggregated entropy in nats (before `−coef`).
    pub entropy: f64,
}

/// Entropy bonus term to add to the policy loss.
///
/// * `entropy`: `[batch, seq]` float, per-token entropy of π_θ(·|s_t) in nats (differentiable).
/// * `mask`: `[batch, seq]`, any dtype, non-zero = response token.
/// * `coef`: bonus coefficient (≥ 0); the returned loss is `−coef · agg(entropy)`, so minimising
///   it raises entropy.
pub fn entropy_bonus(
    entropy: &Tensor,
    mask: &Tensor,
    coef: f64,
    agg: LossAgg,
) -> Result<(Tensor, EntropyStats)> {
    expect_float("entropy", entropy)?;
    let (b, t) = expect_2d("entropy", entropy)?;
    expect_shape("mask", mask, &[b, t], "[batch, seq]")?;
    crate::error::check_min("coef", coef, 0.0)?;
    let h = aggregate_loss(entropy, mask, agg)?;
    let stats = EntropyStats {
        entropy: scalar(&h)?,
    };
    Ok((h.affine(-coef, 0.0)?, stats))
}
