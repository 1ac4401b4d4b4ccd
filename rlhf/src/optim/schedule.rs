//! Learning-rate schedules: constant, and linear warm-up followed by cosine or linear decay to
//! a minimum lr (the conventions of HF `transformers`' schedulers). It does not own an
//! optimizer; call `AdamW::set_lr(schedule.lr_at(step))` before each step.

use crate::error::{Result, RlhfError};

/// A learning-rate schedule as a function of the optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum LrSchedule {
    /// `lr` at every step.
    Constant {
        /// The learning rate.
        lr: f64,
    },
    /// Linear warm-up from 0 to `peak_lr` over `warmup_steps`, then half-cosine down to
    /// `min_lr` at `total_steps`, `min_lr` afterwards.
    WarmupCosine {
        /// Learning rate at the end of warm-up.
        peak_lr: f64,
        /// Floor reached at `total_steps`.
        min_lr: f64,
        /// Number of warm-up steps (0 = none).
        warmup_steps: u64,
        /// Total number of optimizer steps (≥ `warmup_steps`).
        total_steps: u64,
    },
    /// Linear warm-up, then linear decay from `peak_lr` to `min_lr` at `total_steps`.
    WarmupLinear {
        /// Learning rate at the end of warm-up.
        peak_lr: f64,
        /// Floor reached at `total_steps`.
        min_lr: f64,
        /// Number of warm-up steps (0 = none).
        warmup_steps: u64,
        /// Total number of optimizer steps (≥ `warmup_steps`).
        total_steps: u64,
    },
}

impl LrSchedule {
    /// Checks `0 <= min_lr <= peak_lr` (or `lr >= 0`) and `warmup_steps <= total_steps`.
    pub fn validate(&self) -> Result<()> {
        match *self {
            LrSchedule::Constant { lr } => crate::error::check_min("lr", lr, 0.0),
            LrSchedule::WarmupCosine {
                peak_lr,
                min_lr,
                warmup_steps,
                total_steps,
            }
            | LrSchedule::WarmupLinear {
                peak_lr,
                min_lr,
                warmup_steps,
                total_steps,
            } => {
                if !(min_lr >= 0.0 && min_lr <= peak_lr) {
                    return Err(RlhfError::invalid(
                        "min_lr",
                        min_lr,
                        format!("must be in [0, peak_lr = {peak_lr}]"),
                    ));
                }
                if warmup_steps > total_steps {
                    return Err(RlhfError::invalid(
                        "warmup_steps",
                        warmup_steps,
                        format!("must be <= total_steps = {total_steps}"),
                    ));
                }
                Ok(())
            }
        }
    }

    /// Learning rate for optimizer step `step` (0-based: the number of steps already taken).
    ///
    /// Warm-up: `peak · step / warmup_steps` for `step < warmup_steps` (so step 0 has lr 0, as
    /// in HF `transformers`). Decay: with `p = (step − warmup) / max(1, total − warmup)` clipped
    /// to `[0, 1]`, cosine gives `min + (peak − min)·½(1 + cos πp)`, linear
    /// `min + (peak − min)(1 − p)`.
    pub fn lr_at(&self, step: u64) -> f64 {
        match *self {
            LrSchedule::Constant { lr } => lr,
            LrSchedule::WarmupCosine {
                peak_lr,
                min_lr,
                warmup_steps,
                total_steps,
            } => warmup_then(step, peak_lr, min_lr, warmup_steps, total_steps, |p| {
                0.5 * (1.0 + (std::f64::consts::PI * p).cos())
            }),
            LrSchedule::WarmupLinear {
                peak_lr,
                min_lr,
                warmup_steps,
                total_steps,
            } => warmup_then(step, peak_lr, min_lr, warmup_steps, total_steps, |p| {
                1.0 - p
            }),
        }
    }
}

fn warmup_then(
    step: u64,
    peak: f64,
    min: f64,
    warmup: u64,
    total: u64,
    decay: impl Fn(f64) -> f64,
) -> f64 {
    if step < warmup {
        return peak * step as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    let p = ((step - warmup) as f64 / span).clamp(0.0, 1.0);
    min + (peak - min) * decay(p)
}
