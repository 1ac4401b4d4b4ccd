//! REINFORCE++ advantages (Hu et al. 2025): per-token discounted returns of token-level rewards,
//! normalised over all response tokens of the batch. No critic, no per-group baseline.

use candle_core::Tensor;

use crate::advantages::whiten::{whiten_host, WhitenOptions};
use crate::error::{Result, RlhfError};
use crate::mask::{expect_2d, expect_float, expect_shape, from_host, host_f64, host_mask};

/// Returns and normalised advantages from [`reinforce_pp_advantages`].
#[derive(Debug, Clone)]
pub struct ReinforcePpOutput {
    /// `[batch, seq]`: whitened returns (the advantages), `0` at masked positions.
    pub advantages: Tensor,
    /// `[batch, seq]`: discounted returns `G_t = Σ_{k>=t} γ^{k−t} r_k` over response tokens,
    /// `0` at masked positions.
    pub returns: Tensor,
}

/// REINFORCE++ advantages.
///
/// * `token_rewards`: `[batch, seq]` float (typically `−β·KL_t`, plus the sequence score on the
///   last response token, see [`crate::losses::kl::kl_shaped_rewards`]).
/// * `mask`: `[batch, seq]`, any dtype, non-zero = response token; masked positions are skipped
///   in the discounted sum (the next token of a response token is the next response token).
/// * `gamma`: discount in `[0, 1]`. `whiten`: the batch normalisation (mean/std over all
///   response tokens; see [`crate::advantages::whiten::masked_whiten`]).
/// * Detached, in `token_rewards`' dtype.
pub fn reinforce_pp_advantages(
    token_rewards: &Tensor,
    mask: &Tensor,
    gamma: f64,
    whiten: WhitenOptions,
) -> Result<ReinforcePpOutput> {
    let dtype = expect_float("token_rewards", token_rewards)?;
    let (b, t) = expect_2d("token_rewards", token_rewards)?;
    expect_shape("mask", mask, &[b, t], "[batch, seq]")?;
    if !(0.0..=1.0).contains(&gamma) {
        return Err(RlhfError::invalid("gamma", gamma, "must be in [0, 1]"));
    }
    let r = host_f64(token_rewards)?;
    let m = host_mask(mask)?;
    let mut returns = vec![0.0; b * t];
    for row in 0..b {
        let mut running = 0.0;
        for col in (0..t).rev() {
            let i = row * t + col;
            if m[i] {
                running = r[i] + gamma * running;
                returns[i] = running;
            }
        }
    }
    let advantages = whiten_host(&returns, &m, whiten)?;
    Ok(ReinforcePpOutput {
        advantages: from_host(advantages, &[b, t], dtype, token_rewards)?,
        returns: from_host(returns, &[b, t], dtype, token_rewards)?,
    })
}
