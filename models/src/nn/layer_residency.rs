//! [`LayerResidency`]: where a decoder layer's weights live between uses. A sharded
//! (FSDP-style) trainer keeps only its shard of each layer and fills the layer's weights just
//! before the layer runs, in the forward and again in the backward, and frees them right
//! after (`streamed_layer.rs` runs a layer that way). This file holds only the contract; the
//! sharded implementation lives with the trainer (`oxalign-rlhf`'s `fsdp` module).

use candle_core::backprop::GradStore;
use candle_core::Result;

/// What a model asks of the owner of its layers' weights when those weights are not always
/// present. Every rank of a group calls these in the same order (the forward's layer order,
/// then the backward's reverse order), so an implementation may use collectives.
pub trait LayerResidency: Send + Sync + std::fmt::Debug {
    /// True when layer `layer`'s weights are present now; the forward then runs the layer
    /// as usual (inside candle's autograd graph).
    fn is_resident(&self, layer: usize) -> bool;

    /// Fills layer `layer`'s weights (their `Var`s, in place).
    fn acquire(&self, layer: usize) -> Result<()>;

    /// Frees layer `layer`'s weights again.
    fn release(&self, layer: usize) -> Result<()>;

    /// Takes the gradients of layer `layer`'s weights from `grads`, the backward of that
    /// layer alone (recomputed from its input), before the weights are freed. Called once
    /// per layer per backward, in reverse layer order.
    fn take_gradients(&self, layer: usize, grads: &GradStore) -> Result<()>;

    /// True when the weights are always present and layers stream only to recompute their
    /// activations in the backward (activation checkpointing): a forward with a KV cache
    /// then runs the layers as usual instead of failing.
    fn weights_stay(&self) -> bool {
        false
    }

    /// True when a layer's backward runs over the graph its forward built and kept (only
    /// where the weights stay): no recompute, and each layer's activations are freed as
    /// soon as its backward is done, instead of when the whole backward ends.
    fn keeps_forward_graph(&self) -> bool {
        false
    }
}
