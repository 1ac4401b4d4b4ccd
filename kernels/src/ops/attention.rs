//! Fused causal self-attention `softmax(q k^T / sqrt(hd) + mask) v` as a differentiable candle
//! `CustomOp3` over (q, k, v) with grouped-query heads, key padding, a sliding window and
//! packed segments (several sequences per row, each attending only to itself), for the
//! training forward (no KV cache: queries and keys are the same `T` positions).
//! CPU kernels only (flash-style, see `attention_fwd.rs` / `attention_bwd.rs`); on other
//! devices, and for f16/bf16, the wrapper runs the composed candle ops instead.
//! Not a decoding kernel: it has no KV cache, no query offset and no dropout.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor};
use rayon::prelude::*;

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
    masks: (Option<&[u32]>, Option<&[u32]>),
    window: Option<usize>,
    how: (Tiles, Order),
) -> Result<Tensor> {
    heads_op(q, k, v, masks, window, how, Heads::Split)
}

/// [`causal_attention_segmented`] (with `engine_order`, [`causal_attention_engine_order`])
/// with the heads merged back: `[B, T, nh · hd]`, the output projection's input. On the CPU
/// the op writes that layout itself, so the graph keeps no second, transposed copy of the
/// output for the backward.
pub fn causal_attention_merged(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    masks: (Option<&[u32]>, Option<&[u32]>),
    window: Option<usize>,
    engine_order: bool,
) -> Result<Tensor> {
    let order = match engine_order {
        true => Order::Engine,
        false => Order::Tiled,
    };
    heads_op(
        q,
        k,
        v,
        masks,
        window,
        (Tiles::DEFAULT, order),
        Heads::Merged,
    )
}

/// The layout of the attention's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Heads {
    /// `[B, nh, T, hd]`.
    Split,
    /// `[B, T, nh · hd]`.
    Merged,
}

/// `out` `[b, nh, t, hd]` as `[b, t, nh, hd]`.
fn merge<T: Copy + Default + Send + Sync>(out: &[T], d: Dims) -> Vec<T> {
    let mut merged = vec![T::default(); out.len()];
    if merged.is_empty() {
        return merged;
    }
    merged
        .par_chunks_mut(d.nh * d.hd)
        .enumerate()
        .for_each(|(bt, row)| {
            let (b, t) = (bt / d.t, bt % d.t);
            for (h, dst) in row.chunks_mut(d.hd).enumerate() {
                let at = ((b * d.nh + h) * d.t + t) * d.hd;
                dst.copy_from_slice(&out[at..at + d.hd]);
            }
        });
    merged
}

/// [`attention_op`] with its output in `heads`' layout.
fn heads_op(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (key_mask, segments): (Option<&[u32]>, Option<&[u32]>),
    window: Option<usize>,
    (tiles, order): (Tiles, Order),
    heads: Heads,
) -> Result<Tensor> {
    let dims = check_shapes(q, k, v)?;
    if tiles.q == 0 || tiles.k == 0 {
        candle_core::bail!("{OP}: tile sizes must be positive, got {tiles:?}");
    }
    let vis = Visibility::new(OP, (dims.b, dims.t), key_mask, segments, window)?;
    match (q.device().is_cpu(), q.dtype()) {
        (true, DType::F32 | DType::F64) => {}
        (false, _) | (true, DType::F16 | DType::BF16) => {
            let out = reference::causal_attention_segmented(q, k, v, key_mask, segments, window)?;
            return match heads {
                Heads::Split => Ok(out),
                Heads::Merged => {
                    let Dims { b, nh, t, hd, .. } = dims;
                    out.transpose(1, 2)?.reshape((b, t, nh * hd))
                }
            };
        }
        (true, dt) => candle_core::bail!("{OP}: `q` must be a float tensor, got {dt:?}"),
    }
    let op = CausalAttention {
        dims,
        vis: Arc::new(vis),
        tiles,
        order,
        heads,
        lse: Mutex::new(None),
    };
    // `v` may stay a transposed view (the value projection's `[B, T, nkv, hd]`): the op
    // copies it for the kernel only while it runs, so the graph keeps no second copy.
    let v = match v.stride().last() == Some(&1) {
        true => v.clone(),
        false => v.contiguous()?,
    };
    q.contiguous()?.apply_op3(&k.contiguous()?, &v, op)
}

/// `x`'s elements in row-major order: the storage itself when `layout` is contiguous, else
/// a copy.
fn rows_of<'a, T: Real>(s: &'a CpuStorage, layout: &Layout, arg: &str) -> Result<Cow<'a, [T]>> {
    if layout.is_contiguous() {
        return contiguous_slice::<T>(s, layout, OP, arg).map(Cow::Borrowed);
    }
    let data = T::cpu_storage_as_slice(s)?;
    let &[d0, d1, d2, d3] = layout.dims() else {
        candle_core::bail!("{OP}: `{arg}` must be 4-D, got {:?}", layout.dims());
    };
    let &[s0, s1, s2, s3] = layout.stride() else {
        candle_core::bail!(
            "{OP}: `{arg}` must be 4-D, got strides {:?}",
            layout.stride()
        );
    };
    let mut out = Vec::with_capacity(d0 * d1 * d2 * d3);
    for i0 in 0..d0 {
        for i1 in 0..d1 {
            for i2 in 0..d2 {
                let row = layout.start_offset() + i0 * s0 + i1 * s1 + i2 * s2;
                out.extend((0..d3).map(|i3| data[row + i3 * s3]));
            }
        }
    }
    Ok(Cow::Owned(out))
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
    /// The output's layout (the backward's output gradient comes in the same).
    heads: Heads,
    /// Per-row log-sum-exp `[B, nh, T]` written by `cpu_fwd` (the op is made per call).
    lse: Mutex<Option<Arc<CpuStorage>>>,
}

impl CausalAttention {
    fn fwd<T: Real>(&self, s: [(&CpuStorage, &Layout); 3]) -> Result<(Vec<T>, Vec<T>)> {
        let q = contiguous_slice::<T>(s[0].0, s[0].1, OP, "q")?;
        let k = contiguous_slice::<T>(s[1].0, s[1].1, OP, "k")?;
        let v = rows_of::<T>(s[2].0, s[2].1, "v")?;
        Ok(forward((q, k, &v), self.dims, &self.vis, self.tiles))
    }

    fn fwd_engine_order(&self, s: [(&CpuStorage, &Layout); 3]) -> Result<(Vec<f32>, Vec<f32>)> {
        let q = contiguous_slice::<f32>(s[0].0, s[0].1, OP, "q")?;
        let k = contiguous_slice::<f32>(s[1].0, s[1].1, OP, "k")?;
        let v = rows_of::<f32>(s[2].0, s[2].1, "v")?;
        Ok(forward_engine_order(
            (q, k, &v),
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

impl CausalAttention {
    /// `[B, T, nh · hd]`.
    fn merged_shape(&self) -> Shape {
        let Dims { b, nh, t, hd, .. } = self.dims;
        Shape::from((b, t, nh * hd))
    }

    /// A tensor in the output's layout as contiguous `[B, nh, T, hd]`, the kernels' layout.
    fn split(&self, x: &Tensor) -> Result<Tensor> {
        let Dims { b, nh, t, hd, .. } = self.dims;
        match self.heads {
            Heads::Split => x.contiguous(),
            Heads::Merged => x.reshape((b, t, nh, hd))?.transpose(1, 2)?.contiguous(),
        }
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
        let d = self.dims;
        match (self.heads, out) {
            (Heads::Split, out) => Ok((out, l1.shape().clone())),
            (Heads::Merged, CpuStorage::F32(o)) => {
                Ok((CpuStorage::F32(merge(&o, d)), self.merged_shape()))
            }
            (Heads::Merged, CpuStorage::F64(o)) => {
                Ok((CpuStorage::F64(merge(&o, d)), self.merged_shape()))
            }
            (Heads::Merged, other) => validate::unsupported_cpu_dtype(OP, &other),
        }
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
        let (d_out, res) = (self.split(grad_res)?, self.split(res)?);
        let v_rows = v.contiguous()?;
        let args = [q, k, &v_rows, &res, &d_out];
        match q.dtype() {
            DType::F32 => self.grads::<f32>(args, &lse, want),
            DType::F64 => self.grads::<f64>(args, &lse, want),
            dt => candle_core::bail!("{OP}: backward has no kernel for {dt:?}"),
        }
    }
}
