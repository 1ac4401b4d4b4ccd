//! A decoder layer whose weights are present only while it runs (FSDP-style "just in time"
//! gathering; see [`LayerResidency`]). The layer is one candle custom op in the model's
//! graph:
//!
//! * **forward**: acquire the layer's weights, run the layer on its input outside the
//!   graph, release the weights. The op's output is the layer's output `[B, T, H]` and, for a
//!   sparse layer, its router logits `[B·T, E]` (flattened one after the other), so the
//!   load-balancing loss stays differentiable through the routers.
//! * **backward**: acquire the weights again, recompute the layer from its saved input (the
//!   same routing: the experts the forward chose are replayed), backpropagate the incoming
//!   gradients through it alone, hand the weights' gradients to the [`LayerResidency`], and
//!   release the weights. The gradient of the layer's input flows on to the layer below.
//!
//! So at any moment of a training step one layer's full weights and gradients are held,
//! not the whole model's; the price is one extra forward of every layer (activation
//! checkpointing). Candle's autograd keeps no weight of a streamed layer in the graph.
//! CPU f32 only (the sharded trainer's precondition); no KV cache.
//!
//! Where the weights stay and the residency keeps the forward's graph
//! ([`LayerResidency::keeps_forward_graph`]: the layerwise backward), the forward runs the
//! layer inside a graph of its own, on a leaf copy of its input, and keeps that graph; the
//! backward then runs over it (no recompute) and drops it, freeing the layer's activations
//! while the layers below are still to go.

use crate::moe::routing::{ExpertChoices, RouterTrace};
use crate::nn::decoder_layer::DecoderLayer;
use crate::nn::layer_residency::LayerResidency;
use crate::nn::mask::Visibility;
use candle_core::{CpuStorage, CustomOp1, Device, Layout, Result, Shape, Tensor, Var};
use std::sync::{Arc, Mutex, MutexGuard};

/// The attention visibility of one decoder call, owned (a custom op outlives the call's
/// borrows): what [`Visibility::new`] takes.
#[derive(Debug)]
pub(crate) struct VisibilityParts {
    /// `[B, S]` key mask (1 = real), `None` when no key is padding.
    pub key_mask: Option<Vec<u32>>,
    /// `[B, T]` segment ids of packed rows.
    pub segments: Option<Vec<u32>>,
    /// `(batch, t, s, offset)`.
    pub dims: (usize, usize, usize, usize),
    /// The device of the mask tensor.
    pub device: Device,
}

impl VisibilityParts {
    fn rule(&self, window: Option<usize>) -> Visibility<'_> {
        let window = window.filter(|&w| w < self.dims.2);
        Visibility::new(self.key_mask.as_deref(), self.dims, window, &self.device)
            .with_segments(self.segments.as_deref())
    }
}

/// What a sparse layer's forward chose, kept for the recompute in backward.
#[derive(Debug)]
struct Chosen {
    experts: Vec<u32>,
    top_k: usize,
    overridden: (usize, usize),
    logits_dims: (usize, usize),
}

/// The graph one layer's forward built, kept for its backward (the layerwise backward).
#[derive(Debug)]
struct KeptForward {
    /// The leaf the forward ran on (a copy of the op's input).
    x: Var,
    /// The layer's output as its two summands (residual stream, feed-forward branch), their
    /// graph reaching back to `x` and the weights. Their sum is not kept: the op's output
    /// holds it, and an add needs no values for its backward.
    parts: (Tensor, Tensor),
    /// A sparse layer's router logits, in the same graph.
    logits: Option<Tensor>,
}

/// The custom op of one streamed layer.
#[derive(Debug)]
struct StreamedLayer {
    layer: DecoderLayer,
    index: usize,
    residency: Arc<dyn LayerResidency>,
    cos: Tensor,
    sin: Tensor,
    visibility: Arc<VisibilityParts>,
    /// `[B, T, H]` of the input and output.
    dims: (usize, usize, usize),
    /// The one-layer routing trace the forward starts from (replaying or free).
    routing: RouterTrace,
    /// What the forward chose (a sparse layer), shared with the caller that built the op.
    chosen: Arc<Mutex<Option<Chosen>>>,
    /// `Some` when the forward keeps its graph for the backward: the graph, until the
    /// backward takes it.
    kept: Option<Mutex<Option<KeptForward>>>,
}

/// Runs `layer` (number `index`) on `x` `[B, T, H]` as a streamed layer: its weights are
/// acquired from `residency` for the forward and again for the backward, and released
/// after each. A sparse layer appends its routing to `trace` (its logits still
/// differentiable), as [`DecoderLayer::forward`] does.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_streamed(
    layer: &DecoderLayer,
    index: usize,
    residency: &Arc<dyn LayerResidency>,
    x: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    visibility: &Arc<VisibilityParts>,
    trace: &mut RouterTrace,
) -> Result<Tensor> {
    let dims = x.dims3()?;
    let chosen = Arc::new(Mutex::new(None));
    let op = StreamedLayer {
        layer: layer.clone(),
        index,
        residency: residency.clone(),
        cos: cos.clone(),
        sin: sin.clone(),
        visibility: visibility.clone(),
        dims,
        routing: trace.next_layer_alone(),
        chosen: chosen.clone(),
        kept: residency.keeps_forward_graph().then(|| Mutex::new(None)),
    };
    // Candle calls an op's backward only when its input is tracked. Below a frozen
    // embedding (a LoRA model) the first layer's input is not, yet its weights (adapters)
    // want gradients: the input then enters as a leaf of its own (the gradient reaching it is
    // dropped).
    let x = match x.track_op() {
        true => x.contiguous()?,
        false => Var::from_tensor(&x.contiguous()?)?.into_inner(),
    };
    let out = x.apply_op1_arc(Arc::new(Box::new(op) as Box<dyn CustomOp1 + Send + Sync>))?;
    let n_out = dims.0 * dims.1 * dims.2;
    let y = out.narrow(0, 0, n_out)?.reshape(dims)?;
    if let Some(c) = lock(&chosen)?.as_ref() {
        let (rows, experts) = c.logits_dims;
        let logits = out
            .narrow(0, n_out, rows * experts)?
            .reshape((rows, experts))?;
        trace.push(logits, c.experts.clone(), c.top_k, c.overridden);
    }
    Ok(y)
}

fn lock<T>(slot: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    slot.lock()
        .map_err(|_| candle_core::Error::Msg("streamed layer: record lock poisoned".into()))
}

impl StreamedLayer {
    /// The layer on `x` with the weights present: its output and, when sparse, the routing
    /// trace of its one layer.
    fn run(&self, x: &Tensor, mut routing: RouterTrace) -> Result<((Tensor, Tensor), RouterTrace)> {
        let visible = self.visibility.rule(self.layer.window());
        let parts =
            self.layer
                .forward_parts(x, &self.cos, &self.sin, &visible, None, &mut routing)?;
        Ok((parts, routing))
    }

    /// The routing the recompute replays: exactly what the forward chose.
    fn replay_of_forward(&self) -> Result<RouterTrace> {
        Ok(match lock(&self.chosen)?.as_ref() {
            Some(c) => RouterTrace::replaying(ExpertChoices {
                top_k: c.top_k,
                layers: vec![c.experts.clone()],
            }),
            None => RouterTrace::new(),
        })
    }

    /// Backpropagates `grad_res` (the op's output gradient) through the layer's graph
    /// `kept`, hands the weights' gradients to the residency and returns the input's
    /// gradient. `kept` is dropped on return, freeing the layer's activations.
    fn backward_through(&self, kept: KeptForward, grad_res: &Tensor) -> Result<Tensor> {
        let n_out = self.dims.0 * self.dims.1 * self.dims.2;
        let g_y = grad_res.narrow(0, 0, n_out)?.reshape(self.dims)?;
        let (residual, branch) = &kept.parts;
        let mut surrogate = ((residual * &g_y)?.sum_all()? + (branch * &g_y)?.sum_all()?)?;
        if let Some(logits) = &kept.logits {
            let (rows, experts) = logits.dims2()?;
            let g_logits = grad_res
                .narrow(0, n_out, rows * experts)?
                .reshape((rows, experts))?;
            surrogate = (surrogate + (logits * g_logits)?.sum_all()?)?;
        }
        let grads = surrogate.backward()?;
        self.residency.take_gradients(self.index, &grads)?;
        match grads.get(kept.x.as_tensor()) {
            Some(g) => Ok(g.clone()),
            None => kept.x.as_tensor().zeros_like(),
        }
    }

    /// Runs `work` with the layer's weights present, releasing them however it ends.
    fn with_weights<R>(&self, work: impl FnOnce() -> Result<R>) -> Result<R> {
        self.residency.acquire(self.index)?;
        let out = work();
        let released = self.residency.release(self.index);
        let out = out?;
        released.map(|_| out)
    }
}

impl CustomOp1 for StreamedLayer {
    fn name(&self) -> &'static str {
        "streamed-decoder-layer"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (Some((start, end)), CpuStorage::F32(v)) = (layout.contiguous_offsets(), storage)
        else {
            candle_core::bail!(
                "streamed layer {}: input must be contiguous f32",
                self.index
            )
        };
        let x = Var::from_slice(&v[start..end], self.dims, &Device::Cpu)?;
        let (parts, routing) =
            self.with_weights(|| self.run(x.as_tensor(), self.routing.clone()))?;
        let mut out = (&parts.0 + &parts.1)?.flatten_all()?.to_vec1::<f32>()?;
        if let Some(kept) = &self.kept {
            let logits = routing.logits.first().cloned();
            *lock(kept)? = Some(KeptForward { x, parts, logits });
        }
        if let Some(logits) = routing.logits.first() {
            let logits_dims = logits.dims2()?;
            out.extend(logits.flatten_all()?.to_vec1::<f32>()?);
            let chosen = Chosen {
                experts: routing.chosen.layers.into_iter().next().unwrap_or_default(),
                top_k: routing.chosen.top_k,
                overridden: routing.overridden,
                logits_dims,
            };
            *lock(&self.chosen)? = Some(chosen);
        }
        let n = out.len();
        Ok((CpuStorage::F32(out), Shape::from(n)))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let kept = match &self.kept {
            Some(kept) => lock(kept)?.take(),
            None => None,
        };
        let grad_x = self.with_weights(|| {
            // The kept graph, or (checkpointing, or a second backward) a recompute.
            let kept = match kept {
                Some(kept) => kept,
                None => {
                    let x = Var::from_tensor(&arg.detach())?;
                    let (parts, routing) = self.run(x.as_tensor(), self.replay_of_forward()?)?;
                    let logits = routing.logits.first().cloned();
                    KeptForward { x, parts, logits }
                }
            };
            self.backward_through(kept, grad_res)
        })?;
        Ok(Some(grad_x))
    }
}
