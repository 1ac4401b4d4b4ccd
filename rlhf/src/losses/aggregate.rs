//! Reduction of a per-token loss matrix to a scalar (`LossAgg`): token-mean and the two
//! sequence-mean modes. It does not weight or clip; the losses do that before aggregating.

use candle_core::Tensor;

use crate::error::Result;
use crate::mask::{expect_2d, expect_float, expect_shape, predicate, zero_unmasked_out};

/// How a `[batch, seq]` per-token loss becomes a scalar.
///
/// Serialised in snake_case (`token_mean`), the spelling of [`LossAggKind`] and of recipes;
/// the kebab-case of earlier versions (`token-mean`) still reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossAgg {
    /// Σ_{b,t} m·ℓ / Σ_{b,t} m: every response token weighs the same.
    #[default]
    #[serde(alias = "token-mean")]
    TokenMean,
    /// mean over sequences of Σ_t m·ℓ (Dr. GRPO style: long answers weigh more).
    #[serde(alias = "seq-mean-token-sum")]
    SeqMeanTokenSum,
    /// mean over sequences of (Σ_t m·ℓ / Σ_t m) (the original GRPO paper).
    #[serde(alias = "seq-mean-token-mean")]
    SeqMeanTokenMean,
    /// mean over sequences of Σ_t m·ℓ / `horizon`: Dr. GRPO's constant normaliser (Liu et al.
    /// 2025; TRL's `dr_grpo`, veRL's `seq-mean-token-sum-norm`), with `horizon` the generation
    /// budget (max new tokens), so no sequence's length changes its tokens' weight.
    #[serde(alias = "seq-mean-token-sum-norm")]
    SeqMeanTokenSumNorm {
        /// The constant divisor, in tokens (> 0).
        horizon: usize,
    },
}

/// Which [`LossAgg`], without the horizon of `SeqMeanTokenSumNorm`: the choice a recipe
/// names (`rl.loss_agg = "token_mean"`), whose horizon comes from elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossAggKind {
    /// [`LossAgg::TokenMean`].
    #[default]
    TokenMean,
    /// [`LossAgg::SeqMeanTokenSum`].
    SeqMeanTokenSum,
    /// [`LossAgg::SeqMeanTokenMean`].
    SeqMeanTokenMean,
    /// [`LossAgg::SeqMeanTokenSumNorm`].
    SeqMeanTokenSumNorm,
}

impl LossAggKind {
    /// The aggregation of this kind; `horizon` (tokens) is the divisor of
    /// `SeqMeanTokenSumNorm`, the other kinds ignore it.
    pub fn with_horizon(self, horizon: usize) -> LossAgg {
        match self {
            LossAggKind::TokenMean => LossAgg::TokenMean,
            LossAggKind::SeqMeanTokenSum => LossAgg::SeqMeanTokenSum,
            LossAggKind::SeqMeanTokenMean => LossAgg::SeqMeanTokenMean,
            LossAggKind::SeqMeanTokenSumNorm => LossAgg::SeqMeanTokenSumNorm { horizon },
        }
    }
}

/// Aggregates a per-token loss over the response tokens.
///
/// * `loss`: `[batch, seq]` float, per-token loss (differentiable); `mask`: `[batch, seq]`, any
///   dtype, non-zero = response token.
/// * Sequence modes average over rows with at least one response token (empty rows are left
///   out); an all-zero mask gives a loss of exactly `0` (still connected to the graph).
/// * Returns a scalar tensor of `loss`' dtype. Masked values (even NaN) never reach it.
pub fn aggregate_loss(loss: &Tensor, mask: &Tensor, agg: LossAgg) -> Result<Tensor> {
    aggregate(loss, mask, agg, None)
}

/// Like [`aggregate_loss`], but divides by a caller-given `denominator` instead of the local
/// count: the global number of response tokens (`TokenMean`) or of non-empty sequences (the
/// sequence modes) across all micro-batches / data-parallel ranks of one optimizer step, so that
/// summing the micro-batch losses gives the full-batch loss.
pub fn aggregate_loss_with_denominator(
    loss: &Tensor,
    mask: &Tensor,
    agg: LossAgg,
    denominator: f64,
) -> Result<Tensor> {
    crate::error::check_above("denominator", denominator, 0.0)?;
    aggregate(loss, mask, agg, Some(denominator))
}

fn aggregate(loss: &Tensor, mask: &Tensor, agg: LossAgg, denom: Option<f64>) -> Result<Tensor> {
    let dtype = expect_float("loss", loss)?;
    let (b, t) = expect_2d("loss", loss)?;
    expect_shape("mask", mask, &[b, t], "[batch, seq]")?;
    let pred = predicate(mask)?;
    let m = pred.to_dtype(dtype)?;
    let l = zero_unmasked_out(loss, &pred)?;
    let numerator = match agg {
        LossAgg::TokenMean => l.sum_all()?,
        LossAgg::SeqMeanTokenSum => l.sum(1)?.sum_all()?,
        LossAgg::SeqMeanTokenSumNorm { horizon } => {
            if horizon == 0 {
                return Err(crate::RlhfError::invalid(
                    "horizon",
                    horizon,
                    "must be at least 1 token",
                ));
            }
            l.sum_all()?.affine(1.0 / horizon as f64, 0.0)?
        }
        LossAgg::SeqMeanTokenMean => {
            let lens = m.sum(1)?.maximum(1.0)?;
            l.sum(1)?.div(&lens)?.sum_all()?
        }
    };
    let out = match denom {
        Some(d) => numerator.affine(1.0 / d, 0.0)?,
        None => {
            let count = match agg {
                LossAgg::TokenMean => m.sum_all()?,
                LossAgg::SeqMeanTokenSum
                | LossAgg::SeqMeanTokenMean
                | LossAgg::SeqMeanTokenSumNorm { .. } => {
                    m.sum(1)?.gt(0.0)?.to_dtype(dtype)?.sum_all()?
                }
            };
            numerator.broadcast_div(&count.maximum(1.0)?)?
        }
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kind of `agg`; exhaustive, so a new [`LossAgg`] needs its [`LossAggKind`].
    fn kind(agg: LossAgg) -> LossAggKind {
        match agg {
            LossAgg::TokenMean => LossAggKind::TokenMean,
            LossAgg::SeqMeanTokenSum => LossAggKind::SeqMeanTokenSum,
            LossAgg::SeqMeanTokenMean => LossAggKind::SeqMeanTokenMean,
            LossAgg::SeqMeanTokenSumNorm { .. } => LossAggKind::SeqMeanTokenSumNorm,
        }
    }

    #[test]
    fn kinds_build_their_aggregation_and_share_its_spelling() {
        for k in [
            LossAggKind::TokenMean,
            LossAggKind::SeqMeanTokenSum,
            LossAggKind::SeqMeanTokenMean,
            LossAggKind::SeqMeanTokenSumNorm,
        ] {
            let agg = k.with_horizon(16);
            assert_eq!(kind(agg), k);
            let name = serde_json::to_value(k).unwrap();
            let name = name.as_str().unwrap();
            assert!(!name.contains('-'), "{name}");
            if k != LossAggKind::SeqMeanTokenSumNorm {
                assert_eq!(serde_json::to_value(agg).unwrap(), name);
                let kebab = serde_json::Value::from(name.replace('_', "-"));
                assert_eq!(serde_json::from_value::<LossAgg>(kebab).unwrap(), agg);
            }
        }
        assert_eq!(
            LossAggKind::SeqMeanTokenSumNorm.with_horizon(7),
            LossAgg::SeqMeanTokenSumNorm { horizon: 7 }
        );
        let norm = serde_json::json!({"seq-mean-token-sum-norm": {"horizon": 7}});
        assert_eq!(
            serde_json::from_value::<LossAgg>(norm).unwrap(),
            LossAgg::SeqMeanTokenSumNorm { horizon: 7 }
        );
    }
}
