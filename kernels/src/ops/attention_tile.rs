//! A key (or value) tile of the attention kernels stored transposed, `[hd, stride]`, so the
//! dot products of one query row with every key of the tile vectorise over the keys (no
//! horizontal reductions). Loaded once per tile and reused by every query row of a block.
//! The stride is the tile's width rounded up to [`LANES`] with zero columns, so the dot
//! products run in whole vectors even for the few keys a query row of a short sequence sees.

use std::ops::Range;

use multiversion::multiversion;

use super::cpu_math::Real;

/// Keys per vector chunk of the dot products (one AVX-512 register of f32).
const LANES: usize = 16;

/// Rows `keys` of a `[t, hd]` matrix, transposed into `data[d * stride + c]`; the columns
/// from `keys.len()` to `stride` are zero.
pub(crate) struct TransposedTile<T> {
    keys: Range<usize>,
    hd: usize,
    stride: usize,
    data: Vec<T>,
}

impl<T: Real> TransposedTile<T> {
    /// An empty tile for rows of `hd` elements, holding up to `cap` rows without reallocating.
    pub(crate) fn new(hd: usize, cap: usize) -> Self {
        TransposedTile {
            keys: 0..0,
            hd,
            stride: 0,
            data: Vec::with_capacity(hd * cap.next_multiple_of(LANES)),
        }
    }

    /// Loads rows `keys` of `rows` (`[t, hd]` row-major).
    pub(crate) fn load(&mut self, rows: &[T], keys: Range<usize>) {
        let (hd, stride) = (self.hd, keys.len().next_multiple_of(LANES));
        self.data.clear();
        self.data.resize(hd * stride, T::ZERO);
        for (c, row) in rows[keys.start * hd..keys.end * hd].chunks(hd).enumerate() {
            for (d, &x) in row.iter().enumerate() {
                self.data[d * stride + c] = x;
            }
        }
        self.keys = keys;
        self.stride = stride;
    }

    /// The absolute row indices the tile holds.
    pub(crate) fn keys(&self) -> &Range<usize> {
        &self.keys
    }

    /// `out[c] = alpha * (x . row(keys.start + c))` for the tile-local indices `local`
    /// (`x`: `[hd]`; `out`: at least `local.end` long; other entries untouched).
    #[inline(always)]
    pub(crate) fn dots(&self, x: &[T], alpha: T, local: Range<usize>, out: &mut [T]) {
        let out = &mut out[local.clone()];
        tile_dots(&self.data, self.stride, self.hd, x, alpha, true, local, out);
    }

    /// `out[c - local.start] = alpha * (Σ_d x_d k_(keys.start + c),d)` for the tile-local
    /// indices `local`, each dot product summed over `d` in order from zero before the one
    /// multiplication by `alpha` (`out`: `local.len()` long). The decoding engine's paged
    /// attention computes its scores in exactly this order.
    #[inline(always)]
    pub(crate) fn dots_then_scale(&self, x: &[T], alpha: T, local: Range<usize>, out: &mut [T]) {
        tile_dots(
            &self.data,
            self.stride,
            self.hd,
            x,
            alpha,
            false,
            local,
            out,
        );
    }
}

/// The loops of [`TransposedTile::dots`] (`scale_first`: each `x_d` scaled by `alpha` before
/// its products) and [`TransposedTile::dots_then_scale`] (sums first, one multiplication by
/// `alpha` after), in whole chunks of [`LANES`] keys (the zero columns of the stride fill
/// the last chunk; their sums are never written out). Each key's sum runs over `d` in order
/// whatever the chunking, and the clones for AVX-512 and AVX2+FMA do the same arithmetic in
/// wider or narrower vectors (Rust never fuses the multiply and the add), so every clone
/// gives the same bits.
#[allow(clippy::too_many_arguments)]
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn tile_dots<T: Real>(
    data: &[T],
    stride: usize,
    hd: usize,
    x: &[T],
    alpha: T,
    scale_first: bool,
    local: Range<usize>,
    out: &mut [T],
) {
    let mut start = local.start / LANES * LANES;
    while start < local.end {
        // One chunk at a time: a fixed-size accumulator stays in registers across `d`.
        let mut acc = [T::ZERO; LANES];
        for (d, &xd) in x.iter().enumerate().take(hd) {
            let a = if scale_first { alpha * xd } else { xd };
            let col = &data[d * stride + start..d * stride + start + LANES];
            for (o, &k) in acc.iter_mut().zip(col) {
                *o += a * k;
            }
        }
        if !scale_first {
            acc.iter_mut().for_each(|o| *o *= alpha);
        }
        let keys = start.max(local.start)..(start + LANES).min(local.end);
        out[keys.start - local.start..keys.end - local.start]
            .copy_from_slice(&acc[keys.start - start..keys.end - start]);
        start += LANES;
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dots_match_row_dot_products() {
        let (t, hd) = (7, 5);
        let rows: Vec<f64> = (0..t * hd).map(|i| ((i * 37) % 11) as f64 - 5.0).collect();
        let x: Vec<f64> = (0..hd).map(|d| d as f64 * 0.5 - 1.0).collect();
        let mut tile = TransposedTile::new(hd, 4);
        tile.load(&rows, 2..6);
        assert_eq!(tile.keys(), &(2..6));
        let mut out = vec![f64::NAN; 4];
        tile.dots(&x, 2.0, 1..3, &mut out);
        assert!(out[0].is_nan() && out[3].is_nan());
        for (c, &got) in out.iter().enumerate().take(3).skip(1) {
            let j = 2 + c;
            let want: f64 = (0..hd).map(|d| 2.0 * x[d] * rows[j * hd + d]).sum();
            assert!((got - want).abs() < 1e-12, "{c}: {got} vs {want}");
        }
    }
}
