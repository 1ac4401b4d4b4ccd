//! Divergence found by a training role, returned as data in its reply so the controller can
//! name the role, the step and the phase. A role that finds one stops its update there: a
//! loss over its limit or a non-finite gradient is never applied, and non-finite weights are
//! reported before any checkpoint is written. It does not decide what to do (the controller
//! stops the run).

use candle_core::Var;
use oxalign_rlhf::trainer::StepStats;
use oxalign_rlhf::RlhfError;
use serde::{Deserialize, Serialize};

/// What diverged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum Divergence {
    /// A loss was not finite or exceeded its `[guard]` limit (the update was not applied).
    #[error("{what} is {value:e} (limit {limit:e}) in minibatch update {update}; that update was not applied")]
    Loss {
        /// Which loss.
        what: String,
        /// Its value.
        value: f64,
        /// The limit.
        limit: f64,
        /// 1-based minibatch update within the step.
        update: usize,
    },
    /// The global gradient norm was not finite (the update was skipped).
    #[error(
        "the gradient norm is {norm} in minibatch update {update}; that update was not applied"
    )]
    Gradient {
        /// The norm.
        norm: f64,
        /// 1-based minibatch update within the step.
        update: usize,
    },
    /// A weight tensor holds NaN or infinity after the update.
    #[error("weight tensor {tensor} holds NaN or infinity after the update")]
    Weights {
        /// The parameter name.
        tensor: String,
    },
    /// A rollout statistic is not finite or exceeds its `[guard]` limit (before any update).
    #[error("{what} is {value:e} (limit {limit:e}); no update was applied")]
    Rollout {
        /// Which statistic (`kl`, `reward_mean`, ...).
        what: String,
        /// Its value.
        value: f64,
        /// The limit (infinite when only finiteness is required).
        limit: f64,
    },
}

impl Divergence {
    /// The divergence an optimizer-step error stands for, if it is one.
    pub fn from_rlhf(e: &RlhfError, update: usize) -> Option<Self> {
        match e {
            RlhfError::Diverged { what, value, limit } => Some(Divergence::Loss {
                what: (*what).to_string(),
                value: *value,
                limit: *limit,
                update,
            }),
            _ => None,
        }
    }
}

/// The divergence of a step of one optimizer update that ended with `step`: its skipped
/// (non-finite) gradient, else the first non-finite weight of `named`, else none.
pub(crate) fn after_one_update(
    step: &StepStats,
    named: &[(String, Var)],
) -> candle_core::Result<Option<Divergence>> {
    if step.skipped {
        return Ok(Some(Divergence::Gradient {
            norm: step.grad_norm,
            update: 1,
        }));
    }
    Ok(non_finite_weight(named)?.map(|tensor| Divergence::Weights { tensor }))
}

/// The first parameter (by name) holding a NaN or an infinity, if any.
pub fn non_finite_weight(named: &[(String, Var)]) -> candle_core::Result<Option<String>> {
    for (name, var) in named {
        // x·0 is 0 for every finite x and NaN for NaN or ±inf.
        let probe = var
            .as_tensor()
            .affine(0.0, 0.0)?
            .sum_all()?
            .to_dtype(candle_core::DType::F32)?
            .to_scalar::<f32>()?;
        if !probe.is_finite() {
            return Ok(Some(name.clone()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn finds_the_first_non_finite_weight() {
        let ok = Var::from_tensor(&Tensor::new(&[1e30f32, -2.0], &Device::Cpu).unwrap()).unwrap();
        let inf =
            Var::from_tensor(&Tensor::new(&[0f32, f32::INFINITY], &Device::Cpu).unwrap()).unwrap();
        let nan = Var::from_tensor(&Tensor::new(&[f32::NAN], &Device::Cpu).unwrap()).unwrap();
        let named = |v: Vec<(&str, &Var)>| {
            v.into_iter()
                .map(|(n, v)| (n.to_string(), v.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(non_finite_weight(&named(vec![("a", &ok)])).unwrap(), None);
        let found = non_finite_weight(&named(vec![("a", &ok), ("b", &inf), ("c", &nan)]));
        assert_eq!(found.unwrap().as_deref(), Some("b"));
        let found = non_finite_weight(&named(vec![("c", &nan)]));
        assert_eq!(found.unwrap().as_deref(), Some("c"));
    }
}
