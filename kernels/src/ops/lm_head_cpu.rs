//! CPU kernels of the fused LM head (`lm_head_logprobs`): token log-probs and entropy of
//! `softmax(scale · h Wᵀ)` computed block by block, so the `[N, V]` logits never exist.
//!
//! * Forward: rayon over blocks of rows; per block, the vocabulary is swept in chunks with an
//!   online log-sum-exp (running max, sum of exponentials and their logit-weighted sum).
//!   Under a top-k / top-p truncation a block's rows are built whole instead, since the kept
//!   set depends on the whole row (`truncation.rs`).
//! * Backward: the logits of each (row block, vocabulary chunk) are read back from the
//!   forward's kept logits (`lm_head_kept.rs`, freed group by group) when it kept them, else
//!   recomputed; turned into `dz` in place,
//!   and multiplied into the gradients of `h` and `W`. Rayon runs over
//!   vocabulary chunks, so each task owns its rows of `dW`; `dh` is summed over tasks.
//!   Rows whose upstream gradients are both zero (masked positions) are skipped.
//!
//! Plain slices only; shapes and dtypes are checked by the op in `lm_head.rs`.

use multiversion::multiversion;
use rayon::prelude::*;

use super::cpu_math::{row_exp_sums, row_max, Real};
use super::lm_head_bf16::{round_in_place, Bf16Head, HiddenRows, PackedHidden};
use super::lm_head_kept::{vocab_group_width, KeptGroup, KeptLogits, VOCAB_CHUNK};
use super::truncation::{kept_threshold, Truncation};
use crate::matmul::{gemm_rm, MatRef};

/// Rows per forward task at most (`ROW_BLOCK × VOCAB_CHUNK` f32 logits are 512 KiB, an L2's
/// share; each chunk's weights are packed once per block, so taller blocks pack less per
/// product); see [`forward_rows_per_task`].
const ROW_BLOCK: usize = 256;
/// Rows per forward task under a truncation, where a task holds its rows' whole logits.
const TRUNCATED_ROW_BLOCK: usize = 128;
/// Rows processed per backward pass over the vocabulary; bounds the per-task `dh` buffers.
const BACKWARD_ROWS: usize = 8192;
/// Rows per backward GEMM against one vocabulary chunk (`BACKWARD_BLOCK × VOCAB_CHUNK` floats
/// of `∂z` per task, 2 MiB in f32): tall enough that packing the chunk's weights, and
/// reading and writing its `∂W` rows, cost little beside the products (at 128 rows the chunk's
/// weights were packed twice and its 1 MiB of `∂W` read and written once per 128 rows).
const BACKWARD_BLOCK: usize = 1024;

/// Shapes of one fused head call: `n` rows of `hidden` features, `vocab` outputs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadDims {
    pub n: usize,
    pub hidden: usize,
    pub vocab: usize,
}

/// Online softmax statistics of one row: running max `m`, `s = Σ e^(z-m)`,
/// `w = Σ e^(z-m)(z-m)`.
#[derive(Clone, Copy)]
struct RowStats<T> {
    m: T,
    s: T,
    w: T,
}

impl<T: Real> RowStats<T> {
    fn new() -> Self {
        Self {
            m: T::NEG_INFINITY,
            s: T::ZERO,
            w: T::ZERO,
        }
    }

    /// Folds one chunk of the row's logits in.
    #[inline(always)]
    fn absorb(&mut self, chunk: &[T]) {
        let mc = row_max(chunk);
        let (sc, wc) = row_exp_sums(chunk, mc, true);
        if self.s == T::ZERO {
            *self = Self {
                m: mc,
                s: sc,
                w: wc,
            };
            return;
        }
        let m = if mc > self.m { mc } else { self.m };
        let (da, db) = (self.m - m, mc - m);
        let (ea, eb) = (da.exp(), db.exp());
        self.w = ea * (self.w + self.s * da) + eb * (wc + sc * db);
        self.s = ea * self.s + eb * sc;
        self.m = m;
    }

    /// `(logsumexp, entropy)` of the whole row.
    fn finish(&self) -> (T, T) {
        let lse = self.m + self.s.ln();
        (lse, self.s.ln() - self.w / self.s)
    }
}

/// Columns of the forward output: log-prob, entropy, logsumexp, kept threshold.
pub(crate) const COLS: usize = 4;

/// Forward: `[n, 4]` rows of `(log p(target), entropy, logsumexp, τ)` of `softmax(scale · h
/// Wᵀ)` restricted to the tempered logits `≥ τ` (see `truncation.rs`; `τ = -inf` when `cut`
/// keeps everything), and, with `keep` on an untruncated head whose logits fit
/// [`KeptLogits::room`], the scaled logits for the backward pass.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward<T: Real + 'static>(
    h: &[T],
    w: &[T],
    targets: &[u32],
    d: HeadDims,
    scale: T,
    cut: Truncation,
    bf16: Option<&Bf16Head>,
    keep: bool,
) -> (Vec<T>, Option<KeptLogits<T>>) {
    // The hidden states rounded once for every vocabulary chunk's products, where those
    // do not round them themselves.
    let rounded = bf16.filter(|head| !head.rounds_operands()).map(|_| {
        let mut copy = h.to_vec();
        round_in_place(&mut copy);
        copy
    });
    let h = rounded.as_deref().unwrap_or(h);
    let mut out = vec![T::ZERO; d.n * COLS];
    let truncated = !cut.is_off(d.vocab);
    let mut kept = match keep && !truncated {
        true => KeptLogits::room(d.n, d.vocab),
        false => None,
    };
    let rows = forward_rows_per_task(d.n, truncated);
    let blocks = out
        .par_chunks_mut(rows * COLS)
        .zip(h.par_chunks(rows * d.hidden))
        .zip(targets.par_chunks(rows));
    match kept.as_mut() {
        Some(kept) => {
            let width = kept.group_width();
            blocks.zip(kept.row_blocks(rows).into_par_iter()).for_each(
                |(((out, hb), tb), mut kept)| {
                    let kept = Some((kept.as_mut_slice(), width));
                    forward_block(out, hb, tb, w, d, scale, bf16, kept)
                },
            )
        }
        None => blocks.for_each(|((out, hb), tb)| {
            if truncated {
                forward_block_truncated(out, hb, tb, w, d, (scale, cut), bf16)
            } else {
                forward_block(out, hb, tb, w, d, scale, bf16, None)
            }
        }),
    }
    (out, kept)
}

/// Rows per forward task for `n` rows: [`ROW_BLOCK`] (or [`TRUNCATED_ROW_BLOCK`]), lowered
/// to a multiple of 16 that still gives every thread two tasks when `n` is short.
fn forward_rows_per_task(n: usize, truncated: bool) -> usize {
    let most = if truncated {
        TRUNCATED_ROW_BLOCK
    } else {
        ROW_BLOCK
    };
    let share = n
        .div_ceil(2 * rayon::current_num_threads())
        .next_multiple_of(16);
    share.clamp(16, most)
}

/// One block of rows, untruncated; `kept` receives the logits when given: this block's
/// rows of each vocabulary group (`[rows, group width]` each) and the groups' width.
#[allow(clippy::too_many_arguments)]
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn forward_block<T: Real + 'static>(
    out: &mut [T],
    hb: &[T],
    targets: &[u32],
    w: &[T],
    d: HeadDims,
    scale: T,
    bf16: Option<&Bf16Head>,
    mut kept: Option<(&mut [&mut [T]], usize)>,
) {
    let rows = targets.len();
    let mut z = vec![T::ZERO; rows * VOCAB_CHUNK];
    let mut stats = vec![RowStats::<T>::new(); rows];
    let mut target_logit = vec![T::ZERO; rows];
    let lhs = MatRef::row_major(hb, rows, d.hidden);
    for c0 in (0..d.vocab).step_by(VOCAB_CHUNK) {
        let cw = VOCAB_CHUNK.min(d.vocab - c0);
        match bf16 {
            Some(head) => head.logits(hb, rows, (c0, cw), &mut z[..rows * cw], scale),
            None => {
                let wc = MatRef::row_major(&w[c0 * d.hidden..(c0 + cw) * d.hidden], cw, d.hidden);
                gemm_rm(&mut z, lhs, wc.t(), scale, false, T::ONE);
            }
        }
        for (r, row) in z[..rows * cw].chunks(cw).enumerate() {
            if let Some((groups, width)) = kept.as_mut() {
                let (g, at) = (c0 / *width, c0 % *width);
                let cols = (*width).min(d.vocab - g * *width);
                groups[g][r * cols + at..r * cols + at + cw].copy_from_slice(row);
            }
            stats[r].absorb(row);
            let y = targets[r] as usize;
            if (c0..c0 + cw).contains(&y) {
                target_logit[r] = row[y - c0];
            }
        }
    }
    for (r, o) in out.chunks_mut(COLS).enumerate() {
        let (lse, ent) = stats[r].finish();
        o[0] = target_logit[r] - lse;
        o[1] = ent;
        o[2] = lse;
        o[3] = T::NEG_INFINITY;
    }
}

/// [`forward_block`] under a truncation: each row's logits are built whole
/// (`TRUNCATED_ROW_BLOCK × V` floats at once), its kept threshold is found, lowered to the target's logit when the
/// target fell below it, and only kept logits enter the softmax.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn forward_block_truncated<T: Real + 'static>(
    out: &mut [T],
    hb: &[T],
    targets: &[u32],
    w: &[T],
    d: HeadDims,
    (scale, cut): (T, Truncation),
    bf16: Option<&Bf16Head>,
) {
    let rows = targets.len();
    let mut z = vec![T::ZERO; rows * d.vocab];
    match bf16 {
        Some(head) => head.logits(hb, rows, (0, d.vocab), &mut z, scale),
        None => {
            let lhs = MatRef::row_major(hb, rows, d.hidden);
            let wm = MatRef::row_major(w, d.vocab, d.hidden);
            gemm_rm(&mut z, lhs, wm.t(), scale, false, T::ONE);
        }
    }
    let mut kept = Vec::with_capacity(d.vocab);
    for ((row, o), &y) in z.chunks(d.vocab).zip(out.chunks_mut(COLS)).zip(targets) {
        let zy = row[y as usize];
        let tau = kept_threshold(row, cut);
        let tau = if zy < tau { zy } else { tau };
        kept.clear();
        kept.extend(row.iter().copied().filter(|&x| x >= tau));
        let mut stats = RowStats::<T>::new();
        stats.absorb(&kept);
        let (lse, ent) = stats.finish();
        o[0] = zy - lse;
        o[1] = ent;
        o[2] = lse;
        o[3] = tau;
    }
}

/// Per-row inputs of the backward pass (only rows with a non-zero upstream gradient).
pub(crate) struct BackwardRows<T> {
    /// Indices of the rows into `0..n`.
    pub index: Vec<usize>,
    /// Their hidden states, row-major `[rows, hidden]`.
    pub hidden: Vec<T>,
    /// Target id, logsumexp, kept threshold, entropy, d loss / d logprob, d loss / d entropy
    /// per row.
    pub target: Vec<u32>,
    pub lse: Vec<T>,
    pub tau: Vec<T>,
    pub entropy: Vec<T>,
    pub g_logprob: Vec<T>,
    pub g_entropy: Vec<T>,
}

impl<T: Real> BackwardRows<T> {
    /// Keeps the rows whose upstream gradients are not both zero. `res` and `grad` are the
    /// forward output and its gradient, `[n, COLS]` each.
    pub fn select(h: &[T], targets: &[u32], res: &[T], grad: &[T], hidden: usize) -> Self {
        let mut rows = Self {
            index: Vec::new(),
            hidden: Vec::new(),
            target: Vec::new(),
            lse: Vec::new(),
            tau: Vec::new(),
            entropy: Vec::new(),
            g_logprob: Vec::new(),
            g_entropy: Vec::new(),
        };
        for (i, (r, g)) in res.chunks(COLS).zip(grad.chunks(COLS)).enumerate() {
            if g[0] == T::ZERO && g[1] == T::ZERO {
                continue;
            }
            rows.index.push(i);
            rows.hidden
                .extend_from_slice(&h[i * hidden..(i + 1) * hidden]);
            rows.target.push(targets[i]);
            rows.lse.push(r[2]);
            rows.tau.push(r[3]);
            rows.entropy.push(r[1]);
            rows.g_logprob.push(g[0]);
            rows.g_entropy.push(g[1]);
        }
        rows
    }

    fn len(&self) -> usize {
        self.index.len()
    }
}

/// Backward: `dh [n, hidden]` followed by `dW [vocab, hidden]` in one buffer (the op's one
/// output: joining two buffers afterwards would hold `dW` twice for a moment) for the
/// selected rows; with `want_dw = false` (a frozen head) `dW` is absent and its products
/// are skipped. `cache` holds the forward's logits, when it kept them; each vocabulary
/// group's are freed once its task has read them for the last time, while `dW`'s pages are
/// first touched group by group by the tasks that own them, so the two do not both peak.
/// Under a bf16 head whose products do not round their operands, the rows' hidden states
/// are rounded here, once for every chunk.
pub(crate) fn backward<T: Real + 'static>(
    mut rows: BackwardRows<T>,
    (w, cache): (&[T], Option<&KeptLogits<T>>),
    d: HeadDims,
    (scale, want_dw): (T, bool),
    bf16: Option<&Bf16Head>,
) -> Vec<T> {
    if bf16.is_some_and(|head| !head.rounds_operands()) {
        round_in_place(&mut rows.hidden);
    }
    let rows = &rows;
    let dw_len = if want_dw { d.vocab * d.hidden } else { 0 };
    let mut out = vec![T::ZERO; d.n * d.hidden + dw_len];
    let (dh, dw) = out.split_at_mut(d.n * d.hidden);
    crate::host_memory::touch_pages(dh, T::ZERO);
    for r0 in (0..rows.len()).step_by(BACKWARD_ROWS) {
        let r1 = (r0 + BACKWARD_ROWS).min(rows.len());
        let dw_all = want_dw.then_some(&mut *dw);
        let source = Source { w, cache, bf16 };
        let span = Span {
            rows: r0..r1,
            first: r0 == 0,
            last: r1 == rows.len(),
        };
        let part = backward_rows(rows, span, (source, dw_all), d, scale);
        for (k, &i) in rows.index[r0..r1].iter().enumerate() {
            let src = &part[k * d.hidden..(k + 1) * d.hidden];
            for (o, &v) in dh[i * d.hidden..(i + 1) * d.hidden].iter_mut().zip(src) {
                *o += v;
            }
        }
    }
    out
}

/// The selected rows one pass over the vocabulary covers, and whether it is the first pass
/// (which first touches `dW`) and the last (after which the kept logits are freed).
struct Span {
    rows: std::ops::Range<usize>,
    first: bool,
    last: bool,
}

/// One pass over the vocabulary for rows `span` of `rows`: accumulates into `dw` (when
/// given) and returns `dh` of those rows, row-major `[span.len(), hidden]`.
///
/// The vocabulary is cut into one contiguous group of chunks per task (twice the rayon
/// threads, for balance), so there are that many `dh` partial sums, not one per chunk.
fn backward_rows<T: Real + 'static>(
    rows: &BackwardRows<T>,
    pass: Span,
    (source, dw): (Source<'_, T>, Option<&mut [T]>),
    d: HeadDims,
    scale: T,
) -> Vec<T> {
    let Source { w, cache, bf16 } = source;
    let span = pass.rows.clone();
    let len = span.len() * d.hidden;
    // The hidden states of each row block, packed once for the `∂W` products of every chunk.
    let packed_hidden: Vec<Option<PackedHidden>> = match (bf16, dw.is_some()) {
        (Some(head), true) => (span.start..span.end)
            .step_by(BACKWARD_BLOCK)
            .map(|b0| {
                let b1 = (b0 + BACKWARD_BLOCK).min(span.end);
                head.pack_hidden(&rows.hidden[b0 * d.hidden..b1 * d.hidden], b1 - b0)
            })
            .collect(),
        _ => Vec::new(),
    };
    let group_rows = match cache {
        Some(kept) => kept.group_width(),
        None => vocab_group_width(d.vocab),
    };
    let run_group = |g: usize, mut dw_group: Option<&mut [T]>| {
        if let (true, Some(dw)) = (pass.first, dw_group.as_deref_mut()) {
            crate::host_memory::touch_pages(dw, T::ZERO);
        }
        let kept = cache.and_then(|c| c.group(g));
        let mut dh = vec![T::ZERO; len];
        let first = g * group_rows;
        let end = (first + group_rows).min(d.vocab);
        for c0 in (first..end).step_by(VOCAB_CHUNK) {
            let cw = VOCAB_CHUNK.min(end - c0);
            let wc = MatRef::row_major(&w[c0 * d.hidden..(c0 + cw) * d.hidden], cw, d.hidden);
            let at = (c0 - first) * d.hidden..(c0 - first + cw) * d.hidden;
            let dw_chunk = dw_group.as_deref_mut().map(|g| &mut g[at]);
            let chunk = Chunk {
                wc,
                c0,
                bf16,
                cache: kept.as_ref(),
                packed_hidden: &packed_hidden,
            };
            backward_chunk(rows, span.clone(), chunk, dw_chunk, &mut dh, d, scale);
        }
        drop(kept);
        if let (true, Some(cache)) = (pass.last, cache) {
            cache.release(g);
        }
        dh
    };
    let partials: Vec<Vec<T>> = match dw {
        Some(dw) => dw
            .par_chunks_mut(group_rows * d.hidden)
            .enumerate()
            .map(|(g, dw_group)| run_group(g, Some(dw_group)))
            .collect(),
        None => (0..d.vocab.div_ceil(group_rows))
            .into_par_iter()
            .map(|g| run_group(g, None))
            .collect(),
    };
    let mut partials = partials.into_iter();
    let mut dh = partials.next().unwrap_or_else(|| vec![T::ZERO; len]);
    for p in partials {
        for (x, y) in dh.iter_mut().zip(&p) {
            *x += *y;
        }
    }
    dh
}

/// Where the backward pass gets its logits: the head weight, the forward's kept logits when
/// there are any, and the bf16 head when the products run in bf16.
#[derive(Clone, Copy)]
struct Source<'a, T> {
    w: &'a [T],
    cache: Option<&'a KeptLogits<T>>,
    bf16: Option<&'a Bf16Head>,
}

/// One vocabulary chunk of the backward pass: the weight rows `wc` of entries `c0..c0 +
/// wc.rows`, the kept logits, the bf16 head, and (bf16 tile) each row block's hidden states
/// packed for `∂W` (in `span`'s blocks of [`BACKWARD_BLOCK`] rows; empty otherwise).
#[derive(Clone, Copy)]
struct Chunk<'a, T> {
    wc: MatRef<'a, T>,
    c0: usize,
    bf16: Option<&'a Bf16Head>,
    cache: Option<&'a KeptGroup<'a, T>>,
    packed_hidden: &'a [Option<PackedHidden>],
}

/// The rows of `span`, against one vocabulary chunk.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn backward_chunk<T: Real + 'static>(
    rows: &BackwardRows<T>,
    span: std::ops::Range<usize>,
    chunk: Chunk<'_, T>,
    mut dw_chunk: Option<&mut [T]>,
    dh: &mut [T],
    d: HeadDims,
    scale: T,
) {
    let Chunk {
        wc,
        c0,
        bf16,
        cache,
        packed_hidden,
    } = chunk;
    let cw = wc.rows;
    let mut z = vec![T::ZERO; BACKWARD_BLOCK.min(span.len()) * cw];
    for b0 in (span.start..span.end).step_by(BACKWARD_BLOCK) {
        let b1 = (b0 + BACKWARD_BLOCK).min(span.end);
        let n_rows = b1 - b0;
        let hb = MatRef::row_major(&rows.hidden[b0 * d.hidden..b1 * d.hidden], n_rows, d.hidden);
        let z = &mut z[..n_rows * cw];
        match (cache, bf16) {
            (Some(cache), _) => {
                for (k, zr) in z.chunks_mut(cw).enumerate() {
                    zr.copy_from_slice(cache.row(rows.index[b0 + k], c0, cw));
                }
            }
            (None, Some(head)) => head.logits(hb.data, n_rows, (c0, cw), z, scale),
            (None, None) => gemm_rm(z, hb, wc.t(), scale, false, T::ONE),
        }
        for (k, zr) in z.chunks_mut(cw).enumerate() {
            logits_to_grad(zr, rows, b0 + k, c0);
        }
        let local = (b0 - span.start) * d.hidden..(b1 - span.start) * d.hidden;
        if let Some(head) = bf16 {
            if !head.rounds_operands() {
                round_in_place(z);
            }
            if let Some(dw) = dw_chunk.as_deref_mut() {
                let hidden = HiddenRows {
                    rows: hb.data,
                    packed: packed_hidden
                        .get((b0 - span.start) / BACKWARD_BLOCK)
                        .and_then(Option::as_ref),
                };
                head.weight_grad(z, (n_rows, cw), hidden, dw, scale);
            }
            head.input_grad(z, n_rows, (c0, cw), &mut dh[local], scale);
            continue;
        }
        let dz = MatRef::row_major(&*z, n_rows, cw);
        if let Some(dw) = dw_chunk.as_deref_mut() {
            gemm_rm(dw, dz.t(), hb, scale, true, T::ONE);
        }
        gemm_rm(&mut dh[local], dz, wc, scale, true, T::ONE);
    }
}

/// Overwrites one row's logits `z` (vocabulary `c0..`) with `∂loss/∂z`:
/// `g_lp (1[y] − p) − g_ent · p (log p + H)`, with `log p = z − lse`, and 0 for logits below
/// the kept threshold (the kept set is held fixed: the gradient almost everywhere).
#[inline(always)]
fn logits_to_grad<T: Real>(z: &mut [T], rows: &BackwardRows<T>, i: usize, c0: usize) {
    let (lse, ent, tau) = (rows.lse[i], rows.entropy[i], rows.tau[i]);
    let (g_lp, g_ent) = (rows.g_logprob[i], rows.g_entropy[i]);
    let truncated = tau > T::NEG_INFINITY;
    for v in z.iter_mut() {
        if truncated && *v < tau {
            *v = T::ZERO;
            continue;
        }
        let logp = *v - lse;
        let p = logp.exp();
        *v = -(g_lp * p) - g_ent * p * (logp + ent);
    }
    let y = rows.target[i] as usize;
    if (c0..c0 + z.len()).contains(&y) {
        z[y - c0] += g_lp;
    }
}
