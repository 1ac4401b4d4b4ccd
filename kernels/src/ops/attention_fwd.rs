//! CPU forward kernel of the fused causal attention: tiled over query and key blocks with an
//! online softmax (running max and sum per query row), so the `[T, T]` score matrix of a head
//! is never materialised. Also the shape and per-head views the backward kernel shares.
//! Plain slices in, plain vectors out; argument checks live in `attention.rs`.

use multiversion::multiversion;
use std::ops::Range;

use rayon::prelude::*;

use super::attention_tile::{TransposedTile, ROWS};
use super::attention_visibility::Visibility;
use super::cpu_math::{axpy, axpy_terms, row_max, scale_in_place, Real};

/// Shapes of one call: q `[b, nh, t, hd]`, k and v `[b, nkv, t, hd]` (`nkv` divides `nh`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub b: usize,
    pub nh: usize,
    pub nkv: usize,
    pub t: usize,
    pub hd: usize,
}

impl Dims {
    /// Query heads per kv head.
    pub(crate) fn n_rep(&self) -> usize {
        self.nh / self.nkv
    }

    /// `(q, k, v)` rows `[t, hd]` of flat query head `bh = b * nh + h` and its kv head
    /// (`h / n_rep`, GQA).
    pub(crate) fn head<'a, T: Real>(
        &self,
        (q, k, v): (&'a [T], &'a [T], &'a [T]),
        bh: usize,
        vis: &'a Visibility,
    ) -> HeadView<'a, T> {
        let (b, h) = (bh / self.nh, bh % self.nh);
        let n = self.t * self.hd;
        let kv = b * self.nkv + h / self.n_rep();
        HeadView {
            q: &q[bh * n..(bh + 1) * n],
            k: &k[kv * n..(kv + 1) * n],
            v: &v[kv * n..(kv + 1) * n],
            valid: vis.valid_keys(b),
            vis,
            b,
            t: self.t,
            hd: self.hd,
            scale: T::from_f64((self.hd as f64).powf(-0.5)),
        }
    }
}

/// Query and key tile heights in rows (the unit of parallel work and of cache reuse).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tiles {
    pub q: usize,
    pub k: usize,
}

impl Tiles {
    /// 64 x 64: a key tile of K and V at head dim 128 is 64 KiB of f32, an L2-sized working set.
    pub(crate) const DEFAULT: Tiles = Tiles { q: 64, k: 64 };
}

/// One query head and the kv head it reads, as `[t, hd]` row-major slices.
pub(crate) struct HeadView<'a, T> {
    pub q: &'a [T],
    pub k: &'a [T],
    pub v: &'a [T],
    valid: Option<&'a [bool]>,
    pub vis: &'a Visibility,
    /// Batch row.
    pub b: usize,
    pub t: usize,
    pub hd: usize,
    /// `hd^-0.5`.
    pub scale: T,
}

impl<T: Real> HeadView<'_, T> {
    #[inline]
    pub(crate) fn row<'s>(&self, x: &'s [T], i: usize) -> &'s [T] {
        &x[i * self.hd..(i + 1) * self.hd]
    }

    /// Scaled scores `hd^-0.5 q_i . k_j` of the query rows `rows` (at most [`ROWS`]) against
    /// the keys of `tile` each may see: row `r` of the group in `scores[r * w..(r + 1) * w]`
    /// (`w = scores.len() / ROWS`) at tile-local indices, padded keys at `-inf`. Returns each
    /// row's local range written (empty when the row sees none of the tile, and past the
    /// group's end).
    pub(crate) fn group_scores(
        &self,
        tile: &TransposedTile<T>,
        rows: Range<usize>,
        scores: &mut [T],
    ) -> [Range<usize>; ROWS] {
        let j0 = tile.keys().start;
        let locals: [Range<usize>; ROWS] = std::array::from_fn(|r| {
            let i = rows.start + r;
            if i >= rows.end {
                return 0..0;
            }
            let keys = self.vis.key_range_in(self.b, i, tile.keys());
            match keys.is_empty() {
                true => 0..0,
                false => keys.start - j0..keys.end - j0,
            }
        });
        let Some(span) = span_of(&locals) else {
            return locals;
        };
        let xs = std::array::from_fn(|r| self.row(self.q, (rows.start + r).min(rows.end - 1)));
        tile.dots_rows(xs, self.scale, span, scores);
        if let Some(valid) = self.valid {
            let w = scores.len() / ROWS;
            for (local, scores) in locals.iter().zip(scores.chunks_exact_mut(w)) {
                let keys = &valid[j0 + local.start..j0 + local.end];
                for (s, &ok) in scores[local.clone()].iter_mut().zip(keys) {
                    if !ok {
                        *s = T::NEG_INFINITY;
                    }
                }
            }
        }
        locals
    }
}

/// The smallest range holding every non-empty range of `locals`, or `None` when all are empty.
pub(crate) fn span_of(locals: &[Range<usize>]) -> Option<Range<usize>> {
    let live = locals.iter().filter(|l| !l.is_empty());
    let start = live.clone().map(|l| l.start).min()?;
    let end = live.map(|l| l.end).max()?;
    Some(start..end)
}

/// Attention output `[b, nh, t, hd]` and per-row log-sum-exp of the scaled scores
/// `[b, nh, t]` (nats; `ln t` for a dead row, whose output is the mean of all `t` values).
pub(crate) fn forward<T: Real>(
    qkv: (&[T], &[T], &[T]),
    d: Dims,
    vis: &Visibility,
    tiles: Tiles,
) -> (Vec<T>, Vec<T>) {
    forward_by_blocks(qkv, d, vis, tiles, forward_block)
}

/// The forward's outputs `[b, nh, t, hd]` and `[b, nh, t]`, filled in parallel over heads and
/// blocks of `tiles.q` query rows by `block(head, key tile height, first row, out, lse)`.
pub(crate) fn forward_by_blocks<T: Real>(
    qkv: (&[T], &[T], &[T]),
    d: Dims,
    vis: &Visibility,
    tiles: Tiles,
    block: impl Fn(&HeadView<T>, usize, usize, &mut [T], &mut [T]) + Sync,
) -> (Vec<T>, Vec<T>) {
    let mut out = vec![T::ZERO; qkv.0.len()];
    let mut lse = vec![T::ZERO; d.b * d.nh * d.t];
    if out.is_empty() {
        return (out, lse);
    }
    let (n, hd) = (d.t * d.hd, d.hd);
    out.par_chunks_mut(n)
        .zip(lse.par_chunks_mut(d.t))
        .enumerate()
        .for_each(|(bh, (out, lse))| {
            let head = d.head(qkv, bh, vis);
            out.par_chunks_mut(tiles.q * hd)
                .zip(lse.par_chunks_mut(tiles.q))
                .enumerate()
                .for_each(|(qb, (out, lse))| {
                    block(&head, tiles.k, qb * tiles.q, out, lse);
                });
        });
    (out, lse)
}

/// Running softmax state of one query row.
struct RowState<T> {
    max: T,
    sum: T,
}

/// Query rows `i0..i0 + lse.len()` of one head: `out` `[rows, hd]`, `lse` `[rows]`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn forward_block<T: Real>(h: &HeadView<T>, tk: usize, i0: usize, out: &mut [T], lse: &mut [T]) {
    let (rows, hd) = (lse.len(), h.hd);
    let mut state: Vec<RowState<T>> = (0..rows)
        .map(|_| RowState {
            max: T::NEG_INFINITY,
            sum: T::ZERO,
        })
        .collect();
    let mut scores = vec![T::ZERO; ROWS * tk];
    let mut tile = TransposedTile::new(hd, tk);
    // Key ranges only grow with i: the block's keys run from the first row's lowest key to
    // its last row (causal).
    let (keys_lo, keys_hi) = (h.vis.key_range(h.b, i0).start, i0 + rows);
    let mut j0 = keys_lo;
    while j0 < keys_hi {
        tile.load(h.k, j0..(j0 + tk).min(keys_hi));
        let groups = state.chunks_mut(ROWS).zip(out.chunks_mut(ROWS * hd));
        for (g, (states, accs)) in groups.enumerate() {
            let first = i0 + g * ROWS;
            let locals = h.group_scores(&tile, first..first + states.len(), &mut scores);
            let rows = states.iter_mut().zip(accs.chunks_mut(hd));
            for ((st, acc), (local, s)) in rows.zip(locals.into_iter().zip(scores.chunks_mut(tk))) {
                if !local.is_empty() {
                    online_update(h, j0 + local.start, &mut s[local], st, acc);
                }
            }
        }
        j0 = tile.keys().end;
    }
    for (r, ((st, acc), lse)) in state.iter().zip(out.chunks_mut(hd)).zip(lse).enumerate() {
        *lse = finish_row(h, i0 + r, st, acc);
    }
}

/// Folds the scores `s` of keys `j0..j0 + s.len()` into a row: rescales the unnormalised
/// output `acc` `[hd]` to the new running max and adds `e^(s_j - max) v_j` (`s` is
/// overwritten with those weights).
#[inline(always)]
fn online_update<T: Real>(
    h: &HeadView<T>,
    j0: usize,
    s: &mut [T],
    st: &mut RowState<T>,
    acc: &mut [T],
) {
    let block_max = row_max(s);
    if block_max == T::NEG_INFINITY {
        return;
    }
    if block_max > st.max {
        let alpha = (st.max - block_max).exp();
        st.sum *= alpha;
        scale_in_place(acc, alpha);
        st.max = block_max;
    }
    let m = st.max;
    for x in s.iter_mut() {
        *x = (*x - m).exp();
    }
    for &p in s.iter().filter(|&&p| p != T::ZERO) {
        st.sum += p;
    }
    let terms = s.iter().enumerate().filter(|(_, &p)| p != T::ZERO);
    axpy_terms(acc, terms.map(|(c, &p)| (p, h.row(h.v, j0 + c))));
}

/// Normalises row `i`'s output and returns its log-sum-exp. A dead row (no visible key)
/// becomes the plain mean of all `t` values, as a softmax over `t` equal scores would give.
#[inline(always)]
fn finish_row<T: Real>(h: &HeadView<T>, i: usize, st: &RowState<T>, acc: &mut [T]) -> T {
    if h.vis.row_sees_any(h.b, i) {
        scale_in_place(acc, T::ONE / st.sum);
        return st.max + st.sum.ln();
    }
    acc.fill(T::ZERO);
    for j in 0..h.t {
        axpy(acc, T::ONE, h.row(h.v, j));
    }
    let t = T::from_usize(h.t);
    scale_in_place(acc, T::ONE / t);
    t.ln()
}
