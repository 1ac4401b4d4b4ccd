//! Rotary position embedding tables: inverse frequencies (default, linear and Llama-3 scaling,
//! computed in f32 exactly as HF does) and the `cos`/`sin` rows for given position ids.
//! Applying them to q/k lives in `layers.rs`.

use crate::config::model_config::{ModelConfig, RopeScaling};
use candle_core::{DType, Device, Result, Tensor};

/// Inverse RoPE frequencies of one model (`head_dim / 2` values).
#[derive(Clone, Debug)]
pub(crate) struct RotaryEmbedding {
    inv_freq: Vec<f32>,
}

impl RotaryEmbedding {
    /// Frequencies for `cfg` (`rope_theta`, `head_dim`, optional `rope_scaling`).
    pub fn new(cfg: &ModelConfig) -> RotaryEmbedding {
        Self::with_base(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling.as_ref())
    }

    /// Frequencies of the sliding layers of a model with a local RoPE base (Gemma 3's
    /// `rope_local_base_freq`, unscaled); `None` when every layer uses [`Self::new`]'s.
    pub fn local(cfg: &ModelConfig) -> Option<RotaryEmbedding> {
        let base = cfg.style.local_rope_theta?;
        Some(Self::with_base(cfg.head_dim, base, None))
    }

    /// Frequencies for heads of `dim` with RoPE base `base` and optional `scaling`.
    fn with_base(dim: usize, base: f64, scaling: Option<&RopeScaling>) -> RotaryEmbedding {
        let base = base as f32;
        // HF: 1 / base ** (arange(0, dim, 2).float() / dim), in float32.
        let mut inv_freq: Vec<f32> = (0..dim)
            .step_by(2)
            .map(|i| 1.0f32 / base.powf(i as f32 / dim as f32))
            .collect();
        match scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) => {
                let f = *factor as f32;
                inv_freq.iter_mut().for_each(|x| *x /= f);
            }
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let factor = *factor as f32;
                let low = *low_freq_factor as f32;
                let high = *high_freq_factor as f32;
                let old_ctx = *original_max_position_embeddings as f32;
                let low_freq_wavelen = old_ctx / low;
                let high_freq_wavelen = old_ctx / high;
                for x in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *x;
                    let scaled = if wavelen > low_freq_wavelen {
                        *x / factor
                    } else {
                        *x
                    };
                    // HF: ~(wavelen < high) & ~(wavelen > low); wavelen is finite.
                    let is_medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                    *x = if is_medium {
                        let smooth = (old_ctx / wavelen - low) / (high - low);
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    };
                }
            }
        }
        RotaryEmbedding { inv_freq }
    }

    /// The inverse frequencies (`head_dim / 2` values, f32).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// `cos`, `sin` tables `[B, T, head_dim/2]` in `dtype` for position ids `positions`
    /// (row-major `[B, T]`).
    pub fn cos_sin(
        &self,
        positions: &[u32],
        batch: usize,
        seq: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        let cos = Tensor::from_vec(cos, (batch, seq, half), device)?.to_dtype(dtype)?;
        let sin = Tensor::from_vec(sin, (batch, seq, half), device)?.to_dtype(dtype)?;
        Ok((cos, sin))
    }
}
