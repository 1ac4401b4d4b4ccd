//! Refusing an update that left a non-finite weight: the role's divergence check after every
//! optimizer step of the policy, critic and reward-model trainers.

use super::divergence::{non_finite_weight, Divergence};
use crate::error::Cause;

/// Errors when a weight is not finite, so such weights are never saved.
pub(crate) fn refuse_non_finite(named: &[(String, candle_core::Var)]) -> Result<(), Cause> {
    match non_finite_weight(named)? {
        Some(tensor) => Err(Divergence::Weights { tensor }.into()),
        None => Ok(()),
    }
}
