//! One pre-norm decoder layer: `x + attn(norm(x))`, then `x + ffn(norm(x))` where the
//! feed-forward block is a dense MLP or routed experts. Composition only; the math lives in
//! `attention.rs`, `mlp.rs` and `moe/block.rs`.

use crate::config::layout::{FeedForwardParams, LayerParams};
use crate::config::model_config::ModelConfig;
use crate::io::param_store::ParamStore;
use crate::moe::block::SparseMoe;
use crate::moe::expert_parallel::ExpertParallel;
use crate::moe::routing::RouterTrace;
use crate::nn::attention::Attention;
use crate::nn::kv_cache::KvCache;
use crate::nn::layers::rms_norm;
use crate::nn::mask::Visibility;
use crate::nn::mlp::Mlp;
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
    input_norm: Tensor,
    attn: Attention,
    post_attn_norm: Tensor,
    ffn: FeedForward,
    eps: f64,
    window: Option<usize>,
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
        Ok(DecoderLayer {
            input_norm: params.get(&decl.input_norm.name)?,
            attn: Attention::new(cfg, params, &decl.attn)?,
            post_attn_norm: params.get(&decl.post_attention_norm.name)?,
            ffn: match &decl.ffn {
                FeedForwardParams::Dense(m) => FeedForward::Dense(Mlp::new(params, m)?),
                FeedForwardParams::Sparse(m) => {
                    FeedForward::Sparse(SparseMoe::new(cfg, params, m, ep)?)
                }
            },
            eps: cfg.rms_norm_eps,
            window: cfg.layer_window(index),
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
        let h = self.attn.forward(
            &rms_norm(x, &self.input_norm, self.eps)?,
            cos,
            sin,
            visible,
            cache,
        )?;
        let x = (x + h)?;
        let normed = rms_norm(&x, &self.post_attn_norm, self.eps)?;
        let h = match &self.ffn {
            FeedForward::Dense(m) => m.forward(&normed)?,
            FeedForward::Sparse(m) => m.forward(&normed, trace)?,
        };
        x + h
    }
}
