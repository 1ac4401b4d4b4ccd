//! Packing f32 operands into the bf16 pair layouts the register tile reads, rounding on the
//! way. A `u32` holds one pair: the bf16 of an even `k` in its low half and of `k + 1` in its
//! high half (zero past the end), which is what `vdpbf16ps` multiplies lane by lane.
//!
//! - `B` `[k, n]` as panels of [`NR`] columns: `[n / NR][k / 2][NR]` pairs;
//! - a block of `A` `[rows, k]` as tiles of [`MR`] rows: `[rows / MR][pairs][MR]` pairs.

use rayon::prelude::*;

use super::{bf16_bits, MatView};

/// Rows of `A` (and `C`) per register tile.
pub(super) const MR: usize = 12;
/// Columns of `B` (and `C`) per register tile: two 16-lane registers.
pub(super) const NR: usize = 32;

/// The pair of `(k, k + 1)` at a fixed other index, read through `get` (zero past `k_len`).
#[inline]
fn pair(k: usize, k_len: usize, get: impl Fn(usize) -> f32) -> u32 {
    let lo = bf16_bits(get(k)) as u32;
    let hi = if k + 1 < k_len {
        bf16_bits(get(k + 1)) as u32
    } else {
        0
    };
    lo | (hi << 16)
}

/// Packs all of `b` `[k, n]` into `out` (resized to `panels · pairs · NR`).
pub(super) fn pack_b(b: MatView, out: &mut Vec<u32>) {
    let (k, n) = (b.rows, b.cols);
    let pairs = k.div_ceil(2);
    let panel_len = pairs * NR;
    out.clear();
    out.resize(n.div_ceil(NR) * panel_len, 0);
    out.par_chunks_mut(panel_len)
        .enumerate()
        .for_each(|(q, panel)| {
            let cols = NR.min(n - q * NR);
            for (p, lanes) in panel.chunks_exact_mut(NR).enumerate() {
                for (j, lane) in lanes.iter_mut().take(cols).enumerate() {
                    *lane = pair(2 * p, k, |kk| b.at(kk, q * NR + j));
                }
            }
        });
}

/// Packs rows `row0..row0 + rows` and pairs `p0..p0 + pn` of `a` into `out` as tiles of
/// [`MR`] rows (the last tile zero-padded): tile `t` starts at `t · pn · MR`.
pub(super) fn pack_a(a: MatView, row0: usize, rows: usize, p0: usize, pn: usize, out: &mut [u32]) {
    let k = a.cols;
    for (t, tile) in out.chunks_exact_mut(pn * MR).enumerate() {
        let first = t * MR;
        if first >= rows {
            break;
        }
        let live = MR.min(rows - first);
        for (p, lanes) in tile.chunks_exact_mut(MR).enumerate() {
            let kk = 2 * (p0 + p);
            for (i, lane) in lanes.iter_mut().enumerate() {
                *lane = match i < live {
                    true => pair(kk, k, |c| a.at(row0 + first + i, c)),
                    false => 0,
                };
            }
        }
    }
}
