//! Generalized Advantage Estimation (Schulman et al. 2016) over response masks, with
//! bootstrapping for rows whose response was cut off. Not differentiable (advantages are targets).

use candle_core::Tensor;

use crate::error::{Result, RlhfError};
use crate::mask::{
    expect_1d, expect_2d, expect_float, expect_like, from_host, host_f64, host_mask,
};

/// Discount and trace parameters of GAE.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GaeConfig {
    /// Discount factor γ in `[0, 1]` (per response token).
    pub gamma: f64,
    /// GAE trace parameter λ in `[0, 1]` (`1` = Monte-Carlo returns, `0` = one-step TD).
    pub lambda: f64,
}

impl Default for GaeConfig {
    /// γ = 1, λ = 0.95 (the usual RLHF setting).
    fn default() -> Self {
        Self {
            gamma: 1.0,
            lambda: 0.95,
        }
    }
}

/// Value of the state after the last response token, for rows whose response was truncated.
#[derive(Debug, Clone, Copy)]
pub struct GaeBootstrap<'a> {
    /// `[batch]` float, same dtype as `values`: V(s_{T}) of the state after the last token.
    pub last_value: &'a Tensor,
    /// `[batch]`, any dtype: non-zero when the row was cut off (bootstrap from `last_value`),
    /// zero when it ended (terminal state, value 0; `last_value` is ignored for that row).
    pub truncated: &'a Tensor,
}

/// Advantages and value targets from [`gae`].
#[derive(Debug, Clone)]
pub struct GaeOutput {
    /// `[batch, seq]`: Â_t at response tokens, `0` elsewhere.
    pub advantages: Tensor,
    /// `[batch, seq]`: Â_t + V(s_t) at response tokens (critic targets), `0` elsewhere.
    pub returns: Tensor,
}

/// GAE(γ, λ) over the response tokens of each row.
///
/// * `rewards`: `[batch, seq]` float, per-token rewards (e.g. KL-shaped, score on the last
///   response token). `values`: `[batch, seq]`, same dtype, critic values V(s_t).
/// * `mask`: `[batch, seq]`, any dtype, non-zero = response token. Response tokens need not be
///   contiguous: the "next state" of a response token is the next response token in the row, so
///   masked positions (prompt, padding, tool output) are skipped entirely and their rewards and
///   values never influence any result.
/// * `bootstrap`: `None` treats every row as terminated (value after the last token is 0).
///
/// δ_t = r_t + γ V(s_{t+1}) − V(s_t), Â_t = Σ_l (γλ)^l δ_{t+l}; returns = Â + V. Computed on the
/// host in f64 and returned in `rewards`' dtype and device, detached.
pub fn gae(
    rewards: &Tensor,
    values: &Tensor,
    mask: &Tensor,
    config: GaeConfig,
    bootstrap: Option<GaeBootstrap<'_>>,
) -> Result<GaeOutput> {
    let dtype = expect_float("rewards", rewards)?;
    let (b, t) = expect_2d("rewards", rewards)?;
    expect_like("values", values, &[b, t], dtype, "rewards")?;
    crate::mask::expect_shape("mask", mask, &[b, t], "[batch, seq]")?;
    for (name, v) in [("gamma", config.gamma), ("lambda", config.lambda)] {
        if !(0.0..=1.0).contains(&v) {
            return Err(RlhfError::invalid(name, v, "must be in [0, 1]"));
        }
    }
    let r = host_f64(rewards)?;
    let v = host_f64(values)?;
    let m = host_mask(mask)?;
    let (last_value, truncated) = match bootstrap {
        Some(bs) => {
            if expect_1d("last_value", bs.last_value)? != b {
                return Err(shape_err("last_value", b, bs.last_value));
            }
            if expect_1d("truncated", bs.truncated)? != b {
                return Err(shape_err("truncated", b, bs.truncated));
            }
            (host_f64(bs.last_value)?, host_mask(bs.truncated)?)
        }
        None => (vec![0.0; b], vec![false; b]),
    };

    let (gamma, lambda) = (config.gamma, config.lambda);
    let mut adv = vec![0.0; b * t];
    let mut ret = vec![0.0; b * t];
    for row in 0..b {
        let mut next_value = if truncated[row] { last_value[row] } else { 0.0 };
        let mut next_adv = 0.0;
        for col in (0..t).rev() {
            let i = row * t + col;
            if !m[i] {
                continue;
            }
            let delta = r[i] + gamma * next_value - v[i];
            next_adv = delta + gamma * lambda * next_adv;
            next_value = v[i];
            adv[i] = next_adv;
            ret[i] = next_adv + v[i];
        }
    }
    Ok(GaeOutput {
        advantages: from_host(adv, &[b, t], dtype, rewards)?,
        returns: from_host(ret, &[b, t], dtype, rewards)?,
    })
}

fn shape_err(name: &str, b: usize, t: &Tensor) -> RlhfError {
    RlhfError::Shape {
        name: name.into(),
        expected: format!("[batch] = [{b}]"),
        got: t.dims().to_vec(),
    }
}
