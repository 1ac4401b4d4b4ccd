//! Activation checkpointing (HF's `gradient_checkpointing`): a training forward keeps only
//! each decoder layer's input, and the backward recomputes one layer at a time from it, so
//! the activations held between forward and backward are `layers × [B, T, H]` instead of
//! every intermediate of every layer. The price is one more forward of each layer.
//!
//! It is the streamed layer of the sharded trainer (`streamed_layer.rs`) with weights that
//! never leave: [`Checkpointing`] is a [`LayerResidency`] whose layers are never "resident"
//! (so each runs as one op outside candle's graph), whose acquire and release do nothing,
//! and which collects the gradients each layer's recomputed backward computes for the
//! trainable `Var`s. The trainer adds them to the gradients of the loss's own backward
//! ([`Checkpointing::add_taken_to`]) before clipping and the optimizer step. Forwards with
//! a KV cache run the layers as usual.
//!
//! [`Checkpointing::layerwise`] is the same machinery without the recompute: each layer's
//! forward keeps its own graph, and the backward walks the layers top-down over those
//! graphs, dropping each one as soon as its layer is done. The arithmetic is the plain
//! backward's; what changes is that a layer's activations are freed while the layers below
//! still run their backward (candle frees a graph only when the whole backward is done), so
//! the step's peak memory no longer holds every activation beside every gradient.
//!
//! Both collect the LM head's weight gradient too ([`GradientSink`]): handed over as the
//! head's backward computed it, it skips candle's `zeros + grad` accumulation, which would
//! hold three `[V, H]` tensors at the moment every activation is still alive.

use crate::nn::layer_residency::LayerResidency;
use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};
use oxalign_kernels::ops::{scatter_rows, GradientSink};
use std::sync::{Mutex, MutexGuard};

/// The checkpointing of one model's decoder layers, collecting its trainable `Var`s'
/// gradients from the layers' recomputed backwards.
#[derive(Debug)]
pub struct Checkpointing {
    vars: Vec<Var>,
    /// False: the layers keep their forward's graph for the backward (no recompute).
    recompute: bool,
    /// The gradient taken so far for each of `vars`.
    taken: Mutex<Vec<Option<Tensor>>>,
}

impl Checkpointing {
    /// Checkpointing whose gradients are those of `vars` (the model's trainable ones).
    pub fn new(vars: Vec<Var>) -> Checkpointing {
        let taken = Mutex::new(vec![None; vars.len()]);
        Checkpointing {
            vars,
            recompute: true,
            taken,
        }
    }

    /// The layerwise backward without recompute (see the module docs), collecting the
    /// gradients of `vars`.
    pub fn layerwise(vars: Vec<Var>) -> Checkpointing {
        Checkpointing {
            recompute: false,
            ..Checkpointing::new(vars)
        }
    }

    fn taken(&self) -> MutexGuard<'_, Vec<Option<Tensor>>> {
        self.taken.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves every gradient the layers' backwards produced since the last call into
    /// `grads` (added to a gradient `grads` already holds for the same `Var`).
    pub fn add_taken_to(&self, grads: &mut GradStore) -> Result<()> {
        let mut taken = self.taken();
        for (var, g) in self.vars.iter().zip(taken.iter_mut()) {
            let Some(g) = g.take() else { continue };
            let sum = match grads.get(var.as_tensor()) {
                Some(have) => (have + g)?,
                None => g,
            };
            grads.insert(var.as_tensor(), sum);
        }
        Ok(())
    }

    /// Forgets gradients taken and not yet added (a step that failed after its backward).
    pub fn clear(&self) {
        self.taken().iter_mut().for_each(|g| *g = None);
    }
}

impl Checkpointing {
    /// Which of `vars` `param` is.
    fn index_of(&self, param: &Tensor) -> Option<usize> {
        self.vars
            .iter()
            .position(|v| v.as_tensor().id() == param.id())
    }
}

impl GradientSink for Checkpointing {
    fn add_rows(&self, param: &Tensor, ids: &Tensor, rows: &Tensor) -> Result<bool> {
        let Some(at) = self.index_of(param) else {
            return Ok(false);
        };
        // The slot holds only what earlier lookups of this step added (a table is no
        // layer's weight), so it may be added to in place.
        let mut taken = self.taken();
        let have = taken[at].take();
        taken[at] = Some(scatter_rows(have, param, ids, rows)?);
        Ok(true)
    }

    fn accept(&self, param: &Tensor, grad: Tensor) -> Result<Option<Tensor>> {
        let Some(at) = self.index_of(param) else {
            return Ok(Some(grad));
        };
        let mut taken = self.taken();
        let slot = &mut taken[at];
        *slot = Some(match slot.take() {
            Some(have) => (have + grad)?,
            None => grad,
        });
        Ok(None)
    }
}

impl LayerResidency for Checkpointing {
    fn is_resident(&self, _layer: usize) -> bool {
        false
    }

    fn acquire(&self, _layer: usize) -> Result<()> {
        Ok(())
    }

    fn release(&self, _layer: usize) -> Result<()> {
        Ok(())
    }

    fn take_gradients(&self, _layer: usize, grads: &GradStore) -> Result<()> {
        let mut taken = self.taken();
        for (var, slot) in self.vars.iter().zip(taken.iter_mut()) {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            *slot = Some(match slot.take() {
                Some(have) => (have + g)?,
                None => g.clone(),
            });
        }
        Ok(())
    }

    fn weights_stay(&self) -> bool {
        true
    }

    fn keeps_forward_graph(&self) -> bool {
        !self.recompute
    }
}
