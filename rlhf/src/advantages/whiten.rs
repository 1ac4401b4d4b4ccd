//! Masked whitening of advantages: mean/std over the response tokens of the whole batch.
//! Not differentiable and not per-row (per-group normalisation lives in `group.rs`).

use candle_core::Tensor;

use crate::error::{Result, RlhfError};
use crate::mask::{expect_2d, expect_float, expect_shape, from_host, host_f64, host_mask};

/// Options of [`masked_whiten`].
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WhitenOptions {
    /// `true`: result has mean 0. `false`: the mean is added back (only the scale changes).
    pub shift_mean: bool,
    /// Added to the variance inside the square root.
    pub eps: f64,
}

impl Default for WhitenOptions {
    /// `shift_mean = true`, `eps = 1e-8`.
    fn default() -> Self {
        Self {
            shift_mean: true,
            eps: 1e-8,
        }
    }
}

/// Whitens `x` over its masked tokens: `(x − μ) / sqrt(σ² + eps)` (`+ μ` when
/// `shift_mean = false`), where μ and σ² are the mean and the unbiased (n − 1) variance of the
/// `n` response tokens of the whole batch.
///
/// * `x`: `[batch, seq]` float; `mask`: `[batch, seq]`, any dtype, non-zero = response token.
/// * Returns `[batch, seq]` in `x`'s dtype, detached, `0` at masked positions. Masked values never
///   influence the statistics. Errors when fewer than 2 tokens are unmasked.
pub fn masked_whiten(x: &Tensor, mask: &Tensor, options: WhitenOptions) -> Result<Tensor> {
    expect_float("x", x)?;
    let (b, t) = expect_2d("x", x)?;
    expect_shape("mask", mask, &[b, t], "[batch, seq]")?;
    crate::error::check_min("eps", options.eps, 0.0)?;
    let values = host_f64(x)?;
    let m = host_mask(mask)?;
    let out = whiten_host(&values, &m, options)?;
    from_host(out, &[b, t], x.dtype(), x)
}

/// Host version of [`masked_whiten`] on flat row-major slices.
pub(crate) fn whiten_host(values: &[f64], m: &[bool], options: WhitenOptions) -> Result<Vec<f64>> {
    let selected: Vec<f64> = values
        .iter()
        .zip(m)
        .filter(|(_, &keep)| keep)
        .map(|(v, _)| *v)
        .collect();
    let n = selected.len();
    if n < 2 {
        return Err(RlhfError::invalid(
            "mask",
            format!("{n} response token(s)"),
            "whitening needs at least 2 unmasked tokens",
        ));
    }
    let mean = selected.iter().sum::<f64>() / n as f64;
    let var = selected.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n as f64 - 1.0);
    let inv_std = 1.0 / (var + options.eps).sqrt();
    let shift = if options.shift_mean { 0.0 } else { mean };
    Ok(values
        .iter()
        .zip(m)
        .map(|(v, &keep)| {
            if keep {
                (v - mean) * inv_std + shift
            } else {
                0.0
            }
        })
        .collect())
}
