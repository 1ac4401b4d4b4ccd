//! Direct preference optimisation losses from summed sequence log-probs: DPO (Rafailov et al.
//! 2023), conservative DPO (label smoothing) and IPO (Azar et al. 2023). It does not compute
//! the log-probs or sum them over tokens.

use candle_core::Tensor;

use crate::error::{Result, RlhfError};
use crate::losses::log_sigmoid::log_sigmoid;
use crate::mask::{expect_1d, expect_float, expect_like, host_f64, scalar};

/// Which preference loss.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DpoLoss {
    /// `−(1−ε) log σ(β h) − ε log σ(−β h)`; `label_smoothing = ε = 0` is plain DPO,
    /// `0 < ε < 0.5` is conservative DPO (cDPO).
    Sigmoid {
        /// ε, the assumed probability that a preference label is flipped.
        label_smoothing: f64,
    },
    /// IPO: `(h − 1/(2β))²`.
    Ipo,
}

/// Which [`DpoLoss`], without its label smoothing: the choice a recipe names
/// (`dpo.loss = "ipo"`), whose ε comes from another key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DpoLossKind {
    /// [`DpoLoss::Sigmoid`].
    #[default]
    Sigmoid,
    /// [`DpoLoss::Ipo`].
    Ipo,
}

impl DpoLossKind {
    /// The loss of this kind; `label_smoothing` is `Sigmoid`'s ε, `Ipo` ignores it.
    pub fn with_label_smoothing(self, label_smoothing: f64) -> DpoLoss {
        match self {
            DpoLossKind::Sigmoid => DpoLoss::Sigmoid { label_smoothing },
            DpoLossKind::Ipo => DpoLoss::Ipo,
        }
    }
}

/// Summed sequence log-probs (nats) of one batch of preference pairs, each `[batch]`, one dtype.
#[derive(Debug, Clone, Copy)]
pub struct PreferenceLogprobs<'a> {
    /// log π_θ(y_w|x), differentiable.
    pub policy_chosen: &'a Tensor,
    /// log π_θ(y_l|x), differentiable.
    pub policy_rejected: &'a Tensor,
    /// log π_ref(y_w|x), constant.
    pub reference_chosen: &'a Tensor,
    /// log π_ref(y_l|x), constant.
    pub reference_rejected: &'a Tensor,
}

/// Diagnostics of [`dpo_loss`] (batch means; implicit rewards are `β·(log π − log π_ref)`).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct DpoStats {
    /// Mean implicit reward of the chosen responses.
    pub chosen_reward: f64,
    /// Mean implicit reward of the rejected responses.
    pub rejected_reward: f64,
    /// Fraction of pairs with chosen reward > rejected reward.
    pub reward_accuracy: f64,
    /// Mean of chosen − rejected reward.
    pub reward_margin: f64,
    /// The loss value.
    pub loss: f64,
}

/// Preference loss, mean over the batch.
///
/// With `h = (log π(y_w) − log π(y_l)) − (log π_ref(y_w) − log π_ref(y_l))`:
/// `Sigmoid { ε }`: `−(1−ε) log σ(βh) − ε log σ(−βh)`; `Ipo`: `(h − 1/(2β))²`.
/// `beta > 0`. Returns a scalar of the inputs' dtype (differentiable w.r.t. the policy
/// log-probs) and stats.
pub fn dpo_loss(
    logps: PreferenceLogprobs<'_>,
    beta: f64,
    loss: DpoLoss,
) -> Result<(Tensor, DpoStats)> {
    let dtype = expect_float("policy_chosen", logps.policy_chosen)?;
    let n = expect_1d("policy_chosen", logps.policy_chosen)?;
    expect_like(
        "policy_rejected",
        logps.policy_rejected,
        &[n],
        dtype,
        "policy_chosen",
    )?;
    expect_like(
        "reference_chosen",
        logps.reference_chosen,
        &[n],
        dtype,
        "policy_chosen",
    )?;
    expect_like(
        "reference_rejected",
        logps.reference_rejected,
        &[n],
        dtype,
        "policy_chosen",
    )?;
    crate::error::check_above("beta", beta, 0.0)?;
    let ref_c = logps.reference_chosen.detach();
    let ref_r = logps.reference_rejected.detach();
    let chosen_logratio = (logps.policy_chosen - &ref_c)?;
    let rejected_logratio = (logps.policy_rejected - &ref_r)?;
    let h = (&chosen_logratio - &rejected_logratio)?;
    let per_pair = match loss {
        DpoLoss::Sigmoid {
            label_smoothing: eps,
        } => {
            if !(0.0..0.5).contains(&eps) {
                return Err(RlhfError::invalid(
                    "label_smoothing",
                    eps,
                    "must be in [0, 0.5)",
                ));
            }
            let bh = h.affine(beta, 0.0)?;
            let pos = log_sigmoid(&bh)?.affine(-(1.0 - eps), 0.0)?;
            if eps > 0.0 {
                (pos - log_sigmoid(&bh.neg()?)?.affine(eps, 0.0)?)?
            } else {
                pos
            }
        }
        DpoLoss::Ipo => h.affine(1.0, -1.0 / (2.0 * beta))?.sqr()?,
    };
    let loss = per_pair.mean_all()?;
    let chosen = host_f64(&chosen_logratio.detach())?;
    let rejected = host_f64(&rejected_logratio.detach())?;
    let denom = n.max(1) as f64;
    let mut stats = DpoStats {
        loss: scalar(&loss)?,
        ..DpoStats::default()
    };
    for (c, r) in chosen.iter().zip(&rejected) {
        let (c, r) = (beta * c, beta * r);
        stats.chosen_reward += c / denom;
        stats.rejected_reward += r / denom;
        stats.reward_margin += (c - r) / denom;
        stats.reward_accuracy += if c > r { 1.0 / denom } else { 0.0 };
    }
    Ok((loss, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kind of `loss`; exhaustive, so a new [`DpoLoss`] needs its kind.
    fn kind(loss: DpoLoss) -> DpoLossKind {
        match loss {
            DpoLoss::Sigmoid { .. } => DpoLossKind::Sigmoid,
            DpoLoss::Ipo => DpoLossKind::Ipo,
        }
    }

    #[test]
    fn kinds_build_their_loss_and_share_its_spelling() {
        for k in [DpoLossKind::Sigmoid, DpoLossKind::Ipo] {
            let loss = k.with_label_smoothing(0.1);
            assert_eq!(kind(loss), k);
            let tagged = serde_json::to_value(loss).unwrap();
            assert_eq!(tagged["type"], serde_json::to_value(k).unwrap());
        }
        assert_eq!(
            DpoLossKind::Sigmoid.with_label_smoothing(0.1),
            DpoLoss::Sigmoid {
                label_smoothing: 0.1
            }
        );
    }
}
