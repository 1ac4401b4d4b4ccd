//! The parameters a trainer steps, replicated or sharded (FSDP), and the [`Sharded`] trait
//! the policy and critic trainers share: shard once after construction, gather before a
//! use of the model, release after, save and load the optimizer with its layout, and report
//! what the replica holds.
//!
//! Replicated: every replica holds the whole model, gradients and AdamW state, and gradients
//! are averaged with all-reduce. Sharded: see [`crate::fsdp`].

use super::expert_parallel::{any_rank_non_finite, apply_expert_parallel_gradients, ExpertShare};
use super::grads::{apply_gradients_measured, StepStats};
use crate::fsdp::{
    apply_sharded_gradients, held_bytes, load_shard_state, save_shard_state, shard_optimizer,
    LayerStream, ShardedParams, TrainMemory,
};
use crate::optim::AdamW;
use crate::{Result, RlhfError};
use candle_core::{Tensor, Var};
use oxalign_kernels::collective::Collective;
use oxalign_models::nn::checkpointing::Checkpointing;
use oxalign_models::nn::layer_residency::LayerResidency;
use oxalign_models::ParamStore;
use std::path::Path;
use std::sync::Arc;

/// A trainer's parameters: the model's `Var`s and, when sharded, the shards behind them.
pub struct TrainParams {
    vars: Vec<Var>,
    fsdp: Option<Arc<ShardedParams>>,
    /// The model's layers streamed over the shards' group (set with `fsdp` when the
    /// trainer was sharded with its collective).
    stream: Option<Arc<LayerStream>>,
    /// Which parameters are this rank's routed experts, when expert-parallel.
    pub(crate) experts: Option<ExpertShare>,
    /// Bytes of the gradients the optimizer stepped on in the last step.
    last_grad_bytes: usize,
    /// [`TrainMemory::step_peak`] of the last step.
    last_step_peak: Option<usize>,
    /// The model's activation checkpointing, whose layers' gradients join the loss's.
    checkpoint: Option<Arc<Checkpointing>>,
}

impl TrainParams {
    pub(crate) fn new(vars: Vec<Var>) -> Self {
        Self {
            vars,
            fsdp: None,
            stream: None,
            experts: None,
            last_grad_bytes: 0,
            last_step_peak: None,
            checkpoint: None,
        }
    }

    /// Adds the gradients `checkpoint` collects to every step's (activation checkpointing;
    /// replicated training only: sharded training streams and recomputes its layers anyway).
    pub(crate) fn set_checkpointing(&mut self, checkpoint: Arc<Checkpointing>) -> Result<()> {
        if self.fsdp.is_some() || self.experts.is_some() {
            let name = match checkpoint.keeps_forward_graph() {
                true => "layerwise backward",
                false => "gradient_checkpointing",
            };
            return Err(crate::RlhfError::InvalidArgument {
                name: name.into(),
                value: "true".into(),
                reason: "applies to replicated trainers only (a sharded one recomputes its \
                         layers already; expert-parallel ones are not supported)"
                    .into(),
            });
        }
        self.checkpoint = Some(checkpoint);
        Ok(())
    }

    /// Backward, gradient exchange (all-reduce, or reduce-scatter when sharded), clip and
    /// AdamW: the replicated [`super::apply_gradients`], the sharded
    /// [`apply_sharded_gradients`], or the expert-parallel step (`expert_parallel.rs`).
    pub(crate) fn apply(
        &mut self,
        loss: &Tensor,
        opt: &mut AdamW,
        max_grad_norm: f64,
        collective: Option<&dyn Collective>,
    ) -> Result<StepStats> {
        if let Some(share) = &self.experts {
            let (stats, bytes) = apply_expert_parallel_gradients(
                loss,
                &self.vars,
                share,
                opt,
                max_grad_norm,
                collective,
            )?;
            self.last_grad_bytes = bytes;
            self.last_step_peak = None;
            return Ok(stats);
        }
        let (stats, bytes, peak) = match &self.fsdp {
            None => apply_gradients_measured(
                loss,
                &self.vars,
                opt,
                max_grad_norm,
                collective,
                self.checkpoint.as_deref(),
            )?,
            Some(fsdp) => apply_sharded_gradients(
                loss,
                fsdp,
                self.stream.as_deref(),
                opt,
                max_grad_norm,
                collective,
            )?,
        };
        self.last_grad_bytes = bytes;
        self.last_step_peak = Some(peak);
        Ok(stats)
    }

    /// Errors when the model's weights are released (sharded, between uses); with streamed
    /// layers, when the weights outside the layers are.
    pub(crate) fn ensure_gathered(&self) -> Result<()> {
        let streamed = self.stream.is_some();
        self.fsdp
            .as_ref()
            .map_or(Ok(()), |f| f.ensure_gathered(streamed))
    }

    /// Makes the model usable for a training step's forward and backward: with streamed
    /// layers, gathers only the weights outside the layers (each layer is gathered as it
    /// runs); otherwise the whole model. No-op when replicated.
    pub(crate) fn gather_for_step(&self, collective: Option<&dyn Collective>) -> Result<()> {
        match (&self.fsdp, &self.stream) {
            (Some(f), Some(_)) => f.gather_rest(collective),
            (Some(f), None) => f.gather(collective),
            (None, _) => Ok(()),
        }
    }

    /// Releases the weights after a use that returned `out` (a release error is reported
    /// only when the use itself succeeded).
    pub(crate) fn finish<R>(&mut self, out: Result<R>) -> Result<R> {
        let released = match &self.fsdp {
            Some(f) => f.release(),
            None => Ok(()),
        };
        let out = out?;
        released.map(|_| out)
    }
}

/// What the policy and critic trainers share for sharded (FSDP) training. `parts` and
/// `parts_mut` give the pieces; the other methods are provided.
pub trait Sharded {
    /// The parameters, the optimizer and the model's declaration.
    fn parts(&self) -> (&TrainParams, &AdamW, &ParamStore);

    /// The same, mutably.
    fn parts_mut(&mut self) -> (&mut TrainParams, &mut AdamW, &ParamStore);

    /// Points the model's decoder at `residency` (its layers' weights come and go) or, with
    /// `None`, back to weights that are always present.
    fn set_layer_residency(&mut self, residency: Option<Arc<dyn LayerResidency>>);

    /// Shards this trainer as rank `rank` of `world`: keeps 1/`world` of every parameter as
    /// an f32 master shard, rebuilds AdamW over the shards (same lr and weight decay), and
    /// frees the model's full weights. Call once, before any step (the optimizer must not
    /// have stepped yet) and after anything that copies the full model (an engine).
    ///
    /// `collective` is the group's handle for this rank (`None` for a group of one). With it
    /// (or alone in its group) a step gathers the decoder layers just in time, one at a
    /// time, in the forward and again in the backward ([`LayerStream`]); without it in a
    /// larger group, a step gathers the whole model first (through the collective each call
    /// passes).
    fn shard(
        &mut self,
        rank: usize,
        world: usize,
        collective: Option<Arc<dyn Collective>>,
    ) -> Result<()> {
        let (params, opt, store) = self.parts_mut();
        if params.fsdp.is_some() {
            return Err(RlhfError::Sharding("the trainer is already sharded".into()));
        }
        if params.experts.is_some() {
            return Err(RlhfError::Sharding(
                "not combined with expert parallelism (the experts are spread)".into(),
            ));
        }
        if opt.steps_taken() > 0 {
            return Err(RlhfError::Sharding(
                "shard a trainer before its first step (its optimizer state would be lost)".into(),
            ));
        }
        let fsdp = Arc::new(ShardedParams::new(store.vars(), rank, world)?);
        let lr = opt.lr();
        *opt = shard_optimizer(store, &fsdp, lr, opt.config().weight_decay)?;
        fsdp.release()?;
        let stream = (world == 1 || collective.is_some())
            .then(|| Arc::new(LayerStream::new(fsdp.clone(), collective)));
        params.fsdp = Some(fsdp);
        params.stream = stream.clone();
        self.set_layer_residency(stream.map(|s| s as Arc<dyn LayerResidency>));
        Ok(())
    }

    /// True once [`Sharded::shard`] has run.
    fn is_sharded(&self) -> bool {
        self.parts().0.fsdp.is_some()
    }

    /// True once the model's experts are spread over a group
    /// ([`super::PolicyTrainer::spread_experts`]).
    fn is_expert_parallel(&self) -> bool {
        self.parts().0.experts.is_some()
    }

    /// Fills the model's full weights from every rank's shards (every rank must call it).
    /// No-op when replicated or already gathered.
    fn gather(&mut self, collective: Option<&dyn Collective>) -> Result<()> {
        match &self.parts().0.fsdp {
            Some(f) => f.gather(collective),
            None => Ok(()),
        }
    }

    /// Frees the model's full weights again (sharded only; the shards stay).
    fn release(&mut self) -> Result<()> {
        match &self.parts().0.fsdp {
            Some(f) => f.release(),
            None => Ok(()),
        }
    }

    /// The first parameter holding a NaN or infinity (in any rank's shard when sharded;
    /// every rank must call it then), if any.
    fn first_non_finite_weight(
        &self,
        collective: Option<&dyn Collective>,
    ) -> Result<Option<String>> {
        let (params, _, store) = self.parts();
        if let Some(f) = &params.fsdp {
            return f.first_non_finite(collective);
        }
        let mut found = None;
        for (name, var) in store.vars() {
            let probe = var.as_tensor().affine(0.0, 0.0)?.sum_all()?;
            let probe = probe
                .to_dtype(candle_core::DType::F32)?
                .to_scalar::<f32>()?;
            if !probe.is_finite() {
                found = Some(name);
                break;
            }
        }
        if params.experts.is_some() && any_rank_non_finite(found.is_some(), collective)? {
            // Every rank takes the same decision; a peer's expert may be the culprit.
            return Ok(found.or_else(|| Some("an expert held by another rank".into())));
        }
        Ok(found)
    }

    /// Saves the optimizer into `dir`: the whole state when replicated, this rank's shard
    /// with its layout (`dir/shard_<rank>/`) when sharded.
    /// Expert-parallel: this rank's whole state (its experts' moments, and the dense ones
    /// every rank holds) in `dir/expert_rank_<rank>/`.
    fn save_optimizer(&self, dir: &Path) -> Result<()> {
        let (params, opt, _) = self.parts();
        if let Some(share) = &params.experts {
            return opt.save_state(&expert_rank_dir(dir, share.rank));
        }
        match &params.fsdp {
            Some(f) => save_shard_state(opt, f.layout(), dir),
            None => opt.save_state(dir),
        }
    }

    /// Loads what [`Sharded::save_optimizer`] wrote (a sharded state needs the same layout).
    fn load_optimizer(&mut self, dir: &Path) -> Result<()> {
        let (params, opt, _) = self.parts_mut();
        if let Some(share) = &params.experts {
            return opt.load_state(&expert_rank_dir(dir, share.rank));
        }
        match &params.fsdp {
            Some(f) => load_shard_state(opt, f.layout(), dir),
            None => opt.load_state(dir),
        }
    }

    /// What this replica holds now, measured from the tensors' storage: the model's `Var`s
    /// (empty between uses when sharded) plus the master shards, the gradients of the last
    /// step, and AdamW's moments.
    fn memory(&self) -> TrainMemory {
        let (params, opt, store) = self.parts();
        let model: usize = store
            .vars()
            .iter()
            .map(|(_, v)| held_bytes(v.as_tensor()))
            .sum();
        let shards = params.fsdp.as_ref().map_or(0, |f| f.held().0);
        TrainMemory {
            params: model + shards,
            grads: params.last_grad_bytes,
            optimizer: opt.moment_bytes(),
            step_peak: params.last_step_peak,
        }
    }
}

/// Where an expert-parallel rank's optimizer state lives under `dir`.
pub fn expert_rank_dir(dir: &Path, rank: usize) -> std::path::PathBuf {
    dir.join(format!("expert_rank_{rank}"))
}
