//! One optimizer step of a sharded replica: backward on the gathered model, reduce-scatter
//! of the gradients (the full gradients are dropped right after), the global-norm clip over
//! the whole group, and AdamW on this rank's shards. The same rules as the replicated
//! `apply_gradients`: a non-finite norm skips the step, weights untouched.

use super::params::ShardedParams;
use super::stream::LayerStream;
use crate::optim::{clip::CLIP_EPS, default_group_of};
use crate::optim::{param_groups::default_groups, AdamW, AdamWConfig};
use crate::trainer::StepStats;
use crate::Result;
use candle_core::Tensor;
use oxalign_kernels::collective::Collective;
use oxalign_models::ParamStore;

/// Backpropagates `loss` (this replica's share, scaled so that the mean over replicas is
/// the global loss), reduce-scatters the gradients, clips them to `max_grad_norm` by their
/// global norm and steps `opt` (built by [`shard_optimizer`]) on the shards. With `stream`,
/// the layers the forward streamed hand over their shard gradients during the backward
/// (layer by layer, [`LayerStream`]); the rest is reduce-scattered after it. Also returns
/// the bytes held by the shard gradients the optimizer stepped on, and the most bytes held
/// at once during the step (model `Var`s present, full gradients, shards, shard gradients,
/// moments; activations not counted: [`super::TrainMemory::step_peak`]).
pub(crate) fn apply_sharded_gradients(
    loss: &Tensor,
    params: &ShardedParams,
    stream: Option<&LayerStream>,
    opt: &mut AdamW,
    max_grad_norm: f64,
    collective: Option<&dyn Collective>,
) -> Result<(StepStats, usize, usize)> {
    crate::error::check_above("max_norm", max_grad_norm, 0.0)?;
    if let Some(s) = stream {
        s.begin_step();
    }
    let full = loss.backward()?;
    let streamed = stream.map(LayerStream::finish_step);
    let (shard_bytes, model_bytes) = params.held();
    let full_grad_bytes: usize = params
        .full_vars()
        .iter()
        .filter_map(|v| full.get(v.as_tensor()))
        .map(super::held_bytes)
        .sum();
    let skip = streamed.as_ref().map_or(&[][..], |s| s.units.as_slice());
    let mut grads = params.reduce_scatter(&full, collective, skip)?;
    drop(full);
    let mut layer_peak = 0;
    if let Some(s) = streamed {
        layer_peak = s.peak;
        for (i, g) in s.shard_grads {
            grads.insert(params.shard_var(i).as_tensor(), g);
        }
    }
    let bytes = params
        .named_shards()
        .iter()
        .filter_map(|(_, v)| grads.get(v.as_tensor()))
        .map(super::held_bytes)
        .sum();
    // The parameters outside the layers keep their full gradients through the whole
    // backward (the head's come first), so they add to the peak of every layer.
    let at_end = model_bytes + full_grad_bytes + shard_bytes + bytes;
    let peak = (layer_peak + full_grad_bytes).max(at_end) + opt.moment_bytes();
    let grad_norm = params.global_grad_norm(&grads, collective)?;
    if !grad_norm.is_finite() {
        let stats = StepStats {
            grad_norm,
            skipped: true,
        };
        return Ok((stats, bytes, peak));
    }
    let coef = max_grad_norm / (grad_norm + CLIP_EPS);
    opt.step_scaled(&grads, (coef < 1.0).then_some(coef))?;
    let stats = StepStats {
        grad_norm,
        skipped: false,
    };
    Ok((stats, bytes, peak))
}

/// AdamW over the shards of `params` with the groups the model's declaration gives (weight
/// decay on linear weights only, as [`AdamW::for_params`]), torch's betas and eps.
pub(crate) fn shard_optimizer(
    store: &ParamStore,
    params: &ShardedParams,
    lr: f64,
    weight_decay: f64,
) -> Result<AdamW> {
    let config = AdamWConfig {
        lr,
        weight_decay,
        ..AdamWConfig::default()
    };
    let group_of = |n: &str| match store.spec(n) {
        Some(spec) => usize::from(!spec.kind.decays()),
        None => default_group_of(n),
    };
    AdamW::with_groups(
        params.named_shards(),
        config,
        default_groups(weight_decay),
        group_of,
    )
}
