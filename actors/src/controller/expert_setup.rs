//! Building an expert-parallel policy (`placement.expert_parallel = N > 1`): two collective
//! groups over the policy's devices, one for its trainers (token-row exchanges and gradient
//! all-reduces) and one for its engines (their token dispatch), so a generation ahead
//! never interleaves with a training step's exchanges. Each trainer keeps its rank's experts
//! and its engine takes the same ones. The model and trainer code is
//! `oxalign_models::ExpertParallel` and `PolicyTrainer::spread_experts`.

use crate::error::Cause;
use crate::executor::ExecutorPool;
use crate::recipe::Recipe;
use crate::roles::EngineReplica;
use oxalign_kernels::collective::Collective;
use oxalign_kernels::device::DeviceSpec;
use oxalign_models::engine::EngineConfig;
use oxalign_models::ExpertParallel;
use oxalign_rlhf::trainer::PolicyTrainer;
use std::path::Path;
use std::sync::Arc;

/// The two groups of an expert-parallel policy, one handle per rank.
pub(crate) struct ExpertGroups {
    pub trainers: Vec<Arc<dyn Collective>>,
    pub engines: Vec<Arc<dyn Collective>>,
}

impl ExpertGroups {
    /// The groups over the policy's devices `specs` (NCCL on CUDA devices), or `None` when
    /// the recipe keeps every expert on every device.
    pub(crate) fn for_recipe(
        recipe: &Recipe,
        specs: &[DeviceSpec],
        pool: &ExecutorPool,
    ) -> Result<Option<Self>, Cause> {
        if recipe.placement.expert_parallel <= 1 {
            return Ok(None);
        }
        Ok(Some(Self {
            trainers: crate::replicas::collective_group(specs, pool)?,
            engines: crate::replicas::collective_group(specs, pool)?,
        }))
    }

    /// Spreads `trainer`'s experts as rank `rank` and builds its engine over the same
    /// experts. A policy the group cannot spread (a dense model, experts it does not
    /// divide) is the user's input at fault: [`Cause::ExpertParallel`] naming the key and
    /// `weights`.
    pub(crate) fn spread(
        &self,
        rank: usize,
        trainer: &mut PolicyTrainer,
        weights: &Path,
        config: EngineConfig,
    ) -> Result<EngineReplica, Cause> {
        let handle = |g: &[Arc<dyn Collective>]| ExpertParallel::new(g[rank].clone());
        trainer
            .spread_experts(handle(&self.trainers))
            .map_err(|source| Cause::ExpertParallel {
                world: self.trainers.len(),
                weights: weights.to_path_buf(),
                source: Box::new(source),
            })?;
        EngineReplica::with_experts(&trainer.model, config, handle(&self.engines))
    }
}
