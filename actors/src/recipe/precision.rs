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
    Ok(())
}
