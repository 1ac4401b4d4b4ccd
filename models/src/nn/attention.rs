//! Grouped-query self-attention of one decoder layer: q/k/v/o projections (optional biases),
//! optional per-head RMSNorm of q and k (Qwen3 `q_norm` / `k_norm`), RoPE on q and k, scaled
//! dot-product attention under a visibility rule (Gemma's `query_pre_attn_scalar` scale by
//! rescaling q), optional KV cache.
//! The training forward (no cache, f32/f64 on the CPU) runs the fused kernel
//! `oxalign_kernels::ops::causal_attention_merged` (packed rows included); everything else
//! composes candle ops.
//! Masks and position ids are built by the caller (`mask.rs`).

use crate::config::layout::AttentionParams;
use crate::config::model_config::ModelConfig;
use crate::config::param_spec::ParamSpec;
use crate::io::param_store::ParamStore;
use crate::nn::kv_cache::KvCache;
use crate::nn::layers::{apply_rope, softmax_last_dim};
use crate::nn::mask::{mask_scores, Visibility};
use crate::nn::norm::RmsNorm;
use crate::nn::precision::Precision;
use crate::nn::proj::Proj;
use candle_core::{DType, Result, Tensor};
use oxalign_kernels::ops::{causal_attention_merged, softcap};

/// Weights and shape of one attention block (the tensors of an [`AttentionParams`]).
#[derive(Clone, Debug)]
pub struct Attention {
    q: Proj,
    k: Proj,
    v: Proj,
    o: Proj,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    /// What q is multiplied by so that the kernels' `head_dim^-0.5` gives the model's
    /// score scale (`query_pre_attn_scalar`); `None` when they agree.
    q_rescale: Option<f64>,
    /// Gemma 2's `attn_logit_softcapping`: scores become `c · tanh(s / c)`.
    softcap: Option<f64>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    precision: Precision,
}

impl Attention {
    /// Picks up the tensors `decl` names (with a bias where it declares one) from `params`.
    pub fn new(
        cfg: &ModelConfig,
        params: &ParamStore,
        decl: &AttentionParams,
    ) -> Result<Attention> {
        let norm = |spec: &Option<ParamSpec>| -> Result<Option<RmsNorm>> {
            let weight = spec.as_ref().map(|n| params.get(&n.name)).transpose()?;
            Ok(weight.map(|w| RmsNorm::new(w, cfg)))
        };
        Ok(Attention {
            q: Proj::new(params, &decl.q)?,
            k: Proj::new(params, &decl.k)?,
            v: Proj::new(params, &decl.v)?,
            o: Proj::new(params, &decl.o)?,
            q_norm: norm(&decl.q_norm)?,
            k_norm: norm(&decl.k_norm)?,
            q_rescale: q_rescale(cfg),
            softcap: cfg.style.attn_softcap,
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            precision: Precision::F32,
        })
    }

    /// Makes the q/k/v and output projections compute in `precision`.
    pub(crate) fn set_precision(&mut self, precision: Precision) {
        self.precision = precision;
    }

    /// `x`: `[B, T, H]`; `cos`/`sin`: `[B, T, head_dim/2]`; `visible`: which of the `S` keys
    /// each query sees. With `cache = Some((cache, layer))` the new keys/values are appended
    /// and attention runs over all cached positions. Returns `[B, T, H]`, added to `onto`
    /// when given (the residual stream: the output projection and the add then run as one
    /// op where [`Proj::forward_onto`] fuses them).
    pub fn forward(
        &self,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        visible: &Visibility,
        cache: Option<(&mut KvCache, usize)>,
        onto: Option<&Tensor>,
    ) -> Result<Tensor> {
        let out = self.attend(x, cos, sin, visible, cache)?;
        match onto {
            Some(residual) => self.o.forward_onto(&out, residual, self.precision),
            None => self.o.forward(&out, self.precision),
        }
    }

    /// The heads' outputs `[B, T, heads · head_dim]`, before the output projection.
    fn attend(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        visible: &Visibility,
        cache: Option<(&mut KvCache, usize)>,
    ) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let (nh, nkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let p = self.precision;
        let split = |proj: &Proj, n: usize, norm: Option<&RmsNorm>| {
            let y = proj.forward(x, p)?.reshape((b, t, n, hd))?;
            let y = match norm {
                Some(norm) => norm.forward(&y)?,
                None => y,
            };
            // `[B, n, T, hd]` as a view: RoPE reads it in place on the CPU and writes a
            // contiguous result, so q and k are not copied first.
            y.transpose(1, 2)
        };
        // q and k rotated; where nothing sits between the projection and RoPE, as one op
        // that keeps only the rotated heads for the backward.
        let rotated = |proj: &Proj, n: usize, norm: Option<&RmsNorm>, rescale: Option<f64>| {
            if norm.is_none() && rescale.is_none() {
                if let Some(y) = proj.forward_rotated(x, (cos, sin), n, p)? {
                    return Ok(y);
                }
            }
            let y = split(proj, n, norm)?;
            let y = match rescale {
                Some(f) => y.affine(f, 0.0)?,
                None => y,
            };
            apply_rope(&y, cos, sin)
        };
        let q = rotated(&self.q, nh, self.q_norm.as_ref(), self.q_rescale)?;
        let k = rotated(&self.k, nkv, self.k_norm.as_ref(), None)?;
        // A view: the fused attention reads it as it is.
        let v = split(&self.v, nkv, None)?;
        let fused = cache.is_none()
            && self.softcap.is_none()
            && visible.is_self_attention()
            && x.device().is_cpu()
            && matches!(x.dtype(), DType::F32 | DType::F64);
        if fused {
            // In the int8 engine's numbers the attention must be the engine's bits too, or
            // the int8 rounding of its output can flip on one side only. The op writes the
            // merged heads itself (no transposed copy kept for the backward).
            let engine_order = p == Precision::FakeInt8;
            let masks = (visible.key_mask(), visible.segments());
            return causal_attention_merged(&q, &k, &v, masks, visible.window(), engine_order);
        }
        let v = v.contiguous()?;
        let (k, v) = match cache {
            Some((cache, layer)) => cache.append(layer, &k, &v)?,
            None => (k, v),
        };
        composed_attention(&q, &k, &v, visible.mask()?, self.softcap)?
            .transpose(1, 2)?
            .reshape((b, t, nh * hd))
    }
}

/// The factor that turns the kernels' `head_dim^-0.5` score scale into
/// `query_pre_attn_scalar^-0.5` (`None` when there is none or they agree).
fn q_rescale(cfg: &ModelConfig) -> Option<f64> {
    let scalar = cfg.style.query_pre_attn_scalar?;
    let f = (cfg.head_dim as f64 / scalar).sqrt();
    (f != 1.0).then_some(f)
}

/// Attention from candle ops: `q` `[B, nh, T, hd]`, `k`/`v` `[B, nkv, S, hd]`, `visible`
/// `[B|1, 1, T, S]` u8 (None = all keys visible), scores soft-capped at `cap` when given
/// (Gemma 2; the fused kernel has no cap) -> `[B, nh, T, hd]`. Hidden scores are
/// replaced by `MASKED_SCORE`, so a query with no visible key averages all `S` values.
fn composed_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    visible: Option<&Tensor>,
    cap: Option<f64>,
) -> Result<Tensor> {
    let (b, nh, t, hd) = q.dims4()?;
    let (nkv, s) = (k.dim(1)?, k.dim(2)?);
    let n_rep = nh / nkv;
    // GQA without copying K/V: query head h = g * n_rep + r uses kv head g, so the
    // n_rep query heads of a group are stacked along the sequence axis.
    let q = q.reshape((b, nkv, n_rep * t, hd))?;
    let scores = (q.matmul(&k.t()?)? * (hd as f64).powf(-0.5))?.reshape((b, nh, t, s))?;
    let scores = match cap {
        Some(c) => softcap(&scores, c)?,
        None => scores,
    };
    let scores = match visible {
        Some(m) => mask_scores(&scores, m)?,
        None => scores,
    };
    let probs = softmax_last_dim(&scores)?.reshape((b, nkv, n_rep * t, s))?;
    probs.matmul(&v.contiguous()?)?.reshape((b, nh, t, hd))
}
