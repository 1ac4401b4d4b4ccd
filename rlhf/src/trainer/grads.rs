//! One optimizer step from a loss: backward, data-parallel gradient averaging, global-norm
//! clipping, AdamW. Shared by the policy and critic trainers.
//!
//! A step whose gradient norm is not finite is skipped (weights untouched) and reported,
//! so a NaN in a loss never reaches the weights or a checkpoint. [`check_loss`] refuses a
//! loss above a configured limit before its gradients are computed.

use crate::optim::{clip_coefficient, AdamW, AdamWConfig};
use crate::{Result, RlhfError};
use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use oxalign_kernels::collective::Collective;
use oxalign_models::nn::checkpointing::Checkpointing;
use oxalign_models::ParamStore;

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
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
    apply_gradients_measured(loss, vars, opt, max_grad_norm, collective, None).map(|(s, _, _)| s)
}

/// The gradients of `loss`: its backward, plus what the layers of an activation-checkpointed
/// model (or one with the layerwise backward) computed in their own backwards (`checkpoint`).
pub fn backward(loss: &Tensor, checkpoint: Option<&Checkpointing>) -> Result<GradStore> {
    if let Some(c) = checkpoint {
        c.clear();
    }
    let mut grads = loss.backward()?;
    if let Some(c) = checkpoint {
        c.add_taken_to(&mut grads)?;
    }
    Ok(grads)
}

/// [`apply_gradients`] (with the gradients of checkpointed layers, [`backward`]), also
/// returning the bytes held by the gradients the optimizer stepped on (measured from their
/// storage).
pub(crate) fn apply_gradients_measured(
    loss: &Tensor,
    vars: &[Var],
    opt: &mut AdamW,
    max_grad_norm: f64,
    collective: Option<&dyn Collective>,
    checkpoint: Option<&Checkpointing>,
) -> Result<(StepStats, usize, usize)> {
    let mut grads = backward(loss, checkpoint)?;
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
            .map_err(|source| RlhfError::Collective {
                what: "gradient all-reduce",
                source,
            })?;
        for (v, g) in vars.iter().zip(averaged) {
            grads.insert(v.as_tensor(), g);
        }
    }
    let grad_bytes: usize = vars
        .iter()
        .filter_map(|v| grads.get(v.as_tensor()))
        .map(crate::fsdp::held_bytes)
        .sum();
    let model_bytes: usize = vars
        .iter()
        .map(|v| crate::fsdp::held_bytes(v.as_tensor()))
        .sum();
    let peak = model_bytes + grad_bytes + opt.moment_bytes();
    let (grad_norm, clip_scale) = clip_coefficient(&grads, vars.iter(), max_grad_norm)?;
    if !grad_norm.is_finite() {
        let stats = StepStats {
            grad_norm,
            skipped: true,
        };
        return Ok((stats, grad_bytes, peak));
    }
    opt.step_scaled(&grads, clip_scale)?;
    let stats = StepStats {
        grad_norm,
        skipped: false,
    };
    Ok((stats, grad_bytes, peak))
}

/// Refuses a loss that is not finite or whose magnitude exceeds `limit`
/// ([`RlhfError::Diverged`]), before any gradient is applied. `local` is this replica's loss;
/// with data parallelism and a finite `limit` the replicas' losses are averaged over
/// `collective` first (on `device`), so every replica takes the same decision.
pub fn check_loss(
    what: &'static str,
    local: f64,
    limit: f64,
    device: &Device,
    collective: Option<&dyn Collective>,
) -> Result<()> {
    if limit.is_infinite() {
        // Only non-finite values can fail; the gradient norm check catches them together
        // on every replica, so no collective is needed here.
        if local.is_finite() || collective.is_some_and(|c| c.world_size() > 1) {
            return Ok(());
        }
    }
    let value = match collective.filter(|c| c.world_size() > 1) {
        Some(c) => {
            let t = Tensor::new(&[local as f32], device)?;
            let mean = c
                .all_reduce_mean(&[t])
                .map_err(|source| RlhfError::Collective {
                    what: "loss all-reduce",
                    source,
                })?;
            mean[0].to_vec1::<f32>()?[0] as f64
        }
        None => local,
    };
    if value.is_finite() && value.abs() <= limit {
        return Ok(());
    }
    Err(RlhfError::Diverged { what, value, limit })
}

/// AdamW (default parameter groups from the model's declaration, torch's betas and eps) over
/// a model's parameters, and the bare `Var`s in the same order for [`apply_gradients`].
pub(crate) fn adamw_over(
    params: &ParamStore,
    lr: f64,
    weight_decay: f64,
) -> Result<(AdamW, Vec<Var>)> {
    let vars = params.vars().into_iter().map(|(_, v)| v).collect();
    let config = AdamWConfig {
        lr,
        weight_decay,
        ..AdamWConfig::default()
    };
    Ok((AdamW::for_params(params, config)?, vars))
}
