//! The reward model's trainer: Bradley–Terry updates of a [`RewardModel`] on preference
//! pairs (chosen and rejected rows scored at their last real token), and plain scoring for
//! evaluation. The loss is in `losses/bradley_terry.rs`.

use super::grads::{adamw_over, apply_gradients_measured, check_loss, StepStats};
use super::TokenBatch;
use crate::losses::{bradley_terry_loss, BradleyTerryStats};
use crate::mask::host_f64;
use crate::optim::AdamW;
use crate::Result;
use candle_core::Var;
use oxalign_kernels::collective::Collective;
use oxalign_models::nn::checkpointing::Checkpointing;
use oxalign_models::RewardModel;

/// A reward model and its optimizer.
pub struct RewardTrainer {
    /// The model being trained.
    pub model: RewardModel,
    /// Its optimizer.
    pub opt: AdamW,
    /// Largest Bradley–Terry loss a step applies (a larger or non-finite one fails with
    /// [`crate::RlhfError::Diverged`] before the weights change). Default infinite.
    pub max_loss: f64,
    vars: Vec<Var>,
    checkpoint: Option<std::sync::Arc<Checkpointing>>,
}

impl RewardTrainer {
    /// Wraps `model` with AdamW (default parameter groups).
    pub fn new(model: RewardModel, lr: f64, weight_decay: f64) -> Result<Self> {
        let (opt, vars) = adamw_over(model.params(), lr, weight_decay)?;
        Ok(Self {
            model,
            opt,
            max_loss: f64::INFINITY,
            vars,
            checkpoint: None,
        })
    }

    /// Turns on activation checkpointing for this trainer's forwards and backwards
    /// ([`oxalign_models::Model::checkpoint_activations`]).
    pub fn checkpoint_activations(&mut self) {
        self.checkpoint = Some(self.model.checkpoint_activations());
    }

    /// Turns on the layerwise backward ([`oxalign_models::Model::layerwise_backward`]):
    /// each layer's activations freed once its backward is done.
    pub fn layerwise_backward(&mut self) {
        self.checkpoint = Some(self.model.layerwise_backward());
    }

    /// Sequence scores `[B]` of `batch` (prompt + response), detached, on the host.
    pub fn scores(&self, batch: &TokenBatch) -> Result<Vec<f64>> {
        let s = self
            .model
            .forward(&batch.ids, Some(&batch.attention_mask))?
            .detach();
        host_f64(&s)
    }

    /// One Bradley–Terry update; row `i` of `chosen` and `rejected` is one pair.
    pub fn step(
        &mut self,
        chosen: &TokenBatch,
        rejected: &TokenBatch,
        lr: f64,
        max_grad_norm: f64,
        weight: f64,
        collective: Option<&dyn Collective>,
    ) -> Result<(BradleyTerryStats, StepStats)> {
        self.opt.set_lr(lr);
        let dropout = self.model.dropout_scope(self.opt.steps_taken());
        let c = self
            .model
            .forward(&chosen.ids, Some(&chosen.attention_mask))?;
        let r = self
            .model
            .forward(&rejected.ids, Some(&rejected.attention_mask))?;
        drop(dropout);
        let (loss, stats) = bradley_terry_loss(&c, &r, None)?;
        let device = c.device().clone();
        check_loss(
            "Bradley–Terry loss",
            stats.loss,
            self.max_loss,
            &device,
            collective,
        )?;
        let (step, _, _) = apply_gradients_measured(
            &loss.affine(weight, 0.0)?,
            &self.vars,
            &mut self.opt,
            max_grad_norm,
            collective,
            self.checkpoint.as_deref(),
        )?;
        Ok((stats, step))
    }
}
