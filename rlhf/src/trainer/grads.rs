//! One optimizer step from a loss: backward, data-parallel gradient averaging, global-norm
//! clipping, AdamW. Shared by the policy and critic trainers.
//!
//! A step whose gradient norm is not finite is skipped (weights untouched) and reported,
//! so a NaN in a loss never reaches the weights or a checkpoint.

use crate::optim::{clip_grad_norm, AdamW, AdamWConfig};
use crate::{Result, RlhfError};
use candle_core::{Tensor, Var};
use oxalign_kernels::collective::Collective;

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StepStats {
    /// Global gradient L2 norm before clipping (after the data-parallel average).
    pub grad_norm: f64,
    /// True when the step was skipped because the norm was NaN or infinite.
    pub skipped: bool,
}

/// Backpropagates `loss`, averages the gradients of `vars` over `collective` (if any),
/// clips them to `max_grad_norm` and applies `opt`.
///
/// With data parallelism every replica must call this with its share of the loss scaled so
/// that the *mean* over replicas is the global loss.
pub fn apply_gradients(
    loss: &Tensor,
    vars: &[Var],
    opt: &mut AdamW,
    max_grad_norm: f64,
    collective: Option<&dyn Collective>,
) -> Result<StepStats> {
    let mut grads = loss.backward()?;
    if let Some(c) = collective.filter(|c| c.world_size() > 1) {
        let local: Vec<Tensor> = vars
            .iter()
            .map(|v| match grads.get(v.as_tensor()) {
                Some(g) => Ok(g.clone()),
                None => v.as_tensor().zeros_like(),
            })
            .collect::<candle_core::Result<_>>()?;
        let averaged = c
            .all_reduce_mean(&local)
            .map_err(|e| RlhfError::Data(format!("gradient all-reduce failed: {e}")))?;
        for (v, g) in vars.iter().zip(averaged) {
            grads.insert(v.as_tensor(), g);
        }
    }
    let grad_norm = clip_grad_norm(&mut grads, vars.iter(), max_grad_norm)?;
    if !grad_norm.is_finite() {
        return Ok(StepStats {
            grad_norm,
            skipped: true,
        });
    }
    opt.step(&grads)?;
    Ok(StepStats {
        grad_norm,
        skipped: false,
    })
}

/// AdamW (default parameter groups, torch's betas and eps) over a model's named
/// parameters, and the bare `Var`s in the same order for [`apply_gradients`].
pub fn adamw_over(
    named: Vec<(String, Var)>,
    lr: f64,
    weight_decay: f64,
) -> Result<(AdamW, Vec<Var>)> {
    let vars = named.iter().map(|(_, v)| v.clone()).collect();
    let config = AdamWConfig {
        lr,
        weight_decay,
        ..AdamWConfig::default()
    };
    Ok((AdamW::new(named, config)?, vars))
}
