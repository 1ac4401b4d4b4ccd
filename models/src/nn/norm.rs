//! [`RmsNorm`]: one RMSNorm of the decoder, its weight and how the weight scales. Llama's
//! norms scale by `w`; Gemma's by `1 + w` (the weight stored as the scale minus one,
//! `BlockStyle::norm_offset`), added in f32 as HF does, so the gradient still reaches `w`.

use crate::config::model_config::ModelConfig;
use crate::nn::layers::rms_norm;
use candle_core::{Result, Tensor};

/// An RMSNorm: `x / sqrt(mean(x^2) + eps) * (offset + weight)`.
#[derive(Clone, Debug)]
pub(crate) struct RmsNorm {
    weight: Tensor,
    offset: f32,
    eps: f64,
}

impl RmsNorm {
    /// The norm of `weight` under `cfg`'s epsilon and weight offset.
    pub fn new(weight: Tensor, cfg: &ModelConfig) -> RmsNorm {
        RmsNorm {
            weight,
            offset: cfg.style.norm_offset,
            eps: cfg.rms_norm_eps,
        }
    }

    /// Normalises `x` `[..., D]` over its last dim.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.offset == 0.0 {
            return rms_norm(x, &self.weight, self.eps);
        }
        let scale = self.weight.affine(1.0, f64::from(self.offset))?;
        rms_norm(x, &scale, self.eps)
    }
}
