//! Causal attention of one engine step over the paged KV cache: every new token of every
//! sequence attends to its sequence's cached keys/values (after RoPE), in one pass that is
//! parallel over tokens (rayon). Scores come a key block at a time from the pool's
//! channel-major key blocks (vertical multiply-adds over 16 positions, no horizontal sums);
//! values accumulate 16 channels at a time in registers. The query heads that share a KV
//! head (GQA) are processed together. It reads the pool; it never writes it.

use crate::engine::block_pool::BlockPool;
use crate::engine::step_item::{AttnDims, StepItem};
use oxalign_kernels::ops::rows;
use rayon::prelude::*;

/// Lanes of the accumulators (one AVX-512 or two AVX2 registers).
const LANES: usize = 16;

/// Where a flat token of the step comes from.
#[derive(Clone, Copy)]
struct TokenRef {
    item: usize,
    /// Absolute position of the token in its sequence.
    pos: usize,
}

/// Attention of every new token of `items` in `layer`.
///
/// `qkv`: `[tokens, (heads + 2 kv_heads) * head_dim]`, q already rotated; `out`:
/// `[tokens, heads * head_dim]`, overwritten. `window`: sliding-window size of this layer.
pub(crate) fn paged_attention(
    pool: &BlockPool,
    layer: usize,
    items: &[StepItem<'_>],
    qkv: &[f32],
    dims: AttnDims,
    window: Option<usize>,
    out: &mut [f32],
) {
    let tokens: Vec<TokenRef> = items
        .iter()
        .enumerate()
        .flat_map(|(item, it)| {
            (0..it.tokens.len()).map(move |j| TokenRef {
                item,
                pos: it.start + j,
            })
        })
        .collect();
    let q_dim = dims.heads * dims.head_dim;
    let row = q_dim + 2 * dims.kv_heads * dims.head_dim;
    debug_assert_eq!(qkv.len(), tokens.len() * row);
    debug_assert_eq!(out.len(), tokens.len() * q_dim);
    let wide = crate::engine::simd::wide_simd();
    let widest = wide && avx512_available();
    out.par_chunks_mut(q_dim)
        .zip(qkv.par_chunks(row))
        .zip(tokens.par_iter())
        .for_each_init(Vec::new, |scores, ((o, r), t)| {
            let lo = window.map_or(0, |w| (t.pos + 1).saturating_sub(w));
            let job = TokenJob {
                pool,
                layer,
                table: items[t.item].table,
                span: lo..t.pos + 1,
                q: &r[..q_dim],
                dims,
            };
            if widest {
                // SAFETY: `avx512_available` checked the CPU features.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    attend_token_avx512(&job, scores, o)
                };
            } else if wide {
                // SAFETY: `wide_simd` checked the CPU features.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    attend_token_avx2(&job, scores, o)
                };
            } else {
                attend_token(&job, scores, o);
            }
        });
}

/// The inputs of one token's attention.
struct TokenJob<'a> {
    pool: &'a BlockPool,
    layer: usize,
    table: &'a [usize],
    /// Positions attended to.
    span: std::ops::Range<usize>,
    /// The token's rotated query heads `[heads * head_dim]`.
    q: &'a [f32],
    dims: AttnDims,
}

/// Whether the AVX-512F build of [`attend_token`] can run here.
fn avx512_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`attend_token`] compiled for AVX-512F (16-lane accumulators fill one register).
///
/// # Safety
/// The CPU supports AVX-512F, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn attend_token_avx512(job: &TokenJob<'_>, scores: &mut Vec<f32>, out: &mut [f32]) {
    attend_token(job, scores, out)
}

/// [`attend_token`] compiled for AVX2+FMA (the same code, wider vectors).
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_token_avx2(job: &TokenJob<'_>, scores: &mut Vec<f32>, out: &mut [f32]) {
    attend_token(job, scores, out)
}

/// One token: for each KV group, the group's query heads against positions `span`.
#[inline(always)]
fn attend_token(job: &TokenJob<'_>, scores: &mut Vec<f32>, out: &mut [f32]) {
    let (hd, n_rep) = (job.dims.head_dim, job.dims.heads / job.dims.kv_heads);
    let n = job.span.len();
    for g in 0..job.dims.kv_heads {
        let qg = &job.q[g * n_rep * hd..(g + 1) * n_rep * hd];
        scores.clear();
        scores.resize(n_rep * n, 0.0);
        group_scores(job, g, qg, n_rep, scores);
        if let Some(c) = job.dims.softcap {
            scores.iter_mut().for_each(|s| *s = c * (*s / c).tanh());
        }
        // Softmax per head.
        for r in 0..n_rep {
            rows::softmax_in_place(&mut scores[r * n..(r + 1) * n]);
        }
        let og = &mut out[g * n_rep * hd..(g + 1) * n_rep * hd];
        group_values(job, g, n_rep, scores, og);
    }
}

/// `scores[r * n + i] = q_r · k_(lo + i) / sqrt(head_dim)` for the `n_rep` heads of group `g`,
/// a block at a time: with channel-major key blocks every multiply-add is vertical over
/// [`LANES`] positions, so no horizontal sums are needed.
#[inline(always)]
fn group_scores(job: &TokenJob<'_>, g: usize, qg: &[f32], n_rep: usize, scores: &mut [f32]) {
    if job.pool.block_size() == LANES {
        return group_scores_by_four(job, g, qg, n_rep, scores);
    }
    let (hd, bs) = (job.dims.head_dim, job.pool.block_size());
    let scale = (hd as f64).powf(-0.5) as f32;
    let (lo, n) = (job.span.start, job.span.len());
    let mut pos = lo - lo % bs;
    while pos < job.span.end {
        let kt = job.pool.key_block(job.layer, job.table[pos / bs], g);
        let mut c = 0;
        while c < bs {
            let width = LANES.min(bs - c);
            for r in 0..n_rep {
                let q = &qg[r * hd..(r + 1) * hd];
                let mut acc = [0f32; LANES];
                if width == LANES {
                    for (d, &qd) in q.iter().enumerate() {
                        let k: &[f32; LANES] =
                            kt[d * bs + c..d * bs + c + LANES].try_into().unwrap();
                        for l in 0..LANES {
                            acc[l] += qd * k[l];
                        }
                    }
                } else {
                    for (d, &qd) in q.iter().enumerate() {
                        for l in 0..width {
                            acc[l] += qd * kt[d * bs + c + l];
                        }
                    }
                }
                // Keep only positions inside the span (the rest of the block is unused).
                for (l, a) in acc.iter().enumerate().take(width) {
                    let p = pos + c + l;
                    if p >= lo && p < job.span.end {
                        scores[r * n + p - lo] = a * scale;
                    }
                }
            }
            c += width;
        }
        pos += bs;
    }
}

/// [`group_scores`] when a key block is one vector of [`LANES`] positions (the default block
/// size): four blocks at a time, so each query head runs four independent sums instead of
/// one chain of `head_dim` dependent adds. Every score is still summed over `d` in order, so
/// the numbers are the same bits.
#[inline(always)]
fn group_scores_by_four(
    job: &TokenJob<'_>,
    g: usize,
    qg: &[f32],
    n_rep: usize,
    scores: &mut [f32],
) {
    let hd = job.dims.head_dim;
    let scale = (hd as f64).powf(-0.5) as f32;
    let (lo, end, n) = (job.span.start, job.span.end, job.span.len());
    let (first, last) = (lo / LANES, (end - 1) / LANES);
    let mut b = first;
    while b <= last {
        let count = 4.min(last + 1 - b);
        let keys: [&[f32]; 4] = std::array::from_fn(|j| {
            job.pool
                .key_block(job.layer, job.table[b + j.min(count - 1)], g)
        });
        for r in 0..n_rep {
            let q = &qg[r * hd..(r + 1) * hd];
            let mut acc = [[0f32; LANES]; 4];
            for (d, &qd) in q.iter().enumerate() {
                for (a, kt) in acc.iter_mut().zip(&keys) {
                    let k: &[f32; LANES] = kt[d * LANES..(d + 1) * LANES].try_into().unwrap();
                    for l in 0..LANES {
                        a[l] += qd * k[l];
                    }
                }
            }
            for (j, a) in acc.iter().enumerate().take(count) {
                for (l, v) in a.iter().enumerate() {
                    let p = (b + j) * LANES + l;
                    if p >= lo && p < end {
                        scores[r * n + p - lo] = v * scale;
                    }
                }
            }
        }
        b += count;
    }
}

/// `out_r = Σ_i p_ri · v_(lo + i)` for the `n_rep` heads of group `g`, 64 channels (four
/// independent sums) at a time while they last, then [`LANES`] at a time, so the
/// accumulators stay in registers. Each channel is summed over positions in order.
#[inline(always)]
fn group_values(job: &TokenJob<'_>, g: usize, n_rep: usize, probs: &[f32], out: &mut [f32]) {
    let (hd, bs) = (job.dims.head_dim, job.pool.block_size());
    let (lo, n) = (job.span.start, job.span.len());
    let mut d0 = 0;
    while d0 + 4 * LANES <= hd {
        for r in 0..n_rep {
            let p_r = &probs[r * n..(r + 1) * n];
            let mut acc = [[0f32; LANES]; 4];
            let mut pos = lo;
            while pos < job.span.end {
                let end = (pos - pos % bs + bs).min(job.span.end);
                let vb = job.pool.value_block(job.layer, job.table[pos / bs], g);
                for p in pos..end {
                    let w = p_r[p - lo];
                    let base = (p % bs) * hd + d0;
                    for (j, a) in acc.iter_mut().enumerate() {
                        let v: &[f32; LANES] = vb[base + j * LANES..base + (j + 1) * LANES]
                            .try_into()
                            .unwrap();
                        for l in 0..LANES {
                            a[l] += w * v[l];
                        }
                    }
                }
                pos = end;
            }
            for (j, a) in acc.iter().enumerate() {
                let at = r * hd + d0 + j * LANES;
                out[at..at + LANES].copy_from_slice(a);
            }
        }
        d0 += 4 * LANES;
    }
    while d0 < hd {
        let width = LANES.min(hd - d0);
        for r in 0..n_rep {
            let p_r = &probs[r * n..(r + 1) * n];
            let mut acc = [0f32; LANES];
            // Walk the span block by block: positions `pos..end` share one value block.
            let mut pos = lo;
            while pos < job.span.end {
                let end = (pos - pos % bs + bs).min(job.span.end);
                let vb = job.pool.value_block(job.layer, job.table[pos / bs], g);
                for p in pos..end {
                    let w = p_r[p - lo];
                    let base = (p % bs) * hd + d0;
                    if width == LANES {
                        let v: &[f32; LANES] = vb[base..base + LANES].try_into().unwrap();
                        for l in 0..LANES {
                            acc[l] += w * v[l];
                        }
                    } else {
                        for l in 0..width {
                            acc[l] += w * vb[base + l];
                        }
                    }
                }
                pos = end;
            }
            out[r * hd + d0..r * hd + d0 + width].copy_from_slice(&acc[..width]);
        }
        d0 += width;
    }
}
