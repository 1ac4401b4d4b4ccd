//! [`GradientSink`]: where an op may hand a parameter's gradient instead of returning it to
//! candle's backward. Candle accumulates every gradient it is given as `zeros_like(param) +
//! grad`, so for a moment it holds three tensors the size of the parameter; for the LM head's
//! `[V, H]` weight, computed while every activation of the forward is still alive, that is
//! the step's peak. A sink (the trainer's layerwise backward, `oxalign-models`'
//! `nn/checkpointing.rs`) keeps the gradient as the op computed it (a lookup's rows added in
//! candle's order) and adds it to the loss's gradients after the backward.

use candle_core::{Result, Tensor};

/// Collects the gradients of some parameters outside candle's `GradStore`.
pub trait GradientSink: Send + Sync + std::fmt::Debug {
    /// Takes `grad`, the gradient of `param`, when this sink collects `param`'s gradients
    /// (`Ok(None)`); otherwise hands it back (`Ok(Some(grad))`) for candle's backward.
    fn accept(&self, param: &Tensor, grad: Tensor) -> Result<Option<Tensor>>;

    /// A lookup's gradient: adds `rows[i]` to row `ids[i]` of `param`'s gradient, in order
    /// of `i`, onto the gradient collected so far (or zeros), as candle's `index_add` would,
    /// when this sink collects `param` (`Ok(true)`; [`super::scatter_rows`] does it);
    /// `Ok(false)` otherwise.
    fn add_rows(&self, param: &Tensor, ids: &Tensor, rows: &Tensor) -> Result<bool>;
}
