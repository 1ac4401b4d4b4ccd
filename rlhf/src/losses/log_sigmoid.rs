//! A numerically stable, differentiable log σ(x) built from candle ops (no overflow in either
//! tail, exact gradient σ(−x) including at x = 0). Not a fused kernel.

use candle_core::Tensor;

use crate::error::Result;

/// Element-wise `log σ(x) = −log(1 + e^{−x})`, any shape, float dtype.
///
/// Uses `−log(1 + e^{−x})` for `x ≥ 0` and `x − log(1 + e^{x})` for `x < 0`; each branch only ever
/// sees arguments of its own sign, so neither the value nor the gradient can overflow.
pub fn log_sigmoid(x: &Tensor) -> Result<Tensor> {
    let zeros = x.zeros_like()?;
    let nonneg = x.ge(0.0)?;
    let x_pos = nonneg.where_cond(x, &zeros)?;
    let x_neg = nonneg.where_cond(&zeros, x)?;
    let pos = x_pos.neg()?.exp()?.affine(1.0, 1.0)?.log()?.neg()?;
    let neg = (&x_neg - x_neg.exp()?.affine(1.0, 1.0)?.log()?)?;
    Ok(nonneg.where_cond(&pos, &neg)?)
}
