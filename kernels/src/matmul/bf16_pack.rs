//! Packing f32 operands into the bf16 pair layouts the register tile reads, rounding on the
//! way. A `u32` holds one pair: the bf16 of an even `k` in its low half and of `k + 1` in its
//! high half (zero past the end), which is what `vdpbf16ps` multiplies lane by lane.
//!
//! - `B` `[k, n]` as panels of [`NR`] columns: `[n / NR][k / 2][NR]` pairs;
//! - a block of `A` `[rows, k]` as tiles of [`MR`] rows: `[rows / MR][pairs][MR]` pairs.
//!
//! Operands with contiguous rows or columns are packed 16 or 32 values at a time
//! (`bf16_pack_avx512.rs`); any other strides go through [`pair`] one value at a time.

use rayon::prelude::*;

use super::bf16_pack_avx512 as simd;
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

/// The `len` values of `m.data` from `start` (bounds-checked), as a pointer for the SIMD
/// packers.
fn run(m: &MatView, start: usize, len: usize) -> *const f32 {
    m.data[start..start + len].as_ptr()
}

/// Packs all of `b` `[k, n]` into `out` (resized to `panels · pairs · NR`).
pub(super) fn pack_b(b: MatView, out: &mut Vec<u32>) {
    let (k, n) = (b.rows, b.cols);
    let pairs = k.div_ceil(2);
    let panel_len = pairs * NR;
    out.clear();
    out.resize(n.div_ceil(NR) * panel_len, 0);
    let simd = simd::available();
    out.par_chunks_mut(panel_len)
        .enumerate()
        .for_each(|(q, panel)| {
            let (j0, cols) = (q * NR, NR.min(n - q * NR));
            if simd && b.col_stride == 1 {
                for (p, lanes) in panel.chunks_exact_mut(NR).enumerate() {
                    let even = run(&b, 2 * p * b.row_stride + j0, cols);
                    let odd =
                        (2 * p + 1 < k).then(|| run(&b, (2 * p + 1) * b.row_stride + j0, cols));
                    // SAFETY: the CPU has AVX-512F/BW; both rows hold `cols` values and
                    // `lanes` NR >= cols slots.
                    unsafe { simd::pack_rows(even, odd, cols, lanes.as_mut_ptr()) };
                }
            } else if simd && b.row_stride == 1 {
                for (half, start) in (0..cols).step_by(16).enumerate() {
                    let live = 16.min(cols - start);
                    let mut runs = [std::ptr::null::<f32>(); 16];
                    for (i, column) in runs.iter_mut().enumerate().take(live) {
                        *column = run(&b, (j0 + start + i) * b.col_stride, k);
                    }
                    // SAFETY: the CPU has AVX-512F/BW; each column holds `k` values; pair `p`
                    // of column `start + i` goes to `panel[p · NR + start + i]`, inside the
                    // panel's `pairs · NR` slots.
                    let out = panel[16 * half..].as_mut_ptr();
                    unsafe { simd::pack_runs(&runs[..live], k, (0, pairs), out, (NR, live)) };
                }
            } else {
                for (p, lanes) in panel.chunks_exact_mut(NR).enumerate() {
                    for (j, lane) in lanes.iter_mut().take(cols).enumerate() {
                        *lane = pair(2 * p, k, |kk| b.at(kk, j0 + j));
                    }
                }
            }
        });
}

/// Packs rows `row0..row0 + rows` and pairs `p0..p0 + pn` of `a` into `out` as tiles of
/// [`MR`] rows (the last tile zero-padded): tile `t` starts at `t · pn · MR`.
pub(super) fn pack_a(a: MatView, row0: usize, rows: usize, p0: usize, pn: usize, out: &mut [u32]) {
    let simd = simd::available();
    for (t, tile) in out.chunks_exact_mut(pn * MR).enumerate() {
        let first = t * MR;
        if first >= rows {
            break;
        }
        let live = MR.min(rows - first);
        let r0 = row0 + first;
        if simd && a.col_stride == 1 {
            pack_a_rows(a, r0, live, p0, pn, tile);
        } else if simd && a.row_stride == 1 {
            pack_a_columns(a, r0, live, p0, tile);
        } else {
            for (p, lanes) in tile.chunks_exact_mut(MR).enumerate() {
                let kk = 2 * (p0 + p);
                for (i, lane) in lanes.iter_mut().enumerate() {
                    *lane = match i < live {
                        true => pair(kk, a.cols, |c| a.at(r0 + i, c)),
                        false => 0,
                    };
                }
            }
        }
    }
}

/// One tile of `A` whose rows are contiguous in `k`: 16 pairs of every row at once.
fn pack_a_rows(a: MatView, r0: usize, live: usize, p0: usize, pn: usize, tile: &mut [u32]) {
    let k = a.cols;
    let mut runs = [std::ptr::null::<f32>(); MR];
    for (i, row) in runs.iter_mut().enumerate().take(live) {
        *row = run(&a, (r0 + i) * a.row_stride, k);
    }
    // SAFETY: the CPU has AVX-512F/BW; each row holds `k` values; pair `p` of row `i` goes
    // to `tile[p · MR + i]` (rows `live..MR` as zeros), inside the tile's `pn · MR` slots.
    unsafe { simd::pack_runs(&runs[..live], k, (p0, pn), tile.as_mut_ptr(), (MR, MR)) };
}

/// One tile of `A` whose columns are contiguous in rows (a transposed operand): the `live`
/// rows of `k` and `k + 1` at once.
fn pack_a_columns(a: MatView, r0: usize, live: usize, p0: usize, tile: &mut [u32]) {
    let k = a.cols;
    for (p, lanes) in tile.chunks_exact_mut(MR).enumerate() {
        let kk = 2 * (p0 + p);
        let even = run(&a, kk * a.col_stride + r0, live);
        let odd = (kk + 1 < k).then(|| run(&a, (kk + 1) * a.col_stride + r0, live));
        // SAFETY: the CPU has AVX-512F/BW; both columns hold `live` values and `lanes`
        // MR >= live slots.
        unsafe { simd::pack_rows(even, odd, live, lanes.as_mut_ptr()) };
        lanes[live..].fill(0);
    }
}

/// Each row of `x` (`[rows, k]` row-major) as bf16 pairs, `[rows][k.div_ceil(2)]` in `out`
/// (resized): the activations of a bf16 dot-product kernel.
pub(crate) fn bf16_row_pairs(x: &[f32], rows: usize, k: usize, out: &mut Vec<u32>) {
    assert_eq!(x.len(), rows * k, "bf16_row_pairs: x must be [rows, k]");
    let pairs = k.div_ceil(2);
    out.clear();
    out.resize(rows * pairs, 0);
    let simd = simd::available();
    for (row, dst) in x
        .chunks_exact(k.max(1))
        .zip(out.chunks_exact_mut(pairs.max(1)))
    {
        if simd {
            // SAFETY: the CPU has AVX-512F/BW; `row` holds `k` values and `dst` `pairs`.
            unsafe { simd::pack_row(row.as_ptr(), k, dst.as_mut_ptr()) };
        } else {
            for (p, d) in dst.iter_mut().enumerate() {
                *d = pair(2 * p, k, |c| row[c]);
            }
        }
    }
}
