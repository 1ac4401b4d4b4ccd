//! CPU backward kernel of the fused causal attention (the FlashAttention-2 backward): scores
//! are recomputed tile by tile from q, k and the saved log-sum-exp, with
//! `D_i = dO_i . O_i`, `P = e^(S - lse)`, `dP = dO V^T`, `dS = P * (dP - D)`.
//! Two passes, each owning its outputs (no atomics, deterministic): dK/dV per (batch, kv head,
//! key tile), summed over the query heads of the group; then dQ per (batch, head, query tile).

use multiversion::multiversion;
use std::ops::Range;

use rayon::prelude::*;

use super::attention_fwd::{span_of, Dims, HeadView, Tiles};
use super::attention_tile::{TransposedTile, ROWS};
use super::attention_visibility::Visibility;
use super::cpu_math::{axpy, axpy_terms, row_dot, Real};

/// What the backward pass reads: the forward inputs, its output and log-sum-exp, and the
/// upstream gradient (all flat, in the layouts of [`Dims`]; `lse` is `[b, nh, t]`).
pub(crate) struct Saved<'a, T> {
    pub q: &'a [T],
    pub k: &'a [T],
    pub v: &'a [T],
    pub out: &'a [T],
    pub lse: &'a [T],
    pub d_out: &'a [T],
}

/// One query head with its backward inputs: `d_out` `[t, hd]`, `lse` and `delta` `[t]`.
struct GradView<'a, T> {
    head: HeadView<'a, T>,
    d_out: &'a [T],
    lse: &'a [T],
    delta: &'a [T],
}

impl<'a, T: Real> GradView<'a, T> {
    fn new(x: &Saved<'a, T>, delta: &'a [T], d: Dims, bh: usize, vis: &'a Visibility) -> Self {
        let (n, t) = (d.t * d.hd, d.t);
        GradView {
            head: d.head((x.q, x.k, x.v), bh, vis),
            d_out: &x.d_out[bh * n..(bh + 1) * n],
            lse: &x.lse[bh * t..(bh + 1) * t],
            delta: &delta[bh * t..(bh + 1) * t],
        }
    }

    /// For the query rows `rows` (at most [`ROWS`]) against the keys of a tile (`kt`, `vt`:
    /// its K and V rows): writes `P_ij` into `p` and `dS_ij` into `ds`, row `r` of the group in
    /// block `r` of each (`p.len() / ROWS` entries per row) at tile-local indices, and returns
    /// each row's range (empty for a dead row and past the group's end).
    #[inline(always)]
    fn group_p_ds(
        &self,
        (kt, vt): (&TransposedTile<T>, &TransposedTile<T>),
        rows: Range<usize>,
        p: &mut [T],
        ds: &mut [T],
    ) -> [Range<usize>; ROWS] {
        let h = &self.head;
        let mut locals = h.group_scores(kt, rows.clone(), p);
        for (r, local) in locals.iter_mut().enumerate() {
            if rows.start + r < rows.end && !h.vis.row_sees_any(h.b, rows.start + r) {
                *local = 0..0;
            }
        }
        let Some(span) = span_of(&locals) else {
            return locals;
        };
        let d_out = std::array::from_fn(|r| h.row(self.d_out, (rows.start + r).min(rows.end - 1)));
        vt.dots_rows(d_out, T::ONE, span, ds);
        let w = p.len() / ROWS;
        let blocks = p.chunks_exact_mut(w).zip(ds.chunks_exact_mut(w));
        let live = locals.iter().zip(blocks).enumerate();
        for (r, (local, (p, ds))) in live.filter(|(_, (l, _))| !l.is_empty()) {
            let (lse, delta) = (self.lse[rows.start + r], self.delta[rows.start + r]);
            for (p, ds) in p[local.clone()].iter_mut().zip(&mut ds[local.clone()]) {
                *p = (*p - lse).exp();
                *ds = *p * (*ds - delta);
            }
        }
        locals
    }
}

/// Gradients in the layouts of q (`dq`) and k/v (`dkv = (dk, dv)`); `None` when not asked for.
pub(crate) struct Grads<T> {
    pub dq: Option<Vec<T>>,
    pub dkv: Option<(Vec<T>, Vec<T>)>,
}

/// `dq` (when `want_q`) and `(dk, dv)` (when `want_kv`).
pub(crate) fn backward<T: Real>(
    x: &Saved<T>,
    d: Dims,
    vis: &Visibility,
    tiles: Tiles,
    (want_q, want_kv): (bool, bool),
) -> Grads<T> {
    let delta = row_deltas(x.d_out, x.out, d.hd);
    Grads {
        dq: want_q.then(|| backward_dq(x, &delta, d, vis, tiles)),
        dkv: want_kv.then(|| backward_dkv(x, &delta, d, vis, tiles)),
    }
}

/// `D_i = dO_i . O_i` for every query row, `[b, nh, t]`.
fn row_deltas<T: Real>(d_out: &[T], out: &[T], hd: usize) -> Vec<T> {
    if hd == 0 {
        return Vec::new();
    }
    d_out
        .par_chunks(hd)
        .zip(out.par_chunks(hd))
        .map(|(g, o)| row_dot(g, o))
        .collect()
}

fn backward_dq<T: Real>(
    x: &Saved<T>,
    delta: &[T],
    d: Dims,
    vis: &Visibility,
    tiles: Tiles,
) -> Vec<T> {
    let mut dq = vec![T::ZERO; x.q.len()];
    if dq.is_empty() {
        return dq;
    }
    let hd = d.hd;
    dq.par_chunks_mut(d.t * hd)
        .enumerate()
        .for_each(|(bh, dq)| {
            let g = GradView::new(x, delta, d, bh, vis);
            dq.par_chunks_mut(tiles.q * hd)
                .enumerate()
                .for_each(|(qb, dq)| dq_block(&g, tiles.k, qb * tiles.q, dq));
        });
    dq
}

/// `dq_i = hd^-0.5 sum_j dS_ij k_j` for query rows `i0..i0 + dq.len() / hd`; dead rows get 0
/// (their scores are constants).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn dq_block<T: Real>(g: &GradView<T>, tk: usize, i0: usize, dq: &mut [T]) {
    let h = &g.head;
    let rows = dq.len() / h.hd;
    let (mut kt, mut vt) = (TransposedTile::new(h.hd, tk), TransposedTile::new(h.hd, tk));
    let (mut p, mut ds) = (vec![T::ZERO; ROWS * tk], vec![T::ZERO; ROWS * tk]);
    let mut j0 = h.vis.key_range(h.b, i0).start;
    while j0 < i0 + rows {
        let keys = j0..(j0 + tk).min(i0 + rows);
        kt.load(h.k, keys.clone());
        vt.load(h.v, keys.clone());
        for (n, dq) in dq.chunks_mut(ROWS * h.hd).enumerate() {
            let first = i0 + n * ROWS;
            let group = first..first + dq.len() / h.hd;
            let locals = g.group_p_ds((&kt, &vt), group, &mut p, &mut ds);
            let blocks = p.chunks_exact(tk).zip(ds.chunks_exact(tk));
            for ((dq_i, local), (p, ds)) in dq.chunks_mut(h.hd).zip(locals).zip(blocks) {
                let terms = local.filter(|&c| p[c] != T::ZERO);
                axpy_terms(dq_i, terms.map(|c| (ds[c] * h.scale, h.row(h.k, j0 + c))));
            }
        }
        j0 = keys.end;
    }
}

fn backward_dkv<T: Real>(
    x: &Saved<T>,
    delta: &[T],
    d: Dims,
    vis: &Visibility,
    tiles: Tiles,
) -> (Vec<T>, Vec<T>) {
    let mut dk = vec![T::ZERO; x.k.len()];
    let mut dv = vec![T::ZERO; x.v.len()];
    if dk.is_empty() {
        return (dk, dv);
    }
    let hd = d.hd;
    let dead: Vec<Vec<usize>> = (0..d.b).map(|b| vis.dead_rows(b)).collect();
    dk.par_chunks_mut(d.t * hd)
        .zip(dv.par_chunks_mut(d.t * hd))
        .enumerate()
        .for_each(|(bg, (dk, dv))| {
            let (b, kv) = (bg / d.nkv, bg % d.nkv);
            dk.par_chunks_mut(tiles.k * hd)
                .zip(dv.par_chunks_mut(tiles.k * hd))
                .enumerate()
                .for_each(|(kb, (dk, dv))| {
                    let keys = kb * tiles.k..kb * tiles.k + dk.len() / hd;
                    let first = GradView::new(x, delta, d, b * d.nh + kv * d.n_rep(), vis);
                    let mut kt = TransposedTile::new(hd, keys.len());
                    let mut vt = TransposedTile::new(hd, keys.len());
                    kt.load(first.head.k, keys.clone());
                    vt.load(first.head.v, keys);
                    for r in 0..d.n_rep() {
                        let g = GradView::new(x, delta, d, b * d.nh + kv * d.n_rep() + r, vis);
                        dkv_block(&g, (&kt, &vt), dk, dv);
                        dead_rows_dv(&g, &dead[b], dv);
                    }
                });
        });
    (dk, dv)
}

/// Adds one query head's `dv_j += P_ij dO_i` and `dk_j += hd^-0.5 dS_ij q_i` for the key
/// tile `kt`/`vt` (`dk`, `dv`: `[tile width, hd]`) over the live query rows that see it.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn dkv_block<T: Real>(
    g: &GradView<T>,
    tiles: (&TransposedTile<T>, &TransposedTile<T>),
    dk: &mut [T],
    dv: &mut [T],
) {
    let h = &g.head;
    let hd = h.hd;
    let width = tiles.0.keys().len();
    let (mut p, mut ds) = (vec![T::ZERO; ROWS * width], vec![T::ZERO; ROWS * width]);
    let queries = h.vis.query_range_for(h.b, tiles.0.keys());
    for first in queries.clone().step_by(ROWS) {
        let group = first..(first + ROWS).min(queries.end);
        let locals = g.group_p_ds(tiles, group.clone(), &mut p, &mut ds);
        let Some(span) = span_of(&locals) else {
            continue;
        };
        // Key by key, the group's rows in order: each dk/dv row gets its terms in the order
        // of the queries, as one axpy per query would add them.
        for c in span {
            let live = |r: &usize| locals[*r].contains(&c) && p[r * width + c] != T::ZERO;
            let rows = (0..group.len()).filter(live);
            let r = c * hd;
            let dv_terms = rows
                .clone()
                .map(|r| (p[r * width + c], h.row(g.d_out, first + r)));
            axpy_terms(&mut dv[r..r + hd], dv_terms);
            let dk_terms = rows.map(|r| (ds[r * width + c] * h.scale, h.row(h.q, first + r)));
            axpy_terms(&mut dk[r..r + hd], dk_terms);
        }
    }
}

/// A dead query row averages all `t` values with weight `1/t` each and constant scores:
/// `dv_j += dO_i / t` for every key, nothing for dk (`dead`: that batch row's dead queries).
fn dead_rows_dv<T: Real>(g: &GradView<T>, dead: &[usize], dv: &mut [T]) {
    if dead.is_empty() {
        return;
    }
    let h = &g.head;
    let mut sum = vec![T::ZERO; h.hd];
    for &i in dead {
        axpy(&mut sum, T::ONE, h.row(g.d_out, i));
    }
    let w = T::ONE / T::from_usize(h.t);
    for dv_j in dv.chunks_mut(h.hd) {
        axpy(dv_j, w, &sum);
    }
}
