//! The training attention's forward in the decoding engine's arithmetic (f32). For each
//! query, in this order:
//! 1. the scores of its visible keys, ascending: each a dot product summed over the channels
//!    in order from zero, then multiplied once by `hd^-0.5`;
//! 2. their softmax by [`rows::softmax_in_place`];
//! 3. each output channel, the probability-weighted values summed over the keys in order
//!    from zero.
//!
//! The engine's paged attention (`oxalign-models`' `engine/paged_attention.rs`) does exactly
//! these operations, so a trainer forward in the engine's numbers (fake int8) gets the
//! engine's attention outputs bit for bit, and the int8 rounding after it cannot flip on
//! one side only. Padded keys are left out of a row (not scored as `-inf`), so the lanes of
//! the softmax sum are those of the engine's unpadded row. Key tiles are transposed once per
//! block of query rows, as in the tiled forward; the backward is the tiled one (it needs
//! only the log-sum-exp this returns).

use super::attention_fwd::{forward_by_blocks, Dims, HeadView, Tiles};
use super::attention_tile::TransposedTile;
use super::attention_visibility::Visibility;
use super::cpu_math::{axpy, scale_in_place};
use super::rows;

/// Attention output `[b, nh, t, hd]` and per-row log-sum-exp `[b, nh, t]`, as
/// [`super::attention_fwd::forward`] returns them, in the engine's arithmetic.
pub(crate) fn forward_engine_order(
    qkv: (&[f32], &[f32], &[f32]),
    d: Dims,
    vis: &Visibility,
    tiles: Tiles,
) -> (Vec<f32>, Vec<f32>) {
    forward_by_blocks(qkv, d, vis, tiles, block)
}

/// Query rows `i0..i0 + lse.len()` of one head: `out` `[rows, hd]`, `lse` `[rows]`.
fn block(h: &HeadView<f32>, tk: usize, i0: usize, out: &mut [f32], lse: &mut [f32]) {
    let ranges: Vec<_> = (0..lse.len())
        .map(|r| h.vis.key_range(h.b, i0 + r))
        .collect();
    let mut scores: Vec<Vec<f32>> = ranges.iter().map(|r| vec![0f32; r.len()]).collect();
    let (keys_lo, keys_hi) = (ranges[0].start, i0 + lse.len());
    let mut tile = TransposedTile::new(h.hd, tk);
    let mut j0 = keys_lo;
    while j0 < keys_hi {
        tile.load(h.k, j0..(j0 + tk).min(keys_hi));
        for (r, (range, s)) in ranges.iter().zip(&mut scores).enumerate() {
            let keys = h.vis.key_range_in(h.b, i0 + r, tile.keys());
            if keys.is_empty() {
                continue;
            }
            let local = keys.start - j0..keys.end - j0;
            let dst = &mut s[keys.start - range.start..keys.end - range.start];
            tile.dots_then_scale(h.row(h.q, i0 + r), h.scale, local, dst);
        }
        j0 = tile.keys().end;
    }
    for (r, ((range, s), (acc, lse))) in ranges
        .into_iter()
        .zip(scores)
        .zip(out.chunks_mut(h.hd).zip(lse))
        .enumerate()
    {
        *lse = finish_row(h, i0 + r, range, &s, acc);
    }
}

/// Softmax of row `i`'s scores over its visible keys and the weighted sum of their values
/// into `acc` `[hd]`; returns the log-sum-exp. A dead row (no visible key) becomes the plain
/// mean of all `t` values, as in the tiled forward.
fn finish_row(
    h: &HeadView<f32>,
    i: usize,
    range: std::ops::Range<usize>,
    scores: &[f32],
    acc: &mut [f32],
) -> f32 {
    acc.fill(0.0);
    if !h.vis.row_sees_any(h.b, i) {
        for j in 0..h.t {
            axpy(acc, 1.0, h.row(h.v, j));
        }
        scale_in_place(acc, 1.0 / h.t as f32);
        return (h.t as f32).ln();
    }
    let start = range.start;
    let keys: Vec<usize> = match h.vis.valid_keys(h.b) {
        Some(valid) => range.filter(|&j| valid[j]).collect(),
        None => range.collect(),
    };
    let mut probs: Vec<f32> = keys.iter().map(|&j| scores[j - start]).collect();
    let lse = rows::softmax_in_place(&mut probs);
    for (&j, &p) in keys.iter().zip(&probs) {
        axpy(acc, p, h.row(h.v, j));
    }
    lse
}
