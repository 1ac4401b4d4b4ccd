//! Gradient accumulation across micro-batches: sums scaled gradients of a fixed set of
//! parameters from several `backward()` calls into one `GradStore` for a single optimizer step.
//! It does not average across data-parallel ranks (that is the collective's job).

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};

use crate::error::{Result, RlhfError};

/// Accumulates `Σ_k scale_k · ∇_k` for a fixed list of parameters.
#[derive(Debug)]
pub struct GradAccumulator {
    vars: Vec<Var>,
    sums: Vec<Option<Tensor>>,
    micro_batches: usize,
}

impl GradAccumulator {
    /// An empty accumulator for `vars` (gradients of other tensors are ignored and dropped).
    pub fn new<'a>(vars: impl IntoIterator<Item = &'a Var>) -> Self {
        let vars: Vec<Var> = vars.into_iter().cloned().collect();
        let sums = vec![None; vars.len()];
        Self {
            vars,
            sums,
            micro_batches: 0,
        }
    }

    /// Adds `scale · grad` for every tracked parameter that has a gradient in `grads`
    /// (typically `scale = 1 / micro_batches`, or a token-count weight). Sums are detached and
    /// kept in f32 (f64 for f64 gradients), also for bf16/f16 gradients. `scale` must be finite.
    pub fn add(&mut self, grads: &GradStore, scale: f64) -> Result<()> {
        if !scale.is_finite() {
            return Err(RlhfError::invalid("scale", scale, "must be finite"));
        }
        for (var, sum) in self.vars.iter().zip(self.sums.iter_mut()) {
            if let Some(g) = grads.get(var.as_tensor()) {
                let acc_dtype = match g.dtype() {
                    DType::F64 => DType::F64,
                    _ => DType::F32,
                };
                let g = g.detach().to_dtype(acc_dtype)?.affine(scale, 0.0)?;
                *sum = Some(match sum.take() {
                    Some(s) => (s + g)?.detach(),
                    None => g,
                });
            }
        }
        self.micro_batches += 1;
        Ok(())
    }

    /// Number of [`GradAccumulator::add`] calls since the last [`GradAccumulator::take`].
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Returns the accumulated gradients as a `GradStore` (keyed by the parameters, ready for
    /// clipping and [`crate::optim::AdamW::step`]) and resets the accumulator.
    pub fn take(&mut self) -> GradStore {
        let mut store = GradStore::default();
        for (var, sum) in self.vars.iter().zip(self.sums.iter_mut()) {
            if let Some(g) = sum.take() {
                store.insert(var.as_tensor(), g);
            }
        }
        self.micro_batches = 0;
        store
    }
}
