//! LoRA dropout (PEFT's `lora_dropout`): in a training forward, each adapter's input is
//! dropped element by element with probability `p` and the kept elements scaled by
//! `1 / (1 - p)`, so `y = x·Wᵀ + (α/r)·B·A·(m ⊙ x)`; the base product always sees `x`
//! whole. Off (the identity) everywhere else: scoring, the reference, evaluation, the
//! merged weights.
//!
//! One [`LoraDropout`] serves every adapter of a model. A trainer switches it on around the
//! forward it differentiates ([`LoraDropout::scope`], keyed by the optimizer step), and the
//! masks are drawn from a counter-based seed (`seed`, step, draw index), so the same run
//! draws the same masks, a resumed run included, whatever happened in between.

use candle_core::{Result, Tensor};
use rand::{RngCore, SeedableRng};
use std::sync::{Arc, Mutex, MutexGuard};

/// What every adapter of a model shares: the scale `alpha / r` (or `alpha / √r`) and the
/// dropout.
#[derive(Clone, Debug)]
pub(crate) struct AdapterBinding {
    pub(crate) scale: f64,
    pub(crate) dropout: Arc<LoraDropout>,
}

/// The dropout of a model's adapters, shared by its layers.
#[derive(Debug)]
pub(crate) struct LoraDropout {
    p: f64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    seed: u64,
    /// Whether a training forward is running ([`LoraDropout::scope`]).
    on: bool,
    /// The step the draws below belong to.
    step: u64,
    /// Masks drawn so far in `step`.
    draws: u64,
}

/// While alive, the adapters' dropout is on; dropping it turns it off again.
#[must_use = "dropout is on only while the scope is alive"]
pub struct DropoutScope(Option<Arc<LoraDropout>>);

impl DropoutScope {
    /// A scope that turns nothing on (a model without adapters).
    pub(crate) fn off() -> DropoutScope {
        DropoutScope(None)
    }
}

impl Drop for DropoutScope {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            d.lock().on = false;
        }
    }
}

impl LoraDropout {
    /// Dropout with probability `p` (checked by `LoraConfig::check`: `0 <= p < 1`).
    pub(crate) fn new(p: f64) -> Arc<LoraDropout> {
        Arc::new(LoraDropout {
            p,
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the seed every mask is derived from.
    pub(crate) fn set_seed(&self, seed: u64) {
        self.lock().seed = seed;
    }

    /// The seed every mask is derived from.
    pub(crate) fn seed(&self) -> u64 {
        self.lock().seed
    }

    /// Turns dropout on for the forwards of optimizer step `step` until the scope drops.
    /// The first scope of a step starts its draws from 0; later ones (more micro-batches of
    /// the same step) continue them, so no two forwards of a run share a mask.
    pub(crate) fn scope(this: &Arc<LoraDropout>, step: u64) -> DropoutScope {
        if this.p == 0.0 {
            return DropoutScope(None);
        }
        let mut s = this.lock();
        if s.step != step {
            s.step = step;
            s.draws = 0;
        }
        s.on = true;
        drop(s);
        DropoutScope(Some(this.clone()))
    }

    /// `x` with dropout applied when a training forward is running, else `x` itself.
    pub(crate) fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let seed = {
            let mut s = self.lock();
            if !s.on {
                return Ok(x.clone());
            }
            s.draws += 1;
            mix(mix(mix(s.seed) ^ s.step) ^ s.draws)
        };
        let mask = keep_mask(x.elem_count(), self.p, seed);
        let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
        x * mask
    }
}

/// `n` values, each 0 with probability `p` and `1 / (1 - p)` otherwise, drawn from a
/// generator seeded with `seed`.
fn keep_mask(n: usize, p: f64, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let threshold = (p * 4_294_967_296.0) as u64;
    let kept = (1.0 / (1.0 - p)) as f32;
    (0..n)
        .map(|_| match (rng.next_u32() as u64) < threshold {
            true => 0.0,
            false => kept,
        })
        .collect()
}

/// SplitMix64's finaliser: spreads the bits of `z` (so seeds, steps and draw indices that
/// differ in one bit give unrelated generators).
fn mix(z: u64) -> u64 {
    let z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Off outside a scope; inside, about `p` of the elements are 0 and the rest `x/(1-p)`,
    /// so the mean is kept; the same seed and step draw the same masks, another step others.
    #[test]
    fn drops_a_fraction_p_inside_a_scope_and_nothing_outside() -> Result<()> {
        let d = LoraDropout::new(0.25);
        d.set_seed(7);
        let x = Tensor::ones((64, 256), candle_core::DType::F32, &Device::Cpu)?;
        assert_eq!(d.apply(&x)?.to_vec2::<f32>()?, x.to_vec2::<f32>()?);
        let draw = |step| -> Result<Vec<f32>> {
            let _on = LoraDropout::scope(&d, step);
            d.apply(&x)?.flatten_all()?.to_vec1::<f32>()
        };
        let a = draw(3)?;
        let zeros = a.iter().filter(|&&v| v == 0.0).count() as f64 / a.len() as f64;
        assert!((zeros - 0.25).abs() < 0.02, "dropped fraction {zeros}");
        assert!(a.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
        let mean = a.iter().map(|&v| v as f64).sum::<f64>() / a.len() as f64;
        assert!((mean - 1.0).abs() < 0.03, "mean {mean}");
        let b = draw(4)?;
        assert_ne!(a, b, "another step draws another mask");
        assert_eq!(d.apply(&x)?.to_vec2::<f32>()?, x.to_vec2::<f32>()?);
        d.lock().step = 99;
        assert_eq!(
            draw(3)?,
            a,
            "step 3 again from its first draw: the same mask"
        );
        Ok(())
    }

    /// p = 0 never draws, inside a scope or not.
    #[test]
    fn zero_is_the_identity() -> Result<()> {
        let d = LoraDropout::new(0.0);
        let x = Tensor::ones((4, 8), candle_core::DType::F32, &Device::Cpu)?;
        let _on = LoraDropout::scope(&d, 1);
        assert_eq!(d.apply(&x)?.to_vec2::<f32>()?, x.to_vec2::<f32>()?);
        Ok(())
    }
}
