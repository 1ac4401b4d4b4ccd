//! KL coefficient controllers: a fixed β and the adaptive proportional controller of Ziegler et
//! al. 2019 ("Fine-tuning language models from human preferences"). Plain numbers, serde-able
//! state; it does not measure the KL (see `losses::kl`).

use crate::error::{Result, RlhfError};

/// A constant β.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedKl {
    /// The KL coefficient (≥ 0).
    pub beta: f64,
}

/// Adaptive β: `e = clip((KL − target) / target, −0.2, 0.2)`, `β ← β·(1 + e·n_steps/horizon)`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveKl {
    /// Current coefficient (starts at the initial β).
    pub beta: f64,
    /// Target KL (nats per sequence, the same units as the KL passed to `update`), > 0.
    pub target: f64,
    /// Horizon in samples (Ziegler et al. use 10 000), > 0.
    pub horizon: f64,
}

impl AdaptiveKl {
    /// Proportional error is clipped to this magnitude.
    pub const ERROR_CLIP: f64 = 0.2;

    /// A controller starting at `init_beta`; errors on `target <= 0`, `horizon <= 0` or a
    /// negative β.
    pub fn new(init_beta: f64, target: f64, horizon: f64) -> Result<Self> {
        let c = Self {
            beta: init_beta,
            target,
            horizon,
        };
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<()> {
        crate::error::check_min("beta", self.beta, 0.0)?;
        crate::error::check_above("target", self.target, 0.0)?;
        crate::error::check_above("horizon", self.horizon, 0.0)?;
        Ok(())
    }

    /// One update after observing `current_kl` (mean KL per sequence, nats) over `n_steps`
    /// samples (the batch size in Ziegler et al.).
    pub fn update(&mut self, current_kl: f64, n_steps: u64) {
        let err =
            ((current_kl - self.target) / self.target).clamp(-Self::ERROR_CLIP, Self::ERROR_CLIP);
        self.beta *= 1.0 + err * n_steps as f64 / self.horizon;
    }
}

/// Either controller, with a tagged serde form, e.g.
/// `{"type": "adaptive", "beta": 0.1, "target": 6.0, "horizon": 10000.0}`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KlController {
    /// See [`FixedKl`].
    Fixed(FixedKl),
    /// See [`AdaptiveKl`].
    Adaptive(AdaptiveKl),
}

impl KlController {
    /// The current β.
    pub fn beta(&self) -> f64 {
        match self {
            KlController::Fixed(c) => c.beta,
            KlController::Adaptive(c) => c.beta,
        }
    }

    /// Feeds the observed KL (nats per sequence) over `n_steps` samples; a no-op for
    /// [`FixedKl`]. Errors when `current_kl` is not finite (β would become NaN).
    pub fn update(&mut self, current_kl: f64, n_steps: u64) -> Result<()> {
        if !current_kl.is_finite() {
            return Err(RlhfError::invalid(
                "current_kl",
                current_kl,
                "must be finite",
            ));
        }
        if let KlController::Adaptive(c) = self {
            c.update(current_kl, n_steps);
        }
        Ok(())
    }

    /// Checks the parameters (e.g. after deserialising a saved state).
    pub fn validate(&self) -> Result<()> {
        match self {
            KlController::Fixed(c) => crate::error::check_min("beta", c.beta, 0.0),
            KlController::Adaptive(c) => c.validate(),
        }
    }
}
