//! Bradley–Terry pairwise loss for reward-model training (Ouyang et al. 2022), with the optional
//! per-pair margin of Llama 2. It does not score sequences (see the reward model).

use candle_core::Tensor;

use crate::error::Result;
use crate::losses::log_sigmoid::log_sigmoid;
use crate::mask::{expect_1d, expect_float, expect_like, host_f64, scalar};

/// Diagnostics of [`bradley_terry_loss`] (batch means).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct BradleyTerryStats {
    /// Fraction of pairs with `r_chosen > r_rejected`.
    pub accuracy: f64,
    /// Mean of `r_chosen − r_rejected`.
    pub reward_margin: f64,
    /// Mean chosen reward.
    pub chosen_reward: f64,
    /// Mean rejected reward.
    pub rejected_reward: f64,
    /// The loss value.
    pub loss: f64,
}

/// `mean_b −log σ(r_chosen − r_rejected − margin)`.
///
/// * `chosen_rewards`, `rejected_rewards`: `[batch]` float scalar rewards (differentiable).
/// * `margin`: optional `[batch]` same dtype (constants); `None` means 0.
/// * Returns a scalar of the inputs' dtype and stats.
pub fn bradley_terry_loss(
    chosen_rewards: &Tensor,
    rejected_rewards: &Tensor,
    margin: Option<&Tensor>,
) -> Result<(Tensor, BradleyTerryStats)> {
    let dtype = expect_float("chosen_rewards", chosen_rewards)?;
    let n = expect_1d("chosen_rewards", chosen_rewards)?;
    expect_like(
        "rejected_rewards",
        rejected_rewards,
        &[n],
        dtype,
        "chosen_rewards",
    )?;
    let mut diff = (chosen_rewards - rejected_rewards)?;
    if let Some(m) = margin {
        expect_like("margin", m, &[n], dtype, "chosen_rewards")?;
        diff = (diff - m.detach())?;
    }
    let loss = log_sigmoid(&diff)?.neg()?.mean_all()?;
    let c = host_f64(&chosen_rewards.detach())?;
    let r = host_f64(&rejected_rewards.detach())?;
    let denom = n.max(1) as f64;
    let mut stats = BradleyTerryStats {
        loss: scalar(&loss)?,
        ..Default::default()
    };
    for (c, r) in c.iter().zip(&r) {
        stats.accuracy += if c > r { 1.0 / denom } else { 0.0 };
        stats.reward_margin += (c - r) / denom;
        stats.chosen_reward += c / denom;
        stats.rejected_reward += r / denom;
    }
    Ok((loss, stats))
}
