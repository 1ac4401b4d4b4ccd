//! Global-norm gradient clipping over a candle `GradStore`, like
//! `torch.nn.utils.clip_grad_norm_` (L2 norm, `max_norm / (norm + 1e-6)` scaling). It does not
//! all-reduce gradients across ranks; do that before clipping.

use candle_core::backprop::GradStore;
use candle_core::{DType, Var};

use crate::error::Result;
use crate::optim::fused_adamw;

/// Added to the norm before dividing, as PyTorch does.
pub(crate) const CLIP_EPS: f64 = 1e-6;

/// L2 norm over the gradients of `vars` (parameters without a gradient are skipped), in f64.
pub fn global_grad_norm<'a>(
    grads: &GradStore,
    vars: impl IntoIterator<Item = &'a Var>,
) -> Result<f64> {
    let mut total = 0.0f64;
    for var in vars {
        if let Some(g) = grads.get(var.as_tensor()) {
            total += if fused_adamw::fusable(g) {
                fused_adamw::sum_of_squares(g)?
            } else {
                g.to_dtype(DType::F64)?
                    .sqr()?
                    .sum_all()?
                    .to_scalar::<f64>()?
            };
        }
    }
    Ok(total.sqrt())
}

/// The global-norm clip without touching the gradients: `(norm, scale)` where `scale` is
/// `Some(max_norm / (norm + 1e-6))` when that is below 1 (pass it to
/// [`crate::optim::AdamW::step_scaled`]) and `None` otherwise or when the norm is not finite.
pub fn clip_coefficient<'a>(
    grads: &GradStore,
    vars: impl IntoIterator<Item = &'a Var>,
    max_norm: f64,
) -> Result<(f64, Option<f64>)> {
    crate::error::check_above("max_norm", max_norm, 0.0)?;
    let norm = global_grad_norm(grads, vars)?;
    let coef = max_norm / (norm + CLIP_EPS);
    Ok((norm, (norm.is_finite() && coef < 1.0).then_some(coef)))
}

/// Scales the gradients of `vars` in place so their global L2 norm is at most `max_norm`.
///
/// * Returns the norm *before* clipping.
/// * Scale factor `min(1, max_norm / (norm + 1e-6))` applied to every gradient of `vars`.
/// * When the norm is NaN or infinite, gradients are left unchanged and the non-finite norm is
///   returned, so the caller can skip the step (PyTorch would multiply them by NaN/0).
pub fn clip_grad_norm<'a>(
    grads: &mut GradStore,
    vars: impl IntoIterator<Item = &'a Var> + Clone,
    max_norm: f64,
) -> Result<f64> {
    crate::error::check_above("max_norm", max_norm, 0.0)?;
    let norm = global_grad_norm(grads, vars.clone())?;
    if !norm.is_finite() {
        return Ok(norm);
    }
    let coef = max_norm / (norm + CLIP_EPS);
    if coef < 1.0 {
        for var in vars {
            if let Some(g) = grads.remove(var.as_tensor()) {
                grads.insert(var.as_tensor(), g.affine(coef, 0.0)?);
            }
        }
    }
    Ok(norm)
}
