//! The critic's trainer: per-token values for rollouts and clipped value-loss updates on a
//! `ValueModel`. It does not compute returns; `experience.rs` does.

use super::grads::{adamw_over, check_loss, StepStats};
use super::sharding::{Sharded, TrainParams};
use super::{PackedRows, TokenBatch};
use crate::losses::{value_loss, LossAgg};
use crate::optim::AdamW;
use crate::Result;
use candle_core::Tensor;
use oxalign_kernels::collective::Collective;
use oxalign_models::{ParamStore, ValueModel};

/// A value model and its optimizer; replicated, or sharded with [`Sharded::shard`] (as
/// [`super::PolicyTrainer`]).
pub struct CriticTrainer {
    /// The critic.
    pub model: ValueModel,
    /// Its optimizer.
    pub opt: AdamW,
    /// Largest value loss a minibatch update applies; a larger or non-finite one fails with
    /// [`crate::RlhfError::Diverged`] before the weights change. Default infinite.
    pub max_value_loss: f64,
    /// Run the value updates on packed rows ([`PackedRows`]) instead of the padded batch;
    /// the loss and gradients are the padded path's (to f32 rounding). Default `false`.
    pub packing: bool,
    params: TrainParams,
}

impl Sharded for CriticTrainer {
    fn parts(&self) -> (&TrainParams, &AdamW, &ParamStore) {
        (&self.params, &self.opt, self.model.params())
    }

    fn parts_mut(&mut self) -> (&mut TrainParams, &mut AdamW, &ParamStore) {
        (&mut self.params, &mut self.opt, self.model.params())
    }

    fn set_layer_residency(
        &mut self,
        residency: Option<std::sync::Arc<dyn oxalign_models::nn::layer_residency::LayerResidency>>,
    ) {
        self.model.set_layer_residency(residency);
    }
}

impl CriticTrainer {
    /// Turns on activation checkpointing for this trainer's forwards and backwards
    /// ([`oxalign_models::Model::checkpoint_activations`]). Errors when sharded.
    pub fn checkpoint_activations(&mut self) -> Result<()> {
        let checkpoint = self.model.checkpoint_activations();
        self.params.set_checkpointing(checkpoint)
    }

    /// Turns on the layerwise backward ([`oxalign_models::Model::layerwise_backward`]):
    /// each layer's activations freed once its backward is done. Errors when sharded.
    pub fn layerwise_backward(&mut self) -> Result<()> {
        let layerwise = self.model.layerwise_backward();
        self.params.set_checkpointing(layerwise)
    }

    /// Wraps `model` with AdamW (default parameter groups).
    pub fn new(model: ValueModel, lr: f64, weight_decay: f64) -> Result<Self> {
        let (opt, vars) = adamw_over(model.params(), lr, weight_decay)?;
        Ok(Self {
            model,
            opt,
            max_value_loss: f64::INFINITY,
            packing: false,
            params: TrainParams::new(vars),
        })
    }

    /// V(s_t) `[B, T-1]` aligned with next-token log-probs (position t is the state before
    /// target t+1), detached.
    pub fn values(&self, batch: &TokenBatch) -> Result<Tensor> {
        Ok(self.forward(batch, false)?.detach())
    }

    /// V of every state `[B, T]`, detached: column t is the value after tokens `..=t`, so
    /// the column of a row's last real token is the value of the state after its response
    /// (what GAE bootstraps from when the response was cut off).
    pub fn state_values(&self, batch: &TokenBatch) -> Result<Tensor> {
        self.params.ensure_gathered()?;
        Ok(self
            .model
            .forward(&batch.ids, Some(&batch.attention_mask))?
            .detach())
    }

    /// V(s_t) `[B, T-1]` (differentiable), from packed rows when `packed` (then 0 past each
    /// sequence's end).
    pub fn forward(&self, batch: &TokenBatch, packed: bool) -> Result<Tensor> {
        self.params.ensure_gathered()?;
        if packed {
            let rows = PackedRows::new(batch)?;
            let l = rows.ids.dim(1)?;
            let v = self.model.forward_packed(&rows.ids, &rows.segments)?;
            return rows.unpack(&v.narrow(1, 0, l - 1)?);
        }
        let t = batch.ids.dim(1)?;
        Ok(self
            .model
            .forward(&batch.ids, Some(&batch.attention_mask))?
            .narrow(1, 0, t - 1)?)
    }

    /// One clipped value-loss update. `old_values`, `returns`: `[B, T-1]`. Returns
    /// (loss, step stats).
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        batch: &TokenBatch,
        old_values: &Tensor,
        returns: &Tensor,
        clip: Option<f64>,
        agg: LossAgg,
        lr: f64,
        max_grad_norm: f64,
        weight: f64,
        collective: Option<&dyn Collective>,
    ) -> Result<(f64, StepStats)> {
        self.params.gather_for_step(collective)?;
        let out = self.step_gathered(
            batch,
            (old_values, returns),
            clip,
            agg,
            lr,
            max_grad_norm,
            weight,
            collective,
        );
        self.params.finish(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn step_gathered(
        &mut self,
        batch: &TokenBatch,
        (old_values, returns): (&Tensor, &Tensor),
        clip: Option<f64>,
        agg: LossAgg,
        lr: f64,
        max_grad_norm: f64,
        weight: f64,
        collective: Option<&dyn Collective>,
    ) -> Result<(f64, StepStats)> {
        self.opt.set_lr(lr);
        let dropout = self.model.dropout_scope(self.opt.steps_taken());
        let v = self.forward(batch, self.packing)?;
        drop(dropout);
        let (loss, stats) = value_loss(&v, old_values, returns, &batch.response_mask, clip, agg)?;
        let device = v.device().clone();
        check_loss(
            "value loss",
            stats.loss,
            self.max_value_loss,
            &device,
            collective,
        )?;
        let step = self.params.apply(
            &loss.affine(weight, 0.0)?,
            &mut self.opt,
            max_grad_norm,
            collective,
        )?;
        Ok((stats.loss, step))
    }
}
