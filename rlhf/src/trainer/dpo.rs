//! One DPO / cDPO / IPO update of a [`PolicyTrainer`] on a batch of preference pairs: the
//! policy's summed response log-probs of the chosen and rejected rows against the frozen
//! reference's (given, computed once elsewhere). The loss is in `losses/dpo.rs`.

use super::grads::{check_loss, StepStats};
use super::{PolicyTrainer, TokenBatch};
use crate::losses::{dpo_loss, DpoLoss, DpoStats, PreferenceLogprobs};
use crate::Result;
use candle_core::Tensor;
use oxalign_kernels::collective::Collective;
use oxalign_kernels::ops::TokenDistribution;

/// Settings of one preference update.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct DpoConfig {
    /// β: the strength of the implicit KL to the reference.
    pub beta: f64,
    /// Sigmoid (DPO, cDPO with label smoothing) or IPO.
    pub loss: DpoLoss,
    /// Learning rate.
    pub lr: f64,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
}

/// Summed response log-probs `[B]` (nats) of `batch` under `lp` `[B, T-1]`.
pub fn summed_response_logprobs(lp: &Tensor, batch: &TokenBatch) -> Result<Tensor> {
    let mask = batch.response_mask.to_dtype(lp.dtype())?;
    Ok((lp * mask)?.sum(1)?)
}

impl PolicyTrainer {
    /// One update on `chosen` / `rejected` (row `i` of each is one pair); `ref_chosen`,
    /// `ref_rejected` are the reference's summed response log-probs `[B]`. `weight` scales
    /// this replica's loss (1 without data parallelism).
    #[allow(clippy::too_many_arguments)]
    pub fn dpo_step(
        &mut self,
        chosen: &TokenBatch,
        rejected: &TokenBatch,
        ref_chosen: &Tensor,
        ref_rejected: &Tensor,
        cfg: &DpoConfig,
        weight: f64,
        collective: Option<&dyn Collective>,
    ) -> Result<(DpoStats, StepStats)> {
        self.opt.set_lr(cfg.lr);
        let dropout = self.model.dropout_scope(self.opt.steps_taken());
        let c = summed_response_logprobs(
            &self
                .head_outputs(chosen, TokenDistribution::MODEL, self.packing.sft)?
                .logprobs,
            chosen,
        )?;
        let r = summed_response_logprobs(
            &self
                .head_outputs(rejected, TokenDistribution::MODEL, self.packing.sft)?
                .logprobs,
            rejected,
        )?;
        drop(dropout);
        let (loss, stats) = dpo_loss(
            PreferenceLogprobs {
                policy_chosen: &c,
                policy_rejected: &r,
                reference_chosen: ref_chosen,
                reference_rejected: ref_rejected,
            },
            cfg.beta,
            cfg.loss,
        )?;
        let device = c.device().clone();
        check_loss(
            "DPO loss",
            stats.loss,
            self.max_policy_loss,
            &device,
            collective,
        )?;
        let step = self.params.apply(
            &loss.affine(weight, 0.0)?,
            &mut self.opt,
            cfg.max_grad_norm,
            collective,
        )?;
        Ok((stats, step))
    }
}
