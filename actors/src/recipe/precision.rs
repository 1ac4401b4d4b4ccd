//! The numbers each trainer computes in: `model.precision` for every trainer, with
//! `rl.trainer_precision` overriding it for the RL policy, and the check that
//! `model.precision` names a precision every trainer has (`fake_int8` is the RL policy's
//! alone: it mirrors the int8 rollout engine).

use super::{Recipe, RecipeError};
use oxalign_models::Precision;

impl Recipe {
    /// The precision of the policy trainer (SFT, DPO and the RL policy).
    pub fn policy_precision(&self) -> Precision {
        match self.rl.trainer_precision {
            Precision::F32 => self.model.precision,
            p => p,
        }
    }
}

/// Refuses `model.precision = "fake_int8"`.
pub(crate) fn validate(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if r.model.precision == Precision::FakeInt8 {
        return Err(bad(
            "model.precision",
            "expected \"f32\" or \"bf16_mixed\"; \"fake_int8\" mirrors the int8 rollout engine, \
             so it is the RL policy's alone: set rl.trainer_precision = \"fake_int8\" instead"
                .to_string(),
        ));
    }
    checkpointing(r, bad)
}

/// Refuses `model.gradient_checkpointing` where the recompute does not apply: sharded or
/// expert-parallel training, LoRA dropout (the recompute would draw other masks), GPUs.
fn checkpointing(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    if !r.model.gradient_checkpointing {
        return Ok(());
    }
    let refuse = |why: &str| {
        Err(bad(
            "model.gradient_checkpointing",
            format!("cannot be used {why}"),
        ))
    };
    if r.placement.sharding == super::Sharding::Sharded {
        return refuse("with placement.sharding = \"sharded\" (sharded training recomputes each layer in its backward already)");
    }
    if r.placement.expert_parallel > 1 {
        return refuse("with placement.expert_parallel > 1");
    }
    if r.lora.as_ref().is_some_and(|l| l.dropout > 0.0) {
        return refuse(
            "with lora.dropout > 0 (the recomputed layers would draw other dropout masks)",
        );
    }
    let p = &r.placement;
    if [&p.policy, &p.critic].iter().any(|d| d.contains("cuda")) {
        return refuse("on CUDA devices yet (the recomputing layer op is CPU-only)");
    }
    Ok(())
}
