//! The policy's trainer: log-probs for rollouts, SFT steps and PPO minibatch updates on a
//! `CausalLm`, with AdamW and optional data-parallel gradient averaging.
//!
//! It computes; it does not schedule. Which minibatch, which learning rate and which replica
//! are the caller's decisions.

use super::grads::{adamw_over, check_loss, StepStats};
use super::sharding::{Sharded, TrainParams};
use super::{scalar, PackedRows, Packing, TokenBatch};
use crate::losses::{
    entropy_bonus, kl_loss, sft_loss, EntropyStats, KlEstimator, PolicyObjective, PpoConfig,
    PpoStats, RolloutCorrection,
};
use crate::mask::masked_abs_diff;
use crate::optim::AdamW;
use crate::Result;
use candle_core::{DType, Device, Tensor};
use oxalign_kernels::collective::Collective;
use oxalign_kernels::ops::{HeadOutputs, TokenDistribution};
use oxalign_models::moe::routing::{ExpertChoices, RouterTrace};
use oxalign_models::{CausalLm, ParamStore};

/// Loss settings of a PPO policy update.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct PolicyLossConfig {
    /// The surrogate: PPO, GSPO or CISPO.
    pub objective: PolicyObjective,
    /// Clipping and aggregation.
    pub ppo: PpoConfig,
    /// KL-as-loss coefficient β (0 when the KL is in the reward).
    pub kl_loss_coef: f64,
    /// KL estimator for the loss term.
    pub kl_estimator: KlEstimator,
    /// Entropy bonus coefficient.
    pub entropy_coef: f64,
    /// Correction of the engine/trainer mismatch: per-token weights from π_old / π_engine
    /// (token TIS, sequence masking or IcePop masking) on the surrogate.
    pub rollout_correction: RolloutCorrection,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
}

/// Diagnostics of one policy minibatch update (local to this replica).
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct PolicyStats {
    /// PPO surrogate loss.
    pub policy_loss: f64,
    /// Fraction of clipped tokens.
    pub clip_frac: f64,
    /// k1 estimate of KL(π_old ‖ π).
    pub approx_kl: f64,
    /// Mean token entropy (nats).
    pub entropy: f64,
    /// Mean and max |log π_trainer − log π_rollout| over the response tokens (nats), before
    /// this update: the engine-vs-trainer mismatch. Zero when no rollout log-probs are given.
    pub rollout_mismatch_mean: f64,
    /// See `rollout_mismatch_mean`.
    pub rollout_mismatch_max: f64,
    /// With rollout routing replay: the fraction of (token, sparse layer) routings where the
    /// trainer's own router would have chosen other experts than the rollout did, before
    /// this update. Zero without replay.
    pub routing_overridden: f64,
    /// The routers' load-balancing loss (unscaled) when it is part of the loss
    /// ([`PolicyTrainer::router_aux_loss_coef`] > 0 on an MoE policy); `None` otherwise.
    pub router_aux_loss: Option<f64>,
    /// Gradient norm and skip flag.
    pub step: StepStats,
}

/// The tensors of one PPO minibatch update (see [`PolicyTrainer::ppo_step`]).
#[derive(Clone, Copy)]
struct PpoInputs<'a> {
    batch: &'a TokenBatch,
    old_logprobs: &'a Tensor,
    advantages: &'a Tensor,
    ref_logprobs: Option<&'a Tensor>,
    rollout_logprobs: Option<&'a Tensor>,
}

/// One training forward: the head's outputs, what the routers did, and the `[rows, T]`
/// mask (1 = real token) of the rows the forward ran on (padded or packed), which the
/// load-balancing loss pools over.
struct TracedForward {
    out: HeadOutputs,
    trace: RouterTrace,
    real_tokens: Tensor,
}

/// A policy model and its optimizer.
///
/// Replicated by default; [`Sharded::shard`] makes it hold 1/N of the parameters, gradients
/// and AdamW state (then every step gathers the model and releases it after, and reading the
/// model outside a step needs [`Sharded::gather`] first).
pub struct PolicyTrainer {
    /// The model being trained (weights shared with anything that cloned its tensors).
    pub model: CausalLm,
    /// Its optimizer.
    pub opt: AdamW,
    /// Largest SFT loss (mean NLL, nats) a step applies; a larger or non-finite one fails
    /// with [`crate::RlhfError::Diverged`] before the weights change. Default infinite.
    pub max_sft_loss: f64,
    /// Largest |PPO surrogate loss| a minibatch update applies (same rule). Default infinite.
    pub max_policy_loss: f64,
    /// Largest |approximate KL| (k1, nats per token) between the rollout-time policy and the
    /// current one before a minibatch update is applied (same rule): a policy that has
    /// moved this far in one step has collapsed. Default infinite.
    pub max_update_kl: f64,
    /// The distribution rollouts are sampled from (temperature, top-k, top-p): PPO's
    /// log-probs, ratios, KL and entropy are taken under it, and so is [`Self::logprobs`],
    /// so they match the engine's sampling log-probs. SFT and [`Self::nll`] always use the
    /// model's own distribution. Default [`TokenDistribution::MODEL`].
    pub rollout_distribution: TokenDistribution,
    /// Which training steps run on packed rows ([`PackedRows`]: several sequences per row,
    /// attention and positions per sequence) instead of the padded batch. Losses and
    /// gradients are the padded path's (to f32 rounding). Default: none.
    pub packing: Packing,
    /// Weight of the routers' load-balancing loss ([`oxalign_models::moe::aux_loss`]) in the SFT
    /// and policy losses. Default HF's and TRL's rule: `router_aux_loss_coef` of the model's
    /// `config.json` when its `output_router_logits` is true, else 0 (always 0 for a dense
    /// model).
    pub router_aux_loss_coef: f64,
    pub(crate) params: TrainParams,
}

impl Sharded for PolicyTrainer {
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

impl PolicyTrainer {
    /// Wraps `model` with AdamW (default parameter groups: no decay on norms, biases, embeddings).
    pub fn new(model: CausalLm, lr: f64, weight_decay: f64) -> Result<Self> {
        let (opt, vars) = adamw_over(model.params(), lr, weight_decay)?;
        let router_aux_loss_coef = match &model.config().moe {
            Some(m) if m.output_router_logits => m.router_aux_loss_coef,
            _ => 0.0,
        };
        Ok(Self {
            model,
            opt,
            max_sft_loss: f64::INFINITY,
            max_policy_loss: f64::INFINITY,
            max_update_kl: f64::INFINITY,
            rollout_distribution: TokenDistribution::MODEL,
            packing: Packing::default(),
            router_aux_loss_coef,
            params: TrainParams::new(vars),
        })
    }

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

    /// Next-token log-probs `[B, T-1]` (nats) of `batch` under the current weights and
    /// [`Self::rollout_distribution`], detached.
    pub fn logprobs(&self, batch: &TokenBatch) -> Result<Tensor> {
        Ok(self
            .head_outputs(batch, self.rollout_distribution, self.packing.rl)?
            .logprobs
            .detach())
    }

    /// Token log-probs and entropies `[B, T-1]` under `dist`, from the fused head (no
    /// `[B, T, V]` logits), computed on packed rows when `packed` (then 0 past each
    /// sequence's end).
    pub fn head_outputs(
        &self,
        batch: &TokenBatch,
        dist: TokenDistribution,
        packed: bool,
    ) -> Result<HeadOutputs> {
        Ok(self.head_outputs_traced(batch, dist, packed, false)?.out)
    }

    /// [`Self::head_outputs`] with the routing of the forward: replaying the rollout's
    /// experts when `batch.routing` is set ([`TokenBatch::routing`]), else the routers' own.
    /// With `response_only` (a loss masked by `batch.response_mask` follows), an unpacked
    /// batch runs the LM head only at the response targets, and the outputs are 0 elsewhere.
    fn head_outputs_traced(
        &self,
        batch: &TokenBatch,
        dist: TokenDistribution,
        packed: bool,
        response_only: bool,
    ) -> Result<TracedForward> {
        self.params.ensure_gathered()?;
        let records = batch.routing.as_deref();
        if !packed {
            let t = batch.ids.dim(1)?;
            let mut trace = match records {
                Some(r) => {
                    let rows: Vec<(&ExpertChoices, usize)> = r.iter().map(|x| (x, 0)).collect();
                    RouterTrace::replaying(ExpertChoices::for_batch(&rows, t))
                }
                None => RouterTrace::new(),
            };
            let (m, mask) = (&self.model, Some(&batch.attention_mask));
            let out = if response_only {
                let at = response_positions(&batch.response_mask)?;
                m.next_token_outputs_at_traced(&batch.ids, mask, dist, &mut trace, &at)?
            } else {
                m.next_token_outputs_traced(&batch.ids, mask, dist, &mut trace)?
            };
            return Ok(TracedForward {
                out,
                trace,
                real_tokens: batch.attention_mask.clone(),
            });
        }
        let rows = PackedRows::new(batch)?;
        let mut trace = match records {
            Some(r) => RouterTrace::replaying(rows.routing(r)),
            None => RouterTrace::new(),
        };
        let out = self.model.next_token_outputs_packed_traced(
            &rows.ids,
            &rows.segments,
            dist,
            &mut trace,
        )?;
        let out = HeadOutputs {
            logprobs: rows.unpack(&out.logprobs)?,
            entropy: rows.unpack(&out.entropy)?,
        };
        Ok(TracedForward {
            out,
            trace,
            real_tokens: rows.real_tokens()?,
        })
    }

    /// `router_aux_loss_coef` times the load-balancing loss of `forward`'s routers, and the
    /// unscaled loss; `None` when the coefficient is 0 or the model is dense.
    fn router_aux_term(&self, forward: &TracedForward) -> Result<Option<(Tensor, f64)>> {
        if self.router_aux_loss_coef == 0.0 {
            return Ok(None);
        }
        let aux = self
            .model
            .router_aux_loss(&forward.trace, Some(&forward.real_tokens))?;
        match aux {
            Some(aux) => {
                let value = scalar(&aux)?;
                Ok(Some((aux.affine(self.router_aux_loss_coef, 0.0)?, value)))
            }
            None => Ok(None),
        }
    }

    /// One supervised step on the response tokens of `batch` (prompt masked out).
    ///
    /// `weight` scales this replica's loss (1 without data parallelism). Returns the mean
    /// NLL per trained token and the step stats.
    pub fn sft_step(
        &mut self,
        batch: &TokenBatch,
        lr: f64,
        max_grad_norm: f64,
        weight: f64,
        collective: Option<&dyn Collective>,
    ) -> Result<(f64, StepStats)> {
        self.params.gather_for_step(collective)?;
        let out = self.sft_step_gathered(batch, lr, max_grad_norm, weight, collective);
        self.params.finish(out)
    }

    fn sft_step_gathered(
        &mut self,
        batch: &TokenBatch,
        lr: f64,
        max_grad_norm: f64,
        weight: f64,
        collective: Option<&dyn Collective>,
    ) -> Result<(f64, StepStats)> {
        self.opt.set_lr(lr);
        let dropout = self.model.dropout_scope(self.opt.steps_taken());
        let forward =
            self.head_outputs_traced(batch, TokenDistribution::MODEL, self.packing.sft, true)?;
        drop(dropout);
        let lp = &forward.out.logprobs;
        let (mut loss, stats) = sft_loss(lp, &batch.response_mask)?;
        if let Some((aux, _)) = self.router_aux_term(&forward)? {
            loss = (loss + aux)?;
        }
        let device = lp.device().clone();
        check_loss(
            "SFT loss",
            stats.nll,
            self.max_sft_loss,
            &device,
            collective,
        )?;
        let step = self.params.apply(
            &loss.affine(weight, 0.0)?,
            &mut self.opt,
            max_grad_norm,
            collective,
        )?;
        Ok((stats.nll, step))
    }

    /// One PPO update on a minibatch.
    ///
    /// * `old_logprobs`, `advantages`: `[B, T-1]` f32 aligned with `batch.response_mask`.
    /// * `ref_logprobs`: needed when `cfg.kl_loss_coef > 0`.
    /// * `rollout_logprobs`: the engine's log-probs, needed when `cfg.rollout_correction` is set.
    /// * `weight`: this replica's share of the global loss (see [`apply_gradients`]).
    #[allow(clippy::too_many_arguments)]
    pub fn ppo_step(
        &mut self,
        batch: &TokenBatch,
        old_logprobs: &Tensor,
        advantages: &Tensor,
        ref_logprobs: Option<&Tensor>,
        rollout_logprobs: Option<&Tensor>,
        cfg: &PolicyLossConfig,
        lr: f64,
        weight: f64,
        collective: Option<&dyn Collective>,
    ) -> Result<PolicyStats> {
        self.params.gather_for_step(collective)?;
        let inputs = PpoInputs {
            batch,
            old_logprobs,
            advantages,
            ref_logprobs,
            rollout_logprobs,
        };
        let out = self.ppo_step_gathered(&inputs, cfg, lr, weight, collective);
        self.params.finish(out)
    }

    /// [`Self::ppo_step`] on gathered parameters: the traced forward under the rollout
    /// distribution, the loss (surrogate, KL and entropy terms, router aux term), the
    /// divergence checks, then the weighted gradient step.
    fn ppo_step_gathered(
        &mut self,
        inputs: &PpoInputs<'_>,
        cfg: &PolicyLossConfig,
        lr: f64,
        weight: f64,
        collective: Option<&dyn Collective>,
    ) -> Result<PolicyStats> {
        self.opt.set_lr(lr);
        let mask = &inputs.batch.response_mask;
        let forward = self.head_outputs_traced(
            inputs.batch,
            self.rollout_distribution,
            self.packing.rl,
            true,
        )?;
        let aux = self.router_aux_term(&forward)?;
        let TracedForward {
            out:
                HeadOutputs {
                    logprobs: lp,
                    entropy: token_entropy,
                },
            trace,
            ..
        } = forward;
        let (rollout_mismatch_mean, rollout_mismatch_max) = match inputs.rollout_logprobs {
            Some(r) => masked_abs_diff(&lp, r, mask)?,
            None => (0.0, 0.0),
        };
        let (mut loss, ppo, ent_stats) = ppo_loss(inputs, &lp, token_entropy, cfg)?;
        if let Some((term, _)) = &aux {
            loss = (loss + term)?;
        }
        self.check_update_limits(&ppo, lp.device(), collective)?;
        let step = self.params.apply(
            &loss.affine(weight, 0.0)?,
            &mut self.opt,
            cfg.max_grad_norm,
            collective,
        )?;
        Ok(PolicyStats {
            policy_loss: ppo.loss,
            clip_frac: ppo.clip_frac,
            approx_kl: ppo.approx_kl,
            entropy: ent_stats.entropy,
            rollout_mismatch_mean,
            rollout_mismatch_max,
            routing_overridden: overridden_fraction(&trace),
            router_aux_loss: aux.map(|(_, v)| v),
            step,
        })
    }

    /// Refuses the minibatch update ([`check_loss`], agreed over `collective`) when its
    /// surrogate loss exceeds [`Self::max_policy_loss`] or its approx KL to the rollout
    /// policy exceeds [`Self::max_update_kl`] (in that order), before the weights change.
    fn check_update_limits(
        &self,
        ppo: &PpoStats,
        device: &Device,
        collective: Option<&dyn Collective>,
    ) -> Result<()> {
        check_loss(
            "policy loss",
            ppo.loss,
            self.max_policy_loss,
            device,
            collective,
        )?;
        check_loss(
            "approx KL to the rollout policy",
            ppo.approx_kl,
            self.max_update_kl,
            device,
            collective,
        )
    }

    /// Mean NLL per response token of `batch` (no update), e.g. for SFT evaluation.
    pub fn nll(&self, batch: &TokenBatch) -> Result<f64> {
        let lp = self
            .head_outputs(batch, TokenDistribution::MODEL, self.packing.sft)?
            .logprobs
            .detach();
        let (loss, _) = sft_loss(&lp, &batch.response_mask)?;
        scalar(&loss)
    }
}

/// The PPO minibatch loss without the router aux term, from the policy's `[B, T-1]`
/// log-probs `lp` and token entropies: the objective's surrogate (rollout-corrected when
/// rollout log-probs are given), plus the KL-to-reference term when `cfg.kl_loss_coef > 0`
/// and reference log-probs are given, plus the entropy bonus when `cfg.entropy_coef > 0`
/// (added in that order). Returns the loss and the surrogate's and entropy's statistics.
fn ppo_loss(
    inputs: &PpoInputs<'_>,
    lp: &Tensor,
    token_entropy: Tensor,
    cfg: &PolicyLossConfig,
) -> Result<(Tensor, PpoStats, EntropyStats)> {
    let PpoInputs {
        batch,
        old_logprobs,
        advantages,
        ref_logprobs,
        rollout_logprobs,
    } = *inputs;
    let mask = &batch.response_mask;
    let is_weights = match rollout_logprobs {
        Some(r) => cfg
            .rollout_correction
            .weights(old_logprobs, r, mask)?
            .map(|(w, _)| w),
        None => None,
    };
    let (mut loss, ppo) = cfg.objective.loss(
        lp,
        old_logprobs,
        advantages,
        mask,
        &cfg.ppo,
        is_weights.as_ref(),
    )?;
    if cfg.kl_loss_coef > 0.0 {
        if let Some(r) = ref_logprobs {
            let (kl, _) = kl_loss(lp, r, mask, cfg.kl_estimator, cfg.kl_loss_coef, cfg.ppo.agg)?;
            loss = (loss + kl)?;
        }
    }
    let ent = if cfg.entropy_coef > 0.0 {
        token_entropy
    } else {
        token_entropy.detach()
    };
    let (bonus, ent_stats) = entropy_bonus(&ent, mask, cfg.entropy_coef, cfg.ppo.agg)?;
    if cfg.entropy_coef > 0.0 {
        loss = (loss + bonus)?;
    }
    Ok((loss, ppo, ent_stats))
}

/// [`PolicyStats::routing_overridden`] of a forward's trace.
fn overridden_fraction(trace: &RouterTrace) -> f64 {
    let (differ, total) = trace.overridden;
    if total == 0 {
        0.0
    } else {
        differ as f64 / total as f64
    }
}

/// The row-major indices (u32) of the `[B, T-1]` next-token grid where `response_mask` is set.
fn response_positions(response_mask: &Tensor) -> Result<Tensor> {
    let mask = response_mask
        .flatten_all()?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
    let at: Vec<u32> = (0..mask.len() as u32)
        .filter(|&i| mask[i as usize] != 0.0)
        .collect();
    Ok(Tensor::new(at.as_slice(), response_mask.device())?)
}
