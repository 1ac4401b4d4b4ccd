//! [`LayerStream`]: a sharded replica's decoder layers gathered just in time. It is the
//! model's [`LayerResidency`]: the forward gathers each layer as it reaches it and frees it
//! after; the backward (which recomputes each layer from its input) gathers it again,
//! reduce-scatters that layer's gradients to this rank's shard at once, and frees the layer
//! and its full gradients before moving to the layer below. So during a step a replica holds
//! the shards, the parameters outside the layers (embedding, final norm, head) and one layer
//! with its gradients, never the whole model.

use super::params::ShardedParams;
use super::storage::held_bytes;
use candle_core::backprop::GradStore;
use candle_core::Tensor;
use oxalign_kernels::collective::Collective;
use oxalign_models::nn::layer_residency::LayerResidency;
use std::sync::{Arc, Mutex, MutexGuard};

/// What the backward of one step handed over so far.
#[derive(Default)]
struct Taken {
    /// This rank's shard gradients, `(parameter index, gradient)`.
    shard_grads: Vec<(usize, Tensor)>,
    /// Per unit: its shard gradients came from a streamed layer's backward.
    units: Vec<bool>,
    /// The most bytes held at once while a layer's backward ran: the model's `Var`s present
    /// (the rest and that layer), that layer's full gradients, the master shards and the
    /// shard gradients taken so far.
    peak: usize,
}

/// The streamed layers of one step, as [`LayerStream::finish_step`] returns them.
pub(crate) struct StreamedGrads {
    /// This rank's shard gradients of the streamed layers, `(parameter index, gradient)`.
    pub shard_grads: Vec<(usize, Tensor)>,
    /// Per unit: its shard gradients are in `shard_grads` (the layout's other units still
    /// need a reduce-scatter from the outer backward's gradients).
    pub units: Vec<bool>,
    /// See [`Taken::peak`]; 0 when no layer was streamed.
    pub peak: usize,
}

/// The [`LayerResidency`] of a sharded replica (see the module docs).
pub(crate) struct LayerStream {
    params: Arc<ShardedParams>,
    collective: Option<Arc<dyn Collective>>,
    taken: Mutex<Taken>,
}

impl std::fmt::Debug for LayerStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let layout = self.params.layout();
        write!(f, "LayerStream(rank {} of {})", layout.rank, layout.world)
    }
}

fn model_error(e: crate::RlhfError) -> candle_core::Error {
    candle_core::Error::Msg(e.to_string())
}

impl LayerStream {
    /// Streams the layers of `params` over `collective` (the group the shards belong to;
    /// `None` only for a group of one).
    pub fn new(params: Arc<ShardedParams>, collective: Option<Arc<dyn Collective>>) -> Self {
        Self {
            params,
            collective,
            taken: Mutex::new(Taken::default()),
        }
    }

    fn taken(&self) -> MutexGuard<'_, Taken> {
        self.taken.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn unit(&self, layer: usize) -> candle_core::Result<usize> {
        self.params.unit_of_layer(layer).ok_or_else(|| {
            candle_core::Error::Msg(format!("fsdp: no shard unit holds decoder layer {layer}"))
        })
    }

    /// Forgets what an earlier backward handed over (call before a step's backward).
    pub fn begin_step(&self) {
        *self.taken() = Taken {
            units: vec![false; self.params.num_units()],
            ..Taken::default()
        };
    }

    /// What the step's backward handed over, taken out.
    pub fn finish_step(&self) -> StreamedGrads {
        let taken = std::mem::take(&mut *self.taken());
        StreamedGrads {
            shard_grads: taken.shard_grads,
            units: taken.units,
            peak: taken.peak,
        }
    }
}

impl LayerResidency for LayerStream {
    fn is_resident(&self, layer: usize) -> bool {
        self.params
            .unit_of_layer(layer)
            .is_none_or(|u| self.params.is_unit_gathered(u))
    }

    fn acquire(&self, layer: usize) -> candle_core::Result<()> {
        let unit = self.unit(layer)?;
        self.params
            .gather_unit(unit, self.collective.as_deref())
            .map_err(model_error)
    }

    fn release(&self, layer: usize) -> candle_core::Result<()> {
        let unit = self.unit(layer)?;
        self.params.release_unit(unit).map_err(model_error)
    }

    fn take_gradients(&self, layer: usize, grads: &GradStore) -> candle_core::Result<()> {
        let unit = self.unit(layer)?;
        let shard = self
            .params
            .reduce_scatter_unit(unit, grads, self.collective.as_deref())
            .map_err(model_error)?;
        let (shards, model) = self.params.held();
        let full_grads = self.params.unit_grad_bytes(unit, grads);
        let mut taken = self.taken();
        if taken.units.len() != self.params.num_units() {
            taken.units = vec![false; self.params.num_units()];
        }
        taken.shard_grads.extend(shard);
        taken.units[unit] = true;
        let shard_grads: usize = taken.shard_grads.iter().map(|(_, g)| held_bytes(g)).sum();
        taken.peak = taken.peak.max(shards + model + full_grads + shard_grads);
        Ok(())
    }
}
