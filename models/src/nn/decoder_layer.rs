//! One pre-norm decoder layer: `x + attn(norm(x))`, then `x + ffn(norm(x))` where the
//! feed-forward block is a dense MLP or routed experts; with Gemma's norms
//! `x + norm(attn(norm(x)))`, then `x + norm(ffn(norm(x)))`. Composition only; the math
//! lives in `attention.rs`, `mlp.rs`, `norm.rs` and `moe/block.rs`.

use crate::config::layout::{FeedForwardParams, LayerParams};
use crate::config::model_config::ModelConfig;
use crate::config::param_spec::ParamSpec;
use crate::io::param_store::ParamStore;
use crate::moe::block::SparseMoe;
use crate::moe::expert_parallel::ExpertParallel;
use crate::moe::routing::RouterTrace;
use crate::nn::attention::Attention;
use crate::nn::kv_cache::KvCache;
use crate::nn::mask::Visibility;
use crate::nn::mlp::Mlp;
use crate::nn::norm::RmsNorm;
use candle_core::{Result, Tensor};

/// The feed-forward block of a layer.
#[derive(Clone, Debug)]
enum FeedForward {
    Dense(Mlp),
    Sparse(SparseMoe),
}

/// Weights of one decoder layer (the tensors of a [`LayerParams`]).
#[derive(Clone, Debug)]
pub(crate) struct DecoderLayer {
    input_norm: RmsNorm,
    attn: Attention,
    post_attn_norm: RmsNorm,
    /// Gemma's norms before and after the feed-forward block (`post_attn_norm` then
    /// normalises the attention's output).
    feedforward_norms: Option<(RmsNorm, RmsNorm)>,
    ffn: FeedForward,
    window: Option<usize>,
    local_rope: bool,
}

impl DecoderLayer {
    /// Layer `index` of `cfg`: the tensors `decl` names, from `params` (a sparse layer's
    /// experts only this rank's when `ep` spreads them over a group).
    pub fn new(
        cfg: &ModelConfig,
        params: &ParamStore,
        decl: &LayerParams,
        index: usize,
        ep: Option<&ExpertParallel>,
    ) -> Result<DecoderLayer> {
        let norm = |spec: &ParamSpec| {
            Ok::<_, candle_core::Error>(RmsNorm::new(params.get(&spec.name)?, cfg))
        };
        let feedforward_norms = match &decl.feedforward_norms {
            Some((pre, post)) => Some((norm(pre)?, norm(post)?)),
            None => None,
        };
        Ok(DecoderLayer {
            input_norm: norm(&decl.input_norm)?,
            attn: Attention::new(cfg, params, &decl.attn)?,
            post_attn_norm: norm(&decl.post_attention_norm)?,
            feedforward_norms,
            ffn: match &decl.ffn {
                FeedForwardParams::Dense(m) => {
                    FeedForward::Dense(Mlp::new(params, m, cfg.style.activation)?)
                }
                FeedForwardParams::Sparse(m) => {
                    FeedForward::Sparse(SparseMoe::new(cfg, params, m, ep)?)
                }
            },
            window: cfg.layer_window(index),
            local_rope: cfg.layer_uses_local_rope(index),
        })
    }

    /// Makes the layer's linear layers compute in `precision` (norms stay f32).
    pub(crate) fn set_precision(&mut self, precision: crate::nn::precision::Precision) {
        self.attn.set_precision(precision);
        match &mut self.ffn {
            FeedForward::Dense(m) => m.set_precision(precision),
            FeedForward::Sparse(m) => m.set_precision(precision),
        }
    }

    /// The sliding window this layer uses (`None` = full causal attention).
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// Whether this layer takes the local RoPE tables (Gemma 3's sliding layers).
    pub fn local_rope(&self) -> bool {
        self.local_rope
    }

    /// `x`: `[B, T, H]` -> `[B, T, H]`; see [`Attention::forward`] for the other arguments. A
    /// sparse layer records its routing in `trace` (and replays from it when asked).
    pub fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        visible: &Visibility,
        cache: Option<(&mut KvCache, usize)>,
        trace: &mut RouterTrace,
    ) -> Result<Tensor> {
        let (residual, branch) = self.forward_parts(x, cos, sin, visible, cache, trace)?;
        residual + branch
    }

    /// [`Self::forward`]'s output as its two summands: the residual stream after attention
    /// and the feed-forward branch (normed where the family norms it).
    pub(crate) fn forward_parts(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        visible: &Visibility,
        cache: Option<(&mut KvCache, usize)>,
        trace: &mut RouterTrace,
    ) -> Result<(Tensor, Tensor)> {
        let normed = self.input_norm.forward(x)?;
        let ffn = |normed: &Tensor, trace: &mut RouterTrace| match &self.ffn {
            FeedForward::Dense(m) => m.forward(normed),
            FeedForward::Sparse(m) => m.forward(normed, trace),
        };
        match &self.feedforward_norms {
            None => {
                let x = self
                    .attn
                    .forward(&normed, (cos, sin), visible, cache, Some(x))?;
                let h = ffn(&self.post_attn_norm.forward(&x)?, trace)?;
                Ok((x, h))
            }
            Some((pre, post)) => {
                let h = self
                    .attn
                    .forward(&normed, (cos, sin), visible, cache, None)?;
                let x = (x + self.post_attn_norm.forward(&h)?)?;
                let h = ffn(&pre.forward(&x)?, trace)?;
                Ok((x, post.forward(&h)?))
            }
        }
    }
}
