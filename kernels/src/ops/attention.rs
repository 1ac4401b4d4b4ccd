//! Fused causal self-attention `softmax(q k^T / sqrt(hd) + mask) v` as a differentiable candle
//! `CustomOp3` over (q, k, v) with grouped-query heads, key padding, a sliding window and
//! packed segments (several sequences per row, each attending only to itself), for the
//! training forward (no KV cache: queries and keys are the same `T` positions).
//! CPU kernels only (flash-style, see `attention_fwd.rs` / `attention_bwd.rs`); on other
//! devices, and for f16/bf16, the wrapper runs the composed candle ops instead.
//! Not a decoding kernel: it has no KV cache, no query offset and no dropout.

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor};

use super::attention_bwd::{backward, Grads, Saved};
use super::attention_engine_order::forward_engine_order;
use super::attention_fwd::{forward, Dims, Tiles};
use super::attention_visibility::Visibility;
use super::cpu_math::{contiguous_slice, Real};
use super::{reference, validate};

const OP: &str = "causal_attention";

/// Scaled dot-product causal self-attention over `T` positions.
///
/// * `q`: `[B, nh, T, hd]`; `k`, `v`: `[B, nkv, T, hd]` with `nkv` dividing `nh` (query head
///   `h` reads kv head `h / (nh / nkv)`). Same dtype (f32 or f64 for the fused CPU kernel).
/// * `key_mask`: row-major `[B, T]`, nonzero = real token, 0 = padding; `None` = no padding.
/// * `window`: sliding window in tokens (`None` = full causal attention).
/// * returns `[B, nh, T, hd]`: `sum_j softmax_j(hd^-0.5 q_i . k_j) v_j` over the keys `j`
///   visible to query `i`: `j <= i`, `key_mask[b, j] != 0` and `i - j < window`.
///
/// A query that sees no key at all (a left-pad position) gets the uniform average of all `T`
/// values and passes no gradient to q or k, exactly as the composed path whose hidden scores
/// are replaced by `-1e9` does. Differentiable in q, k and v. Off the CPU, or for f16/bf16,
/// this runs [`reference::causal_attention`] (same maths, `[B, nh, T, T]` intermediates).
pub fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_mask: Option<&[u32]>,
    window: Option<usize>,
) -> Result<Tensor> {
    causal_attention_tiled(q, k, v, (key_mask, None), window, Tiles::DEFAULT)
}

/// [`causal_attention`] over packed rows: `segments` (row-major `[B, T]`) gives each token a
/// segment id, and a query sees only the keys of its own segment (a maximal run of equal ids
/// in its row) on top of the causal, padding and window rules. A row holding sequences `a`
/// and `b` back to back as segments gives, at each position, what `a` and `b` give run
/// separately (with positions restarting per segment, which is the caller's RoPE business).
/// Off the CPU, or for f16/bf16, this runs [`reference::causal_attention_segmented`].
pub fn causal_attention_segmented(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_mask: Option<&[u32]>,
    segments: Option<&[u32]>,
    window: Option<usize>,
) -> Result<Tensor> {
    causal_attention_tiled(q, k, v, (key_mask, segments), window, Tiles::DEFAULT)
}

/// [`causal_attention_segmented`] whose f32 CPU forward computes in the decoding engine's
/// arithmetic (`attention_engine_order.rs`): each query's outputs are the bits the engine's
/// paged attention gives for the same q, k and v. For a trainer that must see the engine's
/// numbers exactly (fake int8 rollouts). Slower than the tiled forward (one pass more over
/// the scores, no online softmax); the backward is the same. f64 and other devices run as
/// [`causal_attention_segmented`].
pub fn causal_attention_engine_order(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_mask: Option<&[u32]>,
    segments: Option<&[u32]>,
    window: Option<usize>,
) -> Result<Tensor> {
    let masks = (key_mask, segments);
    attention_op(q, k, v, masks, window, (Tiles::DEFAULT, Order::Engine))
}

/// [`causal_attention_segmented`] with explicit tile sizes (tests use tiny tiles on tiny
/// shapes); `masks` is `(key_mask, segments)`.
pub(crate) fn causal_attention_tiled(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    masks: (Option<&[u32]>, Option<&[u32]>),
    window: Option<usize>,
    tiles: Tiles,
) -> Result<Tensor> {
    attention_op(q, k, v, masks, window, (tiles, Order::Tiled))
}

/// Which arithmetic the f32 CPU forward uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// Flash-style tiles with an online softmax (`attention_fwd.rs`).
    Tiled,
    /// The decoding engine's per-query order (`attention_engine_order.rs`).
    Engine,
}

/// Checks the arguments and applies the op (or the composed reference off the CPU).
pub(crate) fn attention_op(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (key_mask, segments): (Option<&[u32]>, Option<&[u32]>),
    window: Option<usize>,
    (tiles, order): (Tiles, Order),
) -> Result<Tensor> {
    let dims = check_shapes(q, k, v)?;
    if tiles.q == 0 || tiles.k == 0 {
        candle_core::bail!("{OP}: tile sizes must be positive, got {tiles:?}");
    }
    let vis = Visibility::new(OP, (dims.b, dims.t), key_mask, segments, window)?;
    match (q.device().is_cpu(), q.dtype()) {
        (true, DType::F32 | DType::F64) => {}
        (false, _) | (true, DType::F16 | DType::BF16) => {
            return reference::causal_attention_segmented(q, k, v, key_mask, segments, window);
        }
        (true, dt) => candle_core::bail!("{OP}: `q` must be a float tensor, got {dt:?}"),
    }
    let op = CausalAttention {
        dims,
        vis: Arc::new(vis),
        tiles,
        order,
        lse: Mutex::new(None),
    };
    q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)
}

/// Checks ranks, head counts, dtypes and devices; returns the shapes.
fn check_shapes(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Dims> {
    validate::same_dtype(OP, "q", q, "k", k)?;
    validate::same_dtype(OP, "q", q, "v", v)?;
    validate::same_device(OP, q, "k", k)?;
    validate::same_device(OP, q, "v", v)?;
    let &[b, nh, t, hd] = q.dims() else {
        candle_core::bail!("{OP}: `q` must be [B, nh, T, hd], got {:?}", q.dims());
    };
    let nkv = k.dims().get(1).copied().unwrap_or(0);
    if k.dims() != [b, nkv, t, hd] || nkv == 0 {
        candle_core::bail!(
            "{OP}: `k` must be [{b}, nkv, {t}, {hd}] (nkv > 0) for `q` of shape {:?}, got {:?}",
            q.dims(),
            k.dims()
        );
    }
    if v.dims() != k.dims() {
        candle_core::bail!(
            "{OP}: `v` must have the shape of `k` {:?}, got {:?}",
            k.dims(),
            v.dims()
        );
    }
    if nh % nkv != 0 {
        candle_core::bail!("{OP}: the {nkv} kv heads of `k` must divide the {nh} heads of `q`");
    }
    if t == 0 || hd == 0 {
        candle_core::bail!(
            "{OP}: `q` has an empty sequence or head dim, shape {:?}",
            q.dims()
        );
    }
    Ok(Dims { b, nh, nkv, t, hd })
}

/// `(q, k, v) -> out [B, nh, T, hd]`; keeps the forward's log-sum-exp for [`CustomOp3::bwd`].
struct CausalAttention {
    dims: Dims,
    vis: Arc<Visibility>,
    tiles: Tiles,
    order: Order,
    /// Per-row log-sum-exp `[B, nh, T]` written by `cpu_fwd` (the op is made per call).
    lse: Mutex<Option<Arc<CpuStorage>>>,
}

impl CausalAttention {
    fn fwd<T: Real>(&self, s: [(&CpuStorage, &Layout); 3]) -> Result<(Vec<T>, Vec<T>)> {
        let q = contiguous_slice::<T>(s[0].0, s[0].1, OP, "q")?;
        let k = contiguous_slice::<T>(s[1].0, s[1].1, OP, "k")?;
        let v = contiguous_slice::<T>(s[2].0, s[2].1, OP, "v")?;
        Ok(forward((q, k, v), self.dims, &self.vis, self.tiles))
    }

    fn fwd_engine_order(&self, s: [(&CpuStorage, &Layout); 3]) -> Result<(Vec<f32>, Vec<f32>)> {
        let q = contiguous_slice::<f32>(s[0].0, s[0].1, OP, "q")?;
        let k = contiguous_slice::<f32>(s[1].0, s[1].1, OP, "k")?;
        let v = contiguous_slice::<f32>(s[2].0, s[2].1, OP, "v")?;
        Ok(forward_engine_order(
            (q, k, v),
            self.dims,
            &self.vis,
            self.tiles,
        ))
    }

    fn saved_lse(&self) -> Result<Arc<CpuStorage>> {
        let guard = self
            .lse
            .lock()
            .map_err(|_| candle_core::Error::Msg(format!("{OP}: saved state is poisoned")))?;
        match guard.as_ref() {
            Some(lse) => Ok(lse.clone()),
            None => candle_core::bail!("{OP}: backward called before a CPU forward"),
        }
    }

    /// Gradients for the tensors that want them, from the saved state.
    fn grads<T: Real>(
        &self,
        [q, k, v, out, d_out]: [&Tensor; 5],
        lse: &CpuStorage,
        want: (bool, bool),
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let guards = [q, k, v, out, d_out].map(|t| t.storage_and_layout());
        let slice = |i: usize, arg: &str| -> Result<&[T]> {
            match &*guards[i].0 {
                Storage::Cpu(s) => contiguous_slice::<T>(s, guards[i].1, OP, arg),
                _ => candle_core::bail!("{OP}: backward needs `{arg}` on the CPU"),
            }
        };
        let saved = Saved {
            q: slice(0, "q")?,
            k: slice(1, "k")?,
            v: slice(2, "v")?,
            out: slice(3, "output")?,
            lse: T::cpu_storage_as_slice(lse)?,
            d_out: slice(4, "output gradient")?,
        };
        let Grads { dq, dkv } = backward(&saved, self.dims, &self.vis, self.tiles, want);
        let dev = q.device();
        let dq = dq
            .map(|g| Tensor::from_vec(g, q.shape(), dev))
            .transpose()?;
        let (dk, dv) = match dkv {
            Some((dk, dv)) => (
                Some(Tensor::from_vec(dk, k.shape(), dev)?),
                Some(Tensor::from_vec(dv, v.shape(), dev)?),
            ),
            None => (None, None),
        };
        Ok((dq, dk, dv))
    }
}

impl CustomOp3 for CausalAttention {
    fn name(&self) -> &'static str {
        "causal-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let args = [(s1, l1), (s2, l2), (s3, l3)];
        let (out, lse) = match (s1, s2, s3) {
            (CpuStorage::F32(_), CpuStorage::F32(_), CpuStorage::F32(_)) => {
                let (o, l) = match self.order {
                    Order::Tiled => self.fwd::<f32>(args)?,
                    Order::Engine => self.fwd_engine_order(args)?,
                };
                (CpuStorage::F32(o), CpuStorage::F32(l))
            }
            (CpuStorage::F64(_), CpuStorage::F64(_), CpuStorage::F64(_)) => {
                let (o, l) = self.fwd::<f64>(args)?;
                (CpuStorage::F64(o), CpuStorage::F64(l))
            }
            (a, _, _) => validate::unsupported_cpu_dtype(OP, a)?,
        };
        match self.lse.lock() {
            Ok(mut slot) => *slot = Some(Arc::new(lse)),
            Err(_) => candle_core::bail!("{OP}: saved state is poisoned"),
        }
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let want = (q.track_op(), k.track_op() || v.track_op());
        if want == (false, false) {
            return Ok((None, None, None));
        }
        let lse = self.saved_lse()?;
        let d_out = grad_res.contiguous()?;
        let res = res.contiguous()?;
        let args = [q, k, v, &res, &d_out];
        match q.dtype() {
            DType::F32 => self.grads::<f32>(args, &lse, want),
            DType::F64 => self.grads::<f64>(args, &lse, want),
            dt => candle_core::bail!("{OP}: backward has no kernel for {dt:?}"),
        }
    }
}
