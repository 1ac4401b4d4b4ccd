//! The decoder body shared by every head (`model.*` in HF): token embedding (scaled, for
//! Gemma), the stack of decoder layers (each with its RoPE tables: Gemma 3's sliding layers
//! have their own base) and the final RMSNorm. It produces hidden states `[B, T, H]`; LM, value and
//! reward heads live in their own files.

use crate::config::model_config::ModelConfig;
use crate::io::param_store::ParamStore;
use crate::moe::expert_parallel::ExpertParallel;
use crate::moe::routing::RouterTrace;
use crate::nn::decoder_layer::DecoderLayer;
use crate::nn::kv_cache::KvCache;
use crate::nn::layer_residency::LayerResidency;
use crate::nn::mask::{mask_to_host, position_ids, segment_position_ids, Visibility};
use crate::nn::norm::RmsNorm;
use crate::nn::rope::RotaryEmbedding;
use crate::nn::streamed_layer::{forward_streamed, VisibilityParts};
use candle_core::{DType, Result, Tensor};
use oxalign_kernels::ops::{embedding, GradientSink};
use std::sync::Arc;

/// Embedding + decoder layers + final norm, weights shared with a [`ParamStore`].
#[derive(Clone, Debug)]
pub struct Decoder {
    embed: Tensor,
    /// What the embeddings are multiplied by (Gemma: `sqrt(hidden_size)`).
    embed_scale: Option<f32>,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    rope: RotaryEmbedding,
    /// The sliding layers' RoPE (Gemma 3), when it differs.
    local_rope: Option<RotaryEmbedding>,
    /// Who fills and frees the layers' weights when they are not always present (a sharded
    /// trainer); `None`: always present.
    residency: Option<Arc<dyn LayerResidency>>,
    /// Where the embedding's and the LM head's backwards hand their weights' gradients
    /// (the collector of the checkpointing or layerwise backward); `None`: to candle's.
    grad_sink: Option<Arc<dyn GradientSink>>,
}

impl Decoder {
    /// Builds the decoder of `cfg` over the backbone tensors of `params` (the names
    /// `cfg.backbone_params()` declares).
    pub fn new(cfg: &ModelConfig, params: &ParamStore) -> Result<Decoder> {
        Self::with_experts(cfg, params, None)
    }

    /// [`Decoder::new`] with the routed experts spread over `ep` (`params` then holds only
    /// this rank's experts; see `expert_parallel.rs`).
    pub fn with_experts(
        cfg: &ModelConfig,
        params: &ParamStore,
        ep: Option<&ExpertParallel>,
    ) -> Result<Decoder> {
        let decl = cfg.backbone_params();
        Ok(Decoder {
            embed: params.get(&decl.embed_tokens.name)?,
            layers: decl
                .layers
                .iter()
                .enumerate()
                .map(|(i, layer)| DecoderLayer::new(cfg, params, layer, i, ep))
                .collect::<Result<_>>()?,
            embed_scale: cfg.embed_scale(),
            norm: RmsNorm::new(params.get(&decl.norm.name)?, cfg),
            rope: RotaryEmbedding::new(cfg),
            local_rope: RotaryEmbedding::local(cfg),
            residency: None,
            grad_sink: None,
        })
    }

    /// Streams the layers through `residency`: a layer whose weights are not present runs as
    /// one op that acquires them for its forward and again for its backward (recomputing the
    /// layer) and releases them after each (`streamed_layer.rs`). `None` turns it off.
    pub fn set_layer_residency(&mut self, residency: Option<Arc<dyn LayerResidency>>) {
        self.residency = residency;
        self.grad_sink = None;
    }

    /// Hands the embedding's and the LM head's weight gradients to `sink` instead of
    /// candle's backward (`oxalign_kernels::ops::GradientSink`). Reset by
    /// [`Decoder::set_layer_residency`].
    pub(crate) fn set_gradient_sink(&mut self, sink: Option<Arc<dyn GradientSink>>) {
        self.grad_sink = sink;
    }

    /// See [`Decoder::set_gradient_sink`].
    pub(crate) fn gradient_sink(&self) -> Option<Arc<dyn GradientSink>> {
        self.grad_sink.clone()
    }

    /// Makes every layer's linear layers compute in `precision` (embedding and norms stay f32).
    pub(crate) fn set_precision(&mut self, precision: crate::nn::precision::Precision) {
        for layer in &mut self.layers {
            layer.set_precision(precision);
        }
    }

    /// The token embedding matrix `[V, H]` (also the LM head when embeddings are tied).
    pub fn embed_tokens(&self) -> &Tensor {
        &self.embed
    }

    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Final-normed hidden states `[B, T, H]` for `input_ids` `[B, T]` (u32).
    ///
    /// `attention_mask` `[B, T]` (1 = real, 0 = pad) hides padded keys and sets position ids to
    /// `cumsum(mask) - 1` clamped at 0; without it positions are `0..T` (continuing the cache).
    /// With a `cache`, the new tokens attend to everything cached and are appended to it.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor> {
        self.forward_traced(input_ids, attention_mask, cache, &mut RouterTrace::new())
    }

    /// [`Decoder::forward`] that records the routing of every sparse layer in `trace`, or
    /// replays it from there (see [`RouterTrace::replaying`]; tokens in row-major `[B, T]`
    /// order, padding included). Dense models leave `trace` empty.
    pub fn forward_traced(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        mut cache: Option<&mut KvCache>,
        trace: &mut RouterTrace,
    ) -> Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        if t == 0 {
            candle_core::bail!("input_ids has no positions (shape [{b}, 0])")
        }
        let input_ids = if input_ids.dtype() == DType::U32 {
            input_ids.clone()
        } else {
            input_ids.to_dtype(DType::U32)?
        };
        let new_mask = match attention_mask {
            Some(m) => mask_to_host(m, b, t)?,
            None => vec![1u32; b * t],
        };
        let (positions, key_mask, offset) = match cache.as_deref_mut() {
            Some(c) if c.num_layers() != self.layers.len() => {
                candle_core::bail!(
                    "KvCache was made for {} layers, the model has {}",
                    c.num_layers(),
                    self.layers.len()
                )
            }
            Some(c) => {
                let offset = c.len();
                let (pos, km) = c.begin_step(b, t, &new_mask)?;
                (pos, km, offset)
            }
            None => {
                let pos = position_ids(&new_mask, b, t, &vec![0; b]);
                (pos, new_mask, 0)
            }
        };
        let key_mask = key_mask.contains(&0).then_some(key_mask);
        let rows = Rows {
            ids: &input_ids,
            positions: &positions,
            key_mask: key_mask.as_deref(),
            segments: None,
            offset,
        };
        self.run(rows, cache, trace)
    }

    /// Final-normed hidden states `[B, T, H]` of packed rows: `input_ids` `[B, T]` (u32)
    /// holds several sequences per row, `segments` (row-major `[B, T]`) a segment id per
    /// token. Each token attends only to the earlier tokens of its own segment (a maximal run
    /// of equal ids) and position ids restart at 0 at every segment start, so each segment's
    /// hidden states equal those of its sequence run alone. Padding in a packed row is a
    /// segment of its own whose outputs the caller ignores. No KV cache. Differentiable.
    pub fn forward_packed(&self, input_ids: &Tensor, segments: &[u32]) -> Result<Tensor> {
        self.forward_packed_traced(input_ids, segments, &mut RouterTrace::new())
    }

    /// [`Decoder::forward_packed`] recording (or replaying) the routing in `trace`, over the
    /// packed `[B, T]` tokens in row-major order.
    pub fn forward_packed_traced(
        &self,
        input_ids: &Tensor,
        segments: &[u32],
        trace: &mut RouterTrace,
    ) -> Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        if t == 0 || segments.len() != b * t {
            candle_core::bail!(
                "packed forward: input_ids [{b}, {t}] needs {} segment ids (and T > 0), got {}",
                b * t,
                segments.len()
            )
        }
        let input_ids = input_ids.to_dtype(DType::U32)?;
        let positions = segment_position_ids(segments, t);
        let rows = Rows {
            ids: &input_ids,
            positions: &positions,
            key_mask: None,
            segments: Some(segments),
            offset: 0,
        };
        self.run(rows, None, trace)
    }

    /// Embedding, layers and final norm over `rows` (appending to `cache` when given).
    fn run(
        &self,
        rows: Rows<'_>,
        mut cache: Option<&mut KvCache>,
        trace: &mut RouterTrace,
    ) -> Result<Tensor> {
        let (b, t) = rows.ids.dims2()?;
        let (offset, key_mask) = (rows.offset, rows.key_mask);
        let dtype = self.embed.dtype();
        let device = self.embed.device().clone();
        let s = offset + t;
        let global = self.rope.cos_sin(rows.positions, b, t, dtype, &device)?;
        let local = match &self.local_rope {
            Some(r) => Some(r.cos_sin(rows.positions, b, t, dtype, &device)?),
            None => None,
        };
        let dims = (b, t, s, offset);
        let rule = |w| Visibility::new(key_mask, dims, w, &device).with_segments(rows.segments);
        let full = rule(None);
        // One rule per distinct window, so each mask tensor is built at most once.
        let mut windowed: Vec<Visibility> = Vec::new();
        let mut x = embedding(&self.embed, rows.ids, self.grad_sink.clone())?;
        if let Some(scale) = self.embed_scale {
            x = x.affine(f64::from(scale), 0.0)?;
        }
        let mut parts: Option<Arc<VisibilityParts>> = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let (cos, sin) = match (&local, layer.local_rope()) {
                (Some(local), true) => local,
                _ => &global,
            };
            let streamed = self
                .residency
                .as_ref()
                .filter(|r| !(r.is_resident(i) || cache.is_some() && r.weights_stay()));
            if let Some(r) = streamed {
                if cache.is_some() {
                    candle_core::bail!(
                        "layer {i}'s weights are not present (sharded); a cached forward needs the whole model gathered"
                    )
                }
                let parts = parts.get_or_insert_with(|| Arc::new(rows.visibility_parts(&device)));
                x = forward_streamed(layer, i, r, &x, (cos, sin), parts, trace)?;
                continue;
            }
            let visible = match layer.window() {
                Some(w) if w < s => {
                    let at = match windowed.iter().position(|v| v.window() == Some(w)) {
                        Some(at) => at,
                        None => {
                            windowed.push(rule(Some(w)));
                            windowed.len() - 1
                        }
                    };
                    &windowed[at]
                }
                _ => &full,
            };
            let layer_cache = cache.as_deref_mut().map(|c| (c, i));
            x = layer.forward(&x, cos, sin, visible, layer_cache, trace)?;
        }
        self.norm.forward(&x)
    }
}

/// The token rows of one decoder call and their host-side bookkeeping.
struct Rows<'a> {
    /// `[B, T]` u32 token ids.
    ids: &'a Tensor,
    /// `[B, T]` row-major position ids.
    positions: &'a [u32],
    /// `[B, S]` key mask (1 = real), `None` when no key is padding.
    key_mask: Option<&'a [u32]>,
    /// `[B, T]` segment ids of packed rows, `None` for one sequence per row.
    segments: Option<&'a [u32]>,
    /// Cached positions before these rows.
    offset: usize,
}

impl Rows<'_> {
    /// The visibility of these rows as owned data (for a streamed layer's op).
    fn visibility_parts(&self, device: &candle_core::Device) -> VisibilityParts {
        let (b, t) = self.ids.dims2().unwrap_or((0, 0));
        VisibilityParts {
            key_mask: self.key_mask.map(<[u32]>::to_vec),
            segments: self.segments.map(<[u32]>::to_vec),
            dims: (b, t, self.offset + t, self.offset),
            device: device.clone(),
        }
    }
}
