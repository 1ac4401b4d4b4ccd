//! Rollout correction between the behaviour policy (the generation engine, e.g. quantized) and
//! the trainer's π_old: per-token weights on the policy-gradient surrogate from the ratio
//! `w_t = π_old(y_t) / π_engine(y_t)`, in one of three published forms:
//!
//! * token TIS, `min(w_t, C)` (Yao et al. 2025; [`truncated_is_weights`]);
//! * sequence-level masking: a whole sequence is dropped (weight 0 on every token) when its
//!   length-normalised ratio, the **geometric mean** `exp(mean_t log w_t)` over its response
//!   tokens, falls outside `[lower, upper]`; kept sequences get weight 1 (veRL's
//!   `rollout_is_level = "geometric"` with `rollout_is_mode = "mask"`, NeMo RL's seq-mask);
//! * IcePop's double-sided token masking: `w_t` where `lower ≤ w_t ≤ upper`, 0 elsewhere
//!   (Ling team 2025, "Ring-1T"; `M(k) = k·1[α ≤ k ≤ β]`).
//!
//! It computes weights and diagnostics; applying them is the policy loss's job
//! (`PolicyObjective::loss(.., is_weights)`). Each row's weights depend on that row only, so
//! a minibatch gets the same weights as the whole batch.

use candle_core::Tensor;

use crate::error::{check_above, check_min, Result, RlhfError};
use crate::losses::tis::{expect_logprob_pair, truncated_is_weights};
use crate::mask::{from_host, host_f64, host_mask};

/// How the engine/trainer mismatch is corrected.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutCorrection {
    /// No weights (the surrogate uses π_old alone).
    #[default]
    None,
    /// Token TIS: `min(w_t, cap)`, `cap > 0`.
    TokenTis {
        /// Truncation constant `C`.
        cap: f64,
    },
    /// Whole sequences whose geometric-mean ratio lies outside `[lower, upper]` get weight 0,
    /// the others weight 1.
    SeqMask {
        /// Lowest kept ratio (`0 ≤ lower ≤ 1`).
        lower: f64,
        /// Highest kept ratio (`≥ 1`).
        upper: f64,
    },
    /// Tokens whose ratio lies outside `[lower, upper]` get weight 0, the others `w_t`.
    Icepop {
        /// `α`, lowest kept ratio (`0 ≤ α ≤ 1`).
        lower: f64,
        /// `β`, highest kept ratio (`≥ 1`).
        upper: f64,
    },
}

/// Which [`RolloutCorrection`], without its bounds: the choice a recipe names
/// (`rl.rollout_correction = "token_tis"`), whose cap and band come from other keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutCorrectionKind {
    /// [`RolloutCorrection::None`].
    #[default]
    None,
    /// [`RolloutCorrection::TokenTis`].
    TokenTis,
    /// [`RolloutCorrection::SeqMask`].
    SeqMask,
    /// [`RolloutCorrection::Icepop`].
    Icepop,
}

impl RolloutCorrectionKind {
    /// The correction of this kind: `cap` is `TokenTis`'s, `(lower, upper)` the kept band of
    /// `SeqMask` and `Icepop`; each kind ignores the bounds it has no use for.
    pub fn with_bounds(self, cap: f64, (lower, upper): (f64, f64)) -> RolloutCorrection {
        match self {
            RolloutCorrectionKind::None => RolloutCorrection::None,
            RolloutCorrectionKind::TokenTis => RolloutCorrection::TokenTis { cap },
            RolloutCorrectionKind::SeqMask => RolloutCorrection::SeqMask { lower, upper },
            RolloutCorrectionKind::Icepop => RolloutCorrection::Icepop { lower, upper },
        }
    }
}

/// Diagnostics of one correction over the response tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct CorrectionStats {
    /// Mean of the weights over response tokens (masked ones count as 0).
    pub weight_mean: f64,
    /// Fraction of response tokens whose weight was set to 0 by a mask (seq_mask, icepop).
    pub masked_frac: f64,
    /// Fraction of response tokens whose weight was capped (token TIS).
    pub truncated_frac: f64,
    /// Fraction of sequences with response tokens that were masked whole (seq_mask).
    pub masked_seq_frac: f64,
}

impl RolloutCorrection {
    /// Checks the bounds: `cap > 0`; `0 ≤ lower ≤ 1 ≤ upper`, finite.
    pub fn validate(&self) -> Result<()> {
        match *self {
            RolloutCorrection::None => Ok(()),
            RolloutCorrection::TokenTis { cap } => check_above("cap", cap, 0.0),
            RolloutCorrection::SeqMask { lower, upper }
            | RolloutCorrection::Icepop { lower, upper } => {
                check_min("lower", lower, 0.0)?;
                if lower > 1.0 {
                    return Err(RlhfError::invalid("lower", lower, "must be <= 1"));
                }
                check_min("upper", upper, 1.0)?;
                if !upper.is_finite() {
                    return Err(RlhfError::invalid("upper", upper, "must be finite"));
                }
                Ok(())
            }
        }
    }

    /// Per-token weights `[batch, seq]` (detached, 0 off the response) and their stats, or
    /// `None` for [`RolloutCorrection::None`].
    ///
    /// * `trainer_old_logprobs`: `[batch, seq]` float, π_old's log-probs of the rollout
    ///   tokens as the trainer computes them (nats).
    /// * `rollout_logprobs`: same shape and dtype, the engine's sampling log-probs (nats).
    /// * `mask`: `[batch, seq]`, any dtype, non-zero = response token.
    pub fn weights(
        &self,
        trainer_old_logprobs: &Tensor,
        rollout_logprobs: &Tensor,
        mask: &Tensor,
    ) -> Result<Option<(Tensor, CorrectionStats)>> {
        self.validate()?;
        let (b, t) = expect_logprob_pair(trainer_old_logprobs, rollout_logprobs, mask)?;
        if *self == RolloutCorrection::None {
            return Ok(None);
        }
        if let RolloutCorrection::TokenTis { cap } = *self {
            let (w, s) = truncated_is_weights(trainer_old_logprobs, rollout_logprobs, mask, cap)?;
            let stats = CorrectionStats {
                weight_mean: s.weight_mean,
                truncated_frac: s.truncated_frac,
                ..CorrectionStats::default()
            };
            return Ok(Some((w, stats)));
        }
        let (old, roll, m) = (
            host_f64(&trainer_old_logprobs.detach())?,
            host_f64(&rollout_logprobs.detach())?,
            host_mask(mask)?,
        );
        let mut w = vec![0f64; b * t];
        let (mut masked_rows, mut rows) = (0usize, 0usize);
        for r in 0..b {
            let row = r * t..(r + 1) * t;
            let keep = match *self {
                RolloutCorrection::SeqMask { lower, upper } => {
                    let (sum, n) = row
                        .clone()
                        .filter(|&i| m[i])
                        .fold((0.0, 0usize), |(s, n), i| (s + old[i] - roll[i], n + 1));
                    if n == 0 {
                        continue;
                    }
                    rows += 1;
                    let ratio = (sum / n as f64).exp();
                    let keep = (lower..=upper).contains(&ratio);
                    masked_rows += usize::from(!keep);
                    keep
                }
                _ => true,
            };
            for i in row.filter(|&i| m[i]) {
                let ratio = (old[i] - roll[i]).exp();
                w[i] = match *self {
                    RolloutCorrection::Icepop { lower, upper }
                        if (lower..=upper).contains(&ratio) =>
                    {
                        ratio
                    }
                    RolloutCorrection::SeqMask { .. } if keep => 1.0,
                    _ => 0.0,
                };
            }
        }
        let n_tok = m.iter().filter(|&&x| x).count();
        let zeros = (0..b * t).filter(|&i| m[i] && w[i] == 0.0).count();
        let denom = n_tok.max(1) as f64;
        let stats = CorrectionStats {
            weight_mean: (0..b * t).filter(|&i| m[i]).map(|i| w[i]).sum::<f64>() / denom,
            masked_frac: zeros as f64 / denom,
            truncated_frac: 0.0,
            masked_seq_frac: masked_rows as f64 / rows.max(1) as f64,
        };
        let weights = from_host(
            w,
            &[b, t],
            trainer_old_logprobs.dtype(),
            trainer_old_logprobs,
        )?;
        Ok(Some((weights, stats)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t(v: &[f32], b: usize, s: usize) -> Tensor {
        Tensor::from_slice(v, (b, s), &Device::Cpu).unwrap()
    }

    /// A token ratio of e^1 ≈ 2.72 is masked by IcePop with β = 2 and keeps its ratio
    /// with β = 5; a sequence whose geometric mean is e^0.5 is masked whole by seq_mask
    /// with upper 1.5, and the other row is kept with weight 1.
    #[test]
    fn icepop_and_seq_mask_mask_what_falls_outside() -> Result<()> {
        let old = t(&[0.0, 0.0, 0.0, 0.0], 2, 2);
        let roll = t(&[-1.0, 0.0, -0.05, 0.05], 2, 2);
        let mask = t(&[1.0, 1.0, 1.0, 1.0], 2, 2);
        let icepop = RolloutCorrection::Icepop {
            lower: 0.5,
            upper: 2.0,
        };
        let (w, s) = icepop.weights(&old, &roll, &mask)?.unwrap();
        let w = w.flatten_all()?.to_vec1::<f32>()?;
        assert_eq!(w[0], 0.0);
        assert_eq!(w[1], 1.0);
        assert!((w[2] - 0.05f32.exp()).abs() < 1e-6 && (w[3] - (-0.05f32).exp()).abs() < 1e-6);
        assert!((s.masked_frac - 0.25).abs() < 1e-12);
        let seq = RolloutCorrection::SeqMask {
            lower: 0.5,
            upper: 1.5,
        };
        let (w, s) = seq.weights(&old, &roll, &mask)?.unwrap();
        assert_eq!(w.flatten_all()?.to_vec1::<f32>()?, vec![0.0, 0.0, 1.0, 1.0]);
        assert!((s.masked_frac - 0.5).abs() < 1e-12 && (s.masked_seq_frac - 0.5).abs() < 1e-12);
        assert!(RolloutCorrection::None
            .weights(&old, &roll, &mask)?
            .is_none());
        assert!(RolloutCorrection::Icepop {
            lower: 1.5,
            upper: 2.0
        }
        .validate()
        .is_err());
        Ok(())
    }

    /// The kind of `c`; exhaustive, so a new [`RolloutCorrection`] needs its kind.
    fn kind(c: RolloutCorrection) -> RolloutCorrectionKind {
        match c {
            RolloutCorrection::None => RolloutCorrectionKind::None,
            RolloutCorrection::TokenTis { .. } => RolloutCorrectionKind::TokenTis,
            RolloutCorrection::SeqMask { .. } => RolloutCorrectionKind::SeqMask,
            RolloutCorrection::Icepop { .. } => RolloutCorrectionKind::Icepop,
        }
    }

    #[test]
    fn kinds_build_their_correction_with_its_bounds_and_share_its_spelling() {
        for k in [
            RolloutCorrectionKind::None,
            RolloutCorrectionKind::TokenTis,
            RolloutCorrectionKind::SeqMask,
            RolloutCorrectionKind::Icepop,
        ] {
            let c = k.with_bounds(2.0, (0.5, 5.0));
            assert_eq!(kind(c), k);
            let name = serde_json::to_value(k).unwrap();
            let spelled = serde_json::to_value(c).unwrap();
            let c_name = match &spelled {
                serde_json::Value::Object(m) => m.keys().next().unwrap().clone(),
                v => v.as_str().unwrap().to_string(),
            };
            assert_eq!(name, c_name.as_str());
        }
        assert_eq!(
            RolloutCorrectionKind::TokenTis.with_bounds(2.0, (0.5, 5.0)),
            RolloutCorrection::TokenTis { cap: 2.0 }
        );
        assert_eq!(
            RolloutCorrectionKind::Icepop.with_bounds(2.0, (0.5, 5.0)),
            RolloutCorrection::Icepop {
                lower: 0.5,
                upper: 5.0
            }
        );
    }
}
