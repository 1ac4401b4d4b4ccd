//! One pre-norm decoder layer: `x + attn(norm(x))`, then `x + mlp(norm(x))`. Composition only;
//! the attention and MLP math live in `attention.rs` and `mlp.rs`.

use crate::attention::Attention;
use crate::config::ModelConfig;
use crate::kv_cache::KvCache;
use crate::layers::rms_norm;
use crate::layout::LayerParams;
use crate::mask::Visibility;
use crate::mlp::Mlp;
use crate::param_store::ParamStore;
use candle_core::{Result, Tensor};

/// Weights of one decoder layer (the tensors of a [`LayerParams`]).
#[derive(Clone, Debug)]
pub struct DecoderLayer {
    input_norm: Tensor,
    attn: Attention,
    post_attn_norm: Tensor,
    mlp: Mlp,
    eps: f64,
    window: Option<usize>,
}

impl DecoderLayer {
    /// Layer `index` of `cfg`: the tensors `decl` names, from `params`.
    pub fn new(
        cfg: &ModelConfig,
        params: &ParamStore,
        decl: &LayerParams,
        index: usize,
    ) -> Result<DecoderLayer> {
        Ok(DecoderLayer {
            input_norm: params.get(&decl.input_norm.name)?,
            attn: Attention::new(cfg, params, &decl.attn)?,
            post_attn_norm: params.get(&decl.post_attention_norm.name)?,
            mlp: Mlp::new(params, &decl.mlp)?,
            eps: cfg.rms_norm_eps,
            window: cfg.layer_window(index),
        })
    }

    /// The sliding window this layer uses (`None` = full causal attention).
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// `x`: `[B, T, H]` -> `[B, T, H]`; see [`Attention::forward`] for the other arguments.
    pub fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        visible: &Visibility,
        cache: Option<(&mut KvCache, usize)>,
    ) -> Result<Tensor> {
        let h = self.attn.forward(
            &rms_norm(x, &self.input_norm, self.eps)?,
            cos,
            sin,
            visible,
            cache,
        )?;
        let x = (x + h)?;
        let h = self
            .mlp
            .forward(&rms_norm(&x, &self.post_attn_norm, self.eps)?)?;
        x + h
    }
}
