//! Turning a policy trainer expert-parallel ([`PolicyTrainer::spread_experts`]): its model
//! keeps only this rank's routed experts and AdamW is rebuilt over what it keeps. The
//! gradient exchange of its steps is `expert_parallel.rs`'s.

use super::expert_parallel::ExpertShare;
use super::policy::PolicyTrainer;
use super::sharding::{Sharded, TrainParams};
use crate::{Result, RlhfError};
use oxalign_models::{ExpertNames, ExpertParallel};

impl PolicyTrainer {
    /// Spreads the model's routed experts over `ep` (this trainer is rank `ep.rank()`): the
    /// model keeps only this rank's experts and AdamW is rebuilt over what it keeps (same lr
    /// and weight decay). Every rank of the group must then run the same steps together.
    /// Call once, before any step; not with FSDP sharding.
    pub fn spread_experts(&mut self, ep: ExpertParallel) -> Result<()> {
        let refuse = |m: &str| Err(RlhfError::ExpertParallel(m.into()));
        if self.is_sharded() {
            return refuse("not combined with FSDP sharding");
        }
        if self.params.experts.is_some() {
            return refuse("the trainer's experts are already spread");
        }
        if self.opt.steps_taken() > 0 {
            return refuse("spread the experts before the first step (optimizer state)");
        }
        let (rank, world) = (ep.rank(), ep.world());
        let model = self
            .model
            .with_expert_parallel(ep)
            .map_err(|e| RlhfError::ExpertParallel(e.to_string()))?;
        let (lr, wd) = (self.opt.lr(), self.opt.config().weight_decay);
        let (opt, vars) = super::grads::adamw_over(model.params(), lr, wd)?;
        let names = ExpertNames::of(model.config());
        let is_expert = model
            .vars()
            .iter()
            .map(|(n, _)| names.expert_of(n).is_some())
            .collect();
        self.model = model;
        self.opt = opt;
        self.params = TrainParams::new(vars);
        self.params.experts = Some(ExpertShare {
            is_expert,
            rank,
            world,
        });
        Ok(())
    }
}
